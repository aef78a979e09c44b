"""docs/benchmarks.md (and its plots) from the stored results.

Every run merges its results into ``docs/benchmarks.json`` (one entry per
benchmark, the newest wins) and renders the whole page again from it, so
running one benchmark keeps the others' figures.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

ORDER = ["recovery", "detection", "scale", "flush", "footprint"]


def _fmt(v: Any, unit: str = "", nd: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if abs(v) >= 100:
            s = f"{v:.0f}"
        elif abs(v) >= 10:
            s = f"{v:.1f}"
        else:
            s = f"{v:.{nd}g}"
        return f"{s}{(' ' + unit) if unit else ''}"
    return f"{v}{(' ' + unit) if unit else ''}"


def _met(m: bool | None) -> str:
    return {True: "**met**", False: "**missed**", None: "not measured"}[m]


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return out


def load(store: Path) -> dict[str, Any]:
    if store.exists():
        try:
            return json.loads(store.read_text())
        except json.JSONDecodeError:
            return {}
    return {}


def update(docs: Path, results: list[dict[str, Any]]) -> Path:
    docs.mkdir(parents=True, exist_ok=True)
    store = docs / "benchmarks.json"
    data = load(store)
    for r in results:
        data[r["name"]] = r
    store.write_text(json.dumps(data, indent=1, default=str) + "\n")
    plots = make_plots(docs, data)
    md = render(data, plots)
    path = docs / "benchmarks.md"
    path.write_text(md)
    return path


# ---------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------


def make_plots(docs: Path, data: dict[str, Any]) -> dict[str, str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    made: dict[str, str] = {}

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(docs / name, dpi=110)
        plt.close(fig)
        made[name.removesuffix(".png")] = name

    rec = data.get("recovery")
    if rec and "table" in rec:
        names = list(rec["table"])
        delays = list(next(iter(rec["table"].values())))
        fig, ax = plt.subplots(figsize=(7.5, 4))
        width = 0.8 / max(1, len(names))
        for i, s in enumerate(names):
            vals = [(rec["table"][s].get(d) or {}).get("recovery_s") or 0 for d in delays]
            xs = [j + i * width for j in range(len(delays))]
            ax.bar(xs, vals, width, label=rec["strategies"].get(s, s))
            for x, v in zip(xs, vals, strict=True):
                ax.text(x, v, f"{v:.2g}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(delays))])
        ax.set_xticklabels([f"provisioning delay {d} s" for d in delays])
        ax.set_yscale("log")
        ax.set_ylabel("recovery (s, log scale)")
        ax.set_title("Fault until progress regained (median)")
        ax.legend(fontsize=7)
        save(fig, "recovery.png")
        if rec.get("timelines"):
            fig, ax = plt.subplots(figsize=(7.5, 4))
            for s, pts in rec["timelines"].items():
                if pts:
                    ax.plot(
                        [p[0] for p in pts],
                        [p[1] for p in pts],
                        label=rec["strategies"].get(s, s),
                        lw=1.2,
                        drawstyle="steps-post",
                    )
            ax.axvline(0, color="k", lw=0.8, ls="--")
            ax.set_xlabel("seconds since the fault")
            ax.set_ylabel("last completed step")
            ax.set_title(f"Training progress around the fault (provisioning delay {rec['ratios']['delay_s']:g} s)")
            ax.legend(fontsize=7)
            save(fig, "recovery-timeline.png")

    det = data.get("detection")
    if det and "by_kind" in det:
        kinds = [k for k, v in det["by_kind"].items() if v.get("available") and v.get("decision_s") is not None]
        if kinds:
            fig, ax = plt.subplots(figsize=(6.5, 3.5))
            vals = [det["by_kind"][k]["decision_s"] for k in kinds]
            worst = [det["by_kind"][k]["decision_s_max"] for k in kinds]
            ax.bar(kinds, vals, label="median")
            ax.scatter(kinds, worst, color="k", marker="_", s=300, label="worst", zorder=3)
            for i, v in enumerate(vals):
                ax.text(i, v, f"{v * 1000:.0f} ms", ha="center", va="bottom", fontsize=8)
            ax.set_ylabel("fault to hold decision (s)")
            ax.set_title("Detection latency by fault kind")
            ax.legend(fontsize=8)
            save(fig, "detection.png")

    sc = data.get("scale")
    if sc and sc.get("sizes"):
        ok = [r for r in sc["sizes"] if "error" not in r]
        if ok:
            fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
            n = [r["workers"] for r in ok]
            a1.plot(n, [r["cpu_cores"] for r in ok], "o-", label="coordinator, all threads")
            if all("cpu_cores_main_thread" in r for r in ok):
                a1.plot(n, [r["cpu_cores_main_thread"] for r in ok], "s--", label="asyncio (Python) thread")
                a1.plot(n, [r["cpu_cores_other_threads"] for r in ok], "^--", label="gRPC core threads")
            wi = [x for x in sc.get("what_if") or [] if "error" not in x]
            if wi:
                a1.plot(
                    [x["workers"] for x in wi],
                    [x["cpu_cores"] for x in wi],
                    "D",
                    color="k",
                    label="what-if: keepalive 5 s, memoized up_slices",
                )
                a2.plot(
                    [x["workers"] for x in wi],
                    [x["hold_fanout"]["p99_s"] for x in wi],
                    "D",
                    color="k",
                    label="what-if p99",
                )
            a1.axhline(0.5, color="r", lw=0.8, ls=":", label="target 0.5 core")
            a1.set_xlabel("worker sidecars (1 Hz heartbeats)")
            a1.set_ylabel("cores")
            a1.set_title("Coordinator CPU at steady state")
            a1.legend(fontsize=7)
            a2.plot(n, [r["hold_fanout"]["p50_s"] for r in ok], "o-", label="hold fan-out p50")
            a2.plot(n, [r["hold_fanout"]["p99_s"] for r in ok], "s-", label="hold fan-out p99")
            a2.axhline(1.0, color="r", lw=0.8, ls=":", label="target p99 1 s")
            a2.set_xlabel("worker sidecars")
            a2.set_ylabel("seconds after the decision")
            a2.set_title("Hold broadcast")
            a2.legend(fontsize=7)
            save(fig, "scale.png")

    fl = data.get("flush")
    if fl and fl.get("sizes"):
        rows = fl["sizes"]
        fig, ax = plt.subplots(figsize=(6.5, 3.5))
        labels = [f"{r['size_mib']} MiB" for r in rows]
        w = 0.27
        for i, (key, lab) in enumerate(
            [
                ("raw_mib_per_s", "raw write + fsync"),
                ("orbax_mib_per_s", "Orbax flush (default, zstd)"),
                ("orbax_nocompression_mib_per_s", "Orbax flush, no compression"),
            ]
        ):
            ax.bar([j + i * w for j in range(len(rows))], [r[key] for r in rows], w, label=lab)
        ax.set_xticks([j + w for j in range(len(rows))])
        ax.set_xticklabels(labels)
        ax.set_ylabel("MiB/s")
        ax.set_title("Emergency flush throughput")
        ax.legend(fontsize=7)
        save(fig, "flush.png")

    fp = data.get("footprint")
    if fp and fp.get("summary"):
        s = fp["summary"]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2))
        roles = ["coordinator", "worker"]
        a1.bar(roles, [s[f"{r}_cpu_pct"] or 0 for r in roles])
        a1.axhline(1.0, color="r", lw=0.8, ls=":", label="target 1%")
        a1.set_ylabel("% of a core")
        a1.set_title("Idle CPU")
        a1.legend(fontsize=7)
        a2.bar(roles, [s[f"{r}_rss_mib"] or 0 for r in roles])
        a2.axhline(100, color="r", lw=0.8, ls=":", label="target 100 MiB")
        a2.set_ylabel("MiB")
        a2.set_title("RSS")
        a2.legend(fontsize=7)
        save(fig, "footprint.png")
    return made


# ---------------------------------------------------------------------------
# the page
# ---------------------------------------------------------------------------


def render(data: dict[str, Any], plots: dict[str, str]) -> str:
    L: list[str] = []
    L += [
        "# Benchmarks",
        "",
        "Generated by `python -m bench` (see `bench/`); do not edit by hand. Each section says how it was",
        "measured; every figure is from the run named in its header, on the machine described there.",
        "",
        "```sh",
        ".venv/bin/python -m bench all                 # everything (about 25 min on 2 cores)",
        ".venv/bin/python -m bench recovery --quick    # one benchmark, smoke-sized (what CI runs)",
        ".venv/bin/python -m bench scale --json out.json",
        "```",
        "",
        "Names: `recovery`, `detection`, `scale`, `flush`, `footprint`, `all`. `--quick` runs a small, single-run",
        "version (its figures are not representative); `--json PATH` writes the results as JSON; results are",
        "also merged into `docs/benchmarks.json`, from which this page and its plots are drawn.",
        "",
    ]
    envs = {n: data[n].get("environment") for n in ORDER if n in data and data[n].get("environment")}
    if envs:
        e = next(iter(envs.values()))
        L += [
            f"Machine: {e.get('cpus')} CPUs, {e.get('memory_gib')} GiB, Linux {e.get('kernel')}, Python "
            f"{e.get('python')}; grpcio {e.get('grpc')}, jax {e.get('jax')}, orbax-checkpoint "
            f"{e.get('orbax.checkpoint')}, pathwaysutils {e.get('pathwaysutils')}, psutil {e.get('psutil')}, "
            f"matplotlib {e.get('matplotlib')}. Only loopback networking: every process runs on the same cores.",
            "",
        ]
    L += ["## Targets", ""]
    rows = []
    for n in ORDER:
        r = data.get(n)
        if not r:
            rows.append([n, "–", "–", "not run yet", ""])
            continue
        if r.get("error"):
            rows.append([n, "–", "–", "**failed**", r["error"][:120]])
            continue
        for t in r.get("targets", []):
            mode = " (quick run)" if r.get("quick") else ""
            rows.append(
                [
                    n,
                    t["name"],
                    t["target"],
                    f"{_fmt(t['measured'], t['unit'])} – {_met(t['met'])}",
                    (t.get("note") or "") + mode,
                ]
            )
    L += _table(["benchmark", "what", "target", "measured", "note"], rows)
    L.append("")
    for n in ORDER:
        r = data.get(n)
        if not r:
            continue
        L += SECTIONS[n](r, plots) if not r.get("error") else [f"## {n}", "", f"Failed: {r['error']}", ""]
    return "\n".join(L) + "\n"


def _header(r: dict[str, Any], title: str) -> list[str]:
    when = r.get("finished_at") or "?"
    mode = "quick (smoke-sized, one run: not representative)" if r.get("quick") else "full"
    la = r.get("load_average")
    load = (
        f" Load average at its end (1/5/15 min): {'/'.join(f'{x:g}' for x in la)} on 2 cores"
        " (other developers' test runs shared the machine)."
        if la
        else ""
    )
    return [f"## {title}", "", f"Run: {when}, {mode}, {r.get('duration_s', '?')} s.{load}", ""]


def _doc(module: str) -> list[str]:
    import importlib
    import re

    text = importlib.import_module(module).__doc__ or ""
    text = re.sub(r":(?:class|mod|func|meth|data|attr):`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    doc = text.strip().split("\n")
    return ["### Method", "", *doc[1:], ""] if len(doc) > 1 else []


def _plot(plots: dict[str, str], key: str, alt: str) -> list[str]:
    return [f"![{alt}]({plots[key]})", ""] if key in plots else []


def sec_recovery(r: dict[str, Any], plots: dict[str, str]) -> list[str]:
    L = _header(r, "Recovery: full restart vs checkpoint rewind vs elastic-sidecar")
    c = r["config"]
    L += _doc("bench.recovery")
    L += [
        f"Job: {c['slices']} slices x {c['devices_per_slice']} CPU devices, {c['step_seconds']} s steps, periodic "
        f"checkpoint every {c['checkpoint_period']} steps, one SIGKILL of host {c['fault_slice']}.0 at step "
        f"{c['fault_step']} (mid-period), `elastic_min_slice_count` {c['min_slices']} for (b) and (c), "
        f"provisioning delays {', '.join(f'{d:g}' for d in c['delays'])} s, {c['repeats']} run(s) each ("
        f"{min(c['repeats'], c.get('long_delay_repeats', c['repeats']))} at delays of 30 s and more; medians), strategies "
        "interleaved; the notice runs only at the realistic delay (a notice does not depend on it).",
        "",
        f"**Realistic delay: {c['realistic_delay']:g} s**"
        + (" (quick run: the one short delay stands in for it)." if r.get("quick") else ".")
        + " Replacing a TPU slice means a new node pool's VMs, "
        "scheduling and image pulls: minutes in practice (a JobSet restart at 1,000+ nodes takes several minutes, "
        "FACTS section 1). 60 s is a floor, so the full-restart ratio below is conservative. The ratios are "
        "recovery seconds of (a) and (b) over (c), medians from this one run.",
        "",
    ]
    rows = []
    for s, by in r["table"].items():
        for d, row in by.items():
            gp = row["goodput"]
            rows.append(
                [
                    r["strategies"].get(s, s),
                    f"{d} s",
                    _fmt(row["recovery_s"], "s"),
                    ", ".join(_fmt(x) for x in row["recovery_s_all"]),
                    _fmt(row["lost_steps"]),
                    _fmt(row["fault_cost_s"], "s"),
                    " / ".join(f"{float(v) * 100:.2f}%" if v is not None else "–" for v in gp.values()),
                ]
            )
    every = " / ".join(f"{float(n):g} s" for n in c["fault_every_s"])
    L += _table(
        [
            "strategy",
            "delay",
            "recovery (median)",
            "runs",
            "lost steps",
            "fault cost",
            f"goodput, a fault every {every}",
        ],
        rows,
    )
    L.append("")
    ra = r["ratios"]
    L += [
        f"Ratios at {ra['delay_s']:g} s: full restart / elastic-sidecar = **{_fmt(ra['full_restart'])}x**, "
        f"checkpoint rewind / elastic-sidecar = **{_fmt(ra['checkpoint_rewind'])}x**. At every delay: "
        + "; ".join(
            f"{d} s: {_fmt(v['full_restart'])}x / {_fmt(v['checkpoint_rewind'])}x" for d, v in ra["per_delay"].items()
        )
        + ".",
        "",
    ]
    L += ["Where the time went (medians, realistic delay):", ""]
    rk = f"{c['realistic_delay']:g}"
    prow = []
    for s, by in r["table"].items():
        ph = by.get(rk, {}).get("phases", {})
        prow.append([r["strategies"].get(s, s), ", ".join(f"{k} {_fmt(v)}" for k, v in ph.items())])
    L += _table(["strategy", "phases (s)"], prow)
    L.append("")
    L += _plot(plots, "recovery", "recovery seconds by strategy and delay")
    L += _plot(plots, "recovery-timeline", "progress around the fault")
    L += ["### Limits", ""]
    L += [
        "- The simulated job's costs are small: a process start with imports is about a second here and the "
        "trainer compiles in a fraction of one, where a real MaxText start takes minutes (FACTS section 9: 14 s "
        "to the first step for a tiny model on CPU). Full restart and rewind are therefore *under*-stated.",
        f"- Checkpoint rewind loses about half a checkpoint period ({c['checkpoint_period']} steps x "
        f"{c['step_seconds']} s here); MaxText's default `checkpoint_period` is 10,000 steps, so its real loss is "
        "far larger. Its recovery also depends on how soon the trainer touches a lost device.",
        "- With `elastic_min_slice_count` 2, both (b) and (c) continue on the survivors, so their recovery does not "
        "depend on the provisioning delay; (b) pays a second rewind when it grows back (its monitor polls every "
        f"{c['poll_interval']:g} s), (c) a short hold. The goodput column counts a step on k of n slices as k/n "
        "of a step, so time on fewer slices is a cost for both.",
        "- (c)'s recovery is dominated by compiling the step for the new mesh and running it (see phases); the "
        "coordination itself (detection + hold) takes milliseconds.",
        "- goodput(N) = 1 - fault cost / N assumes faults further apart than one disruption (delay + recovery).",
    ]
    L.append(
        "- The smallest delay is 1 s, not 0: with an instant replacement the demo trainer (simjob/trainer.py "
        "`_apply`) can copy state from a replica on the replaced slice, which the simulator still marks lost, and "
        "dies of an uncaught DATA_LOSS (seen in 1 of 1 runs at 0 s)."
    )
    rw = (r["table"].get("checkpoint_rewind", {}).get(rk) or {}).get("phases", {})
    if rw.get("scale_up_after_fault_s") is not None:
        L.append(
            f"- (b) grew back {rw['scale_up_after_fault_s']:.1f} s after the fault at the {c['realistic_delay']:g} s "
            f"delay: the manager's monitor thread probes inactive slices every {c['poll_interval']:g} s, and the "
            "scale-up re-runs training from the last checkpoint again."
        )
    notice = r["table"].get("elastic_sidecar_notice")
    if notice is None:
        L.append("- Proactive (notice) runs: not yet available when this ran (no `notice` fault kind in the demo).")
    else:
        L.append(
            "- Notice runs are measured from the notice's delivery (the host dies at the demo's "
            "`--notice-deadline` afterwards); baselines do not listen to notices, so for them a notice is the "
            "same as the kill."
        )
    fails = [x for x in r.get("runs", []) if x.get("error")]
    if fails:
        L.append(
            f"- {len(fails)} run(s) failed: "
            + "; ".join(f"{x['strategy']} {x['delay_s']:g}s: {x['error']}" for x in fails)
        )
    L.append("")
    return L


def sec_detection(r: dict[str, Any], plots: dict[str, str]) -> list[str]:
    L = _header(r, "Detection: fault to the coordinator's decision")
    L += _doc("bench.detection")
    rows = []
    for k, v in r["by_kind"].items():
        if not v.get("available"):
            rows.append([k, "–", "–", "–", v.get("note", "not yet available")])
        else:
            rows.append(
                [
                    k,
                    _fmt(v["detection_s"], "s"),
                    _fmt(v["decision_s"], "s"),
                    _fmt(v["decision_s_max"], "s"),
                    f"{v['samples']} runs via {', '.join(v['via'])}"
                    + (f"; {v['errors']} without a decision" if v["errors"] else ""),
                ]
            )
    L += _table(["kind", "detection (median)", "hold decision (median)", "worst", "how"], rows)
    L.append("")
    L += _plot(plots, "detection", "detection latency by kind")
    L += [
        "### Limits",
        "",
        "- A killed host closes its gRPC stream: the coordinator hears it at once. A hung host (SIGSTOP) sends "
        "nothing and keeps its socket, so the heartbeat deadline (1.2 s: heartbeat 0.25 s, timeout 1.2 s) "
        "bounds it; the transport keepalive (0.5 s + 1 s timeout) is the backstop.",
        "- NOT_SERVING travels as a health report on the worker's stream; it is as fast as a kill.",
        "- Notices are measured from delivery: the metadata stand-in's change, or the publish to the Pub/Sub "
        "emulator (which includes the emulator's delivery, an upper bound of after-delivery).",
        "",
    ]
    return L


def sec_scale(r: dict[str, Any], plots: dict[str, str]) -> list[str]:
    L = _header(r, "Scale: one coordinator, thousands of workers")
    L += _doc("bench.scale")
    rows = []
    for x in r["sizes"]:
        if "error" in x:
            rows.append([x["workers"], "**failed**", x["error"][:160], "", "", "", "", ""])
            continue
        rows.append(
            [
                x["workers"],
                _fmt(x["registration_s"], "s"),
                _fmt(x["cpu_cores"]),
                f"{_fmt(x.get('cpu_cores_main_thread'))} / {_fmt(x.get('cpu_cores_other_threads'))}",
                _fmt(x["rss_mib"], "MiB"),
                _fmt(x["hold_fanout"]["p50_s"], "s"),
                _fmt(x["hold_fanout"]["p99_s"], "s"),
                _fmt(x.get("generators_cpu_cores")),
            ]
        )
    L += _table(
        [
            "workers",
            "registration",
            "coordinator cores",
            "Python / gRPC-core threads",
            "RSS",
            "hold fan-out p50",
            "p99",
            "load generators' cores",
        ],
        rows,
    )
    L.append("")
    wi = [x for x in r.get("what_if") or [] if isinstance(x, dict)]
    if wi:
        env = r.get("what_if_env", {})
        L += [
            f"What-if: the same run with the coordinator started through "
            f"`bench/coordinator_variant.py`, keepalive every {int(env.get('BENCH_KEEPALIVE_MS', 0)) / 1000:g} s "
            "on both sides, and `State.up_slices()` memoized per state "
            f"(BENCH_MEMO_UP_SLICES={env.get('BENCH_MEMO_UP_SLICES', '?')}). The shipped code has since adopted "
            "both (a 5 s peer keepalive in `agent/constants.py`, `up_slices()` cached per state), so the two "
            "rows should now agree; a gap would point at a regression:",
            "",
        ]
        wrows = []
        for x in wi:
            base = next((b for b in r["sizes"] if b.get("workers") == x.get("workers") and "error" not in b), None)
            if "error" in x:
                wrows.append([x.get("workers"), "**failed**", x["error"][:160], "", "", ""])
                continue
            wrows.append(
                [
                    x["workers"],
                    f"{_fmt(x['cpu_cores'])} (shipped: {_fmt(base['cpu_cores']) if base else '–'})",
                    f"{_fmt(x.get('cpu_cores_main_thread'))} / {_fmt(x.get('cpu_cores_other_threads'))}",
                    f"{_fmt(x['registration_s'], 's')} (shipped: {_fmt(base['registration_s'], 's') if base else '–'})",
                    _fmt(x["hold_fanout"]["p50_s"], "s"),
                    _fmt(x["hold_fanout"]["p99_s"], "s"),
                ]
            )
        L += _table(
            ["workers", "coordinator cores", "Python / gRPC-core threads", "registration", "hold p50", "hold p99"],
            wrows,
        )
        L.append("")
    L += _plot(plots, "scale", "coordinator CPU and hold fan-out vs workers")
    ok = [x for x in r["sizes"] if "error" not in x]
    L += ["### Limits", ""]
    if len(ok) >= 2:
        a, b = ok[0], ok[-1]
        per = (b["cpu_cores"] - a["cpu_cores"]) / (b["workers"] - a["workers"])
        est = a["cpu_cores"] + per * (10000 - a["workers"])
        L.append(
            f"- CPU grows about linearly: {per * 1000:.3f} cores per 1,000 workers between {a['workers']} and "
            f"{b['workers']}; a straight line gives about {est:.2f} cores at 10,000 (an extrapolation, not a "
            "measurement)."
        )
    L += [
        "- Most of it is not Python: the gRPC core threads carry the transport keepalive, which the daemons set to "
        "a ping every 0.5 s in *both* directions (agent/constants.py `GRPC_KEEPALIVE_OPTIONS` on the worker and "
        "`GRPC_SERVER_KEEPALIVE_OPTIONS` on the coordinator): four HTTP/2 frames per worker per half second, eight "
        "times the 1 Hz heartbeat traffic. At 10,000 workers a 0.5 s keepalive is unaffordable; the heartbeat "
        "deadline already detects a hung worker.",
        "- In the Python thread, the decision core re-evaluates `State.up_slices()` on every 50 ms tick, which "
        "walks every host (O(N) x 20/s), and each registration copies the host map (O(N), so registering N "
        "workers is O(N^2): the registration column).",
        "- On this 2-core machine the load generators (N heartbeats/s and their own keepalive pings) compete with "
        "the coordinator for the same cores, which inflates the fan-out latencies; on a cluster each worker is on "
        "its own host.",
    ]
    for x in r["sizes"]:
        if "error" in x:
            why = x["error"].removeprefix("did not reach steady state: ")
            L.append(f"- {x['workers']} workers did not reach steady state: {why}.")
    for x in wi:
        if "error" in x:
            L.append(f"- What-if at {x['workers']} workers: {x['error']}.")
    if wi and ok:
        w = max((x for x in wi if "error" not in x), key=lambda x: x["workers"], default=None)
        if w is not None:
            est = w["cpu_cores"] / w["workers"] * 10000
            L.append(
                f"- Even with both what-if changes, {w['workers']} workers cost {w['cpu_cores']:g} cores, about "
                f"{est:.2f} at 10,000 if it stays linear: what is left is per-message work (a Python `read()` with "
                "a timeout per heartbeat on the asyncio thread, HTTP/2 framing in gRPC core). Under half a core at "
                "10,000 needs fewer messages reaching the coordinator: a slower heartbeat at that size, or one "
                "aggregated stream per slice (a slice leader) instead of one per host."
            )
    L.append("")
    return L


def sec_flush(r: dict[str, Any], plots: dict[str, str]) -> list[str]:
    L = _header(r, "Flush: Orbax emergency flush vs raw write + fsync")
    L += _doc("bench.flush")
    rows = []
    for x in r["sizes"]:
        rows.append(
            [
                f"{x['size_mib']} MiB",
                f"{_fmt(x['raw_write_fsync_s'], 's')} ({x['raw_mib_per_s']:.0f} MiB/s)",
                f"{_fmt(x['orbax_flush_s'], 's')} ({x['orbax_mib_per_s']:.0f} MiB/s)",
                f"{x['ratio'] * 100:.0f}%",
                f"{_fmt(x['orbax_nocompression_flush_s'], 's')} ({x['orbax_nocompression_mib_per_s']:.0f} MiB/s)",
                f"{x['ratio_nocompression'] * 100:.0f}%",
            ]
        )
    L += _table(
        [
            "state",
            "raw write + fsync",
            "Orbax flush (default)",
            "Orbax / raw",
            "Orbax, no compression",
            "no compression / raw",
        ],
        rows,
    )
    sb = r["step_boundary"]
    L += [
        "",
        f"`ElasticSession.step_boundary()` with nothing pending: **{sb['step_boundary_us'] * 1000:.0f} ns** "
        f"per call (median of 5 batches of {sb['calls_per_batch']:,}); `report_step()` (builds a protobuf and "
        f"queues it for the link thread): {sb['report_step_us']:.2f} us.",
        "",
    ]
    L += _plot(plots, "flush", "flush throughput")
    L += [
        "### Limits",
        "",
        "- Orbax's default zstd compression runs on the 2 CPUs here (FACTS section 3); random weights do not "
        "compress, so it is pure cost. `PyTreeCheckpointHandler(use_compression=False)` removes it; the trainer's "
        "manager would need that handler to get the last column.",
        "- The raw baseline writes each leaf sequentially and fsyncs it; Orbax writes leaves in parallel through "
        "TensorStore, which is why it can beat the baseline without compression.",
        "- The disk is a virtio block device: fsync returns once the host has the data, so the raw baseline "
        "(about 2 GiB/s) is fast. The first raw write of each size was several times slower than the next two "
        "(see `raw_all_s` in benchmarks.json); medians compare warmed runs. Raw writes ran first, then Orbax, then "
        "Orbax without compression.",
        "- Without compression Orbax keeps a roughly fixed overhead per save (barriers, metadata, commit, the "
        "re-read of committed steps), which weighs more on 256 MiB than on 1 GiB.",
        "",
    ]
    return L


def sec_footprint(r: dict[str, Any], plots: dict[str, str]) -> list[str]:
    L = _header(r, "Footprint: idle sidecars and start-up")
    L += _doc("bench.footprint")
    s = r["summary"]
    rows = [
        [
            "coordinator",
            _fmt(s["coordinator_cpu_pct"], "%"),
            _fmt(s["coordinator_rss_mib"], "MiB"),
            _fmt(s["coordinator_uss_mib"], "MiB"),
            _fmt(s["coordinator_startup_s"], "s"),
            "gRPC health SERVING",
        ],
        [
            "worker",
            _fmt(s["worker_cpu_pct"], "%"),
            _fmt(s["worker_rss_mib"], "MiB"),
            _fmt(s["worker_uss_mib"], "MiB"),
            _fmt(s["worker_startup_s"], "s"),
            "registered with the coordinator",
        ],
    ]
    L += _table(["role", "idle CPU (% of a core)", "RSS", "USS", "start-up", "ready means"], rows)
    L.append("")
    L += _plot(plots, "footprint", "idle CPU and RSS")
    L += [
        "### Limits",
        "",
        "- psutil reads CPU time in 10 ms ticks: over a 10 s window the resolution is 0.1% of a core.",
        "- A worker's idle cost is its 4 Hz heartbeat, its health Watch and the keepalive. Start-up is mostly "
        "Python imports (grpcio, protobuf, structlog).",
        "- RSS includes shared libraries (grpcio's core is most of it); USS is what the process alone holds.",
        "- The coordinator's idle cost comes from its 50 ms decision tick (20 `decide()` calls a second even "
        "when nothing can change), the workers' 4 Hz heartbeats and the 0.5 s keepalive pings in both directions; "
        "ticking only when a deadline is pending is the likely fix (not measured here).",
        "",
    ]
    return L


SECTIONS = {
    "recovery": sec_recovery,
    "detection": sec_detection,
    "scale": sec_scale,
    "flush": sec_flush,
    "footprint": sec_footprint,
}


def stamp(result: dict[str, Any]) -> dict[str, Any]:
    result.setdefault("finished_at", time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    return result
