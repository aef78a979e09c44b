"""docs/benchmarks.md and its plots, from the benchmarks' JSON alone.

    python -m bench.report [--json docs/benchmarks.json] [--out docs]

Everything the page says about a result is read from the JSON that ``python -m
bench`` wrote: figures, run counts, spreads, the commit, the machine, the
arguments, each benchmark's method (its module docstring, stored at run time)
and whether a run was valid. The only things defined here are the targets (a
threshold and which rows it applies to) and the layout. A target is **met**,
**not met** or **not measured**; a row marked invalid or not run is printed as
such and never counts as met. Numbers are printed as stored (no rounding here),
so every figure on the page can be found in the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    STEP_OVERHEAD_RESOLUTION,
    cost_below_stall,
    is_maxtext,
    maxtext_name,
    own_rate_invalid,
    step_times_drifted,
    trainer_of,
)

ORDER = ("goodput", "recovery", "step_overhead", "detection", "scale", "flush", "footprint")


# ---------------------------------------------------------------------------
# input
# ---------------------------------------------------------------------------


def sections(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per-benchmark sections of a combined file, or the one section of a single benchmark's file."""
    if "benchmarks" in data:
        return {k: v for k, v in data["benchmarks"].items() if isinstance(v, dict) and v.get("schema") == 2}
    if data.get("schema") == 2 and "name" in data:
        return {data["name"]: data}
    return {}


