"""Recovery on the real MaxText: ``python -m bench recovery``.

One job (maxtext[tpu]==0.2.5 on the CPU, :mod:`simjob.maxtext`): the tests'
tiny model (``--maxtext-model larger``: about ten times its parameters), eight
CPU devices in four slices of two, each device with its ``slice_index``
(:mod:`simjob.maxtext.cpu_elastic`), so MaxText builds its own multi-slice
mesh: the slices along ``data`` over DCN (``dcn_data_parallelism``), each
slice's devices along ``fsdp``, every slice a whole replica,
MaxText's own periodic checkpoint every ``checkpoint_period`` steps (async
Orbax), a fixed learning-rate schedule. The job is trained once per period to
:data:`LEAD_STEPS` before the faulted period starts and checkpointed there
(:func:`pretrain`); every run restores a copy of that checkpoint, trains to its
fault and on for a tail (:meth:`Job.steps_for`), so a long period costs each run
its phase, not the period's whole start. Only what happens on a fault differs:

* ``full_restart``: MaxText without ``elastic_enabled``; the failed step ends
  the process, and a new MaxText process (what JobSet starts) begins once the
  replacement slice is there (the replacement delay after the fault) and
  restores the last committed periodic checkpoint.
* ``checkpoint_rewind``: MaxText's own elastic mode (``elastic_enabled``,
  pathwaysutils ``Manager.elastic_retry``, ``elastic_min_slice_count=-1``): the
  next attempt waits for every slice (pathwaysutils polls every 10 s) and
  rewinds to the last committed periodic checkpoint.
  With ``--maxtext-min-slices 1`` (``elastic_min_slice_count=1``, both elastic
  strategies) the next attempt continues on the surviving slice instead, and
  when the replacement is back MaxText's ``maybe_elastic_scale_up`` raises
  ``ScaleUpSignalError`` at a step boundary: a second attempt, which rewinds to
  the last committed checkpoint again (FACTS section 1).
* ``local_checkpoint_rewind``: the same rewind, to a checkpoint MaxText saves
  every ``local_checkpoint_period`` steps (async Orbax, on the local disk
  here), in place of the periodic one, whose cost is the same with and without
  the fault. It stands in for Orbax's emergency or multi-tier checkpointing,
  neither of which runs in this single-controller set-up: with one process,
  Orbax's emergency ``CheckpointManager`` puts it in the primary replica, which
  writes only the persistent tier; the multi-tier ``ReplicatorCheckpointManager``
  fails its first save with "Please call initialize_distributed_to_device_ids()"
  (both tried with maxtext 0.2.5 on this CPU set-up).
* ``sidecar``: the same elastic MaxText served by ``trainer_hooks.maxtext``
  under a real coordinator (hosted by the benchmark process), with an
  in-memory snapshot before every step (``ELASTIC_SIDECAR_SNAPSHOT_EVERY``):
  the hook saves the snapshot of the failed step's boundary from the surviving
  slice's copies, and the next attempt restores it. With
  ``--maxtext-min-slices 1`` the coordinator adopts MaxText's
  ``elastic_min_slice_count``: the job continues on the survivor from the
  snapshot and grows back (``ScaleUpSignalError`` from the hook) from the
  snapshot of the step boundary where it grows.

The faults: ``kill``: slice :data:`LOST_SLICE` dies while step index F runs, as on Pathways
(:mod:`simjob.maxtext.cpu_elastic`): nothing is raised then, the step's donated state is gone, what
lived only on the slice is deleted and the ``DATA_LOSS`` error surfaces at MaxText's next read or
wait; pathwaysutils' own health computation finds the survivors. ``notice`` (the sidecar only:
MaxText has no notice path of its own): once F steps are done a maintenance notice names the slice's
node; the job drains it at a step boundary and goes on on the others from memory
(``elastic_min_slice_count`` at most 3 for these runs). F is at a seeded random phase of the period
that starts after the first periodic save of the run (a save still in flight then leaves the
pre-trained checkpoint, :data:`LEAD_STEPS` before it), the rounds' phases stratified over the period
(:func:`fault_index`); the replacement (the simulator reconnects the slice, and for the sidecar a
new worker registers) comes ``replacement_delay`` seconds after the fault (after the notice's
drain). ``hang`` is not run on MaxText (its rows say why), nor is the example trainer's
``memory_snapshot`` baseline. Every run starts with an empty compile cache (``jax_cache_dir``), as a
new job's: its rebuilds compile, none loads an earlier run's program.

Each faulted run's recovery is split into phases (:func:`recovery_phases`: ``detect``, ``hold``,
``rebuild``, ``restore``, ``first_step``, and when the job went on on fewer slices ``degraded`` and
the grow's own), rows give their medians (``phase_seconds_median``) and, for the sidecar, the bytes
its holds and flushes wrote to storage from the fault on (``flush_bytes_median``).

Every MaxText process appends its completed steps with wall-clock times to an
event log (:mod:`simjob.maxtext.cpu_elastic`), read the same way for every
strategy (:func:`analyse`). The fault cost is local: ``T - W * s0`` over a
window from the last step completed before the fault to the step
:data:`LOCAL_TAIL_STEPS` new steps past both the fault and the job's return to
every slice (``T`` its seconds, ``W`` the new steps kept in it), ``s0`` the
same run's own step time over the checkpoint period before the fault. Beside
it rows keep the whole-run measure, ``T - W / r0`` over the whole run against
the median rate ``r0`` of the same strategy's fault-free runs: on a shared VM those
rates differ between runs, which over a long run can move the whole-run cost by
more than the fault's; the local window's error
grows only with the work in it. Lost steps (completed steps run
again, over every rewind), recovery (fault to the first completed step past those completed at
the fault) and the same from the replacement. Each step event names the devices
its state spans: a step on three of the four slices counts as three quarters of
a step of work in ``W`` (its global batch is that share of the job's), so running
on the survivors is work at its real size. On this CPU such a step also takes less
time than a full one (the eight virtual devices share two cores), which a TPU slice would
not: rows give ``shrunk_steps`` and ``fault_cost_if_shrunk_steps_took_full_time``,
the cost had every shrunk step taken a fault-free step's time. A run that did not do what it
measures (no fault, training not finished, a non-zero exit) is counted in
``failed_runs`` with its reason, never as a figure. The sidecar rows also
report the snapshot's cost per step, as the hook measures it (``finished``
line): milliseconds and the fraction of the step time, over fault-free runs.

Every row also gives (issue 23): ``step_overhead_fraction_median``, the
strategy's steady step time over plain MaxText's (``full_restart``: no
elastic mode, no sidecar), minus 1, each the median over the strategy's
faulted runs of the mean step time from :data:`SETTLE_STEPS` past the
warm-up to the fault, less the slots of the periodic checkpoint every
strategy pays alike (:func:`steady_before_fault`; ``steady_step_source``
says which runs, and falls back to the fault-free runs); ``period_cost_seconds_median``, each run's
fault cost with every step on fewer slices counted at the full-slice rate
(``..._if_shrunk_steps_took_full_time``) plus the steady overhead over one
checkpoint period (``(steady - plain) * checkpoint_period``), the median over
runs; and ``mesh_slices_before`` / ``mesh_slices_after``, the slices of the
mesh MaxText built before the fault and for the first attempt after it (the
``mesh`` events). ``local_checkpoint_rewind`` checkpoints every
:data:`LOCAL_CHECKPOINT_PERIOD` steps. The sidecar runs with the hook's shipped
snapshot interval (``auto``) unless :attr:`Job.snapshot_every` says otherwise.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.common import (
    consecutive_steps,
    cost_fields,
    fault_cost,
    git_state,
    log,
    median,
    portable_path,
    read_jsonl,
    rnd,
    spread,
)

STRATEGIES = ("full_restart", "checkpoint_rewind", "local_checkpoint_rewind", "sidecar")
FAULTS = ("kill", "notice")
NOTICE_STRATEGIES = ("sidecar",)
"""Only the sidecar delivers a maintenance notice to MaxText, which has no notice path of its own."""
NOT_RUN_STRATEGIES = {
    "memory_snapshot": (
        "not run on MaxText: MaxText has no in-memory snapshot of its own (elastic_backup_kind is not wired "
        "in 0.2.5); the sidecar row is the snapshot"
    ),
}
NOT_RUN_FAULTS = {
    "hang": (
        "not run on MaxText: pathwaysutils' DeviceLossSimulator only raises DATA_LOSS; there is no way here "
        "to hang one CPU slice inside a single MaxText process"
    ),
}
WARMUP_STEP = 3
"""Completed steps after which work is counted (the first steps compile)."""
TAIL_STEPS = 60
"""Steps after the faulted checkpoint period: the job runs on after any fault, for at least
:data:`LOCAL_TAIL_STEPS` new steps."""
LOCAL_TAIL_STEPS = 50
"""New steps past the fault (and past the job's return to every slice) that close the window of the
local fault cost (:func:`analyse`): enough for the steps right after a restore (the first ones
re-trace or refill caches) to be in it, few enough that the window stays short."""
SETTLE_STEPS = 100
"""Steps past the warm-up before a run's steady step time is measured (:func:`steady_before_fault`): the first
steps after a start fill caches, and the hook's ``auto`` measures its interval (a probe round every 9 steps)."""
MIN_STEADY_STEPS = 50
"""Fewest steps a run's steady step time before its fault is measured over."""
MIN_STEADY_RUNS = 3
"""Fewest faulted runs whose steady step times before the fault make a row's steady step time."""
LEAD_STEPS = 200
"""Steps each run trains from the pre-trained checkpoint (:func:`pretrain`) before its faulted
checkpoint period starts: the run's own step time before the fault is measured over them and the
phase (:func:`analyse`), and the training before it is done once per period, not in every run."""
GROW_TAIL_STEPS = 2000
"""The same when the job continues on the survivor (``min_slices`` 1): it must still be running when the
replacement comes, pathwaysutils' monitor (10 s poll) sees it and the job is back on both slices.
These steps leave time for that on the CPU; a run that ends before it is back
on every slice is a failed run (:func:`analyse`)."""
SLICES = 4
"""The job's slices: 8 CPU devices in 4 slices of 2 (:data:`simjob.maxtext.job.MULTI_SLICES`), each with its
``slice_index``, so MaxText builds its own multi-slice (DCN) mesh; the fault loses slice :data:`LOST_SLICE`."""
DEVICES = 8
LOST_SLICE = 1
LOCAL_CHECKPOINT_PERIOD = 20
"""``local_checkpoint_rewind``'s checkpoint every 20 steps: MaxText's own example value for its local
(emergency) checkpoints (``local_checkpoint_period`` in its multi-tier checkpointing guide)."""
MESH_FLAGS = ("dcn_data_parallelism=-1", "ici_fsdp_parallelism=-1")
"""The slices along MaxText's ``data`` axis (DCN), each slice's devices along ``fsdp``: every slice holds a whole
replica (:data:`simjob.maxtext.job.MULTI_SLICE_MESH`)."""
ELASTIC_FLAGS = ("elastic_enabled=true", "enable_single_controller=true")
START_SECONDS = 240.0
"""A MaxText process's start to its first step, on a loaded 2-core machine (about 20 s when idle)."""


@dataclass(frozen=True)
class Job:
    """The MaxText job every strategy runs: model, checkpoint period, steps."""

    model: str
    checkpoint_period: int
    snapshot_every: int | None = None
    """The sidecar's ``ELASTIC_SIDECAR_SNAPSHOT_EVERY``; None: the hook's shipped default (``auto``)."""
    min_slices: int = -1
    """MaxText's ``elastic_min_slice_count``: -1 waits for every slice, 1 continues on the survivor."""
    local_checkpoint_period: int = LOCAL_CHECKPOINT_PERIOD
    """``local_checkpoint_rewind``'s ``checkpoint_period``: a save this often (see the module doc)."""
    fault_free_steps: int | None = None
    """A fault-free run's ``steps`` (:mod:`bench.step_overhead`); None: through the faulted period's save."""

    def __post_init__(self) -> None:
        if self.checkpoint_period < 1:
            raise ValueError(f"checkpoint_period={self.checkpoint_period}: expected a whole number of steps >= 1")
        if self.min_slices != -1 and not 1 <= self.min_slices <= SLICES:
            raise ValueError(f"min_slices={self.min_slices}: expected -1 (every slice) or 1..{SLICES}")
        if self.local_checkpoint_period < 1:
            raise ValueError(f"local_checkpoint_period={self.local_checkpoint_period}: expected a whole number >= 1")
        if self.fault_free_steps is not None and self.fault_free_steps < 1:
            raise ValueError(f"fault_free_steps={self.fault_free_steps}: expected a whole number of steps >= 1")

    @property
    def lead(self) -> int:
        """Steps each run trains from the pre-trained checkpoint before its faulted period starts."""
        return min(LEAD_STEPS, self.checkpoint_period)

    @property
    def first_period_end(self) -> int:
        """Completed steps where the faulted period starts: a multiple of the period, at least
        :attr:`lead` steps past the warm-up of a run that starts from the pre-trained checkpoint."""
        p = self.checkpoint_period
        return p * math.ceil((self.lead + WARMUP_STEP + 5) / p)

    @property
    def start_label(self) -> int:
        """The label of the pre-trained checkpoint every run of this job restores at its start
        (:func:`pretrain`): :attr:`lead` steps before the faulted period's save. A save still in flight
        when the fault hits (an async Orbax commit takes a while) leaves this one, as in a long-running
        job it leaves the save before: only ``lead`` steps back here, not a whole period."""
        return self.first_period_end - self.lead

    def tail(self, strategy: str) -> int:
        """Steps past the fault: enough to be back on every slice when the job continues on the survivor."""
        return TAIL_STEPS if self.min_slices == -1 or strategy == "full_restart" else GROW_TAIL_STEPS

    def steps_for(self, fault_step: int | None, strategy: str) -> int:
        """A run's ``steps``: its fault and the tail after it; a fault-free run trains through the faulted
        period's save and :data:`TAIL_STEPS` more. Each run is as long as it must be: the fault cost is
        local (:func:`analyse`), so runs of different lengths measure the same thing."""
        if fault_step is None:
            return self.fault_free_steps or self.first_period_end + TAIL_STEPS
        return fault_step + self.tail(strategy)


def fault_index(job: Job, seed: int, rep: int, runs: int = 1) -> int:
    """Step index (= completed steps) in which the slice is lost: a seeded random phase of the period.

    MaxText saves after step index ``k * period`` (label k * period, ``k * period + 1`` completed), so
    index ``first_period_end + 1 + r`` is ``r`` steps (0 .. period - 1) past that save. The phases of
    ``runs`` rounds are stratified: round ``rep`` draws from the ``rep``-th of ``runs`` equal parts of
    the period, so five rounds cover the period as faults that land at any time do, rather than, by
    chance, all early or all late (the rewind's lost work grows with the phase, the sidecar's does not).
    """
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
    fault_step: int | None,
    replacement_time: float | None = None,
    reference_steps: int = 300,
    local_tail: int = LOCAL_TAIL_STEPS,
    save_every: int | None = None,
) -> dict[str, Any]:
    """One run's figures from its event log (``step`` / ``fault`` lines, wall-clock ``t``).

    ``save_every``: MaxText's periodic checkpoint, every strategy's alike, whose slots the steady step time
    before the fault leaves out (:func:`steady_before_fault`); None: none left out.

    ``error`` says why the run does not measure what it should; its figures are then not used.
    """
    out: dict[str, Any] = {"lost_steps": None, "recovery_s": None}
    done = [e for e in events if e.get("kind") == "step"]
    # Steps count from the run's start: 0, or the completed steps of the checkpoint it restored first.
    warm = min((e["step"] for e in done), default=1) - 1 + WARMUP_STEP
    start = next((e["t"] for e in done if e["step"] == warm), None)
    if start is None:
        out["error"] = f"no step {warm} (the end of the warm-up) in the event log"
        return out
    # The step events in time order; a step completed again after a rewind replaces the earlier one
    # (the kept state is the last one), and each earlier completion was lost work.
    done.sort(key=lambda e: e["t"])
    full = max((int(e.get("devices") or 0) for e in done), default=0)
    last_run: dict[int, dict[str, Any]] = {}
    seconds_of: dict[int, float] = {}  # a step's own time: since the step before it, in the same process
    lost = rewinds = high = 0
    prev: dict[str, Any] | None = None
    faults_at = [float(e["t"]) for e in events if e.get("kind") == "fault"]

    def same_attempt(a: dict[str, Any], b: dict[str, Any]) -> bool:
        # MaxText's elastic retries run in one process: a fault between two steps, or a change of the
        # devices the state spans (a shrink or a grow), starts a new attempt even when the steps follow on.
        return (
            a.get("pid") == b.get("pid")
            and a["step"] == b["step"] - 1
            and a.get("devices") == b.get("devices")
            and not any(a["t"] < f <= b["t"] for f in faults_at)
        )

    for e in done:
        lost += e["step"] <= high
        rewinds += prev is not None and e["step"] <= prev["step"]
        if prev is not None and same_attempt(prev, e):
            seconds_of[e["step"]] = e["t"] - prev["t"]
        else:  # the first step of an attempt: its time includes the restart
            seconds_of.pop(e["step"], None)
        high = max(high, e["step"])
        last_run[e["step"]] = e
        prev = e

    def weight(e: dict[str, Any]) -> float:
        return int(e["devices"]) / full if full and e.get("devices") else 1.0

    kept = [e for k, e in last_run.items() if k > warm]
    shrunk = [e for e in kept if weight(e) < 1.0]
    end = max(e["t"] for e in done)
    out["work_steps"] = rnd(sum(weight(e) for e in kept), 3) if shrunk else len(kept)
    out["seconds"] = rnd(end - start)
    out["shrunk_steps"] = len(shrunk)
    out["shrunk_seconds"] = rnd(sum(seconds_of.get(e["step"], 0.0) for e in shrunk), 3)
    last = max(e["step"] for e in done)
    out["last_step"] = last
    if last != steps:
        out["error"] = f"training did not finish: last completed step {last}, expected {steps}"
        return out
    if fault_step is None:
        out["mesh_slices_before"], _ = mesh_slices(events, None)
        out["steady_step_s"] = rnd(out["seconds"] / out["work_steps"], 6) if out["work_steps"] else None
        if any(e.get("kind") == "fault" for e in events):
            out["error"] = "a fault happened in a fault-free run"
        return out
    fault = next((e for e in events if e.get("kind") == "fault"), None)
    if fault is None:
        out["error"] = f"no fault happened (expected slice loss in step index {fault_step})"
        return out
    ft = float(fault["t"])
    out["mesh_slices_before"], out["mesh_slices_after"] = mesh_slices(events, ft)
    before = max((e["step"] for e in done if e["t"] <= ft), default=0)
    if before != fault_step:
        out["error"] = f"the fault hit with {before} steps completed, expected {fault_step}"
        return out
    after = [e for e in done if e["t"] > ft]
    if not after:
        out["error"] = "no step completed after the fault"
        return out
    restored = after[0]["step"] - 1  # the first step of the next attempt runs from its restored state
    regained = next(e for e in after if e["step"] > before)
    out["step_at_fault"] = before
    out["restored_step"] = restored
    out["lost_steps"] = lost  # every completed step run again, over every rewind (a scale-up's too)
    out["rewinds"] = rewinds
    out["recovery_s"] = rnd(regained["t"] - ft)
    back: dict[str, Any] | None = None
    if replacement_time is not None:
        out["replacement_after_s"] = rnd(replacement_time - ft)
        out["recovery_after_replacement_s"] = rnd(regained["t"] - replacement_time)
        if full:
            # Back on every slice: a step on all the job's devices after the replacement. A run that ends
            # before it would leave the grow out of its cost (as the example trainer's runs count it).
            back = next((e for e in after if e["t"] > replacement_time and weight(e) == 1.0), None)
            if back is None:
                out["error"] = "training ended before the job was back on every slice after the replacement"
                return out
            out["back_on_every_slice_after_replacement_s"] = rnd(back["t"] - replacement_time)
    back = back or regained
    # The local fault cost: from the last step completed before the fault to the step `local_tail` new
    # steps past both the fault and the return to every slice, less the work done in that window at this
    # run's own step time just before the fault (over `reference_steps` steps: one checkpoint period holds
    # exactly one periodic save, as the run's long-term step time does). The whole-run measure above
    # compares with other processes' rates, which differ between runs on a shared VM; the
    # error of this one grows with the window's work, not with the run's length.
    done_before = [e for e in done if e["t"] <= ft]
    pre = {e["step"]: e["t"] for e in done_before}
    steady = steady_before_fault(done_before, warm, before, save_every)
    if steady is not None:
        out["steady_step_s"], out["steady_reference_steps"] = rnd(steady[0], 6), steady[1]
    n_ref = min(reference_steps, before - warm)
    if n_ref < 10 or before - n_ref not in pre:  # the row then has the whole-run measure only
        out["local_note"] = f"too few steps before the fault for its own step time: {n_ref} past the warm-up"
        return out
    ref_s = (pre[before] - pre[before - n_ref]) / n_ref
    start_step = max(before, back["step"])
    target = min(start_step + local_tail, last)
    end = last_run[target]["t"]
    window = [e for k, e in last_run.items() if before < k <= target]
    work = sum(weight(e) for e in window)
    local = (end - pre[before]) - work * ref_s
    timed = [e for e in window if weight(e) < 1.0 and e["step"] in seconds_of]  # not an attempt's first step
    out["own_step_s"] = rnd(ref_s, 6)
    out["own_step_reference_steps"] = n_ref
    out["local_window_s"] = rnd(end - pre[before], 3)
    out["local_window_work_steps"] = rnd(work, 3)
    out["local_window_tail_steps"] = target - start_step
    out["local_fault_cost_s"] = rnd(local, 3)
    # Had each step on the survivor taken the run's own full step time (as on a TPU slice).
    out["local_fault_cost_if_shrunk_steps_took_full_time_s"] = rnd(
        local - sum(seconds_of[e["step"]] for e in timed) + len(timed) * ref_s, 3
    )
    return out


