"""The trainer guards itself, is fenced, authenticates, and tells the truth about flushes.

Every test runs the real :class:`ElasticSession` over its real link against a
real gRPC server on loopback (:class:`FakeSidecar`); flushes go through a real
Orbax CheckpointManager in a temporary directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trainer_hooks import AbortTraining, Directive, ElasticSession, FlushResult
from trainer_hooks import session as session_module
from trainer_hooks.session import DEFAULT_ADDRESS, ENV_TOKEN_FILE

from .sidecar import FakeSidecar, boundary_until, call_within, flush, free_port, hold, resume

np = pytest.importorskip("numpy")
ocp = pytest.importorskip("orbax.checkpoint")

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 1.0
"""elastic_timeout_seconds in these tests."""
SLACK = 2.5
GRACE = 0.5
"""session.DECISION_GRACE_SECONDS in the no-decision tests (5 s shipped)."""
"""How much later than the timeout an abort may come on a loaded 2-core machine."""


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def make_tree(step: int) -> dict[str, Any]:
    return {"w": np.full((256, 8), float(step), np.float32), "count": np.asarray(step, np.int64)}


class Flusher:
    """A real Orbax flusher; the state is unreadable when a slice in ``unreadable_if_down`` is down."""

    def __init__(self, directory: Path, unreadable_if_down: frozenset[int] = frozenset(), fail_steps=()) -> None:  # type: ignore[no-untyped-def]
        from trainer_hooks.orbax_flush import OrbaxFlusher, tree_nbytes

        self.manager = ocp.CheckpointManager(
            directory, options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True, max_to_keep=10)
        )
        self.calls: list[tuple[int, frozenset[int]]] = []
        self.unreadable_if_down = unreadable_if_down
        self.fail_steps = set(fail_steps)

        def make_args(step: int, down: frozenset[int]) -> tuple[Any, int]:
            if down & self.unreadable_if_down or step in self.fail_steps:
                raise RuntimeError(f"cannot flush step {step}: no surviving replica of the state")
            tree = make_tree(step)
            return ocp.args.Composite(state=ocp.args.StandardSave(tree)), tree_nbytes(tree)

        self._inner = OrbaxFlusher(self.manager, make_args)

    def __call__(self, step: int, down: frozenset[int]) -> FlushResult:
        self.calls.append((step, down))
        return self._inner(step, down)

    def committed(self) -> list[int]:
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


@pytest.fixture
def flusher(tmp_path: Path) -> Iterator[Flusher]:
    f = Flusher(tmp_path / "checkpoints", unreadable_if_down=frozenset({3}))
    yield f
    f.close()


class Events(list):  # type: ignore[type-arg]
    def __call__(self, kind: str, fields: dict[str, Any]) -> None:
        self.append((kind, fields))

    def kinds(self) -> list[str]:
        return [k for k, _ in self]


def connect(address: str, flusher: Any = None, timeout: float = TIMEOUT, **kw: Any) -> tuple[ElasticSession, Events]:
    events = Events()
    session = ElasticSession.connect(
        address, job="guard-job", flush=flusher, on_event=events, elastic_timeout_seconds=timeout, **kw
    )
    return session, events


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` on a thread; the dict gets ``result`` or ``error`` and ``at`` (monotonic end time)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as e:
            out["error"] = e
        out["at"] = time.monotonic()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def idle_until(session: ElasticSession, step: int, cond: Callable[[], bool], timeout: float = 10.0) -> None:
    """Step boundaries at ``step`` (no directive expected) until ``cond`` holds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        assert session.step_boundary(step) is None
        time.sleep(0.005)


def started(sidecar: FakeSidecar, session: ElasticSession, steps: int = 5, epoch: int = 0) -> Directive:
    """start() answered by a resume on slices 0 and 1, then ``steps`` steps trained and reported."""
    sidecar.send(resume(1, 0, 1, epoch=epoch))
    d = session.start(-1, timeout=10)
    session.resumed(d, 0, "fresh", 0.0)
    for s in range(1, steps + 1):
        assert session.step_boundary(s - 1) is None
        session.report_step(s, 0.001)
    sidecar.wait_for(lambda: len(sidecar.of("step")) >= steps, f"{steps} step reports")
    return d