def fmt(v: Any) -> str:
    """A stored value as stored: numbers unrounded, None as a dash."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, list):
        return ", ".join(fmt(x) for x in v)
    return str(v)


def spread_text(median: Any, lo: Any = None, hi: Any = None, n: Any = None, p90: Any = None) -> str:
    """``median [min–max] p90 …, n=…`` from stored figures; only the parts that exist."""
    if median is None:
        return "–"
    s = fmt(median)
    if lo is not None and hi is not None:
        s += f" [{fmt(lo)}–{fmt(hi)}]"
    if p90 is not None:
        s += f", p90 {fmt(p90)}"
    if n is not None:
        s += f", n={fmt(n)}"
    return s


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "/") for c in r) + " |" for r in rows]
    return out


def status(row: dict[str, Any]) -> str:
    """``valid``, ``INVALID: why`` or ``NOT RUN: why`` for a result row."""
    if row.get("status") == "not_run" or row.get("runs") == 0:
        return f"**NOT RUN**: {row.get('invalid_reason') or 'no successful run'}"
    if row.get("valid") is False or row.get("invalid_reason"):
        return f"**INVALID**: {row.get('invalid_reason') or 'marked invalid'}"
    return "valid"


def is_valid(row: dict[str, Any]) -> bool:
    return status(row) == "valid"


# ---------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------


MIN_RUNS = {"goodput": 5, "recovery": 5, "step_overhead": 5, "flush": 5, "detection": 5, "footprint": 3, "scale": 3}
"""Runs a figure needs before a target is judged on it (the methods' minimums)."""


def unjudged(s: dict[str, Any], runs: Any) -> str | None:
    """Why a target cannot be judged on this section's figure (None when it can)."""
    if s.get("quick"):
        return "quick (smoke-sized) run"
    need = MIN_RUNS.get(s.get("name", ""), 1)
    if not isinstance(runs, int) or runs < need:
        return f"{fmt(runs)} runs, fewer than the {need} the method asks for"
    return None


@dataclass
class Verdict:
    target: str
    goal: str
    measured: str
    verdict: str  # "met", "not met", "not measured", "invalid"
    basis: str


def trainer_config(rec: dict[str, Any], trainer: str) -> dict[str, Any]:
    """The config a trainer's recovery rows ran with (one run of several trainers, or one run each)."""
    cfg = rec.get("config", {})
    return (cfg.get("by_trainer") or {}).get(trainer, cfg)


def _own_rate_ratio(base: dict[str, Any], side: dict[str, Any]) -> float | None:
    """The baseline's fault cost over the sidecar's, each against its runs' own pre-fault rate: only for
    rows measured that way in every run (the example trainer's; MaxText rows carry a local cost instead)."""
    if base.get("fault_cost_method") == "local" or side.get("fault_cost_method") == "local":
        return None
    b, s = base.get("fault_cost_own_rate_seconds_median"), side.get("fault_cost_own_rate_seconds_median")
    if b is None or s is None or float(s) <= 0:
        return None
    if base.get("fault_cost_own_rate_runs") != base.get("runs") or side.get("fault_cost_own_rate_runs") != side.get(
        "runs"
    ):
        return None
    return round(float(b) / float(s), 2)


def _recovery_ratio_target(
    rec: dict[str, Any] | None, baseline: str, factor: float, trainer: str, goal_name: str
) -> list[Verdict]:
    goal = f">= {factor:g}x lower fault cost than {baseline}"
    if rec is None:
        return [Verdict(goal_name, goal, "–", "not measured", "no recovery results")]
    cfg = trainer_config(rec, trainer)
    period, delay = cfg.get("realistic_checkpoint_period"), cfg.get("realistic_delay")
    rows = [r for r in rec.get("results", []) if r.get("trainer") == trainer]
    at = [r for r in rows if r.get("checkpoint_period") == period and r.get("replacement_delay") == delay]
    where = f"trainer {trainer}, checkpoint period {fmt(period)}, replacement delay {fmt(delay)}"
    if not at:
        return [Verdict(goal_name, goal, "–", "not measured", f"no rows for {where}")]
    out = []
    for fault in sorted({r["fault"] for r in at}):
        side = next((r for r in at if r["fault"] == fault and r["strategy"] == "sidecar"), None)
        base = next((r for r in at if r["fault"] == fault and r["strategy"] == baseline), None)
        name = f"{goal_name} ({fault})"
        basis = f"{where}, fault {fault}"
        if side is not None and side.get("elastic_min_slice_count") is not None:
            basis += f", elastic_min_slice_count {fmt(side['elastic_min_slice_count'])}"
        if side is not None and side.get("fault_cost_method"):
            basis += f", {side['fault_cost_method']} fault cost"
        step_s = [r.get("own_step_seconds_median") for r in (base, side) if r is not None]
        if period and step_s and all(step_s):
            # What the period is in training time here: its realism is a matter of seconds, not of steps.
            lo, hi = round(period * min(step_s)), round(period * max(step_s))
            basis += f", one period {fmt(lo)}{'' if lo == hi else f'-{fmt(hi)}'} s of training here"
        own_basis = (
            side is not None
            and base is not None
            and _own_rate_ratio(base, side) is not None
            and not any(own_rate_invalid(rec, r) for r in (side, base))
            and not any(r.get("status") == "not_run" for r in (side, base))
        )
        below = (
            []
            if own_basis or side is None or base is None
            else [w for r in (side, base) if (w := cost_below_stall(rec, r, own_rate=False))]
        )
        if side is None or base is None or (not own_basis and (not is_valid(side) or not is_valid(base) or below)):
            why = (
                "; ".join([status(r) for r in (side, base) if r is not None and not is_valid(r)] + below)
                or "rows missing"
            )
            if side is not None and base is not None and _own_rate_ratio(base, side) is not None:
                why += "; " + "; ".join(filter(None, (own_rate_invalid(rec, r) for r in (side, base))))
            out.append(Verdict(name, goal, "–", "not measured", f"{basis}: {why}"))
            continue
        ratio = next(
            (
                x
                for x in rec.get("ratios", [])
                if x["trainer"] == trainer
                and x["fault"] == fault
                and x["baseline"] == baseline
                and x["checkpoint_period"] == period
                and x["replacement_delay"] == delay
            ),
            None,
        )
        costs = (
            f"{baseline} {fmt(base['fault_cost_seconds_median'])} s (n={fmt(base['runs'])}) / sidecar "
            f"{fmt(side['fault_cost_seconds_median'])} s (n={fmt(side['runs'])})"
        )
        own = _own_rate_ratio(base, side) if own_basis else None
        if own is not None:
            # The same basis as the goodput section's (bench/goodput.py fault_cost_of): each run's cost
            # against its own pre-fault rate, which a drift of the machine between runs does not move.
            spread = base.get("fault_free_rate_spread")
            ref = (ratio or {}).get("ratio")
            basis += "; each run against its own pre-fault rate (as goodput)"
            if ref is not None:
                basis += f"; against the fault-free runs' rate instead: {fmt(ref)}x ({costs})"
            if spread is not None:
                basis += f", those runs' rates spreading {fmt(spread)}"
            ref_why = [f"{r['strategy']}: {r['invalid_reason']}" for r in (side, base) if r.get("invalid_reason")]
            if ref_why:
                basis += " (not valid on that basis: " + "; ".join(ref_why) + ")"
            ratio = {**(ratio or {}), "ratio": own}
            costs = (
                f"{baseline} {fmt(base['fault_cost_own_rate_seconds_median'])} s (n={fmt(base['runs'])}) / "
                f"sidecar {fmt(side['fault_cost_own_rate_seconds_median'])} s (n={fmt(side['runs'])})"
            )
        if ratio is None or ratio.get("ratio") is None:
            why = (ratio or {}).get("why_none", "no ratio stored")
            out.append(Verdict(name, goal, costs, "not measured", f"{basis}: {why}"))
            continue
        why = unjudged(rec, min(side["runs"], base["runs"]))
        if why:
            out.append(Verdict(name, goal, f"{fmt(ratio['ratio'])}x ({costs})", "not measured", f"{basis}: {why}"))
            continue
        ok = ratio["ratio"] >= factor
        why_not = WHY_NOT_MET.get("maxtext" if is_maxtext(trainer) else trainer)  # every MaxText size: one page
        if not ok and why_not:
            basis += f"; why not met: {why_not}"
        out.append(Verdict(name, goal, f"{fmt(ratio['ratio'])}x ({costs})", "met" if ok else "not met", basis))
    return out


WHY_NOT_MET = {
    "maxtext": "[maxtext.md](maxtext.md#the-runs-at-6143005-checkpoint-periods-1000-and-10000-again-published)",
    "example": "[recovery.md](recovery.md#the-run-at-a09f273-kill-5-runs-a-row-the-same-command)",
}
"""Where a trainer's recovery ratio that falls short is explained (the analysis, with its figures' runs)."""


def scale_causes(sc: dict[str, Any], r: dict[str, Any]) -> list[str]:
    """Why a scale row's figures cannot stand for the shipped coordinator, from the row and its config."""
    cfg = sc.get("config", {})
    out = []
    shipped = (cfg.get("shipped_heartbeat_interval"), cfg.get("shipped_heartbeat_timeout"))
    used = (r.get("heartbeat_interval"), r.get("heartbeat_timeout"))
    if None not in shipped and used != shipped:
        out.append(
            f"heartbeat {fmt(used[0])} s / timeout {fmt(used[1])} s, not the shipped {fmt(shipped[0])} s / "
            f"{fmt(shipped[1])} s"
        )
    shipped_transport = cfg.get("shipped_heartbeats")
    if shipped_transport and transport(r) != shipped_transport:
        out.append(f"heartbeats by {transport(r)}, not the shipped {shipped_transport}")
    if r.get("saturated"):
        out.append(
            f"the coordinator's event loop was saturated (main thread {fmt(r.get('coordinator_cores_main_thread'))} "
            "cores): its CPU figure is a ceiling, not the demand"
        )
    if not is_valid(r):
        out.append(status(r))
    return out


def transport(r: dict[str, Any]) -> str:
    """How a scale row's workers heartbeat: "datagram" or "stream" (rows from before datagrams: stream)."""
    return str(r.get("heartbeats") or "stream")


def sharing(r: dict[str, Any]) -> str:
    """`` (N streams a connection)`` for a scale row whose stand-in hosts shared TCP connections, else ''."""
    k = r.get("streams_per_connection") or 1
    return f" ({fmt(k)} streams a connection)" if k > 1 else ""


def sharing_note(rows: list[dict[str, Any]]) -> list[str]:
    """What rows marked by :func:`sharing` did not reproduce, when any are shown."""
    shared = [r for r in rows if (r.get("streams_per_connection") or 1) > 1]
    if not shared:
        return []
    files = sorted({fmt(r["coordinator_open_files"]) for r in shared if r.get("coordinator_open_files")})
    return [
        "",
        'Rows marked "streams a connection": this machine\'s open-file limit cannot hold a socket a host at the '
        "coordinator, so that many stand-in hosts' Join streams shared one TCP connection (HTTP/2 streams of one "
        "connection; bench/scale_loadgen.py shared_channel_options). Each host still registered, heartbeated by "
        "its own datagrams and was held and resumed on its own stream; the connections pinged as often in all as "
        "one a host would. Not reproduced: a socket a host in the coordinator's process (open files at the "
        f"coordinator: {', '.join(files) or '–'}), and the TCP and HTTP/2 framing of writes to hosts that share "
        "a connection (a fan-out's writes to them may share a system call).",
    ]


def topology_line(sc: dict[str, Any] | None) -> str | None:
    """What the scale rows measured: the flat topology, or something else the rows name."""
    tops = sorted({str(r.get("topology")) for r in (sc or {}).get("results", []) if r.get("topology")})
    if not tops:
        return None
    if tops == ["flat"]:
        return (
            "Topology measured: flat (every worker streams to the coordinator itself). Per-slice leaders "
            "(one aggregated stream per slice) are not built, so no figure here measures them."
        )
    return "Topologies measured: " + ", ".join(tops) + "."


def scale_gap(sc: dict[str, Any]) -> str | None:
    """The gap to 10,000 workers stated from the largest valid run at the shipped heartbeats (the
    page prints only figures the JSON holds, plus a whole-number factor of workers)."""
    cfg = sc.get("config", {})
    shipped = cfg.get("shipped_heartbeat_interval")
    ok = [
        r
        for r in sc.get("results", [])
        if is_valid(r) and r.get("coordinator_cores") is not None and r.get("heartbeat_interval") == shipped
    ]
    if not ok or shipped is None:
        return None
    r = max(ok, key=lambda x: x["workers"])
    if r["workers"] >= 10000:
        return None
    return (
        f"Gap: the largest valid run at the shipped heartbeats had {fmt(r['workers'])} workers and used "
        f"{fmt(r['coordinator_cores'])} cores (main thread {fmt(r.get('coordinator_cores_main_thread'))}). Every "
        f"worker's heartbeat ({fmt(shipped)} s, by {transport(r)}) reaches the coordinator itself, so at the same CPU "
        f"per worker 10,000 workers would need about {round(10000 / r['workers'])} times that (an extrapolation, not "
        f"a measurement). The cause is the {r.get('topology') or 'flat'} topology: one stream and one heartbeat per "
        "worker at the coordinator; per-slice leaders are not built"
    )


def scale_shortfall(sc: dict[str, Any], r: dict[str, Any], field: str) -> str:
    """Where a valid row that misses its target spends the time, from the figures its run recorded."""
    size = next((x for x in sc.get("sizes", []) if x.get("workers") == r.get("workers")), {})
    if field == "coordinator_cores":
        return (
            f"gap: main thread (the event loop) {fmt(r.get('coordinator_cores_main_thread'))} cores, gRPC's own "
            f"threads {fmt(size.get('cpu_cores_other_threads'))}; every worker still keeps its own stream and sends "
            f"its heartbeats to the coordinator itself ({r.get('topology') or 'flat'} topology, heartbeats by "
            f"{transport(r)}); per-slice leaders are not built"
        )
    cpus = size.get("load_cpus")
    where = f"{len(cpus)} CPU(s) apart from the coordinator's" if cpus else "the machine's CPUs with the coordinator"
    by_datagram = r.get("hold_first_by_datagram")
    how = (
        f"{fmt(by_datagram)} of the workers heard it first by datagram (the stream copies' p99 "
        f"{fmt(r.get('stream_fanout_p99_seconds'))} s)"
        if by_datagram
        else "the coordinator writes one message per worker stream"
    )
    return (
        f"gap: median hold fan-out {fmt(r.get('fanout_p50_seconds'))} s; {how}, and the load generators that read "
        f"them shared {where}, using {fmt(size.get('generators_cpu_cores'))} cores at steady state"
    )


def hold_cycle_rows(sc: dict[str, Any]) -> list[dict[str, Any]]:
    """Scale rows of the hold-cycle scenario (rows from before scenarios existed are of that one)."""
    return [r for r in sc.get("results", []) if r.get("scenario", "hold_cycles") == "hold_cycles"]


def _scale_target(
    sc: dict[str, Any] | None, field: str, limit: float, name: str, unit: str, at: int = 10000
) -> Verdict:
    goal = f"< {limit:g} {unit} at {at:,} workers, shipped heartbeat settings, every fan-out delivered"
    if sc is None:
        return Verdict(name, goal, "–", "not measured", "no scale results")
    rows = [r for r in hold_cycle_rows(sc) if r.get("workers", 0) >= at]
    if at > 10000:
        rows = [r for r in rows if r.get("workers") == at]
    else:  # the size itself when it ran, else the largest size that ran (not one this machine could not run)
        rows = (
            [r for r in rows if r.get("workers") == at and r.get("runs") != 0]
            or [r for r in rows if r.get("runs") != 0]
            or rows
        )
    if not rows:
        sizes = ", ".join(fmt(r.get("workers")) for r in sc.get("results", [])) or "none"
        return Verdict(name, goal, "–", "not measured", f"no run at {at:,} workers (sizes run: {sizes})")
    r = min(rows, key=lambda x: x["workers"]) if at > 10000 else max(rows, key=lambda x: x["workers"])
    if r.get("runs") == 0:
        return Verdict(name, goal, "–", "not measured", f"{fmt(r['workers'])} workers: {status(r)}")
    basis = (
        f"{fmt(r['workers'])} workers{sharing(r)}, heartbeat {fmt(r.get('heartbeat_interval'))} s, "
        f"{fmt(r.get('cycles'))} cycles"
    )
    if r.get("topology"):
        basis += f", topology {r['topology']}"
    basis += f", heartbeats by {transport(r)}"
    v = r.get(field)
    shown = "–" if v is None else f"{fmt(v)} {unit}"
    if field == "coordinator_cores" and v is not None:
        shown = spread_text(v, r.get("coordinator_cores_min"), r.get("coordinator_cores_max"))
        shown += f" {unit} ({fmt(r.get('cpu_windows'))} windows)"
    causes = scale_causes(sc, r)
    if not is_valid(r):
        gap = scale_gap(sc) if field == "coordinator_cores" else None
        return Verdict(name, goal, shown, "invalid", f"{basis}: " + "; ".join(causes) + (f". {gap}" if gap else ""))
    if v is None:
        return Verdict(name, goal, "–", "not measured", basis)
    why = unjudged(sc, r.get("runs"))
    off_shipped = [c for c in causes if c.startswith(("heartbeat ", "heartbeats by "))]
    if why or off_shipped:
        return Verdict(
            name, goal, shown, "not measured", f"{basis}: " + "; ".join([*([why] if why else []), *off_shipped])
        )
    if v >= limit:
        causes.append(scale_shortfall(sc, r, field))
    if field == "fanout_p99_seconds" and r.get("fanout_p99_processed_seconds") is not None:
        size = next((x for x in sc.get("sizes", []) if x.get("workers") == r.get("workers")), {})
        per = sc.get("config", {}).get("workers_per_generator")
        cpus = size.get("load_cpus")
        share = r.get("hold_first_by_datagram")
        shown_share = "–" if share is None else f"{fmt(round(share * 100, 2))}%"
        causes.append(
            f"datagrams timed at the kernel's receive time in the load generators ({shown_share} "
            f"of first copies came by datagram); the generators ({fmt(per)} workers a process, "
            f"{f'on {len(cpus)} CPU(s) of their own' if cpus else 'beside the coordinator'}) read them by "
            f"{fmt(r['fanout_p99_processed_seconds'])} s p99"
        )
        copies = [c for c in r.get("hold_stream_copies") or [] if c]
        if copies:
            causes.append(
                f"workers that acknowledged their datagram late also got the stream's copy: {fmt(min(copies))}-"
                f"{fmt(max(copies))} a cycle, p99 {fmt(r.get('stream_fanout_p99_seconds'))} s"
            )
    return Verdict(name, goal, shown, "met" if v < limit else "not met", "; ".join([basis, *causes]))


FLUSH_FRACTION = (0.7, 1.2)
"""The flush target: Orbax's throughput within this band of the fair raw writer's (bench/flush.py)."""


def flush_band_distance(fraction: float) -> float:
    """Orders sizes for the verdict: most negative = furthest below the band, then furthest above."""
    lo, hi = FLUSH_FRACTION
    if fraction < lo:
        return fraction - lo - 10.0
    return hi - fraction if fraction > hi else 0.0


def _flush_targets(fl: dict[str, Any] | None) -> list[Verdict]:
    goal = (
        f"{FLUSH_FRACTION[0]}-{FLUSH_FRACTION[1]} of the fair raw write+fsync (median of interleaved pairs), every size"
    )
    if fl is None:
        return [Verdict("flush throughput", goal, "–", "not measured", "no flush results")]
    out = []
    rows = [r for r in fl.get("results", []) if r.get("fraction_of_raw_median") is not None]
    for method in sorted({r["method"] for r in rows}):
        mine = [r for r in rows if r["method"] == method]
        # The size furthest outside the band (below it first: a slow flush is the failure that matters).
        worst = min(mine, key=lambda r: flush_band_distance(r["fraction_of_raw_median"]))
        shown = spread_text(
            worst["fraction_of_raw_median"],
            worst.get("fraction_of_raw_min"),
            worst.get("fraction_of_raw_max"),
            worst["runs"],
        )
        ok = FLUSH_FRACTION[0] <= worst["fraction_of_raw_median"] <= FLUSH_FRACTION[1]
        why = unjudged(fl, min(r["runs"] for r in mine))
        if why:
            out.append(Verdict(f"flush throughput ({method})", goal, shown, "not measured", why))
            continue
        out.append(
            Verdict(
                f"flush throughput ({method})",
                goal,
                shown,
                "met" if ok else "not met",
                f"worst size {fmt(worst['size_mib'])} MiB, device-to-host copy included in both"
                + (
                    f" (without it: {fmt(worst['fraction_of_raw_without_copy_median'])})"
                    if worst.get("fraction_of_raw_without_copy_median") is not None
                    else ""
                )
                + (
                    "; above the band: the raw writer was not the fastest"
                    if worst["fraction_of_raw_median"] > FLUSH_FRACTION[1]
                    else ""
                ),
            )
        )
    sb = next((r for r in fl.get("results", []) if r.get("method") == "step_boundary_idle"), None)
    if sb is not None:
        name, sgoal = "step_boundary() with nothing pending", "< 50 microseconds, median"
        v = sb.get("microseconds_median")
        why = unjudged(fl, sb.get("runs"))
        shown = f"{fmt(v)} microseconds, n={fmt(sb.get('runs'))}"
        if v is None or why:
            out.append(Verdict(name, sgoal, shown, "not measured", why or "no figure"))
        else:
            out.append(Verdict(name, sgoal, shown, "met" if v < 50 else "not met", "median of runs"))
    return out or [Verdict("flush throughput", goal, "–", "not measured", "no flush rows")]


def _detection_targets(de: dict[str, Any] | None) -> list[Verdict]:
    limits = {"kill": 0.5, "hang": 2.0, "pubsub_notice": 0.2, "metadata_notice": 0.2}
    out = []
    rows = {r["kind"]: r for r in (de or {}).get("results", [])}
    for kind, lim in limits.items():
        goal = f"<= {lim:g} s, worst run"
        r = rows.get(kind)
        name = f"detection: {kind} to hold decision"
        if r is None or not r.get("available") or not r.get("runs"):
            out.append(Verdict(name, goal, "–", "not measured", (r or {}).get("note", "no result")))
            continue
        shown = f"{fmt(r['decision_seconds_median'])} s [worst {fmt(r['decision_seconds_max'])} s], n={fmt(r['runs'])}"
        if r.get("errors"):
            why = "; ".join(r.get("error_reasons") or []) or "no decision"
            out.append(Verdict(name, goal, shown, "invalid", f"{fmt(r['errors'])} runs failed: {why}"))
            continue
        basis = "median [worst]"
        if r.get("sent_to_decision_seconds_max") is not None:
            basis += (
                " from the subscriber's receipt; from publishing (Pub/Sub's delivery included): "
                f"{fmt(r['sent_to_decision_seconds_median'])} s [worst {fmt(r['sent_to_decision_seconds_max'])} s]"
            )
        out.append(Verdict(name, goal, shown, "met" if r["decision_seconds_max"] <= lim else "not met", basis))
    return out


def _footprint_targets(fp: dict[str, Any] | None) -> list[Verdict]:
    out = []
    rows = {r["role"]: r for r in (fp or {}).get("results", [])}
    for role in ("coordinator", "worker"):
        r = rows.get(role)
        for field, lim, unit, what in (
            ("idle_cpu_pct_median", 1.0, "%", "idle CPU"),
            ("rss_mib_median", 100, "MiB", "RSS"),
        ):
            name, goal = f"{role} {what}", f"< {lim:g} {unit}"
            v = None if r is None else r.get(field)
            why = None if r is None else unjudged(fp or {}, r["runs"])
            if v is None:
                out.append(Verdict(name, goal, "–", "not measured", "no footprint results"))
            elif why:
                out.append(Verdict(name, goal, f"{fmt(v)} {unit}, n={fmt(r['runs'])}", "not measured", why))
            else:
                out.append(
                    Verdict(
                        name, goal, f"{fmt(v)} {unit}, n={fmt(r['runs'])}", "met" if v < lim else "not met", "median"
                    )
                )
    return out


def _restart_targets(sc: dict[str, Any] | None) -> list[Verdict]:
    """Per size with a coordinator_restart row: no host lost and every worker back (the rejoin grace counts
    from the newest re-registration, so the time until all are back is shown beside it)."""
    out = []
    for r in sorted(
        (r for r in (sc or {}).get("results", []) if r.get("scenario") == "coordinator_restart"),
        key=lambda x: x["workers"],
    ):
        name = f"coordinator restart at {fmt(r['workers'])} workers"
        goal = "0 hosts lost, every worker back (the grace counts from the newest re-registration)"
        shown = (
            f"{fmt(r.get('hosts_lost'))} lost, all back {fmt(r.get('all_back_seconds'))} s "
            f"(grace {fmt(r.get('rejoin_grace'))} s), n={fmt(r.get('runs'))}"
        )
        why = unjudged(sc or {}, r.get("runs"))
        if not is_valid(r):
            out.append(Verdict(name, goal, shown, "invalid" if r.get("runs") else "not measured", status(r)))
        elif why:
            out.append(Verdict(name, goal, shown, "not measured", why))
        else:
            out.append(
                Verdict(name, goal, shown, "met", f"SIGKILL under load, restarted on the same ports{sharing(r)}")
            )
    return out


def _goodput_group(r: dict[str, Any]) -> str:
    """A goodput row's trainer and checkpoint period (rows before periods were kept apart name none)."""
    period = r.get("checkpoint_period")
    return f"{r['trainer']} trainer" + ("" if period is None else f", checkpoint period {fmt(period)}")


def _goodput_targets(gp: dict[str, Any] | None) -> list[Verdict]:
    """Per trainer and checkpoint period: is the sidecar's goodput the highest of the strategies at the
    stated schedule?"""
    goal = "the sidecar's goodput the highest of the strategies"
    if gp is None:
        return [Verdict("goodput", goal, "–", "not measured", "no goodput results")]
    out = []
    every = gp.get("results", [])
    rows = [r for r in every if r.get("goodput") is not None]
    for group in sorted({_goodput_group(r) for r in every}):
        mine = sorted((r for r in rows if _goodput_group(r) == group), key=lambda r: -r["goodput"])
        side = next((r for r in mine if r["strategy"] == "sidecar"), None)
        name = f"goodput, {group}"
        if not mine:
            why = next(
                (r["invalid_reason"] for r in every if _goodput_group(r) == group and r.get("invalid_reason")), ""
            )
            out.append(Verdict(name, goal, "–", "not measured", why or "no goodput in this group"))
            continue
        runs = min(r.get("runs", 0) for r in mine)
        shown = ", ".join(f"{r['strategy']} {fmt(r['goodput'])}" for r in mine) + f", n={fmt(runs)}"
        why = unjudged(gp, runs)
        if side is None or why:
            side_why = next(
                (
                    r["invalid_reason"]
                    for r in every
                    if _goodput_group(r) == group and r["strategy"] == "sidecar" and r.get("invalid_reason")
                ),
                None,
            )
            out.append(Verdict(name, goal, shown, "not measured", why or side_why or "no sidecar row"))
            continue
        best = mine[0]
        ok = side["goodput"] >= best["goodput"]
        sched = (
            f"a fault every {fmt(side['fault_interval_minutes'])} min ({', '.join(side['faults_measured'])}), "
            f"run of {fmt(side['run_hours'])} h"
        )
        out.append(
            Verdict(
                name, goal, shown, "met" if ok else "not met", sched + ("" if ok else f"; {best['strategy']} higher")
            )
        )
    return out or [Verdict("goodput", goal, "–", "not measured", "no goodput rows")]


PERIOD_COST_FACTOR = 3
"""The sidecar's period cost at most a third of MaxText's rewind's (issue 23)."""
STEP_OVERHEAD_BUDGET = STEP_OVERHEAD_RESOLUTION
"""The sidecar's steady step overhead over plain MaxText at most 2% (issue 23)."""


def _period_cost_targets(rec: dict[str, Any] | None) -> list[Verdict]:
    """MaxText, per checkpoint period measured: the sidecar's period cost (fault cost at the full-slice rate
    plus the steady overhead over one period) the lowest of all strategies and at most a third of the rewind's,
    and its steady step overhead over plain MaxText at most 2%."""
    goal = (
        f"sidecar's period cost the lowest and <= 1/{PERIOD_COST_FACTOR} of checkpoint_rewind's; its step "
        f"overhead <= {STEP_OVERHEAD_BUDGET:.0%}"
    )
    rows = [r for r in (rec or {}).get("results", []) if is_maxtext(r.get("trainer")) and r.get("fault") == "kill"]
    if rec is None or not any(r.get("period_cost_seconds_median") is not None for r in rows):
        return [Verdict("period cost, MaxText", goal, "–", "not measured", "no MaxText rows with a period cost")]
    out = []
    # Each model size apart (bench.common.maxtext_label), the tiny model's first.
    for trainer, period in sorted(
        {(r["trainer"], r["checkpoint_period"]) for r in rows}, key=lambda k: (k[0] != "maxtext", k)
    ):
        at = [r for r in rows if r["trainer"] == trainer and r["checkpoint_period"] == period]
        name = f"period cost, {maxtext_name(trainer)}, period {fmt(period)}"
        costs = {r["strategy"]: r for r in at if r.get("period_cost_seconds_median") is not None and is_valid(r)}
        side, rewind = costs.get("sidecar"), costs.get("checkpoint_rewind")
        shown = ", ".join(f"{k} {fmt(v['period_cost_seconds_median'])} s" for k, v in sorted(costs.items()))
        if side is None or rewind is None:
            out.append(Verdict(name, goal, shown or "–", "not measured", "no valid sidecar or rewind row"))
            continue
        runs = min(int(r.get("runs") or 0) for r in costs.values())
        overhead = side.get("step_overhead_fraction_median")
        missing = sorted({"full_restart", "checkpoint_rewind", "local_checkpoint_rewind"} - set(costs))
        for strategy in list(missing):
            floor = _period_cost_floor(next((r for r in at if r.get("strategy") == strategy), None))
            if floor is not None and floor > float(side["period_cost_seconds_median"]):
                missing.remove(strategy)  # cannot be the lowest, whatever its fault cost
                shown += f", {strategy} >= {fmt(floor)} s (its row invalid by its fault cost; bound: {FLOOR_NOTE})"
        shown += f"; sidecar step overhead {fmt(overhead)} (n={fmt(runs)})"
        why = unjudged(rec, runs)
        drift = step_times_drifted(list(costs.values()))
        if why or missing or overhead is None:
            reason = why or (f"no valid {', '.join(missing)} row" if missing else "no step overhead")
            out.append(Verdict(name, goal, shown, "not measured", reason + (f"; {drift}" if drift else "")))
            continue
        if drift:
            # The period cost adds steady overhead the run could not resolve; its fault costs still stand.
            full = {k: _full_rate_cost(v) for k, v in costs.items()}
            ratio = full["checkpoint_rewind"] / full["sidecar"]
            basis = (
                f"{drift}; fault cost alone at the full-slice rate: "
                + ", ".join(f"{k} {fmt(v)} s" for k, v in sorted(full.items()))
                + f" (rewind / sidecar {ratio:.2f}x)"
            )
            out.append(Verdict(name, goal, shown, "not measured", basis))
            continue
        lowest = min(costs.values(), key=lambda r: float(r["period_cost_seconds_median"]))
        ratio = float(rewind["period_cost_seconds_median"]) / float(side["period_cost_seconds_median"])
        fails = []
        if lowest is not side:
            fails.append(f"{lowest['strategy']} lower")
        if ratio < PERIOD_COST_FACTOR:
            fails.append(f"rewind / sidecar {ratio:.2f}x")
        if float(overhead) > STEP_OVERHEAD_BUDGET:
            said = f"step overhead {float(overhead):.2%}"
            own = rewind.get("step_overhead_fraction_median")
            if own is not None:  # what the same run reads for MaxText's own elastic mode, beside it
                said += f" (checkpoint_rewind, no more work a step than plain MaxText, reads {float(own):.2%})"
            fails.append(said)
        basis = f"rewind / sidecar {ratio:.2f}x" + (f"; {', '.join(fails)}" if fails else "")
        out.append(Verdict(name, goal, shown, "not met" if fails else "met", basis))
    return out


FLOOR_NOTE = "its steady overhead over the period plus its lowest run's fault cost"


def _period_cost_floor(row: dict[str, Any] | None) -> float | None:
    """A lower bound on the period cost of a MaxText row that is invalid only because a run's local fault
    cost fell below zero (the run's own step time was off by more than its fault cost): its steady overhead
    over one period, ``(steady - plain) * period``, plus the lowest run's local fault cost (a full-rate cost
    is never below the local one). None for any other row or without the figures."""
    if row is None or not str(row.get("invalid_reason") or "").startswith("local fault cost below zero"):
        return None
    steady, plain = row.get("steady_step_seconds_median"), row.get("plain_step_seconds_median")
    lowest, period = row.get("fault_cost_seconds_min"), row.get("checkpoint_period")
    if steady is None or plain is None or lowest is None or not period:
        return None
    return round((float(steady) - float(plain)) * int(period) + min(0.0, float(lowest)), 3)


def _full_rate_cost(row: dict[str, Any]) -> float:
    """A MaxText row's fault cost with every step on fewer slices at the full-slice rate (a row with none
    kept on fewer slices: its local cost)."""
    full = row.get("fault_cost_if_shrunk_steps_took_full_time_seconds_median")
    return float(full if full is not None else row["fault_cost_seconds_median"])


def _step_overhead_target(so: dict[str, Any] | None) -> list[Verdict]:
    """MaxText: the sidecar's steady step overhead over plain MaxText at most 2%, from the paired rounds of
    ``python -m bench step_overhead`` (the wall time's median over rounds without steal)."""
    name, goal = (
        "step overhead, MaxText (paired rounds)",
        f"sidecar's steady step <= {STEP_OVERHEAD_BUDGET:.0%} over plain",
    )
    if so is None:
        return []
    side = next((r for r in so.get("results", []) if r.get("variant") == "sidecar"), None)
    if side is None or not is_valid(side) or side.get("overhead_fraction_median") is None:
        return [Verdict(name, goal, "–", "not measured", (side or {}).get("invalid_reason") or "no sidecar row")]
    wall, cpu = float(side["overhead_fraction_median"]), side.get("cpu_overhead_fraction_median")
    used = int(side.get("rounds_used") or 0)
    shown = f"wall {fmt(wall)}" + (f", CPU {fmt(cpu)}" if cpu is not None else "") + f" of the step, n={used} rounds"
    # The in-process figure comes from every sidecar run's own lines, whatever rounds steal left out.
    out = _in_process_overhead(so, side)
    why = unjudged(so, used)
    if why:
        return [Verdict(name, goal, shown, "not measured", why), *out]
    per = [float(x) for x in side.get("overhead_fraction_per_round") or [wall]]
    basis = "wall, per round: " + ", ".join(fmt(x) for x in per)
    # Judged only where every round agrees: rounds that straddle the budget do not resolve it, whatever
    # their median says (on this VM the step time drifts by more than 2% between runs minutes apart).
    if max(per) <= STEP_OVERHEAD_BUDGET:
        return [Verdict(name, goal, shown, "met", basis), *out]
    if min(per) > STEP_OVERHEAD_BUDGET:
        return [Verdict(name, goal, shown, "not met", basis), *out]
    return [
        Verdict(name, goal, shown, "not measured", basis + ": the rounds straddle the budget, not resolved"),
        *out,
    ]


def _in_process_overhead(so: dict[str, Any], side: dict[str, Any]) -> list[Verdict]:
    """The same 2% from the sidecar runs' own figures, which a drift between runs does not touch: ``auto``'s
    measure of its snapshots plus the hook's own time at each boundary over the plain step."""
    name, goal = "step overhead, MaxText (in process)", f"snapshots + hook's own time <= {STEP_OVERHEAD_BUDGET:.0%}"
    snap, own = side.get("snapshot_hook_overhead_fraction_median"), side.get("hook_fraction_of_plain_step")
    if snap is None or own is None:
        return []
    total = float(snap) + float(own)
    runs = int(side.get("runs") or 0)
    shown = f"{fmt(round(total, 5))} (snapshots {fmt(snap)} + hook {fmt(own)}), n={runs}"
    why = unjudged(so, runs)
    if why:
        return [Verdict(name, goal, shown, "not measured", why)]
    return [Verdict(name, goal, shown, "met" if total <= STEP_OVERHEAD_BUDGET else "not met", "medians of the runs")]


def targets(secs: dict[str, dict[str, Any]]) -> list[Verdict]:
    rec = secs.get("recovery")
    out = _goodput_targets(secs["goodput"]) if "goodput" in secs else []
    sizes = sorted({r["trainer"] for r in (rec or {}).get("results", []) if is_maxtext(r.get("trainer"))} - {"maxtext"})
    for mx in ["maxtext", *sizes]:
        name = maxtext_name(mx)
        out += _recovery_ratio_target(rec, "checkpoint_rewind", 3, mx, f"sidecar vs checkpoint rewind, {name}")
        out += _recovery_ratio_target(rec, "full_restart", 10, mx, f"sidecar vs full restart, {name}")
    out += _period_cost_targets(rec)
    out += _step_overhead_target(secs.get("step_overhead"))
    if rec is not None and any(r.get("trainer") == "example" for r in rec.get("results", [])):
        out += _recovery_ratio_target(
            rec, "checkpoint_rewind", 3, "example", "sidecar vs checkpoint rewind, example trainer"
        )
        out += _recovery_ratio_target(rec, "full_restart", 10, "example", "sidecar vs full restart, example trainer")
    sc = secs.get("scale")
    out.append(_scale_target(sc, "coordinator_cores", 0.5, "coordinator CPU", "cores"))
    out.append(_scale_target(sc, "fanout_p99_seconds", 1.0, "hold fan-out p99 (worst cycle)", "s"))
    if sc is not None and any(r.get("workers") == 25000 for r in hold_cycle_rows(sc)):
        out.append(_scale_target(sc, "coordinator_cores", 1.0, "coordinator CPU at 25,000", "cores", at=25000))
    out += _restart_targets(sc)
    out += _flush_targets(secs.get("flush"))
    out += _detection_targets(secs.get("detection"))
    out += _footprint_targets(secs.get("footprint"))
    return out


# ---------------------------------------------------------------------------
# sections
# ---------------------------------------------------------------------------


def commit_line(d: dict[str, Any]) -> str:
    """A run's commit, whether its tree was dirty, when it started and how long it took."""
    return (
        f"Commit `{d.get('git_sha') or 'unknown'}`"
        + (" **with uncommitted changes (dirty)**" if d.get("dirty") else "")
        + f"; started {d.get('started_at') or '–'}, took {fmt(d.get('duration_s'))} s"
    )


def row_run_list(s: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs a section's rows name (``row["run"]``, one per commit and start), oldest first."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for r in s.get("results") or []:
        run = r.get("run")
        if run:
            seen.setdefault((str(run.get("started_at")), str(run.get("git_sha"))), run)
    return [seen[k] for k in sorted(seen)]


def row_commit(r: dict[str, Any]) -> str:
    return f"`{(r.get('run') or {}).get('git_sha') or '–'}`"


def header(s: dict[str, Any]) -> list[str]:
    m = s.get("machine", {})
    by_trainer = (s.get("config") or {}).get("by_trainer") or {}
    runs = {str(c["git_sha"]) for c in by_trainer.values() if c.get("git_sha")}
    row_runs = row_run_list(s)
    if len(row_runs) > 1:
        # Rows of separate runs (bench --keep-other-rows): each row names its run's commit.
        first = "Rows from separate runs, each row with its run's commit (`commit` column):"
        lines = [first, ""]
        for run in row_runs:
            rm = run.get("machine")
            where = (
                f"{fmt(rm.get('cores'))} cores ({fmt(rm.get('cores_usable'))} usable), {fmt(rm.get('memory_gib'))} "
                f"GiB, {rm.get('cpu_model') or '–'}, Python {rm.get('python') or '–'}"
                if rm
                else "machine not recorded"
            )
            lines.append(
                f"- {commit_line(run)}; {where}; net.core.rmem_max {fmt(run.get('net_core_rmem_max'))}: "
                + (f"`python -m bench {' '.join(run['argv'])}`" if run.get("argv") is not None else "command unknown")
            )
        if s.get("method"):
            lines += ["", "<details><summary>Method (the benchmark's description when it ran)</summary>", ""]
            lines += [s["method"].strip(), "", "</details>"]
        return lines
    if len(runs) > 1:
        # Separate runs per trainer: each trainer's block below names its commit and command line.
        first = (
            "Separate runs per trainer, at commits "
            + ", ".join(f"`{x}`" for x in sorted(runs))
            + ": each trainer's commit, start, duration and command line are given with its rows."
        )
    else:
        first = (
            commit_line(s) + ("; **quick (smoke-sized: figures not representative)**" if s.get("quick") else "") + "."
        )
    lines = [
        first,
        f"Machine: {fmt(m.get('cores'))} cores ({fmt(m.get('cores_usable'))} usable), {fmt(m.get('memory_gib'))} GiB, "
        f"{m.get('cpu_model') or '–'}; Python {m.get('python') or '–'}, jax {m.get('jax') or '–'}; load average at "
        f"start {fmt(m.get('load_average_at_start'))}, at end {fmt(s.get('load_average_at_end'))}.",
    ]
    argv = (s.get("config") or {}).get("argv")
    if argv is not None and len(runs) <= 1:
        lines += ["", "```sh", "python -m bench " + " ".join(argv), "```"]
    if s.get("error"):
        lines += ["", f"**The benchmark failed**: {s['error']}"]
    if s.get("method"):
        lines += ["", "<details><summary>Method (the benchmark's description when it ran)</summary>", ""]
        lines += [s["method"].strip(), "", "</details>"]
    return lines


def sweep_lines(cfg: dict[str, Any]) -> list[str]:
    """Which (fault, checkpoint period, replacement delay) points ran, from the run's own config."""
    cases = cfg.get("cases") or []
    if not cases:
        return []
    by_fault: dict[str, list[str]] = {}
    for fault, period, delay in cases:
        by_fault.setdefault(fault, []).append(f"({fmt(period)}, {fmt(delay)} s)")
    out = [
        "",
        "Points run, as (checkpoint period, replacement delay)"
        + (f", sweep {cfg['sweep']}" if cfg.get("sweep") else "")
        + ":",
        "",
    ]
    out += [f"- {fault}: {', '.join(points)}" for fault, points in by_fault.items()]
    missing = [f for f in ("kill", "hang", "notice") if f not in by_fault]
    if missing:
        out.append(f"- not run: {', '.join(missing)}")
    runs, refs = cfg.get("runs"), cfg.get("fault_free_runs") or cfg.get("runs")
    out += [
        "",
        f"Rounds: {fmt(runs)} (each row's n counts its successful runs); fault-free reference runs per strategy "
        f"and period: {fmt(refs)}; strategies: {fmt(cfg.get('strategies'))}.",
    ]
    return out


def left_out(cfg: dict[str, Any], r: dict[str, Any]) -> str | None:
    """Why a recovery row has no runs when the run's ``--sweep-strategies`` left its strategy out
    at this point (every strategy runs at the realistic point); None otherwise.

    The rule is ``bench.recovery.Config.runs_at``'s, read here from the config the run recorded
    (the page is rendered from the JSON alone, also for runs made before rows said it)."""
    chosen = cfg.get("sweep_strategies")
    point = (r.get("checkpoint_period"), r.get("replacement_delay"))
    realistic = (cfg.get("realistic_checkpoint_period"), cfg.get("realistic_delay"))
    if r.get("runs") or r.get("failed_runs") or chosen is None or point == realistic or r["strategy"] in chosen:
        return None
    return f"not run by choice: --sweep-strategies {','.join(chosen)} away from the realistic point"


ROW_KEY_HEAD = ["trainer", "strategy", "period", "delay s"]


def row_key(r: dict[str, Any]) -> list[str]:
    """A recovery row's identifying cells, under :data:`ROW_KEY_HEAD`."""
    return [r["trainer"], r["strategy"], fmt(r["checkpoint_period"]), fmt(r["replacement_delay"])]


def maxtext_steps(s: dict[str, Any], mx: dict[str, Any]) -> str:
    """How long a MaxText run was: from its pre-trained checkpoint to its fault and a tail
    (a run that records ``start_label``), or, for earlier runs, the steps every run had."""
    if mx.get("start_label"):
        return (
            "each run restores a checkpoint of the job trained to step "
            + ", ".join(f"{fmt(v)} (period {k})" for k, v in mx["start_label"].items())
            + f", runs to its fault ({fmt(mx.get('fault_phases'))}) and {fmt(mx.get('tail_steps'))} steps "
            f"past it (full_restart: {fmt(mx.get('tail_steps_full_restart'))})"
        )
    # The steps the fault-free runs completed, where recorded: until a later fix the config's figure
    # left out the longer tail of runs that continue on the survivor.
    ran = sorted(
        {r["last_step"] for r in s.get("fault_free_runs", []) if is_maxtext(trainer_of(r)) and r.get("last_step")}
    )
    if ran:
        return f"steps per run {', '.join(fmt(x) for x in ran)} (as the fault-free runs completed)"
    return f"steps per run {fmt(mx.get('steps'))}"


def snapshot_interval_text(mx: dict[str, Any]) -> str:
    """The sidecar's MaxText snapshot interval as run: a number of steps, or the hook's shipped ``auto``."""
    every = mx.get("snapshot_every")
    if every is None or "auto" in str(every) or str(every) == "-1":
        return "auto (the hook's shipped default: measured, at most 2% of the step)"
    return f"every {fmt(every)} step(s)"


def sec_recovery(s: dict[str, Any], plots: dict[str, str]) -> list[str]:
    cfg = s.get("config", {})
    out: list[str] = []
    ran = set(cfg.get("trainers") or [])
    for t in ("example", "maxtext"):
        if ran and t not in ran:
            out += [f"**Trainer {t}: not run** at this commit: no {t} rows, and its targets are not measured.", ""]
    by_trainer = cfg.get("by_trainer") or {}
    for trainer, c in sorted(by_trainer.items()) or [(None, cfg)]:
        if trainer is not None:
            out += [f"**Trainer {trainer}** (its own run):", ""]
            if c.get("git_sha"):
                out += [
                    commit_line(c)
                    + f"; load average at start {fmt((c.get('machine') or {}).get('load_average_at_start'))}"
                    f", at end {fmt(c.get('load_average_at_end'))}.",
                ]
                if c.get("argv") is not None:
                    out += ["", "```sh", "python -m bench " + " ".join(c["argv"]), "```"]
                out.append("")
        if not is_maxtext(trainer) and "example" in (c.get("trainers") or ["example"]):
            out.append(
                f"Example trainer state: {fmt(c.get('state_bytes'))} bytes across {fmt(c.get('slices'))} slices, "
                f"donated: {fmt(c.get('donate'))}."
            )
            if c.get("fresh_memory_seconds"):
                out.append(
                    "Writing fresh memory at the start of the run, each GiB in turn (s): "
                    + ", ".join(fmt(x) for x in c["fresh_memory_seconds"])
                    + " (the trainers' allocations pay this; see the method)."
                )
        mx = c.get("maxtext")
        if mx and (trainer is None or is_maxtext(trainer)):
            out.append(
                f"MaxText: model {fmt(mx.get('model'))} ({fmt(mx.get('slices'))} CPU slices; parameters and state "
                f"bytes per row below), {maxtext_steps(s, mx)}, the sidecar's snapshot interval "
                f"{snapshot_interval_text(mx)}; elastic_min_slice_count "
                # Runs before the option existed all passed -1 (bench.recovery_maxtext's flags then).
                f"{fmt(mx.get('elastic_min_slice_count', -1))} for both elastic strategies "
                "(-1: wait for every slice; 1: continue on the survivor, grow back when the replacement comes)."
            )
            j = mx.get("journal") or {}
            if j.get("runs_from_earlier_sittings"):
                first = j.get("earliest_earlier_run_finished_at")
                when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(first)) if first else "–"
                out.append(
                    f"{fmt(j['runs_from_earlier_sittings'])} of these runs were made by earlier sittings of the same "
                    f"benchmark at the same commit (its journal; the earliest finished {when}): the start and "
                    "duration above are the last sitting's."
                )
        out += [
            f"Realistic point: checkpoint period {fmt(c.get('realistic_checkpoint_period'))} steps, replacement "
            f"delay {fmt(c.get('realistic_delay'))} s; fault phases seeded with {fmt(c.get('seed'))}.",
        ]
        out += sweep_lines(c) + [""]
    out += [
        "",
        "Fault cost (s): median [min–max], p90, n = successful runs. Lost steps: median (worst).",
        "",
    ]
    rows = []
    for r in s.get("results", []):
        if not r.get("runs"):
            rows.append(
                [r["trainer"], r["strategy"], r["fault"], fmt(r["checkpoint_period"]), fmt(r["replacement_delay"])]
                + ["–"] * 4
                + [fmt(r.get("failed_runs")), left_out(trainer_config(s, r["trainer"]), r) or status(r)]
            )
            continue
        cost = spread_text(
            r.get("fault_cost_seconds_median"),
            r.get("fault_cost_seconds_min"),
            r.get("fault_cost_seconds_max"),
            r.get("runs"),
            r.get("fault_cost_seconds_p90"),
        )
        rows.append(
            [
                r["trainer"],
                r["strategy"],
                r["fault"] + (f" (run as {r['ran_as']})" if r.get("ran_as") else ""),
                fmt(r["checkpoint_period"]),
                fmt(r["replacement_delay"]),
                cost,
                f"{fmt(r.get('lost_steps_median'))} ({fmt(r.get('lost_steps_max'))})",
                fmt(r.get("recovery_seconds_median")),
                fmt(r.get("restored_from")),
                fmt(r.get("failed_runs")),
                status(r),
            ]
        )
    head = ["trainer", "strategy", "fault", "period", "delay s", "fault cost s", "lost steps"]
    out += table(head + ["recovery s", "restored from", "failed runs", "status"], rows)
    ratios = s.get("ratios") or []
    if ratios:
        out += ["", "Ratios: a baseline's median fault cost over the sidecar's (fault cost only).", ""]
        out += table(
            ["trainer", "fault", "period", "delay s", "baseline", "baseline s", "sidecar s", "ratio"],
            [
                [
                    x["trainer"],
                    x["fault"],
                    fmt(x["checkpoint_period"]),
                    fmt(x["replacement_delay"]),
                    x["baseline"],
                    fmt(x["baseline_fault_cost_seconds_median"]),
                    fmt(x["sidecar_fault_cost_seconds_median"]),
                    fmt(x["ratio"]) if x.get("ratio") is not None else f"– ({x.get('why_none', '')})",
                ]
                for x in ratios
            ],
        )
    period = [r for r in s.get("results", []) if r.get("period_cost_seconds_median") is not None]
    if period:
        out += [
            "",
            "MaxText, one checkpoint period with its fault (issue 23): the fault cost with every step on fewer "
            "slices at the full-slice rate, plus the strategy's steady step overhead over plain MaxText "
            "(full_restart: no elastic mode, no sidecar) times the period's steps. Steady step times are read "
            "before each run's fault (steady source); mesh slices: MaxText's mesh before the fault and for the "
            "first attempt after it.",
            "",
        ]
        out += table(
            [
                *ROW_KEY_HEAD,
                "period cost s",
                "fault cost at full rate s",
                "step overhead",
                "steady step s",
                "plain step s",
                "mesh slices",
                "n",
                "steady source",
            ],
            [
                [
                    *row_key(r),
                    fmt(r["period_cost_seconds_median"]),
                    fmt(r.get("fault_cost_if_shrunk_steps_took_full_time_seconds_median")),
                    fmt(r.get("step_overhead_fraction_median")),
                    fmt(r.get("steady_step_seconds_median")),
                    fmt(r.get("plain_step_seconds_median")),
                    f"{fmt(r.get('mesh_slices_before'))} -> {fmt(r.get('mesh_slices_after'))}",
                    fmt(r.get("runs")),
                    fmt(r.get("steady_step_source")),
                ]
                for r in period
            ],
        )
    snaps: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in s.get("results", []):  # one line per job: the cost comes from its fault-free runs
        if r.get("snapshot_ms_per_step_median") is not None:
            snaps.setdefault((r["trainer"], r["strategy"], r["checkpoint_period"], r.get("model")), r)
    if snaps:
        out += ["", "In-memory snapshots (fault-free runs; not in the fault cost above):", ""]
        out += table(
            ["trainer", "strategy", "period", "model", "params", "snapshot ms per step", "of the step", "n"],
            [
                [
                    r["trainer"],
                    r["strategy"],
                    fmt(r["checkpoint_period"]),
                    fmt(r.get("model")),
                    fmt(r.get("params")),
                    fmt(r["snapshot_ms_per_step_median"]),
                    fmt(r.get("snapshot_fraction_of_step_median")),
                    fmt(r.get("snapshot_cost_runs")),
                ]
                for r in snaps.values()
            ],
        )
    local = [r for r in s.get("results", []) if r.get("fault_cost_method") == "local" and r.get("runs")]
    if local:
        out += [
            "",
            "Local fault cost (the rows above with these): from the last step completed before the fault to "
            "the step a few new steps past both the fault and the return to every slice, less the work done in "
            "that window at the run's own step time over the checkpoint period before the fault. The whole-run "
            "measure (the run's time less its work at the fault-free runs' rate) is beside it; its error grows "
            "with the run's length, because fault-free rates differ between runs:",
            "",
        ]
        out += table(
            [
                *ROW_KEY_HEAD,
                "local fault cost s",
                "own step s",
                "window s",
                "window work steps",
                "whole-run fault cost s",
                "fault-free rate spread",
            ],
            [
                [
                    *row_key(r),
                    fmt(r.get("fault_cost_seconds_median")),
                    fmt(r.get("own_step_seconds_median")),
                    fmt(r.get("local_window_seconds_median")),
                    fmt(r.get("local_window_work_steps_median")),
                    spread_text(
                        r.get("whole_run_fault_cost_seconds_median"),
                        r.get("whole_run_fault_cost_seconds_min"),
                        r.get("whole_run_fault_cost_seconds_max"),
                        r.get("runs"),
                    ),
                    fmt(r.get("fault_free_rate_spread")),
                ]
                for r in local
            ],
        )
    each = [r for r in s.get("runs", []) if r.get("local_fault_cost_s") is not None and r.get("checkpoint_period")]
    if each:
        out += [
            "",
            "Each run with a local fault cost, by the fault's phase (steps past the last periodic save "
            "MaxText started before the fault):",
            "",
        ]
        out += table(
            ["trainer", "strategy", "period", "delay s", "fault in step", "phase", "lost steps", "rewinds"]
            + ["fault cost s", "window s", "window work steps"],
            [
                [
                    trainer_of(r),
                    r.get("strategy"),
                    fmt(r["checkpoint_period"]),
                    fmt(r.get("replacement_delay")),
                    fmt(r.get("fault_step")),
                    fmt((r["fault_step"] - 1) % r["checkpoint_period"]) if r.get("fault_step") else "–",
                    fmt(r.get("lost_steps")),
                    fmt(r.get("rewinds")),
                    fmt(r["local_fault_cost_s"]),
                    fmt(r.get("local_window_s")),
                    fmt(r.get("local_window_work_steps")),
                ]
                for r in sorted(each, key=lambda r: (trainer_of(r), str(r.get("strategy")), r.get("fault_step") or 0))
            ],
        )
    shrunk = [r for r in s.get("results", []) if r.get("shrunk_steps_median") is not None]
    if shrunk:
        out += [
            "",
            "Steps run on the survivor alone (kept; each counted as the fraction of the job's devices it ran on). "
            "Here such a step also takes less time than a full one (virtual CPU devices share the cores), which a "
            "TPU slice would not; the last column is the fault cost had each taken a fault-free step's time:",
            "",
        ]
        out += table(
            [
                *ROW_KEY_HEAD,
                "shrunk steps",
                "their seconds",
                "fault cost s",
                "at full time s",
            ],
            [
                [
                    *row_key(r),
                    fmt(r["shrunk_steps_median"]),
                    fmt(r.get("shrunk_seconds_median")),
                    fmt(r.get("fault_cost_seconds_median")),
                    fmt(r.get("fault_cost_if_shrunk_steps_took_full_time_seconds_median")),
                ]
                for r in shrunk
            ],
        )
    failed = [r for r in s.get("results", []) if r.get("failed_runs") and r.get("failures")]
    if failed:
        out += ["", "Why runs failed (they count in no figure):", ""]
        for r in failed:
            why = "; ".join(sorted({str(x).split("; see ")[0] for x in r["failures"]}))
            out.append(
                f"- {r['trainer']} {r['strategy']} {r['fault']}, period {fmt(r['checkpoint_period'])}, delay "
                f"{fmt(r['replacement_delay'])} s: {fmt(r['failed_runs'])} failed: {why}"
            )
    notes = sorted({f"{r['strategy']}: {r['note']}" for r in s.get("results", []) if r.get("note")})
    if notes:
        out += [""] + [f"- {n}" for n in notes]
    return out + plot_line(plots, "recovery")


def sec_scale(s: dict[str, Any], plots: dict[str, str]) -> list[str]:
    rows = [
        [
            fmt(r["workers"]) + sharing(r),
            f"{fmt(r.get('heartbeat_interval'))} / {fmt(r.get('heartbeat_timeout'))}",
            transport(r),
            spread_text(r.get("coordinator_cores"), r.get("coordinator_cores_min"), r.get("coordinator_cores_max"))
            + (f" ({fmt(r['cpu_windows'])} windows)" if r.get("cpu_windows") else "")
            + (" (saturated: a ceiling)" if r.get("saturated") else ""),
            fmt(r.get("coordinator_cores_main_thread")),
            fmt(r.get("coordinator_rss_mib")),
            fmt(r.get("fanout_p99_seconds")),
            fmt(r.get("fanout_p99_processed_seconds")),
            fmt(r.get("resume_fanout_p99_seconds")),
            fmt(r.get("hold_first_by_datagram")),
            fmt(r.get("stream_fanout_p99_seconds")),
            fmt(r.get("delivered_fraction")),
            fmt(r.get("udp_receive_buffer_drops")),
            fmt(r.get("coordinator_socket_drops")),
            fmt(r.get("cycles")),
            fmt(r.get("runs")),
            fmt(r.get("pinned")),
            status(r),
        ]
        for r in s.get("results", [])
        if r.get("scenario") != "coordinator_restart"
    ]
    if any(r.get("scenario") == "health_reports" for r in s.get("results", [])):
        for line, r in zip(
            rows, (r for r in s.get("results", []) if r.get("scenario") != "coordinator_restart"), strict=True
        ):
            line[0] += " (hold by health report)" if r.get("scenario") == "health_reports" else ""
    head = ["workers", "heartbeat / timeout s", "heartbeats by", "coordinator cores", "main thread cores", "RSS MiB"]
    head += ["hold fan-out p99 s (worst cycle)", "same, when the generator read it", "resume fan-out p99 s"]
    head += ["hold first by datagram"]
    head += ["hold stream copy p99 s (worst cycle)", "delivered", "UDP datagrams dropped (machine)"]
    head += ["dropped on the coordinator's socket", "cycles", "runs", "pinned", "status"]
    split = len(row_run_list(s)) > 1
    if split:
        head.append("commit")
        kept = [r for r in s.get("results", []) if r.get("scenario") != "coordinator_restart"]
        for line, r in zip(rows, kept, strict=True):
            line.append(row_commit(r))
    top = topology_line(s)
    out = table(head, rows) + (["", top] if top else [])
    cfg = s.get("config") or {}
    if cfg.get("net_core_rmem_max") is not None:
        out += [
            "",
            f"The machine's net.core.rmem_max: {fmt(cfg['net_core_rmem_max'])} bytes; the coordinator asks for "
            f"{fmt(cfg.get('coordinator_recv_buffer_asked'))} bytes on its heartbeat socket (the kernel grants at "
            "most rmem_max).",
        ]
    restarts = [r for r in s.get("results", []) if r.get("scenario") == "coordinator_restart"]
    if restarts:
        out += ["", "Coordinator restart (SIGKILL under load, started again on the same ports):", ""]
        out += table(
            [
                "workers",
                "hosts lost",
                "all back s (worst run)",
                "restart to serving s",
                "restarted coordinator CPU s until all back",
                "rejoin grace s",
                "dropped on the coordinator's socket",
                "runs",
                "status",
                *(["commit"] if split else []),
            ],
            [
                [
                    fmt(r["workers"]) + sharing(r),
                    fmt(r.get("hosts_lost")),
                    fmt(r.get("all_back_seconds")),
                    fmt(r.get("restart_to_serving_seconds")),
                    fmt(r.get("restart_cpu_seconds")),
                    fmt(r.get("rejoin_grace")),
                    fmt(r.get("coordinator_socket_drops")),
                    fmt(r.get("runs")),
                    status(r),
                    *([row_commit(r)] if split else []),
                ]
                for r in restarts
            ],
        )
    return out + sharing_note(s.get("results", [])) + plot_line(plots, "scale")


def sec_goodput(s: dict[str, Any], plots: dict[str, str]) -> list[str]:
    cfg = s.get("config") or {}
    rows = []
    for r in s.get("results", []):
        costs = r.get("fault_cost_seconds") or {}
        rows.append(
            [
                r["trainer"],
                fmt(r.get("checkpoint_period")),
                r["strategy"],
                f"**{fmt(r.get('goodput'))}**",
                fmt(r.get("steady_seconds_per_step")),
                fmt(r.get("steady_overhead")),
                ", ".join(f"{k} {fmt(v)}" for k, v in costs.items()) or "–",
                fmt(r.get("mean_fault_cost_seconds")),
                fmt(r.get("runs")),
                status(r),
            ]
        )
    mix = cfg.get("fault_mix") or {}
    out = [
        f"Each row: the fraction of wall time spent on work kept over a {fmt(cfg.get('run_hours'))}-hour run with a "
        f"fault every {fmt(cfg.get('fault_interval_minutes'))} minutes (mix "
        + ", ".join(f"{k} {fmt(v)}" for k, v in mix.items())
        + f"): {cfg.get('formula') or '–'}. Inputs: {cfg.get('inputs_from') or '–'}"
        + (f" (commit `{cfg['inputs_git_sha']}`)" if cfg.get("inputs_git_sha") else "")
        + ".",
        "",
    ]
    out += table(
        [
            "trainer",
            "checkpoint period",
            "strategy",
            "goodput",
            "s/step, fault-free",
            "steady overhead",
            "fault cost s (median, per kind)",
            "mean fault cost s",
            "runs",
            "status",
        ],
        rows,
    )
    missing = sorted({f for r in s.get("results", []) for f in r.get("faults_not_measured") or []})
    if missing:
        out += [
            "",
            "Fault kinds of the mix not measured for some rows (left out of their mean): " + ", ".join(missing) + ".",
        ]
    proj = s.get("projection") or []
    if proj:
        sources = sorted({str(p.get("source")) for p in proj})
        out += [
            "",
            f"On paper, at {fmt(proj[0].get('chips'))} chips: the per-fault costs measured here (seconds on this "
            "machine, not what a restart costs at that scale), at the interval between interruptions that a "
            "published rate gives that job. Rate"
            + ("s" if len(sources) > 1 else "")
            + ": "
            + "; ".join(f"[{i}] {src}" for i, src in enumerate(sources, 1))
            + ".",
            "",
        ]
        out += table(
            ["trainer", "checkpoint period", "strategy", "hours between interruptions", "goodput", "rate"],
            [
                [
                    p["trainer"],
                    fmt(p.get("checkpoint_period")),
                    p["strategy"],
                    fmt(p.get("interval_hours")),
                    fmt(p.get("goodput")),
                    f"[{sources.index(str(p.get('source'))) + 1}]",
                ]
                for p in proj
            ],
        )
    return out + plot_line(plots, "goodput")


def sec_flush(s: dict[str, Any], plots: dict[str, str]) -> list[str]:
    rows, sb = [], []
    for r in s.get("results", []):
        if r.get("method") == "step_boundary_idle":
            sb.append(r)
            continue
        rows.append(
            [
                fmt(r["size_mib"]),
                r["method"],
                spread_text(r.get("seconds_median"), r.get("seconds_min"), r.get("seconds_max"), r.get("runs")),
                fmt(r.get("mib_per_s_median")),
                spread_text(
                    r.get("fraction_of_raw_median"), r.get("fraction_of_raw_min"), r.get("fraction_of_raw_max")
                ),
                spread_text(
                    r.get("fraction_of_raw_without_copy_median"),
                    r.get("fraction_of_raw_without_copy_min"),
                    r.get("fraction_of_raw_without_copy_max"),
                ),
            ]
        )
    out = table(
        [
            "MiB",
            "method",
            "seconds",
            "MiB/s (median)",
            "fraction of raw (per run)",
            "fraction of raw without the device-to-host copy",
        ],
        rows,
    )
    raw = s.get("config", {}).get("raw")
    if raw:
        out += ["", f"Raw: {raw}."]
    for r in sb:
        out += [
            "",
            f"`step_boundary()` with nothing pending: {fmt(r['microseconds_median'])} microseconds (median; worst "
            f"{fmt(r['microseconds_max'])}, n={fmt(r['runs'])}, "
            f"{fmt(r['calls_per_run'])} calls a run); `report_step()`: "
            f"{fmt(r.get('report_step_microseconds_median'))} microseconds.",
        ]
    return out + plot_line(plots, "flush")


def sec_detection(s: dict[str, Any], plots: dict[str, str]) -> list[str]:
    rows = [
        [
            r["kind"],
            fmt(r.get("runs")),
            fmt(r.get("detection_seconds_median")),
            spread_text(r.get("decision_seconds_median"), None, None, None, r.get("decision_seconds_p90")),
            fmt(r.get("decision_seconds_max")),
            (
                f"{fmt(r['sent_to_decision_seconds_median'])} [worst {fmt(r.get('sent_to_decision_seconds_max'))}]"
                if r.get("sent_to_decision_seconds_median") is not None
                else "–"
            ),
            fmt(r.get("errors")),
            fmt(r.get("via")) if r.get("available") else f"not available: {r.get('note', '')}",
        ]
        for r in s.get("results", [])
    ]
    header = ["kind", "runs", "detection s", "decision s (median, p90)", "worst s"]
    header += ["from sending s (median [worst])", "errors", "via"]
    notes = [
        "",
        'A Pub/Sub notice counts from when the coordinator\'s subscriber received it; "from sending" counts from '
        "the publish call, Pub/Sub's own delivery (here the emulator's) included. Rows without that column count "
        "from the fault or the notice's delivery.",
    ]
    return table(header, rows) + notes


def sec_footprint(s: dict[str, Any], plots: dict[str, str]) -> list[str]:
    rows = [
        [
            r["role"],
            fmt(r.get("runs")),
            spread_text(r.get("idle_cpu_pct_median"), None, r.get("idle_cpu_pct_max")),
            fmt(r.get("rss_mib_median")),
            fmt(r.get("uss_mib_median")),
            fmt(r.get("startup_seconds_median")),
        ]
        for r in s.get("results", [])
    ]
    out = table(["role", "runs", "idle CPU % (median, worst)", "RSS MiB", "USS MiB", "start-up s"], rows)
    summ = s.get("summary") or {}
    main, others = summ.get("coordinator_main_thread_cpu_pct"), summ.get("coordinator_other_threads_cpu_pct")
    if main is not None and others is not None:
        n = len(s.get("rounds") or [])
        out += [
            "",
            f"Coordinator idle CPU by thread (median of {n} rounds): main thread (Python: asyncio loop, "
            f"decisions, grpc.aio) {fmt(main)} %, all other threads (gRPC core) {fmt(others)} %.",
        ]
    return out


def sec_step_overhead(s: dict[str, Any], plots: dict[str, str]) -> list[str]:
    cfg = s.get("config") or {}
    rows = []
    for r in s.get("results", []):
        rows.append(
            [
                r.get("variant"),
                fmt(r.get("runs")),
                fmt(r.get("wall_step_seconds_median")),
                fmt(r.get("cpu_step_seconds_median")),
                fmt(r.get("overhead_fraction_median")) if r.get("variant") != "plain" else "–",
                ", ".join(fmt(x) for x in r.get("overhead_fraction_per_round") or []) or "–",
                fmt(r.get("cpu_overhead_fraction_median")) if r.get("variant") != "plain" else "–",
                ", ".join(fmt(x) for x in r.get("steal_fraction_per_run") or []),
                status(r),
            ]
        )
    if cfg.get("concurrent"):
        cores = ", ".join(str(c) for c in cfg.get("cores") or [])
        how = (
            f"{fmt(cfg.get('rounds'))} rounds of {fmt(cfg.get('steps'))} fault-free steps; in each round plain MaxText "
            f"and the other variant ran side by side, each pinned to one CPU ({cores}), then again with the CPUs "
            f"swapped, so a variant's figures in a round are the geometric mean of its two runs (`--concurrent`) "
            f"and a step is a step on one CPU; overheads leave out rounds in which a run saw more than "
            f"{fmt(cfg.get('steal_limit'))} of the CPUs' time as steal (see the method)."
        )
    else:
        how = (
            f"{fmt(cfg.get('rounds'))} rounds of {fmt(cfg.get('steps'))} fault-free steps per variant, back to back "
            f"in a rotating order; overheads are paired with the same round's plain run and leave out rounds in "
            f"which a run saw more than {fmt(cfg.get('steal_limit'))} of the CPUs' time as steal (see the method)."
        )
    out = [how, ""]
    out += table(
        [
            "variant",
            "runs",
            "wall s/step (median)",
            "CPU s/step (median)",
            "overhead (wall, median)",
            "per round",
            "overhead (CPU, median)",
            "steal per run",
            "status",
        ],
        rows,
    )
    side = next((r for r in s.get("results", []) if r.get("variant") == "sidecar"), None)
    if side and side.get("hook_seconds_per_step_median") is not None:
        out += [
            "",
            f"The hook's own figures (sidecar runs, median): snapshots cost "
            f"{fmt(side.get('snapshot_hook_overhead_fraction_median'))} of the step by its `auto` interval's "
            f"in-process measure (interval seen: {', '.join(side.get('snapshot_every_seen') or []) or '–'}); its own "
            f"bookkeeping at each step boundary {fmt(side.get('hook_seconds_per_step_median'))} s, "
            f"{fmt(side.get('hook_fraction_of_plain_step'))} of the plain step.",
        ]
    return out


SECTIONS: dict[str, tuple[str, Callable[[dict[str, Any], dict[str, str]], list[str]]]] = {
    "step_overhead": ("Step overhead: MaxText, paired rounds", sec_step_overhead),
    "recovery": ("Recovery: fault cost by strategy", sec_recovery),
    "detection": ("Detection: fault to the coordinator's decision", sec_detection),
    "scale": ("Scale: one coordinator, many workers", sec_scale),
    "flush": ("Flush: Orbax against raw write + fsync", sec_flush),
    "goodput": ("Goodput: work kept at a stated fault rate", sec_goodput),
    "footprint": ("Footprint: idle daemons", sec_footprint),
}


# ---------------------------------------------------------------------------
# plots (optional: matplotlib)
# ---------------------------------------------------------------------------


def plot_line(plots: dict[str, str], key: str) -> list[str]:
    return ["", f"![{key}]({plots[key]})"] if key in plots else []


def make_plots(secs: dict[str, dict[str, Any]], out: Path) -> dict[str, str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    made: dict[str, str] = {}
    gp = secs.get("goodput")
    gp_rows = [r for r in (gp or {}).get("results", []) if r.get("goodput") is not None]
    if gp_rows:
        groups = sorted({_goodput_group(r) for r in gp_rows})
        strategies = sorted({r["strategy"] for r in gp_rows})
        fig, ax = plt.subplots(figsize=(7, 3.8))
        width = 0.8 / len(strategies)
        for i, st in enumerate(strategies):
            vals = [
                next((r["goodput"] for r in gp_rows if _goodput_group(r) == g and r["strategy"] == st), 0.0)
                for g in groups
            ]
            ax.bar([x + i * width for x in range(len(groups))], vals, width, label=st)
        ticks = [g.replace(" trainer, checkpoint period ", "\nperiod ") for g in groups]
        ax.set_xticks([x + width * (len(strategies) - 1) / 2 for x in range(len(groups))], ticks, fontsize=8)
        ax.set_ylabel("goodput (fraction of wall time)")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(out / "goodput.png", dpi=110)
        plt.close(fig)
        made["goodput"] = "goodput.png"
    rec = secs.get("recovery")
    if rec:
        rows = [  # each trainer's own realistic point (separate runs per trainer have their own)
            r
            for r in rec.get("results", [])
            if is_valid(r)
            and r.get("checkpoint_period") == trainer_config(rec, r["trainer"]).get("realistic_checkpoint_period")
            and r.get("replacement_delay") == trainer_config(rec, r["trainer"]).get("realistic_delay")
            and r.get("fault_cost_seconds_median") is not None
        ]
        if rows:
            fig, ax = plt.subplots(figsize=(10, 5.5))
            labels = [
                f"{r['trainer']} {r['strategy']} {r['fault']}" + (" (local)" if r.get("fault_cost_method") else "")
                for r in rows
            ]
            med = [r["fault_cost_seconds_median"] for r in rows]
            lo = [m - (r.get("fault_cost_seconds_min") or m) for m, r in zip(med, rows, strict=True)]
            hi = [(r.get("fault_cost_seconds_max") or m) - m for m, r in zip(med, rows, strict=True)]
            ax.bar(range(len(rows)), med, yerr=[lo, hi], capsize=3)
            ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=60, ha="right")
            ax.set_ylabel("fault cost, s (median, min-max)")
            fig.tight_layout()
            fig.savefig(out / "recovery.png", dpi=110)
            plt.close(fig)
            made["recovery"] = "recovery.png"
    sc = secs.get("scale")
    if sc and sc.get("results"):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for valid, marker in ((True, "o"), (False, "x")):
            pts = [r for r in sc["results"] if is_valid(r) == valid and r.get("coordinator_cores") is not None]
            ax.plot(
                [r["workers"] for r in pts],
                [r["coordinator_cores"] for r in pts],
                marker,
                label="valid" if valid else "INVALID",
            )
        ax.set_xlabel("workers")
        ax.set_ylabel("coordinator cores")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "scale.png", dpi=110)
        plt.close(fig)
        made["scale"] = "scale.png"
    fl = secs.get("flush")
    rows = [r for r in (fl or {}).get("results", []) if r.get("fraction_of_raw_median") is not None]
    if rows:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar(range(len(rows)), [r["fraction_of_raw_median"] for r in rows])
        ax.set_xticks(range(len(rows)), [f"{r['size_mib']} MiB\n{r['method']}" for r in rows], fontsize=7)
        ax.set_ylabel("fraction of raw throughput")
        fig.tight_layout()
        fig.savefig(out / "flush.png", dpi=110)
        plt.close(fig)
        made["flush"] = "flush.png"
    return made


