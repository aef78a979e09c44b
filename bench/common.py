"""Shared helpers of the benchmarks: processes, statistics, logs, environment."""

from __future__ import annotations

import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port that was free just now and that this process has not handed out before.

    The kernel can give the same port to two ``bind(0)`` calls once the first socket is closed, so
    a rig that picks a dozen ports before starting its servers could otherwise give two of them one
    port (and one server would fail to bind).
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def raise_nofile(want: int | None = None) -> int:
    """Raise this process's RLIMIT_NOFILE soft limit (to the hard limit by default)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if want is None else min(hard, max(soft, want))
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


def median(xs: Iterable[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return statistics.median(v) if v else None


def percentile(xs: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100)."""
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def rnd(x: float | None, n: int = 4) -> float | None:
    return None if x is None else round(float(x), n)


def consecutive_steps(steps: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs of ``step`` events (in time order) in which the second step directly follows the first in the
    same process: the second one's own time is ``b["t"] - a["t"]``."""
    return [
        (a, b)
        for a, b in zip(steps, steps[1:], strict=False)
        if a.get("pid") == b.get("pid") and b["step"] == a["step"] + 1
    ]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def iso_to_epoch(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def wait_until(pred: Callable[[], Any], timeout: float, interval: float = 0.02) -> Any:
    """Poll ``pred`` until it returns something truthy; returns it (None on timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


def stop_process(p: subprocess.Popen[Any] | None, grace: float = 5.0) -> int | None:
    if p is None:
        return None
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return p.returncode


def environment() -> dict[str, Any]:
    """What the figures were measured on."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
    }
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
        info["psutil"] = psutil.__version__
    except ImportError:
        info["psutil"] = None
    for mod in ("grpc", "jax", "orbax.checkpoint", "pathwaysutils", "matplotlib"):
        try:
            m = __import__(mod, fromlist=["_"])
            info[mod] = getattr(m, "__version__", "?")
        except Exception:  # noqa: BLE001 - report what is missing, never fail on it
            info[mod] = None
    if info.get("orbax.checkpoint") in (None, "?"):
        try:
            from importlib.metadata import version

            info["orbax.checkpoint"] = version("orbax-checkpoint")
        except Exception:  # noqa: BLE001
            pass
    return info


def target(name: str, goal: str, measured: float | None, unit: str, ok: bool | None, note: str = "") -> dict[str, Any]:
    """One row of the targets table: ``ok`` None means not measured."""
    return {"name": name, "target": goal, "measured": measured, "unit": unit, "met": ok, "note": note}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class CpuSampler:
    """CPU (cores used) and RSS of one process over windows, with psutil."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.proc = psutil.Process(pid)

    def cpu_seconds(self) -> float:
        t = self.proc.cpu_times()
        return float(t.user + t.system)

    def rss(self) -> int:
        return int(self.proc.memory_info().rss)

    def windows(self, seconds: float, n: int) -> list[float]:
        """Cores used in each of ``n`` consecutive windows of ``seconds / n``."""
        out = []
        w = seconds / n
        for _ in range(n):
            c0, t0 = self.cpu_seconds(), time.monotonic()
            time.sleep(w)
            c1, t1 = self.cpu_seconds(), time.monotonic()
            out.append((c1 - c0) / (t1 - t0))
        return out


def cli_flags(role: str) -> set[str]:
    """Every option string ``elastic-sidecar <role>`` accepts (the daemons gain options over time)."""
    import argparse

    from agent.cli import build_parser

    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    return {s for a in sub.choices[role]._actions for s in a.option_strings}  # noqa: SLF001


def daemon_port_flags(role: str) -> list[str]:
    """Free loopback ports for a daemon's side servers (HTTP, admin) so that several can run here.

    Their defaults are fixed ports (29311, 29312); two daemons on one machine would collide.
    """
    flags = cli_flags(role)
    out: list[str] = []
    for f in ("--http-listen", "--admin-listen"):
        if f in flags:
            out += [f, f"127.0.0.1:{free_port()}"]
    return out


# ---------------------------------------------------------------------------
# the JSON every benchmark writes
# ---------------------------------------------------------------------------

SCHEMA_VERSION = 2


def git_state(root: Path = ROOT) -> dict[str, Any]:
    """``git_sha`` (HEAD now) and ``dirty`` (``git status --porcelain`` not empty); None when unknown."""

    def git(*args: str) -> str | None:
        try:
            p = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return p.stdout if p.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=normal")
    return {"git_sha": sha.strip() if sha else None, "dirty": None if status is None else bool(status.strip())}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def machine() -> dict[str, Any]:
    """What the figures were measured on: cores, memory, CPU model, Python and library versions."""
    info = environment()
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {
        "cores": os.cpu_count(),
        "cores_usable": affinity,
        "memory_gib": info.get("memory_gib"),
        "cpu_model": _cpu_model(),
        "python": info["python"],
        "jax": info.get("jax"),
        "kernel": info["kernel"],
        "arch": info["machine"],
        "libraries": {k: v for k, v in info.items() if k not in ("python", "machine", "cpus", "kernel", "memory_gib")},
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def envelope(name: str, config: dict[str, Any], results: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """One benchmark's output: provenance, machine, the arguments, and a list of result rows.

    Everything a report says is read from here (bench/report.py); ``extra`` carries what a row
    cannot (targets, per-run raw figures).
    """
    return {
        "schema": SCHEMA_VERSION,
        "name": name,
        **git_state(),
        "machine": machine(),
        "config": config,
        "results": results,
        **extra,
    }


def spread(xs: Sequence[float | None]) -> dict[str, Any]:
    """Median, p90 (nearest rank), min and max of the figures that exist, and how many there were."""
    v = sorted(x for x in xs if x is not None)
    if not v:
        return {"n": 0, "median": None, "p90": None, "min": None, "max": None}
    return {"n": len(v), "median": statistics.median(v), "p90": percentile(v, 90), "min": v[0], "max": v[-1]}


def cost_fields(costs: Sequence[float], measure: str, why_below: str) -> dict[str, Any]:
    """A row's ``fault_cost_seconds_*`` (median, p90, min, max) from its runs' costs, and an
    ``invalid_reason`` when any is below zero: a fault cannot make training faster, so such a cost
    measures the reference's error (``why_below``), and the row's figures measure noise, not the fault."""
    cost = spread(costs)
    out: dict[str, Any] = {f"fault_cost_seconds_{k}": rnd(cost[k], 3) for k in ("median", "p90", "min", "max")}
    below = [c for c in costs if c < 0]
    if below:
        out["invalid_reason"] = (
            f"{measure} below zero in {len(below)} of {len(costs)} runs (lowest {rnd(min(below), 3)} s): {why_below}"
        )
    return out


def trainer_of(record: dict[str, Any]) -> str:
    """A recovery row's or run's trainer; runs recorded before they named it: MaxText's are tagged ``mx-``."""
    if record.get("trainer"):
        return str(record["trainer"])
    return "maxtext" if str(record.get("tag", "")).startswith("mx-") else "example"


def maxtext_label(model: str | None) -> str:
    """The recovery rows' trainer for a MaxText model size: ``maxtext`` for the tiny model (as every row
    was before other sizes were published), ``maxtext-<model>`` for any other, so that one size's rows
    neither replace another's in docs/benchmarks.json nor mix with them in a verdict."""
    return "maxtext" if model in (None, "", "tiny") else f"maxtext-{model}"


def fault_cost(
    runs: Sequence[dict[str, Any]], refs: Sequence[dict[str, Any]]
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], float | None]:
    """A recovery row's shared figures: each faulted run's fault cost (``seconds`` less its
    ``work_steps`` at the median rate of the fault-free ``refs``, stored as ``fault_cost_s``), lost
    steps and recovery time over the runs without an error.

    Returns (row fields, successful runs, successful references, the reference rate in steps/s).
    """
    good_refs = [r for r in refs if not r.get("error")]
    rate = median(r["work_steps"] / r["seconds"] for r in good_refs if r.get("seconds"))
    ok = [r for r in runs if not r.get("error")]
    costs = [r["seconds"] - r["work_steps"] / rate for r in ok] if rate else []
    for r, c in zip(ok, costs, strict=False):
        r["fault_cost_s"] = rnd(c)
    lost, rec = spread([r["lost_steps"] for r in ok]), spread([r["recovery_s"] for r in ok])
    rates = [r["work_steps"] / r["seconds"] for r in good_refs if r.get("seconds")]
    fields = {
        "runs": len(ok),
        "failed_runs": len(runs) - len(ok),
        "failures": sorted({r["error"] for r in runs if r.get("error")}),
        "fault_free_runs": len(good_refs),
        "fault_free_seconds_per_step": rnd(1 / rate, 5) if rate else None,
        "lost_steps_median": lost["median"],
        "lost_steps_max": lost["max"],
        **cost_fields(
            costs, "fault cost", "the fault-free runs' rate varies by more than the fault costs over runs this long"
        ),
        "recovery_seconds_median": rnd(rec["median"], 3),
        "recovery_seconds_p90": rnd(rec["p90"], 3),
        # How far apart the fault-free runs' rates are ((max - min) / median): each run's cost moves by
        # about this fraction of its length when the rate is off by as much.
        "fault_free_rate_spread": rnd((max(rates) - min(rates)) / rate, 4) if rate and len(rates) > 1 else None,
    }
    return fields, ok, good_refs, rate


def portable_path(value: str) -> str:
    """``value`` as a published result records it: an absolute path inside the repository relative to its
    root, any other absolute path as its last component under ``<outside>/`` (a scratch directory of the
    machine that ran it, which means nothing elsewhere); anything else unchanged."""
    if not value.startswith("/"):
        return value
    p = Path(value)
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return f"<outside>/{p.name}"


def portable_argv(argv: list[str]) -> list[str]:
    """``argv`` with every absolute path (also in ``--flag=/path``) made :func:`portable_path`."""
    out = []
    for a in argv:
        flag, eq, val = a.partition("=")
        out.append(f"{flag}={portable_path(val)}" if eq and flag.startswith("-") else portable_path(a))
    return out