# ---------------------------------------------------------------------------
# (1) no sidecar at start
# ---------------------------------------------------------------------------


def test_start_without_a_sidecar_aborts_42_after_the_timeout(flusher: Flusher) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens here
    session, events = connect(address, flusher)
    t0 = time.monotonic()
    try:
        with pytest.raises(AbortTraining) as ei:
            call_within(session.start, TIMEOUT + SLACK + 5)
    finally:
        session.close()
    waited = time.monotonic() - t0
    print(f"\n[guard] start() with no sidecar: AbortTraining after {waited:.2f} s (timeout {TIMEOUT} s)")
    assert ei.value.exit_code == 42
    assert TIMEOUT <= waited < TIMEOUT + SLACK
    assert f"no sidecar at {address}" in ei.value.reason and "waiting to start" in ei.value.reason
    assert "elastic_timeout_seconds=1" in ei.value.reason
    assert ei.value.committed_step == -1
    assert flusher.calls == []  # nothing trained: nothing to flush
    assert events.kinds() == ["sidecar_lost"]


def test_start_waits_for_a_sidecar_that_comes_up_within_the_timeout(flusher: Flusher) -> None:
    port = free_port()
    session, events = connect(f"127.0.0.1:{port}", flusher, timeout=4.0)
    t, out = in_thread(lambda: session.start(-1))
    try:
        time.sleep(1.5)
        assert t.is_alive(), out
        with FakeSidecar(port) as sidecar:
            hello = sidecar.wait_for_message("hello", timeout=5)
            assert (hello.job, hello.step_in_memory, hello.held, hello.epoch) == ("guard-job", -1, False, 0)
            sidecar.send(resume(1, 0, 1))
            t.join(10)
    finally:
        session.close()
    assert "error" not in out, out
    assert out["result"].active_slices == (0, 1)
    assert "sidecar_lost" not in events.kinds()


# ---------------------------------------------------------------------------
# (2) the sidecar gone while the trainer is held
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("intact", [True, False], ids=["state-intact", "state-unreadable"])
def test_sidecar_gone_during_a_hold_flushes_if_it_can_then_aborts_42(flusher: Flusher, intact: bool) -> None:
    sidecar = FakeSidecar().start()
    session, events = connect(sidecar.address, flusher)
    try:
        started(sidecar, session, steps=5)
        # A hold without a flush (memory suffices); slice 3's loss makes the state unreadable.
        sidecar.send(hold(2, flush=False, down=(1,) if intact else (1, 3)))
        t, out = in_thread(lambda: boundary_until(session, 5))
        ack = sidecar.wait_for_message("held")
        assert (ack.generation, ack.step, ack.committed_step, ack.flush_error) == (2, 5, -1, "")
        assert session.held
        gone = time.monotonic()
        sidecar.stop()
        t.join(TIMEOUT + SLACK + 10)
    finally:
        sidecar.stop()
        session.close()
    assert not t.is_alive()
    err = out.get("error")
    assert isinstance(err, AbortTraining), out
    after = out["at"] - gone
    print(f"\n[guard] link lost during a hold ({'intact' if intact else 'unreadable'}): exit 42 after {after:.2f} s")
    assert err.exit_code == 42
    assert TIMEOUT <= after < TIMEOUT + SLACK
    assert "while held" in err.reason
    assert flusher.calls == [(5, frozenset({1}) if intact else frozenset({1, 3}))]
    if intact:
        assert flusher.committed() == [5]
        assert err.committed_step == 5 and session.committed_step == 5
        assert "flush" not in err.reason
    else:
        assert flusher.committed() == []  # nothing committed, nothing counted
        assert err.committed_step == -1 and session.committed_step == -1
        assert "flush of step 5 failed" in err.reason and "no surviving replica" in err.reason
        assert "flush_failed" in events.kinds()
    assert events.kinds()[0] == "held" and "sidecar_lost" in events.kinds()
    assert not session.held


