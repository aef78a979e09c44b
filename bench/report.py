"""Render docs/benchmarks.md (and its plot) from docs/benchmarks.json alone.

``python -m bench.report [--json docs/benchmarks.json] [--out docs/] [--no-plots]``. Each section says
what it measures, the command that measures it now, and the commit, machine and time its rows came
from; a row's ``invalid_reason`` is printed beside it. The TPU host-link runs are read from
``host_link_tpu_v5e.json`` beside the JSON, when present. Run history lives in git.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ORDER = ("recovery", "detection", "scale", "footprint")
HOST_LINK = "host_link_tpu_v5e.json"


def sections(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The per-benchmark sections of a combined file, or a one-benchmark file as its only section."""
    if "benchmarks" in data:
        return {k: v for k, v in data["benchmarks"].items() if isinstance(v, dict)}
    return {data["name"]: data} if data.get("name") else {}


def fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return ", ".join(fmt(x) for x in v)
    return str(v)


def both(r: dict[str, Any], key: str, a: str = "median", b: str = "p90") -> str:
    """Two figures of a row in one cell: ``key_a, key_b``."""
    return f"{fmt(r.get(f'{key}_{a}'))}, {fmt(r.get(f'{key}_{b}'))}"


def table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    return out + ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]


def status(r: dict[str, Any]) -> str:
    if r.get("status") == "not_run":
        return str(r.get("invalid_reason") or "not run")
    if r.get("valid") is False or r.get("invalid_reason"):
        return "INVALID: " + str(r.get("invalid_reason") or "see the run")
    return "ok"


def run_line(s: dict[str, Any]) -> str:
    """Commit, start, duration and machine of one run."""
    m = s.get("machine") or {}
    dirty = " (dirty tree)" if s.get("dirty") else ""
    return (
        f"Measured at commit `{str(s.get('git_sha'))[:12]}`{dirty}, started {s.get('started_at') or '?'}, took "
        f"{fmt(s.get('duration_s'))} s; {fmt(m.get('cores'))} cores, {fmt(m.get('memory_gib'))} GiB, "
        f"{m.get('cpu_model') or '?'}."
    )


def sec_recovery(s: dict[str, Any]) -> list[str]:
    by = (s.get("config") or {}).get("by_trainer") or {}
    out: list[str] = []
    for t in sorted({str(r.get("trainer")) for r in s.get("results", [])}):
        mine = [r for r in s["results"] if r.get("trainer") == t]
        for p in sorted({r.get("checkpoint_period") for r in mine}, key=str):
            rows = [r for r in mine if r.get("checkpoint_period") == p]
            src = {**s, **(by.get(f"{t} (period {p})") or by.get(t) or {})}
            out += [f"**{t}**, checkpoint period {p} ({fmt(rows[0].get('params'))} parameters). {run_line(src)}", ""]
            phased = any(r.get("phase_seconds_median") for r in rows)  # older results have no phases
            head = ["strategy", *(["fault"] if phased else []), "runs", "lost steps (median, max)"]
            head += ["recovery s (median, p90)", "fault cost s (median, p90)"]
            out += table(
                head + [*(["phases s (median)"] if phased else []), "hook s/step", "status"],
                [
                    [r["strategy"], *([r.get("fault", "kill")] if phased else []), r.get("runs")]
                    + [both(r, "lost_steps", b="max"), both(r, "recovery_seconds"), both(r, "fault_cost_seconds")]
                    + (
                        [", ".join(f"{k} {fmt(v)}" for k, v in (r.get("phase_seconds_median") or {}).items())]
                        if phased
                        else []
                    )
                    + [r.get("hook_seconds_per_step_median"), status(r)]
                    for r in rows
                ],
            ) + [""]
    return out


def sec_detection(s: dict[str, Any]) -> list[str]:
    head = ["kind", "runs", "detection s", "decision s (median, p90, worst)", "errors", "via"]
    rows = [
        [r["kind"], r.get("runs"), r.get("detection_seconds_median")]
        + [", ".join(fmt(r.get(f"decision_seconds_{k}")) for k in ("median", "p90", "max")), r.get("errors")]
        + [r.get("via") if r.get("available", True) else r.get("note")]
        for r in s.get("results", [])
    ]
    return [run_line(s), ""] + table(head, rows)


def sec_scale(s: dict[str, Any]) -> list[str]:
    rows = s.get("results", [])
    runs = {json.dumps(r.get("run"), sort_keys=True): r["run"] for r in rows if isinstance(r.get("run"), dict)}
    out = [f"- {run_line({**s, **run})}" for run in runs.values()] or [run_line(s)]
    holds = [r for r in rows if r.get("scenario") != "coordinator_restart"]
    head = ["workers", "scenario", "heartbeat / timeout s", "coordinator cores", "RSS MiB", "hold fan-out p99 s"]
    out += [""] + table(
        head + ["delivered", "runs", "status"],
        [
            [_workers(r), r.get("scenario") or "hold_cycles"]
            + [f"{fmt(r.get('heartbeat_interval'))} / {fmt(r.get('heartbeat_timeout'))}", r.get("coordinator_cores")]
            + [r.get("coordinator_rss_mib") or r.get("coordinator_rss_mib_at_collapse"), r.get("fanout_p99_seconds")]
            + [r.get("delivered_fraction"), r.get("runs"), status(r)]
            for r in holds
        ],
    )
    restarts = [r for r in rows if r.get("scenario") == "coordinator_restart"]
    if restarts:
        out += ["", "Coordinator restart (SIGKILL under load, started again on the same ports):", ""]
        out += table(
            ["workers", "hosts lost", "restart to serving s", "all back s (worst run)", "runs", "status"],
            [
                [_workers(r), r.get("hosts_lost"), r.get("restart_to_serving_seconds"), r.get("all_back_seconds")]
                + [r.get("runs"), status(r)]
                for r in restarts
            ],
        )
    return out


