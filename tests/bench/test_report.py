"""bench/report.py renders docs/benchmarks.md from JSON alone, and never calls an invalid run met.

The fixture is generated here in the shape ``python -m bench`` writes (the smoke tests check
that real runs have that shape); its figures are distinctive so that every decimal on the page
can be traced back to it.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from bench import goodput
from bench.__main__ import combine
from bench.report import fmt, render, sections, targets
from bench.report import main as report_main

SHA = "0123456789abcdef0123456789abcdef01234567"


def section(name: str, config: dict[str, Any], results: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "schema": 2,
        "name": name,
        "git_sha": SHA,
        "dirty": False,
        "machine": {
            "cores": 2,
            "cores_usable": 2,
            "memory_gib": 23.5,
            "cpu_model": "Test CPU",
            "python": "3.12.1",
            "jax": "0.12.0.1",
            "load_average_at_start": [1.25, 1.5, 1.75],
        },
        "config": {"argv": [name, "--quick"], **config},
        "results": results,
        "started_at": "2026-12-01 00:00:00 UTC",
        "duration_s": 12.5,
        "load_average_at_end": [2.25, 2.5, 2.75],
        "method": f"How {name} was measured.",
        **extra,
    }


def rec_row(trainer: str, strategy: str, cost: float | None, **kw: Any) -> dict[str, Any]:
    row = {
        "trainer": trainer,
        "strategy": strategy,
        "fault": "kill",
        "replacement_delay": 30.0,
        "checkpoint_period": 100,
        "state_bytes": 1107296256,
        "donate": True,
        "runs": 5,
        "failed_runs": 0,
        "lost_steps_median": 41,
        "lost_steps_max": 77,
        "fault_cost_seconds_median": cost,
        "fault_cost_seconds_p90": None if cost is None else cost + 0.111,
        "fault_cost_seconds_min": None if cost is None else cost - 0.123,
        "fault_cost_seconds_max": None if cost is None else cost + 0.222,
        "recovery_seconds_median": 1.337,
        "restored_from": ["checkpoint"],
    }
    row.update(kw)
    return row


def fixture() -> dict[str, Any]:
    rec_rows = [
        rec_row("example", "full_restart", 40.417),
        rec_row("example", "checkpoint_rewind", 6.183),
        rec_row("example", "sidecar", 1.733),
        rec_row("maxtext", "sidecar", None, runs=0, status="not_run", invalid_reason="not implemented: no runner"),
        rec_row(
            "maxtext", "checkpoint_rewind", None, runs=0, status="not_run", invalid_reason="not implemented: no runner"
        ),
    ]
    ratios = [
        {
            "trainer": "example",
            "fault": "kill",
            "checkpoint_period": 100,
            "replacement_delay": 30.0,
            "baseline": "full_restart",
            "baseline_fault_cost_seconds_median": 40.417,
            "sidecar_fault_cost_seconds_median": 1.733,
            "ratio": 23.32,
        },
        {
            "trainer": "example",
            "fault": "kill",
            "checkpoint_period": 100,
            "replacement_delay": 30.0,
            "baseline": "checkpoint_rewind",
            "baseline_fault_cost_seconds_median": 6.183,
            "sidecar_fault_cost_seconds_median": 1.733,
            "ratio": 3.57,
        },
    ]
    rec = section(
        "recovery",
        {
            "realistic_checkpoint_period": 100,
            "realistic_delay": 30.0,
            "state_bytes": 1107296256,
            "slices": 4,
            "donate": True,
            "seed": 0,
            "fresh_memory_seconds": [0.74, 0.782, 8.814],
        },
        rec_rows,
        ratios=ratios,
    )
    scale_rows = [
        {
            "workers": 1000,
            "heartbeat_interval": 0.25,
            "heartbeat_timeout": 1.2,
            "coordinator_cores": 0.137,
            "coordinator_rss_mib": 88.4,
            "fanout_p99_seconds": 0.0421,
            "delivered_fraction": 1.0,
            "cycles": 3,
            "valid": True,
        },
        # Under the CPU target, but invalid: it must never read as met.
        {
            "workers": 10000,
            "heartbeat_interval": 0.25,
            "heartbeat_timeout": 1.2,
            "coordinator_cores": 0.3141,
            "coordinator_rss_mib": 612.7,
            "fanout_p99_seconds": 0.6543,
            "delivered_fraction": 0.2391,
            "cycles": 1,
            "valid": False,
            "invalid_reason": "cycle 1: hold reached 2391 of 9999 live workers",
        },
    ]
    for r in scale_rows:
        r["topology"] = "flat"
        r.setdefault("runs", 3)
        r.setdefault("coordinator_socket_drops", 0)
    scale = section(
        "scale",
        {"heartbeat_interval": 0.25, "shipped_heartbeat_interval": 0.25, "shipped_heartbeat_timeout": 1.2},
        scale_rows,
    )
    flush_rows = [
        {
            "size_mib": 256,
            "method": "raw",
            "runs": 5,
            "seconds_median": 0.8123,
            "seconds_min": 0.7012,
            "seconds_max": 0.9987,
            "mib_per_s_median": 315.2,
            "fraction_of_raw_median": None,
        },
        {
            "size_mib": 256,
            "method": "orbax_zstd",
            "runs": 5,
            "seconds_median": 2.4567,
            "seconds_min": 2.3011,
            "seconds_max": 2.9876,
            "mib_per_s_median": 104.2,
            "fraction_of_raw_median": 0.331,
            "fraction_of_raw_min": 0.287,
            "fraction_of_raw_max": 0.402,
        },
        {
            "size_mib": 256,
            "method": "orbax_uncompressed",
            "runs": 5,
            "seconds_median": 1.0543,
            "seconds_min": 0.9876,
            "seconds_max": 1.2109,
            "mib_per_s_median": 242.8,
            "fraction_of_raw_median": 0.771,
            "fraction_of_raw_min": 0.712,
            "fraction_of_raw_max": 0.833,
        },
    ]
    flush_rows.append(
        {
            "method": "step_boundary_idle",
            "runs": 5,
            "microseconds_median": 0.0376,
            "microseconds_max": 0.0412,
            "calls_per_run": 1000000,
            "report_step_microseconds_median": 2.768,
        }
    )
    flush = section("flush", {"sizes_mib": [256]}, flush_rows)
    detection = section(
        "detection",
        {"slices": 4},
        [
            {
                "kind": kind,
                "available": True,
                "runs": 5,
                "errors": 0,
                "detection_seconds_median": med,
                "decision_seconds_median": med,
                "decision_seconds_p90": worst,
                "decision_seconds_max": worst,
                **(
                    {"sent_to_decision_seconds_median": med + 0.05, "sent_to_decision_seconds_max": worst + 0.15}
                    if kind == "pubsub_notice"
                    else {}
                ),
                "via": [via],
            }
            for kind, med, worst, via in (
                ("kill", 0.0071, 0.0093, "WorkerLost(stream_closed)"),
                ("hang", 1.1574, 1.1794, "WorkerLost(heartbeat_timeout)"),
                ("pubsub_notice", 0.0584, 0.0625, "NodeNotice"),
                ("metadata_notice", 0.0045, 0.0055, "NodeNotice"),
            )
        ],
    )
    footprint = section(
        "footprint",
        {"workers": 4},
        [
            {
                "role": role,
                "runs": 3,
                "idle_cpu_pct_median": cpu,
                "idle_cpu_pct_max": cpu + 0.1,
                "rss_mib_median": rss,
                "uss_mib_median": rss - 24.5,
                "startup_seconds_median": 0.271,
            }
            for role, cpu, rss in (("coordinator", 0.7, 55.1), ("worker", 0.3, 55.6))
        ],
        summary={"coordinator_main_thread_cpu_pct": 0.45, "coordinator_other_threads_cpu_pct": 0.25},
        rounds=[{}, {}, {}],
    )
    gp_rows, gp_proj = goodput.compute(
        [
            {**rec_row("example", "full_restart", 25.125), "fault_free_seconds_per_step": 0.0625},
            {**rec_row("example", "sidecar", 7.875), "fault_free_seconds_per_step": 0.0675},
        ],
        goodput.Schedule(run_hours=24.0, fault_interval_minutes=30.0, fault_mix={"kill": 1.0}),
    )
    gp = section(
        "goodput",
        {"run_hours": 24.0, "fault_interval_minutes": 30.0, "fault_mix": {"kill": 1.0}, "formula": "as stated"},
        gp_rows,
        projection=gp_proj,
    )
    overhead = section(
        "step_overhead",
        {"rounds": 5, "steps": 2000, "steal_limit": 0.01},
        [
            {"trainer": "maxtext", "variant": "plain", "runs": 5, "wall_step_seconds_median": 0.035},
            {
                "trainer": "maxtext",
                "variant": "sidecar",
                "runs": 5,
                "rounds_used": 5,
                "overhead_fraction_median": 0.012,
                "overhead_fraction_per_round": [0.01, 0.012, 0.02, 0.005, 0.015],
                "cpu_overhead_fraction_median": 0.018,
            },
        ],
    )
    return combine([gp, rec, overhead, detection, scale, flush, footprint])


def numbers(obj: Any) -> set[str]:
    """Every number in a JSON value, as the report may print it."""
    out: set[str] = set()
    if isinstance(obj, dict):
        for v in obj.values():
            out |= numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            out |= numbers(v)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out.add(str(obj))
        if isinstance(obj, float) and obj.is_integer():
            out.add(str(int(obj)))
    elif isinstance(obj, str):
        out |= set(re.findall(r"\d+\.\d+", obj))
    return out


# Thresholds of the targets (report.py defines them; they are goals, not results).
THRESHOLDS = {"0.5", "0.7", "0.2", "1.0", "2.0"}


def test_every_decimal_on_the_page_is_in_the_json(tmp_path: Path) -> None:
    data = fixture()
    md = render(data)
    known = numbers(data) | THRESHOLDS
    decimals = set(re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", md))
    assert decimals, "the page shows figures"
    assert decimals <= known, f"figures not in the JSON: {sorted(decimals - known)}"


def test_commit_and_machine_are_printed() -> None:
    md = render(fixture())
    assert SHA in md
    assert "Test CPU" in md and "2 cores" in md
    assert "Writing fresh memory at the start of the run, each GiB in turn (s): 0.74, 0.782, 8.814" in md


def test_invalid_rows_are_printed_invalid_and_never_met() -> None:
    data = fixture()
    md = render(data)
    row = next(line for line in md.splitlines() if line.startswith("| 10000 "))
    assert "**INVALID**" in row and "hold reached 2391 of 9999" in row
    cpu = next(v for v in targets(sections(data)) if v.target == "coordinator CPU")
    assert cpu.verdict == "invalid", cpu
    # The same figures marked valid would meet the target: the verdict above comes from validity.
    ok = copy.deepcopy(data)
    r = ok["benchmarks"]["scale"]["results"][1]
    r["valid"] = True
    del r["invalid_reason"]
    assert next(v for v in targets(sections(ok)) if v.target == "coordinator CPU").verdict == "met"
    # The fan-out's basis says how the first copies came, as a share, and who also got a stream copy.
    r.update(
        fanout_p99_processed_seconds=1.2272,
        hold_first_by_datagram=0.9987,
        hold_stream_copies=[952, 0, 1364],
        stream_fanout_p99_seconds=1.6617,
    )
    fan = next(v for v in targets(sections(ok)) if v.target == "hold fan-out p99 (worst cycle)")
    assert fan.verdict == "met" and "(99.87% of first copies came by datagram)" in fan.basis, fan
    assert "stream's copy: 952-1364 a cycle, p99 1.6617 s" in fan.basis, fan


def test_targets_from_data() -> None:
    doc = fixture()
    vs = {v.target: v for v in targets(sections(doc))}
    # No MaxText row ran: not measured, with the row's own reason.
    mt = vs["sidecar vs checkpoint rewind, MaxText (kill)"]
    assert mt.verdict == "not measured" and "not implemented" in mt.basis
    assert vs["sidecar vs checkpoint rewind, example trainer (kill)"].verdict == "met"  # 3.57 >= 3
    assert vs["sidecar vs full restart, example trainer (kill)"].verdict == "met"  # 23.32 >= 10
    assert vs["flush throughput (orbax_zstd)"].verdict == "not met"
    assert vs["flush throughput (orbax_uncompressed)"].verdict == "met"
    assert vs["hold fan-out p99 (worst cycle)"].verdict == "invalid"
    assert vs["step_boundary() with nothing pending"].verdict == "met"
    assert vs["detection: kill to hold decision"].verdict == "met"
    # The median and the worst run, each with its unit, and the run count.
    kill = vs["detection: kill to hold decision"]
    r = next(r for r in doc["benchmarks"]["detection"]["results"] if r["kind"] == "kill")
    assert kill.measured == (
        f"{fmt(r['decision_seconds_median'])} s [worst {fmt(r['decision_seconds_max'])} s], n={r['runs']}"
    )
    assert vs["coordinator RSS"].verdict == "met"
    # A Pub/Sub notice is judged from its receipt; its publish-to-hold figure stands beside it.
    ps = vs["detection: pubsub_notice to hold decision"]
    assert ps.verdict == "met" and "from the subscriber's receipt" in ps.basis
    assert "from publishing" in ps.basis and "[worst 0.2125 s]" in ps.basis
    assert "from publishing" not in vs["detection: metadata_notice to hold decision"].basis


def test_a_page_with_every_benchmark_judges_every_target(tmp_path: Path) -> None:
    data = fixture()
    md = render(data)
    for title in ("Goodput", "Recovery", "Step overhead", "Detection", "Scale", "Flush", "Footprint"):
        assert f"## {title}" in md, title
    assert "Not in this file" not in md
    vs = targets(sections(data))
    assert {v.verdict for v in vs} <= {"met", "not met", "not measured", "invalid"}
    # Figures carry their run counts.
    for v in vs:
        if v.verdict in ("met", "not met"):
            assert "n=" in v.measured or "windows" in v.measured, v


def test_the_10000_worker_target_states_its_cause_and_the_topology() -> None:
    data = fixture()
    cpu = next(v for v in targets(sections(data)) if v.target == "coordinator CPU")
    assert cpu.verdict == "invalid" and "hold reached 2391 of 9999 live workers" in cpu.basis
    md = render(data)
    assert "Per-slice leaders (one aggregated stream per slice) are not built" in md
    # Valid, but saturated: not met, saying the loop was saturated.
    sat = copy.deepcopy(data)
    r = sat["benchmarks"]["scale"]["results"][1]
    r.update(valid=True, cycles=3, coordinator_cores=1.0899, coordinator_cores_main_thread=0.9748, saturated=True)
    del r["invalid_reason"]
    cpu = next(v for v in targets(sections(sat)) if v.target == "coordinator CPU")
    assert cpu.verdict == "not met" and "event loop was saturated" in cpu.basis
    # Under the target but at a heartbeat other than the shipped one: not measured.
    slow = copy.deepcopy(sat)
    r = slow["benchmarks"]["scale"]["results"][1]
    r.update(coordinator_cores=0.3141, saturated=False, heartbeat_interval=1.0, heartbeat_timeout=3.0)
    cpu = next(v for v in targets(sections(slow)) if v.target == "coordinator CPU")
    assert cpu.verdict == "not measured" and "not the shipped 0.25 s" in cpu.basis


def test_a_scale_row_heartbeating_by_another_transport_than_the_shipped_one_is_not_measured() -> None:
    data = fixture()
    sc = data["benchmarks"]["scale"]
    sc["config"]["shipped_heartbeats"] = "datagram"
    r = sc["results"][1]
    r.update(valid=True, cycles=3, heartbeats="datagram")
    del r["invalid_reason"]
    assert next(v for v in targets(sections(data)) if v.target == "coordinator CPU").verdict == "met"
    # A row without the field is from before datagrams: it heartbeat on its stream.
    del r["heartbeats"]
    cpu = next(v for v in targets(sections(data)) if v.target == "coordinator CPU")
    assert cpu.verdict == "not measured" and "heartbeats by stream, not the shipped datagram" in cpu.basis
    assert "| 10000 | 0.25 / 1.2 | stream |" in render(data)


def test_ratio_below_target_is_not_met() -> None:
    data = fixture()
    for x in data["benchmarks"]["recovery"]["ratios"]:
        x["ratio"] = 1.37
    vs = {v.target: v for v in targets(sections(data))}
    assert vs["sidecar vs checkpoint rewind, example trainer (kill)"].verdict == "not met"


def test_example_ratios_are_judged_against_each_runs_own_pre_fault_rate_where_every_run_has_one() -> None:
    data = fixture()
    for x in data["benchmarks"]["recovery"]["ratios"]:
        x["ratio"] = 1.43  # against the fault-free runs' rate: not met
    rec = data["benchmarks"]["recovery"]
    rows = {r["strategy"]: r for r in rec["results"] if r["trainer"] == "example"}
    per_run = {"checkpoint_rewind": 13.69, "full_restart": 24.41, "sidecar": 1.844}
    for name, own in per_run.items():
        rows[name].update(fault_cost_own_rate_seconds_median=own, fault_cost_own_rate_runs=rows[name]["runs"])
    key = ("fault", "checkpoint_period", "replacement_delay")
    rec["runs"] = [
        {"trainer": "example", "strategy": n, **{k: rows[n][k] for k in key}, "fault_cost_own_rate_s": c}
        for n, c in per_run.items()
        for _ in range(rows[n]["runs"])
    ]
    rows["checkpoint_rewind"]["fault_free_rate_spread"] = 0.148
    vs = {v.target: v for v in targets(sections(data))}
    rewind = vs["sidecar vs checkpoint rewind, example trainer (kill)"]
    assert rewind.verdict == "met" and rewind.measured.startswith("7.42x (checkpoint_rewind 13.69 s")
    assert "fault-free runs' rate instead: 1.43x" in rewind.basis and "spreading 0.148" in rewind.basis
    # A row whose cost against the fault-free runs' rate went below zero in a run (that rate's noise) is
    # judged on its own-rate cost, the reason stated beside it.
    rows["checkpoint_rewind"]["invalid_reason"] = "fault cost below zero in 1 of 5 runs (lowest -0.673 s): noise"
    rewind = {v.target: v for v in targets(sections(data))}["sidecar vs checkpoint rewind, example trainer (kill)"]
    assert rewind.verdict == "met"
    assert "not valid on that basis: checkpoint_rewind: fault cost below zero" in rewind.basis
    # ... but not where an own-rate cost is itself below zero.
    rec["runs"][0]["fault_cost_own_rate_s"] = -0.2
    rewind = {v.target: v for v in targets(sections(data))}["sidecar vs checkpoint rewind, example trainer (kill)"]
    assert rewind.verdict == "not measured" and "own-rate cost below zero (lowest -0.2 s)" in rewind.basis
    rec["runs"][0]["fault_cost_own_rate_s"] = 13.69
    del rows["checkpoint_rewind"]["invalid_reason"]
    # A row with a run that had no pre-fault rate keeps the reference-based ratio.
    rows["sidecar"]["fault_cost_own_rate_runs"] = rows["sidecar"]["runs"] - 1
    vs = {v.target: v for v in targets(sections(data))}
    assert vs["sidecar vs checkpoint rewind, example trainer (kill)"].verdict == "not met"


def test_command_line_writes_the_page(tmp_path: Path) -> None:
    store = tmp_path / "benchmarks.json"
    store.write_text(json.dumps(fixture()))
    assert report_main(["--json", str(store), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "benchmarks.md").read_text()
    assert md.startswith("# Benchmarks") and "## Targets" in md and SHA in md
    assert "**NOT RUN**" in md  # the MaxText rows


def test_the_snapshot_cost_per_step_is_on_the_page_once_per_job(tmp_path: Path) -> None:
    data = fixture()
    snap = {"model": "tiny", "params": 115008, "snapshot_ms_per_step_median": 11.65, "snapshot_cost_runs": 3}
    snap["snapshot_fraction_of_step_median"] = 0.9246
    rows = data["benchmarks"]["recovery"]["results"]
    rows += [rec_row("maxtext", "sidecar", 3.2, **snap), rec_row("maxtext", "sidecar", 3.9, fault="notice", **snap)]
    store = tmp_path / "benchmarks.json"
    store.write_text(json.dumps(data))
    assert report_main(["--json", str(store), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "benchmarks.md").read_text()
    assert "snapshot ms per step" in md
    lines = [x for x in md.splitlines() if "11.65" in x]
    assert len(lines) == 1 and "0.9246" in lines[0] and "maxtext" in lines[0], lines


def test_quick_or_too_few_runs_are_not_judged() -> None:
    quick = fixture()
    quick["benchmarks"]["recovery"]["quick"] = True
    v = next(v for v in targets(sections(quick)) if v.target == "sidecar vs checkpoint rewind, example trainer (kill)")
    assert v.verdict == "not measured" and "quick" in v.basis
    few = fixture()
    for r in few["benchmarks"]["recovery"]["results"]:
        r["runs"] = min(r["runs"], 3)
    v = next(v for v in targets(sections(few)) if v.target == "sidecar vs checkpoint rewind, example trainer (kill)")
    assert v.verdict == "not measured" and "fewer than the 5" in v.basis


def test_separate_recovery_runs_of_one_commit_merge_by_trainer(tmp_path: Path) -> None:
    """The example trainer and MaxText run separately (their own rounds) into one recovery section."""
    from bench.__main__ import merge

    cfg = {"realistic_checkpoint_period": 50, "realistic_delay": 10.0, "slices": 4, "seed": 0, "runs": 3}
    example = section(
        "recovery",
        {**cfg, "trainers": ["example"], "state_bytes": 1073741824, "donate": True},
        [rec_row("example", s, c, checkpoint_period=50, replacement_delay=10.0) for s, c in [("sidecar", 1.5)]],
        ratios=[
            {
                "trainer": "example",
                "fault": "kill",
                "checkpoint_period": 50,
                "replacement_delay": 10.0,
                "baseline": "checkpoint_rewind",
                "baseline_fault_cost_seconds_median": 3.0,
                "sidecar_fault_cost_seconds_median": 1.5,
                "ratio": 2.0,
            }
        ],
    )
    mx = {**cfg, "trainers": ["maxtext"], "runs": 5, "maxtext": {"model": "tiny", "slices": 2, "steps": {"50": 110}}}
    maxtext = section(
        "recovery",
        mx,
        [
            rec_row("maxtext", s, c, checkpoint_period=50, replacement_delay=10.0, own_step_seconds_median=t)
            for s, c, t in [("sidecar", 4.25, 0.4), ("checkpoint_rewind", 17.5, 0.2)]
        ],
        ratios=[
            {
                "trainer": "maxtext",
                "fault": "kill",
                "checkpoint_period": 50,
                "replacement_delay": 10.0,
                "baseline": "checkpoint_rewind",
                "baseline_fault_cost_seconds_median": 17.5,
                "sidecar_fault_cost_seconds_median": 4.25,
                "ratio": 4.12,
            }
        ],
    )
    store = tmp_path / "b.json"
    merge(store, [example])
    data = merge(store, [maxtext])
    rec = sections(data)["recovery"]
    assert sorted({r["trainer"] for r in rec["results"]}) == ["example", "maxtext"]
    assert [x["trainer"] for x in rec["ratios"]] == ["example", "maxtext"]
    assert rec["config"]["by_trainer"]["example"]["runs"] == 3 and rec["config"]["by_trainer"]["maxtext"]["runs"] == 5
    page = render(data)
    assert "**Trainer example**" in page and "**Trainer maxtext**" in page and "MaxText: model tiny" in page
    # The MaxText target is judged on MaxText's own config (5 runs), not the example run's.
    (v,) = [t for t in targets(sections(data)) if t.target.startswith("sidecar vs checkpoint rewind, MaxText")]
    assert v.verdict == "met", v
    assert "why not met" not in v.basis  # met: nothing to explain
    assert "one period 10-20 s of training here" in v.basis, v.basis  # 50 steps at each row's own step time
    for x in data["benchmarks"]["recovery"]["ratios"]:
        x["ratio"] = 0.94
    (short,) = [t for t in targets(sections(data)) if t.target.startswith("sidecar vs checkpoint rewind, MaxText")]
    assert short.verdict == "not met"
    assert (
        "why not met: [maxtext.md](maxtext.md#the-runs-at-6143005-checkpoint-periods-1000-and-10000-again-published)"
        in short.basis
    )
    # A run of the example trainer again replaces only its own rows.
    merge(store, [example])
    assert len(sections(json.loads(store.read_text()))["recovery"]["results"]) == 3
    assert "not run" not in page.split("**Trainer example**")[0]
    # A clean run at another commit replaces only its trainer's rows; each trainer's rows keep
    # their own commit, printed with them, and the page lists both commits.
    other = copy.deepcopy(example)
    other["git_sha"] = "f" * 40
    other["started_at"] = "2026-12-02 00:00:00 UTC"
    # Each run's own figures stay with their trainer's rows; runs recorded before they named their
    # trainer are told apart by MaxText's tags.
    old_runs = {"runs": [{"tag": "mx-sidecar-kill-p50-d10-r0", "lost_steps": 0}], "fault_free_runs": []}
    store.write_text(json.dumps({**data, "benchmarks": {**data["benchmarks"], "recovery": {**rec, **old_runs}}}))
    other["runs"] = [{"trainer": "example", "lost_steps": 3}]
    other["fault_free_runs"] = [{"trainer": "example", "seconds": 12.5}]
    data = merge(store, [other])
    rec = sections(data)["recovery"]
    assert rec["runs"] == [
        {"tag": "mx-sidecar-kill-p50-d10-r0", "lost_steps": 0},
        {"trainer": "example", "lost_steps": 3},
    ]
    assert rec["fault_free_runs"] == [{"trainer": "example", "seconds": 12.5}]
    assert {r["trainer"] for r in rec["results"]} == {"example", "maxtext"}
    assert rec["config"]["by_trainer"]["example"]["git_sha"] == "f" * 40
    assert rec["config"]["by_trainer"]["maxtext"]["git_sha"] == SHA
    assert set(data["git_shas"]) >= {"f" * 40, SHA}
    page = render(data)
    assert f"Commit `{'f' * 40}`" in page.split("**Trainer example**")[1].split("**Trainer maxtext**")[0]
    assert f"Commit `{SHA}`" in page.split("**Trainer maxtext**")[1]
    assert f"`{'f' * 40}`" in page.split("## Targets")[0]
    assert "Separate runs per trainer, at commits" in page
    # A dirty run replaces the whole section: figures of uncommitted code are never mixed in.
    dirty = copy.deepcopy(example)
    dirty["dirty"] = True
    data = merge(store, [dirty])
    assert {r["trainer"] for r in sections(data)["recovery"]["results"]} == {"example"}
    assert "**Trainer maxtext: not run** at this commit" in render(data)


def test_the_coordinators_idle_cpu_is_split_by_thread_when_measured() -> None:
    data = fixture()
    md = render(data)
    assert "main thread (Python: asyncio loop, decisions, grpc.aio) 0.45 %" in md
    assert "all other threads (gRPC core) 0.25 %" in md
    assert "(median of 3 rounds)" in md
    del data["benchmarks"]["footprint"]["summary"]
    assert "Coordinator idle CPU by thread" not in render(data)


def test_the_10000_worker_gap_is_stated_from_the_largest_valid_run() -> None:
    data = fixture()
    cpu = next(v for v in targets(sections(data)) if v.target == "coordinator CPU")
    assert "largest valid run at the shipped heartbeats had 1000 workers and used 0.137 cores" in cpu.basis
    assert "about 10 times that" in cpu.basis and "not a measurement" in cpu.basis
    # No valid run at the shipped heartbeats: no gap is claimed.
    none = copy.deepcopy(data)
    none["benchmarks"]["scale"]["results"][0]["valid"] = False
    cpu = next(v for v in targets(sections(none)) if v.target == "coordinator CPU")
    assert "Gap:" not in cpu.basis


def test_rows_left_out_by_sweep_strategies_say_so_and_failed_rows_do_not() -> None:
    data = fixture()
    rec = data["benchmarks"]["recovery"]
    rec["config"]["sweep_strategies"] = ["full_restart", "checkpoint_rewind", "sidecar"]
    away = rec_row("example", "memory_snapshot", None, runs=0, replacement_delay=2.0)
    failed = rec_row("example", "local_checkpoint_rewind", None, runs=0, failed_runs=5, replacement_delay=2.0)
    here = rec_row("example", "memory_snapshot", None, runs=0)  # at the realistic point: it should have run
    rec["results"] += [away, failed, here]
    lines = [x for x in render(data).splitlines() if x.startswith("| example |") and "| – |" in x]
    by = {(x.split("|")[2].strip(), x.split("|")[5].strip()): x for x in lines}
    assert "not run by choice: --sweep-strategies" in by[("memory_snapshot", "2")]
    assert "**NOT RUN**" in by[("local_checkpoint_rewind", "2")]
    assert "**NOT RUN**" in by[("memory_snapshot", "30")]


def test_the_page_says_why_runs_failed() -> None:
    data = fixture()
    row = data["benchmarks"]["recovery"]["results"][1]
    row.update(failed_runs=2, failures=["exit code 1; see /tmp/x/output.log", "no fault time"])
    md = render(data)
    line = next(x for x in md.splitlines() if x.startswith("- example checkpoint_rewind kill"))
    assert "2 failed: exit code 1; no fault time" in line and "/tmp/x" not in line


def test_a_valid_10000_worker_row_over_the_target_states_where_the_time_goes() -> None:
    data = fixture()
    sc = data["benchmarks"]["scale"]
    r = sc["results"][1]
    r.update(valid=True, cycles=3, coordinator_cores=0.61, coordinator_cores_main_thread=0.4558, fanout_p99_seconds=3.4)
    del r["invalid_reason"]
    sc["sizes"] = [{"workers": 10000, "cpu_cores_other_threads": 0.1439, "load_cpus": [1], "generators_cpu_cores": 0.7}]
    vs = {v.target: v for v in targets(sections(data))}
    cpu, fan = vs["coordinator CPU"], vs["hold fan-out p99 (worst cycle)"]
    assert cpu.verdict == "not met" and "main thread (the event loop) 0.4558 cores" in cpu.basis
    assert "gRPC's own threads 0.1439" in cpu.basis
    assert fan.verdict == "not met" and "shared 1 CPU(s) apart from the coordinator's, using 0.7 cores" in fan.basis


def test_steps_on_the_survivor_are_tabled_with_the_cost_had_they_taken_a_full_steps_time() -> None:
    data = fixture()
    rows = data["benchmarks"]["recovery"]["results"]
    shrunk = {
        "shrunk_steps_median": 137,
        "shrunk_seconds_median": 4.321,
        "fault_cost_if_shrunk_steps_took_full_time_seconds_median": 9.876,
    }
    rows.append(rec_row("maxtext", "sidecar", 6.543, elastic_min_slice_count=1, **shrunk))
    md = render(data)
    assert "Steps run on the survivor alone" in md
    (line,) = [x for x in md.splitlines() if "9.876" in x]
    assert all(v in line for v in ("maxtext", "sidecar", "137", "4.321", "6.543")), line
    del rows[-1]
    assert "Steps run on the survivor alone" not in render(data)


def test_local_fault_costs_are_tabled_beside_the_whole_run_measure_and_named_in_the_verdict(tmp_path: Path) -> None:
    local = {
        "fault_cost_method": "local",
        "elastic_min_slice_count": 1,
        "own_step_seconds_median": 0.0345,
        "local_window_seconds_median": 31.25,
        "local_window_work_steps_median": 612.5,
        "whole_run_fault_cost_seconds_median": -4.931,
        "whole_run_fault_cost_seconds_min": -8.831,
        "whole_run_fault_cost_seconds_max": 14.567,
        "fault_free_rate_spread": 0.1123,
    }
    example = section(
        "recovery", {"trainers": ["maxtext"], "realistic_checkpoint_period": 100, "realistic_delay": 30.0}, []
    )
    example["config"]["maxtext"] = {"model": "tiny", "slices": 2, "steps": {"100": 3060}}
    example["fault_free_runs"] = [{"tag": "mx-ref-sidecar-p100-r0", "last_step": 5500, "seconds": 250.5}]
    example["results"] = [
        rec_row("maxtext", "sidecar", 11.75, **local),
        rec_row("maxtext", "checkpoint_rewind", 47.0, **local),
    ]
    example["ratios"] = [
        {
            "trainer": "maxtext",
            "fault": "kill",
            "checkpoint_period": 100,
            "replacement_delay": 30.0,
            "baseline": "checkpoint_rewind",
            "baseline_fault_cost_seconds_median": 47.0,
            "sidecar_fault_cost_seconds_median": 11.75,
            "ratio": 4.0,
        }
    ]
    from bench.__main__ import merge

    data = merge(tmp_path / "b.json", [example])
    md = render(data)
    assert "Local fault cost" in md
    # The steps the runs completed, not the config's figure (which left out the survivor's longer tail).
    assert "steps per run 5500 (as the fault-free runs completed)" in md
    (line,) = [x for x in md.splitlines() if "612.5" in x and "sidecar" in x]
    assert all(v in line for v in ("11.75", "0.0345", "31.25", "-4.931 [-8.831–14.567]", "0.1123")), line
    (v,) = [t for t in targets(sections(data)) if t.target.startswith("sidecar vs checkpoint rewind, MaxText")]
    assert v.verdict == "met" and "elastic_min_slice_count 1, local fault cost" in v.basis, v
    for r in data["benchmarks"]["recovery"]["results"]:
        del r["fault_cost_method"]
    assert "Local fault cost" not in render(data)
    # Each run's own figures, by the fault's phase in the checkpoint period.
    run = {"trainer": "maxtext", "strategy": "checkpoint_rewind", "checkpoint_period": 100, "replacement_delay": 30.0}
    run |= {"rewinds": 2}
    run |= {"fault_step": 237, "lost_steps": 613, "local_fault_cost_s": 41.25, "local_window_s": 44.5}
    data["benchmarks"]["recovery"]["runs"] = [run, {**run, "local_fault_cost_s": None}]
    (line,) = [x for x in render(data).splitlines() if "41.25" in x]
    assert all(v in line for v in ("| 237 | 36 | 613 | 2 |", "44.5")), line
    assert line.startswith("| maxtext | checkpoint_rewind | 100 |"), line  # each model size's runs apart


def test_a_larger_maxtext_models_rows_sit_beside_the_tiny_models_and_are_judged_apart(tmp_path: Path) -> None:
    """A MaxText run of the larger model (rows written as ``maxtext``, the model in its config) merges beside
    the tiny model's rows at the same period instead of replacing them; each size gets its own verdicts; a
    later tiny run replaces only the tiny rows."""
    from bench.__main__ import merge
    from bench.common import label_maxtext_model

    def mx_run(model: str, side: float, rewind: float) -> dict[str, Any]:
        cfg = {"realistic_checkpoint_period": 1000, "realistic_delay": 10.0, "seed": 0, "runs": 5}
        cfg |= {"trainers": ["maxtext"], "maxtext_model": model, "maxtext": {"model": model, "slices": 4}}
        rows = [
            rec_row(
                "maxtext",
                s,
                c,
                checkpoint_period=1000,
                replacement_delay=10.0,
                model=model,
                period_cost_seconds_median=c,
                step_overhead_fraction_median=0.0,
                fault_cost_if_shrunk_steps_took_full_time_seconds_median=c,
            )
            for s, c in [("sidecar", side), ("checkpoint_rewind", rewind), ("full_restart", rewind + 10)]
        ]
        rows.append({**rows[1], "strategy": "local_checkpoint_rewind", "period_cost_seconds_median": rewind + 5})
        ratios = [
            {
                "trainer": "maxtext",
                "fault": "kill",
                "checkpoint_period": 1000,
                "replacement_delay": 10.0,
                "baseline": base,
                "baseline_fault_cost_seconds_median": cost,
                "sidecar_fault_cost_seconds_median": side,
                "ratio": round(cost / side, 2),
            }
            for base, cost in [("checkpoint_rewind", rewind), ("full_restart", rewind + 10)]
        ]
        runs = [{"trainer": "maxtext", "strategy": "sidecar", "checkpoint_period": 1000, "lost_steps": 3}]
        return section("recovery", cfg, rows, ratios=ratios, runs=runs, fault_free_runs=[])

    tiny, larger = mx_run("tiny", 7.25, 14.5), mx_run("larger", 9.5, 38.0)
    assert label_maxtext_model(tiny) is tiny  # the tiny model keeps the label every earlier row has
    labelled = label_maxtext_model(larger)
    assert labelled["config"]["trainers"] == ["maxtext-larger"]
    assert {r["trainer"] for k in ("results", "ratios", "runs") for r in labelled[k]} == {"maxtext-larger"}
    assert label_maxtext_model(labelled) == labelled
    store = tmp_path / "b.json"
    merge(store, [tiny])
    data = merge(store, [larger])
    rec = sections(data)["recovery"]
    assert sorted({r["trainer"] for r in rec["results"]}) == ["maxtext", "maxtext-larger"]
    assert sorted(rec["config"]["by_trainer"]) == ["maxtext", "maxtext-larger"]
    vs = {v.target: v for v in targets(sections(data))}
    tiny_v, larger_v = vs["period cost, MaxText, period 1000"], vs["period cost, MaxText (larger model), period 1000"]
    assert tiny_v.verdict == "not met" and "rewind / sidecar 2.00x" in tiny_v.basis, tiny_v
    assert larger_v.verdict == "met" and "rewind / sidecar 4.00x" in larger_v.basis, larger_v
    assert vs["sidecar vs checkpoint rewind, MaxText (larger model) (kill)"].verdict == "met"
    assert vs["sidecar vs checkpoint rewind, MaxText (kill)"].verdict == "not met"
    assert "**Trainer maxtext-larger**" in render(data) and "MaxText: model larger" in render(data)
    # A new tiny run replaces the tiny rows and keeps the larger model's.
    data = merge(store, [mx_run("tiny", 4.5, 14.5)])
    vs = {v.target: v for v in targets(sections(data))}
    assert "rewind / sidecar 3.22x" in vs["period cost, MaxText, period 1000"].basis
    assert "rewind / sidecar 4.00x" in vs["period cost, MaxText (larger model), period 1000"].basis


def test_maxtexts_period_cost_is_tabled_and_judged_per_period() -> None:
    data = fixture()
    rows = data["benchmarks"]["recovery"]["results"]
    rows[:] = [r for r in rows if r["trainer"] != "maxtext"]

    def mx(strategy: str, period_cost: float, overhead: float, period: int = 1000) -> dict[str, Any]:
        return rec_row(
            "maxtext",
            strategy,
            5.5,
            checkpoint_period=period,
            period_cost_seconds_median=period_cost,
            step_overhead_fraction_median=overhead,
            fault_cost_if_shrunk_steps_took_full_time_seconds_median=4.25,
            steady_step_seconds_median=0.0312,
            plain_step_seconds_median=0.0306,
            mesh_slices_before=4,
            mesh_slices_after=3,
            steady_step_source="median over 5 faulted runs, before the fault",
        )

    rows += [
        mx("full_restart", 61.5, 0.0),
        mx("checkpoint_rewind", 40.25, 0.0125),
        mx("local_checkpoint_rewind", 17.75, 0.375),
        mx("sidecar", 11.125, 0.0175),
    ]
    md = render(data)
    (line,) = [x for x in md.splitlines() if "11.125" in x and "4 -> 3" in x]
    assert all(v in line for v in ("sidecar", "4.25", "0.0175", "0.0312", "0.0306", "4 -> 3")), line
    vs = {v.target: v for v in targets(sections(data))}
    v = vs["period cost, MaxText, period 1000"]
    assert v.verdict == "met" and "3.62x" in v.basis, v
    # Over 2% a step, or a baseline with a lower period cost, or under 3x the rewind: not met, saying which.
    rows[-1]["step_overhead_fraction_median"] = 0.025
    v = {v.target: v for v in targets(sections(data))}["period cost, MaxText, period 1000"]
    assert v.verdict == "not met" and "step overhead 2.50%" in v.basis, v
    rows[-1].update(step_overhead_fraction_median=0.01, period_cost_seconds_median=18.5)
    v = {v.target: v for v in targets(sections(data))}["period cost, MaxText, period 1000"]
    assert v.verdict == "not met" and "local_checkpoint_rewind lower" in v.basis and "2.18x" in v.basis, v
    # A strategy measured faster than plain MaxText by more than the 2% resolved: the run's step times drifted,
    # so the period cost (steady overhead included) is not judged; the fault costs alone are shown.
    rows[-3]["step_overhead_fraction_median"] = -0.197
    rows[-3]["fault_cost_if_shrunk_steps_took_full_time_seconds_median"] = 29.5
    v = {v.target: v for v in targets(sections(data))}["period cost, MaxText, period 1000"]
    assert v.verdict == "not measured" and "checkpoint_rewind -19.70%" in v.basis, v
    assert "rewind / sidecar 6.94x" in v.basis, v  # 29.5 / 4.25 at the full-slice rate
    rows[-3]["step_overhead_fraction_median"] = -0.015  # within the resolution: judged as before
    v = {v.target: v for v in targets(sections(data))}["period cost, MaxText, period 1000"]
    assert v.verdict == "not met" and "local_checkpoint_rewind lower" in v.basis, v
    # A missing baseline is not a verdict (and a drift is named beside it).
    del rows[-2]
    v = {v.target: v for v in targets(sections(data))}["period cost, MaxText, period 1000"]
    assert v.verdict == "not measured" and "local_checkpoint_rewind" in v.basis, v
    rows[-2]["step_overhead_fraction_median"] = -0.197
    v = {v.target: v for v in targets(sections(data))}["period cost, MaxText, period 1000"]
    assert "no valid local_checkpoint_rewind row" in v.basis and "checkpoint_rewind -19.70%" in v.basis, v


def test_a_baseline_invalid_by_its_fault_costs_sign_is_bounded_by_its_step_overhead() -> None:
    """A row invalid only because a run's local fault cost fell below zero cannot be the lowest period cost
    when its steady overhead over the period alone is above the sidecar's: the verdict is judged."""
    data = fixture()
    rows = data["benchmarks"]["recovery"]["results"]
    rows[:] = [r for r in rows if r["trainer"] != "maxtext"]

    def mx(strategy: str, period_cost: float, overhead: float, steady: float, **kw: Any) -> dict[str, Any]:
        return rec_row(
            "maxtext",
            strategy,
            5.5,
            checkpoint_period=10000,
            period_cost_seconds_median=period_cost,
            step_overhead_fraction_median=overhead,
            fault_cost_if_shrunk_steps_took_full_time_seconds_median=4.25,
            steady_step_seconds_median=steady,
            plain_step_seconds_median=0.015,
            **kw,
        )

    below = "local fault cost below zero in 1 of 5 runs (lowest -0.25 s): the run's own step time ..."
    rows += [
        mx("full_restart", 84.5, 0.0, 0.015),
        mx("checkpoint_rewind", 86.75, 0.019, 0.01529),
        mx("local_checkpoint_rewind", 108.5, 0.66, 0.0249, invalid_reason=below, fault_cost_seconds_min=-0.25),
        mx("sidecar", 12.25, 0.0293, 0.01544),
    ]
    v = {v.target: v for v in targets(sections(data))}["period cost, MaxText, period 10000"]
    # (0.0249 - 0.015) * 10000 - 0.25 = 98.75 s, above the sidecar's 12.25 s.
    assert v.verdict == "not met" and "local_checkpoint_rewind >= 98.75 s" in v.measured, v
    assert "step overhead 2.93% (checkpoint_rewind, no more work a step than plain MaxText, reads 1.90%)" in v.basis
    # MaxText's rewind reading more than 2% slower than plain MaxText, whose work a step it does: the step times
    # drifted, and the sidecar's 2.93% is not judged either.
    rows[-3]["step_overhead_fraction_median"] = 0.021
    v = {v.target: v for v in targets(sections(data))}["period cost, MaxText, period 10000"]
    assert v.verdict == "not measured" and "checkpoint_rewind +2.10% against plain MaxText, though" in v.basis, v
    rows[-3]["step_overhead_fraction_median"] = 0.019
    rows[-1]["step_overhead_fraction_median"] = 0.015
    v = {v.target: v for v in targets(sections(data))}["period cost, MaxText, period 10000"]
    assert v.verdict == "met" and "rewind / sidecar 7.08x" in v.basis, v
    # A bound at or below the sidecar's period cost settles nothing; nor does a row invalid for another reason.
    rows[-2]["steady_step_seconds_median"] = 0.0161
    v = {v.target: v for v in targets(sections(data))}["period cost, MaxText, period 10000"]
    assert v.verdict == "not measured" and "no valid local_checkpoint_rewind row" in v.basis, v
    rows[-2].update(steady_step_seconds_median=0.0249, invalid_reason="2 of 5 runs failed")
    v = {v.target: v for v in targets(sections(data))}["period cost, MaxText, period 10000"]
    assert v.verdict == "not measured" and "no valid local_checkpoint_rewind row" in v.basis, v


