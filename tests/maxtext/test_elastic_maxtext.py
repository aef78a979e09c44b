"""MaxText's own elastic path (``elastic_enabled``), driven by the sidecar, on the CPU.

MaxText runs through ``python -m simjob.maxtext`` with the patches
of :mod:`simjob.maxtext.cpu_elastic`. The coordinator's policy has two
slices, each with one (submitted) worker; MaxText reports its own flags
(``elastic_min_slice_count=1`` ...), which the coordinator adopts. Losing
slice 1 makes the sidecar resume on slice 0 alone: the hook flushes and
raises a ``DATA_LOSS`` error, and ``elastic_retry`` starts the next attempt at
once from exactly the flushed step. A replacement for slice 1 makes it resume
on both: the hook flushes and raises ``ScaleUpSignalError``, same again.
The four CPU devices form two slices of two (``ELASTIC_SIDECAR_TEST_CPU_SLICES=2``: each
device carries its ``slice_index``, so MaxText builds its own two-slice DCN mesh), a shrink
really builds MaxText's mesh on slice 0's two devices, and the resumed acknowledgement names
the slices of the mesh built.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.core.model import (
    OperatorCommand,
    TrainerFlushed,
    TrainerHeld,
    TrainerResumed,
    TrainerStepped,
    WorkerJoined,
    WorkerLost,
)
from simjob.maxtext.cpu_elastic import ENV, ENV_SLICES
from tests.maxtext.harness import (
    PATCHED_MODULE,
    START_TIMEOUT,
    WAIT,
    MaxTextRun,
    Sidecar,
    checkpoint_labels,
    maxtext_args,
    require_maxtext_venv,
)

pytestmark = pytest.mark.maxtext

ELASTIC_FLAGS = (
    "elastic_enabled=true",
    "enable_single_controller=true",
    "elastic_min_slice_count=1",
    "elastic_timeout_seconds=60",
    "elastic_max_retries=5",
)


MONITOR_FOUND_SLICE_1 = b"Newly available but inactive slices frozenset({1})"
"""pathwaysutils' monitor thread (``Manager._check_inactive_slices``, every ``poll_interval``: 10 s) logs this
at each poll that finds slice 1 healthy and not in use."""


def log_since(run: MaxTextRun, offset: int) -> bytes:
    """What ``run`` logged past ``offset`` bytes (read often: not the whole log each time)."""
    with open(run.log, "rb") as f:
        f.seek(offset)
        return f.read()


def resumed_on(sc: Sidecar, slices: set[int], since: float, run: MaxTextRun) -> TrainerResumed:
    found = sc.wait_for(
        lambda: sc.applied(TrainerResumed, since, lambda e: e.active == frozenset(slices)),
        f"the trainer to resume on {sorted(slices)}",
        run,
        timeout=WAIT,
    )
    return found[-1].event


def flushed_since(sc: Sidecar, since: float) -> int:
    acks = sc.applied(TrainerFlushed, since)
    assert acks, "the hook did not flush before restarting"
    return acks[-1].event.committed_step


def test_elastic_retry_restarts_at_once_from_the_flushed_step_on_shrink_and_grow(tmp_path: Path) -> None:
    require_maxtext_venv()
    sc = Sidecar(num_slices=2)
    run = None
    try:
        sc.submit(WorkerJoined(0, 0, "inc-1", node="node-0"))
        sc.submit(WorkerJoined(1, 0, "inc-1", node="node-1"))
        args = maxtext_args(tmp_path, "elastic", 100_000, *ELASTIC_FLAGS)
        env = {ENV: "1", ENV_SLICES: "2"}
        run = MaxTextRun("elastic", args, tmp_path, sidecar=sc, module=PATCHED_MODULE, env=env)
        sc.wait_for(lambda: sc.applied(TrainerStepped), "the first step", run, timeout=START_TIMEOUT)
        p = sc.state.policy
        assert (p.elastic_min_slice_count, p.elastic_timeout_seconds, p.elastic_max_retries) == (1, 60, 5)
        assert sc.state.active == {0, 1}

        # shrink: slice 1 is lost; the sidecar resumes on slice 0 alone
        t0 = time.monotonic()
        sc.request(WorkerLost(1, 0, "inc-1", "stream_closed"))
        shrunk = resumed_on(sc, {0}, t0, run)
        committed = flushed_since(sc, t0)
        shrink_s = time.monotonic() - t0
        assert (shrunk.step, shrunk.restored_from) == (committed, "checkpoint"), "steps lost in the elastic restart"
        assert committed - 1 in checkpoint_labels(tmp_path, "elastic")
        restarts = run.hook_lines("restart")
        assert restarts and restarts[-1][1]["how"] == "elastic_retry"
        sc.wait_for(lambda: sc.state.trainer.last_step > committed, "a step after the shrink", run)

        # grow: a replacement for slice 1 registers; the sidecar resumes on both
        t1 = time.monotonic()
        sc.request(WorkerJoined(1, 0, "inc-2", node="node-1"))
        grown = resumed_on(sc, {0, 1}, t1, run)
        committed2 = flushed_since(sc, t1)
        grow_s = time.monotonic() - t1
        assert (grown.step, grown.restored_from) == (committed2, "checkpoint")
        assert committed2 > committed
        sc.wait_for(lambda: sc.state.trainer.last_step > committed2, "a step after growing back", run)

        text = run.text()
        assert "Elastic event detected" in text or "DATA_LOSS: elastic-sidecar: shrink" in text
        assert "Scale up requested" in text or "ScaleUpSignalError" in text or len(run.hook_lines("restart")) == 2
        rebuilds = [f["rebuild_seconds"] for _, f in run.hook_lines("resumed") if f["restored_from"] == "checkpoint"]
        assert len(rebuilds) == 2
        print(
            f"\nelastic MaxText: slice lost to resumed {shrink_s:.3f} s, replacement to resumed {grow_s:.3f} s; "
            f"in-process restart (raise to first step boundary) {rebuilds} s"
        )

        sc.request(OperatorCommand("abort", "end of test", restart=True))
        assert run.wait(60) == 42, run.tail()
    finally:
        if run is not None:
            run.kill()
        sc.stop()


def budget_flags(retries: int) -> tuple[str, ...]:
    """``elastic_max_retries=retries`` (the test runs as many cycles). Each loss-and-replacement
    cycle is two ``elastic_retry`` attempts, so pathwaysutils' own ``ElasticRetryLimit(retries)``
    would refuse (exit 1) once half the cycles are done: three cycles in the default run, the
    issue's ten under ``--runslow``."""
    return (
        "elastic_enabled=true",
        "enable_single_controller=true",
        "elastic_min_slice_count=1",
        "elastic_timeout_seconds=60",
        f"elastic_max_retries={retries}",
    )


