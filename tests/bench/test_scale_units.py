"""The scale benchmark's verdicts, drop accounting, rows per size and open-file limit, without running it."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from bench import scale


def cycle(**kw: Any) -> dict[str, Any]:
    c = {"t_disconnect": 0.5, "t_hold": 1.0, "hold_expected": 99, "hold_received": 99, "t_resume": 1.0}
    return c | {"resume_expected": 100, "resume_received": 100} | kw


def why(cyc: list[dict[str, Any]], cycles: int = 1, **out: Any) -> str:
    return " ".join(scale.validate(100, cyc, cycles, {"coordinator_socket_drops": 0} | out))


def test_a_run_is_valid_only_if_every_cycle_reached_every_worker() -> None:
    assert scale.validate(100, [cycle(), cycle()], 2, {"coordinator_socket_drops": 0}) == []
    assert "the hold reached 50 of 99" in why([cycle(hold_received=50)])
    assert "(of 99)" in why([cycle(hold_expected=27, hold_received=27)])
    assert "no resume" in why([cycle(t_resume=None)])
    assert "the resume reached 3 of 100" in why([cycle(resume_received=3)])
    assert "before the worker was disconnected" in why([cycle(t_hold=0.4)])
    assert "1 of 3 hold cycles" in why([cycle()], 3)
    assert "no hold decision" in why([{"error": "no hold decision after a worker disconnected"}])
    assert "5 workers were lost to heartbeat timeouts" in why([cycle()], heartbeat_timeouts=5)
    assert "only 97 of 100 connected workers" in why([cycle()], datagram_workers=97, connected_workers=100)


def test_drops_on_the_coordinators_socket_make_a_run_invalid() -> None:
    assert "dropped 7 heartbeat datagrams on the coordinator's socket" in why([cycle()], coordinator_socket_drops=7)
    assert "could not be read" in why([cycle()], coordinator_socket_drops=None)
    assert scale.socket_drops({}) is None  # not read: not zero
    metrics = {("elastic_sidecar_heartbeat_datagrams_total", (("result", "accepted"),)): 5000.0}
    assert scale.socket_drops(metrics) == 0  # the dropped series appears at the first drop
    assert scale.socket_drops(metrics | {scale.DROPPED: 12.0}) == 12


def test_a_restart_run_needs_every_host_back_and_none_lost() -> None:
    restart = {"scenario": "coordinator_restart"}
    assert why([], 0, **restart, all_back_seconds=32.5, hosts_lost=0) == ""  # a long storm that lost nobody
    assert "3 hosts were lost" in why([], 0, **restart, all_back_seconds=4.0, hosts_lost=3)
    assert "not every worker was back" in why([], 0, **restart, all_back_seconds=None, hosts_lost=0)
    records = [
        {"trigger": "WorkerLost", "message": "host 3.1 lost (heartbeat_timeout)"},
        {"trigger": "Tick", "message": "12 host(s) did not rejoin within the grace; holding"},
        {"trigger": "WorkerJoined", "message": "host 3.1 re-registered"},
    ]
    assert sum(map(scale.hosts_lost, records)) == 13
    assert [scale.timed_out(r) for r in records] == [True, False, False]


def run(valid: bool = True, drops: int | None = 0, cores: float = 0.3, **kw: Any) -> dict[str, Any]:
    return {
        "workers": 1000,
        "scenario": "hold_cycles",
        "valid": valid,
        "cpu_cores": cores,
        "cpu_cores_windows": [cores - 0.01, cores + 0.01],
        "fanout_p99_seconds": 0.2 + cores,
        "fanout_p50_seconds": 0.1,
        "delivered_fraction": 1.0,
        "coordinator_socket_drops": drops,
        "cycles": [{}, {}, {}],
        **({} if valid else {"invalid_reason": "cycle 1: no resume was decided"}),
        **kw,
    }


def test_a_sizes_row_stands_for_all_its_runs() -> None:
    r = scale.size_row([run(cores=0.3), run(cores=0.5), run(cores=0.4)])
    assert r["runs"] == 3 and r["valid"] is True
    assert r["coordinator_cores"] == 0.4 and r["coordinator_cores_runs"] == [0.3, 0.5, 0.4]
    assert r["coordinator_cores_min"] == 0.29 and r["coordinator_cores_max"] == 0.51
    assert r["fanout_p99_seconds"] == 0.7  # the worst run's
    assert r["coordinator_socket_drops"] == 0 and r["cycles"] == 9
    bad = scale.size_row([run(), run(valid=False), run(drops=None)])
    assert bad["valid"] is False and bad["invalid_reason"].startswith("run 2: ")
    assert bad["coordinator_socket_drops"] is None  # one run's drops unknown: the sum is unknown
    collapsed = scale.row({"workers": 25000, "valid": False, "collapse": {"workers_registered": 9000}})
    assert collapsed["workers_registered"] == 9000 and collapsed["coordinator_rss_mib"] is None


def test_every_scale_size_pins_from_all_usable_cpus() -> None:
    if len(scale.USABLE_CPUS) < 2:
        pytest.skip("one usable CPU: the scale bench does not pin")
    before = os.sched_getaffinity(0)
    coord, others = scale.pinning()
    try:
        scale.pin(os.getpid(), others)  # what a size does to this process
        assert scale.pinning() == (coord, others)  # the next size still pins the coordinator apart
    finally:
        os.sched_setaffinity(0, before)


def test_a_size_past_the_open_file_limit_is_a_not_run_row_that_names_the_limit(
    monkeypatch: Any, tmp_path: Path
) -> None:
    import resource

    from agent import fdlimit

    def refuse(*_: Any) -> None:
        raise ValueError("not allowed to raise maximum limit")

    monkeypatch.setattr(resource, "getrlimit", lambda _: (20000, 20000))
    monkeypatch.setattr(resource, "setrlimit", refuse)
    assert scale.too_few_open_files(10000) is None
    short = scale.too_few_open_files(25000)
    assert short is not None and f"{fdlimit.need(25000):,}" in short and "20,000" in short
    # Hosts that share connections need a socket a connection: 12,500 at two streams a connection.
    assert scale.too_few_open_files(25000, 2) is None
    assert "20,000 shared connections" in str(scale.too_few_open_files(40000, 2))
    ran: list[int] = []
    monkeypatch.setattr(scale, "run_size", lambda n, *a, **k: ran.append(n) or {})
    (row,) = scale.run(tmp_path, sizes=[25000], repeats=1)["results"]
    assert ran == [] and (row["workers"], row["runs"], row["status"], row["valid"]) == (25000, 0, "not_run", False)
    assert row["invalid_reason"] == short
    monkeypatch.setattr(resource, "setrlimit", lambda *_: None)  # a privileged process raises its hard limit
    assert scale.too_few_open_files(25000) is None


def test_rows_whose_hosts_shared_connections_say_so_on_the_page() -> None:
    from bench.report import sec_scale

    docs = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.json"
    sc = json.loads(docs.read_text())["benchmarks"]["scale"]
    sc["results"][0]["streams_per_connection"] = 2  # as --streams-per-connection 2 records it
    assert "(2 streams a connection)" in "\n".join(sec_scale(copy.deepcopy(sc)))
    for r in sc["results"]:
        r.pop("streams_per_connection", None)
    assert "streams a connection" not in "\n".join(sec_scale(copy.deepcopy(sc)))
