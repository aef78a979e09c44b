"""Recovery on the real MaxText: ``python -m bench recovery``; docs/recovery.md says what it runs and why.

One MaxText job on 4 CPU slices (:mod:`simjob.maxtext`) restores a pre-trained checkpoint
(:func:`pretrain`), loses a slice at a seeded phase of its checkpoint period (:func:`fault_index`) and
trains on; the :data:`STRATEGIES` differ only in how it recovers. A run is read from the step events
MaxText's patched loop appends (:func:`analyse`, :func:`recovery_phases`); a row gives medians over its
runs (:func:`summarise`), and a run that did not measure what it should is a failed run, never a figure.
"""

from __future__ import annotations

import math
import random
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.common import log, median, read_jsonl, rnd, spread, wait_until

STRATEGIES = ("full_restart", "checkpoint_rewind", "local_checkpoint_rewind", "sidecar")
FAULTS = ("kill", "notice")
NOTICE_STRATEGIES = ("sidecar",)
"""Only the sidecar delivers a maintenance notice to MaxText, which has no notice path of its own."""
WARMUP_STEP = 3
"""Completed steps after which work is counted (the first steps compile)."""
TAIL_STEPS = 60
"""Steps a run goes on after its fault, at least :data:`LOCAL_TAIL_STEPS` new ones."""
LOCAL_TAIL_STEPS = 50
"""New steps past the fault and the return to every slice that close the fault cost's window: the steps
right after a restore (re-traces, cold caches) fall in it."""
LEAD_STEPS = 200
"""Steps each run trains from the pre-trained checkpoint before its faulted period: its own step time."""
GROW_TAIL_STEPS = 2000
"""The tail when the job goes on on the survivors: it must still run when the replacement comes and
pathwaysutils' monitor (10 s poll) grows it back; a run that ends before that is a failed run."""
SLICES = 4
DEVICES = 8
LOST_SLICE = 1
LOCAL_CHECKPOINT_PERIOD = 20
"""MaxText's example ``local_checkpoint_period`` (its multi-tier checkpointing guide). The local rewind stands
in for Orbax's emergency and multi-tier checkpointing, neither of which runs single-controller: the emergency
``CheckpointManager`` writes only the persistent tier, the ``ReplicatorCheckpointManager`` fails its first save."""
MESH_FLAGS = ("dcn_data_parallelism=-1", "ici_fsdp_parallelism=-1")
ELASTIC_FLAGS = ("elastic_enabled=true", "enable_single_controller=true")
START_SECONDS = 240.0
"""The longest a MaxText process may take from its start to its first step, on a loaded machine."""


@dataclass(frozen=True)
class Job:
    """The MaxText job every strategy runs: model, checkpoint period, steps."""

    model: str
    checkpoint_period: int
    min_slices: int = -1
    """MaxText's ``elastic_min_slice_count``: -1 waits for every slice, 1 continues on the survivor."""
    local_checkpoint_period: int = LOCAL_CHECKPOINT_PERIOD

    def __post_init__(self) -> None:
        if self.checkpoint_period < 1:
            raise ValueError(f"checkpoint_period={self.checkpoint_period}: expected a whole number of steps >= 1")
        if self.min_slices != -1 and not 1 <= self.min_slices <= SLICES:
            raise ValueError(f"min_slices={self.min_slices}: expected -1 (every slice) or 1..{SLICES}")
        if self.local_checkpoint_period < 1:
            raise ValueError(f"local_checkpoint_period={self.local_checkpoint_period}: expected a whole number >= 1")

    @property
    def lead(self) -> int:
        return min(LEAD_STEPS, self.checkpoint_period)

    @property
    def first_period_end(self) -> int:
        """Completed steps where the faulted period starts: a multiple of the period past the lead."""
        p = self.checkpoint_period
        return p * math.ceil((self.lead + WARMUP_STEP + 5) / p)

    @property
    def start_label(self) -> int:
        """The pre-trained checkpoint every run restores (:func:`pretrain`), :attr:`lead` steps before the
        faulted period: a save still in flight at the fault leaves this one, as it leaves the save before."""
        return self.first_period_end - self.lead

    def tail(self, strategy: str) -> int:
        return TAIL_STEPS if self.min_slices == -1 or strategy == "full_restart" else GROW_TAIL_STEPS

    def steps_for(self, fault_step: int, strategy: str) -> int:
        return fault_step + self.tail(strategy)