def _workers(r: dict[str, Any]) -> str:
    n = r.get("streams_per_connection") or 1
    return f"{r['workers']}" + (f" ({n} streams a connection)" if n > 1 else "")


def sec_footprint(s: dict[str, Any]) -> list[str]:
    head = ["role", "runs", "idle CPU % (median, worst)", "RSS MiB", "USS MiB", "start-up s"]
    rows = [
        [r["role"], r.get("runs"), both(r, "idle_cpu_pct", b="max"), r.get("rss_mib_median")]
        + [r.get("uss_mib_median"), r.get("startup_seconds_median")]
        for r in s.get("results", [])
    ]
    return [run_line(s), ""] + table(head, rows)


def sec_host_link(hl: dict[str, Any]) -> list[str]:
    out = [
        f"On one borrowed TPU v5e chip (a gVisor sandbox, so a floor); every run is in [{HOST_LINK}]({HOST_LINK}).",
        "",
    ]
    good = [r for r in hl.get("runs", []) if status(r) == "ok"]
    if len(good) < len(hl.get("runs", [])):
        left_out = len(hl["runs"]) - len(good)
        out += [f"{left_out} runs marked invalid in that file are left out here (each says why there).", ""]
    rows = []
    for run in good:
        cfg, alone = run.get("config") or {}, run.get("copy") or {}
        if cfg.get("beside") == "compile":
            what, rate = f"compile, {cfg.get('compile_layers')}-layer step", None
        else:
            what, rate = f"copy {cfg.get('state_gib')} GiB, {cfg.get('via')}", alone.get("gb_per_s_median")
        for r in run.get("results") or [{}]:
            rows.append(
                [str(run.get("git_sha"))[:7], what, alone.get("seconds_median"), rate, r.get("step_kind")]
                + [r.get("step_seconds"), r.get("runs"), r.get("slowdown_seconds_median")]
                + [r.get("slowdown_over_copy_median")]
            )
    head = ["commit", "beside the steps", "its s alone", "copy GB/s", "step", "step s", "pairs", "slowdown s"]
    return out + table(head + ["slowdown / its s"], rows)


def refresh_line(secs: dict[str, Any]) -> str:
    """What the last runs of the sections took, from their own ``duration_s``."""
    took = {n: secs[n].get("duration_s") for n in ORDER if n in secs and secs[n].get("duration_s") is not None}
    parts = ", ".join(f"{n} {round(t)} s" for n, t in took.items())
    return (
        f"A full refresh (`python -m bench all`) runs every section below; their last runs took "
        f"{round(sum(took.values()) / 60)} min together ({parts})."
    )


_MERGE = "--require-clean --merge-into docs/benchmarks.json"
SECTIONS: dict[str, tuple[str, Any, str]] = {
    "recovery": (
        "Recovery phases on the real MaxText",
        sec_recovery,
        "One fault on the real MaxText (4 slices of 2 CPU devices): `kill` (a slice lost mid-step) under each "
        "strategy, and the sidecar's `notice` (a maintenance notice, drained at a step boundary). Lost steps are "
        "completed steps run again, recovery the fault to the first new step, fault cost the time beyond the "
        "run's own step time over a window past the fault ([recovery.md](recovery.md)).",
    ),
    "detection": (
        "Detection: fault to the coordinator's decision",
        sec_detection,
        "A coordinator with its journal on, four hosts and a fake trainer, so every loss ends in a hold. "
        "Detection is the journal's first record at or after the fault in which the slice is no longer up, the "
        "decision the first with a `HoldTrainer`; the host is then replaced (or serves again) before the next fault. `kill` is a "
        "SIGKILL of the host's processes, `hang` a SIGSTOP, `not_serving` its stand-in Pathways worker turning "
        "NOT_SERVING; the notices come from the host's stand-in metadata server and a Pub/Sub emulator, and count "
        "from their delivery to the daemon (a Pub/Sub one from its receipt).",
    ),
    "scale": (
        "Scale: one coordinator, many workers",
        sec_scale,
        "The coordinator on a core of its own; load generators of up to 2,500 stand-in hosts each (a channel and a "
        "`Join` stream a host, heartbeats by datagram) register every host at once, as after a job restart. "
        "`hold_cycles`: a host leaves and comes back, three cycles a run; a host's fan-out is its first copy of the "
        "command (a datagram's kernel receive time) less the decision's time in the coordinator's log, and a row "
        "keeps the worst cycle's p99. `coordinator_restart`: SIGKILL under load, started again on the same ports, "
        "until its `workers_connected` counts every host. A run is valid only if every hold and resume reached "
        "every live host, every host's datagrams were confirmed, the kernel dropped none on the coordinator's "
        "socket and no host was lost; a row only if every run was. One process standing in for 2,500 hosts "
        "sends their heartbeats from a clock process of its own and registers them only while its event loop "
        "keeps time (bench/scale_loadgen.py).",
    ),
    "footprint": (
        "Footprint: idle daemons",
        sec_footprint,
        "A coordinator, four worker sidecars and a fake trainer, the job running and nothing happening: each "
        "process's CPU and memory over an idle window. Start-up: the coordinator's until its health check serves, "
        "a worker's until it has registered.",
    ),
}
"""Each section's title, renderer and what it measures."""
COMMANDS = {
    "recovery": (
        f"python -m bench recovery --maxtext-model tiny {_MERGE}",
        "make bench-recovery",
        " The ten-times-larger model's rows: `--maxtext-model larger` (`make bench-recovery MAXTEXT_MODEL=larger`).",
    ),
    "detection": (f"python -m bench detection {_MERGE}", "make bench-detection", ""),
    "scale": (
        f"python -m bench scale --sizes 10000,25000 --scenarios hold_cycles,coordinator_restart --repeats 3 {_MERGE}",
        "make bench-scale",
        "",
    ),
    "footprint": (f"python -m bench footprint {_MERGE}", "make bench-footprint", ""),
}
"""The command that measures each section now: the page shows it, whatever command its rows came from."""


