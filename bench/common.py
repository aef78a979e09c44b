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


def fresh_memory_seconds(gib: int) -> list[float]:
    """Seconds to write each GiB of ``gib`` GiB of private memory the process had not touched, in turn.

    Most of a trainer's start, rebuild, snapshot and restart is allocating and filling GiB-sized
    buffers, so this sets the scale of the example trainer's fault costs. On the VM this project
    is measured on it is far from constant: one run of this measured 0.74-0.78 s for each of the
    first three GiB and 8.8 s for the fourth (memory the guest has not used lately comes from the
    VM's host, and freed memory goes back to it within about 20 s), so a recovery run records it
    at its start. The mapping is held until every GiB is written, as a trainer holds its state.
    """
    import mmap

    step, page = 1 << 30, mmap.PAGESIZE
    held: list[mmap.mmap] = []
    out: list[float] = []
    try:
        for _ in range(gib):
            t0 = time.perf_counter()
            m = mmap.mmap(-1, step, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            held.append(m)
            for off in range(0, step, page):
                m[off] = 1
            out.append(round(time.perf_counter() - t0, 3))
    finally:
        for m in held:
            m.close()
    return out


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


def maxtext_name(trainer: str) -> str:
    """A :func:`maxtext_label` as the verdicts name it: ``MaxText`` for the tiny model, ``MaxText (larger
    model)`` for ``maxtext-larger``."""
    size = trainer.split("-", 1)[1] if trainer.startswith("maxtext-") else None
    return "MaxText" + (f" ({size} model)" if size else "")


def is_maxtext(trainer: Any) -> bool:
    """Whether a recovery trainer (or a ``by_trainer`` key such as ``maxtext (period 10000)``) is MaxText's,
    of any model size."""
    t = str(trainer or "").split(" (period ")[0]
    return t == "maxtext" or t.startswith("maxtext-")


def label_maxtext_model(result: dict[str, Any]) -> dict[str, Any]:
    """A recovery result with its MaxText records (rows, ratios, runs, fault-free runs, ``config.trainers``)
    under :func:`maxtext_label` of the model it ran. The tiny model's, a result already labelled and a merged
    section (``config.by_trainer``: its trainers are labelled already) come back unchanged."""
    cfg = result.get("config") or {}
    label = maxtext_label(cfg.get("maxtext_model") or (cfg.get("maxtext") or {}).get("model"))
    if label == "maxtext" or "by_trainer" in cfg or "maxtext" not in (cfg.get("trainers") or []):
        return result
    out = dict(result)
    for key in ("results", "ratios", "runs", "fault_free_runs"):
        if key in result:
            out[key] = [{**r, "trainer": label} if trainer_of(r) == "maxtext" else r for r in result[key] or []]
    out["config"] = {**cfg, "trainers": [label if t == "maxtext" else t for t in cfg["trainers"]]}
    return out


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


def row_runs(rec: dict[str, Any], row: dict[str, Any]) -> list[dict[str, Any]]:
    """The faulted runs of a recovery result behind one of its rows (same trainer, strategy, fault, period, delay)."""
    key = ("strategy", "fault", "checkpoint_period", "replacement_delay")
    return [
        r
        for r in rec.get("runs") or []
        if trainer_of(r) == row.get("trainer") and all(r.get(k) == row.get(k) for k in key)
    ]


def own_rate_costs(rec: dict[str, Any], row: dict[str, Any]) -> list[float]:
    """The row's runs' fault costs against each run's own pre-fault rate (``fault_cost_own_rate_s``)."""
    return [float(r["fault_cost_own_rate_s"]) for r in row_runs(rec, row) if r.get("fault_cost_own_rate_s") is not None]


STALL_RATE_SLACK = 0.1
"""How much faster than the rate a cost is taken against the steps computed again after a fault may run
(:func:`cost_below_stall`): about the spread of the fault-free runs' rates between runs."""


def cost_below_stall(rec: dict[str, Any], row: dict[str, Any], own_rate: bool) -> str | None:
    """Why the row's fault costs on one basis cannot be judged (None when they can): a run's cost below its stall.

    From the fault until the trainer completes a step above the last one it had completed (the run's
    ``recovery_s``) it keeps no work but the steps it computes again, which only stand in for the
    executions the fault wasted, and the one new step that ends it. So a fault costs at least
    ``recovery_s`` less one step, at any rate, give or take how much faster the steps computed again
    ran than the rate: allowed for as :data:`STALL_RATE_SLACK` of their time (the spread of the
    fault-free runs' rates). A cost below that says the rate it was taken against
    (the run's own pre-fault rate with ``own_rate``, else the fault-free runs') is not the rate the run
    went on at: the machine's drift between runs, or a pre-fault window that holds a cost paid once at
    the start.
    MaxText's rows (a local cost, bench/recovery_maxtext.py) are not judged here."""
    if row.get("fault_cost_method") == "local":
        return None
    field = "fault_cost_own_rate_s" if own_rate else "fault_cost_s"
    runs = [r for r in row_runs(rec, row) if not r.get("error")]
    below = []
    for r in runs:
        step = r.get("pre_fault_seconds_per_step") if own_rate else row.get("fault_free_seconds_per_step")
        if r.get(field) is None or r.get("recovery_s") is None or step is None:
            continue
        again = float(r.get("lost_steps") or 0) * float(step)
        floor = float(r["recovery_s"]) - float(step) - STALL_RATE_SLACK * again
        if float(r[field]) < floor:
            below.append((float(r[field]), floor))
    if not below:
        return None
    cost, floor = min(below, key=lambda x: x[0] - x[1])
    basis = "its own pre-fault rate" if own_rate else "the fault-free runs' rate"
    return (
        f"{row.get('strategy')}: cost against {basis} below the run's own stall in {len(below)} of {len(runs)} "
        f"runs (worst {round(cost, 3)} s against {round(floor, 3)} s, the fault to its first new step less one "
        "step and the slack for steps computed again): that rate is not the one the run went on at"
    )


def own_rate_invalid(rec: dict[str, Any], row: dict[str, Any]) -> str | None:
    """Why the row's own-rate cost cannot be judged (None when it can): every run has one, none below zero.

    An example-trainer row's ``invalid_reason`` speaks of its cost against the fault-free runs' rate
    (bench/recovery.py: a cost below zero there, or no reference run), which the own-rate cost does not
    use; so where the own-rate basis is judged (the report's ratios, bench/goodput.py), that reason is
    stated beside it instead, as MaxText's whole-run cost below zero is beside its local cost
    (bench/recovery_maxtext.py ``_local_fields``)."""
    if not row.get("runs") or row.get("status") == "not_run" or row.get("fault_cost_method") == "local":
        return f"{row.get('strategy')}: no own-rate cost (no run, or a local cost instead)"
    own = own_rate_costs(rec, row)
    if len(own) != row.get("runs") or row.get("fault_cost_own_rate_runs") != row.get("runs"):
        return f"{row.get('strategy')}: own-rate cost in {len(own)} of {row.get('runs')} runs"
    if any(c < 0 for c in own):
        return f"{row.get('strategy')}: own-rate cost below zero (lowest {round(min(own), 3)} s)"
    return cost_below_stall(rec, row, own_rate=True)


STEP_OVERHEAD_RESOLUTION = 0.02
"""The step overhead the MaxText rows must resolve (issue 23: at most 2% a step). Every strategy does at least
what plain MaxText does (elastic mode, local saves, the sidecar's hook and snapshots on top), so a strategy
measured faster than plain by more than this measures the machine's drift between its runs, not itself; so
does MaxText's rewind measured slower by more than this (:data:`REWIND_STEP_WORK`)."""


REWIND_STEP_WORK = (
    "MaxText's own elastic mode, which adds no work a step but reading which slices are up (maxtext 0.2.5 "
    "trainers/pre_train/train.py: maybe_elastic_scale_up; pathwaysutils elastic/manager.py: "
    "available_inactive_slices, set by a background thread every 10 s)"
)
"""Why the rewind's steady step must read as plain MaxText's, within what the rows resolve."""


def step_times_drifted(rows: list[dict[str, Any]]) -> str | None:
    """Why the steady step times of one period's MaxText rows cannot be compared (None when they can): a
    strategy's ``step_overhead_fraction_median`` below ``-STEP_OVERHEAD_RESOLUTION`` (nothing does less work a
    step than plain MaxText), or MaxText's rewind (``checkpoint_rewind``) off plain MaxText's by more than
    ``STEP_OVERHEAD_RESOLUTION`` either way (:data:`REWIND_STEP_WORK`: it does the same work, to within an
    attribute read). Its step overhead, the period cost built on it and a goodput that weighs steady step
    times then measure drift, not the strategy (the rows' fault costs at the full-slice rate, read against
    each run's own step time, still stand)."""
    read = [
        (float(r["step_overhead_fraction_median"]), str(r.get("strategy")), r)
        for r in rows
        if r.get("step_overhead_fraction_median") is not None
    ]
    below = sorted((o, s) for o, s, _ in read if o < -STEP_OVERHEAD_RESOLUTION)
    above = sorted(
        (o, s)
        for o, s, r in read
        if s == "checkpoint_rewind" and is_maxtext(r.get("trainer")) and o > STEP_OVERHEAD_RESOLUTION
    )
    if not below and not above:
        return None
    said = []
    if below:
        named = ", ".join(f"{s} {o:+.2%}" for o, s in below)
        said.append(f"{named} against plain MaxText, which does no more work than any strategy")
    if above:
        named = ", ".join(f"{s} {o:+.2%}" for o, s in above)
        said.append(f"{named} against plain MaxText, though it is {REWIND_STEP_WORK}")
    return (
        f"steady step times drifted: {'; '.join(said)}; the run's step times cannot resolve the "
        f"{STEP_OVERHEAD_RESOLUTION:.0%} overheads compared"
    )


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