def fault_index(job: Job, seed: int, rep: int, runs: int = 1) -> int:
    """Step index (= completed steps) in which the slice is lost: a seeded phase of the period.

    MaxText saves after step index ``k * period``, so index ``first_period_end + 1 + r`` is ``r`` steps past
    that save. Round ``rep`` of ``runs`` draws from the ``rep``-th of ``runs`` equal parts of the period, so
    the rounds cover it as faults at any time do (the rewind's lost work grows with the phase)."""
    if runs < 1:
        raise ValueError(f"runs={runs}: expected a whole number >= 1")
    rng = random.Random(f"{seed}/maxtext/{job.checkpoint_period}/{rep}")
    part = (rep % runs + rng.random()) / runs
    return job.first_period_end + 1 + min(job.checkpoint_period - 1, int(part * job.checkpoint_period))


def maxtext_flags(job: Job, strategy: str, delay: float) -> list[str]:
    """The strategy's MaxText arguments beyond the job's own (elastic or not)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown MaxText strategy {strategy!r}: expected one of {list(STRATEGIES)}")
    period = job.local_checkpoint_period if strategy == "local_checkpoint_rewind" else job.checkpoint_period
    flags = [f"checkpoint_period={period}", *MESH_FLAGS]
    if strategy != "full_restart":
        # A loss on a shrinking job costs two attempts (the shrink, then the scale-up), and pathwaysutils
        # counts every attempt against elastic_max_retries (FACTS section 2): room for one more of each.
        retries = 3 if job.min_slices == -1 else 5
        flags += [
            *ELASTIC_FLAGS,
            f"elastic_min_slice_count={job.min_slices}",
            f"elastic_max_retries={retries}",
            f"elastic_timeout_seconds={int(max(60.0, 2 * delay + 40))}",
        ]
    return flags


# ---------------------------------------------------------------------------
# reading one run
# ---------------------------------------------------------------------------


def analyse(
    events: Sequence[dict[str, Any]],
    *,
    steps: int,
    fault_step: int,
    replacement_time: float | None = None,
    reference_steps: int = 300,
    local_tail: int = LOCAL_TAIL_STEPS,
) -> dict[str, Any]:
    """One faulted run's figures from its event log (``step`` / ``fault`` / ``mesh`` lines, wall-clock ``t``).

    ``error`` says why the run does not measure what it should; its figures are then not used."""
    out: dict[str, Any] = {"lost_steps": None, "recovery_s": None}
    done = sorted((e for e in events if e.get("kind") == "step"), key=lambda e: e["t"])
    # Steps count from the run's start: 0, or the completed steps of the checkpoint it restored first.
    warm = min((e["step"] for e in done), default=1) - 1 + WARMUP_STEP
    if not any(e["step"] == warm for e in done):
        out["error"] = f"no step {warm} (the end of the warm-up) in the event log"
        return out
    full = max((int(e.get("devices") or 0) for e in done), default=0)
    faults_at = [float(e["t"]) for e in events if e.get("kind") == "fault"]
    last_run: dict[int, dict[str, Any]] = {}  # a step completed again after a rewind replaces the earlier one
    lost = rewinds = high = 0
    for prev, e in zip([None, *done], done, strict=False):
        lost += e["step"] <= high
        rewinds += prev is not None and e["step"] <= prev["step"]
        high = max(high, e["step"])
        last_run[e["step"]] = e

    def weight(e: dict[str, Any]) -> float:  # a step on fewer slices is that share of the job's work
        return int(e["devices"]) / full if full and e.get("devices") else 1.0

    kept = [e for k, e in last_run.items() if k > warm]
    out["work_steps"] = rnd(sum(weight(e) for e in kept), 3)
    out["shrunk_steps"] = sum(weight(e) < 1.0 for e in kept)
    last = max(e["step"] for e in done)
    if last != steps:
        out["error"] = f"training did not finish: last completed step {last}, expected {steps}"
        return out
    if not faults_at:
        out["error"] = f"no fault happened (expected slice loss in step index {fault_step})"
        return out
    ft = faults_at[0]
    out["mesh_slices_before"], out["mesh_slices_after"] = mesh_slices(events, ft)
    before = max((e["step"] for e in done if e["t"] <= ft), default=0)
    if before != fault_step:
        out["error"] = f"the fault hit with {before} steps completed, expected {fault_step}"
        return out
    after = [e for e in done if e["t"] > ft]
    if not after:
        out["error"] = "no step completed after the fault"
        return out
    regained = next(e for e in after if e["step"] > before)
    out.update(step_at_fault=before, restored_step=after[0]["step"] - 1, lost_steps=lost, rewinds=rewinds)
    out["recovery_s"] = rnd(regained["t"] - ft)
    back = regained
    if replacement_time is not None:
        out["replacement_after_s"] = rnd(replacement_time - ft)
        out["recovery_after_replacement_s"] = rnd(regained["t"] - replacement_time)
        # Back on every slice: a step on all the job's devices after the replacement; a run that ends before
        # it would leave the grow out of its cost.
        grown = next((e for e in after if e["t"] > replacement_time and weight(e) == 1.0), None)
        if full and grown is None:
            out["error"] = "training ended before the job was back on every slice after the replacement"
            return out
        if grown is not None:
            back = grown
            out["back_on_every_slice_after_replacement_s"] = rnd(grown["t"] - replacement_time)
    # The fault cost: the window from the last step before the fault to `local_tail` new steps past both the
    # fault and the return to every slice, less its work at this run's own step time before the fault (over
    # `reference_steps`: one checkpoint period holds one periodic save, as the long-term step time does).
    pre = {e["step"]: e["t"] for e in done if e["t"] <= ft}
    n_ref = min(reference_steps, before - warm)
    if n_ref < 10 or before - n_ref not in pre:
        out["local_note"] = f"too few steps before the fault for its own step time: {n_ref} past the warm-up"
        return out
    ref_s = (pre[before] - pre[before - n_ref]) / n_ref
    target = min(max(before, back["step"]) + local_tail, last)
    window = [e for k, e in last_run.items() if before < k <= target]
    cost = (last_run[target]["t"] - pre[before]) - sum(weight(e) for e in window) * ref_s
    out["own_step_s"], out["own_step_reference_steps"] = rnd(ref_s, 6), n_ref
    out["local_window_s"] = rnd(last_run[target]["t"] - pre[before], 3)
    out["local_window_work_steps"] = rnd(sum(weight(e) for e in window), 3)
    out["local_window_tail_steps"] = target - max(before, back["step"])
    out["fault_cost_s"] = rnd(cost, 3)
    return out


def recovery_phases(
    events: Sequence[dict[str, Any]], decided: float | None = None, held: Sequence[float] = ()
) -> dict[str, float]:
    """A faulted run's recovery split into phases (seconds), from its event log (wall-clock ``t``).

    ``detect``: the fault (or notice) to the decision: ``decided`` (the sidecar's), else the failed step's
    error surfacing in MaxText (``step_failed``; 0 without one: the time then falls in ``hold``). ``hold``: the
    decision to the trainer held (the hook's HeldAck, a time in ``held``), else to the start of the attempt that
    builds the next mesh (the failed attempt has ended; for a full restart, the new process has started), else
    to that mesh: so every strategy's ``rebuild`` holds MaxText's re-initialise (``elastic_retry``'s slice check,
    the config, the mesh) as well as its compiles.
    ``restore``: the attempt's ``load_state_if_possible`` (a snapshot or a checkpoint). ``first_step``: the
    attempt's first step less the compiles in it. ``rebuild``: the rest up to that step (re-initialise,
    compile). They sum to the fault to the first step. A job that goes on on fewer slices adds ``degraded``
    (its first step there to the grow: a HeldAck, else its last step there) and the grow's ``grow_rebuild``,
    ``grow_restore`` and ``grow_first_step``."""
    evs = sorted(events, key=lambda e: float(e["t"]))
    fault = next((e for e in evs if e.get("kind") == "fault"), None)
    if fault is None:
        return {}
    ft = float(fault["t"])
    surfaced = next((float(e["t"]) for e in evs if e.get("kind") == "step_failed" and float(e["t"]) >= ft), ft)
    d = decided if decided is not None else surfaced
    first = _attempt(evs, d, next((h for h in held if h >= d), None))
    if first is None:
        return {}
    out = {"detect": d - ft, **first[0]}
    full = max(int(e.get("devices") or 0) for e in evs if e.get("kind") == "step")
    if int(first[1].get("devices") or full) < full:
        t1 = float(first[1]["t"])
        back = next(
            (e for e in evs if e.get("kind") == "step" and float(e["t"]) > t1 and e.get("devices") == full), None
        )
        if back is not None:
            shrunk = [float(e["t"]) for e in evs if e.get("kind") == "step" and t1 <= float(e["t"]) < float(back["t"])]
            grow_at = next((h for h in held if t1 < h < float(back["t"])), shrunk[-1])
            grow = _attempt(evs, grow_at, grow_at)
            out["degraded"] = grow_at - t1
            out.update({f"grow_{k}": v for k, v in (grow[0] if grow else {}).items() if k != "hold"})
    return {k: round(v, 3) for k, v in out.items()}


def _attempt(evs: Sequence[dict[str, Any]], after: float, held: float | None) -> tuple[dict[str, float], dict] | None:
    """The phases of the first attempt that builds its mesh after ``after`` (:func:`recovery_phases`), and its
    first step's event; None if it never completed a step."""

    def first(kind: str, since: float) -> dict[str, Any] | None:
        return next((e for e in evs if e.get("kind") == kind and float(e["t"]) > since), None)

    mesh = first("mesh", after)
    start = first("state", float(mesh["t"])) if mesh else None
    step = first("step", float(start["t"])) if start else None
    if mesh is None or start is None or step is None:
        return None
    m, s, t1 = float(mesh["t"]), float(start["t"]), float(step["t"])

    def seconds(kind: str, lo: float, hi: float) -> float:
        return sum(float(e["seconds"]) for e in evs if e.get("kind") == kind and lo < float(e["t"]) <= hi)

    begun = [float(e["t"]) for e in evs if e.get("kind") == "attempt" and after < float(e["t"]) <= m]
    h = held if held is not None else begun[-1] if begun else m
    restore = seconds("restore", m, s)
    first_step = max(0.0, (t1 - s) - seconds("compile", s, t1))
    return {
        "hold": h - after,
        "rebuild": t1 - h - restore - first_step,
        "restore": restore,
        "first_step": first_step,
    }, step


def mesh_slices(events: Sequence[dict[str, Any]], fault_t: float) -> tuple[int | None, int | None]:
    """The slices of the newest mesh MaxText built before the fault and of the first one after it."""
    meshes = sorted((e for e in events if e.get("kind") == "mesh"), key=lambda e: float(e["t"]))
    before = [int(e["slices"]) for e in meshes if float(e["t"]) <= fault_t]
    after = [int(e["slices"]) for e in meshes if float(e["t"]) > fault_t]
    return (before[-1] if before else None), (after[0] if after else None)


def snapshot_cost(finished: dict[str, Any] | None) -> dict[str, Any]:
    """The hook's ``finished`` figures about its snapshots: how many it saved, skipped (one still copying) and
    saw fail, the interval it ended on, its own measure of the snapshots' overhead and its own seconds a step."""
    if not finished or not finished.get("snapshots"):
        return {}
    names = (
        ("snapshots", "snapshots", int),
        ("snapshots_skipped", "snapshots_skipped", int),
        ("snapshots_failed", "snapshots_failed", int),
        ("snapshot_every_now", "snapshot_every", lambda v: v),
        ("snapshot_overhead_fraction", "hook_overhead_fraction", lambda v: rnd(v, 4)),
        ("hook_seconds_per_step", "hook_seconds_per_step", lambda v: rnd(v, 7)),
    )
    return {name: conv(finished[key]) for key, name, conv in names if finished.get(key) is not None}


# ---------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------


def _base_row(strategy: str, fault: str, period: int, delay: float, model: str, min_slices: int) -> dict[str, Any]:
    return {
        "trainer": "maxtext",
        "strategy": strategy,
        "fault": fault,
        "replacement_delay": delay,
        "checkpoint_period": period,
        "model": model,
        "elastic_min_slice_count": min_slices,
    }


def not_run_row(
    strategy: str, fault: str, period: int, delay: float, model: str, why: str, min_slices: int = -1
) -> dict[str, Any]:
    empty = dict.fromkeys(("lost_steps_median", "fault_cost_seconds_median", "fault_cost_seconds_p90"))
    row = {**_base_row(strategy, fault, period, delay, model, min_slices), "runs": 0, "failed_runs": 0, **empty}
    return row | {"recovery_seconds_median": None, "status": "not_run", "invalid_reason": why}


def summarise(
    strategy: str,
    fault: str,
    period: int,
    delay: float,
    model: str,
    runs: Sequence[dict[str, Any]],
    min_slices: int = -1,
) -> dict[str, Any]:
    """One row: the medians (and spreads) of ``runs``' figures, leaving out the runs with an error."""
    row = _base_row(strategy, fault, period, delay, model, min_slices)
    ok = [r for r in runs if not r.get("error")]
    lost, rec = spread([r["lost_steps"] for r in ok]), spread([r["recovery_s"] for r in ok])
    cost = spread([r.get("fault_cost_s") for r in ok])

    def mid(key: str, digits: int = 3) -> float | None:
        return rnd(median(r.get(key) for r in ok), digits)

    row.update(
        {
            "runs": len(ok),
            "failed_runs": len(runs) - len(ok),
            "failures": sorted({r["error"] for r in runs if r.get("error")}),
            "fault_steps": sorted(r["fault_step"] for r in runs if r.get("fault_step") is not None),
            "lost_steps_median": lost["median"],
            "lost_steps_max": lost["max"],
            "recovery_seconds_median": rnd(rec["median"], 3),
            "recovery_seconds_p90": rnd(rec["p90"], 3),
            "recovery_after_replacement_seconds_median": mid("recovery_after_replacement_s"),
            "back_on_every_slice_after_replacement_seconds_median": mid("back_on_every_slice_after_replacement_s"),
            **{f"fault_cost_seconds_{k}": rnd(cost[k], 3) for k in ("median", "p90", "min", "max")},
            "shrunk_steps_median": median(r.get("shrunk_steps") for r in ok),
            "own_step_seconds_median": mid("own_step_s", 6),
            "local_window_work_steps_median": mid("local_window_work_steps"),
        }
    )
    if not ok:
        row["invalid_reason"] = "no faulted run measured what it should: " + "; ".join(row["failures"])
    for key in ("params", "state_bytes"):
        seen = sorted({r[key] for r in runs if r.get(key)})
        if seen:
            row[key] = seen[0] if len(seen) == 1 else seen
    for key in ("mesh_slices_before", "mesh_slices_after"):
        m = median(r.get(key) for r in ok)
        row[key] = int(round(m)) if m is not None else None
    phases = [r["phases"] for r in ok if r.get("phases")]
    if phases:
        names = dict.fromkeys(k for p in phases for k in p)
        row["phase_seconds_median"] = {k: rnd(median(p[k] for p in phases if k in p), 3) for k in names}
    written = [r["flush_bytes"] for r in ok if r.get("flush_bytes") is not None]
    if written:
        row["flush_bytes_median"] = median(written)
    snaps = [r["snapshot"] for r in ok if r.get("snapshot")]
    if snaps:
        for key, name, digits in (
            ("hook_seconds_per_step", "hook_seconds_per_step_median", 7),
            ("hook_overhead_fraction", "snapshot_hook_overhead_fraction_median", 4),
            ("snapshots_skipped", "snapshots_skipped_median", 1),
        ):
            if (m := median(c.get(key) for c in snaps)) is not None:
                row[name] = rnd(m, digits)
        every = sorted({str(c["snapshot_every"]) for c in snaps if c.get("snapshot_every") is not None})
        if every:
            row["snapshot_every_seen"] = every
        row["snapshot_cost_runs"] = len(snaps)
    return row


# ---------------------------------------------------------------------------
# running MaxText
# ---------------------------------------------------------------------------


def run_one(
    job: Job,
    strategy: str,
    root: Path,
    tag: str,
    *,
    fault_step: int,
    delay: float,
    start: Path | None = None,
    fault: str = "kill",
) -> dict[str, Any]:
    """One MaxText job under ``strategy`` with a fault at ``fault_step``, read by :func:`analyse`.

    ``start``: the pre-trained checkpoint (:func:`pretrain`), copied into the run's checkpoint directory.
    ``fault``: ``kill`` (the slice dies in step ``fault_step``) or ``notice`` (the sidecar only: a maintenance
    notice for the slice's node once ``fault_step`` steps are done; the replacement registers ``delay``
    seconds after the job went on without it)."""
    from agent.core.model import (
        NodeNotice,
        TrainerFlushed,
        TrainerHeld,
        TrainerResumed,
        TrainerSliceError,
        WorkerJoined,
    )
    from simjob.maxtext import cpu_elastic
    from simjob.maxtext.job import PATCHED_MODULE, MaxTextRun, Sidecar, maxtext_args

    wd = root / tag
    if wd.exists():
        shutil.rmtree(wd)
    (wd / "control").mkdir(parents=True)
    if start is not None:
        shutil.copytree(start, wd / "job" / "checkpoints" / start.name)
    events = wd / "events.jsonl"
    steps = job.steps_for(fault_step, strategy)
    args = maxtext_args(wd, "job", steps, *maxtext_flags(job, strategy, delay), model=job.model)
    env = {
        cpu_elastic.ENV: "1",
        cpu_elastic.ENV_SLICES: str(SLICES),
        cpu_elastic.ENV_EVENTS: str(events),
        cpu_elastic.ENV_CONTROL: str(wd / "control"),
    }
    fault_env = {cpu_elastic.ENV_FAIL_AT: f"{fault_step}:{LOST_SLICE}"} if fault == "kill" else {}
    sc = Sidecar(num_slices=SLICES) if strategy == "sidecar" else None
    procs: list[MaxTextRun] = []
    out: dict[str, Any] = {
        "trainer": "maxtext",
        "strategy": strategy,
        "fault_step": fault_step,
        "replacement_delay": delay,
        "tag": tag,
    }
    t0 = time.monotonic()
    replaced: float | None = None
    decided: float | None = None
    try:
        if sc is not None:
            for s in range(SLICES):
                sc.submit(WorkerJoined(s, 0, "inc-1", node=f"node-{s}"))
        first = MaxTextRun(
            "maxtext", args, wd, sidecar=sc, module=PATCHED_MODULE, env={**env, **fault_env}, devices=DEVICES
        )
        procs.append(first)
        budget = START_SECONDS + steps * 2.0 + delay + 60.0
        if sc is not None and fault == "notice":
            if not wait_until(
                lambda: any(e.get("step", 0) >= fault_step for e in read_jsonl(events)), budget, proc=first.proc
            ):
                out["error"] = f"step {fault_step} never completed; {first.name} exit code {first.poll()}"
            else:
                cpu_elastic.record(events, "fault", slice=LOST_SLICE, during="notice")
                deadline = time.monotonic() + 120.0
                sc.request(
                    NodeNotice("terminate_on_host_maintenance", "bench", f"node-{LOST_SLICE}", deadline=deadline)
                )
                decided = time.time()
                went_on = lambda: sc.applied(TrainerResumed, 0.0, lambda e: LOST_SLICE not in e.active)  # noqa: E731
                wait_until(went_on, budget, proc=first.proc)
                time.sleep(delay)
                replaced = time.time()  # a new host for the slice: the drained node is under maintenance
                sc.request(WorkerJoined(LOST_SLICE, 0, "inc-2", node=f"node-{LOST_SLICE}-new"))
        else:
            fault_ev = wait_until(
                lambda: next((e for e in read_jsonl(events) if e.get("kind") == "fault"), None), budget, proc=first.proc
            )
            if fault_ev is None:
                out["error"] = f"no fault event; {first.name} exit code {first.poll()}"
            else:
                due = float(fault_ev["t"]) + delay
                if strategy == "full_restart":
                    # The failed step ends the process (JobSet then recreates the job): wait for it, not longer
                    # than the replacement, and start a new MaxText process once the replacement is there.
                    try:
                        first.proc.wait(max(5.0, due - time.time()))
                    except subprocess.TimeoutExpired:  # still running at the replacement: the pods go
                        first.kill()
                    time.sleep(max(0.0, due - time.time()))
                    replaced = time.time()
                    procs.append(
                        MaxTextRun("maxtext-restart", args, wd, module=PATCHED_MODULE, env=env, devices=DEVICES)
                    )
                else:
                    time.sleep(max(0.0, due - time.time()))
                    (wd / "control" / "reconnect").touch()
                    replaced = time.time()
                    if sc is not None:
                        sc.request(WorkerJoined(LOST_SLICE, 0, "inc-2", node=f"node-{LOST_SLICE}"))
        last = procs[-1]
        try:
            code = last.proc.wait(max(10.0, budget - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:  # a hung run is a failed run
            last.kill()
            code = None
            out.setdefault("error", f"{last.name} did not finish within {budget:.0f} s; see {last.log}")
        if code not in (0, None):
            out.setdefault("error", f"{last.name} exited with {code}; see {last.log}")
    finally:
        for p in procs:
            p.kill()
        if sc is not None:
            sc.stop()
    evs = read_jsonl(events)
    noticed = next((float(e["t"]) for e in evs if e.get("kind") == "fault"), None)
    if fault == "notice" and noticed is not None:  # the steps done when the notice came
        fault_step = max((e["step"] for e in evs if e.get("kind") == "step" and float(e["t"]) <= noticed), default=0)
        out["fault_step"] = fault_step
    figures = analyse(
        evs, steps=steps, fault_step=fault_step, replacement_time=replaced, reference_steps=job.checkpoint_period
    )
    if "error" in out:
        figures.pop("error", None)
    out.update(figures)
    if noticed is not None:
        wall = time.time() - time.monotonic()
        if sc is not None and decided is None:
            decided = next((a.at + wall for a in sc.applied(TrainerSliceError)), None)
        held = [a.at + wall for a in sc.applied(TrainerHeld)] if sc is not None else []
        out["phases"] = recovery_phases(evs, decided, held)
        if sc is not None:  # what the sidecar's holds and flushes wrote to storage from the fault on
            acks = [a.event for a in [*sc.applied(TrainerHeld), *sc.applied(TrainerFlushed)] if a.at + wall >= noticed]
            out["flush_bytes"] = sum(int(a.flush_bytes) for a in acks)
    sizes = next((e for e in evs if e.get("kind") == "state"), {})
    out["params"], out["state_bytes"] = sizes.get("params"), sizes.get("state_bytes")
    finished = procs[-1].hook_lines("finished") if procs else []
    if finished:
        out["snapshot"] = snapshot_cost(finished[-1][1])
    out["run_wall_s"] = round(time.monotonic() - t0, 2)
    return out


def pretrain(job: Job, root: Path) -> Path:
    """Train the job once to :attr:`Job.start_label` and commit a checkpoint there; return its directory.

    Every run of the period restores a copy of it, so a run trains only its lead, the fault's phase and the
    tail: the steps before are the same in every run and strategy and would only be run again."""
    from simjob.maxtext import cpu_elastic
    from simjob.maxtext.job import PATCHED_MODULE, MaxTextRun, checkpoint_labels, maxtext_args

    label = job.start_label
    wd = root / f"mx-pretrain-p{job.checkpoint_period}"
    if wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    # A save after step index `label` (checkpoint_period=label), in a run of label + 1 steps.
    args = maxtext_args(wd, "job", label + 1, f"checkpoint_period={label}", *MESH_FLAGS, model=job.model)
    env = {cpu_elastic.ENV: "1", cpu_elastic.ENV_SLICES: str(SLICES), cpu_elastic.ENV_EVENTS: str(wd / "events.jsonl")}
    proc = MaxTextRun("maxtext-pretrain", args, wd, module=PATCHED_MODULE, env=env, devices=DEVICES)
    try:
        code = proc.proc.wait(START_SECONDS + label * 2.0)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"pre-training to step {label} did not finish; see {proc.log}") from None
    finally:
        proc.kill()
    if code != 0:
        raise RuntimeError(f"pre-training to step {label} exited with {code}; see {proc.log}")
    if label not in checkpoint_labels(wd, "job"):
        raise RuntimeError(
            f"pre-training committed no checkpoint {label} (committed: {checkpoint_labels(wd, 'job')}); see {proc.log}"
        )
    return wd / "job" / "checkpoints" / str(label)


def guarded(job: Job, strategy: str, root: Path, tag: str, **kw: Any) -> dict[str, Any]:
    """:func:`run_one`; a run that raises is a failed run with the exception as its reason, not a lost benchmark."""
    try:
        return run_one(job, strategy, root, tag, **kw)
    except Exception as e:  # noqa: BLE001 - recorded in the row's failures
        out = {"trainer": "maxtext", "strategy": strategy, "tag": tag, "lost_steps": None, "recovery_s": None}
        return out | {
            "fault_step": kw.get("fault_step"),
            "replacement_delay": kw.get("delay"),
            "error": f"{type(e).__name__}: {e}",
        }


def run(
    *,
    strategies: Sequence[str],
    cases: Sequence[tuple[str, int, float]],
    runs: int,
    seed: int,
    root: Path,
    model: str = "tiny",
    min_slices: int = -1,
    local_checkpoint_period: int | None = None,
) -> dict[str, Any]:
    """Every (fault, period, delay) case under every strategy, ``runs`` rounds; each ``kill`` case gets the
    sidecar's ``notice`` case beside it. Returns the rows and each run's figures."""
    from simjob.maxtext.job import MAXTEXT_PYTHON, MODELS

    lcp = LOCAL_CHECKPOINT_PERIOD if local_checkpoint_period is None else local_checkpoint_period
    if model not in MODELS:
        raise ValueError(f"unknown MaxText model size {model!r}: expected one of {sorted(MODELS)}")
    if unknown := [s for s in strategies if s not in STRATEGIES]:
        raise ValueError(f"unknown strategy {unknown}: expected some of {list(STRATEGIES)}")
    if bad := [c for c in cases if c[0] not in FAULTS]:
        raise ValueError(f"unknown fault in {bad}: expected one of {list(FAULTS)}")
    ours = list(strategies)

    def run_under(fault: str) -> list[str]:
        return ours if fault != "notice" else [s for s in ours if s in NOTICE_STRATEGIES]

    no_start: dict[int, str] = {}
    if ours and not MAXTEXT_PYTHON.exists():
        why = f"not run: no MaxText interpreter at {MAXTEXT_PYTHON} (python3.12 venv with maxtext[tpu]==0.2.5)"
        log(f"recovery maxtext: {why}")
        no_start = {p: why for _, p, _ in cases}
    if any(s in NOTICE_STRATEGIES for s in ours):
        cases = [*cases, *(("notice", p, d) for f, p, d in cases if f == "kill" and ("notice", p, d) not in cases)]
    jobs = {p: Job(model, p, min_slices=min_slices, local_checkpoint_period=lcp) for _, p, _ in cases}
    # A notice drains one slice: the job goes on on the others (from memory), so it must be allowed to.
    notice_min = SLICES - 1 if min_slices == -1 else min(min_slices, SLICES - 1)
    starts: dict[int, Path] = {}
    for period, job in jobs.items() if ours else []:
        if period in no_start:
            continue
        log(f"recovery maxtext: pre-training period {period} to step {job.start_label}")
        try:
            starts[period] = pretrain(job, root)
        except Exception as e:  # noqa: BLE001 - the period's rows say why they have no figure
            no_start[period] = f"not run: pre-training failed: {type(e).__name__}: {e}"
            log(f"recovery maxtext: {no_start[period]}")
    done: list[dict[str, Any]] = []
    for rep in range(runs):
        for fault, period, delay in cases:
            if period not in starts:
                continue
            job = jobs[period] if fault != "notice" else replace(jobs[period], min_slices=notice_min)
            at = fault_index(job, seed, rep, runs)
            for s in run_under(fault):
                log(f"recovery maxtext: {s} {fault}@{at} period {period} delay {delay:g}s round {rep + 1}/{runs}")
                tag = f"mx-{s}-{fault}-p{period}-d{delay:g}-r{rep}"
                r = guarded(job, s, root, tag, fault_step=at, delay=delay, start=starts[period], fault=fault)
                r.update({"fault": fault, "checkpoint_period": period})
                log(f"  -> lost {r.get('lost_steps')}, recovery {r.get('recovery_s')} s {r.get('error') or ''}")
                done.append(r)
    rows = []
    for fault, period, delay in cases:
        row_min = min_slices if fault != "notice" else notice_min
        for s in run_under(fault):
            if period in no_start:
                rows.append(not_run_row(s, fault, period, delay, model, no_start[period], row_min))
                continue
            key = (s, fault, period, delay)
            mine = [
                r for r in done if (r["strategy"], r["fault"], r["checkpoint_period"], r["replacement_delay"]) == key
            ]
            rows.append(summarise(s, fault, period, delay, model, mine, row_min))
    return {
        "rows": rows,
        "runs": done,
        "config": {
            "model": model,
            "slices": SLICES,
            "devices": DEVICES,
            "lost_slice": LOST_SLICE,
            "elastic_min_slice_count": min_slices,
            "start_label": {p: j.start_label for p, j in jobs.items()},
            "first_period_end": {p: j.first_period_end for p, j in jobs.items()},
            "tail_steps": Job(model, 1, min_slices=min_slices).tail("sidecar"),
            "tail_steps_full_restart": TAIL_STEPS,
            "warmup_step": WARMUP_STEP,
            "local_checkpoint_period": lcp,
            "snapshot_every": "the hook's default (auto)",
        },
    }