def test_a_maxtext_run_of_one_period_can_keep_the_other_periods_rows_with_their_own_commit(tmp_path: Path) -> None:
    """MaxText's period 10,000 takes hours on its own: --keep-other-periods publishes it beside period 1,000."""
    from bench.__main__ import merge

    def mx_run(period: int, sha: str, cost: float) -> dict[str, Any]:
        cfg = {"realistic_checkpoint_period": period, "realistic_delay": 10.0, "trainers": ["maxtext"], "runs": 5}
        sec = section(
            "recovery",
            cfg,
            [rec_row("maxtext", s, c, checkpoint_period=period, replacement_delay=10.0) for s, c in cost_rows(cost)],
            ratios=[
                {
                    "trainer": "maxtext",
                    "fault": "kill",
                    "checkpoint_period": period,
                    "replacement_delay": 10.0,
                    "baseline": "checkpoint_rewind",
                    "baseline_fault_cost_seconds_median": cost * 4,
                    "sidecar_fault_cost_seconds_median": cost,
                    "ratio": 4,
                }
            ],
            runs=[{"trainer": "maxtext", "checkpoint_period": period, "tag": f"mx-{period}"}],
        )
        sec["git_sha"] = sha
        return sec

    def cost_rows(cost: float) -> list[tuple[str, float]]:
        return [("sidecar", cost), ("checkpoint_rewind", cost * 4)]

    example = section("recovery", {"trainers": ["example"], "runs": 5}, [rec_row("example", "sidecar", 1.5)])
    store = tmp_path / "b.json"
    merge(store, [example])
    merge(store, [mx_run(1000, "a" * 40, 8.0)])
    data = merge(store, [mx_run(10000, "b" * 40, 9.0)], keep_periods=True)
    rec = data["benchmarks"]["recovery"]
    periods = sorted((r["trainer"], r["checkpoint_period"]) for r in rec["results"])
    assert periods == [("example", 100), ("maxtext", 1000), ("maxtext", 1000), ("maxtext", 10000), ("maxtext", 10000)]
    by = rec["config"]["by_trainer"]
    assert by["maxtext"]["git_sha"] == "b" * 40 and by["maxtext"]["realistic_checkpoint_period"] == 10000
    assert by["maxtext (period 1000)"]["git_sha"] == "a" * 40 and "example" in by
    assert rec["config"]["trainers"] == ["example", "maxtext"]
    assert sorted(r["checkpoint_period"] for r in rec["ratios"]) == [1000, 10000]
    assert sorted(r["tag"] for r in rec["runs"]) == ["mx-1000", "mx-10000"]
    assert {"a" * 40, "b" * 40} <= set(data["git_shas"])
    assert "**Trainer maxtext (period 1000)**" in render(data)
    # Without the flag a trainer's run replaces all of its rows, as before; a later run of period 1,000 with
    # the flag keeps period 10,000's rows under their own key.
    plain = merge(tmp_path / "c.json", [mx_run(1000, "a" * 40, 8.0)])
    plain = merge(tmp_path / "c.json", [mx_run(10000, "b" * 40, 9.0)])
    assert {r["checkpoint_period"] for r in plain["benchmarks"]["recovery"]["results"]} == {10000}
    again = merge(store, [mx_run(1000, "c" * 40, 7.0)], keep_periods=True)
    by = again["benchmarks"]["recovery"]["config"]["by_trainer"]
    assert by["maxtext"]["git_sha"] == "c" * 40 and by["maxtext (period 10000)"]["git_sha"] == "b" * 40
    assert "maxtext (period 1000)" not in by
    assert sorted(
        r["checkpoint_period"] for r in again["benchmarks"]["recovery"]["results"] if r["trainer"] == "maxtext"
    ) == [
        1000,
        1000,
        10000,
        10000,
    ]


