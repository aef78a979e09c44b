"""The calls a training loop makes: one per step, plus error and resume reports.

A loop looks like this (see ``simjob/trainer.py`` and ``trainer_hooks/maxtext``)::

    session = ElasticSession.connect(address, job="my-job", flush=flusher)
    d = session.start(step_in_memory=-1)          # blocks until the first Resume
    state = build(d)                              # mesh over d.active_slices
    while step < total:
        d = session.step_boundary(step)           # microseconds when nothing is pending
        if d: state = rebuild(d)                  # hold/resume happened: new mesh
        try:
            state = train_step(state); step += 1
            session.report_step(step, seconds)
        except jax.errors.JaxRuntimeError as e:
            if not is_slice_down(e): raise
            d = session.slice_error(step, e, guessed_slices)   # blocks through hold -> resume
            state = rebuild(d)
    session.finished(step)

A hold waits for any in-flight async save, flushes if asked (only a step
Orbax committed counts; a failed flush is acknowledged with its error and
never counted), acknowledges, and blocks until resume or abort. A hold that
asks for a snapshot instead (a drain whose state stays on the slices that
remain) calls the trainer's ``snapshot`` hook, which makes its newest in-memory
snapshot the held step's; a trainer without one, or whose hook cannot keep the
state there, flushes instead. A prepare (the slices the job will run on next,
sent when a drain is planned or begins) calls the trainer's ``prepare`` hook,
which may build that mesh's program in the background; it is advice, never
acknowledged, and a trainer without the hook ignores it. An abort
raises :class:`AbortTraining` carrying the exit code (42: restart).

The trainer guards itself: while it is blocked on the sidecar (waiting to
start, held, or waiting for an answer to a slice error) and the link has been
down for ``elastic_timeout_seconds`` without a break, it flushes if it holds a
step that is not committed yet (reading only slices not known down), then
raises :class:`AbortTraining` (42). A held trainer (or one waiting for an
answer to a slice error) whose link stays up but that gets neither a resume
nor an abort for ``elastic_timeout_seconds`` (plus :data:`DECISION_GRACE_SECONDS`)
does the same: its coordinator decides within that time or aborts itself, so
silence that long means a wedged coordinator (a hung disk write, a stuck
loop), and waiting longer would hang the job. A hold an operator asked for (its reason begins
``operator hold``) waits without that bound, as long as the link is up. An
address that answers gRPC without the trainer link (another port of the
sidecar) raises :class:`SidecarAddressError` from :meth:`ElasticSession.start`
within seconds, naming ``ELASTIC_SIDECAR_ADDRESS``. While training runs, a
missing sidecar never stops it. Commands from a coordinator epoch older than the newest the
trainer accepted are ignored (fencing); the link presents a bearer token from
``ELASTIC_SIDECAR_TOKEN_FILE`` when that is set.

Multi-controller JAX (one process per host, ``process_count`` > 1): every
process opens its own link and says which process it is. A hold names the
step boundary to stop at (``Hold.at_step``): a process short of it keeps
training until it has completed that step, so every process stops at the same
boundary (collectives need all of them). A process blocked inside a collective
whose peer died never reaches a boundary, so the link thread itself ends the
process: on an Abort, a watchdog gives the main thread
``abort_grace_seconds`` to leave through :class:`AbortTraining`, then calls
``os._exit(exit_code)``. An abort never flushes there (a save is collective and
would block on the dead peer); an announced disruption is flushed by the hold
before the abort.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NoReturn, Protocol

from protos.elastic_sidecar.v1 import trainer_pb2
from trainer_hooks.link import SidecarLink

EXIT_RESTART = 42
"""xpk restarts a workload that exits 42 (``agent.constants.EXIT_RESTART``; not imported here)."""
DEFAULT_ELASTIC_TIMEOUT = 300.0
"""MaxText's default ``elastic_timeout_seconds``."""
ENV_TOKEN_FILE = "ELASTIC_SIDECAR_TOKEN_FILE"
"""Path of a file holding the trainer link's bearer token (optional)."""
DEFAULT_ADDRESS = "127.0.0.1:29313"
"""Where the coordinator serves the trainer link by default (its ``--trainer-listen``)."""
ENV_REPORT_INTERVAL = "ELASTIC_SIDECAR_STEP_REPORT_SECONDS"
"""Seconds between step reports at the most (default :data:`REPORT_INTERVAL`; 0: every step)."""
REPORT_INTERVAL = 0.05
"""Step reports are sent at most this often (:meth:`ElasticSession.report_step`) in a multi-controller job: a
TPU step of a second or more is reported every step; faster steps are reported together, well within the
hold's margin (``agent.trainer_group.LEAD_SECONDS``, 0.5 s), which counts from the highest step reported."""
SINGLE_REPORT_INTERVAL = 0.5
"""The same with one process (MaxText on Pathways): its holds name no step (the next boundary), so the reports
only feed the hang check (60 s at the least), the step gauges and the status; each report wakes the link's
thread, which took about 0.3 ms of a 27 ms MaxText step here at one report every 50 ms."""
FINISHED_WAIT_SECONDS = 10.0
"""At the end of training, how long a link that is down is waited for to say ``Finished``."""
DEFAULT_ABORT_GRACE = 1.0
"""Seconds a multi-controller process gets to leave on its own after an Abort before the watchdog ends it."""
LEADER_EXTRA_GRACE = 0.5
"""Process 0 (jax.distributed's coordination service) waits this much longer, so it goes last."""
DECISION_GRACE_SECONDS = 5.0
"""Added to ``elastic_timeout_seconds`` for the no-decision bound: the coordinator's own deadline for the
same wait starts when it receives the acknowledgement, and a slice back just before it still settles
(``settle_seconds``) before the resume."""
OPERATOR_HOLD_PREFIX = "operator hold"
"""How the reason of a hold an operator asked for begins (agent.core.decide's ``operator <kind>: ...``):
such a hold has no deadline, so the trainer's no-decision bound does not apply to it."""