def test_sidecar_gone_after_a_slice_error_flushes_from_the_survivors_then_aborts_42(flusher: Flusher) -> None:
    sidecar = FakeSidecar().start()
    session, events = connect(sidecar.address, flusher)
    try:
        started(sidecar, session, steps=4)
        sidecar.stop()
        t0 = time.monotonic()
        with pytest.raises(AbortTraining) as ei:
            call_within(
                lambda: session.slice_error(4, RuntimeError("DATA_LOSS: slice 1 is gone"), [1]), TIMEOUT + SLACK + 5
            )
        waited = time.monotonic() - t0
    finally:
        session.close()
    assert ei.value.exit_code == 42 and TIMEOUT <= waited < TIMEOUT + SLACK
    assert "waiting for an answer to a slice error" in ei.value.reason
    assert flusher.calls == [(4, frozenset({1}))]
    assert flusher.committed() == [4] and ei.value.committed_step == 4
    assert events.kinds() == ["slice_error", "sidecar_lost"]


def test_a_link_down_shorter_than_the_timeout_does_not_abort(flusher: Flusher) -> None:
    timeout = 4.0
    sidecar = FakeSidecar().start()
    session, events = connect(sidecar.address, flusher, timeout=timeout)
    try:
        started(sidecar, session, steps=5, epoch=7)
        sidecar.send(hold(2, flush=True, down=(1,), epoch=7))
        t, out = in_thread(lambda: boundary_until(session, 5, timeout=30))
        ack = sidecar.wait_for_message("held")
        assert (ack.step, ack.committed_step, ack.flush_error) == (5, 5, "")
        gone = time.monotonic()
        sidecar.stop()
        time.sleep(1.5)
        back = FakeSidecar(sidecar.port).start()
        try:
            hello = back.wait_for_message("hello", timeout=5)
            reattached = time.monotonic() - gone
            # What a restarted coordinator learns from the greeting.
            assert (hello.held, hello.generation, hello.step_in_memory, hello.committed_step, hello.epoch) == (
                True,
                2,
                5,
                5,
                7,
            )
            back.send(resume(2, 0, epoch=8))
            t.join(10)
        finally:
            back.stop()
    finally:
        session.close()
    print(f"\n[guard] sidecar back after 1.5 s: trainer re-attached {reattached:.2f} s after the loss, no abort")
    assert "error" not in out, out
    d = out["result"]
    assert (d.generation, d.active_slices, d.source) == (2, (0,), "memory")
    assert out["at"] - gone < timeout
    assert "sidecar_lost" not in events.kinds()
    assert session.epoch == 8 and not session.held
    assert flusher.calls == [(5, frozenset({1}))]  # the hold's flush only