def recovery_phases(
    events: Sequence[dict[str, Any]], decided: float | None = None, held: Sequence[float] = ()
) -> dict[str, float]:
    """A faulted run's recovery split into phases (seconds), from its event log (wall-clock ``t``).

    ``detect``: the fault (or notice) to the decision: ``decided`` (the sidecar's), else the failed step's
    error surfacing in MaxText (``step_failed``; 0 without one: the time then falls in ``hold``). ``hold``: the
    decision to the trainer held (the hook's HeldAck, a time in ``held``), else to the next attempt's mesh (the
    failed attempt ends, ``elastic_retry`` waits for slices; for a full restart, the new process starts).
    When the replacement comes before the smaller mesh ran a step, ``rebuild`` holds both attempts.
    ``restore``: the attempt's ``load_state_if_possible`` (a snapshot or a checkpoint). ``first_step``: the
    attempt's first step less the compiles in it (MaxText compiles its train step at the first call).
    ``rebuild``: the rest up to that step (re-initialise, compile). They sum to the fault to the first step.
    A job that goes on on fewer slices adds ``degraded`` (its first step there to the grow: a HeldAck, else
    its last step there) and the grow's ``grow_rebuild``, ``grow_restore`` and ``grow_first_step``."""
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

    h = held if held is not None else m
    restore = seconds("restore", m, s)
    first_step = max(0.0, (t1 - s) - seconds("compile", s, t1))
    return {
        "hold": h - after,
        "rebuild": t1 - h - restore - first_step,
        "restore": restore,
        "first_step": first_step,
    }, step