SLICE_DOWN_MARKERS = ("DATA_LOSS", "DEADLINE_EXCEEDED", "NOT_FOUND", "INTERNAL")
"""Substrings Pathways puts in a JaxRuntimeError when a slice is gone
(pathwaysutils.elastic.is_error_due_to_slice_down tests the same ones)."""


def is_slice_down(err: BaseException) -> bool:
    """Whether a runtime error means lost hardware rather than a bug."""
    if type(err).__name__ != "JaxRuntimeError":
        return False
    text = str(err)
    return any(m in text for m in SLICE_DOWN_MARKERS)


def report_interval_from_env(process_count: int = 1) -> float:
    """``ELASTIC_SIDECAR_STEP_REPORT_SECONDS`` as seconds (>= 0), else :data:`SINGLE_REPORT_INTERVAL` for one
    process and :data:`REPORT_INTERVAL` for several; ValueError naming the variable and its value when it is
    not such a number."""
    raw = os.environ.get(ENV_REPORT_INTERVAL, "").strip()
    if not raw:
        return REPORT_INTERVAL if process_count > 1 else SINGLE_REPORT_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{ENV_REPORT_INTERVAL}={raw!r}: expected seconds >= 0 (0: report every step)")
    return value


@dataclass(frozen=True)
class FlushResult:
    committed_step: int
    nbytes: int = 0


SnapshotKeeper = Callable[[int, frozenset[int]], str]
"""``(step, leaving_slices) -> ""`` once the newest in-memory snapshot (or the live state the trainer resumes
from) holds ``step`` on the slices not leaving, nothing written to storage; else why it cannot (then a flush)."""


MeshPreparer = Callable[[tuple[int, ...]], "Future[object] | None"]
"""``(slices) -> future or None``: start building the program for the mesh over ``slices`` (sorted), the one the job
will run on next, and return at once (a background compile) with its future, so that the resume onto that mesh finds
it ready; None when nothing is being built (already built, or not possible)."""
PREPARE_HOLD_WAIT_SECONDS = 10.0
"""A drain's hold from memory waits at most this long from its arrival, training on, for the next mesh's program
being built, unless the hold says how long (``Hold.prepare_wait_seconds``, from the notice's lead): steps on the
full mesh are worth more than a stall. Well inside the shortest notice lead (a Spot VM's 30 s): the hold still
acknowledges, with the snapshot, before the host goes; a longer compile goes on through the hold."""


class Flusher(Protocol):
    """Makes ``step`` durable and returns the newest committed step.

    ``down_slices``: slices whose devices must not be read.
    """

    def __call__(self, step: int, down_slices: frozenset[int]) -> FlushResult: ...


@dataclass(frozen=True)
class Directive:
    """What the trainer must run on after a hold: exactly these slices."""

    generation: int
    active_slices: tuple[int, ...]
    source: str  # "memory" | "checkpoint"
    reason: str
    down_slices: frozenset[int] = frozenset()


class SidecarAddressError(ConnectionError):
    """The trainer's sidecar address answers gRPC but serves no trainer link: a configuration mistake."""


class AbortTraining(Exception):
    """The sidecar decided the job must stop; exit with ``exit_code``."""

    def __init__(self, exit_code: int, reason: str, committed_step: int) -> None:
        super().__init__(f"aborted with exit code {exit_code}: {reason} (last committed step {committed_step})")
        self.exit_code = exit_code
        self.reason = reason
        self.committed_step = committed_step


