"""The scale benchmark's drop accounting, its runs per size and the coordinator-restart scenario's verdicts."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from bench import scale


def cycle(**kw: Any) -> dict[str, Any]:
    c = {"hold_expected": 99, "hold_received": 99, "t_resume": 1.0, "resume_expected": 100, "resume_received": 100}
    return {**c, **kw}


def test_drops_on_the_coordinators_socket_make_a_run_invalid() -> None:
    assert scale.validate(100, [cycle()], 1, 0, drops=0) == []
    assert "dropped 7 heartbeat datagrams on the coordinator's socket" in " ".join(
        scale.validate(100, [cycle()], 1, 0, drops=7)
    )
    assert "could not be read" in " ".join(scale.validate(100, [cycle()], 1, 0, drops=None))


def test_socket_drops_are_read_from_the_coordinators_own_metric() -> None:
    assert scale.socket_drops({}) is None  # not read: not zero
    metrics = {
        ("elastic_sidecar_heartbeat_datagrams_total", (("result", "accepted"),)): 5000.0,
        ("elastic_sidecar_workers_connected", ()): 100.0,
    }
    assert scale.socket_drops(metrics) == 0  # the dropped series appears at the first drop
    metrics[scale.DROPPED] = 12.0
    assert scale.socket_drops(metrics) == 12


def run(valid: bool = True, drops: int | None = 0, cores: float = 0.3, **kw: Any) -> dict[str, Any]:
    return {
        "workers": 1000,
        "scenario": "hold_cycles",
        "valid": valid,
        "cpu_cores": cores,
        "cpu_cores_windows": [cores - 0.01, cores + 0.01],
        "hold_fanout": {"p99_s_worst_cycle": 0.2 + cores, "p50_s": 0.1},
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


def test_a_restart_run_needs_every_host_back_and_none_lost(tmp_path: Path) -> None:
    assert scale.validate_restart({"all_back_seconds": 4.0, "hosts_lost": 0}) == []
    # The grace counts from the newest re-registration: a long storm that lost nobody stands.
    assert scale.validate_restart({"all_back_seconds": 32.5, "hosts_lost": 0}) == []
    assert "3 hosts were lost" in " ".join(scale.validate_restart({"all_back_seconds": 4.0, "hosts_lost": 3}))
    assert "not every worker was back" in " ".join(scale.validate_restart({"all_back_seconds": None}))
    log = tmp_path / "coordinator.log"
    log.write_text(
        '{"trigger": "WorkerLost", "message": "x"}\n'
        '{"trigger": "Tick", "message": "12 host(s) did not rejoin within the grace; holding"}\n'
        '{"trigger": "WorkerJoined", "message": "y"}\n'
    )
    assert scale._worker_lost_since(log) == 13


def test_a_hold_by_health_report_must_reach_the_reporter_too() -> None:
    every = cycle(hold_expected=100, hold_received=100)
    assert scale.validate(100, [every], 1, 0, held_connected=True) == []
    assert "not 100" in " ".join(scale.validate(100, [cycle()], 1, 0, held_connected=True))
    assert "not 99" in " ".join(scale.validate(100, [every], 1, 0))


def test_a_collapse_names_the_stalled_generator_whose_host_went_first(tmp_path: Path) -> None:
    import json
    import time
    from types import SimpleNamespace

    gens: Any = [SimpleNamespace(first=i * 2500, count=2500) for i in range(4)]
    now = time.time()

    def progress(first: int, lag: float, age: float) -> str:
        return json.dumps({"t": now - age, "first": first, "cpu": 1.0, "lag_max": lag})

    genlog = tmp_path / "generators.log"
    lines = [
        progress(0, 0.05, 2.0),
        progress(5000, 1.55, 1.0),
        progress(2500, 0.9, 1.5),
        "not json",
        progress(0, 3.0, 60),
    ]
    genlog.write_text("\n".join(lines) + "\n")
    lost = '{"message": "host 69.71 lost (heartbeat_timeout); active slice(s) [69] down", "trigger": "WorkerLost"}'
    # Host 69.71 is index 6971: generator 5000.., stalled 1.55 s a second ago.
    cause = scale.collapse_cause(lost, gens, genlog, 100, 1.2)
    assert "load generator 5000.." in cause and "1.55 s" in cause and "69.71" in cause, cause
    # A host of a generator that kept up (0..: its 3.0 s stall is a minute old): the coordinator is named.
    cause = scale.collapse_cause(lost.replace("69.71", "17.99"), gens, genlog, 100, 1.2)
    assert "the coordinator" in cause and "1.55 s" in cause and "17.99" not in cause, cause
    # Below the heartbeat timeout a stall explains nothing.
    cause = scale.collapse_cause(lost.replace("69.71", "25.1"), gens, genlog, 100, 1.2)
    assert "the coordinator" in cause, cause
    # No generators' log: the coordinator, and no lag claimed.
    assert scale.collapse_cause(lost, gens, tmp_path / "missing.log", 100, 1.2).endswith("could not keep up")


def test_a_size_past_the_open_file_limit_is_a_not_run_row_that_names_the_limit(monkeypatch: Any) -> None:
    import resource

    from agent import fdlimit

    def refuse(*_: Any) -> None:
        raise ValueError("not allowed to raise maximum limit")

    monkeypatch.setattr(resource, "getrlimit", lambda _: (20000, 20000))
    monkeypatch.setattr(resource, "setrlimit", refuse)
    assert scale.too_few_open_files(10000) is None
    why = scale.too_few_open_files(25000)
    assert why is not None and f"{fdlimit.need(25000):,}" in why and "20,000" in why
    # Hosts that share connections need a socket a connection: 12,500 at two streams a connection.
    assert scale.too_few_open_files(25000, 2) is None
    assert scale.too_few_open_files(40000, 2) is not None and "20,000 shared connections" in str(
        scale.too_few_open_files(40000, 2)
    )
    ran: list[int] = []
    monkeypatch.setattr(scale, "run_size", lambda n, *a, **k: ran.append(n) or {})
    out = scale.run(sizes=[25000], runs=1)
    assert ran == []
    (row,) = out["results"]
    assert (row["workers"], row["runs"], row["status"], row["valid"]) == (25000, 0, "not_run", False)
    assert row["invalid_reason"] == why
    # A privileged process raises its hard limit instead, and runs the size.
    monkeypatch.setattr(resource, "setrlimit", lambda *_: None)
    assert scale.too_few_open_files(25000) is None


def test_a_host_lost_soon_after_it_registered_gets_both_sides_timelines(tmp_path: Path) -> None:
    import json

    def coord(t: str, message: str, trigger: str) -> str:
        return json.dumps({"message": message, "time": f"2026-12-06T05:48:{t}Z", "trigger": trigger})

    lines = [
        coord("10.000000", "host 69.78 (loadgen-6978) re-registered; waiting for 5 host(s) to rejoin", "WorkerJoined"),
        coord("10.100000", "host 69.80 (loadgen-6980) re-registered; waiting for 4 host(s) to rejoin", "WorkerJoined"),
        coord("11.260000", "host 69.78 lost (heartbeat_timeout); waiting for 4 host(s) to rejoin", "WorkerLost"),
        # Lost long after its registration: a later silence, not the registration's (no timeline).
        coord("40.000000", "host 69.80 lost (heartbeat_timeout); active slice(s) [69] down", "WorkerLost"),
        # Its return: a later registration must not be read as the one that was lost.
        coord("30.000000", "host 69.78 (loadgen-6978) came back after it was declared lost", "WorkerJoined"),
    ]
    (tmp_path / "c.log").write_text("\n".join(lines) + "\n")
    t_reg = scale.iso_to_epoch("2026-12-06T05:48:10.000000Z")
    session = {"short_session": 6978, "reply": t_reg + 0.02, "datagrams_from": t_reg + 0.03}
    session |= {"stream_heartbeats": [t_reg + 0.2, t_reg + 0.45, t_reg + 0.7], "ended": t_reg + 1.3}
    other = session | {"reply": t_reg + 25.0}  # an older or later session of the same host
    (tmp_path / "g.log").write_text(json.dumps(other) + "\nnot json\n" + json.dumps(session) + "\n")
    got = scale.lost_host_timelines(tmp_path / "c.log", tmp_path / "g.log", 100)
    assert got == [
        {
            "host": "69.78",
            "lost_s": 1.26,
            "reply_s": 0.02,
            "datagrams_from_s": 0.03,
            "stream_heartbeats_s": [0.2, 0.45, 0.7],
        }
    ]
    text = scale.describe_timelines(got)
    assert "host 69.78: reply read +0.02 s" in text and "first heartbeat sent at +0.03 s" in text, text
    assert "judged lost at +1.26 s (3 stream heartbeats sent, no datagram confirmed)" in text, text
    # Without the stand-in's lines the loss is still named.
    (tmp_path / "g.log").write_text("")
    got = scale.lost_host_timelines(tmp_path / "c.log", tmp_path / "g.log", 100)
    assert scale.describe_timelines(got) == "host 69.78 lost 1.26 s after it registered (no stand-in timeline)"
    assert scale.validate_restart({"all_back_seconds": 20.0, "hosts_lost": 1, "lost_host_timelines": got}) == [
        "1 hosts were lost across the restart (host 69.78 lost 1.26 s after it registered (no stand-in timeline))"
    ]


def test_rows_whose_hosts_shared_connections_say_so_on_the_page() -> None:
    from bench.report import sec_scale

    docs = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.json"
    sc = json.loads(docs.read_text())["benchmarks"]["scale"]
    for r in sc["results"]:
        r.pop("streams_per_connection", None)
    assert "streams a connection" not in "\n".join(sec_scale(copy.deepcopy(sc)))
    row = max(sc["results"], key=lambda r: r["workers"])
    row["streams_per_connection"] = 2
    assert f"| {row['workers']} (2 streams a connection) |" in "\n".join(sec_scale(sc))
