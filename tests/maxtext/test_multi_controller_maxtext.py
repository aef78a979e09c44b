"""The real MaxText (0.2.5, tiny synthetic model) as a multi-controller job on the CPU.

Two MaxText processes joined by ``jax.distributed`` (MaxText's own CPU initialisation, gloo
collectives), each through ``trainer_hooks.maxtext`` with its own link to one in-process
coordinator run with ``--trainer-processes 2``. An operator hold stops both at one step with a
collective flush that MaxText's checkpointer commits; an abort ends both with exit 42.

MaxText's CPU initialisation always uses the jax.distributed coordinator port 1234 on
``JAX_COORDINATOR_ADDRESS`` (here 127.0.0.1): two such tests cannot run at once on one machine.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.core.model import OperatorCommand, Phase, TrainerHeld, WorkerJoined, WorkerLost
from tests.maxtext.harness import (
    START_TIMEOUT,
    MaxTextRun,
    Sidecar,
    checkpoint_labels,
    maxtext_args,
    require_maxtext_venv,
)

pytestmark = pytest.mark.maxtext

RUN = "mc"
PROCESSES = 2


def _start(tmp_path: Path, sc: Sidecar) -> list[MaxTextRun]:
    args = [
        a if a != "skip_jax_distributed_system=true" else "skip_jax_distributed_system=false"
        for a in maxtext_args(tmp_path, RUN, 100_000)
    ]
    return [
        MaxTextRun(
            f"process-{i}",
            [*args, f"metrics_file={tmp_path / f'metrics-{i}.jsonl'}"] if i else args,
            tmp_path,
            sidecar=sc,
            env={
                "JAX_COORDINATOR_ADDRESS": "127.0.0.1",
                "JOB_INDEX": "0",
                "JOB_COMPLETION_INDEX": str(i),
                "PROCESSES_IN_JOB": str(PROCESSES),
                "JAX_PROCESS_COUNT": str(PROCESSES),
                "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
            },
        )
        for i in range(PROCESSES)
    ]


def test_two_maxtext_processes_hold_at_one_step_flush_collectively_and_exit_42(tmp_path: Path) -> None:
    require_maxtext_venv()
    sc = Sidecar(num_slices=1, hosts_per_slice=PROCESSES, trainer_processes=PROCESSES)
    for h in range(PROCESSES):
        sc.submit(WorkerJoined(0, h, f"inc-{h}", node=f"node-{h}"))
    runs = _start(tmp_path, sc)
    try:
        sc.wait_for(
            lambda: sc.state.phase == Phase.RUNNING and sc.state.trainer.last_step > 3,
            "both processes attached and stepping",
            runs[0],
            timeout=START_TIMEOUT,
        )
        assert sorted(sc.coord.trainer_conns) == [0, 1]
        t0 = time.monotonic()
        sc.request(OperatorCommand("hold", "multi-controller test"))
        sc.wait_for(lambda: sc.applied(TrainerHeld, since=t0), "both processes to hold", runs[0])
        held = sc.applied(TrainerHeld)[-1].event
        assert not held.disagreement and not held.flush_error, held
        assert held.committed_step == held.step, "the collective flush did not commit the held step"
        assert held.step - 1 in checkpoint_labels(tmp_path, RUN), "MaxText labels the state after s steps s-1"
        steps = {r.name: [f["step"] for _, f in r.hook_lines("held")] for r in runs}
        assert all(v == [held.step] for v in steps.values()), steps
        assert sc.state.phase == Phase.WAITING

        t1 = time.monotonic()
        sc.request(OperatorCommand("abort", "multi-controller test", restart=True))
        codes = [r.wait(60) for r in runs]
        assert codes == [42, 42], [r.tail() for r in runs]
        print(f"\n[mc maxtext] held at step {held.step}; abort to both exited: {time.monotonic() - t1:.2f} s")
    finally:
        for r in runs:
            r.kill()
        sc.stop()


def test_a_lost_maxtext_process_ends_the_other_with_42_within_seconds(tmp_path: Path) -> None:
    """One process is SIGKILLed (its host dies) and its worker sidecar's stream closes: the other
    process, blocked in (or failing) the step's collective, exits 42 after the coordinator's abort."""
    require_maxtext_venv()
    sc = Sidecar(num_slices=1, hosts_per_slice=PROCESSES, trainer_processes=PROCESSES)
    for h in range(PROCESSES):
        sc.submit(WorkerJoined(0, h, f"inc-{h}", node=f"node-{h}"))
    runs = _start(tmp_path, sc)
    try:
        sc.wait_for(
            lambda: sc.state.phase == Phase.RUNNING and sc.state.trainer.last_step > 3,
            "both processes attached and stepping",
            runs[0],
            timeout=START_TIMEOUT,
        )
        runs[1].proc.kill()
        t0 = time.monotonic()
        sc.submit(WorkerLost(0, 1, "inc-1", "stream_closed"))  # what its worker sidecar's closed stream says
        code = runs[0].wait(60)
        took = time.monotonic() - t0
        assert code == 42, runs[0].tail()
        assert took < 15.0, took  # generous: the watchdog's grace is 1.5 s for process 0
        assert sc.state.phase == Phase.FAILED
        print(f"\n[mc maxtext] process 1 killed: process 0 exited 42 after {took:.2f} s")
    finally:
        for r in runs:
            r.kill()
        sc.stop()
