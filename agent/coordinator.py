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
    PrepareTrainer,
    ReplaceSlice,
    ResumeTrainer,
    State,
    TellWorkers,
    Tick,
    TrainerFlushed,
)
from agent.durable import fencing, statefile
from agent.durable.journal import Journal
from agent.durable.lock import StateLock, lock_path
from agent.durable.writer import StateWriter
from agent.executors import TrainerExecutor, WorkerExecutor
from agent.gc_freeze import GcFreezer
from agent.links import EOF_GRACE_SECONDS, Link
from agent.loop_watch import DecisionWatch, LoopWatch
from agent.metrics import Metrics
from agent.phase_clock import PhaseClock
from agent.record import DecisionRecord
from agent.servers import listen
from agent.servers.feed import EventFeed
from agent.slice_replace import SliceReplacer
from agent.sources.heartbeat_datagrams import DatagramReceiver
from agent.sources.peers import PEER_SERVICE, PeerService
from agent.sources.pubsub import PubSubIntake, decide_notice
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
        self.decisions = DecisionWatch(self.cfg.durability_bound)
        """The decision loop's watchdog (:mod:`agent.loop_watch`)."""
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
        self.records = DecisionRecord(self.feed, self.journal)
        self.phase_clock = PhaseClock()
        """Each decision to the log, the feed and the journal (:mod:`agent.record`)."""
        self.lock = StateLock(lock_path(cfg.state_dir, cfg.state_file))
        self.state_file_note = ""
        """What happened to the state file at start (restored, unreadable and moved aside, ...)."""
        self.state_file_problem = ""
        """Set when the state file found at start could not be used (it was moved aside)."""
        self.fencing = fencing.Epoch(cfg.peer_token, cfg.job)
        """This process's epoch and whether a newer coordinator fenced it (:mod:`agent.durable.fencing`)."""

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

    @property
    def last_reason(self) -> str:
        return self.records.last_reason

    @property
    def decisions_wedged(self) -> bool:
        return self.decisions.wedged

    @property
    def epoch(self) -> int:
        return self.fencing.epoch

    @property
    def epoch_proof(self) -> bytes:
        return self.fencing.proof

    @property
    def coordinator_id(self) -> str:
        return self.fencing.coordinator_id

    @property
    def fenced_by(self) -> int:
        return self.fencing.fenced_by

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
        self.fencing.blind = cfg.state_file is None or not loaded.note or bool(loaded.problem)
        self.fencing.take(fencing.next_epoch(None if self.fencing.blind else file_epoch))
        self.metrics.epoch.set(self.epoch)
        self.metrics.state_durable.set(1 if self.durable else 0)

    async def epoch_claim(self, epoch: int, coordinator: str, proof: bytes, who: str) -> None:
        """A participant says it has seen ``epoch`` (above ours): believe it only if its proof verifies.

        Verified: a blind start that has not steered yet moves above it (durable before it is
        used); otherwise this coordinator is fenced. Not verified: logged and ignored.
        """
        old = self.epoch
        match self.fencing.claim(epoch, coordinator, proof):
            case "unproven":
                log.warning(
                    "a newer coordinator epoch was claimed without a valid proof; ignored (not fencing)",
                    claimed_epoch=epoch,
                    epoch=self.epoch,
                    reported_by=who,
                    claims_ignored=self.fencing.claims_ignored,
                )
            case "moved":
                self.metrics.epoch.set(self.epoch)
                log.warning(
                    "started without a state file below an epoch already issued; taking the next one above it",
                    epoch=self.epoch,
                    was=old,
                    seen_epoch=epoch,
                    reported_by=who,
                )
                await self._make_durable()
            case "fenced":
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
            self.decisions.decided_at = time.monotonic()

    def apply(self, ev: Event, now: float) -> Decision:
        """Decide on one event and record the decision (log, journal, feed, metrics).

        Nothing is carried out here: the loop makes the new state durable,
        then executes the actions (:meth:`_decision_loop`).
        """
        before = self.state
        d = decide(before, ev, now)
        self.state = d.state
        phases = self.phase_clock.observe(ev, d, before, now)  # one clock: the metric, journal and events share it
        self.metrics.observe(ev, d, before, now, phases)
        if isinstance(ev, TrainerFlushed):
            for g, f in self._flush_waiters:
                if ev.generation >= g and not f.done():
                    f.set_result(ev)
        self.stragglers.note(ev, d, before, time.time(), now)
        self.records.record(ev, d, before, phases)
        return d

    # -- executors -----------------------------------------------------------

    def _execute(self, a: Action) -> None:
        if self.fenced_by:
            log.warning("fenced: not carrying out", action=type(a).__name__, newer_epoch=self.fenced_by)
            return
        match a:
            case HoldTrainer() | ResumeTrainer() | AbortTrainer() | FlushTrainer() | PrepareTrainer():
                self.fencing.steered = True
                self.to_trainer.carry_out(a)
            case TellWorkers():
                self.fencing.steered = True
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
        self.fencing.fenced_by = newer_epoch
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
                lambda ev: decide_notice(ev, self.request, self.metrics),
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
            from agent.servers.status import (
                coordinator_readiness,
                coordinator_status,
                readiness_reasons,
                status_document,
            )

            def status() -> dict[str, Any]:
                doc = status_document(coordinator_status(self), self.feed)
                if self.intake is not None:
                    doc["notice_intake"] = self.intake.status()
                return doc

            self.http = await start_http_server(
                cfg.http_listen,
                status=status,
                ready=lambda: coordinator_readiness(self),
                registry=self.metrics.registry,
                reasons=lambda: readiness_reasons(self),
            )

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
        """A wedged decision loop is NOT_SERVING on gRPC health, the liveness probe's (:class:`DecisionWatch`);
        SERVING again once it moves, unless this coordinator is fenced."""
        if not self.decisions.changed(now, self.events.qsize()):
            return
        serving = not self.decisions.wedged and not self.fenced_by
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        asyncio.get_running_loop().create_task(self.health.set("", status))

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
