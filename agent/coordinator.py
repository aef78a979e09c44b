"""The coordinator sidecar: one per job, beside the trainer (the Pathways head).

Sources -> decision core -> executors:

* sources: the Peer service (worker sidecars register and report over one
  stream each and heartbeat by UDP datagram once this side confirms it receives
  them, :mod:`agent.sources.heartbeat_datagrams`; a closed stream or a missed
  heartbeat deadline is a lost host),
  the TrainerLink service (steps, slice errors and acknowledgements from the
  trainer hooks; one link per JAX process of a multi-controller job, presented
  to the core as one trainer by :mod:`agent.trainer_group`) and a ticker that
  lets deadlines fire;
* one decision loop feeds each event to :func:`agent.core.decide` and keeps the
  state; nothing else changes it;
* executors send hold/resume/abort to the trainer, fan commands out to the
  workers, append to the journal, write the state file and log.

Beside them it serves operators (:mod:`agent.servers`): the admin gRPC API on
``--admin-listen`` (its commands are events for the same loop) and HTTP
health, readiness, metrics and a status page on ``--http-listen``. Worker
registrations need the peer token when ``--peer-token-file`` is given. The
trainer link has a listener of its own, ``--trainer-listen``, on loopback by
default (the trainer runs in this pod), with ``--trainer-token-file`` required
for any other address (see :mod:`agent.auth`).

Trust under its own failures (docs/reliability.md):

* **write-ahead**: a decision's state reaches the state file before any of its
  actions runs (:mod:`agent.statefile` says what is kept). A failed write is
  retried; after ``--durability-bound`` seconds the decision is carried out
  from memory anyway, flagged not durable (ERROR log, metric, /status,
  readiness), and the file catches up at the next write that succeeds: a job
  is never left unprotected waiting for a disk. A write that hangs (a stalled
  disk) counts as failed once its bound passes (``statefile.BoundedWriter``),
  and a state directory that cannot be used at all (read-only, missing, full)
  means running without durability, loudly, never exiting for it. A decision
  loop that stops deciding is not ready and NOT_SERVING on gRPC health.
* **fencing** (:mod:`agent.fencing`): every start takes a new epoch, one above
  the last one on file (the wall clock in milliseconds only as a floor when
  there is no state file), durable before it serves, and issued with a proof
  (an HMAC with the peer token). Every command carries it; trainers and workers
  ignore commands from an older epoch and present the newest epoch and proof
  they have seen when they connect. A coordinator that learns of a newer epoch
  whose proof verifies stops steering (it refuses every stream, reports itself
  fenced, not ready, and NOT_SERVING on gRPC health); a claim that does not
  verify is logged and ignored. A coordinator that started blind (no state
  file) and has not steered yet takes an epoch above a verified one instead.
  Two coordinators on one state directory cannot run at once: the second waits
  for the first's lock (``flock``).
* **liveness**: a worker is late by the time since its last message was read,
  counted from the end of any event-loop stall (a stalled loop is measured
  and logged, and never by itself declares anyone lost); a worker not yet heard
  from since its registration reply gets ``--first-heartbeat-timeout`` instead
  of ``--heartbeat-timeout`` (it cannot speak before the reply reaches it). When a worker's stream
  closes, the coordinator checks that host's Pathways worker itself before it
  declares the host lost: a sidecar that restarts on a healthy host, or a
  stream blip, is neither a loss nor a repair.

Every decision line of a recovery carries Cloud Logging's operation
``recovery-<generation>`` (the generation of the hold that began it), with
``first`` on the hold and ``last`` when the trainer acknowledges the resume
(or the job fails), so the Logs Explorer groups a recovery's lines.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import gc
import itertools
import os
import resource
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from agent import constants as C
from agent import fdlimit, fencing, statefile
from agent import log as logmod
from agent.auth import BearerAuthInterceptor, BearerToken
from agent.config import CoordinatorConfig, is_loopback
from agent.core import decide, initial_state
from agent.core.model import (
    AbortTrainer,
    Action,
    Decision,
    Event,
    ExitCoordinator,
    FlushTrainer,
    HoldTrainer,
    NodeNotice,
    Phase,
    PrepareTrainer,
    ResumeSource,
    ResumeTrainer,
    State,
    TellWorkers,
    Tick,
    TrainerAttached,
    TrainerFinished,
    TrainerFlushed,
    TrainerHeld,
    TrainerResumed,
    TrainerSettings,
    TrainerSliceError,
    TrainerStepped,
    WorkerAway,
    WorkerHealth,
    WorkerJoined,
    WorkerLost,
)
from agent.gc_freeze import GcFreezer
from agent.metrics import Metrics
from agent.servers import listen
from agent.sources.health import probe_once
from agent.sources.heartbeat_datagrams import (
    DatagramReceiver,
    Reply,
    command_datagram,
    command_position,
    new_token,
    same_token,
)
from agent.trainer_group import TrainerGroup
from protos.elastic_sidecar.v1 import peer_pb2, peer_pb2_grpc, trainer_pb2, trainer_pb2_grpc

log = logmod.get("coordinator")
PEER_SERVICE = peer_pb2.DESCRIPTOR.services_by_name["Peer"].full_name
TRAINER_SERVICE = trainer_pb2.DESCRIPTOR.services_by_name["TrainerLink"].full_name
TICK_SECONDS = 0.2
"""Deadlines (start, hold, wait, rejoin) are seconds to minutes long: a coarse tick
is enough, and an idle coordinator should cost next to nothing."""
EOF_GRACE_SECONDS = 0.05
STALL_SECONDS = 0.5
"""A tick this late means the event loop was blocked: liveness deadlines restart from its end."""
DECISIONS_WEDGED_SECONDS = 10.0
"""Events waiting and nothing decided for this long (or twice --durability-bound, if longer): the
decision loop is wedged; readiness and gRPC health say so (see _check_decisions)."""
PROBE_TIMEOUT_SECONDS = 0.3
DISPLACED_KEPT = 4
"""Incarnations remembered per host as taken over by a newer sidecar (more than two claimants is rare)."""
"""How long the coordinator's own check of a host's Pathways worker may take."""
GROUP_COMMIT_MAX = 1024
"""Most events decided before one state write (write-ahead still holds: all are durable before any acts)."""
AWAY_PROBE_SECONDS = 0.25
"""How often a host whose sidecar is away is checked until the sidecar is back."""
STREAM_COPIES_PER_PASS = 100
"""Worker commands queued onto streams per event-loop pass. A stream write costs a few hundred
microseconds of Python; queuing 10,000 at once made one pass of the loop take seconds, in
which the heartbeat datagram socket overflowed and disconnects waited. A hundred at a time
keeps each pass to tens of milliseconds; every worker has had the datagram copy already."""


@dataclass
class _Conn:
    """One open stream to a worker or the trainer: its outgoing queue."""

    outbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    last_seen: float = field(default_factory=time.monotonic)
    """When the peer last sent a message (tells a hung peer from a killed one). Until a just-registered
    worker's first message it lies ahead of its registration reply (its longer first timeout, see Join)."""
    replied_at: float = 0.0
    """When its registration reply was written (monotonic)."""
    credited: float = -1.0
    """The ``last_seen`` its registration was credited with: while ``last_seen`` still equals it, nothing
    has been heard since the reply (a message sets ``last_seen`` to the time it was read)."""
    cause: str = ""
    """Why the coordinator ended the stream ("heartbeat_timeout", "replaced", "fenced")."""
    incarnation: str = ""
    health_address: str = ""
    health_check: str = ""
    token: bytes = b""
    """This registration's heartbeat datagram token (empty: datagrams are off)."""
    datagrams: bool = False
    """A heartbeat datagram of this registration arrived (the worker was told so)."""
    reply: Reply | None = None
    """Where this registration's heartbeat datagrams come from: commands go there too."""
    datagram_key: bytes = b""
    """Its heartbeat datagram's bytes, matched without parsing (DatagramReceiver.known)."""
    acked: tuple[int, int] = (-1, 0)
    """(generation, COMMAND_ORDER) of the newest command datagram the worker acknowledged."""
    registration: int = 0
    """This Join stream's number (a worker's registrations are numbered in order): every
    observation about it (its end, a check of its host, a health report) names it, and the
    core drops one about a registration that has since been replaced."""
    first_seen: int = 0
    """The registration at which this incarnation first registered: of two live sidecars claiming one
    host, the one first seen later (the newer process) speaks for it."""
    who: str = ""
    """Pod, node and peer address of the sidecar, for operators (a duplicate's warning names both)."""
    replaced_by: str = ""
    """Why a newer sidecar ended this stream: the ALREADY_EXISTS status the older one gets."""
    judged: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the verdict on this registration's end (away or lost) has been submitted."""