def test_a_hung_sidecar_during_a_hold_is_a_lost_one(flusher: Flusher) -> None:
    """SIGSTOP: the process is there, its port accepts, nothing answers; keepalive must notice."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.trainer_hooks.sidecar"], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        session, events = connect(f"127.0.0.1:{port}", flusher)
        try:
            d = call_within(lambda: session.start(-1), 30)
            session.resumed(d, 0, "fresh", 0.0)
            session.report_step(1, 0.01)
            t, out = in_thread(lambda: boundary_until(session, 1, timeout=30))
            deadline = time.monotonic() + 10
            while "held" not in events.kinds():
                assert time.monotonic() < deadline, "never held"
                time.sleep(0.005)
            held_at = time.monotonic()
            time.sleep(0.2)  # the acknowledgement leaves
            stopped = time.monotonic()
            os.kill(proc.pid, signal.SIGSTOP)
            t.join(TIMEOUT + SLACK + 10)
        finally:
            session.close()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(10)
    err = out.get("error")
    assert isinstance(err, AbortTraining) and err.exit_code == 42, out
    after = out["at"] - stopped
    print(f"\n[guard] sidecar hung (SIGSTOP) during a hold: exit 42 after {after:.2f} s (timeout {TIMEOUT} s)")
    # Whichever bound comes first: no decision for the timeout since the hold (the link still looks
    # up until keepalive notices, ~1.5 s), or the link down for the timeout.
    assert out["at"] - held_at >= TIMEOUT
    assert after < TIMEOUT + 2.0 + SLACK
    assert "while held" in err.reason
    assert flusher.calls == [(1, frozenset())] and err.committed_step == 1


def test_a_held_trainer_without_a_decision_flushes_then_aborts_42(
    flusher: Flusher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link stays up but the coordinator decides nothing (its loop wedged on a hung disk write):
    after elastic_timeout_seconds (plus the grace) held without a resume or an abort, the trainer
    flushes and exits 42."""
    monkeypatch.setattr(session_module, "DECISION_GRACE_SECONDS", GRACE)
    sidecar = FakeSidecar().start()
    session, events = connect(sidecar.address, flusher)
    try:
        started(sidecar, session, steps=5)
        sidecar.send(hold(2, flush=False, down=(1,)))
        t, out = in_thread(lambda: boundary_until(session, 5, timeout=30))
        sidecar.wait_for_message("held")
        held_at = time.monotonic()
        t.join(TIMEOUT + SLACK + 10)
        link_up = session._link.connected.is_set()  # noqa: SLF001
    finally:
        sidecar.stop()
        session.close()
    err = out.get("error")
    assert isinstance(err, AbortTraining), out
    after = out["at"] - held_at
    print(f"\n[guard] held without a decision (link up): exit 42 after {after:.2f} s (timeout {TIMEOUT} s)")
    assert err.exit_code == 42
    assert TIMEOUT + GRACE - 0.05 <= after < TIMEOUT + GRACE + SLACK
    assert link_up  # the sidecar never went away: only its decision did
    assert "no decision from the sidecar" in err.reason and "while held" in err.reason
    assert flusher.calls == [(5, frozenset({1}))] and flusher.committed() == [5] and err.committed_step == 5
    assert events.kinds() == ["held", "sidecar_undecided"]
    assert events[1][1]["link_up"] is True


@pytest.mark.parametrize("after_a_failure", [False, True])
def test_an_operator_hold_waits_past_the_timeout_while_the_link_is_up(
    flusher: Flusher, monkeypatch: pytest.MonkeyPatch, after_a_failure: bool
) -> None:
    """An operator's hold has no deadline: the no-decision bound does not end it. ``after_a_failure``: held for a
    lost slice first, then held by an operator (the same generation again, agent.core.decide), which lifts the
    bound the failure's hold had."""
    monkeypatch.setattr(session_module, "DECISION_GRACE_SECONDS", GRACE)
    sidecar = FakeSidecar().start()
    session, events = connect(sidecar.address, flusher)
    try:
        started(sidecar, session, steps=3)
        first = "slice 1 lost" if after_a_failure else "operator hold: storage maintenance"
        sidecar.send(hold(2, flush=True, down=(1,), reason=first))
        t, out = in_thread(lambda: boundary_until(session, 3, timeout=30))
        sidecar.wait_for_message("held")
        if after_a_failure:
            sidecar.send(hold(2, flush=False, down=(1,), reason="operator hold: investigating"))
        time.sleep((TIMEOUT + GRACE) * 2)
        assert t.is_alive(), out
        sidecar.send(resume(2, 0, 1))
        t.join(10)
    finally:
        sidecar.stop()
        session.close()
    assert "error" not in out, out
    assert out["result"].generation == 2
    assert "sidecar_undecided" not in events.kinds() and "sidecar_lost" not in events.kinds()
    assert flusher.calls == [(3, frozenset({1}))]  # one flush: the operator's second hold flushed nothing more