@dataclass
class ElasticSettings:
    """The trainer's elastic flags, MaxText names, reported to the sidecar."""

    elastic_min_slice_count: int = -1
    elastic_timeout_seconds: float = 300.0
    elastic_max_retries: int = 10


_SOURCE_NAMES = {trainer_pb2.Resume.MEMORY: "memory", trainer_pb2.Resume.CHECKPOINT: "checkpoint"}
_CommandBody = trainer_pb2.Hold | trainer_pb2.Resume | trainer_pb2.Flush | trainer_pb2.Abort | trainer_pb2.Prepare


class ElasticSession:
    def __init__(
        self,
        link: SidecarLink,
        *,
        flush: Flusher | None = None,
        on_event: Callable[[str, dict[str, object]], None] | None = None,
        elastic_timeout_seconds: float = DEFAULT_ELASTIC_TIMEOUT,
        snapshot: SnapshotKeeper | None = None,
        process_index: int = 0,
        process_count: int = 1,
        report_interval: float = REPORT_INTERVAL,
        prepare: MeshPreparer | None = None,
    ) -> None:
        self._link = link
        self.report_interval = max(0.0, float(report_interval))
        """Seconds between step reports at the most (:meth:`report_step`; 0: every step)."""
        self._unsent_steps = 0
        self._unsent_seconds = 0.0
        self._unsent_step = -1
        self._unsent_generation = 0
        """The newest step not reported yet and its generation (``self.step`` moves on a resume)."""
        self._reported_at = -math.inf
        self.process_index = process_index
        self.process_count = max(1, process_count)
        """JAX processes of the job; above 1 the job is multi-controller (see the module docstring)."""
        self._deferred: trainer_pb2.SidecarCommand | None = None
        """A hold whose ``at_step`` this process has not completed yet, or that waits for a prepare."""
        self._deferred_since = 0.0
        """When the deferred hold first arrived (a repeat of it keeps the time)."""
        self._watchdog: threading.Thread | None = None
        self._abort_armed = threading.Event()
        self._abort_code = EXIT_RESTART
        self._abort_reason = ""
        self._abort_grace = 0.0
        self._flush = flush
        self._snapshot = snapshot
        self._prepare = prepare
        self._preparing: tuple[tuple[int, ...], Future[object]] | None = None
        """The mesh being prepared on the sidecar's advice: its slices and its future."""
        self._on_event = on_event if on_event is not None else (lambda kind, fields: None)
        self.elastic_timeout_seconds = (
            float(elastic_timeout_seconds) if elastic_timeout_seconds > 0 else DEFAULT_ELASTIC_TIMEOUT
        )
        """How long the trainer waits, blocked, for a sidecar that is gone before it aborts (42)."""
        self.generation = 0
        self.epoch = 0
        """Newest coordinator epoch a command was accepted from (0: none)."""
        self.epoch_coordinator = ""
        self.epoch_proof = b""
        """Who issued that epoch and its proof, echoed in the hello (agent/durable/fencing.py verifies them)."""
        self.step = -1  # last completed step held in memory (-1: none)
        self.committed_step = -1
        self.held = False
        """True while blocked in a hold or waiting for an answer to a slice error."""
        self._hold_reason = ""
        """The reason of the hold being waited in ('' while waiting for an answer to a slice error)."""
        self.active_slices: tuple[int, ...] = ()
        self._flushed_at = -1
        self._down: frozenset[int] = frozenset()
        self._resumed_ack: trainer_pb2.ResumedAck | None = None
        self._resumed_for: tuple[int, ...] = ()
        """The slices the sidecar's resume named, for the acknowledged one (the mesh's may differ)."""

    # -- construction ----------------------------------------------------------

    @classmethod
    def connect(
        cls,
        address: str,
        *,
        job: str = "",
        total_steps: int = 0,
        settings: ElasticSettings | None = None,
        flush: Flusher | None = None,
        on_event: Callable[[str, dict[str, object]], None] | None = None,
        snapshot: SnapshotKeeper | None = None,
        prepare: MeshPreparer | None = None,
        token: str | None = None,
        token_file: str | None = None,
        elastic_timeout_seconds: float | None = None,
        process_index: int = 0,
        process_count: int = 1,
        host: str = "",
        abort_grace_seconds: float | None = DEFAULT_ABORT_GRACE,
        exit: Callable[[int], object] = os._exit,
        report_interval: float | None = None,
    ) -> ElasticSession:
        """Open the link to the sidecar at ``address`` (on a background thread; returns at once).

        ``token`` / ``token_file``: the link's bearer token; by default the file
        named by ``ELASTIC_SIDECAR_TOKEN_FILE``, if set. ``elastic_timeout_seconds``:
        the self-guard's timeout; by default ``settings.elastic_timeout_seconds``,
        else 300 s. Only ``settings`` is reported to the sidecar.

        ``process_index`` / ``process_count`` / ``host``: this process in a
        multi-controller job (``jax.process_index()``, ``jax.process_count()``,
        the host name). ``report_interval``: seconds between step reports at the most
        (default: ``ELASTIC_SIDECAR_STEP_REPORT_SECONDS``, else :func:`report_interval_from_env`'s default for
        ``process_count``).
        With ``process_count`` > 1 and ``abort_grace_seconds`` not None, an Abort ends the process with ``exit(exit_code)``
        (``os._exit``) if it has not left ``abort_grace_seconds`` after the
        Abort arrived (it is blocked in a collective whose peer is gone);
        process 0, which hosts jax.distributed's coordination service, gets
        :data:`LEADER_EXTRA_GRACE` more so that it goes last (when it goes
        first, JAX terminates the other processes with SIGABRT, not 42).
        """
        holder: list[ElasticSession] = []

        def hello() -> trainer_pb2.TrainerHello:
            return holder[0]._hello(job, total_steps, settings, process_index, process_count, host)

        if token is None and token_file is None:
            token_file = os.environ.get(ENV_TOKEN_FILE, "").strip() or None
        if elastic_timeout_seconds is None:
            elastic_timeout_seconds = (
                settings.elastic_timeout_seconds if settings is not None else DEFAULT_ELASTIC_TIMEOUT
            )
        watch = process_count > 1 and abort_grace_seconds is not None

        def on_command(cmd: trainer_pb2.SidecarCommand) -> None:
            if holder:
                holder[0]._arm_watchdog(cmd)

        link = SidecarLink(address, hello, token=token, token_file=token_file, on_command=on_command)
        session = cls(
            link,
            flush=flush,
            snapshot=snapshot,
            prepare=prepare,
            on_event=on_event,
            elastic_timeout_seconds=elastic_timeout_seconds,
            process_index=process_index,
            process_count=process_count,
            report_interval=report_interval_from_env(process_count) if report_interval is None else report_interval,
        )
        holder.append(session)
        if watch:
            session._start_watchdog(float(abort_grace_seconds or 0.0), exit)
        session._link.start()
        return session

    def _hello(
        self,
        job: str,
        total_steps: int,
        settings: ElasticSettings | None,
        process_index: int,
        process_count: int,
        host: str,
    ) -> trainer_pb2.TrainerHello:
        """What the link sends at every (re)connection: who this trainer is and where it stands."""
        h = trainer_pb2.TrainerHello(
            job=job,
            step_in_memory=self.step,
            generation=self.generation,
            active_slices=list(self.active_slices),
            total_steps=total_steps,
            epoch=self.epoch,
            epoch_coordinator=self.epoch_coordinator,
            epoch_proof=self.epoch_proof,
            committed_step=self.committed_step,
            held=self.held,
            process_index=process_index,
            process_count=process_count,
            host=host,
        )
        if settings is not None:
            h.has_elastic_settings = True
            h.elastic_min_slice_count = settings.elastic_min_slice_count
            h.elastic_timeout_seconds = settings.elastic_timeout_seconds
            h.elastic_max_retries = settings.elastic_max_retries
        return h

    # -- the per-step path -----------------------------------------------------

    def step_boundary(self, step: int) -> Directive | None:
        """Call between steps (``step``: steps completed). Returns a Directive after a hold/resume cycle."""
        if not self._link.inbox and (self._deferred is None or not self._deferred_due(step)):
            return None
        self.step = step
        return self._drain(step)

    def report_step(self, step: int, seconds: float = 0.0) -> None:
        """Step ``step`` completed in ``seconds``. Sent at most every ``report_interval`` seconds: a report
        wakes the link's thread, which in a diagnostic run of MaxText on this project's 2-core CPU took
        0.64 ms of a 44 ms step. A report then stands for every step since the last one of the same
        generation: the newest step and their mean seconds. Any other message, and :meth:`finished`
        and :meth:`close`, send the unsent report first, so the sidecar never sees an event out of order."""
        self.step = step
        if self._unsent_generation != self.generation:
            self._send_unsent_report()  # steps of an earlier generation are reported as such
        self._unsent_steps += 1
        self._unsent_seconds += seconds
        self._unsent_step, self._unsent_generation = step, self.generation
        now = time.monotonic()
        if now - self._reported_at >= self.report_interval:
            self._send_step_report(now)

    def _send_unsent_report(self) -> None:
        if self._unsent_steps:
            self._send_step_report(time.monotonic())

    def _send_step_report(self, now: float) -> None:
        n, self._unsent_steps = self._unsent_steps, 0
        total, self._unsent_seconds = self._unsent_seconds, 0.0
        self._reported_at = now
        self._link.send(
            trainer_pb2.TrainerMessage(
                step=trainer_pb2.StepReport(
                    step=self._unsent_step, step_seconds=total / n, generation=self._unsent_generation
                )
            )
        )

    def _send(self, msg: trainer_pb2.TrainerMessage) -> None:
        """Send ``msg`` after the unsent step report, if any."""
        self._send_unsent_report()
        self._link.send(msg)

    # -- blocking calls ----------------------------------------------------------

    def start(self, step_in_memory: int = -1, timeout: float | None = None) -> Directive:
        """Wait for the sidecar to say on which slices to start.

        With no sidecar for ``elastic_timeout_seconds``: :class:`AbortTraining`
        (42), without a flush (nothing new to save before the first start).
        ``timeout`` bounds the wait whatever the link does (``TimeoutError``).
        """
        self.step = step_in_memory
        since = time.monotonic()
        deadline = None if timeout is None else since + timeout
        while True:
            cmd = self._next_command(since, deadline)
            if cmd is None:
                misdirected = getattr(self._link, "wrong_service", "")
                if misdirected:
                    self._on_event("wrong_service", {"address": self._link.address, "error": misdirected})
                    raise SidecarAddressError(misdirected)
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"no start command from the sidecar at {self._link.address} within {timeout} s")
                self._guard_abort(step_in_memory, "waiting to start", flush=False)
            d = self._handle(cmd, step_in_memory)
            if d is not None:
                return d

    def slice_error(self, step: int, err: BaseException, slices: Iterable[int] = ()) -> Directive:
        """Report a slice-loss error and block until the sidecar says how to go on."""
        self._down = self._down | frozenset(slices)
        self._send(
            trainer_pb2.TrainerMessage(
                slice_error=trainer_pb2.SliceError(
                    slices=sorted(set(slices)), message=str(err)[:2000], step=step, generation=self.generation
                )
            )
        )
        self._on_event("slice_error", {"step": step, "slices": sorted(set(slices)), "error": str(err)[:200]})
        self._hold_reason = ""
        return self._wait_for_resume(step, newer_than=self.generation, what="waiting for an answer to a slice error")

    def resumed(
        self,
        d: Directive,
        step: int,
        restored_from: str,
        rebuild_seconds: float,
        *,
        active_slices: Iterable[int] | None = None,
    ) -> None:
        """Tell the sidecar the new mesh runs (call after rebuilding for a Directive).

        ``active_slices``: the slices the mesh actually built spans, when the
        trainer knows them (the sidecar checks them against its decision);
        by default the directive's.
        """
        slices = tuple(sorted(d.active_slices if active_slices is None else active_slices))
        self.step = step
        self.active_slices = slices
        self._down = frozenset()
        self._resumed_for = tuple(sorted(d.active_slices))
        self._resumed_ack = trainer_pb2.ResumedAck(
            generation=d.generation,
            step=step,
            active_slices=list(slices),
            restored_from=restored_from,
            rebuild_seconds=rebuild_seconds,
        )
        self._send(trainer_pb2.TrainerMessage(resumed=self._resumed_ack))

    def flush(self, step: int) -> int:
        """Make ``step`` durable now, on the trainer's own initiative, and tell the sidecar.

        For a trainer that must restart to rebuild (MaxText re-runs its train
        function on a new slice set): it flushes first, so the restart restores
        exactly ``step``. Returns the newest committed step (older than ``step``
        when the flush failed; the acknowledgement then carries the error).
        """
        self._flush_and_ack(step, self.generation)
        return self.committed_step

    def committed(self, step: int) -> None:
        """A step the trainer's own checkpointing committed (not a flush the sidecar asked for).

        Reported as a FlushedAck with no flush time, so the sidecar's newest
        committed step (``admin status``) includes periodic checkpoints.
        """
        if step <= self.committed_step:
            return
        self.committed_step = step
        self._send(
            trainer_pb2.TrainerMessage(flushed=trainer_pb2.FlushedAck(generation=self.generation, committed_step=step))
        )

    def finished(self, step: int) -> None:
        """Say training is done. A sidecar that is restarting right now still hears it:
        the report waits for the link (up to ``FINISHED_WAIT_SECONDS``), else the job
        would end with a coordinator that never learns it finished."""
        msg = trainer_pb2.TrainerMessage(finished=trainer_pb2.Finished(step=step))
        self._send_unsent_report()
        self._link.deliver(msg, min(FINISHED_WAIT_SECONDS, self.elastic_timeout_seconds))

    def close(self) -> None:
        self._send_unsent_report()
        self._link.flush_outbox()
        self._link.close()

    # -- command handling --------------------------------------------------------

    def _drain(self, step: int) -> Directive | None:
        directive = None
        while self._link.inbox:
            d = self._handle(self._link.inbox.popleft(), step, at_boundary=True)
            if d is not None:
                directive = d
        deferred = self._deferred
        if deferred is not None and self._deferred_due(step):
            self._deferred = None
            d = self._handle(deferred, step)
            if d is not None:
                directive = d
        return directive

    def _next_command(self, since: float, deadline: float | None = None) -> trainer_pb2.SidecarCommand | None:
        """The next command; None at ``deadline`` or once the link has been down for the timeout."""
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return self._link.next_command(left, down_limit=self.elastic_timeout_seconds, since=since)

    def _wait_for_resume(self, step: int, newer_than: int = -1, what: str = "held") -> Directive:
        self.held = True
        since = time.monotonic()
        # Without a decision for the timeout, the coordinator is wedged (see the module docstring).
        bound = self.elastic_timeout_seconds + DECISION_GRACE_SECONDS
        decide_by = None if self._hold_reason.startswith(OPERATOR_HOLD_PREFIX) else since + bound
        try:
            while True:
                cmd = self._next_command(since, decide_by)
                if cmd is None:
                    now = time.monotonic()
                    link = self._link
                    down = link.down_for(since) if hasattr(link, "down_for") else 0.0
                    if decide_by is not None and now >= decide_by and down == 0.0:
                        self._guard_abort(step, what, flush=True, undecided_since=since)
                    if decide_by is None or now < decide_by or down >= self.elastic_timeout_seconds:
                        self._guard_abort(step, what, flush=True)
                    # Past the decision bound with the link down: the link's own bound decides.
                    decide_by = now + 0.1
                    continue
                d = self._handle(cmd, step, newer_than=newer_than)
                if d is not None:
                    return d
        finally:
            self.held = False

    def _guard_abort(self, step: int, what: str, *, flush: bool, undecided_since: float | None = None) -> NoReturn:
        """The sidecar is gone past the timeout, or (``undecided_since``) has decided nothing since then
        for the timeout: flush what is not committed yet, then abort (42)."""
        link = self._link
        down = link.down_for() if hasattr(link, "down_for") else float("nan")
        last_error = getattr(link, "last_error", "")
        if undecided_since is not None:
            waited = time.monotonic() - undecided_since
            reason = (
                f"no decision from the sidecar at {link.address} for {waited:.1f} s while {what} "
                f"(elastic_timeout_seconds={self.elastic_timeout_seconds:g} + {DECISION_GRACE_SECONDS:g} s): "
                "neither resume nor abort came, so its coordinator is wedged"
            )
            self._on_event(
                "sidecar_undecided",
                {
                    "step": step,
                    "while": what,
                    "waited_seconds": round(waited, 3),
                    "elastic_timeout_seconds": self.elastic_timeout_seconds,
                    "link_up": down == 0.0,
                },
            )
        else:
            reason = (
                f"no sidecar at {link.address} for {down:.1f} s while {what} "
                f"(elastic_timeout_seconds={self.elastic_timeout_seconds:g})"
            )
            if last_error:
                reason += f"; last link error: {last_error}"
            self._on_event(
                "sidecar_lost",
                {
                    "step": step,
                    "while": what,
                    "down_seconds": round(down, 3),
                    "elastic_timeout_seconds": self.elastic_timeout_seconds,
                    "last_error": last_error,
                },
            )
        if flush:
            _, error = self._do_flush(step)
            if error:
                reason += f"; flush of step {step} failed: {error}"
        raise AbortTraining(EXIT_RESTART, reason, self.committed_step)

    def _handle(
        self, cmd: trainer_pb2.SidecarCommand, step: int, newer_than: int = -1, *, at_boundary: bool = False
    ) -> Directive | None:
        """Carry out one command. ``at_boundary``: called from the training loop's step boundary,
        the only place where a hold for a later step (``Hold.at_step``) can wait for that step."""
        kind = cmd.WhichOneof("cmd")
        if kind is None:  # a command this trainer does not know (a newer sidecar): nothing to do
            self._on_event("unknown_command", {"epoch": cmd.epoch})
            return None
        body = getattr(cmd, kind)
        if not self._admit(cmd, kind, body, newer_than):
            return None
        if kind == "hold":
            return self._on_hold(cmd, body, step, at_boundary)
        if kind == "resume":
            return self._on_resume(body)
        if kind == "flush":
            self._on_flush(body, step)
            return None
        if kind == "prepare":
            self._on_prepare(body)
            return None
        if kind == "abort":
            # Not in a multi-controller job: a save there is collective and would
            # block on a dead peer (an announced disruption was flushed by its hold).
            if self.process_count <= 1:
                self._do_flush(step)
            self._link.flush_outbox()
            raise AbortTraining(body.exit_code, body.reason, self.committed_step)
        return None

    def _admit(self, cmd: trainer_pb2.SidecarCommand, kind: str, body: _CommandBody, newer_than: int) -> bool:
        """Whether a command is current: not from a fenced coordinator, not of an older generation."""
        if cmd.epoch < self.epoch:
            self._on_event(
                "fenced", {"kind": kind, "epoch": cmd.epoch, "current_epoch": self.epoch, "generation": body.generation}
            )
            return False
        if cmd.epoch > self.epoch or not self.epoch_proof:
            self.epoch_coordinator, self.epoch_proof = cmd.epoch_coordinator, cmd.epoch_proof
        self.epoch = cmd.epoch
        if body.generation < self.generation or body.generation <= newer_than and kind not in ("abort", "prepare"):
            self._on_event("stale_command", {"kind": kind, "generation": body.generation, "current": self.generation})
            return False
        return True

    def _on_hold(
        self, cmd: trainer_pb2.SidecarCommand, body: trainer_pb2.Hold, step: int, at_boundary: bool
    ) -> Directive | None:
        again = self._deferred is not None and self._deferred.hold.generation == body.generation
        since = self._deferred_since if again else time.monotonic()
        if at_boundary and not self.held and (body.at_step > step or self._awaits_prepare(body, since)):
            # Not there yet: every process of a multi-controller job stops at
            # the same boundary, so train on until step at_step is complete;
            # a drain from memory trains on while the next mesh's program is built.
            self._deferred, self._deferred_since = cmd, since
            self._on_event(
                "hold_deferred",
                {
                    "generation": body.generation,
                    "step": step,
                    "at_step": body.at_step,
                    "until": "step" if body.at_step > step else "prepared",
                },
            )
            return None
        self._deferred = None
        self.generation = body.generation
        self._hold_reason = body.reason
        self._down = self._down | frozenset(body.down_slices)
        t0 = time.monotonic()
        kept, nbytes, error = self._keep(step, body)
        flush_s = time.monotonic() - t0
        self._send(
            trainer_pb2.TrainerMessage(
                held=trainer_pb2.HeldAck(
                    generation=body.generation,
                    step=step,
                    committed_step=self.committed_step,
                    flush_seconds=flush_s,
                    flush_bytes=nbytes,
                    flush_error=error,
                )
            )
        )
        self._on_event(
            "held",
            {
                "generation": body.generation,
                "step": step,
                "flush": body.flush,
                "snapshot": kept,
                "flush_bytes": nbytes,
                "reason": body.reason,
                "flush_error": error,
            },
        )
        return self._wait_for_resume(step)

    def _keep(self, step: int, body: trainer_pb2.Hold) -> tuple[bool, int, str]:
        """What a hold keeps of ``step``: (kept in memory, bytes flushed, flush error)."""
        if body.flush or not body.snapshot:
            return (False, *(self._do_flush(step) if body.flush else (0, "")))
        why = "this trainer keeps no in-memory snapshot" if self._snapshot is None else ""
        if not why:
            try:
                why = self._snapshot(step, frozenset(body.down_slices))
            except Exception as e:  # a snapshot that fails must not lose the hold: flush instead
                why = f"{type(e).__name__}: {e}"[:300]
        if not why:
            return True, 0, ""
        self._on_event("snapshot_unavailable", {"step": step, "why": why, "then": "flush"})
        return (False, *self._do_flush(step))

    def _on_resume(self, body: trainer_pb2.Resume) -> Directive | None:
        ack = self._resumed_ack
        if (
            not self.held
            and ack is not None
            and body.generation == ack.generation
            and tuple(sorted(body.active_slices)) == self._resumed_for
        ):
            # The same resume again (a restarted coordinator repeating what it did not see
            # acknowledged): the mesh already runs; acknowledge again instead of rebuilding.
            self._send(trainer_pb2.TrainerMessage(resumed=ack))
            self._on_event("duplicate_resume", {"generation": body.generation, "slices": list(ack.active_slices)})
            return None
        self.generation = body.generation
        return Directive(
            body.generation,
            tuple(body.active_slices),
            _SOURCE_NAMES.get(body.source, "checkpoint"),
            body.reason,
            self._down,
        )

    def _deferred_due(self, step: int) -> bool:
        """Whether the deferred hold is due at ``step``: its step reached and no prepare to wait for."""
        assert self._deferred is not None
        hold = self._deferred.hold
        return step >= hold.at_step and not self._awaits_prepare(hold, self._deferred_since)

    def _awaits_prepare(self, body: trainer_pb2.Hold, since: float) -> bool:
        """A drain from memory that arrived at ``since`` waits, training on, for the program of exactly the mesh
        it leaves being built, at most ``body.prepare_wait_seconds`` (unset: :data:`PREPARE_HOLD_WAIT_SECONDS`);
        a hold that flushes or a failure's hold does not."""
        p = self._preparing
        if p is None or body.flush or not body.snapshot or p[1].done():
            return False
        wait = body.prepare_wait_seconds if body.HasField("prepare_wait_seconds") else PREPARE_HOLD_WAIT_SECONDS
        remaining = tuple(sorted(set(self.active_slices) - set(body.down_slices)))
        return p[0] == remaining and time.monotonic() - since < wait

    def _on_prepare(self, body: trainer_pb2.Prepare) -> None:
        """Advice: the job will next run on ``body.active``; the hook may build that mesh's program now."""
        slices = tuple(sorted(body.active))
        if self._prepare is None:
            self._on_event("prepare_ignored", {"slices": list(slices), "why": "this trainer has no prepare hook"})
            return
        try:
            future = self._prepare(slices)
        except Exception as e:  # advice that fails must not stop training: the resume compiles then
            self._on_event("prepare_failed", {"slices": list(slices), "error": f"{type(e).__name__}: {e}"[:300]})
            return
        if future is not None:
            self._preparing = (slices, future)
        self._on_event("prepare", {"generation": body.generation, "slices": list(slices), "reason": body.reason})

    def _on_flush(self, body: trainer_pb2.Flush, step: int) -> None:
        self._flush_and_ack(step, body.generation)

    def _flush_and_ack(self, step: int, generation: int) -> None:
        """Flush ``step`` and tell the sidecar how it went, timed, for ``generation``."""
        t0 = time.monotonic()
        nbytes, error = self._do_flush(step)
        self._send(
            trainer_pb2.TrainerMessage(
                flushed=trainer_pb2.FlushedAck(
                    generation=generation,
                    committed_step=self.committed_step,
                    flush_seconds=time.monotonic() - t0,
                    flush_bytes=nbytes,
                    flush_error=error,
                )
            )
        )

    def _start_watchdog(self, grace: float, exit: Callable[[int], object]) -> None:
        """Start the abort watchdog now: at abort time the interpreter may already be shutting
        down (an unhandled error in the main thread), when no new thread can start."""
        if self.process_index == 0:
            # Process 0 hosts jax.distributed's coordination service: when it goes first, the
            # service's clients in the other processes terminate themselves (SIGABRT, not 42).
            grace += LEADER_EXTRA_GRACE
        self._abort_grace = grace

        def watch() -> None:
            self._abort_armed.wait()
            time.sleep(grace)
            code, reason = self._abort_code, self._abort_reason
            self._on_event(
                "abort_watchdog", {"exit_code": code, "reason": reason[:200], "grace_seconds": grace, "step": self.step}
            )
            print(
                f"trainer_hooks: aborted by the sidecar ({reason[:200]}); the training loop did not leave within "
                f"{grace:g} s (blocked in a collective?): exiting {code} now",
                file=sys.stderr,
                flush=True,
            )
            exit(code)

        self._watchdog = threading.Thread(target=watch, name="sidecar-abort-watchdog", daemon=True)
        self._watchdog.start()

    def _arm_watchdog(self, cmd: trainer_pb2.SidecarCommand) -> None:
        """On the link thread: an Abort not older than the newest epoch accepted sets the watchdog off."""
        if self._watchdog is None or cmd.WhichOneof("cmd") != "abort" or cmd.epoch < self.epoch:
            return
        if not self._abort_armed.is_set():
            self._abort_code, self._abort_reason = cmd.abort.exit_code, cmd.abort.reason
            self._abort_armed.set()

    def _do_flush(self, step: int) -> tuple[int, str]:
        """Make ``step`` durable; returns (bytes written, error). Only a committed step counts."""
        if step <= 0 or self._flushed_at == step:
            return 0, ""  # nothing trained yet, or already committed
        if self._flush is None:
            return 0, "this trainer has no flusher"
        try:
            res = self._flush(step, self._down)
        except Exception as e:  # a flush that fails must not lose the hold: report it, never count it
            error = f"{type(e).__name__}: {e}"[:1000]
            self._on_event("flush_failed", {"step": step, "error": error[:300]})
            return 0, error
        self.committed_step = max(self.committed_step, res.committed_step)
        if res.committed_step < step:
            error = f"the flusher committed step {res.committed_step}, not step {step}"
            self._on_event("flush_failed", {"step": step, "error": error})
            return res.nbytes, error
        self._flushed_at = step
        return res.nbytes, ""