def _to_trainer_command(a: Action) -> trainer_pb2.SidecarCommand | None:
    match a:
        case HoldTrainer():
            return trainer_pb2.SidecarCommand(
                hold=trainer_pb2.Hold(
                    generation=a.generation,
                    flush=a.flush,
                    down_slices=sorted(a.down_slices),
                    reason=a.reason,
                    snapshot=a.snapshot,
                )
            )
        case ResumeTrainer():
            src = trainer_pb2.Resume.MEMORY if a.source == ResumeSource.MEMORY else trainer_pb2.Resume.CHECKPOINT
            return trainer_pb2.SidecarCommand(
                resume=trainer_pb2.Resume(
                    generation=a.generation, active_slices=sorted(a.active), source=src, reason=a.reason
                )
            )
        case AbortTrainer():
            return trainer_pb2.SidecarCommand(
                abort=trainer_pb2.Abort(generation=a.generation, exit_code=a.exit_code, reason=a.reason)
            )
        case FlushTrainer():
            return trainer_pb2.SidecarCommand(flush=trainer_pb2.Flush(generation=a.generation, reason=a.reason))
        case PrepareTrainer():
            prepare = trainer_pb2.Prepare(generation=a.generation, active=sorted(a.active), reason=a.reason)
            return trainer_pb2.SidecarCommand(prepare=prepare)
    return None


def _action_record(a: Action) -> dict[str, Any]:
    d: dict[str, Any] = {"type": type(a).__name__}
    for k, v in vars(a).items():
        d[k] = sorted(v) if isinstance(v, frozenset) else (str(v) if isinstance(v, ResumeSource) else v)
    return d