def test_while_training_runs_a_missing_sidecar_never_stops_it(flusher: Flusher) -> None:
    sidecar = FakeSidecar().start()
    session, events = connect(sidecar.address, flusher, timeout=0.5)
    try:
        started(sidecar, session, steps=2)
        sidecar.stop()
        step, end = 2, time.monotonic() + 2.0  # four timeouts without a sidecar
        while time.monotonic() < end:
            assert session.step_boundary(step) is None
            step += 1
            session.report_step(step, 0.001)
            time.sleep(0.01)
        assert session._link.down_for() > 1.0
    finally:
        session.close()
    assert step > 50
    assert events.kinds() == [] and flusher.calls == []


# ---------------------------------------------------------------------------
# (3) fencing
# ---------------------------------------------------------------------------


def test_commands_from_an_older_epoch_are_ignored(flusher: Flusher) -> None:
    from protos.elastic_sidecar.v1 import trainer_pb2

    sidecar = FakeSidecar().start()
    session, events = connect(sidecar.address, flusher)
    try:
        started(sidecar, session, steps=3, epoch=100)
        assert session.epoch == 100
        # A superseded coordinator (epoch 99) tries to hold, flush and abort.
        sidecar.send(hold(2, flush=True, epoch=99))
        sidecar.send(flush(2, epoch=99))
        sidecar.send(trainer_pb2.SidecarCommand(abort=trainer_pb2.Abort(generation=9, exit_code=3), epoch=50))
        deadline = time.monotonic() + 10
        while events.kinds().count("fenced") < 3 and time.monotonic() < deadline:
            assert session.step_boundary(3) is None
            time.sleep(0.002)
        fenced = [f for k, f in events if k == "fenced"]
        assert [(f["kind"], f["epoch"], f["current_epoch"]) for f in fenced] == [
            ("hold", 99, 100),
            ("flush", 99, 100),
            ("abort", 50, 100),
        ]
        time.sleep(0.2)
        assert sidecar.of("held") == [] and sidecar.of("flushed") == []
        assert flusher.calls == [] and session.generation == 1 and session.epoch == 100
        # The same commands from the current epoch are obeyed; a newer epoch is adopted.
        sidecar.send(hold(2, flush=True, epoch=100))
        sidecar.send(resume(2, 0, 1, epoch=101))
        d = boundary_until(session, 3)
        assert d.generation == 2 and session.epoch == 101
        assert sidecar.wait_for_message("held").committed_step == 3
        # A reconnect greets with the newest epoch accepted.
        sidecar.stop()
        with FakeSidecar(sidecar.port) as back:
            hello = back.wait_for_message("hello")
            assert (hello.epoch, hello.generation, hello.committed_step, hello.held) == (101, 2, 3, False)
    finally:
        sidecar.stop()
        session.close()


def test_a_command_this_trainer_does_not_know_is_skipped(flusher: Flusher) -> None:
    from protos.elastic_sidecar.v1 import trainer_pb2

    sidecar = FakeSidecar().start()
    session, events = connect(sidecar.address, flusher)
    try:
        started(sidecar, session, steps=2)
        sidecar.send(trainer_pb2.SidecarCommand(epoch=3))  # no command set: what an unknown one parses as
        idle_until(session, 2, lambda: "unknown_command" in events.kinds())
        assert session.generation == 1 and session.epoch == 0
    finally:
        sidecar.stop()
        session.close()


def test_a_repeated_resume_is_acknowledged_again_without_a_rebuild(flusher: Flusher) -> None:
    sidecar = FakeSidecar().start()
    session, events = connect(sidecar.address, flusher)
    try:
        started(sidecar, session, steps=3, epoch=5)
        first = sidecar.wait_for_message("resumed")
        # A restarted coordinator (newer epoch) repeats the resume it did not see acknowledged.
        sidecar.send(resume(1, 0, 1, epoch=6))
        idle_until(session, 3, lambda: len(sidecar.of("resumed")) >= 2)
        again = sidecar.wait_for_message("resumed", 2)
        assert again == first and (again.generation, list(again.active_slices)) == (1, [0, 1])
        assert events.kinds() == ["duplicate_resume"] and session.epoch == 6
        # A resume of the same generation on other slices is not a repeat: it is obeyed.
        sidecar.send(resume(1, 0, epoch=6))
        d = boundary_until(session, 3)
        assert (d.generation, d.active_slices) == (1, (0,))
    finally:
        sidecar.stop()
        session.close()