def steady_before_fault(
    done: Sequence[dict[str, Any]], warm: int, before: int, save_every: int | None
) -> tuple[float, int] | None:
    """The run's steady step time before its fault: the mean of its steps' own times from
    :data:`SETTLE_STEPS` past the warm-up to the fault, less the slots of MaxText's periodic checkpoint
    (the completed steps ``k * save_every + 1 .. + 3``: its blocking save and the steps its commit runs
    beside), which every strategy pays alike; ``local_checkpoint_rewind``'s own saves stay in (they are
    its overhead), as do the sidecar's snapshots and the hook's measuring of their interval after the
    settling steps. None with fewer than :data:`MIN_STEADY_STEPS` such steps."""

    def periodic(step: int) -> bool:
        return bool(save_every) and (step - 1) % int(save_every) < 3 and step > 3

    # Each step's own time: since the step before it in the same process (``done``: the steps completed
    # before the fault, in time order).
    times = [
        float(b["t"]) - float(a["t"])
        for a, b in consecutive_steps(done)
        if warm + SETTLE_STEPS < b["step"] <= before and not periodic(b["step"])
    ]
    if len(times) < MIN_STEADY_STEPS:
        return None
    return sum(times) / len(times), len(times)


def mesh_slices(events: Sequence[dict[str, Any]], fault_t: float | None) -> tuple[int | None, int | None]:
    """The slices of the mesh MaxText built before the fault (the newest one by then) and for the first attempt
    after it (``mesh`` events of :mod:`simjob.maxtext.cpu_elastic`, from the devices' ``slice_index``); without
    a fault, the first mesh and None."""
    meshes = sorted((e for e in events if e.get("kind") == "mesh"), key=lambda e: float(e["t"]))
    if fault_t is None:
        return (int(meshes[0]["slices"]) if meshes else None), None
    before = [int(e["slices"]) for e in meshes if float(e["t"]) <= fault_t]
    after = [int(e["slices"]) for e in meshes if float(e["t"]) > fault_t]
    return (before[-1] if before else None), (after[0] if after else None)


