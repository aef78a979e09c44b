"""MaxText's own elastic path (``elastic_enabled``), driven by the sidecar, on the CPU.

MaxText runs through ``python -m tests.maxtext.run_patched`` with the patches
of :mod:`tests.maxtext.cpu_elastic_support`. The coordinator's policy has two
slices, each with one (submitted) worker; MaxText reports its own flags
(``elastic_min_slice_count=1`` ...), which the coordinator adopts. Losing
slice 1 makes the sidecar resume on slice 0 alone: the hook flushes and
raises a ``DATA_LOSS`` error, and ``elastic_retry`` starts the next attempt at
once from exactly the flushed step. A replacement for slice 1 makes it resume
on both: the hook flushes and raises ``ScaleUpSignalError``, same again.
(MaxText keeps all four CPU devices as its one slice throughout: see the
support module for what the patches cannot give.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.core.model import (
    OperatorCommand,
    TrainerFlushed,
    TrainerResumed,
    TrainerStepped,
    WorkerJoined,
    WorkerLost,
)
from tests.maxtext.cpu_elastic_support import ENV
from tests.maxtext.harness import (
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
        args = maxtext_args(tmp_path, "elastic", 100_000, *ELASTIC_FLAGS, jax_cache=tmp_path / "jax-cache")
        run = MaxTextRun("elastic", args, tmp_path, sidecar=sc, module="tests.maxtext.run_patched", env={ENV: "1"})
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
