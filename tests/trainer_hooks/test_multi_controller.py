"""Multi-controller trainer hooks: every process holds at one agreed step, and an Abort ends a
process whose main thread is blocked (a collective whose peer died).

The first test runs a real in-process coordinator (``--trainer-processes 4``) and four
trainer sessions on threads, each with its own real gRPC link; a ``threading.Barrier`` per
step stands in for the collective that keeps SPMD processes in lockstep (no process can
complete step k+1 before every process entered it). Step times and the moments of the holds
are random. A process that held at another step than the others would leave the rest blocked
at the barrier (its timeout fails the test), and the coordinator would see the disagreement.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent.coordinator import Coordinator
from agent.core.model import Decision, Event, OperatorCommand, Phase, Policy, TrainerHeld, WorkerJoined
from agent.servers.status import coordinator_status
from protos.elastic_sidecar.v1 import trainer_pb2
from tests.agent.coordinators import coordinator_config
from tests.trainer_hooks.sidecar import FakeSidecar, resume
from trainer_hooks import AbortTraining, ElasticSession, FlushResult

REPO = Path(__file__).resolve().parents[2]
JOB = "mc-job"
PROCESSES = 4
HOLDS = 100
WAIT = 30.0
"""Generous: the machine may be loaded."""


class Process(threading.Thread):
    """One simulated JAX process: steps in lockstep with the others, random step times."""

    def __init__(self, index: int, address: str, barrier: threading.Barrier, seed: int, halt: threading.Event):
        super().__init__(daemon=True, name=f"process-{index}")
        self.index = index
        self.barrier = barrier
        self.rng = random.Random(seed)
        self.halt = halt
        self.held: dict[int, int] = {}
        """Generation -> the step this process held at."""
        self.flushed: list[int] = []
        self.error: BaseException | None = None

        def on_event(kind: str, fields: dict[str, Any]) -> None:
            if kind == "held":
                self.held[int(fields["generation"])] = int(fields["step"])  # type: ignore[arg-type]

        def flusher(step: int, down: frozenset[int]) -> FlushResult:
            self.flushed.append(step)
            return FlushResult(step, 100)

        self.session = ElasticSession.connect(
            address,
            job=JOB,
            flush=flusher,
            on_event=on_event,
            process_index=index,
            process_count=PROCESSES,
            host=f"host-{index}",
            abort_grace_seconds=None,  # in-process: the watchdog would end the test run itself
        )

    def run(self) -> None:
        s = self.session
        try:
            d = s.start(-1, timeout=WAIT)
            s.resumed(d, 0, "fresh", 0.0)
            step = 0
            while not self.halt.is_set():
                d = s.step_boundary(step)
                if d is not None:
                    s.resumed(d, step, d.source, 0.0)
                    continue
                # The collective: nobody completes this step before everybody entered it.
                self.barrier.wait(timeout=WAIT)
                time.sleep(self.rng.choice((0.0, 0.001, 0.003, 0.008, 0.02)))
                step += 1
                s.report_step(step, 0.005)
        except AbortTraining:
            pass
        except threading.BrokenBarrierError as e:
            if not self.halt.is_set():
                self.error = e
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


async def test_every_process_holds_at_the_same_step_across_100_holds_under_random_timing() -> None:
    cfg = coordinator_config(JOB, Policy(num_slices=2, hosts_per_slice=2, trainer_processes=PROCESSES))
    coord = Coordinator(cfg)
    coord.group.lead_seconds = 0.1  # holds come fast here; still several steps of margin
    inner = coord.apply
    held_events: list[TrainerHeld] = []

    def apply(ev: Event, now: float) -> Decision:
        if isinstance(ev, TrainerHeld):
            held_events.append(ev)
        return inner(ev, now)

    coord.apply = apply  # type: ignore[method-assign]
    await coord.start()
    for s in range(2):
        for h in range(2):
            coord.submit(WorkerJoined(s, h, f"w{s}.{h}"))
    halt = threading.Event()
    barrier = threading.Barrier(PROCESSES)
    procs = [Process(i, f"127.0.0.1:{coord.trainer_port}", barrier, 1000 + i, halt) for i in range(PROCESSES)]
    rng = random.Random(7)

    async def until(cond: Any, what: str) -> None:
        deadline = time.monotonic() + WAIT
        while not cond():
            errors = [p.error for p in procs if p.error is not None]
            if errors or time.monotonic() > deadline:
                raise AssertionError(f"waiting for {what}: {errors or 'timed out'}; last: {coord.last_reason}")
            await asyncio.sleep(0.005)

    try:
        for p in procs:
            p.start()
        st = lambda: coord.state  # noqa: E731
        for n in range(HOLDS):
            await until(
                lambda: st().phase == Phase.RUNNING and not st().trainer.resume_pending, f"running before hold {n}"
            )
            await asyncio.sleep(rng.choice((0.0, 0.002, 0.01, 0.03)))  # hold at a random moment
            d = await coord.request(OperatorCommand("hold", f"hold {n}"))
            assert not d.rejected, d.rejected
            gen = st().generation
            await until(lambda g=gen: all(g in p.held for p in procs), f"every process to hold (hold {n})")
            steps = {p.index: p.held[gen] for p in procs}
            assert len(set(steps.values())) == 1, f"hold {n} (generation {gen}): processes held at {steps}"
            await until(lambda: st().phase == Phase.WAITING, f"the coordinator to see hold {n} complete")
            d = await coord.request(OperatorCommand("resume", f"resume {n}"))
            assert not d.rejected, d.rejected
        await until(lambda: st().phase == Phase.RUNNING, "running after the last hold")
        status = coordinator_status(coord)
        assert status.trainer_processes == PROCESSES and list(status.trainer_processes_attached) == [0, 1, 2, 3]
        assert len(held_events) == HOLDS
        assert all(not e.disagreement and not e.flush_error for e in held_events)
        # The operator holds flush: every process flushed exactly the step it held at.
        for p in procs:
            assert p.flushed == [p.held[g] for g in sorted(p.held)]
        assert st().phase == Phase.RUNNING and st().retries_used == 0
    finally:
        halt.set()
        barrier.abort()
        for p in procs:
            link = p.session._link
            with link._arrived:
                link.inbox.append(
                    trainer_pb2.SidecarCommand(abort=trainer_pb2.Abort(generation=1 << 40, exit_code=1, reason="end"))
                )
                link._arrived.notify_all()
        for p in procs:
            p.join(5)
            await asyncio.to_thread(p.session.close)  # off the loop: the coordinator on it ends the stream
        await coord.stop(grace=0.1)


def test_a_hold_for_a_later_step_waits_for_that_step_and_one_already_passed_holds_at_once() -> None:
    with FakeSidecar() as sidecar:
        s = ElasticSession.connect(sidecar.address, job=JOB, process_index=1, process_count=2, abort_grace_seconds=None)
        try:
            hello = sidecar.wait_for_message("hello")
            assert (hello.process_index, hello.process_count) == (1, 2)
            sidecar.send(resume(1, 0))
            d = s.start(-1, timeout=WAIT)
            s.resumed(d, 0, "fresh", 0.0)
            cmd = trainer_pb2.SidecarCommand(hold=trainer_pb2.Hold(generation=2, at_step=7))
            sidecar.send(cmd)
            sidecar.wait_for(lambda: bool(s._link.inbox), "the hold to arrive")
            for step in range(3, 7):
                assert s.step_boundary(step) is None, f"held at step {step}, before at_step 7"
            done: dict[str, Any] = {}
            t = threading.Thread(target=lambda: done.setdefault("d", s.step_boundary(7)), daemon=True)
            t.start()
            held = sidecar.wait_for_message("held")
            assert (held.generation, held.step) == (2, 7)
            sidecar.send(resume(2, 0))
            t.join(WAIT)
            assert done["d"].generation == 2
            s.resumed(done["d"], 7, "memory", 0.0)
            # A hold for a step this process already completed: hold now, the coordinator compares.
            sidecar.send(trainer_pb2.SidecarCommand(hold=trainer_pb2.Hold(generation=3, at_step=5)))
            sidecar.wait_for(lambda: bool(s._link.inbox), "the second hold to arrive")
            t = threading.Thread(target=lambda: done.__setitem__("d", s.step_boundary(9)), daemon=True)
            t.start()
            held = sidecar.wait_for_message("held", 2)
            assert (held.generation, held.step) == (3, 9)
            sidecar.send(resume(3, 0))
            t.join(WAIT)
        finally:
            s.close()


BLOCKED_TRAINER = textwrap.dedent(
    """
    import sys, threading
    from trainer_hooks import ElasticSession
    s = ElasticSession.connect(sys.argv[1], job="mc-job", process_index=1, process_count=2,
                               abort_grace_seconds=0.5)
    s._link.connected.wait(30)
    print("attached", flush=True)
    threading.Event().wait()  # the main thread blocked for good, as in a collective whose peer died
    """
)


def test_abort_ends_a_process_whose_main_thread_is_blocked_with_its_exit_code() -> None:
    with FakeSidecar() as sidecar:
        proc = subprocess.Popen(
            [sys.executable, "-c", BLOCKED_TRAINER, sidecar.address],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "attached"
            # A command other than Abort never ends it.
            sidecar.send(trainer_pb2.SidecarCommand(hold=trainer_pb2.Hold(generation=2, at_step=1)))
            time.sleep(1.5)
            assert proc.poll() is None, "the process ended without an Abort"
            t0 = time.monotonic()
            sidecar.send(
                trainer_pb2.SidecarCommand(abort=trainer_pb2.Abort(generation=2, exit_code=42, reason="host lost"))
            )
            code = proc.wait(timeout=WAIT)
            took = time.monotonic() - t0
            assert code == 42
            assert took < 10.0  # the grace is 0.5 s; generous for a loaded machine
            assert "exiting 42" in (proc.stderr.read() if proc.stderr else "")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_single_controller_session_arms_no_watchdog() -> None:
    with FakeSidecar() as sidecar:
        code = textwrap.dedent(
            """
            import sys, threading
            from trainer_hooks import ElasticSession
            s = ElasticSession.connect(sys.argv[1], job="mc-job")
            s._link.connected.wait(30)
            print("attached", flush=True)
            threading.Event().wait(4)
            print("still here", flush=True)
            """
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code, sidecar.address], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "attached"
            sidecar.send(trainer_pb2.SidecarCommand(abort=trainer_pb2.Abort(generation=2, exit_code=42, reason="x")))
            assert proc.wait(timeout=WAIT) == 0
            assert "still here" in proc.stdout.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("at_step", [0, 5])
def test_a_hold_that_reaches_a_process_waiting_to_start_holds_at_once(at_step: int) -> None:
    """Not at a step boundary (waiting for its first resume) there is no step to train on to:
    the hold is acknowledged at once, whatever at_step says (0 for a single-controller job)."""
    with FakeSidecar() as sidecar:
        s = ElasticSession.connect(sidecar.address, job=JOB, process_index=0, process_count=2, abort_grace_seconds=None)
        try:
            sidecar.wait_for_message("hello")
            sidecar.send(trainer_pb2.SidecarCommand(hold=trainer_pb2.Hold(generation=2, at_step=at_step)))
            done: dict[str, Any] = {}
            t = threading.Thread(target=lambda: done.setdefault("d", s.start(-1, timeout=WAIT)), daemon=True)
            t.start()
            held = sidecar.wait_for_message("held")
            assert (held.generation, held.step) == (2, -1)
            sidecar.send(resume(2, 0))
            t.join(WAIT)
            assert done["d"].generation == 2
        finally:
            s.close()
