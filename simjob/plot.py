"""``elastic-sidecar demo --plot PATH``: the run as a picture.

Steps completed over time, coloured by the slice set they ran on; each fault a vertical line, its
recovery's phases and its grow's as shaded spans (the degraded stretch between them lighter).
matplotlib is imported only here, when a plot is asked for.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from simjob.phases import GROW, SHRINK
from simjob.summary import read_jsonl

MISSING = "--plot needs matplotlib, which is not installed (pip install matplotlib, or the project's [bench] extra)"


PHASE_COLOURS = {
    "detect": "#e41a1c",
    "hold": "#ff7f00",
    "wait": "#ffff33",
    "rebuild": "#984ea3",
    "restore": "#4daf4a",
    "first_step": "#377eb8",
    "degraded": "#eeeeee",
}
_GROWN = {"hold", "wait", "rebuild", "restore", "first_step"}


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def phase_spans(fault_time: float, phases: dict[str, float | None]) -> list[tuple[str, float, float]]:
    """(phase, start, end) of each phase in order from the fault, up to the first unknown one."""
    out, t = [], fault_time
    for name in (*SHRINK, *GROW):
        seconds = phases.get(name)
        if seconds is None:
            break
        out.append((name, t, t + seconds))
        t += seconds
    return out


def draw(summary: dict[str, Any], workdir: Path, t_start: float, path: Path) -> None:
    """Write the run's plot to ``path`` (PNG, or what its suffix names)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    steps = [e for e in read_jsonl(workdir / "trainer-events.jsonl") if e.get("kind") == "step"]
    fig, ax = plt.subplots(figsize=(11, 5), layout="constrained")
    by_set: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for e in steps:
        by_set.setdefault(tuple(e["slices"]), []).append(e)
    for slices, es in sorted(by_set.items(), key=lambda kv: -len(kv[0])):
        ax.scatter(
            [e["t"] - t_start for e in es],
            [e["step"] for e in es],
            s=4,
            color="black" if len(slices) == len(max(by_set, key=len)) else None,
            label=f"steps on slices {list(slices)}",
            zorder=3,
        )
    shown: set[str] = set()
    for f in summary["faults"]:
        t0 = f["time"] - t_start
        ax.axvline(t0, color="black", linewidth=0.8)
        ax.annotate(f["fault"], (t0, 1), xycoords=("data", "axes fraction"), rotation=90, va="top", fontsize=8)
        for name, a, b in phase_spans(t0, f.get("phases") or {}):
            base = name.removeprefix("grow_")  # a grow's phase has its recovery twin's colour
            label = None if base in shown else base + (" (and the grow's)" if base in _GROWN else "")
            shown.add(base)
            ax.axvspan(a, b, color=PHASE_COLOURS[base], alpha=0.45, linewidth=0, label=label)
    ax.set_xlabel("seconds since the demo started")
    ax.set_ylabel("step completed")
    ax.set_title(
        f"elastic-sidecar demo: {summary['final_step']} steps, {len(summary['faults'])} fault(s), "
        f"training goodput {summary.get('training_goodput') or 0:.1%}"
    )
    ax.legend(loc="lower right", fontsize=7, markerscale=3, ncols=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