def _scale_row(workers: int, scenario: str, **kw: Any) -> dict[str, Any]:
    row = {"workers": workers, "scenario": scenario, "runs": 3, "valid": True, "coordinator_socket_drops": 0}
    if scenario == "coordinator_restart":
        row |= {"hosts_lost": 0, "all_back_seconds": 21.5, "rejoin_grace": 10.0, "restart_to_serving_seconds": 1.25}
    else:
        row |= {"coordinator_cores": 0.31, "heartbeat_interval": 0.25, "heartbeat_timeout": 1.2}
    return row | kw


def test_a_scale_run_of_one_scenario_keeps_the_other_rows_each_with_its_commit(tmp_path: Path) -> None:
    """bench --keep-other-rows: a restart-only run replaces the restart rows and keeps the hold cycles' rows,
    each row naming its own run; without the flag the run replaces the section."""
    from bench.__main__ import combine, merge

    first = section(
        "scale",
        {"net_core_rmem_max": 33554432},
        [_scale_row(10000, "hold_cycles"), _scale_row(10000, "coordinator_restart", hosts_lost=32148, valid=False)],
    )
    first["sizes"] = [
        {"workers": 10000, "scenario": "hold_cycles", "run": 0, "load_cpus": [1]},
        {"workers": 10000, "scenario": "coordinator_restart", "run": 0, "hosts_lost": 32148},
    ]
    later = {
        **section("scale", {"net_core_rmem_max": 33554432}, [_scale_row(10000, "coordinator_restart")]),
        "git_sha": "feedbeef",
        "started_at": "2026-12-03 09:00:00 UTC",
    }
    store = tmp_path / "b.json"
    merge(store, [first])
    data = merge(store, [later], keep_rows=True)
    rows = sections(data)["scale"]["results"]
    assert [(r["scenario"], r["run"]["git_sha"]) for r in rows] == [
        ("hold_cycles", SHA),
        ("coordinator_restart", "feedbeef"),
    ]
    assert rows[1]["hosts_lost"] == 0
    # Each row's run names its machine (rows of separate runs may come from different VMs).
    assert [r["run"]["machine"]["cpu_model"] for r in rows] == ["Test CPU", "Test CPU"]
    # The kept row's runs in detail stay; the replaced row's go.
    assert sections(data)["scale"]["sizes"] == [first["sizes"][0]]
    assert set(combine(list(sections(data).values()))["git_shas"]) == {SHA, "feedbeef"}
    page = render(data)
    assert "Rows from separate runs" in page and f"`{SHA}`" in page and "`feedbeef`" in page
    assert page.count("GiB, Test CPU, Python 3.12.1; net.core.rmem_max") == 2
    # Without the flag, or from a dirty run, the new run is the section.
    plain = merge(tmp_path / "c.json", [first]) and merge(tmp_path / "c.json", [later])
    assert [r["scenario"] for r in sections(plain)["scale"]["results"]] == ["coordinator_restart"]
    dirty = merge(store, [{**later, "dirty": True}], keep_rows=True)
    assert [r["scenario"] for r in sections(dirty)["scale"]["results"]] == ["coordinator_restart"]