def rotated(items: list[str], by: int) -> list[str]:
    """``items`` rotated left by ``by`` (modulo their number): round ``by``'s order of the strategies."""
    if not items:
        return []
    k = by % len(items)
    return items[k:] + items[:k]


def step_overhead_fraction(steady_s: float | None, plain_s: float | None) -> float | None:
    """A strategy's steady step time over plain MaxText's, minus 1 (None without both)."""
    if not steady_s or not plain_s:
        return None
    return steady_s / plain_s - 1.0


def period_costs(
    full_rate_costs: Sequence[float], steady_s: float | None, plain_s: float | None, period: int
) -> list[float]:
    """Each run's cost of one checkpoint period with its fault: the fault cost with every step on fewer slices
    counted at the full-slice rate, plus the strategy's steady overhead over the period's steps
    (``(steady - plain) * period``; the overhead is 0 for plain MaxText itself). Empty without both step times."""
    if period < 1:
        raise ValueError(f"period={period}: expected a whole number of steps >= 1")
    if not steady_s or not plain_s:
        return []
    overhead = (steady_s - plain_s) * period
    return [c + overhead for c in full_rate_costs]


def snapshot_cost(finished: dict[str, Any] | None) -> dict[str, Any]:
    """The hook's ``finished`` figures about its snapshots.

    The Orbax-Snapshotter hook (issue 23) reports how many saves it handed over, skipped (one still copying)
    and saw fail, the interval it ended on (``snapshot_every_now``) and its own measure of the snapshots'
    overhead (``snapshot_overhead_fraction``); the rows' ``step_overhead_fraction_median`` is the benchmark's
    own, against plain MaxText. An older hook's ``snapshot_seconds_mean``/``step_seconds_mean`` (a blocking
    copy per step) still give milliseconds per step."""
    if not finished or not finished.get("snapshots"):
        return {}
    out: dict[str, Any] = {}
    snap, step = finished.get("snapshot_seconds_mean"), finished.get("step_seconds_mean")
    if snap is not None and step:
        out.update(
            snapshot_ms_per_step=rnd(snap * 1e3, 3),
            step_ms=rnd(step * 1e3, 3),
            snapshot_fraction_of_step=rnd(snap / step, 4),
        )
    for key in ("snapshots_skipped", "snapshots_failed"):
        if finished.get(key) is not None:
            out[key] = int(finished[key])
    if finished.get("snapshot_every_now") is not None:
        out["snapshot_every"] = finished["snapshot_every_now"]
    if finished.get("snapshot_overhead_fraction") is not None:
        out["hook_overhead_fraction"] = rnd(float(finished["snapshot_overhead_fraction"]), 4)
    if finished.get("hook_seconds_per_step") is not None:
        out["hook_seconds_per_step"] = rnd(float(finished["hook_seconds_per_step"]), 7)
    return {"snapshots": int(finished["snapshots"]), **out} if out else {}


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
    return {
        **_base_row(strategy, fault, period, delay, model, min_slices),
        "runs": 0,
        "failed_runs": 0,
        "lost_steps_median": None,
        "fault_cost_seconds_median": None,
        "fault_cost_seconds_p90": None,
        "recovery_seconds_median": None,
        "step_overhead_fraction_median": None,
        "period_cost_seconds_median": None,
        "mesh_slices_before": None,
        "mesh_slices_after": None,
        "status": "not_run",
        "invalid_reason": why,
    }