class Coordinator:
    """Owns the state; everything else talks to it through :meth:`submit` or :meth:`request`."""

    def __init__(self, cfg: CoordinatorConfig) -> None:
        self.cfg = cfg
        self.events: asyncio.Queue[tuple[Event, asyncio.Future[Decision] | None]] = asyncio.Queue()
        self.metrics = Metrics("coordinator")
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=500)
        """The newest decisions, for WatchEvents backlogs and the status page."""
        self.subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self._flush_waiters: list[tuple[int, asyncio.Future[TrainerFlushed]]] = []
        self.started_at = time.time()
        self.last_reason = ""
        self.workers: dict[tuple[int, int], _Conn] = {}
        self.trainer_conns: dict[int, _Conn] = {}
        """Open trainer links by JAX process index (one, index 0, unless multi-controller)."""
        self.group = TrainerGroup(cfg.policy.trainer_processes)
        """Presents the trainer processes to the core as one trainer (:mod:`agent.trainer_group`)."""
        self.exit_code: asyncio.Future[int] | None = None
        self.state: State = initial_state(cfg.policy, time.monotonic())
        self._persisted: State | None = None
        """The newest state on disk (None: nothing written yet)."""
        self._journal: IO[str] | None = None
        self.port: int = 0
        self.trainer_port: int = 0
        self.datagram_port: int = 0
        """UDP port of the heartbeat datagrams (0: off)."""
        self.datagrams = DatagramReceiver(self._datagram_heartbeat, self.metrics.count_heartbeat_datagrams)
        self.server: grpc.aio.Server | None = None
        self.trainer_server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()
        self.serving = False
        """The peer + trainer-link server is up (readiness)."""
        self.intake: Any = None
        self.admin: Any = None
        """The admin server (:class:`agent.servers.admin.AdminServer`) when it listens."""
        self.http: Any = None
        """The HTTP server (:class:`agent.servers.http.HttpServer`) when it listens."""
        self._tasks: list[asyncio.Task[None]] = []
        self._recovery: int | None = None
        """Generation of the hold that began the recovery in progress (its log operation id)."""
        self.epoch = 0
        """This process's epoch: it grows at every coordinator start (fencing)."""
        self.fenced_by = 0
        """A newer coordinator's epoch, once a participant reported one: this one no longer steers."""
        self.coordinator_id = fencing.new_coordinator_id()
        """Who issues this process's epochs (part of their proof)."""
        self.epoch_proof = b""
        """The proof of :attr:`epoch` (agent.fencing)."""
        self._blind = True
        """Started with no usable state file: its epoch rests on the wall clock."""
        self._steered = False
        """A command went to the trainer or the workers (a blind epoch can no longer be moved)."""
        self._claims_ignored = 0
        self.durable = True
        """Every decision so far reached the state file before its actions ran."""
        self.durability_problem = ""
        self.state_file_note = ""
        """What happened to the state file at start (restored, unreadable and moved aside, ...)."""
        self.state_file_problem = ""
        """Set when the state file found at start could not be used (it was moved aside)."""
        self._lock_fd: int | None = None
        self._state_writer = statefile.BoundedWriter()
        self._renderer = statefile.Renderer()  # used only inside the writer's one-at-a-time writes
        self._loop_resumed_at = 0.0
        """End of the newest event-loop stall: nobody is late for time the loop could not read."""
        self._drops_seen = 0
        """Heartbeat datagrams the kernel dropped, as last seen (DatagramReceiver.dropped)."""
        self._drops_logged_at = -1e9
        self.stalls: list[float] = []
        self.gc_clock = GcClock()
        """How long Python's garbage collector held the process (a stall's warning says how much was it)."""
        self.gc_freezer = GcFreezer(enabled=cfg.gc_freeze)
        """Keeps registered workers' objects out of full collections (--gc-freeze)."""
        self._decided_at = time.monotonic()
        """When the decision loop last finished a batch (monotonic)."""
        self.decisions_wedged = False
        """Events have waited past DECISIONS_WEDGED_SECONDS with nothing decided."""
        """Durations of event-loop stalls seen (newest last)."""
        self._probing: set[int] = set()
        """Registrations whose away host is being watched (:meth:`watch_away`)."""
        self._registrations = itertools.count(1)
        self._displaced: dict[tuple[int, int], dict[str, tuple[int, str]]] = {}
        """Per host, incarnations a newer live sidecar took the host over from: (first seen, who).
        Refused while the newer one is live; one back after it went is flapping."""
        self._judging: dict[tuple[int, int], _Conn] = {}
        """Per host, a registration whose end is being judged (its host checked) right now."""
        self._stream_copies: collections.deque[tuple[_Conn, Any]] = collections.deque()
        """Worker commands waiting for their stream (oldest first): see STREAM_COPIES_PER_PASS."""
        self._stream_copies_due = asyncio.Event()

    @property
    def trainer(self) -> _Conn | None:
        """The link of trainer process 0 (the only one unless multi-controller)."""
        return self.trainer_conns.get(0)

    # -- sources -------------------------------------------------------------

    def submit(self, ev: Event) -> None:
        self.events.put_nowait((ev, None))

    async def request(self, ev: Event) -> Decision:
        """Submit an event and wait until the decision about it is recorded."""
        fut: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self.events.put_nowait((ev, fut))
        return await fut

    async def wait_flushed(self, generation: int, timeout: float) -> TrainerFlushed:
        """The trainer's next flush acknowledgement at ``generation`` or later."""
        fut: asyncio.Future[TrainerFlushed] = asyncio.get_running_loop().create_future()
        self._flush_waiters.append((generation, fut))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._flush_waiters = [(g, f) for g, f in self._flush_waiters if f is not fut]

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=1000)
        self.subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[dict[str, Any]]) -> None:
        self.subscribers.discard(q)

    # -- state on disk -------------------------------------------------------

    def _lock_path(self) -> Path | None:
        if self.cfg.state_dir is not None:
            return self.cfg.state_dir / "lock"
        if self.cfg.state_file is not None:
            return self.cfg.state_file.with_name(self.cfg.state_file.name + ".lock")
        return None

    async def _acquire_lock(self) -> None:
        """Keep a second coordinator off this state location while this one runs."""
        path = self._lock_path()
        if path is None:
            return
        try:
            fd = statefile.open_lock(path)
        except OSError as e:
            self._without_durability(f"state lock {path}: {e.strerror or e}")
            return
        waited = 0.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if waited == 0.0 or waited % 30 < 0.5:
                    log.warning(
                        "another coordinator holds the state lock; waiting for it to go",
                        lock=str(path),
                        waited_seconds=round(waited, 1),
                    )
                await asyncio.sleep(0.5)
                waited += 0.5
        statefile.note_lock_holder(fd)
        self._lock_fd = fd

    def _without_durability(self, problem: str) -> None:
        """A broken state directory (read-only, missing, full): run on, without durability and loudly
        (ERROR, state_durable 0, /readyz with the reason); exiting would be a crash loop, the job unprotected."""
        log.error(
            "state directory unusable; running WITHOUT durability (a restart now would forget decisions) and "
            "retrying the state file at every decision",
            error=problem,
        )
        self.durable = False
        self.durability_problem = problem
        self.metrics.state_durable.set(0)

    def _load_state(self) -> None:
        path = self.cfg.state_file
        now = time.monotonic()
        file_epoch = 0
        if path is not None and path.exists():
            try:
                raw = statefile.read(path)
                restored = statefile.restore(raw, self.state, now, restart_attempt=self.cfg.restart_attempt)
            except statefile.StateFileError as e:
                moved = statefile.move_aside(path)
                self.state_file_note = f"{e}; moved aside to {moved}" if moved else f"{e}; could not move it aside"
                self.state_file_problem = self.state_file_note
                log.error(
                    "state file unusable; starting without it and rebuilding from what the workers and the trainer "
                    "report",
                    state_file=str(path),
                    error=str(e),
                    moved_to=str(moved) if moved else None,
                )
            else:
                self.state = restored.state
                file_epoch = restored.epoch
                self.state_file_note = restored.note
                log.info(
                    "restored coordinator state: " + restored.note,
                    state_file=str(path),
                    phase=str(self.state.phase),
                    generation=self.state.generation,
                    active=sorted(self.state.active),
                    epoch_on_file=file_epoch,
                )
        self._blind = path is None or not self.state_file_note or bool(self.state_file_problem)
        self._take_epoch(fencing.next_epoch(None if self._blind else file_epoch))
        self.metrics.epoch.set(self.epoch)
        self.metrics.state_durable.set(1 if self.durable else 0)

    def _take_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epoch_proof = fencing.proof(self.cfg.peer_token, self.cfg.job, epoch, self.coordinator_id)
        self.metrics.epoch.set(epoch)

    async def epoch_claim(self, epoch: int, coordinator: str, proof: bytes, who: str) -> None:
        """A participant says it has seen ``epoch`` (above ours): believe it only if its proof verifies.

        Verified: a blind start that has not steered yet moves above it (durable before it is
        used); otherwise this coordinator is fenced. Not verified: logged and ignored.
        """
        if epoch <= self.epoch:
            return
        if not fencing.verify(self.cfg.peer_token, self.cfg.job, epoch, coordinator, proof):
            self._claims_ignored += 1
            log.warning(
                "a newer coordinator epoch was claimed without a valid proof; ignored (not fencing)",
                claimed_epoch=epoch,
                epoch=self.epoch,
                reported_by=who,
                claims_ignored=self._claims_ignored,
            )
            return
        if self._blind and not self._steered and not self.fenced_by:
            old = self.epoch
            self._take_epoch(fencing.next_epoch(None, seen=epoch))
            log.warning(
                "started without a state file below an epoch already issued; taking the next one above it",
                epoch=self.epoch,
                was=old,
                seen_epoch=epoch,
                reported_by=who,
            )
            await self._make_durable()
            return
        self.fence(epoch, who)

    def _write_state(self, state: State) -> None:
        """Serialise and write ``state`` (runs in a thread: states are immutable)."""
        assert self.cfg.state_file is not None
        pieces = self._renderer.chunks(state, epoch=self.epoch, restart_attempt=self.cfg.restart_attempt)
        statefile.write(self.cfg.state_file, pieces)

    async def _make_durable(self) -> None:
        """Write the current state before its actions run (write-ahead); see the module docstring."""
        path = self.cfg.state_file
        if path is None:
            return
        target = self.state
        deadline = time.monotonic() + (self.cfg.durability_bound if self.durable else 0.0)
        delay = 0.05
        while True:
            try:
                # Bounded: a write that hangs (a stalled disk) fails like any other (statefile.BoundedWriter).
                bound = max(deadline - time.monotonic(), 0.25) if self.durable else self.cfg.durability_bound
                await self._state_writer.run(self._write_state, target, bound=bound)
            except OSError as e:
                self.metrics.state_write_failures.inc()
                problem = f"state file {path}: {e.strerror or e}"
                if time.monotonic() >= deadline:
                    if self.durable:
                        log.error(
                            "cannot make decisions durable; carrying them out from memory and retrying the state "
                            "file (a restart now would forget decisions since the last good write)",
                            error=problem,
                            bound_seconds=self.cfg.durability_bound,
                        )
                    self.durable = False
                    self.durability_problem = problem
                    self.metrics.state_durable.set(0)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            self._persisted = target
            if not self.durable:
                log.warning("state file writable again; decisions are durable", state_file=str(path))
                self.durable = True
                self.durability_problem = ""
                self.metrics.state_durable.set(1)
            return

    def _write_due(self, d: Decision) -> bool:
        """A write is due when the decision changed intent, or while the file is behind (each event retries it)."""
        if self.cfg.state_file is None:
            return False
        if self._persisted is None or not self.durable:
            return True
        return statefile.intent_changed(self._persisted, d.state)

    # -- the loop ------------------------------------------------------------

    async def _decision_loop(self) -> None:
        """Decide, make durable, then act: events that queued up meanwhile are decided
        together and share one write (group commit), so a registration storm of
        thousands of workers costs a few writes, not one each."""
        while True:
            batch = [await self.events.get()]
            while len(batch) < GROUP_COMMIT_MAX and not self.events.empty():
                batch.append(self.events.get_nowait())
            decided: list[tuple[Decision, asyncio.Future[Decision] | None]] = []
            write_due = False
            for ev, fut in batch:
                try:
                    d = self.apply(ev, time.monotonic())
                except Exception as e:  # a bug must not take the daemon down with it
                    log.exception("failed to handle event", trigger=type(ev).__name__)
                    if fut is not None and not fut.done():
                        fut.set_exception(e)
                    continue
                write_due = write_due or self._write_due(d)
                decided.append((d, fut))
            if write_due:
                await self._make_durable()
            for d, fut in decided:
                for a in d.actions:
                    try:
                        self._execute(a)
                    except Exception:
                        log.exception("failed to carry out an action", action=type(a).__name__)
                if fut is not None and not fut.done():
                    fut.set_result(d)
            self._decided_at = time.monotonic()

    def apply(self, ev: Event, now: float) -> Decision:
        """Decide on one event and record the decision (log, journal, feed, metrics).

        Nothing is carried out here: the loop makes the new state durable,
        then executes the actions (:meth:`_decision_loop`).
        """
        before = self.state
        d = decide(before, ev, now)
        self.state = d.state
        self.metrics.observe(ev, d, before, now)
        if isinstance(ev, TrainerFlushed):
            for g, f in self._flush_waiters:
                if ev.generation >= g and not f.done():
                    f.set_result(ev)
        self._record(ev, d, before)
        return d

    def _record(self, ev: Event, d: Decision, before: State) -> None:
        quiet = isinstance(ev, (Tick, TrainerStepped)) and not d.actions and d.state.phase == before.phase
        if quiet:
            return
        s = d.state
        fields: dict[str, Any] = {
            "trigger": type(ev).__name__,
            "phase": str(s.phase),
            "generation": s.generation,
            "active_slices": sorted(s.active),
            "up_slices": sorted(s.up_slices()),
            "actions": [_action_record(a) for a in d.actions],
        }
        flags: dict[str, bool] = {}
        if self._recovery is None and any(isinstance(a, HoldTrainer) for a in d.actions):
            self._recovery = s.generation
            flags["first"] = True
        if self._recovery is not None:
            fields["operation"] = f"recovery-{self._recovery}"
            resumed = (
                isinstance(ev, TrainerResumed)
                and ev.generation == s.generation
                and s.phase == Phase.RUNNING
                and not s.trainer.resume_pending
            )
            if resumed or s.phase.terminal:
                flags["last"] = True
                self._recovery = None
        log.info(d.reason, **fields, **({"operation_flags": flags} if flags else {}))
        self.last_reason = d.reason
        rec = {"time": time.time(), "reason": d.reason, **{k: v for k, v in fields.items() if k != "operation"}}
        self.recent.append(rec)
        for q in list(self.subscribers):
            try:
                q.put_nowait(rec)
            except asyncio.QueueFull:
                self.subscribers.discard(q)  # a reader that cannot keep up is dropped
        if self._journal is not None:
            rec = {
                "time": time.time(),
                "reason": d.reason,
                **fields,
                "retries_used": s.retries_used,
                "event_detail": _event_detail(ev),
            }
            self._append_journal(logmod.bounded(rec) + "\n")  # at most log.MAX_LINE_BYTES

    def _append_journal(self, line: str) -> None:
        """The journal is a record for people, not intent: a failed append is counted, never fatal."""
        j = self._journal
        assert j is not None
        try:
            if self.cfg.journal_max_bytes and j.tell() + len(line) > self.cfg.journal_max_bytes:
                self._rotate_journal()
                j = self._journal
                assert j is not None
            j.write(line)
            j.flush()
        except (OSError, ValueError) as e:
            self.metrics.journal_write_failures.inc()
            log.warning("journal append failed; the decision stands", error=str(e))

    def _rotate_journal(self) -> None:
        path = self.cfg.journal
        assert path is not None and self._journal is not None
        self._journal.close()
        os.replace(path, path.with_name(path.name + ".1"))
        self._journal = open(path, "a", encoding="utf-8")  # noqa: SIM115

    # -- executors -----------------------------------------------------------

    def _execute(self, a: Action) -> None:
        if self.fenced_by:
            log.warning("fenced: not carrying out", action=type(a).__name__, newer_epoch=self.fenced_by)
            return
        match a:
            case HoldTrainer() | ResumeTrainer() | AbortTrainer() | FlushTrainer() | PrepareTrainer():
                cmd = _to_trainer_command(a)
                assert cmd is not None
                self._steered = True
                cmd.epoch = self.epoch
                cmd.epoch_coordinator = self.coordinator_id
                cmd.epoch_proof = self.epoch_proof
                if isinstance(a, HoldTrainer):
                    # Multi-controller: every process stops at this one boundary (0: the next one).
                    cmd.hold.at_step = self.group.hold_step(a.generation)
                missing = self.cfg.policy.trainer_processes - len(self.trainer_conns)
                if not self.trainer_conns:
                    log.warning(
                        "no trainer attached; command will be repeated when it attaches", command=type(a).__name__
                    )
                elif missing > 0:
                    log.warning(
                        "not every trainer process is attached; the others get the command when the job is whole again",
                        command=type(a).__name__,
                        attached=sorted(self.trainer_conns),
                    )
                for conn in self.trainer_conns.values():
                    conn.outbox.put_nowait(cmd)
            case TellWorkers():
                self._steered = True
                msg = peer_pb2.CoordinatorMessage(
                    command=peer_pb2.PeerCommand(
                        generation=a.generation, kind=a.kind, reason=a.reason, epoch=self.epoch
                    )
                )
                # By datagram where the worker's heartbeats come by datagram (agent.sources.heartbeat_datagrams):
                # every worker hears in milliseconds, where 10,000 stream writes take seconds. Only
                # workers without datagrams, and those that do not acknowledge it in time, get the
                # stream's copy.
                by_datagram: list[_Conn] = []
                failed = 0
                for (slice_, host), conn in self.workers.items():
                    if conn.reply is not None and self.datagrams.send(
                        conn.reply, command_datagram(conn.token, slice_, host, msg.command)
                    ):
                        by_datagram.append(conn)
                    else:
                        failed += conn.reply is not None
                        self._stream_copies.append((conn, msg))
                self.metrics.count_command_datagrams("sent", len(by_datagram))
                self.metrics.count_command_datagrams("failed", failed)
                self._stream_copies_due.set()
                if by_datagram:
                    asyncio.get_running_loop().call_later(
                        C.COMMAND_ACK_SECONDS, self._unacknowledged_to_streams, by_datagram, msg
                    )
            case ExitCoordinator():
                if self.exit_code is not None and not self.exit_code.done():
                    # Give the streams a moment to deliver the last commands.
                    asyncio.get_running_loop().call_later(0.5, _set_result, self.exit_code, a.exit_code)

    def _unacknowledged_to_streams(self, conns: list[_Conn], msg: peer_pb2.CoordinatorMessage) -> None:
        """A command's datagram was not acknowledged (lost, or the worker is slow): send it on the stream."""
        key = command_position(msg.command.generation, msg.command.kind)
        late = [c for c in conns if c.acked < key and not c.closed.is_set()]
        self.metrics.count_command_datagrams("unacknowledged", len(late))
        if late:
            self._stream_copies.extend((c, msg) for c in late)
            self._stream_copies_due.set()

    async def _stream_copier(self) -> None:
        """Queue worker commands onto their streams, STREAM_COPIES_PER_PASS per loop pass, in order."""
        pending = self._stream_copies
        while True:
            await self._stream_copies_due.wait()
            self._stream_copies_due.clear()
            while pending:
                for _ in range(min(STREAM_COPIES_PER_PASS, len(pending))):
                    conn, msg = pending.popleft()
                    if not conn.closed.is_set():
                        conn.outbox.put_nowait(msg)
                await asyncio.sleep(0)

    def fence(self, newer_epoch: int, who: str) -> None:
        """A participant has seen a newer coordinator: stop steering, say so."""
        if newer_epoch <= self.epoch or newer_epoch <= self.fenced_by:
            return
        self.fenced_by = newer_epoch
        self.metrics.fenced.set(1)
        # Its liveness probe (gRPC health) must see it: a fenced coordinator steers nothing.
        asyncio.get_running_loop().create_task(self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING))
        log.error(
            "superseded by a newer coordinator: no longer steering this job",
            epoch=self.epoch,
            newer_epoch=newer_epoch,
            reported_by=who,
        )
        for conn in [*self.workers.values(), *self.trainer_conns.values()]:
            conn.cause = "fenced"
            conn.closed.set()

    # -- liveness --------------------------------------------------------------

    def _datagram_heartbeat(self, dg: peer_pb2.HeartbeatDatagram, now: float, reply: Reply) -> _Conn | None:
        """A heartbeat datagram (agent.sources.heartbeat_datagrams) not matched by its bytes: whose is it?

        The registration it names is alive, and its commands can go back to ``reply``.
        """
        conn = self.workers.get((dg.slice, dg.host))
        if conn is None or conn.closed.is_set() or not same_token(conn.token, dg.token):
            return None
        conn.last_seen = now
        conn.reply = reply
        if dg.ack_kind:
            conn.acked = max(conn.acked, command_position(dg.ack_generation, dg.ack_kind))
        if not conn.datagrams:
            conn.datagrams = True
            conn.outbox.put_nowait(peer_pb2.CoordinatorMessage(datagrams_received=peer_pb2.DatagramsReceived()))
        return conn

    @property
    def loop_resumed_at(self) -> float:
        """End of the newest event-loop stall or kernel drop of heartbeat datagrams (monotonic)."""
        return self._loop_resumed_at

    def check_liveness(self, now: float) -> None:
        """End the streams of workers silent past the heartbeat timeout.

        Lateness counts from the later of the worker's last message and the end
        of the newest event-loop stall: messages that arrived while the loop was
        blocked are read only after it, so the stall itself proves nothing.
        """
        # Late: now - max(last_seen, since) > timeout, i.e. both before the deadline.
        deadline = now - self.cfg.heartbeat_timeout
        if self._loop_resumed_at >= deadline:
            return  # the loop resumed from a stall within the timeout: nobody can be late yet
        for conn in self.workers.values():
            if conn.last_seen < deadline and not conn.closed.is_set():
                conn.cause = "heartbeat_timeout"
                conn.closed.set()

    def _note_datagram_drops(self, now: float) -> None:
        """Heartbeats the kernel dropped (a full socket buffer: this process fell behind) prove no
        silence: like a stall, nobody is judged lost for that time."""
        dropped = self.datagrams.dropped()
        if dropped <= self._drops_seen:
            return
        new, self._drops_seen = dropped - self._drops_seen, dropped
        self._loop_resumed_at = now
        self.metrics.heartbeat_datagrams.labels("dropped").inc(new)
        if now - self._drops_logged_at >= 10.0:
            self._drops_logged_at = now
            log.warning(
                "heartbeat datagrams dropped by the kernel (the socket buffer was full: the coordinator fell "
                "behind); liveness deadlines restart from now and nobody is judged lost for it",
                dropped=new,
                dropped_total=dropped,
            )

    def _note_stall(self, lag: float, now: float) -> None:
        self._loop_resumed_at = now
        self.stalls.append(lag)
        del self.stalls[:-20]
        self.metrics.loop_stalls.inc()
        self.metrics.loop_stall_seconds.inc(lag)
        log.warning(
            "event loop was blocked; liveness deadlines restart from now and nobody is judged lost for it",
            stall_seconds=round(lag, 3),
            # Of which Python's garbage collector (full collections grow with the objects live: the workers).
            gc_seconds=round(self.gc_clock.seconds_since(time.monotonic() - lag), 3),
        )

    async def probe_host(self, key: tuple[int, int], conn: _Conn, peer: str) -> tuple[bool, str]:
        """Check a host's Pathways worker from here (its sidecar's stream just closed)."""
        address = _probe_address(conn.health_address, peer)
        if not address:
            return False, "no health address registered"
        return await probe_once(conn.health_check or "grpc", address, PROBE_TIMEOUT_SECONDS)

    async def watch_away(self, key: tuple[int, int], conn: _Conn, peer: str) -> None:
        """Keep checking a host whose sidecar is away until the sidecar is back or the host fails.

        With a TCP check, for at most ``rejoin_grace_seconds``: a connect from
        outside succeeds on a hung host too, so a sidecar that stays away longer
        counts as a lost host after all. With a gRPC health check (the Pathways
        worker's process itself answers) the host stays as long as it answers:
        lost means lost, and a sidecar paused or cut off for long is not a lost
        host (its absence is logged once the grace has passed).
        """
        if conn.registration in self._probing:
            return
        self._probing.add(conn.registration)
        until = time.monotonic() + self.state.policy.rejoin_grace_seconds
        reg = conn.registration
        try:
            while True:
                await asyncio.sleep(AWAY_PROBE_SECONDS)
                rec = self.state.hosts.get(key)
                if rec is None or rec.registration != reg or rec.away_since is None:
                    return  # its sidecar came back (a newer registration), or the record changed otherwise
                if time.monotonic() > until and (conn.health_check or "grpc") == "grpc":
                    until = float("inf")
                    log.warning(
                        "sidecar still away after the rejoin grace; its host stays in the job while its Pathways "
                        "worker answers",
                        slice=key[0],
                        host=key[1],
                    )
                if time.monotonic() > until:
                    gone = self.state.policy.rejoin_grace_seconds
                    self.submit(WorkerLost(key[0], key[1], conn.incarnation, "sidecar_gone", gone, registration=reg))
                    log.warning(
                        "sidecar did not come back within the rejoin grace; its host counts as lost",
                        slice=key[0],
                        host=key[1],
                        grace_seconds=gone,
                    )
                    return
                ok, detail = await self.probe_host(key, conn, peer)
                if not ok:
                    self.submit(
                        WorkerLost(
                            key[0],
                            key[1],
                            conn.incarnation,
                            "sidecar_gone_host_down",
                            AWAY_PROBE_SECONDS,
                            registration=reg,
                        )
                    )
                    log.warning("host of an away sidecar stopped answering", slice=key[0], host=key[1], detail=detail)
                    return
        finally:
            self._probing.discard(reg)

    # -- lifetime ------------------------------------------------------------

    async def start(self) -> None:
        self.exit_code = asyncio.get_running_loop().create_future()
        self._open_files()
        self.gc_clock.install()
        await self._acquire_lock()
        self._load_state()
        if self.cfg.state_file is not None:
            # The new epoch must be on disk before anyone hears of it.
            await self._make_durable()
        if self.cfg.journal is not None:
            try:
                self.cfg.journal.parent.mkdir(parents=True, exist_ok=True)
                self._journal = open(self.cfg.journal, "a", encoding="utf-8")  # noqa: SIM115
            except OSError as e:  # a record for people, not intent: never a reason not to run
                self.metrics.journal_write_failures.inc()
                log.error("journal cannot be opened; running without it", journal=str(self.cfg.journal), error=str(e))
        self.server = self._grpc_server(
            self.cfg.peer_token, PEER_SERVICE, "peer", options=C.PEER_SERVER_KEEPALIVE_OPTIONS
        )
        peer_pb2_grpc.add_PeerServicer_to_server(PeerService(self), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = listen.bind(self.server, self.cfg.listen, "--listen")
        self.trainer_server = self._grpc_server(self.cfg.trainer_token, TRAINER_SERVICE, "trainer")
        trainer_pb2_grpc.add_TrainerLinkServicer_to_server(TrainerLinkService(self), self.trainer_server)
        self.trainer_port = listen.bind(self.trainer_server, self.cfg.trainer_listen, "--trainer-listen")
        await self.server.start()
        await self.trainer_server.start()
        if self.cfg.heartbeat_datagrams:
            self.datagram_port = self.datagrams.open(self.cfg.listen, self.port)
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.serving = True
        self._loop_resumed_at = time.monotonic()
        self._tasks = [
            asyncio.create_task(self._decision_loop(), name="decisions"),
            asyncio.create_task(self._ticker(), name="ticker"),
            asyncio.create_task(self._stream_copier(), name="stream-copies"),
        ]
        if self.cfg.pubsub_subscription:
            from agent.sources.pubsub import PubSubIntake

            self.intake = PubSubIntake(
                self.cfg.pubsub_subscription,
                self._on_node_event,
                cluster=self.cfg.cluster_name,
                project=self.cfg.pubsub_project,
                on_count=self.metrics.count_pubsub,
                on_state=lambda up: self.metrics.pubsub_streaming.set(1 if up else 0),
            )
            self.intake.start()
        await self._start_operator_servers()
        if self.state.phase.terminal:
            self._finish_restored_terminal()
        log.info(
            "coordinator listening",
            address=self.cfg.listen,
            port=self.port,
            trainer_address=self.cfg.trainer_listen,
            trainer_port=self.trainer_port,
            heartbeat_datagram_port=self.datagram_port or None,
            epoch=self.epoch,
            policy=vars(self.state.policy),
            peer_auth=self.cfg.peer_token is not None,
            trainer_auth=self.cfg.trainer_token is not None,
            admin=None if self.admin is None else self.admin.address,
            http=None if self.http is None else self.http.address,
        )

    def _open_files(self) -> None:
        """One descriptor a worker's connection: raise the soft limit to the hard one (``agent.fdlimit``)."""
        p = self.cfg.policy
        hosts = p.num_slices * p.hosts_per_slice
        got = fdlimit.raise_open_files(hosts, p.trainer_processes)
        self.metrics.open_files_limit.set(-1 if got.soft == resource.RLIM_INFINITY else got.soft)
        if got.soft != got.before:
            log.info("open-file limit raised", before=got.before, limit=got.soft, hard=got.hard, need=got.need)
        if not got.enough:
            log.error(
                "open-file limit too low for the job's hosts: the workers past it cannot connect",
                hosts=hosts,
                need=got.need,
                limit=got.soft,
                hard=got.hard,
                fix="raise the container's RLIMIT_NOFILE hard limit (e.g. the container runtime's LimitNOFILE)",
            )

    def _grpc_server(
        self,
        token: BearerToken | None,
        service: str,
        label: str,
        options: tuple[tuple[str, int], ...] = C.GRPC_SERVER_KEEPALIVE_OPTIONS,
    ) -> grpc.aio.Server:
        """A gRPC server whose ``service`` needs ``token`` (when given); health stays open."""
        interceptors = []
        if token is not None:
            interceptors.append(
                BearerAuthInterceptor(
                    token,
                    [service],
                    label=label,
                    on_refused=lambda svc, why: self.metrics.auth_failures.labels(svc, why).inc(),
                )
            )
        return grpc.aio.server(options=list(options), interceptors=interceptors)

    def _finish_restored_terminal(self) -> None:
        """Restarted after the job ended in this restart attempt: say so, tell a trainer that attaches, exit again."""
        code = self.state.exit_code if self.state.exit_code is not None else C.EXIT_RESTART
        wait = self.state.policy.rejoin_grace_seconds
        log.error(
            f"the job already ended ({self.state.phase}, exit code {code}) in this restart attempt; exiting again "
            f"in {wait:g} s after telling any trainer that attaches",
            exit_code=code,
        )
        assert self.exit_code is not None
        asyncio.get_running_loop().call_later(wait, _set_result, self.exit_code, code)

    async def _start_operator_servers(self) -> None:
        cfg = self.cfg
        if cfg.admin_listen is not None:
            from agent.servers.admin import CoordinatorAdmin, start_admin_server

            self.admin = await start_admin_server(
                CoordinatorAdmin(self, self.metrics),
                cfg.admin_listen,
                token=cfg.admin_token,
                metrics=self.metrics,
                tls_cert=cfg.tls_cert,
                tls_key=cfg.tls_key,
            )
        if cfg.http_listen is not None:
            from agent.servers.http import start_http_server
            from agent.servers.status import coordinator_status, status_document

            def status() -> dict[str, Any]:
                doc = status_document(coordinator_status(self), self)
                if self.intake is not None:
                    doc["notice_intake"] = self.intake.status()
                return doc

            self.http = await start_http_server(
                cfg.http_listen,
                status=status,
                ready=self.readiness,
                registry=self.metrics.registry,
                reasons=self.readiness_reasons,
            )

    def readiness(self) -> dict[str, bool]:
        """What /readyz checks. Worker sidecars are not waited for: this pod starts first."""
        # Not the Pub/Sub intake: notices are an optimisation, and a subscription or
        # permission mistake must not keep the job from starting (it shows in /status).
        checks = {
            "grpc": self.serving,
            "not_fenced": not self.fenced_by,
            "state_durable": self.durable,
            "deciding": not self.decisions_wedged,
        }
        if self.state.phase in (Phase.RUNNING, Phase.HOLDING, Phase.WAITING):
            checks["trainer"] = self.state.trainer.attached
        return checks

    def readiness_reasons(self) -> dict[str, str]:
        """Why a failing readiness check fails (/readyz shows it beside the check)."""
        return {
            "not_fenced": f"a newer coordinator (epoch {self.fenced_by}) took over" if self.fenced_by else "",
            "state_durable": self.durability_problem,
            "deciding": "the decision loop is wedged: events wait and nothing was decided"
            if self.decisions_wedged
            else "",
        }

    async def _ticker(self) -> None:
        loop = asyncio.get_running_loop()
        expected = loop.time() + TICK_SECONDS
        while True:
            await asyncio.sleep(max(0.0, expected - loop.time()))
            now = time.monotonic()
            lag = loop.time() - expected
            if lag > STALL_SECONDS:
                self._note_stall(lag, now)
            expected = loop.time() + TICK_SECONDS
            self.datagrams.read_now()
            now = time.monotonic()
            self._note_datagram_drops(now)
            self.check_liveness(now)
            if self.gc_freezer.tick(len(self.workers)):
                self.metrics.gc_frozen_objects.set(gc.get_freeze_count())
            self._check_decisions(now)
            self.submit(Tick())

    def _check_decisions(self, now: float) -> None:
        """Events waiting and nothing decided for long: the decision loop is wedged (awaiting something that
        never returns). Not ready, and NOT_SERVING on gRPC health, the liveness probe's, so that a loop that
        cannot recover by itself is restarted; SERVING again if it moves (and this coordinator is not fenced)."""
        limit = max(DECISIONS_WEDGED_SECONDS, 2 * self.cfg.durability_bound)
        wedged = not self.events.empty() and now - self._decided_at > limit
        if wedged == self.decisions_wedged:
            return
        self.decisions_wedged = wedged
        serving = not wedged and not self.fenced_by
        if wedged:
            log.error(
                "decision loop wedged: events are waiting and nothing was decided; not ready, NOT_SERVING",
                seconds=round(now - self._decided_at, 1),
                queued=self.events.qsize(),
            )
        else:
            log.warning("decision loop deciding again")
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        asyncio.get_running_loop().create_task(self.health.set("", status))

    async def _on_node_event(self, ev: Any) -> None:
        """A parsed Pub/Sub notice (:class:`agent.sources.gke_events.NodeEvent`): decide on it; the intake
        acks once this returns. Wall-clock times become decision-clock (monotonic) times here."""
        wall, mono = time.time(), time.monotonic()

        def clock(t: Any) -> float | None:
            return None if t is None else mono + (t.timestamp() - wall)

        notice = NodeNotice(
            kind=ev.what,
            source="pubsub",
            node=ev.node,
            node_pool=ev.node_pool,
            deadline=clock(ev.start if ev.start is not None else ev.end),
            event_time=None if ev.event_time is None else ev.event_time.timestamp(),
            cleared=ev.cleared,
            reason=ev.summary,
            starts_at=clock(ev.start) if str(ev.kind) == "scheduled" else None,
            ends_at=clock(ev.end),
        )
        if ev.delivery_seconds is not None:
            self.metrics.pubsub_delivery_seconds.observe(max(0.0, ev.delivery_seconds))
        d = await self.request(notice)
        if not d.outcome:
            # From the message's arrival at this subscriber (the callback thread), not from this handler.
            arrived = mono - max(0.0, wall - ev.received_at) if ev.received_at is not None else mono
            self.metrics.observe_notice_delivery("pubsub", time.monotonic() - arrived)

    async def stop(self, grace: float = 1.0) -> None:
        self.serving = False
        self.gc_clock.uninstall()
        # Decide nothing more: what happens from here on is our own teardown
        # (streams we close, pods the JobSet deletes), not news about the job.
        for t in self._tasks:
            t.cancel()
        if self.http is not None:
            await self.http.stop()
            self.http = None
        if self.admin is not None:
            await self.admin.stop(min(grace, 0.5))
            self.admin = None
        if self.intake is not None:
            await asyncio.to_thread(self.intake.stop)
        await self.health.enter_graceful_shutdown()
        for t in self._tasks:
            t.cancel()
        # End the open Join and Attach streams from our side first: a handler still running
        # when server.stop() cancels it is logged by grpc as a raw CancelledError traceback.
        for conn in [*self.workers.values(), *self.trainer_conns.values()]:
            conn.closed.set()
        if self.workers or self.trainer_conns:
            await asyncio.sleep(EOF_GRACE_SECONDS)
        self.datagrams.close()
        if self.server is not None:
            await self.server.stop(grace)
        if self.trainer_server is not None:
            await self.trainer_server.stop(min(grace, 0.5))
        self._close_state_files()

    def _close_state_files(self) -> None:
        """Close the journal and release the state lock. A full, read-only or vanished state directory
        fails the journal's last flush: logged and counted, never the exit code the run earned. Python's
        buffered file closes its descriptor even when that flush fails (io.BufferedWriter.close)."""
        j, self._journal = self._journal, None
        if j is not None:
            try:
                j.close()
            except (OSError, ValueError) as e:
                self.metrics.journal_write_failures.inc()
                log.error("journal could not be flushed at shutdown; its last lines are lost", error=str(e))
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            try:
                os.close(fd)  # releases the flock
            except OSError as e:
                log.warning("state lock could not be closed at shutdown", error=str(e))

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        stop_requested: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop_requested.append, sig)
        try:
            await self.start()
        except OSError as e:
            log.error("coordinator could not start", error=str(e))
            await self.stop(grace=0)
            return C.EXIT_USAGE
        assert self.exit_code is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _set_result, self.exit_code, C.EXIT_OK)
        if stop_requested:
            _set_result(self.exit_code, C.EXIT_OK)
        code = await self.exit_code
        log.info("coordinator stopping", exit_code=code, phase=str(self.state.phase))
        await self.stop()
        return code


