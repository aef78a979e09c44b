"""The coordinator sidecar, one per job beside the trainer: wiring, the decision loop, and the
write-ahead rule (a decision's state is durable before any of its actions runs).

Sources (:mod:`agent.sources`) submit events; :meth:`Coordinator._decision_loop` decides each with
:func:`agent.core.decide`, makes the new state durable (:mod:`agent.durable`), then hands the
actions to :mod:`agent.executors`. docs/design.md, "How an event travels", has the whole path and
the rules for durability, fencing and liveness.
"""

from __future__ import annotations

import asyncio
import gc
import resource
import signal
import time
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from agent import constants as C
from agent import fdlimit
from agent import log as logmod
from agent.config import CoordinatorConfig
from agent.core import decide, initial_state
from agent.core.model import (
    AbortTrainer,
    Action,
    Decision,
    Event,
    ExitCoordinator,
    FlushTrainer,
    HoldTrainer,
    Phase,
    PrepareTrainer,
    ReplaceSlice,
    ResumeTrainer,
    State,
    TellWorkers,
    Tick,
    TrainerFlushed,
    TrainerResumed,
    TrainerStepped,
)
from agent.durable import fencing, statefile
from agent.durable.journal import Journal, action_record, event_detail
from agent.durable.lock import StateLock, lock_path
from agent.durable.writer import StateWriter
from agent.executors import TrainerExecutor, WorkerExecutor
from agent.gc_freeze import GcFreezer
from agent.links import EOF_GRACE_SECONDS, Link
from agent.loop_watch import LoopWatch
from agent.metrics import Metrics
from agent.phase_clock import PhaseClock
from agent.servers import listen
from agent.servers.feed import EventFeed
from agent.slice_replace import SliceReplacer
from agent.sources.heartbeat_datagrams import DatagramReceiver
from agent.sources.peers import PEER_SERVICE, PeerService
from agent.sources.pubsub import PubSubIntake, node_notice
from agent.sources.trainer_link import TRAINER_SERVICE, TrainerLinkService
from agent.stragglers.collector import StragglerCollector
from agent.trainer_group import TrainerGroup
from protos.elastic_sidecar.v1 import peer_pb2_grpc, trainer_pb2_grpc

log = logmod.get("coordinator")
TICK_SECONDS = 0.2
"""Deadlines (start, hold, wait, rejoin) are seconds to minutes long: a coarse tick
is enough, and an idle coordinator should cost next to nothing."""
STALL_SECONDS = 0.5
"""A tick this late means the event loop was blocked: liveness deadlines restart from its end."""
DECISIONS_WEDGED_SECONDS = 10.0
"""Events waiting and nothing decided for this long (or twice --durability-bound, if longer): the
decision loop is wedged; readiness and gRPC health say so (see _check_decisions)."""
GROUP_COMMIT_MAX = 1024
"""Most events decided before one state write (write-ahead still holds: all are durable before any acts)."""