def steady_step_seconds(
    runs: Sequence[dict[str, Any]], refs: Sequence[dict[str, Any]]
) -> tuple[float | None, str | None]:
    """A strategy's steady step time and where it comes from: the median of its faulted runs' steady step
    time before the fault (:func:`steady_before_fault`) when at least :data:`MIN_STEADY_RUNS` runs have one,
    else the median over its fault-free runs (seconds past the warm-up over their work: these hold the
    settling steps and a periodic checkpoint, and there is one a period by default)."""
    pre = [r["steady_step_s"] for r in runs if not r.get("error") and r.get("steady_step_s")]
    if len(pre) >= MIN_STEADY_RUNS:
        return median(pre), f"median over {len(pre)} faulted runs, before the fault"
    whole = [r["steady_step_s"] for r in refs if not r.get("error") and r.get("steady_step_s")]
    if whole:
        return median(whole), f"median over {len(whole)} fault-free runs, whole run"
    return None, None


def runs_at(runs: Sequence[dict[str, Any]], strategy: str, case: tuple[str, int, float]) -> list[dict[str, Any]]:
    """The faulted runs of ``strategy`` at ``case`` (fault, checkpoint period, replacement delay)."""
    return [
        r
        for r in runs
        if (r["strategy"], r["fault"], r["checkpoint_period"], r["replacement_delay"]) == (strategy, *case)
    ]


def plain_step_seconds(plain_refs: Sequence[dict[str, Any]], plain_runs: Sequence[dict[str, Any]] = ()) -> float | None:
    """Plain MaxText's steady step time: ``full_restart``'s (MaxText without elastic mode or the sidecar),
    as :func:`steady_step_seconds` reads it."""
    return steady_step_seconds(plain_runs, plain_refs)[0]