class GcClock:
    """Python's garbage collections (``gc.callbacks``): when each ended and how long it held the process."""

    def __init__(self) -> None:
        self._started: float | None = None
        self.recent: collections.deque[tuple[float, float, int]] = collections.deque(maxlen=256)
        """(monotonic end, seconds, generation) of the newest collections."""

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        now = time.monotonic()
        if phase == "start":
            self._started = now
        elif self._started is not None:
            self.recent.append((now, now - self._started, int(info.get("generation", -1))))
            self._started = None

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def uninstall(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def seconds_since(self, since: float) -> float:
        """Seconds of collection after ``since`` (monotonic): each collection's part after it."""
        return sum(min(d, end - since) for end, d, _ in self.recent if end > since)


def _set_result(fut: asyncio.Future[int], value: int) -> None:
    if not fut.done():
        fut.set_result(value)


def _event_detail(ev: Event) -> dict[str, Any]:
    return {k: (sorted(v) if isinstance(v, frozenset) else v) for k, v in vars(ev).items()}


# ---------------------------------------------------------------------------
# the Peer service: worker sidecars
# ---------------------------------------------------------------------------


class PeerService(peer_pb2_grpc.PeerServicer):
    def __init__(self, coord: Coordinator) -> None:
        self.c = coord

    async def Join(
        self, request_iterator: AsyncIterator[peer_pb2.WorkerMessage], context: grpc.aio.ServicerContext
    ) -> None:  # noqa: N802
        cfg = self.c.cfg
        try:
            first = await asyncio.wait_for(context.read(), timeout=cfg.heartbeat_timeout * 4)
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "no Register message within the heartbeat timeout")
            return
        if first is grpc.aio.EOF or not first.HasField("register"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message on Join must be a Register")
            return
        reg = first.register
        ident = reg.identity
        p = cfg.policy
        if reg.job != cfg.job:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"job {reg.job!r} is not this coordinator's job {cfg.job!r}"
            )
            return
        if not (0 <= ident.slice < p.num_slices and 0 <= ident.host < p.hosts_per_slice):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"identity.slice={ident.slice} identity.host={ident.host} outside the job's "
                f"{p.num_slices} slices x {p.hosts_per_slice} hosts",
            )
            return
        if not ident.incarnation:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "identity.incarnation must not be empty")
            return
        if reg.epoch_seen > self.c.epoch:
            await self.c.epoch_claim(
                reg.epoch_seen, reg.epoch_seen_coordinator, reg.epoch_seen_proof, f"worker {ident.slice}.{ident.host}"
            )
        if self.c.fenced_by:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this coordinator (epoch {self.c.epoch}) was superseded by epoch {self.c.fenced_by}",
            )
            return
        key = (ident.slice, ident.host)
        peer = context.peer()
        conn = _Conn(
            incarnation=ident.incarnation,
            health_address=reg.health_address,
            health_check=reg.health_check,
            token=new_token() if self.c.datagram_port else b"",
            registration=next(self.c._registrations),
            who=f"pod {ident.pod or '?'} on node {ident.node or '?'} at {peer}",
        )
        conn.first_seen = conn.registration
        refused = await self._one_voice(key, ident, conn, peer)
        if refused:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, refused)
            return
        old = self.c.workers.get(key)
        self.c.workers[key] = conn
        self.c.gc_freezer.registered()
        if old is not None:
            old.cause = "replaced"
            old.closed.set()
        self.c.metrics.workers.set(len(self.c.workers))
        self.c.submit(
            WorkerJoined(
                ident.slice,
                ident.host,
                ident.incarnation,
                ident.node,
                ident.node_pool,
                reg.generation_seen,
                registration=conn.registration,
            )
        )
        cause = "stream_closed"
        tasks: tuple[asyncio.Task[Any], ...] = ()
        try:
            # The reply is written inside the try: a worker gone while it is written (this handler is then
            # cancelled at the write) ended its stream like any other, and is not left registered unwatched.
            await context.write(
                peer_pb2.CoordinatorMessage(
                    registered=peer_pb2.Registered(
                        generation=self.c.state.generation,
                        heartbeat_interval_seconds=cfg.heartbeat_interval,
                        epoch=self.c.epoch,
                        heartbeat_datagram_port=self.c.datagram_port,
                        heartbeat_datagram_token=conn.token,
                        epoch_coordinator=self.c.coordinator_id,
                        epoch_proof=self.c.epoch_proof,
                    )
                )
            )
            # The worker can send nothing more before it reads this reply: its silence counts from here, not
            # from its Register (a reply that waited behind a fan-out on this loop is not the worker's delay).
            # Nor from the write alone: the reply may take a while to reach it (C.FIRST_HEARTBEAT_TIMEOUT_FACTOR),
            # so the registration is credited with the longer first timeout; its first message (a heartbeat
            # on the stream or by datagram) sets last_seen to that moment, and the usual timeout applies.
            conn.replied_at = time.monotonic()
            conn.last_seen = conn.credited = conn.replied_at + (cfg.first_heartbeat_seconds - cfg.heartbeat_timeout)
            reader = asyncio.create_task(self._read(context, ident, conn))
            writer = asyncio.create_task(self._write(context, conn))
            closer = asyncio.create_task(conn.closed.wait())
            tasks = (reader, writer, closer)
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if reader in done and not reader.cancelled() and reader.exception() is None:
                cause = reader.result()
        finally:
            # This handler is cancelled when the peer dies: what follows runs on its own. A cause the
            # coordinator set (replaced, fenced, ...) outranks what the stream's reader saw.
            cause = conn.cause or cause
            for task in tasks:
                task.cancel()
            self.c.datagrams.forget(conn)
            if self.c.workers.get(key) is conn:
                del self.c.workers[key]
            self.c.gc_freezer.ended()
            self.c.metrics.workers.set(len(self.c.workers))
            if cause not in ("replaced", "fenced"):
                self.c._judging[key] = conn
                asyncio.get_running_loop().create_task(self._ended(ident, conn, cause, peer))
        if cause == "replaced" and conn.replaced_by:
            # A newer sidecar claims this host: say so, so that this one backs off instead of taking it back.
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, conn.replaced_by)

    async def _one_voice(self, key: tuple[int, int], ident: peer_pb2.HostIdentity, conn: _Conn, peer: str) -> str:
        """Of two sidecar processes claiming one host, the one first seen later speaks for it.

        Returns why ``conn`` is refused (an older claimant while the newer is live), or "" to go on.
        A newer claimant takes over from a live older one without a loss of the host: the core is
        told only of the new registration (decide: a second sidecar is no loss). Only when the older
        one had gone silent is its host checked first, as when a stream ends: a replacement pod that
        registers before its predecessor's silence was judged is then still a lost host.
        """
        c = self.c
        cur = c.workers.get(key)
        displaced = c._displaced.get(key, {})
        mine = displaced.get(ident.incarnation)
        if mine is not None:
            conn.first_seen = mine[0]
        if cur is not None and cur.incarnation != ident.incarnation and not cur.closed.is_set():
            if conn.first_seen < cur.first_seen:
                c.metrics.duplicate_hosts.labels("refused").inc()
                why = (
                    f"host {key[0]}.{key[1]} is claimed by a newer live sidecar (incarnation {cur.incarnation}, "
                    f"{cur.who}); this older one (incarnation {ident.incarnation}, {conn.who}) is refused while "
                    "that one is live: two sidecars claim one host (a stale pod, or a manifest mistake)"
                )
                log.warning(
                    "two sidecars claim one host: refused the older one",
                    slice=key[0],
                    host=key[1],
                    refused=f"{ident.incarnation} ({conn.who})",
                    live=f"{cur.incarnation} ({cur.who})",
                )
                return why
            c.metrics.duplicate_hosts.labels("took_over").inc()
            log.warning(
                "two sidecars claim one host: the newer one speaks for it, the older one is refused while it is "
                "live (no loss of the host)",
                slice=key[0],
                host=key[1],
                newer=f"{ident.incarnation} ({conn.who})",
                older=f"{cur.incarnation} ({cur.who})",
            )
            cur.replaced_by = (
                f"host {key[0]}.{key[1]} is now claimed by a newer sidecar (incarnation {ident.incarnation}, "
                f"{conn.who}); this one (incarnation {cur.incarnation}) is refused while that one is live"
            )
            kept = dict(displaced)
            kept[cur.incarnation] = (cur.first_seen, cur.who)
            kept.pop(ident.incarnation, None)
            c._displaced[key] = dict(sorted(kept.items(), key=lambda kv: kv[1][0])[-DISPLACED_KEPT:])
            silent = time.monotonic() - max(cur.last_seen, c.loop_resumed_at)
            if silent > 2 * c.cfg.heartbeat_interval and (cur.health_check or "grpc") == "grpc":
                ok, detail = await c.probe_host(key, cur, peer)
                if not ok:
                    log.warning("host check failed", slice=key[0], host=key[1], cause="replaced", detail=detail)
                    c.submit(
                        WorkerLost(key[0], key[1], cur.incarnation, "replaced_host_down", silent, cur.registration)
                    )
            return ""
        if mine is not None:
            # Back once the newer one went (its stream ended): the same two processes take turns.
            del displaced[ident.incarnation]
            if not displaced:
                del c._displaced[key]
            c.metrics.duplicate_hosts.labels("returned").inc()
            log.warning(
                "two sidecars claim one host and are flapping: an older one is back after the newer one's stream ended",
                slice=key[0],
                host=key[1],
                returned=f"{ident.incarnation} ({conn.who})",
                others="; ".join(f"{inc} ({who})" for inc, (_, who) in displaced.items()) or "?",
            )
        judging = c._judging.get(key)
        if judging is not None and judging.incarnation != ident.incarnation:
            # The previous registration's end is being judged (its host checked): let that verdict reach the
            # core first, or it would be about a replaced registration and dropped.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(judging.judged.wait(), PROBE_TIMEOUT_SECONDS * 4)
        return ""

    async def _ended(self, ident: peer_pb2.HostIdentity, conn: _Conn, cause: str, peer: str) -> None:
        """A worker's stream ended: a lost host, or only its sidecar (the host still answers)."""
        key = (ident.slice, ident.host)
        # Silence counts only from the end of this coordinator's newest stall (or kernel drop of
        # heartbeat datagrams), as in check_liveness: while it fell behind, it heard nobody.
        silent = time.monotonic() - max(conn.last_seen, self.c.loop_resumed_at)
        if cause in ("stream_closed", "shutdown") and silent > 2 * self.c.cfg.heartbeat_interval:
            # Already silent when the stream broke: the transport keepalive noticed a hung host first.
            cause = "heartbeat_timeout"
        # Before calling the host lost, look at its Pathways worker ourselves: a
        # sidecar that restarts, is paused or is cut off (or a stream that blips) on
        # a healthy host is no loss. A silent worker too, but only with a check the
        # Pathways worker's process must answer (gRPC health): a hung host's kernel
        # still accepts TCP connections for its stopped processes, so a TCP connect
        # could mask the hang. Every result names this registration: if the worker
        # registered again meanwhile, the core drops it (see HostRecord.registration).
        blind = cause == "heartbeat_timeout" and (conn.health_check or "grpc") != "grpc"
        try:
            ok, detail = (False, "") if blind else await self.c.probe_host(key, conn, peer)
            if ok:
                away = WorkerAway(ident.slice, ident.host, ident.incarnation, f"{cause}; {detail}", conn.registration)
                self.c.submit(away)
            else:
                silent = time.monotonic() - (conn.replied_at if conn.last_seen == conn.credited else conn.last_seen)
                if detail:
                    log.warning("host check failed", slice=ident.slice, host=ident.host, cause=cause, detail=detail)
                lost = WorkerLost(ident.slice, ident.host, ident.incarnation, cause, silent, conn.registration)
                self.c.submit(lost)
        finally:
            conn.judged.set()
            if self.c._judging.get(key) is conn:
                del self.c._judging[key]
        if ok:
            await self.c.watch_away(key, conn, peer)

    async def _read(self, context: grpc.aio.ServicerContext, ident: peer_pb2.HostIdentity, conn: _Conn) -> str:
        # No read deadline here: lateness is judged by Coordinator.check_liveness
        # from when messages were read, so a blocked event loop cannot fake it.
        while True:
            try:
                msg = await context.read()
            except (grpc.aio.AioRpcError, asyncio.CancelledError):
                return "stream_closed"
            if msg is grpc.aio.EOF:
                # grpc.aio also reads EOF from a call the peer's death cancelled; that
                # cancellation (which ends Join as "stream_closed") follows at once.
                await asyncio.sleep(EOF_GRACE_SECONDS)
                return "shutdown"
            conn.last_seen = time.monotonic()
            if msg.HasField("heartbeat"):
                continue
            if msg.HasField("report"):
                kind = msg.report.kind
                if kind in ("pathways_unhealthy", "pathways_healthy"):
                    self.c.submit(
                        WorkerHealth(
                            ident.slice,
                            ident.host,
                            ident.incarnation,
                            kind == "pathways_healthy",
                            msg.report.detail,
                            conn.registration,
                        )
                    )
                elif kind == "metadata_notice":
                    self.c.submit(_metadata_notice(ident, msg.report))
                else:
                    log.warning("unknown worker report kind ignored", kind=kind, slice=ident.slice, host=ident.host)

    async def _write(self, context: grpc.aio.ServicerContext, conn: _Conn) -> None:
        while True:
            msg = await conn.outbox.get()
            await context.write(msg)