@pytest.mark.parametrize("cycles", [3, pytest.param(10, marks=pytest.mark.slow)])
def test_loss_and_replacement_cycles_spend_only_the_sidecars_budget_and_the_mesh_spans_the_slices_decided(
    tmp_path: Path, cycles: int
) -> None:
    """Two slices of two CPU devices each (``ELASTIC_SIDECAR_TEST_CPU_SLICES=2``), ``elastic_max_retries=cycles``.

    ``cycles`` loss-and-replacement cycles (twice as many ``elastic_retry`` attempts) keep training; the mesh
    MaxText builds spans exactly the slices the sidecar resumed on each time; a drain of the
    healthy slice 1 keeps it out of the mesh even after pathwaysutils' monitor (10 s poll) sees
    it healthy; then one more loss, past the budget, exits 42 with the reason.
    """
    require_maxtext_venv()
    sc = Sidecar(num_slices=2)
    run = None
    try:
        sc.submit(WorkerJoined(0, 0, "inc-1", node="node-0"))
        sc.submit(WorkerJoined(1, 0, "inc-1", node="node-1"))
        args = maxtext_args(tmp_path, "budget", 100_000, *budget_flags(cycles))
        env = {ENV: "1", ENV_SLICES: "2"}
        run = MaxTextRun("budget", args, tmp_path, sidecar=sc, module=PATCHED_MODULE, env=env)
        sc.wait_for(lambda: sc.applied(TrainerStepped), "the first step", run, timeout=START_TIMEOUT)
        assert sc.state.policy.elastic_max_retries == cycles
        first = sc.applied(TrainerResumed)[-1].event
        assert first.active == frozenset({0, 1})

        recoveries: list[float] = []
        for cycle in range(cycles):
            t0 = time.monotonic()
            sc.request(WorkerLost(1, 0, f"inc-{cycle + 1}", "stream_closed"))
            resumed_on(sc, {0}, t0, run)  # the ack names the mesh's slices: 2 devices of slice 0
            at = sc.state.trainer.last_step
            sc.wait_for(lambda at=at: sc.state.trainer.last_step > at, "a step on slice 0 alone", run)
            recoveries.append(time.monotonic() - t0)
            t1 = time.monotonic()
            sc.request(WorkerJoined(1, 0, f"inc-{cycle + 2}", node="node-1"))
            resumed_on(sc, {0, 1}, t1, run)
            at = sc.state.trainer.last_step
            sc.wait_for(lambda at=at: sc.state.trainer.last_step > at, "a step on both slices", run)
        assert sc.state.retries_used == cycles
        assert run.poll() is None
        meshes = [(f["decided"], f["slices"]) for _, f in run.hook_lines("resumed")]
        assert all(d == m for d, m in meshes), meshes
        assert [m for _, m in meshes][-4:] == [[0], [0, 1], [0], [0, 1]]
        budget = run.hook_lines("resumed")[-1][1]["retry_budget"]
        assert budget == {"decided_attempts": 2 * cycles, "reported_failures": 0}
        assert "Retry policy rejected" not in run.text()

        # drain the healthy slice 1: the mesh excludes it, also after the monitor's poll sees it up
        t2 = time.monotonic()
        sc.request(OperatorCommand("drain", "test drain", slice=1))
        drained = resumed_on(sc, {0}, t2, run)
        held = sc.applied(TrainerHeld, t2)[-1].event
        assert not held.flush_error, "a drained slice in good health is readable: the drain loses no step"
        assert drained.step == held.step
        restarts = len(run.hook_lines("restart"))
        mark = run.log.stat().st_size
        sc.wait_for(lambda: MONITOR_FOUND_SLICE_1 in log_since(run, mark), "the monitor to find slice 1 up", run)
        at = sc.state.trainer.last_step
        # MaxText asks the manager for a healthy inactive slice at each step (maybe_elastic_scale_up).
        sc.wait_for(lambda: sc.state.trainer.last_step > at + 1, "two steps after the monitor's poll", run)
        assert run.poll() is None and len(run.hook_lines("restart")) == restarts, run.tail()
        assert "Scale up requested" not in run.text()[-20000:]
        assert sc.state.trainer.last_step > drained.step
        assert sc.state.retries_used == cycles, "a drain spends no retry"

        # one real failure past the budget: exit 42, with the reason, never 1
        t3 = time.monotonic()
        sc.request(WorkerLost(0, 0, "inc-1", "stream_closed"))
        assert run.wait(WAIT) == 42, run.tail()
        aborts = run.hook_lines("abort")
        assert aborts and f"elastic_max_retries={cycles}" in aborts[-1][1]["reason"], run.tail()
        print(
            f"\nretry budget: loss to next step on the survivor {[round(r, 3) for r in recoveries]} s; "
            f"terminal failure to exit {time.monotonic() - t3:.3f} s"
        )
    finally:
        if run is not None:
            run.kill()
        sc.stop()