def summarise(
    strategy: str,
    fault: str,
    period: int,
    delay: float,
    model: str,
    runs: Sequence[dict[str, Any]],
    refs: Sequence[dict[str, Any]],
    min_slices: int = -1,
    plain_step_s: float | None = None,
) -> dict[str, Any]:
    """One row: fault cost of ``runs`` against the rate of the same strategy's fault-free ``refs``.

    ``plain_step_s``: plain MaxText's steady step time at this period (``full_restart``'s fault-free runs: no
    elastic mode, no sidecar), for ``step_overhead_fraction_median`` and ``period_cost_seconds_median``."""
    row = _base_row(strategy, fault, period, delay, model, min_slices)
    fields, ok, good_refs, rate = fault_cost(runs, refs)
    local = bool(ok) and all(r.get("local_fault_cost_s") is not None for r in ok)
    if local:
        fields = _local_fields(fields, ok)
    if any(r.get("shrunk_steps") for r in ok) and (local or rate):
        # Had each step on the survivor taken a fault-free step's time, as on a TPU slice (see the module doc).
        if local:
            full = [r["local_fault_cost_if_shrunk_steps_took_full_time_s"] for r in ok]
        else:
            full = [r["fault_cost_s"] - r["shrunk_seconds"] + r["shrunk_steps"] / rate for r in ok]
        row["shrunk_steps_median"] = median(r["shrunk_steps"] for r in ok)
        row["shrunk_seconds_median"] = rnd(median(r["shrunk_seconds"] for r in ok), 3)
        row["fault_cost_if_shrunk_steps_took_full_time_seconds_median"] = rnd(median(full), 3)
    rep = spread([r.get("recovery_after_replacement_s") for r in ok])
    row.update(
        fields
        | {
            "runs": len(ok) if rate or local else 0,
            "recovery_after_replacement_seconds_median": rnd(rep["median"], 3),
            "back_on_every_slice_after_replacement_seconds_median": rnd(
                spread([r.get("back_on_every_slice_after_replacement_s") for r in ok])["median"], 3
            ),
            "fault_steps": sorted(r["fault_step"] for r in runs),
        }
    )
    if not rate and not local:
        row["invalid_reason"] = "no fault-free reference run succeeded"
    elif not ok:
        row["invalid_reason"] = "no faulted run measured what it should: " + "; ".join(row["failures"])
    for key in ("params", "state_bytes"):
        seen = sorted({r[key] for r in [*runs, *refs] if r.get(key)})
        if seen:
            row[key] = seen[0] if len(seen) == 1 else seen
    # Steady step time (fault-free runs), its overhead over plain MaxText's, and one period's cost with the fault.
    steady, source = steady_step_seconds(ok, good_refs)
    row["steady_step_seconds_median"] = rnd(steady, 6)
    row["steady_step_source"] = source
    row["plain_step_seconds_median"] = rnd(plain_step_s, 6)
    overhead = step_overhead_fraction(steady, plain_step_s)
    row["step_overhead_fraction_median"] = rnd(overhead, 4)
    if local:
        full_rate = [r.get("local_fault_cost_if_shrunk_steps_took_full_time_s", r["fault_cost_s"]) for r in ok]
    elif rate:
        full_rate = [r["fault_cost_s"] - r.get("shrunk_seconds", 0.0) + r.get("shrunk_steps", 0) / rate for r in ok]
    else:
        full_rate = []
    periods = period_costs([c for c in full_rate if c is not None], steady, plain_step_s, period)
    row["period_cost_seconds_median"] = rnd(median(periods), 3) if periods else None
    if not periods:
        row["period_cost_note"] = (
            "no plain MaxText step time (full_restart's fault-free runs)"
            if not plain_step_s
            else "no steady step time or no measured fault cost"
        )
    phases = [r["phases"] for r in ok if r.get("phases")]
    if phases:
        names = dict.fromkeys(k for p in phases for k in p)
        row["phase_seconds_median"] = {k: rnd(median(p[k] for p in phases if k in p), 3) for k in names}
    written = [r["flush_bytes"] for r in ok if r.get("flush_bytes") is not None]
    if written:
        row["flush_bytes_median"] = median(written)
    for key in ("mesh_slices_before", "mesh_slices_after"):
        seen = [int(r[key]) for r in ok if r.get(key) is not None]
        mid = median(seen)
        row[key] = int(round(mid)) if mid is not None else None
        if len(set(seen)) > 1:
            row[f"{key}_seen"] = sorted(set(seen))
    costs_snap = [r["snapshot"] for r in good_refs if r.get("snapshot")]
    if costs_snap:
        for key, name, digits in (
            ("snapshot_ms_per_step", "snapshot_ms_per_step_median", 3),
            ("snapshot_fraction_of_step", "snapshot_fraction_of_step_median", 4),
            ("hook_overhead_fraction", "snapshot_hook_overhead_fraction_median", 4),
            ("snapshots_skipped", "snapshots_skipped_median", 1),
        ):
            mid = median(c.get(key) for c in costs_snap)
            if mid is not None:
                row[name] = rnd(mid, digits)
        every = sorted({str(c["snapshot_every"]) for c in costs_snap if c.get("snapshot_every") is not None})
        if every:
            row["snapshot_every_seen"] = every
        row["snapshot_cost_runs"] = len(costs_snap)
    return row