def test_a_second_loss_during_a_hold_without_flush_flushes_from_the_survivors(flusher: Flusher) -> None:
    sidecar = FakeSidecar().start()
    session, _ = connect(sidecar.address, flusher, timeout=30)
    try:
        started(sidecar, session, steps=5)
        sidecar.send(hold(2, flush=False, down=(1,)))
        t, out = in_thread(lambda: boundary_until(session, 5, timeout=30))
        assert sidecar.wait_for_message("held").committed_step == -1
        # Slice 2 goes too: memory no longer suffices, the coordinator re-plans with a flush.
        sidecar.send(hold(3, flush=True, down=(2,)))
        second = sidecar.wait_for_message("held", 2)
        assert (second.generation, second.step, second.committed_step, second.flush_error) == (3, 5, 5, "")
        sidecar.send(resume(3, 0, memory=False))
        t.join(10)
    finally:
        sidecar.stop()
        session.close()
    assert "error" not in out, out
    d = out["result"]
    assert (d.generation, d.active_slices, d.source, d.down_slices) == (3, (0,), "checkpoint", frozenset({1, 2}))
    assert flusher.calls == [(5, frozenset({1, 2}))]  # read from neither lost slice
    assert flusher.committed() == [5]


# ---------------------------------------------------------------------------
# (4) the link presents its token
# ---------------------------------------------------------------------------


def test_the_token_from_the_token_file_is_presented(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "token").write_text("  s3cret-token\n")
    monkeypatch.setenv(ENV_TOKEN_FILE, str(tmp_path / "token"))
    with FakeSidecar(token="s3cret-token") as sidecar:
        session, _ = connect(sidecar.address)
        try:
            sidecar.send(resume(1, 0))
            d = session.start(-1, timeout=10)
        finally:
            session.close()
    assert d.active_slices == (0,)
    assert sidecar.rejected == 0
    assert sidecar.metadata[0]["authorization"] == "Bearer s3cret-token"


@pytest.mark.parametrize("problem", ["wrong", "missing-file"])
def test_a_refused_or_unreadable_token_is_a_link_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, problem: str
) -> None:
    token = tmp_path / "token"
    if problem == "wrong":
        token.write_text("not-the-token\n")
    monkeypatch.setenv(ENV_TOKEN_FILE, str(token))
    with FakeSidecar(token="s3cret-token") as sidecar:
        session, _ = connect(sidecar.address)
        t0 = time.monotonic()
        try:
            with pytest.raises(AbortTraining) as ei:
                call_within(session.start, TIMEOUT + SLACK + 5)
        finally:
            session.close()
    waited = time.monotonic() - t0
    assert ei.value.exit_code == 42 and TIMEOUT <= waited < TIMEOUT + SLACK
    if problem == "wrong":
        assert sidecar.rejected >= 1
        assert sidecar.metadata[0]["authorization"] == "Bearer not-the-token"
        assert "UNAUTHENTICATED" in ei.value.reason
    else:
        assert sidecar.metadata == []  # never attached without its token
        assert "cannot read the trainer link token" in ei.value.reason


def test_the_default_address_is_the_coordinators_trainer_port() -> None:
    assert DEFAULT_ADDRESS == "127.0.0.1:29313"


# ---------------------------------------------------------------------------
# (5) flushes tell the truth
# ---------------------------------------------------------------------------