def test_maxtexts_own_periodic_checkpoints_count_as_committed(tmp_path: Path) -> None:
    """``checkpoint_period=5``: the sidecar's committed step follows MaxText's own saves (``admin status``)."""
    require_maxtext_venv()
    sc = Sidecar(num_slices=1)
    run = None
    try:
        sc.submit(WorkerJoined(0, 0, "inc-1", node="node-0"))
        args = maxtext_args(tmp_path, "periodic", 13, "checkpoint_period=5")
        run = MaxTextRun("periodic", args, tmp_path, sidecar=sc)
        assert run.wait(START_TIMEOUT) == 0, run.tail()
        labels = checkpoint_labels(tmp_path, "periodic")
        assert labels == [5, 10], labels
        acks = [a.event for a in sc.applied(TrainerFlushed)]
        assert [a.committed_step for a in acks] == [6, 11] and not any(a.flush_error for a in acks)
        assert sc.state.trainer.committed_step == 11
        assert [f["step"] for _, f in run.hook_lines("committed")] == [6, 11]
    finally:
        if run is not None:
            run.kill()
        sc.stop()


# A slice lost inside a step and restored from an in-memory snapshot: tests/maxtext/test_multislice_snapshot_maxtext.py
# (four slices, grain data, the loss surfacing asynchronously, Orbax's Pathways Snapshotter in the hook).