def make_plots(secs: dict[str, dict[str, Any]], out: Path) -> dict[str, str]:
    """recovery.png: fault cost by strategy and model."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    rows = [r for r in secs.get("recovery", {}).get("results", []) if r.get("fault_cost_seconds_median") is not None]
    if not rows:
        return {}
    fig, ax = plt.subplots(figsize=(8, 4))
    med = [r["fault_cost_seconds_median"] for r in rows]
    lo = [m - (r.get("fault_cost_seconds_min") or m) for m, r in zip(med, rows, strict=True)]
    hi = [(r.get("fault_cost_seconds_max") or m) - m for m, r in zip(med, rows, strict=True)]
    ax.bar(range(len(rows)), med, yerr=[lo, hi], capsize=3)
    labels = [f"{r['trainer']} {r['strategy']} p{r.get('checkpoint_period')}" for r in rows]
    ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=60, ha="right")
    ax.set_ylabel("fault cost, s (median, min-max)")
    fig.tight_layout()
    fig.savefig(out / "recovery.png", dpi=110)
    plt.close(fig)
    return {"recovery": "recovery.png"}


def render(
    data: dict[str, Any],
    plots: dict[str, str] | None = None,
    source: str = "benchmarks.json",
    host_link: dict[str, Any] | None = None,
) -> str:
    secs, plots = sections(data), plots or {}
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `python -m bench.report` from `{source}`; do not edit by hand. These are the measured "
        "inputs of `elastic-sidecar plan` ([plan.md](plan.md)); run each on a quiet machine, committed tree.",
        "",
        refresh_line(secs),
    ]
    for name in [n for n in ORDER if n in secs]:
        title, body, about = SECTIONS[name]
        lines += ["", f"## {title}", "", "Run: `{}` (`{}`).{}".format(*COMMANDS[name]), "", about, ""]
        lines += body(secs[name]) + (["", f"![{name}]({plots[name]})"] if name in plots else [])
    if host_link:
        lines += [
            "",
            "## On the TPU chip: a snapshot's copy, and a compile, beside the steps",
            "",
            "Run: `python -m bench.host_link --state-gib 0.5 --runs 5 --json PATH` on the chip; `--beside compile "
            "--compile-layers 160` for a program compiled beside the steps (the MaxText prepare).",
            "",
        ] + sec_host_link(host_link)
    return "\n".join(lines) + "\n"


def write(store: Path, out: Path, with_plots: bool = True) -> Path:
    data = json.loads(store.read_text())
    out.mkdir(parents=True, exist_ok=True)
    plots = make_plots(sections(data), out) if with_plots else {}
    hl_path = store.parent / HOST_LINK
    hl = json.loads(hl_path.read_text()) if hl_path.exists() else None
    page = out / "benchmarks.md"
    page.write_text(render(data, plots, store.name, hl))
    return page


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    ap.add_argument("--json", type=Path, default=Path("docs/benchmarks.json"))
    ap.add_argument("--out", type=Path, default=None, help="directory for benchmarks.md (default: the JSON's)")
    ap.add_argument("--no-plots", action="store_true")
    ns = ap.parse_args(argv)
    if not ns.json.is_file():
        print(f"python -m bench.report: --json {ns.json}: no such file", file=sys.stderr)
        return 2
    try:
        page = write(ns.json, ns.out or ns.json.parent, with_plots=not ns.no_plots)
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        print(f"python -m bench.report: --json {ns.json}: not a benchmarks file ({e})", file=sys.stderr)
        return 2
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
