"""Recovery: what one fault costs a training job under each recovery strategy.

Strategies (the same example trainer, stand-in Pathways workers and provisioner
in every one; only what happens on a fault differs):

* ``full_restart`` (:mod:`simjob.strategies.full_restart`): every process
  stops, the job waits for all slices (the replacement delay), starts the
  trainer afresh and restores the last periodic checkpoint.
* ``checkpoint_rewind`` (:mod:`simjob.strategies.checkpoint_rewind`): MaxText's
  way, pathwaysutils ``Manager.elastic_retry`` re-runs training from the last
  committed checkpoint on ``DATA_LOSS``, and again when it grows back.
* ``local_checkpoint_rewind``: the same, with a checkpoint every
  ``local_checkpoint_period`` steps on local disk (what Orbax's multi-tier /
  emergency checkpointing gives a rewind); the periodic persistent save is not
  made, as its cost is the same with and without the fault.
* ``memory_snapshot`` (:mod:`simjob.strategies.memory_snapshot`): the same
  rewind, to an in-memory copy of the state taken before every step.
* ``sidecar``: the real ``python -m agent demo`` (coordinator, worker
  sidecars, trainer hooks); the trainer's in-memory snapshots at
  ``snapshot_every`` (default ``auto``, the MaxText hook's: an interval
  measured to cost at most 1.5% of the step, and none when that interval
  reaches the checkpoint period, where the periodic checkpoints bound a
  crash's loss as tightly; ``1``: a copy of the state before every step).

Faults (one per run, on slice 1, at a seeded random phase of the checkpoint
period): ``kill`` (SIGKILL of the host), ``hang`` (SIGSTOP), ``notice`` (a
maintenance notice through Pub/Sub, the host dies at the notice deadline; the
baselines do not listen to notices, so for them a notice is the kill at the
deadline and their notice rows repeat their kill runs, marked so).

Measured, per run, from the trainer's event log:

* ``fault_cost_seconds``: wall-clock seconds of training lost against a
  fault-free run of the same job (same strategy, checkpoint period, state):
  ``T - W / r0``, where ``T`` is the faulted run's time from the end of its
  warm-up step to its last step, ``W`` the work it kept (each step's last
  execution, a step on k of n slices counting k/n), and ``r0`` the work rate
  of the fault-free runs (their median). Only fault cost feeds the ratios;
* ``fault_cost_own_rate_s``: the same cost with the run's own work rate before
  its fault as ``r0`` (fault-free runs' rates varied by up to 15% between runs
  on the shared machine, as much as some costs); rows give its median beside
  the reference-based one;
* ``lost_steps``: completed steps computed again (the rewind);
* ``recovery_seconds``: fault until the trainer completes a step above the
  last step it had completed when its recovery began.

The example trainer's costs are mostly moving GiB-sized state through memory,
so a full run first writes ``FRESH_MEMORY_GIB`` GiB of fresh memory and records
the seconds of each GiB (``config.fresh_memory_seconds``): on the VM these
figures come from, memory the guest has not used lately comes from the VM's
host at about ten times the usual cost, so the same run can cost more on a day
when less memory is warm.

A run that ends before the strategy is back on every slice is a failed run
(its cost would be understated): rows count those in ``failed_runs``.

``--trainer maxtext`` runs the real MaxText (0.2.5, on the CPU) instead:
``full_restart``, ``checkpoint_rewind`` (MaxText's own elastic mode) and
``sidecar`` (the hook with its in-memory snapshots at its ``auto`` interval) on one job, with
a slice lost inside a step by pathwaysutils' own fault injection; its rows
also give the snapshot's cost per step. What it runs and how it measures:
:mod:`bench.recovery_maxtext`. ``--quick`` there: 3 runs per row, the kill
fault, checkpoint period 20, replacement delay 1 s, 18 MaxText runs (11 minutes
on the 2-core machine with other work on it); the full run: 5 runs per row at
checkpoint periods 25 and 100 and delays 5 and 30 s, 90 MaxText runs (about
an hour and a half, estimated from the quick run).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    PY,
    ROOT,
    env,
    fault_cost,
    fresh_memory_seconds,
    label_maxtext_model,
    log,
    median,
    read_jsonl,
    rnd,
)
from trainer_hooks.maxtext.snapshot import AUTO

NAME = "recovery"
STRATEGIES = ("full_restart", "checkpoint_rewind", "local_checkpoint_rewind", "memory_snapshot", "sidecar")
BASELINES = STRATEGIES[:-1]
FAULTS = ("kill", "hang", "notice")
TRAINERS = ("example", "maxtext")
BASE_CMD = {
    "full_restart": [PY, "-m", "simjob.strategies.full_restart"],
    "checkpoint_rewind": [PY, "-m", "simjob.strategies.checkpoint_rewind"],
    "local_checkpoint_rewind": [PY, "-m", "simjob.strategies.checkpoint_rewind"],
    "memory_snapshot": [PY, "-m", "simjob.strategies.memory_snapshot"],
    "sidecar": [PY, "-m", "agent", "demo"],
}
WARMUP_STEP = 3
"""Work is counted from the end of this step: the first steps compile."""
FRESH_MEMORY_GIB = 4
"""GiB written at the start of a full run to record how fast this machine hands out fresh memory
(the documented state, 1 GiB, in its four replicas)."""


EXAMPLE_LOCAL_CHECKPOINT_PERIOD = 5
"""The example trainer's ``local_checkpoint_rewind``: a local checkpoint every 5 steps (MaxText's is
:data:`bench.recovery_maxtext.LOCAL_CHECKPOINT_PERIOD`, 20, its own example value)."""


@dataclass
class Config:
    trainers: list[str] = field(default_factory=lambda: ["example"])
    strategies: list[str] = field(default_factory=lambda: list(STRATEGIES))
    faults: list[str] = field(default_factory=lambda: list(FAULTS))
    checkpoint_periods: list[int] = field(default_factory=lambda: [25, 100])
    delays: list[float] = field(default_factory=lambda: [5.0, 30.0])
    realistic_checkpoint_period: int = 100
    realistic_delay: float = 30.0
    sweep_faults: list[str] = field(default_factory=lambda: ["kill"])
    """Faults run at the sweep's (period, delay) points; the others only at the realistic point."""
    sweep_strategies: list[str] | None = None
    """Strategies run at the sweep's points other than the realistic one; None: every strategy."""
    sweep: str = "grid"
    """``grid``: every period x every delay; ``cross``: each period at the realistic delay and each
    delay at the realistic period (one axis varied at a time: fewer runs)."""
    runs: int = 5
    fault_free_runs: int = 0
    """Rounds that run the fault-free references (the first ones); 0: every round (``runs``)."""
    seed: int = 0
    slices: int = 4
    devices_per_slice: int = 2
    step_seconds: float = 0.05
    state_mib: int | None = None
    """Train state across all slices' replicas; None: the example model alone (about 135 KB a replica).
    The bulk is the trainer's ``--ballast-mib`` per replica: optimizer-like state rewritten every step."""
    donate: bool = True
    snapshot_every: int = AUTO
    """The sidecar's example trainer: steps between in-memory snapshots (its ``--snapshot-every``): ``AUTO``
    (-1, the MaxText hook's default, as the MaxText rows) measures the interval that keeps the snapshots
    within 1.5% of the step and takes none when that reaches the checkpoint period
    (:mod:`trainer_hooks.maxtext.interval`); 1: before every step, at most the step in flight lost, at the
    cost of a copy of the state every step; N: up to N - 1 more steps lost."""
    local_checkpoint_period: int | None = None
    """``local_checkpoint_rewind``'s checkpoint every N steps; None: each trainer's own default (the example
    trainer's :data:`EXAMPLE_LOCAL_CHECKPOINT_PERIOD`, MaxText's :data:`bench.recovery_maxtext.LOCAL_CHECKPOINT_PERIOD`)."""
    min_slices: int = 2
    poll_interval: float = 10.0
    notice_deadline: float = 4.0
    timeout: float = 180.0
    fault_free_steps: int = 0
    """Steps of each fault-free reference run; 0: three checkpoint periods, at least 100."""
    maxtext_model: str = "tiny"
    """``--trainer maxtext``: the model size (:data:`simjob.maxtext.job.MODELS`)."""
    maxtext_min_slices: int = -1
    """``--trainer maxtext``: ``elastic_min_slice_count`` of both elastic strategies (-1: wait for every slice)."""
    quick: bool = False

    def example_local_period(self) -> int:
        """The example trainer's ``local_checkpoint_rewind`` period."""
        return self.local_checkpoint_period or EXAMPLE_LOCAL_CHECKPOINT_PERIOD

    def ballast_mib(self) -> int | None:
        """The trainer's ``--ballast-mib`` (per replica, one replica per slice) for ``state_mib``."""
        return None if self.state_mib is None else -(-self.state_mib // self.slices)

    def state_bytes(self) -> int:
        model = 8 * (64 + 2) * 256  # the example model's params and momentum (float32) at its default size
        return self.slices * (model + (self.ballast_mib() or 0) * 2**20)

    def cases(self) -> list[tuple[str, int, float]]:
        """(fault, checkpoint period, delay) to run: the sweep faults everywhere, the rest at the realistic point."""
        out = []
        if self.sweep == "grid":
            points = [(p, d) for p in self.checkpoint_periods for d in self.delays]
        else:
            rp, rd = self.realistic_checkpoint_period, self.realistic_delay
            points = sorted({(p, rd) for p in self.checkpoint_periods} | {(rp, d) for d in self.delays})
        for fault in self.faults:
            if fault in self.sweep_faults:
                out += [(fault, p, d) for p, d in points]
            else:
                out.append((fault, self.realistic_checkpoint_period, self.realistic_delay))
        return out

    def runs_at(self, strategy: str, period: int, delay: float) -> bool:
        """Whether ``strategy`` runs at the point (``period``, ``delay``): every strategy runs at the
        realistic point, only ``sweep_strategies`` (None: all) at the sweep's others."""
        realistic = (period, delay) == (self.realistic_checkpoint_period, self.realistic_delay)
        return realistic or self.sweep_strategies is None or strategy in self.sweep_strategies

    def runs_at_period(self, strategy: str, period: int) -> bool:
        """Whether some case runs ``strategy`` at checkpoint ``period`` (it then needs a fault-free reference)."""
        return period == self.realistic_checkpoint_period or any(
            p == period and self.runs_at(strategy, p, d) for _, p, d in self.cases()
        )

    @classmethod
    def make(cls, quick: bool = False, **over: Any) -> Config:
        c = cls()
        if quick:
            c.quick = True
            c.checkpoint_periods = [20]
            c.realistic_checkpoint_period = 20
            c.delays = [1.0]
            c.realistic_delay = 1.0
            c.runs = 3
            c.poll_interval = 2.0
            c.notice_deadline = 1.0
            c.fault_free_steps = 60
        for k, v in over.items():
            if v is not None:
                setattr(c, k, v)
        if c.realistic_checkpoint_period not in c.checkpoint_periods:
            c.realistic_checkpoint_period = max(c.checkpoint_periods)
        if c.realistic_delay not in c.delays:
            c.realistic_delay = max(c.delays)
        bad = (
            set(c.strategies) - set(STRATEGIES)
            or set(c.sweep_strategies or ()) - set(STRATEGIES)
            or set(c.faults) - set(FAULTS)
            or set(c.trainers) - set(TRAINERS)
        )
        if bad:
            raise ValueError(f"unknown strategy, fault or trainer {sorted(bad)}")
        if c.sweep not in ("grid", "cross"):
            raise ValueError(f"sweep {c.sweep!r}: expected 'grid' or 'cross'")
        if not 0 <= c.fault_free_runs <= c.runs:
            raise ValueError(f"fault_free_runs {c.fault_free_runs}: expected 0 (every round) to runs ({c.runs})")
        if c.snapshot_every < AUTO:
            raise ValueError(f"snapshot_every {c.snapshot_every}: expected steps >= 0 (0: no snapshots) or -1 (auto)")
        if c.runs < (3 if c.quick else 5):
            log(f"recovery: {c.runs} runs per row is below the {3 if c.quick else 5} the method asks for")
        return c


# ---------------------------------------------------------------------------
# one run
# ---------------------------------------------------------------------------


def fault_step(cfg: Config, period: int, rep: int) -> int:
    """A seeded random phase of the checkpoint period, after the first checkpoint and the warm-up."""
    rng = random.Random(f"{cfg.seed}/{period}/{rep}")
    first = period * max(1, math.ceil((WARMUP_STEP + 10) / period))
    return first + rng.randrange(period) + 1


def margin_seconds(cfg: Config, strategy: str, period: int, step_s: float) -> float:
    """Seconds a run goes on after the replacement is due: enough to be back on every slice and run a little."""
    if strategy == "full_restart":
        return 8.0 + period * step_s
    if strategy == "sidecar":
        return 4.0 + cfg.notice_deadline
    rewind = {"checkpoint_rewind": period, "local_checkpoint_rewind": cfg.example_local_period()}.get(strategy, 1)
    return cfg.poll_interval + 4.0 + rewind * step_s


SURVIVOR_PACE = 1.5
"""How much faster the rewinding baselines may step on the surviving slices than on all of them."""


def post_fault_seconds(cfg: Config, strategy: str, period: int, step_s: float, delay: float) -> float:
    """Seconds of full-capacity steps a faulted run gets after the fault (the run's steps are sized from it).

    The rewinding baselines train on the surviving slices until their poll sees the replacement,
    and those steps are shorter on the CPU (fewer devices to run): they get :data:`SURVIVOR_PACE`
    times as many, or a run can end before the poll brings the replacement in (as local_checkpoint_rewind
    and memory_snapshot did at short checkpoint periods).
    """
    wait = 0.0 if strategy == "full_restart" else delay
    total = wait + margin_seconds(cfg, strategy, period, step_s)
    rewinds = strategy in ("checkpoint_rewind", "local_checkpoint_rewind", "memory_snapshot")
    return total * SURVIVOR_PACE if rewinds else total


def _strategy_args(cfg: Config, strategy: str, period: int) -> list[str]:
    args = [
        "--checkpoint-period",
        str(cfg.example_local_period() if strategy == "local_checkpoint_rewind" else period),
    ]
    if strategy in ("checkpoint_rewind", "local_checkpoint_rewind", "memory_snapshot"):
        args += ["--poll-interval", str(cfg.poll_interval)]
    if cfg.donate:
        args.append("--trainer-arg=--donate")
    if strategy == "sidecar" and cfg.snapshot_every != 1:
        every = "auto" if cfg.snapshot_every == AUTO else str(cfg.snapshot_every)
        args.append(f"--trainer-arg=--snapshot-every={every}")
    mib = cfg.ballast_mib()
    if mib is not None:
        args.append(f"--trainer-arg=--ballast-mib={mib}")
    return args


MIN_FREE_STATES = 6
"""A run starts only with at least this many copies of the state free on the disk under the
benchmark's root (its periodic, local and flushed checkpoints); otherwise it fails with that reason."""


def free_space_error(cfg: Config, root: Path) -> str | None:
    """Why a run must not start for lack of disk space (None when there is enough)."""
    need = MIN_FREE_STATES * cfg.state_bytes()
    free = shutil.disk_usage(root).free
    if free >= need:
        return None
    return (
        f"not run: {free / 2**30:.1f} GiB free under {root}, fewer than the {need / 2**30:.1f} GiB "
        f"({MIN_FREE_STATES} copies of the state) a run may write"
    )


def drop_checkpoints(job: Path) -> None:
    """Once a run is read, remove its checkpoint directories (a GiB or more each); its event logs,
    journal and process logs stay. Without this, a full run fills the disk in its later rounds."""
    if not job.is_dir():
        return
    for p in job.iterdir():
        if p.is_dir() and p.name != "logs":
            shutil.rmtree(p, ignore_errors=True)


def run_one(
    cfg: Config,
    strategy: str,
    period: int,
    root: Path,
    tag: str,
    *,
    fault: str | None,
    at_step: int,
    delay: float,
    steps: int,
    step_s: float | None = None,
) -> dict[str, Any]:
    wd = root / tag
    if wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    ident = {
        "strategy": strategy,
        "fault": fault,
        "checkpoint_period": period,
        "replacement_delay": delay,
        "fault_step": at_step if fault else None,
        "steps": steps,
    }
    no_space = free_space_error(cfg, root)
    if no_space is not None:
        log(f"recovery: {no_space}")
        return {**ident, "exit_code": None, "error": no_space}
    # Generous: a shared or slow machine makes a late run a failed run, not a hung benchmark.
    run_timeout = 120.0 + delay + steps * max(cfg.step_seconds, step_s or 0.0) * 4
    cmd = [
        *BASE_CMD[strategy],
        "--workdir",
        str(wd / "job"),
        "--slices",
        str(cfg.slices),
        "--devices-per-slice",
        str(cfg.devices_per_slice),
        "--steps",
        str(steps),
        "--step-seconds",
        str(cfg.step_seconds),
        "--min-slices",
        str(cfg.min_slices),
        "--timeout",
        str(cfg.timeout),
        "--replacement-delay",
        str(delay),
        "--notice-deadline",
        str(cfg.notice_deadline),
        "--summary-json",
        str(wd / "summary.json"),
        "--quiet",
        "--run-timeout",
        str(run_timeout),
        *_strategy_args(cfg, strategy, period),
    ]
    cmd += ["--no-faults"] if fault is None else ["--fault", f"{fault}:1.0@{at_step}"]
    t0 = time.monotonic()
    with open(wd / "output.log", "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env(), cwd=ROOT, process_group=0)
        try:
            proc.wait(run_timeout + 60)
        finally:
            if proc.poll() is None:
                # SIGINT lets the harness stop its own trainer and stand-in hosts (they run in their own groups).
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    summary = json.loads((wd / "summary.json").read_text()) if (wd / "summary.json").exists() else {}
    m = analyse(wd / "job", summary, cfg.slices, fault is not None)
    drop_checkpoints(wd / "job")
    m.update({**ident, "exit_code": proc.returncode, "run_wall_s": round(time.monotonic() - t0, 2)})
    if proc.returncode != 0:
        m["error"] = f"exit code {proc.returncode}; see {wd / 'output.log'}"
    elif fault is not None and not m.get("back_on_all_slices"):
        m["error"] = "the run ended before the strategy was back on every slice"
    return m


def demo_fault_time(job: Path, summary: dict[str, Any]) -> float | None:
    """The demo's fault time (its summary's ``time`` field, else rebuilt from its journal)."""
    faults = summary.get("faults") or []
    if not faults:
        return None
    f = faults[0]
    for key in ("time", "fault_time", "t"):
        if isinstance(f.get(key), (int, float)):
            return float(f[key])
    steps = [e for e in read_jsonl(job / "trainer-events.jsonl") if e.get("kind") == "step"]
    journal = read_jsonl(job / "journal.jsonl")
    if f.get("detection_seconds") is not None:
        before = [e["t"] for e in steps if e["step"] == f["step_at_fault"]]
        t_lo = min(before) if before else 0.0
        det = next((j for j in journal if j["time"] >= t_lo and f["slice"] not in j.get("up_slices", [])), None)
        if det is not None:
            return float(det["time"]) - float(f["detection_seconds"])
    return None


def work_and_time(
    steps: list[dict[str, Any]], num_slices: int, start_step: int = WARMUP_STEP
) -> tuple[float, float] | None:
    """(work kept, seconds) from the end of step ``start_step`` (default: the warm-up step) to the last step;
    work in full-capacity steps."""
    start = next((e["t"] for e in steps if e["step"] == start_step), None)
    if start is None or not steps:
        return None
    final: dict[int, dict[str, Any]] = {}
    for e in steps:
        final[e["step"]] = e
    work = sum(len(e["slices"]) / num_slices for k, e in final.items() if k > start_step)
    return work, max(e["t"] for e in steps) - start


def pre_fault_rate(steps: list[dict[str, Any]], num_slices: int, fault_time: float) -> float | None:
    """The run's own work rate before its fault (full-capacity steps a second, from the end of the
    warm-up step to the last step completed before the fault): a reference free of the drift between
    runs on a shared machine. None with fewer than ``MIN_PRE_FAULT_STEPS`` steps to go on."""
    before = [e for e in steps if e["t"] <= fault_time]
    wt = work_and_time(before, num_slices)
    if wt is None or wt[0] < MIN_PRE_FAULT_STEPS or wt[1] <= 0:
        return None
    return wt[0] / wt[1]


SETTLE_STEPS = 50
"""A fault-free run's steady rate (``steady_seconds_per_step``) counts from this many steps past the warm-up:
past what a process pays once at its start, as the sidecar's ``auto`` interval does (its warm-up, baseline
and probe round, with 3 snapshots: 38 steps). Goodput weighs this rate (a run of hours pays the start once);
the fault costs keep the whole run's (``fault_free_seconds_per_step``)."""
MIN_PRE_FAULT_STEPS = 10
"""Steps after the warm-up a run must complete before its fault for its own rate to be used."""


def analyse(job: Path, summary: dict[str, Any], num_slices: int, faulted: bool) -> dict[str, Any]:
    tev = read_jsonl(job / "trainer-events.jsonl")
    hev = read_jsonl(job / "harness-events.jsonl")
    steps = [e for e in tev if e.get("kind") == "step"]
    out: dict[str, Any] = {"recovery_s": None, "lost_steps": None}
    wt = work_and_time(steps, num_slices)
    if wt is None:
        out["error"] = "no steps past the warm-up"
        return out
    out["work_steps"], out["seconds"] = rnd(wt[0]), rnd(wt[1])
    out["back_on_all_slices"] = bool(steps and len(steps[-1]["slices"]) == num_slices)
    if not faulted:
        settled = work_and_time(steps, num_slices, start_step=WARMUP_STEP + SETTLE_STEPS)
        if settled is not None and settled[0] > 0:
            out["steady_seconds_per_step"] = rnd(settled[1] / settled[0], 5)
    snaps = [e["median_seconds"] for e in tev if e.get("kind") == "snapshot_stats"]
    if snaps:
        out["snapshot_seconds_median"] = rnd(median(snaps), 5)
    if not faulted:
        return out
    fault = next((h for h in hev if h.get("kind") == "fault"), None)
    ft = float(fault["fault_time"]) if fault else demo_fault_time(job, summary)
    if ft is None:
        out["error"] = "no fault time"
        return out
    resumes = [e for e in tev if e.get("kind") == "resumed"]
    last_before = max((e["step"] for e in steps if e["t"] <= ft), default=0)
    r = next((x for x in resumes if x["t"] > ft), None)
    s_star = max((e["step"] for e in steps if e["t"] <= r["t"]), default=0) if r else last_before
    t_from = r["t"] if r else ft
    regained = next((e for e in steps if e["t"] > t_from and e["step"] > s_star), None)
    out["step_at_fault"] = last_before
    own = pre_fault_rate(steps, num_slices, ft)
    if own:
        # The same cost as ``fault_cost_s`` (``T - W / r``) with the run's own pre-fault rate as ``r``.
        out["pre_fault_seconds_per_step"] = rnd(1 / own, 5)
        out["fault_cost_own_rate_s"] = rnd(wt[1] - wt[0] / own)
    out["recovery_s"] = rnd(regained["t"] - ft) if regained else None
    out["lost_steps"] = max(0, s_star - int(r["from_step"])) if r else 0
    out["restored_from"] = r.get("restored_from") if r else None
    out["slices_after"] = len(r["slices"]) if r else None
    return out


# ---------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------


def _row(cfg: Config, trainer: str, strategy: str, fault: str, period: int, delay: float) -> dict[str, Any]:
    return {
        "trainer": trainer,
        "strategy": strategy,
        "fault": fault,
        "replacement_delay": delay,
        "checkpoint_period": period,
        "state_bytes": cfg.state_bytes(),
        "donate": cfg.donate,
        **(
            {"snapshot_every": "auto" if cfg.snapshot_every == AUTO else cfg.snapshot_every}
            if strategy == "sidecar"
            else {}
        ),
    }


def summarise(
    cfg: Config, runs: list[dict[str, Any]], refs: dict[tuple[str, int], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """One row per (strategy, fault, period, delay), fault cost against the fault-free rate."""
    rows = []
    for fault, period, delay in cfg.cases() if "example" in cfg.trainers else []:
        for s in cfg.strategies:
            row = _row(cfg, "example", s, fault, period, delay)
            ran_as = "kill" if fault == "notice" and s != "sidecar" else fault
            if ran_as != fault:
                row["ran_as"] = ran_as
                row["note"] = "does not listen to notices: the host dies at the deadline, as in its kill runs"
            every = [
                r
                for r in runs
                if r["strategy"] == s
                and r["fault"] == ran_as
                and r["checkpoint_period"] == period
                and r["replacement_delay"] == delay
            ]
            fields, ok, good_refs, rate = fault_cost(every, refs.get((s, period), []))
            fields["lost_steps_median"] = cost_round(fields["lost_steps_median"])
            own = [r["fault_cost_own_rate_s"] for r in ok if r.get("fault_cost_own_rate_s") is not None]
            fields["fault_cost_own_rate_seconds_median"] = rnd(median(own)) if own else None
            fields["fault_cost_own_rate_runs"] = len(own)
            row.update(fields)
            row["restored_from"] = sorted({str(r.get("restored_from")) for r in ok})
            if not rate:
                row["invalid_reason"] = "no fault-free reference run succeeded"
            steady = [r["steady_seconds_per_step"] for r in good_refs if r.get("steady_seconds_per_step")]
            if steady:
                # What goodput weighs: the fault-free runs' rate past their start (SETTLE_STEPS).
                row["steady_step_seconds_median"] = rnd(median(steady), 5)
                row["steady_step_source"] = f"fault-free runs from {SETTLE_STEPS} steps past the warm-up"
            snaps = [r.get("snapshot_seconds_median") for r in ok + good_refs if r.get("snapshot_seconds_median")]
            if snaps:
                row["snapshot_seconds_median"] = rnd(median(snaps), 5)
            rows.append(row)
    return rows


def cost_round(x: float | None) -> float | None:
    return None if x is None else (int(x) if float(x).is_integer() else x)


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Baseline fault cost over the sidecar's, per (trainer, fault, period, delay): medians of fault cost only."""
    out = []
    for side in (r for r in rows if r["strategy"] == "sidecar" and r.get("runs")):
        c = side["fault_cost_seconds_median"]
        for b in rows:
            if b["strategy"] == "sidecar" or not b.get("runs"):
                continue
            key = ("trainer", "fault", "checkpoint_period", "replacement_delay")
            if any(b[k] != side[k] for k in key):
                continue
            v = b["fault_cost_seconds_median"]
            ok = c is not None and v is not None and c > 0
            out.append(
                {
                    **{k: side[k] for k in key},
                    "baseline": b["strategy"],
                    "baseline_fault_cost_seconds_median": v,
                    "sidecar_fault_cost_seconds_median": c,
                    "ratio": rnd(v / c, 2) if ok else None,
                    **({} if ok else {"why_none": "sidecar fault cost not above zero (or missing)"}),
                }
            )
    return out


def run(
    quick: bool = False,
    workdir: Path | None = None,
    keep: bool = False,
    **over: Any,
) -> dict[str, Any]:
    cfg = Config.make(quick, **over)
    root = Path(workdir or tempfile.mkdtemp(prefix="bench-recovery-"))
    root.mkdir(parents=True, exist_ok=True)
    # Before any run: the pages it writes are freed again long before a fault (see fresh_memory_seconds).
    fresh = fresh_memory_seconds(1 if cfg.quick else FRESH_MEMORY_GIB) if "example" in cfg.trainers else []
    t0 = time.monotonic()
    runs: list[dict[str, Any]] = []
    refs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    cases = cfg.cases()
    if "example" in cfg.trainers:
        for rep in range(cfg.runs):
            # Fault-free references first in each round (their rate sizes the faulted runs), then every
            # case with the strategies interleaved, so drift on a shared machine hits them alike.
            for period in cfg.checkpoint_periods if rep < (cfg.fault_free_runs or cfg.runs) else []:
                for s in cfg.strategies:
                    if not cfg.runs_at_period(s, period):
                        continue  # no faulted run of this strategy at this period needs the reference
                    n = cfg.fault_free_steps or max(100, 3 * period) + SETTLE_STEPS
                    log(f"recovery: {s} fault-free, period {period}, round {rep + 1}/{cfg.runs}")
                    ref = run_one(
                        cfg, s, period, root, f"ref-{s}-p{period}-r{rep}", fault=None, at_step=0, delay=0.0, steps=n
                    )
                    refs.setdefault((s, period), []).append(ref)
            for fault, period, delay in cases:
                at = fault_step(cfg, period, rep)
                for s in cfg.strategies:
                    if fault == "notice" and s != "sidecar":
                        continue  # baselines ignore notices: their kill runs stand for it (see the rows)
                    if not cfg.runs_at(s, period, delay):
                        continue
                    step_s = median(x["seconds"] / x["work_steps"] for x in refs[(s, period)] if x.get("work_steps"))
                    step_s = max(cfg.step_seconds, step_s or cfg.step_seconds)
                    steps = at + math.ceil(post_fault_seconds(cfg, s, period, step_s, delay) / step_s)
                    log(f"recovery: {s} {fault}@{at} period {period} delay {delay:g}s round {rep + 1}/{cfg.runs}")
                    m = run_one(
                        cfg,
                        s,
                        period,
                        root,
                        f"{s}-{fault}-p{period}-d{delay:g}-r{rep}",
                        fault=fault,
                        at_step=at,
                        delay=delay,
                        steps=steps,
                        step_s=step_s,
                    )
                    log(
                        f"  -> lost {m.get('lost_steps')}, recovery {m.get('recovery_s')} s"
                        f"{' ERROR ' + m['error'] if m.get('error') else ''}"
                    )
                    runs.append(m)
            _notice_kill_runs(cfg, cases, runs, refs, root, rep)
    rows = summarise(cfg, runs, refs)
    for r in [*runs, *(x for v in refs.values() for x in v)]:
        r["trainer"] = "example"
    maxtext: dict[str, Any] = {}
    if "maxtext" in cfg.trainers:
        from bench import recovery_maxtext

        maxtext = recovery_maxtext.run(
            strategies=cfg.strategies,
            cases=cases,
            runs=cfg.runs,
            seed=cfg.seed,
            root=root / "maxtext",
            model=cfg.maxtext_model,
            min_slices=cfg.maxtext_min_slices,
            fault_free_runs=cfg.fault_free_runs or None,  # 0: every round
            local_checkpoint_period=cfg.local_checkpoint_period,
        )
        rows += maxtext["rows"]
        runs += maxtext["runs"]
    result = {
        "name": NAME,
        "quick": cfg.quick,
        "config": asdict(cfg)
        | {
            "state_bytes": cfg.state_bytes(),
            "ballast_mib_per_replica": cfg.ballast_mib(),
            "cases": cases,
            "fresh_memory_seconds": fresh,
        }
        | ({"maxtext": maxtext["config"]} if maxtext else {}),
        "results": rows,
        "ratios": ratios(rows),
        "runs": runs,
        "fault_free_runs": [x for v in refs.values() for x in v] + maxtext.get("fault_free_runs", []),
        "duration_s": round(time.monotonic() - t0, 1),
    }
    if not keep and not workdir:
        shutil.rmtree(root, ignore_errors=True)
    return label_maxtext_model(result)


def _notice_kill_runs(
    cfg: Config,
    cases: list[tuple[str, int, float]],
    runs: list[dict[str, Any]],
    refs: dict[tuple[str, int], list[dict[str, Any]]],
    root: Path,
    rep: int,
) -> None:
    """Kill runs for the baselines' notice rows when the kill sweep did not cover that (period, delay)."""
    for fault, period, delay in cases:
        if fault != "notice" or ("kill", period, delay) in cases:
            continue
        at = fault_step(cfg, period, rep)
        for s in cfg.strategies:
            if s == "sidecar":
                continue
            step_s = median(x["seconds"] / x["work_steps"] for x in refs[(s, period)] if x.get("work_steps"))
            step_s = max(cfg.step_seconds, step_s or cfg.step_seconds)
            steps = at + math.ceil(post_fault_seconds(cfg, s, period, step_s, delay) / step_s)
            log(f"recovery: {s} kill@{at} (for its notice row) period {period} delay {delay:g}s")
            runs.append(
                run_one(
                    cfg,
                    s,
                    period,
                    root,
                    f"{s}-kill-p{period}-d{delay:g}-r{rep}",
                    fault="kill",
                    at_step=at,
                    delay=delay,
                    steps=steps,
                    step_s=step_s,
                )
            )