def _local_fields(whole: dict[str, Any], ok: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The row's fault cost from each run's local fault cost (:func:`analyse`); the whole-run measure
    (against the fault-free runs' rate) is kept beside it as ``whole_run_*``, and a whole-run cost
    below zero is reported there, not as the row's invalidity: it measures the reference rate's
    noise, which the local measure does not carry."""
    out = dict(whole)
    for k in ("median", "p90", "min", "max"):
        out[f"whole_run_fault_cost_seconds_{k}"] = out.pop(f"fault_cost_seconds_{k}")
    note = out.pop("invalid_reason", None)
    if note:
        out["whole_run_note"] = note
    for r in ok:
        if r.get("fault_cost_s") is not None:
            r["whole_run_fault_cost_s"] = r["fault_cost_s"]
        r["fault_cost_s"] = r["local_fault_cost_s"]
    out.update(
        {
            "fault_cost_method": "local",
            **cost_fields(
                [r["local_fault_cost_s"] for r in ok],
                "local fault cost",
                "the run's own step time before the fault is off by more than the fault costs",
            ),
            "own_step_seconds_median": rnd(median(r["own_step_s"] for r in ok), 6),
            "local_window_seconds_median": rnd(median(r["local_window_s"] for r in ok), 3),
            "local_window_work_steps_median": rnd(median(r["local_window_work_steps"] for r in ok), 3),
        }
    )
    return out


# ---------------------------------------------------------------------------
# running MaxText
# ---------------------------------------------------------------------------


def run_one(
    job: Job,
    strategy: str,
    root: Path,
    tag: str,
    *,
    fault_step: int | None,
    delay: float,
    start: Path | None = None,
    fault: str = "kill",
) -> dict[str, Any]:
    """One MaxText job under ``strategy`` (with a fault at ``fault_step``, or none), read by :func:`analyse`.

    ``start``: the pre-trained checkpoint (:func:`pretrain`), copied into the run's checkpoint
    directory, which MaxText restores at its start; without it the run trains from step 0.
    ``fault``: ``kill`` (the slice dies in step ``fault_step``) or ``notice`` (the sidecar only: a maintenance
    notice for the slice's node once ``fault_step`` steps are done; the replacement registers ``delay``
    seconds after the job went on without it).
    """
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
    from trainer_hooks.maxtext.snapshot import ENV_SNAPSHOT_EVERY

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
    if strategy == "sidecar" and job.snapshot_every is not None:
        env[ENV_SNAPSHOT_EVERY] = str(job.snapshot_every)
    killed = fault_step is not None and fault == "kill"
    fault_env = {cpu_elastic.ENV_FAIL_AT: f"{fault_step}:{LOST_SLICE}"} if killed else {}
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
        if fault_step is not None and sc is not None and fault == "notice":
            if not _wait_for(lambda: any(e.get("step", 0) >= fault_step for e in read_jsonl(events)), first, budget):
                out["error"] = f"step {fault_step} never completed; {first.name} exit code {first.poll()}"
            else:
                cpu_elastic.record(events, "fault", slice=LOST_SLICE, during="notice")
                deadline = time.monotonic() + 120.0
                sc.request(
                    NodeNotice("terminate_on_host_maintenance", "bench", f"node-{LOST_SLICE}", deadline=deadline)
                )
                decided = time.time()
                went_on = lambda: sc.applied(TrainerResumed, 0.0, lambda e: LOST_SLICE not in e.active)  # noqa: E731
                _wait_for(went_on, first, budget)
                time.sleep(delay)
                replaced = time.time()  # a new host for the slice: the drained node is under maintenance
                sc.request(WorkerJoined(LOST_SLICE, 0, "inc-2", node=f"node-{LOST_SLICE}-new"))
        elif fault_step is not None:
            fault_ev = _wait_for(
                lambda: next((e for e in read_jsonl(events) if e.get("kind") == "fault"), None), first, budget
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
                        out["note"] = "the faulted process was still running at the replacement; killed"
                    out["first_exit_code"] = first.poll()
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
        out["exit_code"] = code
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
        evs,
        steps=steps,
        fault_step=fault_step,
        replacement_time=replaced,
        reference_steps=job.checkpoint_period,
        save_every=None if strategy == "local_checkpoint_rewind" else job.checkpoint_period,
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
    out["processes"] = len(procs)
    return out


def pretrain(job: Job, root: Path) -> Path:
    """Train the job once to :attr:`Job.start_label` and commit a checkpoint there; return its directory.

    Every run of the period restores a copy of it at its start (:func:`run_one`), so a run trains only
    its lead, the fault's phase and the tail: the steps before are the same in every run and strategy
    (MaxText without elastic mode, the same model and mesh) and would only be run again.
    """
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
        return {
            "trainer": "maxtext",
            "strategy": strategy,
            "tag": tag,
            "fault_step": kw.get("fault_step"),
            "replacement_delay": kw.get("delay"),
            "lost_steps": None,
            "recovery_s": None,
            "error": f"{type(e).__name__}: {e}",
        }


def _wait_for(cond: Any, run: Any, timeout: float) -> Any:
    """``cond()`` once it is true, polled until ``run`` exits or ``timeout`` passes (then its last value)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.poll() is None:
        if got := cond():
            return got
        time.sleep(0.02)
    return cond()


def run(
    *,
    strategies: Sequence[str],
    cases: Sequence[tuple[str, int, float]],
    runs: int,
    seed: int,
    root: Path,
    model: str = "tiny",
    fault_free_runs: int | None = None,
    min_slices: int = -1,
    local_checkpoint_period: int | None = None,
) -> dict[str, Any]:
    """Every (fault, period, delay) case under every strategy, ``runs`` times, interleaved by round (in an order
    rotated each round).

    Returns the rows, each run's figures and the fault-free runs.
    """
    from simjob.maxtext.job import MAXTEXT_PYTHON, MODELS

    if local_checkpoint_period is None:
        local_checkpoint_period = LOCAL_CHECKPOINT_PERIOD

    if model not in MODELS:
        raise ValueError(f"unknown MaxText model size {model!r}: expected one of {sorted(MODELS)}")
    ours = [s for s in strategies if s in STRATEGIES]
    unknown = [s for s in strategies if s not in STRATEGIES and s not in NOT_RUN_STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategy {unknown}: expected some of {[*STRATEGIES, *NOT_RUN_STRATEGIES]}")
    no_venv = None
    if ours and not MAXTEXT_PYTHON.exists():
        # The example trainer's rows of the same run are kept; every MaxText row says why it has no figure.
        no_venv = f"not run: no MaxText interpreter at {MAXTEXT_PYTHON} (python3.12 venv with maxtext[tpu]==0.2.5)"
        log(f"recovery maxtext: {no_venv}")
        ours = []
    if any(s in NOTICE_STRATEGIES for s in ours):  # the sidecar's notice row beside each kill case
        cases = [*cases, *(("notice", p, d) for f, p, d in cases if f == "kill" and ("notice", p, d) not in cases)]
    periods = sorted({p for f, p, _ in cases if f in FAULTS})
    refs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    done: list[dict[str, Any]] = []
    n_refs = runs if fault_free_runs is None else fault_free_runs
    starts: dict[int, Path] = {}
    no_start: dict[int, str] = {}
    jobs = {p: Job(model, p, min_slices=min_slices, local_checkpoint_period=local_checkpoint_period) for p in periods}
    # A notice drains one slice: the job goes on on the others (from memory), so it must be allowed to.
    notice_min = SLICES - 1 if min_slices == -1 else min(min_slices, SLICES - 1)
    journal = Journal(
        root / JOURNAL,
        {
            "model": model,
            "min_slices": min_slices,
            "local_checkpoint_period": local_checkpoint_period,
            "seed": seed,
            "runs": runs,
            "fault_free_runs": n_refs,
            "strategies": list(ours),
            "cases": [list(c) for c in cases],
        },
    )
    if journal.done:
        log(f"recovery maxtext: {len(journal.done)} finished runs of this commit and arguments in {journal.path}")
    for period, job in jobs.items() if ours else []:
        kept = journal.done.get(f"pretrain-p{period}", {}).get("checkpoint")
        if kept and Path(kept).is_dir():
            log(f"recovery maxtext: period {period}: the pre-trained checkpoint {kept} of an earlier sitting")
            starts[period] = Path(kept)
            continue
        log(f"recovery maxtext: pre-training period {period} to step {job.start_label}")
        try:
            starts[period] = pretrain(job, root)
            journal.add(f"pretrain-p{period}", {"checkpoint": str(starts[period])})
        except Exception as e:  # noqa: BLE001 - the period's rows say why they have no figure
            no_start[period] = f"not run: pre-training failed: {type(e).__name__}: {e}"
            log(f"recovery maxtext: {no_start[period]}")
    for rep in range(runs):
        # Each round runs the strategies in an order rotated by the round. With one order, plain MaxText
        # (full_restart) always ran first, and its steady step read slower than the others', which no
        # strategy can be: whatever the position costs (not established), it now falls on every strategy in turn.
        order = rotated(ours, rep)
        for period in [p for p in periods if p in starts]:
            job = jobs[period]
            for s in order if rep < n_refs else []:
                n = job.steps_for(None, s) - job.start_label
                tag = f"mx-ref-{s}-p{period}-r{rep}"
                r = journal.get(tag)
                if r is None:
                    log(f"recovery maxtext: {s} fault-free, period {period}, {n} steps, round {rep + 1}/{runs}")
                    r = guarded(job, s, root, tag, fault_step=None, delay=0.0, start=starts[period])
                    r["checkpoint_period"] = period
                    journal.add(tag, r)
                else:
                    log(f"recovery maxtext: {s} fault-free, period {period}, round {rep + 1}/{runs}: from {JOURNAL}")
                log(f"  -> {r.get('seconds')} s for {r.get('work_steps')} steps{_err(r)}")
                refs.setdefault((s, period), []).append(r)
        for fault, period, delay in cases:
            if fault not in FAULTS or period not in starts:
                continue
            job = jobs[period] if fault != "notice" else replace(jobs[period], min_slices=notice_min)
            at = fault_index(job, seed, rep, runs)
            for s in order if fault != "notice" else [s for s in order if s in NOTICE_STRATEGIES]:
                what = f"{s} {fault}@{at} period {period} delay {delay:g}s round {rep + 1}/{runs}"
                tag = f"mx-{s}-{fault}-p{period}-d{delay:g}-r{rep}"
                r = journal.get(tag)
                if r is not None:
                    log(f"recovery maxtext: {what}: from {JOURNAL}")
                    done.append(r)
                    continue
                log(f"recovery maxtext: {what}")
                r = guarded(job, s, root, tag, fault_step=at, delay=delay, start=starts[period], fault=fault)
                r.update({"fault": fault, "checkpoint_period": period})
                journal.add(tag, r)
                log(f"  -> lost {r.get('lost_steps')}, recovery {r.get('recovery_s')} s{_err(r)}")
                done.append(r)
    rows = []
    for fault, period, delay in cases:
        row_min = min_slices if fault != "notice" else notice_min
        for s in strategies if fault != "notice" else [s for s in strategies if s in NOTICE_STRATEGIES]:
            if s in NOT_RUN_STRATEGIES:
                rows.append(not_run_row(s, fault, period, delay, model, NOT_RUN_STRATEGIES[s], min_slices))
            elif no_venv is not None:
                rows.append(not_run_row(s, fault, period, delay, model, no_venv, min_slices))
            elif fault in NOT_RUN_FAULTS:
                rows.append(not_run_row(s, fault, period, delay, model, NOT_RUN_FAULTS[fault], min_slices))
            elif period in no_start:
                rows.append(not_run_row(s, fault, period, delay, model, no_start[period], min_slices))
            else:
                case = (fault, period, delay)
                plain = plain_step_seconds(refs.get(("full_restart", period), []), runs_at(done, "full_restart", case))
                rows.append(
                    summarise(
                        s,
                        fault,
                        period,
                        delay,
                        model,
                        runs_at(done, s, case),
                        refs.get((s, period), []),
                        row_min,
                        plain_step_s=plain,
                    )
                )
    return {
        "rows": rows,
        "runs": done,
        "fault_free_runs": [r for v in refs.values() for r in v],
        "config": {
            "model": model,
            "slices": SLICES,
            "elastic_min_slice_count": min_slices,
            # Every run restores the period's pre-trained checkpoint (start_label), runs to its fault and
            # the tail after it (tail_steps; full_restart's: TAIL_STEPS).
            "start_label": {p: j.start_label for p, j in jobs.items()},
            "first_period_end": {p: j.first_period_end for p, j in jobs.items()},
            "tail_steps": Job(model, 1, min_slices=min_slices).tail("sidecar"),
            "tail_steps_full_restart": TAIL_STEPS,
            "fault_phases": "stratified: round k of n draws from the k-th n-th of the period",
            "order": "the strategies' order rotated by one each round (fault-free and faulted runs alike)",
            "snapshot_every": "the hook's default (auto)",
            "devices": DEVICES,
            "lost_slice": LOST_SLICE,
            "warmup_step": WARMUP_STEP,
            "fault_free_runs_per_strategy": min(n_refs, runs),
            "local_checkpoint_period": local_checkpoint_period,
            "journal": journal.summary(),
        },
    }


JOURNAL = "runs.jsonl"


class Journal:
    """The finished runs of one configuration at one clean commit, in the work directory's ``runs.jsonl``.

    A period of 10,000 steps takes hours of runs (the rewinds train each fault's phase two or three
    times), more than one sitting. With a kept ``--workdir``, a benchmark stopped part way goes on
    where it stopped when it is started again with the same work directory, commit and arguments:
    each run is appended here once it has finished (a run cut short is run again), the period's
    pre-trained checkpoint is reused, and the result says how many runs came from earlier sittings
    (``journal``). Runs recorded by another commit, a dirty tree or other arguments are never reused.
    """

    def __init__(self, path: Path, identity: dict[str, Any]) -> None:
        git = git_state()
        self.path = path if git.get("git_sha") and git.get("dirty") is False else None
        self.identity = {**identity, "git_sha": git.get("git_sha")}
        self.done: dict[str, dict[str, Any]] = {}
        self.reused = 0
        self.first_started: float | None = None
        if self.path is None or not self.path.exists():
            return
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if isinstance(rec, dict) and rec.get("identity") == self.identity and isinstance(rec.get("record"), dict):
                self.done[str(rec.get("tag"))] = rec["record"]
                t = rec.get("finished_at")
                if isinstance(t, (int, float)):
                    self.first_started = min(self.first_started or t, t)

    def get(self, tag: str) -> dict[str, Any] | None:
        r = self.done.get(tag)
        if r is not None:
            self.reused += 1
        return r

    def add(self, tag: str, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        line = json.dumps(
            {"identity": self.identity, "tag": tag, "finished_at": time.time(), "record": record}, default=str
        )
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def summary(self) -> dict[str, Any]:
        return {
            "path": portable_path(str(self.path)) if self.path else None,
            "runs_from_earlier_sittings": self.reused,
            "earliest_earlier_run_finished_at": self.first_started,
        }


def _err(r: dict[str, Any]) -> str:
    return f" ERROR {r['error']}" if r.get("error") else ""
