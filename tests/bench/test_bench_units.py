"""The benchmarks' own arithmetic and checks, without running anything: fault phases, fault cost
against the fault-free rate, ratios, scale validity, and the combined JSON's provenance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import detection, recovery, scale
from bench.__main__ import combine


def test_fault_phases_are_seeded_and_inside_a_checkpoint_period() -> None:
    cfg = recovery.Config.make(runs=5, checkpoint_periods=[25, 100])
    for period in (25, 100):
        steps = [recovery.fault_step(cfg, period, rep) for rep in range(20)]
        assert steps == [recovery.fault_step(cfg, period, rep) for rep in range(20)]  # same seed, same phases
        first = period * max(1, -(-(recovery.WARMUP_STEP + 10) // period))
        assert all(first < s <= first + period for s in steps), steps
        assert len({s - first for s in steps}) > 3, "phases vary"
    other = recovery.Config.make(runs=5, seed=1)
    assert [recovery.fault_step(other, 100, r) for r in range(20)] != [
        recovery.fault_step(cfg, 100, r) for r in range(20)
    ]


def test_sweep_runs_the_sweep_faults_everywhere_and_the_rest_at_the_realistic_point() -> None:
    cfg = recovery.Config.make(checkpoint_periods=[25, 100], delays=[5.0, 30.0], faults=["kill", "notice"])
    cases = cfg.cases()
    assert sorted(c for c in cases if c[0] == "kill") == [("kill", p, d) for p in (25, 100) for d in (5.0, 30.0)]
    assert [c for c in cases if c[0] == "notice"] == [("notice", 100, 30.0)]


def test_a_cross_sweep_varies_one_axis_at_a_time_through_the_realistic_point() -> None:
    cfg = recovery.Config.make(
        checkpoint_periods=[20, 50],
        delays=[5.0, 15.0],
        realistic_checkpoint_period=50,
        realistic_delay=15.0,
        faults=["kill", "hang"],
        sweep="cross",
    )
    assert sorted(c for c in cfg.cases() if c[0] == "kill") == [
        ("kill", 20, 15.0),
        ("kill", 50, 5.0),
        ("kill", 50, 15.0),
    ]
    assert [c for c in cfg.cases() if c[0] == "hang"] == [("hang", 50, 15.0)]


def test_bad_sweep_or_reference_count_is_refused_naming_it() -> None:
    import pytest

    with pytest.raises(ValueError, match="sweep 'diagonal'"):
        recovery.Config.make(sweep="diagonal")
    with pytest.raises(ValueError, match="fault_free_runs 6"):
        recovery.Config.make(runs=5, fault_free_runs=6)


def test_state_size_option_gives_at_least_what_was_asked() -> None:
    cfg = recovery.Config.make(state_mib=1024)
    assert cfg.ballast_mib() == 256
    assert 2**30 <= cfg.state_bytes() < 1.01 * 2**30
    assert "--trainer-arg=--ballast-mib=256" in recovery._strategy_args(cfg, "sidecar", 100)
    assert recovery.Config.make().ballast_mib() is None


def steps(n: int, dt: float, slices: list[int], t0: float = 0.0, first: int = 1) -> list[dict[str, Any]]:
    return [{"kind": "step", "step": first + i, "t": t0 + (i + 1) * dt, "slices": slices} for i in range(n)]


def test_work_and_time_counts_each_steps_last_execution_by_its_slices() -> None:
    # 10 steps on 4 slices, then steps 6..10 again on 2 slices (a rewind onto half the job).
    ev = steps(10, 1.0, [0, 1, 2, 3]) + steps(5, 1.0, [0, 1], t0=20.0, first=6)
    work, secs = recovery.work_and_time(ev, 4)
    assert work == 2 + 5 * 0.5  # steps 4, 5 at full capacity, 6..10 at half
    assert secs == 25.0 - 3.0


def test_a_fault_free_runs_steady_rate_counts_from_past_its_start(tmp_path: Path) -> None:
    # A process that pays 2 s once early on (the sidecar's probe snapshots), then 0.05 s a step.
    ev = steps(recovery.WARMUP_STEP + 20, 0.05, [0, 1, 2, 3])
    ev[-1]["t"] += 2.0
    t = ev[-1]["t"]
    ev += [
        {"kind": "step", "step": len(ev) + 1 + i, "t": t + (i + 1) * 0.05, "slices": [0, 1, 2, 3]}
        for i in range(recovery.SETTLE_STEPS + 100)
    ]
    job = tmp_path / "job"
    job.mkdir()
    (job / "trainer-events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ev))
    (job / "harness-events.jsonl").write_text("")
    m = recovery.analyse(job, {}, 4, faulted=False)
    assert m["steady_seconds_per_step"] == 0.05, m
    assert m["seconds"] / m["work_steps"] > 0.06, "the whole run's rate keeps the one-off cost"
    cfg = recovery.Config.make(quick=True, strategies=["sidecar"], faults=["kill"])
    ref = run("sidecar", None, 10.0, 100.0, steady_seconds_per_step=0.05)
    (row,) = recovery.summarise(cfg, [run("sidecar", "kill", 12.0, 100.0)], {("sidecar", 20): [ref]})
    assert row["steady_step_seconds_median"] == 0.05 and "fault-free" in row["steady_step_source"]
    assert row["fault_free_seconds_per_step"] == 0.1


def run(strategy: str, fault: str | None, secs: float, work: float, **kw: Any) -> dict[str, Any]:
    return {
        "strategy": strategy,
        "fault": fault,
        "checkpoint_period": 20,
        "replacement_delay": 1.0,
        "seconds": secs,
        "work_steps": work,
        "lost_steps": kw.pop("lost", 0),
        "recovery_s": 0.5,
        **kw,
    }


def test_fault_cost_is_time_beyond_the_fault_free_rate_and_failed_runs_do_not_count() -> None:
    cfg = recovery.Config.make(quick=True, strategies=["checkpoint_rewind", "sidecar"], faults=["kill"])
    refs = {
        ("checkpoint_rewind", 20): [run("checkpoint_rewind", None, 10.0, 100.0)],  # 10 steps a second
        ("sidecar", 20): [run("sidecar", None, 10.0, 100.0)],
    }
    runs = [
        run("checkpoint_rewind", "kill", 14.0, 100.0, lost=13),
        run("checkpoint_rewind", "kill", 16.0, 100.0, lost=15),
        run("checkpoint_rewind", "kill", 15.0, 100.0, lost=14),
        run("sidecar", "kill", 11.0, 100.0),
        run("sidecar", "kill", 12.0, 100.0),
        run("sidecar", "kill", 99.0, 100.0, error="exit code 1"),
    ]
    rows = {r["strategy"]: r for r in recovery.summarise(cfg, runs, refs)}
    rw, sc = rows["checkpoint_rewind"], rows["sidecar"]
    assert (rw["runs"], rw["failed_runs"]) == (3, 0)
    assert rw["fault_cost_seconds_median"] == 5.0 and rw["lost_steps_median"] == 14
    assert (sc["runs"], sc["failed_runs"]) == (2, 1) and sc["failures"] == ["exit code 1"]
    assert sc["fault_cost_seconds_median"] == 1.5
    (ratio,) = recovery.ratios(list(rows.values()))
    assert ratio["baseline"] == "checkpoint_rewind" and ratio["ratio"] == round(5.0 / 1.5, 2)


def test_no_ratio_when_the_sidecars_cost_is_not_above_zero() -> None:
    base = {"trainer": "example", "fault": "kill", "checkpoint_period": 20, "replacement_delay": 1.0, "runs": 3}
    rows = [
        {**base, "strategy": "sidecar", "fault_cost_seconds_median": -0.01},
        {**base, "strategy": "full_restart", "fault_cost_seconds_median": 4.0},
    ]
    (r,) = recovery.ratios(rows)
    assert r["ratio"] is None and "not above zero" in r["why_none"]


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


def test_the_example_rows_leave_maxtext_to_its_runner() -> None:
    cfg = recovery.Config.make(quick=True, trainers=["maxtext"], faults=["kill"])
    assert recovery.summarise(cfg, [], {}) == []  # bench.recovery_maxtext makes (and measures) those rows


def test_sweep_strategies_are_checked_and_the_rewinding_baselines_get_longer_after_a_fault() -> None:
    import pytest

    with pytest.raises(ValueError, match="bogus"):
        recovery.Config.make(sweep_strategies=["sidecar", "bogus"])
    cfg = recovery.Config.make(sweep_strategies=["sidecar"])
    assert cfg.sweep_strategies == ["sidecar"]
    # Full restart waits for nothing; the sidecar's run is the delay plus its margin; the
    # baselines that train on the survivors until their poll sees the replacement get half again.
    step = 0.1
    full = recovery.post_fault_seconds(cfg, "full_restart", 50, step, 10.0)
    assert full == recovery.margin_seconds(cfg, "full_restart", 50, step)
    side = recovery.post_fault_seconds(cfg, "sidecar", 50, step, 10.0)
    assert side == 10.0 + recovery.margin_seconds(cfg, "sidecar", 50, step)
    for s in ("checkpoint_rewind", "local_checkpoint_rewind", "memory_snapshot"):
        got = recovery.post_fault_seconds(cfg, s, 50, step, 10.0)
        assert got == recovery.SURVIVOR_PACE * (10.0 + recovery.margin_seconds(cfg, s, 50, step))
    # A strategy left out of the sweep needs no fault-free reference at a period it never runs at.
    assert cfg.runs_at_period("memory_snapshot", cfg.realistic_checkpoint_period)
    assert not cfg.runs_at_period("memory_snapshot", min(cfg.checkpoint_periods))
    assert cfg.runs_at_period("sidecar", min(cfg.checkpoint_periods))


def test_a_read_run_keeps_its_logs_but_not_its_checkpoints(tmp_path: Path) -> None:
    from bench.recovery import drop_checkpoints

    job = tmp_path / "job"
    for d in ("checkpoints/50/state", "local-checkpoints/70", "logs"):
        (job / d).mkdir(parents=True)
    (job / "checkpoints" / "50" / "state" / "data").write_bytes(b"x" * 1024)
    (job / "logs" / "trainer.log").write_text("log\n")
    (job / "trainer-events.jsonl").write_text("{}\n")
    drop_checkpoints(job)
    assert sorted(p.name for p in job.iterdir()) == ["logs", "trainer-events.jsonl"]
    assert (job / "logs" / "trainer.log").read_text() == "log\n"
    drop_checkpoints(tmp_path / "missing")  # a run that never made its directory


def test_a_run_does_not_start_without_disk_space_for_its_checkpoints(tmp_path: Path, monkeypatch: Any) -> None:
    import shutil as sh

    cfg = recovery.Config.make(state_mib=1024)
    usage = sh.disk_usage(tmp_path)
    monkeypatch.setattr(recovery.shutil, "disk_usage", lambda p: usage._replace(free=2 * 2**30))
    why = recovery.free_space_error(cfg, tmp_path)
    assert why is not None and "2.0 GiB free" in why and str(tmp_path) in why
    m = recovery.run_one(cfg, "sidecar", 50, tmp_path, "r", fault="kill", at_step=71, delay=10.0, steps=200)
    assert m["error"] == why and m["exit_code"] is None and m["strategy"] == "sidecar"
    monkeypatch.setattr(recovery.shutil, "disk_usage", lambda p: usage._replace(free=100 * 2**30))
    assert recovery.free_space_error(cfg, tmp_path) is None


def test_the_maxtext_runner_gets_the_fault_free_run_count(tmp_path: Path, monkeypatch: Any) -> None:
    from bench import recovery_maxtext

    seen: list[Any] = []

    def fake(**kw: Any) -> dict[str, Any]:
        seen.append(kw.get("fault_free_runs"))
        return {"rows": [], "runs": [], "config": {}, "fault_free_runs": []}

    monkeypatch.setattr(recovery_maxtext, "run", fake)
    recovery.run(workdir=tmp_path, trainers=["maxtext"], runs=5, fault_free_runs=1)
    recovery.run(workdir=tmp_path, trainers=["maxtext"], runs=5)
    assert seen == [1, None]  # None: a fault-free run in every round


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


def test_fresh_memory_is_timed_one_gib_at_a_time() -> None:
    from bench.common import fresh_memory_seconds

    got = fresh_memory_seconds(1)
    assert len(got) == 1 and isinstance(got[0], float) and 0 < got[0] < 600
    assert fresh_memory_seconds(0) == []


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


def test_a_runs_own_pre_fault_rate_counts_only_steps_before_the_fault() -> None:
    # 30 steps a second apart on 4 slices, then (after the fault at t=30.5) 10 more on 2 slices.
    ev = steps(30, 1.0, [0, 1, 2, 3]) + steps(10, 1.0, [0, 1], t0=40.0, first=31)
    rate = recovery.pre_fault_rate(ev, 4, fault_time=30.5)
    assert rate == pytest.approx((30 - recovery.WARMUP_STEP) / (30.0 - 3.0))
    # Too few steps before the fault: no rate rather than a noisy one.
    assert recovery.pre_fault_rate(ev, 4, fault_time=float(recovery.WARMUP_STEP + 2)) is None


def test_the_sidecars_snapshot_cadence_reaches_its_trainer_only() -> None:
    cfg = recovery.Config.make(quick=True, snapshot_every=8)
    assert "--trainer-arg=--snapshot-every=8" in recovery._strategy_args(cfg, "sidecar", 20)
    assert not any("snapshot-every" in a for a in recovery._strategy_args(cfg, "memory_snapshot", 20))
    # The default is the MaxText hook's: auto (an interval by measurement, none at the checkpoint period).
    default = recovery.Config.make(quick=True)
    assert "--trainer-arg=--snapshot-every=auto" in recovery._strategy_args(default, "sidecar", 20)
    assert recovery._row(default, "example", "sidecar", "kill", 20, 1.0)["snapshot_every"] == "auto"
    every_step = recovery.Config.make(quick=True, snapshot_every=1)
    assert not any("snapshot-every" in a for a in recovery._strategy_args(every_step, "sidecar", 20))
    assert recovery._row(cfg, "example", "sidecar", "kill", 20, 1.0)["snapshot_every"] == 8
    with pytest.raises(ValueError, match="snapshot_every -2"):
        recovery.Config.make(quick=True, snapshot_every=-2)


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


def test_recovery_options_reach_recovery_and_goodput_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recovery options go to both benchmarks from one list: a value given once reaches each run."""
    from bench import goodput
    from bench.__main__ import build_parser, run_one

    calls: dict[str, dict[str, Any]] = {}
    monkeypatch.setattr(recovery, "run", lambda **kw: calls.setdefault("recovery", kw))
    monkeypatch.setattr(goodput, "run", lambda **kw: calls.setdefault("goodput", kw))
    given = ["--strategies", "sidecar", "--delays", "5", "--seed", "7", "--repeats", "2", "--state-mib", "64"]
    given += ["--no-donate", "--poll-interval", "3", "--trainer", "example", "--faults", "kill"]
    given += ["--fault-free-runs", "4"]
    for name in ("recovery", "goodput"):
        run_one(name, build_parser().parse_args([name, *given]))
    shared = {"strategies": ["sidecar"], "delays": [5.0], "seed": 7, "runs": 2, "state_mib": 64, "donate": False}
    shared |= {"poll_interval": 3.0, "trainers": ["example"], "fault_free_runs": 4}
    for name in ("recovery", "goodput"):
        assert shared.items() <= calls[name].items(), (name, calls[name])
    assert calls["recovery"]["faults"] == ["kill"] and "faults" not in calls["goodput"]
    assert set(calls["goodput"]) - {"quick", "sched", "recovery_result", "recovery_source", "workdir"} < set(
        calls["recovery"]
    )
