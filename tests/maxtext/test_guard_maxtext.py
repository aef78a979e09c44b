"""The real MaxText (0.2.5, tiny model, CPU) held by a coordinator that then disappears.

MaxText's own ``elastic_timeout_seconds`` bounds the wait: the hook gives up,
keeps the committed step, and exits 42 (xpk's restart code), never 1 and
never hanging.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.core.model import OperatorCommand, TrainerHeld, WorkerJoined
from tests.maxtext.harness import (
    START_TIMEOUT,
    MaxTextRun,
    Sidecar,
    checkpoint_labels,
    maxtext_args,
    require_maxtext_venv,
)

pytestmark = pytest.mark.maxtext

TIMEOUT = 3
"""MaxText's elastic_timeout_seconds for this run."""
EXIT_SLACK = 20.0
"""Past the timeout: the flush check and MaxText's own teardown on a loaded 2-core machine."""


def test_held_maxtext_whose_sidecar_is_gone_exits_42_after_its_elastic_timeout(tmp_path: Path) -> None:
    require_maxtext_venv()
    sc = Sidecar(num_slices=1)
    stopped = False
    sc.submit(WorkerJoined(0, 0, "inc-1", node="node-0"))
    run = MaxTextRun(
        "guard", maxtext_args(tmp_path, "guard", 100_000, f"elastic_timeout_seconds={TIMEOUT}"), tmp_path, sidecar=sc
    )
    try:
        sc.wait_for(lambda: sc.state.trainer.last_step >= 2, "two steps", run, timeout=START_TIMEOUT)
        t0 = time.monotonic()
        sc.request(OperatorCommand("hold", "test: then the sidecar goes"))
        sc.wait_for(lambda: sc.applied(TrainerHeld, since=t0), "the hold acknowledgement", run)
        held = sc.applied(TrainerHeld, since=t0)[-1].event
        h = held.step
        assert held.committed_step == h  # an operator hold flushes
        gone = time.monotonic()
        sc.stop()
        stopped = True
        rc = run.wait(TIMEOUT + EXIT_SLACK + 30)
        took = time.monotonic() - gone
    finally:
        run.kill()
        if not stopped:
            sc.stop()
    print(
        f"\n[guard] real MaxText held, sidecar gone: exit {rc} after {took:.1f} s (elastic_timeout_seconds={TIMEOUT})"
    )
    assert rc == 42, run.tail()
    assert TIMEOUT <= took < TIMEOUT + EXIT_SLACK
    lost = run.hook_lines("sidecar_lost")
    assert len(lost) == 1 and lost[0][1]["while"] == "held"
    aborts = run.hook_lines("abort")
    assert len(aborts) == 1
    abort = aborts[0][1]
    assert abort["exit_code"] == 42 and abort["committed_step"] == h
    assert "no sidecar at" in abort["reason"] and "elastic_timeout_seconds=3" in abort["reason"]
    assert checkpoint_labels(tmp_path, "guard")[-1] == h - 1  # MaxText labels the state after h steps h-1
    assert max(run.logged_steps()) == h - 1, "MaxText ran a step while held"