def test_a_failed_flush_reports_its_error_and_is_never_counted(tmp_path: Path) -> None:
    f = Flusher(tmp_path / "checkpoints", fail_steps={7})
    sidecar = FakeSidecar().start()
    session, events = connect(sidecar.address, f, timeout=30)
    try:
        started(sidecar, session, steps=4)
        sidecar.send(flush(1))
        idle_until(session, 4, lambda: len(sidecar.of("flushed")) >= 1)
        ok = sidecar.wait_for_message("flushed")
        assert (ok.committed_step, ok.flush_error) == (4, "")
        assert ok.flush_bytes > 0

        for s in range(5, 8):
            session.report_step(s)
        # An operator flush of step 7 fails.
        sidecar.send(flush(1))
        idle_until(session, 7, lambda: len(sidecar.of("flushed")) >= 2)
        bad = sidecar.wait_for_message("flushed", 2)
        assert bad.committed_step == 4 and bad.flush_bytes == 0
        assert "no surviving replica" in bad.flush_error
        # A hold with a flush of step 7 fails too: acknowledged as failed, committed step 4.
        sidecar.send(hold(2, flush=True))
        sidecar.send(resume(2, 0, 1))
        assert boundary_until(session, 7).generation == 2
        held = sidecar.wait_for_message("held")
        assert (held.step, held.committed_step) == (7, 4) and "no surviving replica" in held.flush_error
        # The trainer's own flush (before a restart) says the same.
        assert session.flush(7) == 4
        own = sidecar.wait_for_message("flushed", 3)
        assert own.committed_step == 4 and "no surviving replica" in own.flush_error
    finally:
        sidecar.stop()
        session.close()
        committed = f.committed()
        f.close()
    assert session.committed_step == 4
    assert committed == [4]
    assert events.kinds().count("flush_failed") == 3


# ---------------------------------------------------------------------------
# (6) the example trainer exits 42
# ---------------------------------------------------------------------------


def test_the_example_trainer_exits_42_when_no_sidecar_comes(tmp_path: Path) -> None:
    pytest.importorskip("pathwaysutils")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    env.pop(ENV_TOKEN_FILE, None)
    events = tmp_path / "events.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "simjob.trainer",
        "--sidecar",
        f"127.0.0.1:{free_port()}",
        "--workdir",
        str(tmp_path),
        "--slices",
        "2",
        "--devices-per-slice",
        "1",
        "--steps",
        "5",
        "--elastic-timeout-seconds",
        str(TIMEOUT),
        "--events",
        str(events),
    ]
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 42, r.stderr[-3000:]
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    aborts = [x for x in lines if x["kind"] == "abort"]
    assert len(aborts) == 1 and aborts[0]["exit_code"] == 42
    assert "no sidecar at" in aborts[0]["reason"] and "waiting to start" in aborts[0]["reason"]
    assert [x["kind"] for x in lines].count("step") == 0
    print(f"\n[guard] example trainer with no sidecar: exit 42 after {took:.1f} s (process start included)")


def test_finished_reaches_a_sidecar_that_is_restarting_when_training_ends(flusher: Flusher) -> None:
    sidecar = FakeSidecar().start()
    session, _ = connect(sidecar.address, flusher, timeout=30.0)
    try:
        started(sidecar, session, steps=5, epoch=7)
        sidecar.stop()
        t, out = in_thread(lambda: session.finished(5))
        time.sleep(1.0)
        back = FakeSidecar(sidecar.port).start()
        try:
            done = back.wait_for_message("finished", timeout=10)
            assert done.step == 5
            t.join(10)
            assert not t.is_alive() and "error" not in out, out
        finally:
            back.stop()
    finally:
        session.close()


def test_close_ends_the_link_and_its_thread_before_returning(flusher: Flusher) -> None:
    """What was queued still leaves, the sidecar ends the stream on the trainer's half-close, and no thread
    of the link is left inside gRPC when the process goes on to exit (grpc/grpc#18456)."""
    with FakeSidecar() as sidecar:
        session, _ = connect(sidecar.address, flusher)
        started(sidecar, session, steps=2)
        session.report_step(3, 0.001)
        t0 = time.monotonic()
        session.close()
        took = time.monotonic() - t0
        assert not session._link._thread.is_alive()  # noqa: SLF001
        assert [m.step for m in sidecar.of("step")][-1] == 3
        assert took < 2.0, took  # ended by the sidecar, not cancelled after the wait
