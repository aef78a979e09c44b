"""The benchmarks' own arithmetic and checks, without running anything: fault phases, fault cost
against the fault-free rate, ratios, scale validity, and the combined JSON's provenance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import detection, scale
from bench.__main__ import combine


def cycle(**kw: Any) -> dict[str, Any]:
    c = {
        "spontaneous_holds": [],
        "hold_expected": 99,
        "hold_received": 99,
        "t_resume": 1.0,
        "resume_expected": 100,
        "resume_received": 100,
    }
    c.update(kw)
    return c


def test_scale_validity() -> None:
    assert scale.validate(100, [cycle(), cycle()], 2, 0) == []
    assert "hold reached 50 of 99" in " ".join(scale.validate(100, [cycle(hold_received=50)], 1, 0))
    assert "not 99" in " ".join(scale.validate(100, [cycle(hold_expected=27, hold_received=27)], 1, 0))
    assert "no resume" in " ".join(scale.validate(100, [cycle(t_resume=None)], 1, 0))
    assert "resume reached 3 of 100" in " ".join(scale.validate(100, [cycle(resume_received=3)], 1, 0))
    assert "before the worker was disconnected" in " ".join(
        scale.validate(100, [cycle(spontaneous_holds=[{"generation": 3}])], 1, 0)
    )
    assert "1 of 3 hold cycles" in " ".join(scale.validate(100, [cycle()], 3, 0))
    assert "heartbeat timeouts" in " ".join(scale.validate(100, [cycle()], 1, 5))
    assert "only 97 of 100 connected workers heartbeat by datagram" in " ".join(
        scale.validate(100, [cycle()], 1, 0, datagrams=(97, 100))
    )
    assert scale.validate(100, [cycle()], 1, 0, datagrams=(100, 100)) == []


def test_scale_row_fields() -> None:
    r = scale.row({"workers": 10, "valid": False, "invalid_reason": "x", "cycles": []})
    assert r["valid"] is False and r["invalid_reason"] == "x" and r["delivered_fraction"] == 0.0
    for key in ("workers", "heartbeat_interval", "coordinator_cores", "coordinator_rss_mib", "fanout_p99_seconds"):
        assert key in r


def section(name: str, sha: str | None, dirty: bool, started: str = "2026-12-01 00:00:00 UTC") -> dict[str, Any]:
    return {
        "name": name,
        "git_sha": sha,
        "dirty": dirty,
        "started_at": started,
        "machine": {"cores": 2},
        "config": {},
        "results": [{"x": 1}],
    }


def test_combined_file_names_the_newest_runs_commit_only_when_every_run_was_clean() -> None:
    one = combine([section("flush", "a" * 40, False), section("scale", "a" * 40, False)])
    assert one["git_sha"] == "a" * 40 and one["dirty"] is False
    assert [r["benchmark"] for r in one["results"]] == ["flush", "scale"]
    later = combine([section("flush", "b" * 40, False, "2026-12-01 02:00:00 UTC"), section("scale", "a" * 40, False)])
    assert later["git_sha"] == "b" * 40 and later["git_shas"] == ["a" * 40, "b" * 40]
    mixed = combine([section("flush", "a" * 40, False), section("scale", "b" * 40, True)])
    assert mixed["git_sha"] is None and mixed["git_shas"] == ["a" * 40, "b" * 40] and mixed["dirty"] is True
    assert combine([section("flush", None, False)])["git_sha"] is None


def test_udp_counters_read_the_kernels_receive_buffer_drops() -> None:
    import socket

    before = scale.udp_counters()
    assert "RcvbufErrors" in before and "InDatagrams" in before
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("127.0.0.1", 0))
        tx.sendto(b"x", rx.getsockname())
        assert rx.recv(8) == b"x"
    assert scale.udp_counters()["InDatagrams"] > before["InDatagrams"]


def test_every_scale_size_pins_from_all_usable_cpus() -> None:
    import os

    if not scale.USABLE_CPUS or len(scale.USABLE_CPUS) < 2:
        pytest.skip("one usable CPU: the scale bench does not pin")
    before = os.sched_getaffinity(0)
    coord, others = scale.pinning()
    try:
        scale._pin(os.getpid(), others)  # what a size does to this process
        assert scale.pinning() == (coord, others)  # the next size still pins the coordinator apart
    finally:
        os.sched_setaffinity(0, before)


def test_free_port_never_hands_out_one_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel may give a closed port to the next ``bind(0)``; a rig's servers must not share one."""
    from bench import common

    ports = iter([40001, 40001, 40001, 40002])

    class OneSocket:
        def __init__(self, *a: Any) -> None:
            self.port = next(ports)

        def __enter__(self) -> OneSocket:
            return self

        def __exit__(self, *a: Any) -> None:
            pass

        def bind(self, addr: tuple[str, int]) -> None:
            assert addr == ("127.0.0.1", 0)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(common, "_HANDED_OUT", set())
    monkeypatch.setattr(common.socket, "socket", OneSocket)
    assert [common.free_port(), common.free_port()] == [40001, 40002]


def test_load_generator_lateness_is_read_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "generators.log"
    log.write_text(
        "scale_loadgen 0: heartbeat datagrams 0.307 s late\nsomething else\n"
        "scale_loadgen 2500: heartbeat datagrams 1.25 s late\n"
    )
    assert scale._loadgen_late(log) == [0.307, 1.25]
    assert scale._loadgen_late(tmp_path / "missing.log") == []


def test_notice_decisions_from_sending_are_summarised_only_where_measured() -> None:
    got = detection._sent_to_decision(
        [{"sent_to_decision_s": 0.1}, {"sent_to_decision_s": 0.3}, {"sent_to_decision_s": 0.2}, {"error": "x"}]
    )
    assert got == {"sent_to_decision_seconds_median": 0.2, "sent_to_decision_seconds_max": 0.3}
    assert detection._sent_to_decision([{"decision_s": 0.1}]) == {}


def test_state_cost_measures_a_full_job_and_refuses_sizes_it_cannot_fill(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import state_cost

    out = state_cost.measure(2000, 2)
    assert out["hosts"] == 2000 and out["slices"] == 20
    assert out["state_file_mib"] > 0.3  # 2,000 hosts of about 200 bytes
    assert out["hosts_in_state_mib"] > 0 and out["renderer_cache_mib"] > 0
    assert all(out[k] > 0 for k in ("decision_ms_registration", "render_ms_one_host_changed"))
    with pytest.raises(SystemExit):
        state_cost.main(["--hosts", "2050"])
    assert "multiple of 100" in capsys.readouterr().err