def _probe_address(health_address: str, peer: str) -> str:
    """Where to check a host's Pathways worker: its registered address, a loopback host replaced by the peer's."""
    if not health_address:
        return ""
    host, _, port = health_address.rpartition(":")
    # grpc peer strings: "ipv4:10.0.0.5:41234", "ipv6:[::1]:41234"
    kind, _, rest = peer.partition(":")
    peer_host = rest.rpartition(":")[0] if kind in ("ipv4", "ipv6") else ""
    if peer_host and is_loopback(f"{host}:0") and not is_loopback(f"{peer_host}:0"):
        host = peer_host
    return f"{host}:{port}"


# ---------------------------------------------------------------------------
# the TrainerLink service: the trainer hooks
# ---------------------------------------------------------------------------


class TrainerLinkService(trainer_pb2_grpc.TrainerLinkServicer):
    def __init__(self, coord: Coordinator) -> None:
        self.c = coord

    async def Attach(
        self, request_iterator: AsyncIterator[trainer_pb2.TrainerMessage], context: grpc.aio.ServicerContext
    ) -> None:  # noqa: N802
        first = await context.read()
        if first is grpc.aio.EOF or not first.HasField("hello"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message on Attach must be a TrainerHello")
            return
        hello = first.hello
        if hello.job and hello.job != self.c.cfg.job:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {hello.job!r} is not this coordinator's job {self.c.cfg.job!r}",
            )
            return
        if hello.epoch > self.c.epoch:
            await self.c.epoch_claim(hello.epoch, hello.epoch_coordinator, hello.epoch_proof, "the trainer")
        if self.c.fenced_by:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this coordinator (epoch {self.c.epoch}) was superseded by epoch {self.c.fenced_by}",
            )
            return
        group = self.c.group
        index = hello.process_index
        refused = group.check_hello(index, hello.process_count)
        if refused:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refused)
            return
        old = self.c.trainer_conns.get(index)
        if old is not None and not old.closed.is_set():
            # One trainer process, one link. A second live link for it is a second trainer for this job (two
            # launches, a stale pod): letting each replace the other had them evict each other in a loop.
            # The link that is live keeps the job; a restarted trainer's old link is gone first (its process
            # ended, the stream with it; the transport keepalive finds a silent one), so its new one gets in.
            self.c.metrics.duplicate_trainer_links.inc()
            why = (
                f"a trainer link for process {index} of job {self.c.cfg.job!r} is already attached "
                f"({old.who or '?'}); this second one ({context.peer()}) is refused: is a second trainer running "
                "against this sidecar?"
            )
            log.warning("second trainer link refused", process_index=index, live=old.who, refused=context.peer())
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, why)
            return
        # Headers now: the trainer counts its link as up once the sidecar has accepted it.
        await context.send_initial_metadata(())
        conn = _Conn(who=f"{hello.host or 'trainer'} at {context.peer()}")
        self.c.trainer_conns[index] = conn
        settings = None
        if hello.has_elastic_settings:
            settings = TrainerSettings(
                hello.elastic_min_slice_count, hello.elastic_timeout_seconds, hello.elastic_max_retries
            )
        attached = TrainerAttached(
            hello.generation,
            hello.step_in_memory,
            frozenset(hello.active_slices),
            settings,
            committed_step=hello.committed_step if hello.HasField("committed_step") else -1,
            held=hello.held,
        )
        if not group.single:
            log.info(
                "trainer process attached",
                process_index=index,
                process_count=hello.process_count,
                trainer_host=hello.host,
                generation=hello.generation,
                step=hello.step_in_memory,
                attached=sorted(self.c.trainer_conns),
            )
        for ev in group.attached(index, attached, hello.host):
            self.c.submit(ev)
        reader = asyncio.create_task(self._read(context, index))
        writer = asyncio.create_task(self._write(context, conn))
        closer = asyncio.create_task(conn.closed.wait())
        try:
            await asyncio.wait({reader, writer, closer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            reader.cancel()
            writer.cancel()
            closer.cancel()
            if self.c.trainer_conns.get(index) is conn:
                del self.c.trainer_conns[index]
                if not group.single:
                    log.warning(
                        "trainer process link closed", process_index=index, attached=sorted(self.c.trainer_conns)
                    )
                for ev in group.detached(index):
                    self.c.submit(ev)

    async def _read(self, context: grpc.aio.ServicerContext, index: int) -> None:
        while True:
            try:
                msg = await context.read()
            except grpc.aio.AioRpcError:
                return
            if msg is grpc.aio.EOF:
                return
            ev = _trainer_event(msg)
            if ev is not None:
                for out in self.c.group.message(index, ev):
                    self.c.submit(out)

    async def _write(self, context: grpc.aio.ServicerContext, conn: _Conn) -> None:
        while True:
            cmd = await conn.outbox.get()
            await context.write(cmd)


def _trainer_event(msg: trainer_pb2.TrainerMessage) -> Event | None:
    match msg.WhichOneof("msg"):
        case "step":
            return TrainerStepped(msg.step.step, msg.step.generation, msg.step.step_seconds)
        case "slice_error":
            e = msg.slice_error
            return TrainerSliceError(frozenset(e.slices), e.message, e.step, e.generation)
        case "held":
            h = msg.held
            return TrainerHeld(h.generation, h.step, h.committed_step, h.flush_seconds, h.flush_bytes, h.flush_error)
        case "resumed":
            r = msg.resumed
            return TrainerResumed(r.generation, r.step, frozenset(r.active_slices), r.restored_from)
        case "flushed":
            f = msg.flushed
            return TrainerFlushed(f.generation, f.committed_step, f.flush_seconds, f.flush_bytes, f.flush_error)
        case "finished":
            return TrainerFinished(msg.finished.step)
    log.warning("unexpected trainer message ignored", kind=msg.WhichOneof("msg"))
    return None


async def serve(cfg: CoordinatorConfig) -> int:
    logmod.configure(cfg.log_format, cfg.log_level, jobset=cfg.job, role="coordinator")
    return await Coordinator(cfg).run()


def _metadata_notice(ident: peer_pb2.HostIdentity, report: peer_pb2.LocalReport) -> NodeNotice:
    """A worker's metadata server announced (or cleared) a disruption of its own host."""
    key, _, value = report.detail.partition("=")
    cleared = value in ("NONE", "FALSE")
    left = report.deadline_unix - time.time() if report.deadline_unix else None
    # The node label cloud.google.com/scheduled-maintenance-time names a window's start: plan the
    # drain for it (agent.sources.node_pool) instead of draining now.
    scheduled = key == "node/scheduled-maintenance-time" and left is not None and not cleared
    return NodeNotice(
        kind=key.rsplit("/", 1)[-1] + ("" if value.isdigit() else f":{value}"),  # no timestamps in metric labels
        source="metadata",
        node=ident.node,
        slice=ident.slice,
        deadline=None if left is None else time.monotonic() + left,
        event_time=report.event_time_unix or None,
        cleared=cleared,
        reason=f"{'node' if key.startswith('node/') else 'metadata server'} "
        f"{ident.node or f'host {ident.slice}.{ident.host}'}: {key} = {value}",
        starts_at=time.monotonic() + left if scheduled and left is not None else None,
    )