# ---------------------------------------------------------------------------
# the page
# ---------------------------------------------------------------------------


def render(data: dict[str, Any], plots: dict[str, str] | None = None, source: str = "benchmarks.json") -> str:
    secs = sections(data)
    plots = plots or {}
    # Every commit a figure comes from (combine() stores them, per-trainer recovery runs included).
    shas = data.get("git_shas") or sorted({s.get("git_sha") or "unknown" for s in secs.values()})
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `python -m bench.report` from `{source}`; do not edit by hand. Every figure below is read "
        "from that file; each section names the commit and machine it ran on and the command that ran it.",
        "",
        f"Commit{'s' if len(shas) > 1 else ''}: "
        + ", ".join(f"`{x}`" for x in shas)
        + (" (**some results come from a dirty tree**)" if any(s.get("dirty") for s in secs.values()) else ""),
        "",
    ]
    if "goodput" in secs:  # the page leads with what a user keeps of a run
        title, fn = SECTIONS["goodput"]
        lines += [f"## {title}", ""] + header(secs["goodput"]) + [""] + fn(secs["goodput"], plots) + [""]
    lines += ["## Targets", ""]
    vs = targets(secs)
    lines += table(
        ["target", "goal", "measured", "verdict", "basis"],
        [[v.target, v.goal, v.measured, f"**{v.verdict}**", v.basis] for v in vs],
    )
    top = topology_line(secs.get("scale"))
    if top:
        lines += ["", top]
    for name in ORDER:
        if name not in secs or name == "goodput":
            continue
        title, fn = SECTIONS[name]
        lines += ["", f"## {title}", ""] + header(secs[name]) + [""] + fn(secs[name], plots)
    missing = [n for n in ORDER if n not in secs]
    if missing:
        lines += ["", "Not in this file (not run): " + ", ".join(missing) + "."]
    return "\n".join(lines) + "\n"


def write(store: Path, out: Path, with_plots: bool = True) -> Path:
    data = json.loads(store.read_text())
    out.mkdir(parents=True, exist_ok=True)
    plots = make_plots(sections(data), out) if with_plots else {}
    md = out / "benchmarks.md"
    md.write_text(render(data, plots, source=store.name))
    return md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--json", type=Path, default=Path("docs/benchmarks.json"), help="the results (default docs/benchmarks.json)"
    )
    ap.add_argument("--out", type=Path, default=None, help="where benchmarks.md and plots go (default: beside --json)")
    ap.add_argument("--no-plots", action="store_true")
    ns = ap.parse_args(argv)
    md = write(ns.json, ns.out or ns.json.parent, not ns.no_plots)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