class Coordinator:
    """Owns the state; everything else talks to it through :meth:`submit` or :meth:`request`."""

    def __init__(self, cfg: CoordinatorConfig) -> None:
        self.cfg = cfg
        self.metrics = Metrics("coordinator")
        self.started_at = time.time()
        self._init_decisions()
        self._init_links()
        self._init_durability()
        self._init_servers()
        self._init_process_watch()

    def _init_decisions(self) -> None:
        """The state, the events waiting to be decided, and who hears of the decisions."""
        self.events: asyncio.Queue[tuple[Event, asyncio.Future[Decision] | None]] = asyncio.Queue()
        self.state: State = initial_state(self.cfg.policy, time.monotonic())
        self.exit_code: asyncio.Future[int] | None = None
        self.feed = EventFeed()
        """The newest decisions and their subscribers, for WatchEvents and the status page."""
        self._flush_waiters: list[tuple[int, asyncio.Future[TrainerFlushed]]] = []
        self.last_reason = ""
        self._recovery: int | None = None
        """Generation of the hold that began the recovery in progress (its log operation id)."""
        self._phases = PhaseClock()  # a recovery's phases, for the journal and the admin events stream
        self._decided_at = time.monotonic()
        """When the decision loop last finished a batch (monotonic)."""
        self.decisions_wedged = False
        """Events have waited past DECISIONS_WEDGED_SECONDS with nothing decided."""
        self.stragglers = StragglerCollector.from_config(self.cfg, self.metrics)
        """Workers' metrics windows and step times into straggler verdicts (docs/stragglers.md)."""

    def _init_links(self) -> None:
        """The sources' open streams and the executors that write to them."""
        self.workers: dict[tuple[int, int], Link] = {}
        self.trainer_conns: dict[int, Link] = {}
        """Open trainer links by JAX process index (one, index 0, unless multi-controller)."""
        self.group = TrainerGroup(self.cfg.policy.trainer_processes)
        """Presents the trainer processes to the core as one trainer (:mod:`agent.trainer_group`)."""
        self.peers = PeerService(self)
        """The Peer service: worker sidecars' streams and heartbeats (:mod:`agent.sources.peers`)."""
        self.datagrams = DatagramReceiver(self.peers.datagram_heartbeat, self.metrics.count_heartbeat_datagrams)
        self.to_trainer = TrainerExecutor(self)
        self.to_workers = WorkerExecutor(self)
        self.replacer: SliceReplacer | None = None
        """Cordons a replaced straggler slice's nodes and deletes its pods (--straggler-replace)."""
        if self.cfg.policy.straggler_replace:
            count = self.metrics.straggler_replacements
            self.replacer = SliceReplacer(self.cfg.job, self.cfg.kubeconfig, lambda o: count.labels(o).inc())

    def _init_durability(self) -> None:
        """What survives a restart (:mod:`agent.durable`): state file, journal, lock, epoch."""
        cfg = self.cfg
        self.store = StateWriter(
            cfg.state_file, cfg.durability_bound, cfg.restart_attempt, self.metrics, lambda: self.epoch
        )
        """The state file under the write-ahead rule (:mod:`agent.durable.writer`)."""
        self.journal = Journal(cfg.journal, cfg.journal_max_bytes, self.metrics.journal_write_failures.inc)
        self.lock = StateLock(lock_path(cfg.state_dir, cfg.state_file))
        self.state_file_note = ""
        """What happened to the state file at start (restored, unreadable and moved aside, ...)."""
        self.state_file_problem = ""
        """Set when the state file found at start could not be used (it was moved aside)."""
        self.epoch = 0
        """This process's epoch: it grows at every coordinator start (fencing)."""
        self.fenced_by = 0
        """A newer coordinator's epoch, once a participant reported one: this one no longer steers."""
        self.coordinator_id = fencing.new_coordinator_id()
        """Who issues this process's epochs (part of their proof)."""
        self.epoch_proof = b""
        """The proof of :attr:`epoch` (agent.durable.fencing)."""
        self._blind = True
        """Started with no usable state file: its epoch rests on the wall clock."""
        self._steered = False
        """A command went to the trainer or the workers (a blind epoch can no longer be moved)."""
        self._claims_ignored = 0

    def _init_servers(self) -> None:
        self.port: int = 0
        self.trainer_port: int = 0
        self.datagram_port: int = 0
        """UDP port of the heartbeat datagrams (0: off)."""
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

    def _init_process_watch(self) -> None:
        self.loop_watch = LoopWatch(self.metrics, lambda: self.datagrams.dropped())
        """Stalls of the event loop and datagrams the kernel dropped (:mod:`agent.loop_watch`)."""
        self.gc_freezer = GcFreezer(enabled=self.cfg.gc_freeze)
        """Keeps registered workers' objects out of full collections (--gc-freeze)."""

    @property
    def trainer(self) -> Link | None:
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

    # -- state on disk -------------------------------------------------------

    def _load_state(self) -> None:
        cfg = self.cfg
        loaded = statefile.load(cfg.state_file, self.state, time.monotonic(), cfg.restart_attempt)
        self.state_file_note, self.state_file_problem = loaded.note, loaded.problem
        file_epoch = 0
        if loaded.restored is not None:
            self.state, file_epoch = loaded.restored.state, loaded.restored.epoch
        self._blind = cfg.state_file is None or not loaded.note or bool(loaded.problem)
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

    @property
    def durable(self) -> bool:
        """Every decision so far reached the state file before its actions ran."""
        return self.store.durable

    @property
    def durability_problem(self) -> str:
        return self.store.problem

    async def _make_durable(self) -> None:
        """Write the current state before its actions run (the write-ahead rule)."""
        await self.store.write(self.state)

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
                write_due = write_due or self.store.due(d.state)
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
        self.stragglers.note(ev, d, before, time.time(), now)
        self._record(ev, d, before, self._phases.observe(ev, d, before, now))
        return d

    def _record(self, ev: Event, d: Decision, before: State, phases: dict[str, float]) -> None:
        quiet = isinstance(ev, (Tick, TrainerStepped)) and not d.actions and d.state.phase == before.phase
        if quiet and not phases:
            return
        s = d.state
        fields: dict[str, Any] = {
            "trigger": type(ev).__name__,
            "phase": str(s.phase),
            "generation": s.generation,
            "active_slices": sorted(s.active),
            "up_slices": sorted(s.up_slices()),
            "actions": [action_record(a) for a in d.actions],
            **({"phases": {k: round(v, 6) for k, v in phases.items()}} if phases else {}),
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
        self.feed.publish(rec)
        if self.journal.file is not None:
            rec = {
                "time": time.time(),
                "reason": d.reason,
                **fields,
                "retries_used": s.retries_used,
                "event_detail": event_detail(ev),
            }
            self.journal.append(logmod.bounded(rec) + "\n")  # at most log.MAX_LINE_BYTES

    # -- executors -----------------------------------------------------------

    def _execute(self, a: Action) -> None:
        if self.fenced_by:
            log.warning("fenced: not carrying out", action=type(a).__name__, newer_epoch=self.fenced_by)
            return
        match a:
            case HoldTrainer() | ResumeTrainer() | AbortTrainer() | FlushTrainer() | PrepareTrainer():
                self._steered = True
                self.to_trainer.carry_out(a)
            case TellWorkers():
                self._steered = True
                self.to_workers.carry_out(a)
            case ReplaceSlice():
                if self.replacer is not None:
                    self.replacer.carry_out(a)
            case ExitCoordinator():
                if self.exit_code is not None and not self.exit_code.done():
                    # Give the streams a moment to deliver the last commands.
                    asyncio.get_running_loop().call_later(0.5, _set_result, self.exit_code, a.exit_code)

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

    @property
    def loop_resumed_at(self) -> float:
        """End of the newest event-loop stall or kernel drop of heartbeat datagrams (monotonic)."""
        return self.loop_watch.resumed_at

    async def start(self) -> None:
        self.exit_code = asyncio.get_running_loop().create_future()
        self._open_files()
        self.loop_watch.gc_clock.install()
        await self.lock.acquire(self.store.unusable)
        self._load_state()
        if self.cfg.state_file is not None:
            # The new epoch must be on disk before anyone hears of it.
            await self._make_durable()
        self.journal.open()
        await self._serve_sources()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.serving = True
        self.loop_watch.resumed_at = time.monotonic()
        self._tasks = [
            asyncio.create_task(self._decision_loop(), name="decisions"),
            asyncio.create_task(self._ticker(), name="ticker"),
            asyncio.create_task(self.to_workers.copy_to_streams(), name="stream-copies"),
        ]
        self._start_intake()
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
        got = fdlimit.raise_for_job(p.num_slices * p.hosts_per_slice, p.trainer_processes)
        self.metrics.open_files_limit.set(-1 if got.soft == resource.RLIM_INFINITY else got.soft)

    async def _serve_sources(self) -> None:
        """The Peer and TrainerLink services, each on its own listener, and the heartbeat datagrams."""
        cfg = self.cfg
        self.server = listen.grpc_server(
            cfg.peer_token, PEER_SERVICE, "peer", self._auth_refused, options=C.PEER_SERVER_KEEPALIVE_OPTIONS
        )
        peer_pb2_grpc.add_PeerServicer_to_server(self.peers, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = listen.bind(self.server, cfg.listen, "--listen")
        self.trainer_server = listen.grpc_server(cfg.trainer_token, TRAINER_SERVICE, "trainer", self._auth_refused)
        trainer_pb2_grpc.add_TrainerLinkServicer_to_server(TrainerLinkService(self), self.trainer_server)
        self.trainer_port = listen.bind(self.trainer_server, cfg.trainer_listen, "--trainer-listen")
        await self.server.start()
        await self.trainer_server.start()
        if cfg.heartbeat_datagrams:
            self.datagram_port = self.datagrams.open(cfg.listen, self.port)

    def _start_intake(self) -> None:
        """Notices from Pub/Sub, when the job has a subscription (:mod:`agent.sources.pubsub`)."""
        cfg = self.cfg
        if cfg.pubsub_subscription:
            self.intake = PubSubIntake(
                cfg.pubsub_subscription,
                self._on_node_event,
                cluster=cfg.cluster_name,
                project=cfg.pubsub_project,
                on_count=self.metrics.count_pubsub,
                on_state=lambda up: self.metrics.pubsub_streaming.set(1 if up else 0),
            )
            self.intake.start()

    def _auth_refused(self, service: str, why: str) -> None:
        self.metrics.auth_failures.labels(service, why).inc()

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
                doc = status_document(coordinator_status(self), self.feed)
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
                self.loop_watch.note_stall(lag, now)
            expected = loop.time() + TICK_SECONDS
            self.datagrams.read_now()
            now = time.monotonic()
            self.loop_watch.note_datagram_drops(now)
            self.peers.check_liveness(now)
            if self.gc_freezer.tick(len(self.workers)):
                self.metrics.gc_frozen_objects.set(gc.get_freeze_count())
            self._check_decisions(now)
            for verdict in self.stragglers.tick(self.state, time.time(), now):
                self.submit(verdict)
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
        acks once this returns."""
        wall, mono = time.time(), time.monotonic()
        notice = node_notice(ev, wall, mono)
        if ev.delivery_seconds is not None:
            self.metrics.pubsub_delivery_seconds.observe(max(0.0, ev.delivery_seconds))
        d = await self.request(notice)
        if not d.outcome:
            # From the message's arrival at this subscriber (the callback thread), not from this handler.
            arrived = mono - max(0.0, wall - ev.received_at) if ev.received_at is not None else mono
            self.metrics.observe_notice_delivery("pubsub", time.monotonic() - arrived)

    async def stop(self, grace: float = 1.0) -> None:
        self.serving = False
        self.loop_watch.gc_clock.uninstall()
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
        if self.replacer is not None:
            self.replacer.close()
        self.journal.close()
        self.lock.release()

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


def _set_result(fut: asyncio.Future[int], value: int) -> None:
    if not fut.done():
        fut.set_result(value)


async def serve(cfg: CoordinatorConfig) -> int:
    logmod.configure(cfg.log_format, cfg.log_level, jobset=cfg.job, role="coordinator")
    return await Coordinator(cfg).run()