def test_maxtext_rows_say_how_many_runs_came_from_earlier_sittings() -> None:
    data = fixture()
    rec = data["benchmarks"]["recovery"]
    rec["config"]["maxtext"] = {
        "model": "tiny",
        "slices": 4,
        "journal": {"runs_from_earlier_sittings": 12, "earliest_earlier_run_finished_at": 1796288400.0},
    }
    rec["config"]["trainers"] = ["example", "maxtext"]
    page = render(data)
    assert "12 of these runs were made by earlier sittings" in page and "2026-12-03 09:00 UTC" in page


def test_published_paths_name_no_directory_of_the_machine_that_ran() -> None:
    from bench.common import ROOT, portable_argv, portable_path

    assert portable_path(str(ROOT / "docs" / "benchmarks.json")) == "docs/benchmarks.json"
    assert portable_path(str(ROOT.parent / "p10000-work" / "recovery" / "runs.jsonl")) == "<outside>/runs.jsonl"
    assert portable_path("relative/x.json") == "relative/x.json"
    argv = ["recovery", "--workdir", "/scratch/run-1", f"--json={ROOT}/out.json", "--repeats", "5"]
    assert portable_argv(argv) == ["recovery", "--workdir", "<outside>/run-1", "--json=out.json", "--repeats", "5"]
    doc = json.loads((ROOT / "docs" / "benchmarks.json").read_text())
    assert not re.search(r'"/(work|tmp|home|root)/', json.dumps(doc)), "a machine path in docs/benchmarks.json"


def test_every_why_not_met_link_names_a_heading_of_its_page() -> None:
    # GitHub's anchors: a heading lowercased, punctuation other than '-' dropped, spaces as '-'.
    from bench.report import WHY_NOT_MET

    docs = Path(__file__).resolve().parents[2] / "docs"
    for trainer, link in WHY_NOT_MET.items():
        page, anchor = re.fullmatch(r"\[[^\]]+\]\(([^#)]+)#([^)]+)\)", link).groups()  # type: ignore[union-attr]
        headings = [line.lstrip("#").strip() for line in (docs / page).read_text().splitlines() if line.startswith("#")]
        slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
        assert anchor in slugs, (trainer, anchor)
