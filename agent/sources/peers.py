"""The Peer service: worker sidecars register, report and heartbeat here, and this source turns
what they say (or their silence) into core events: joined, away, lost, health, metadata notices."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from agent import log as logmod
from agent.config import is_loopback
from agent.core.model import NodeNotice, WorkerAway, WorkerHealth, WorkerJoined, WorkerLost
from agent.links import EOF_GRACE_SECONDS, Link, Refused
from agent.sources.health import probe
from agent.sources.heartbeat_datagrams import Reply, command_position, new_token, same_token
from protos.elastic_sidecar.v1 import peer_pb2, peer_pb2_grpc

if TYPE_CHECKING:
    from agent.coordinator import Coordinator

log = logmod.get("coordinator")
PEER_SERVICE = peer_pb2.DESCRIPTOR.services_by_name["Peer"].full_name
PROBE_TIMEOUT_SECONDS = 0.3
"""How long one of the coordinator's own checks of a host's Pathways worker may take."""
PROBE_ATTEMPTS = 3
"""Checks in a row that must get no answer before a host counts as down (a refusal counts at once)."""
PROBE_PAUSE_SECONDS = 0.1
"""Between two checks of a host that did not answer: a slow moment may pass."""
PROBE_BOUND_SECONDS = PROBE_ATTEMPTS * PROBE_TIMEOUT_SECONDS + (PROBE_ATTEMPTS - 1) * PROBE_PAUSE_SECONDS
"""The longest a host check takes (a silent host's takes one check: :meth:`PeerService.probe_host`)."""
DISPLACED_KEPT = 4
"""Incarnations remembered per host as taken over by a newer sidecar (more than two claimants is rare)."""
AWAY_PROBE_SECONDS = 0.25
"""How often a host whose sidecar is away is checked until the sidecar is back."""

Key = tuple[int, int]


class PeerService(peer_pb2_grpc.PeerServicer):
    """Worker sidecars' streams and heartbeats, judged into events for the coordinator's loop."""

    def __init__(self, coord: Coordinator) -> None:
        self.c = coord
        self._registrations = itertools.count(1)
        self._displaced: dict[Key, dict[str, tuple[int, str]]] = {}
        """Per host, incarnations a newer live sidecar took the host over from: (first seen, who).
        Refused while the newer one is live; one back after it went is flapping."""
        self._judging: dict[Key, Link] = {}
        """Per host, a registration whose end is being judged (its host checked) right now."""
        self._probing: set[int] = set()
        """Registrations whose away host is being watched (:meth:`watch_away`)."""

    async def Join(
        self, request_iterator: AsyncIterator[peer_pb2.WorkerMessage], context: grpc.aio.ServicerContext
    ) -> None:  # noqa: N802
        try:
            reg = await self._register_message(context)
            await self._admit(reg)
        except Refused as r:
            await context.abort(r.code, r.message)
            return
        ident = reg.identity
        key = (ident.slice, ident.host)
        peer = context.peer()
        conn = self._new_link(reg, peer)
        refused = await self._one_voice(key, ident, conn, peer)
        if refused:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, refused)
            return
        self._registered(key, reg, conn)
        cause = "stream_closed"
        try:
            cause = await self._serve(context, ident, conn)
        finally:
            # This handler is cancelled when the peer dies: what follows runs on its own. A cause the
            # coordinator set (replaced, fenced, ...) outranks what the stream's reader saw.
            cause = conn.cause or cause
            self._unregistered(key, ident, conn, cause, peer)
        if cause == "replaced" and conn.replaced_by:
            # A newer sidecar claims this host: say so, so that this one backs off instead of taking it back.
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, conn.replaced_by)

    async def _register_message(self, context: grpc.aio.ServicerContext) -> peer_pb2.Register:
        """The stream's first message, which must be a Register naming this job and a host in it."""
        cfg = self.c.cfg
        try:
            first = await asyncio.wait_for(context.read(), timeout=cfg.heartbeat_timeout * 4)
        except TimeoutError:
            raise Refused(
                grpc.StatusCode.DEADLINE_EXCEEDED, "no Register message within the heartbeat timeout"
            ) from None
        if first is grpc.aio.EOF or not first.HasField("register"):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "the first message on Join must be a Register")
        reg = first.register
        ident = reg.identity
        p = cfg.policy
        if reg.job != cfg.job:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION, f"job {reg.job!r} is not this coordinator's job {cfg.job!r}"
            )
        if not (0 <= ident.slice < p.num_slices and 0 <= ident.host < p.hosts_per_slice):
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"identity.slice={ident.slice} identity.host={ident.host} outside the job's "
                f"{p.num_slices} slices x {p.hosts_per_slice} hosts",
            )
        if not ident.incarnation:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "identity.incarnation must not be empty")
        return reg

    async def _admit(self, reg: peer_pb2.Register) -> None:
        """Weigh the epoch the worker has seen (fencing); a fenced coordinator refuses every stream."""
        c = self.c
        ident = reg.identity
        if reg.epoch_seen > c.epoch:
            await c.epoch_claim(
                reg.epoch_seen, reg.epoch_seen_coordinator, reg.epoch_seen_proof, f"worker {ident.slice}.{ident.host}"
            )
        if c.fenced_by:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this coordinator (epoch {c.epoch}) was superseded by epoch {c.fenced_by}",
            )

    def _new_link(self, reg: peer_pb2.Register, peer: str) -> Link:
        ident = reg.identity
        conn = Link(
            incarnation=ident.incarnation,
            health_address=reg.health_address,
            health_check=reg.health_check,
            token=new_token() if self.c.datagram_port else b"",
            registration=next(self._registrations),
            who=f"pod {ident.pod or '?'} on node {ident.node or '?'} at {peer}",
        )
        conn.first_seen = conn.registration
        return conn

    def _registered(self, key: Key, reg: peer_pb2.Register, conn: Link) -> None:
        """``conn`` speaks for its host from now on: an older stream for it ends, the core hears of it."""
        c = self.c
        ident = reg.identity
        old = c.workers.get(key)
        c.workers[key] = conn
        c.gc_freezer.registered()
        if old is not None:
            old.cause = "replaced"
            old.closed.set()
        c.metrics.workers.set(len(c.workers))
        c.submit(
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

    async def _serve(self, context: grpc.aio.ServicerContext, ident: peer_pb2.HostIdentity, conn: Link) -> str:
        """Reply to the registration, then read and write the stream until it ends; returns why it ended."""
        cfg = self.c.cfg
        tasks: tuple[asyncio.Task[Any], ...] = ()
        try:
            # The reply is written inside the caller's try: a worker gone while it is written (this handler is
            # then cancelled at the write) ended its stream like any other, and is not left registered unwatched.
            await context.write(self._reply(conn))
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
                return reader.result()
            return "stream_closed"
        finally:
            for task in tasks:
                task.cancel()

    def _reply(self, conn: Link) -> peer_pb2.CoordinatorMessage:
        c = self.c
        return peer_pb2.CoordinatorMessage(
            registered=peer_pb2.Registered(
                generation=c.state.generation,
                heartbeat_interval_seconds=c.cfg.heartbeat_interval,
                epoch=c.epoch,
                heartbeat_datagram_port=c.datagram_port,
                heartbeat_datagram_token=conn.token,
                epoch_coordinator=c.coordinator_id,
                epoch_proof=c.epoch_proof,
            )
        )

    def _unregistered(self, key: Key, ident: peer_pb2.HostIdentity, conn: Link, cause: str, peer: str) -> None:
        """The stream ended: forget it, and judge its end unless the coordinator ended it on purpose."""
        c = self.c
        c.datagrams.forget(conn)
        if c.workers.get(key) is conn:
            del c.workers[key]
        c.gc_freezer.ended()
        c.metrics.workers.set(len(c.workers))
        if cause not in ("replaced", "fenced"):
            self._judging[key] = conn
            asyncio.get_running_loop().create_task(self._ended(ident, conn, cause, peer))

    async def _one_voice(self, key: Key, ident: peer_pb2.HostIdentity, conn: Link, peer: str) -> str:
        """Of two sidecar processes claiming one host, the one first seen later speaks for it.

        Returns why ``conn`` is refused (an older claimant while the newer is live), or "" to go on.
        A newer claimant takes over from a live older one without a loss of the host: the core is
        told only of the new registration (decide: a second sidecar is no loss). Only when the older
        one had gone silent is its host checked first, as when a stream ends: a replacement pod that
        registers before its predecessor's silence was judged is then still a lost host.
        """
        cur = self.c.workers.get(key)
        displaced = self._displaced.get(key, {})
        mine = displaced.get(ident.incarnation)
        if mine is not None:
            conn.first_seen = mine[0]
        if cur is not None and cur.incarnation != ident.incarnation and not cur.closed.is_set():
            if conn.first_seen < cur.first_seen:
                return self._refuse_older(key, ident, conn, cur)
            await self._take_over(key, ident, conn, cur, displaced, peer)
            return ""
        if mine is not None:
            self._returned(key, ident, conn, displaced)
        judging = self._judging.get(key)
        if judging is not None and judging.incarnation != ident.incarnation:
            # The previous registration's end is being judged (its host checked): let that verdict reach the
            # core first, or it would be about a replaced registration and dropped.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(judging.judged.wait(), PROBE_BOUND_SECONDS + 3 * PROBE_TIMEOUT_SECONDS)
        return ""

    def _refuse_older(self, key: Key, ident: peer_pb2.HostIdentity, conn: Link, cur: Link) -> str:
        self.c.metrics.duplicate_hosts.labels("refused").inc()
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

    async def _take_over(
        self,
        key: Key,
        ident: peer_pb2.HostIdentity,
        conn: Link,
        cur: Link,
        displaced: dict[str, tuple[int, str]],
        peer: str,
    ) -> None:
        """A newer sidecar takes the host over from a live older one (checked first if it had gone silent)."""
        c = self.c
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
        self._displaced[key] = dict(sorted(kept.items(), key=lambda kv: kv[1][0])[-DISPLACED_KEPT:])
        silent = time.monotonic() - max(cur.last_seen, c.loop_resumed_at)
        if silent > 2 * c.cfg.heartbeat_interval and (cur.health_check or "grpc") == "grpc":
            ok, detail = await self.probe_host(key, cur, peer)
            if not ok:
                log.warning("host check failed", slice=key[0], host=key[1], cause="replaced", detail=detail)
                c.submit(WorkerLost(key[0], key[1], cur.incarnation, "replaced_host_down", silent, cur.registration))

    def _returned(
        self, key: Key, ident: peer_pb2.HostIdentity, conn: Link, displaced: dict[str, tuple[int, str]]
    ) -> None:
        """Back once the newer one went (its stream ended): the same two processes take turns."""
        del displaced[ident.incarnation]
        if not displaced:
            del self._displaced[key]
        self.c.metrics.duplicate_hosts.labels("returned").inc()
        log.warning(
            "two sidecars claim one host and are flapping: an older one is back after the newer one's stream ended",
            slice=key[0],
            host=key[1],
            returned=f"{ident.incarnation} ({conn.who})",
            others="; ".join(f"{inc} ({who})" for inc, (_, who) in displaced.items()) or "?",
        )

    async def _ended(self, ident: peer_pb2.HostIdentity, conn: Link, cause: str, peer: str) -> None:
        """A worker's stream ended: a lost host, or only its sidecar (the host still answers)."""
        c = self.c
        key = (ident.slice, ident.host)
        # Silence counts only from the end of this coordinator's newest stall (or kernel drop of
        # heartbeat datagrams), as in check_liveness: while it fell behind, it heard nobody.
        silent = time.monotonic() - max(conn.last_seen, c.loop_resumed_at)
        if cause in ("stream_closed", "shutdown") and silent > 2 * c.cfg.heartbeat_interval:
            # Already silent when the stream broke: the transport keepalive noticed a hung host first.
            cause = "heartbeat_timeout"
        # Before calling the host lost, look at its Pathways worker ourselves: a
        # sidecar that restarts, is paused or is cut off (or a stream that blips) on
        # a healthy host is no loss. A silent worker too, but only with a check the
        # Pathways worker's process must answer (gRPC health): a hung host's kernel
        # still accepts TCP connections for its stopped processes, so a TCP connect
        # could mask the hang. Every result names this registration: if the worker
        # registered again meanwhile, the core drops it (see HostRecord.registration).
        hung = cause == "heartbeat_timeout"
        blind = hung and (conn.health_check or "grpc") != "grpc"
        try:
            ok, detail = (False, "") if blind else await self.probe_host(key, conn, peer, silent=hung)
            if ok:
                away = WorkerAway(ident.slice, ident.host, ident.incarnation, f"{cause}; {detail}", conn.registration)
                c.submit(away)
            else:
                silent = time.monotonic() - (conn.replied_at if conn.last_seen == conn.credited else conn.last_seen)
                if detail:
                    log.warning("host check failed", slice=ident.slice, host=ident.host, cause=cause, detail=detail)
                lost = WorkerLost(ident.slice, ident.host, ident.incarnation, cause, silent, conn.registration)
                c.submit(lost)
        finally:
            conn.judged.set()
            if self._judging.get(key) is conn:
                del self._judging[key]
        if ok:
            await self.watch_away(key, conn, peer)

    async def _read(self, context: grpc.aio.ServicerContext, ident: peer_pb2.HostIdentity, conn: Link) -> str:
        # No read deadline here: lateness is judged by check_liveness
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
            if msg.HasField("report"):
                self._report(ident, conn, msg.report)
            elif msg.HasField("metrics_window"):
                self.c.stragglers.add_window(ident.slice, ident.host, msg.metrics_window)

    def _report(self, ident: peer_pb2.HostIdentity, conn: Link, report: peer_pb2.LocalReport) -> None:
        kind = report.kind
        if kind in ("pathways_unhealthy", "pathways_healthy"):
            self.c.submit(
                WorkerHealth(
                    ident.slice,
                    ident.host,
                    ident.incarnation,
                    kind == "pathways_healthy",
                    report.detail,
                    conn.registration,
                )
            )
        elif kind == "metadata_notice":
            self.c.submit(_metadata_notice(ident, report))
        else:
            log.warning("unknown worker report kind ignored", kind=kind, slice=ident.slice, host=ident.host)

    async def _write(self, context: grpc.aio.ServicerContext, conn: Link) -> None:
        while True:
            msg = await conn.outbox.get()
            await context.write(msg)

    # -- liveness --------------------------------------------------------------

    def datagram_heartbeat(self, dg: peer_pb2.HeartbeatDatagram, now: float, reply: Reply) -> Link | None:
        """A heartbeat datagram (agent.sources.heartbeat_datagrams) not matched by its bytes: whose is it?

        The registration it names is alive, and its commands can go back to ``reply``.
        """
        conn = self.c.workers.get((dg.slice, dg.host))
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

    def check_liveness(self, now: float) -> None:
        """End the streams of workers silent past the heartbeat timeout.

        Lateness counts from the later of the worker's last message and the end
        of the newest event-loop stall: messages that arrived while the loop was
        blocked are read only after it, so the stall itself proves nothing.
        """
        # Late: now - max(last_seen, since) > timeout, i.e. both before the deadline.
        deadline = now - self.c.cfg.heartbeat_timeout
        if self.c.loop_resumed_at >= deadline:
            return  # the loop resumed from a stall within the timeout: nobody can be late yet
        for conn in self.c.workers.values():
            if conn.last_seen < deadline and not conn.closed.is_set():
                conn.cause = "heartbeat_timeout"
                conn.closed.set()

    async def probe_host(self, key: Key, conn: Link, peer: str, *, silent: bool = False) -> tuple[bool, str]:
        """Check a host's Pathways worker from here (its sidecar's stream closed, is away, or was replaced).

        Down at once when refused or answered not serving; a check with no answer is repeated, and
        the host is down only after :data:`PROBE_ATTEMPTS` in a row (:data:`PROBE_BOUND_SECONDS`):
        one slow answer from a busy node must not cost a hold, a shrink and a retry. ``silent``: the
        host's sidecar already said nothing for the heartbeat timeout, so one unanswered check
        confirms a hung host (a second silence, not one slow moment) and its loss is not delayed.
        """
        address = _probe_address(conn.health_address, peer)
        if not address:
            return False, "no health address registered"
        kind = conn.health_check or "grpc"
        attempts = 1 if silent else PROBE_ATTEMPTS
        return await probe(kind, address, PROBE_TIMEOUT_SECONDS, attempts, PROBE_PAUSE_SECONDS)

    async def watch_away(self, key: Key, conn: Link, peer: str) -> None:
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
        try:
            await self._watch_away(key, conn, peer)
        finally:
            self._probing.discard(conn.registration)

    async def _watch_away(self, key: Key, conn: Link, peer: str) -> None:
        c = self.c
        until = time.monotonic() + c.state.policy.rejoin_grace_seconds
        reg = conn.registration
        answered = time.monotonic()
        while True:
            await asyncio.sleep(AWAY_PROBE_SECONDS)
            rec = c.state.hosts.get(key)
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
                gone = c.state.policy.rejoin_grace_seconds
                c.submit(WorkerLost(key[0], key[1], conn.incarnation, "sidecar_gone", gone, registration=reg))
                log.warning(
                    "sidecar did not come back within the rejoin grace; its host counts as lost",
                    slice=key[0],
                    host=key[1],
                    grace_seconds=gone,
                )
                return
            ok, detail = await self.probe_host(key, conn, peer)
            if ok:
                answered = time.monotonic()
            else:
                silent = time.monotonic() - answered
                c.submit(
                    WorkerLost(key[0], key[1], conn.incarnation, "sidecar_gone_host_down", silent, registration=reg)
                )
                log.warning("host of an away sidecar stopped answering", slice=key[0], host=key[1], detail=detail)
                return


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
