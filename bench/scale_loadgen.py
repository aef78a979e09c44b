"""Load generator for the scale benchmark: many fake worker sidecars in one process.

Each fake worker is what :mod:`agent.worker` is on the wire: its own gRPC
channel (with the worker's keepalive options, and a private subchannel pool so
that every worker has its own TCP connection, as separate hosts would), one
``Peer.Join`` stream, a ``Register`` with what the worker's carries (its local
health, the coordinator epoch and generation it last saw), then a heartbeat every
``heartbeat_interval_seconds`` the coordinator asks for (phases spread at
random). Like the worker it reports a change of its local health on the stream
(``LocalReport``, ``pathways_unhealthy`` / ``pathways_healthy``; the ``report``
command below), and when its stream breaks without being told to (a coordinator
restart) it registers again with the worker's backoff (0.05 s, doubling to 1 s),
keeping its incarnation. Like the worker, it sends each heartbeat as a UDP datagram when the
coordinator offers a datagram port, and on its stream too until the coordinator
says it received one (``DatagramsReceived``); ``--no-datagrams`` keeps every
heartbeat on the stream. The process sends all its workers' datagrams from one
socket, spread over the interval (phases by worker index), by a clock that runs as a
small process of its own (:mod:`bench.heartbeat_clock`: as a thread it shared this
process's GIL and fell 1.2-1.5 s behind when thousands of channels opened at once). It
records the arrival time (``time.time()``) of every ``PeerCommand``, and by which
way it came: on the stream, or as the coordinator's ``CommandDatagram`` to the
socket the heartbeats leave from (checked with the worker's token and
acknowledged at once, as the worker does). A datagram's record also holds the
kernel's receive time (``SO_TIMESTAMP``): when it reached this stand-in host.

Controlled over stdin/stdout with one JSON object per line::

    <- {"event": "registered", "ok": N, "failed": M, "t0": ..., "t1": ...}
    -> {"cmd": "datagrams"}                         <- {"event": "datagrams", "confirmed": N, "connected": M,
                                                        "clock_late_max_s": L, "gate_probes": P}
       (L: how late its heartbeat datagram clock has run at worst, in seconds; P: CoordinatorGate's probes)
    -> {"cmd": "disconnect", "index": I}            <- {"event": "disconnected", "index": I, "t": ..., "t_done": ...}
       (t: when it began; t_done: when the channel was closed)
    -> {"cmd": "reconnect", "index": I}             <- {"event": "reconnected", "index": I, "t": ...}
       (as a replaced host: a new incarnation)
    -> {"cmd": "report", "index": I, "healthy": B}  <- {"event": "reported", "index": I, "t": ...}
       (a change of the stand-in host's local Pathways health, as the worker reports it)
    -> {"cmd": "wait", "kind": "hold", "generation": G, "timeout": S}
                                                    <- {"event": "waited", "have": H, "expected": E,
                                                        "stream_have": SH, "command_datagrams_refused": R}
       (H: workers that heard it by either copy; SH: stream copies so far)
    -> {"cmd": "dump", "path": P}                   <- {"event": "dumped", "path": P}
    -> {"cmd": "quit"}

    python -m bench.scale_loadgen --coordinator 127.0.0.1:PORT --first 0 --count 2500 --hosts-per-slice 100
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import socket
import struct
import sys
import threading
import time
from collections import Counter
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from agent import constants as C
from agent.sources.heartbeat_datagrams import (
    MAX_COMMAND_DATAGRAM,
    heartbeat_datagram,
    open_command_datagram,
    target_host,
)
from bench.common import raise_nofile
from bench.heartbeat_clock import HeartbeatClock
from protos.elastic_sidecar.v1 import peer_pb2, peer_pb2_grpc

SO_TIMESTAMP = SCM_TIMESTAMP = 29
"""Linux (socket(7)): the kernel's receive time of each datagram as a ``struct timeval`` in the
ancillary data. One process stands in for thousands of hosts, so when it gets to a datagram says
more about its own backlog than about the coordinator's fan-out; the receive time is when the
datagram reached the (stand-in) host. Python's socket module does not name the constant."""

COMMANDS_PER_WAKE = 64
"""Command datagrams read per wake-up of the loop (see LoadGen._read_commands)."""
LAG_PROBE = 0.05
"""How often (s) a generator checks that its event loop keeps time (LoadGen._watch_lag)."""
STALL_REPORT_SECONDS = 0.8
"""A loop silent this long gets its main thread's stack, state and kernel wait channel written to the log
once (LoadGen._stall_watchdog): two 10,000-worker restart runs lost hosts to a generator whose loop
stopped 1.55 and 1.75 s with almost no CPU used, and nothing said where it waited."""
LAG_OK = 0.1
"""How late (s) a generator's timer may fire while its stand-in hosts still start registrations."""
LAG_CALM = 0.5
"""How long (s) a generator's timers must have fired on time before its stand-in hosts start registrations again."""
CHANNEL_OPTIONS = [*C.PEER_KEEPALIVE_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]


SHORT_SESSION_SECONDS = 10.0
"""A session the coordinator ends this soon after its reply prints its timeline (FakeWorker._short_session)."""


def channel_options(keepalive_ms: int | None) -> list[tuple[str, int]]:
    """The worker's channel options; ``keepalive_ms`` overrides its keepalive interval (what-if runs)."""
    if not keepalive_ms:
        return list(CHANNEL_OPTIONS)
    return [(k, keepalive_ms if k == "grpc.keepalive_time_ms" else v) for k, v in CHANNEL_OPTIONS]


CONNECTION_ARG = "es.loadgen.connection"
"""A channel argument of the load generator's own: channels that carry the same value (and the same
other arguments) share one connection (see :func:`shared_channel_options`)."""


def shared_channel_options(index: int, streams_per_connection: int, keepalive_ms: int | None) -> list[tuple[str, int]]:
    """Channel options that put host ``index``'s stream on one TCP connection with the streams of the
    ``streams_per_connection - 1`` hosts beside it, for a machine whose open-file limit cannot hold a
    socket for each host at the coordinator (``bench.scale.too_few_open_files``).

    gRPC core keeps its subchannels (one connection each) in a process-wide pool unless a channel sets
    ``grpc.use_local_subchannel_pool`` (gRPC's include/grpc/impl/channel_arg_names.h: "the channel uses
    a local subchannel pool within the channel. Otherwise, uses the global subchannel pool"; the pool's
    key is the address and the channel arguments, src/core/client_channel/subchannel_pool_interface.h),
    so channels created with equal arguments share one connection and their calls are HTTP/2 streams on
    it (tests/bench/test_scale_loadgen.py counts the connections). Each group names itself in
    :data:`CONNECTION_ARG`.

    Each host still keeps its own Join stream, registration, heartbeat datagrams and state at the
    coordinator; what a group shares is the socket, the TCP and HTTP/2 framing of its writes, and the
    connection's keepalive pings. So the coordinator receives as many pings as from one connection a
    host, each connection pings ``streams_per_connection`` times as often as a worker does. The
    coordinator's own pings (``PEER_SERVER_KEEPALIVE_TIME_MS``, one per connection every 30 s) are
    not made up for."""
    if streams_per_connection <= 1:
        return channel_options(keepalive_ms)
    every = (keepalive_ms or C.PEER_KEEPALIVE_TIME_MS) // streams_per_connection
    opts = [(k, v) for k, v in channel_options(every) if k != "grpc.use_local_subchannel_pool"]
    return [*opts, (CONNECTION_ARG, index // streams_per_connection)]


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class FakeWorker:
    def __init__(self, gen: LoadGen, index: int) -> None:
        self.gen = gen
        self.index = index
        self.slice, self.host = divmod(index, gen.hosts_per_slice)
        self.incarnation = f"loadgen-{os.getpid()}-{index}"
        self.received: list[tuple[str, int, float, str, float | None]] = []
        self.heard: set[tuple[str, int]] = set()
        self.token = b""
        self.registered = asyncio.Event()
        self.connected = False
        self.task: asyncio.Task[None] | None = None
        self.channel: grpc.aio.Channel | None = None
        self.datagrams_confirmed = False
        self.call: grpc.aio.StreamStreamCall | None = None
        self.healthy = True
        self.epoch_seen = 0
        self.generation_seen = 0
        self.sessions = 0
        """Registrations so far (more than one: it re-registered after its stream broke)."""
        self.timeline: dict[str, Any] = {}
        """The current session's times (epoch s): started, reply, datagrams_from, stream_heartbeats,
        confirmed. Printed when the coordinator ends a session soon after its reply (see :meth:`_session`),
        to tell a reply that came late from heartbeats that went unheard."""

    def start(self) -> None:
        self.registered.clear()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        """Sessions until cancelled (a deliberate disconnect): a stream that breaks by itself (the
        coordinator went away) is followed by a new registration, with agent.worker's backoff. A
        retry finds the coordinator's port closed through the process's :class:`CoordinatorGate`
        without opening a channel for it (see there)."""
        delay = 0.05
        first = True
        tally = self.gen.tally
        while True:
            await self.gen.caught_up.wait()
            if first or await self.gen.gate.reachable():
                try:
                    await self._session()
                    delay = 0.05
                except grpc.aio.AioRpcError as e:
                    tally[f"session_failed:{e.code().name}"] += 1
                    self._short_session(f"failed:{e.code().name}")
                except Exception as e:  # noqa: BLE001
                    # Whatever ends a session, the host tries again, as agent.worker does (a heartbeat
                    # written on a stream the coordinator just ended raises asyncio.InvalidStateError).
                    # Uncaught, it ended this task silently: three hosts of one 10,000-worker restart
                    # run never re-registered and held the job on 99 slices.
                    tally[f"session_failed:{type(e).__name__}"] += 1
                    # E.g. its first stream heartbeat, written after a reply that came so late that the
                    # coordinator had already ended the stream.
                    self._short_session(f"failed:{type(e).__name__}")
            else:
                tally["gate_closed"] += 1
            first = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def report(self, healthy: bool) -> None:
        """A change of local health, on the stream, as agent.worker reports it."""
        self.healthy = healthy
        if self.call is not None and self.connected:
            kind = "pathways_healthy" if healthy else "pathways_unhealthy"
            await self.call.write(peer_pb2.WorkerMessage(report=peer_pb2.LocalReport(kind=kind)))

    async def _session(self) -> None:
        g = self.gen
        # At most ``--concurrency`` of this process's stand-in hosts set up a connection at once, after a
        # coordinator restart as at the first registration. Its one core serves 2,500 hosts: unbounded,
        # all 2,500 handshakes advanced in turn and none finished for about 30 s (one 10,000-worker
        # diagnostic run), past the coordinator's rejoin grace, a convoy no set of real hosts, each with
        # its own CPU, would form.
        async with g.joining:
            # Checked again here: the hosts that passed the check in _run together, the moment the
            # process caught up, queue for this semaphore, and would otherwise all start behind it.
            await g.caught_up.wait()
            g.tally["session_started"] += 1
            self.timeline = {"started": time.time(), "stream_heartbeats": []}
            self.channel = grpc.aio.insecure_channel(g.coordinator, options=g.options_for(self.index))
            try:
                call = peer_pb2_grpc.PeerStub(self.channel).Join()
                ident = peer_pb2.HostIdentity(
                    slice=self.slice, host=self.host, node=f"loadgen-{self.index}", incarnation=self.incarnation
                )
                register = peer_pb2.Register(
                    identity=ident,
                    job=g.job,
                    epoch_seen=self.epoch_seen,
                    generation_seen=self.generation_seen,
                    local_healthy=self.healthy,
                )
                await call.write(peer_pb2.WorkerMessage(register=register))
                first = await call.read()
                self.timeline["reply"] = time.time()
                if first is grpc.aio.EOF or not first.HasField("registered"):
                    raise ConnectionError("no Registered")
                if first.registered.epoch < self.epoch_seen:
                    raise ConnectionError("an older coordinator than one already followed")  # as agent.worker
            except BaseException:
                await self.channel.close()
                raise
        g.tally["registered"] += 1
        reader: asyncio.Task[None] | None = None
        try:
            self.epoch_seen = max(self.epoch_seen, first.registered.epoch)
            self.generation_seen = max(self.generation_seen, first.registered.generation)
            self.call = call
            self.sessions += 1
            interval = first.registered.heartbeat_interval_seconds or 1.0
            port, token = first.registered.heartbeat_datagram_port, first.registered.heartbeat_datagram_token
            use_datagrams = g.datagrams and bool(port and token)
            self.token = token
            self.datagrams_confirmed = False
            self.connected = True
            self.registered.set()
            # One process holds 2,500 stand-in hosts: a full collection of its heap (0.3-1.0 s here at
            # 10,000 workers, finding nothing to free) held the GIL and stopped the datagram clock, so
            # all its workers fell silent at once, which no real host does. What a registration
            # leaves behind lives as long as the worker: moved out of the collector's sight.
            gc.freeze()
            reader = asyncio.create_task(self._read(call))
            if use_datagrams:
                # From here on the process's one datagram clock sends this worker's heartbeats:
                # the same bytes every time, as agent.sources.heartbeat_datagrams.DatagramSender sends.
                g.heartbeat_by_datagram(self, port, heartbeat_datagram(token, self.slice, self.host), interval)
                self.timeline["datagrams_from"] = time.time()
            await asyncio.sleep(random.uniform(0, interval))
            seq = 0
            while not reader.done() and not (use_datagrams and self.datagrams_confirmed):
                seq += 1
                await call.write(
                    peer_pb2.WorkerMessage(heartbeat=peer_pb2.Heartbeat(seq=seq, local_healthy=self.healthy))
                )
                if seq <= 8:
                    self.timeline["stream_heartbeats"].append(time.time())
                await asyncio.sleep(interval)
            await asyncio.wait({reader})
            if not reader.cancelled():
                # The stream's end (the coordinator gone) is this session's end, as in agent.worker: read
                # here, so that 10,000 broken streams do not each print "Task exception was never
                # retrieved" with its traceback (seconds of a generator's core, at the restart).
                e = reader.exception()
                why = "EOF" if e is None else e.code().name if isinstance(e, grpc.aio.AioRpcError) else type(e).__name__
                g.tally[f"stream_ended:{why}"] += 1
                self._short_session(why)
        finally:
            if reader is not None and not reader.done():
                reader.cancel()
            elif reader is not None and not reader.cancelled():
                reader.exception()  # a write failed first: its end is read here, not printed as unretrieved
            self.connected = False
            self.call = None
            self.gen.stop_datagrams(self)
            await self.channel.close()

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                return
            if msg.HasField("datagrams_received"):
                self.datagrams_confirmed = True
                self.timeline.setdefault("confirmed", time.time())
                continue
            if msg.HasField("command"):
                self.command(msg.command, "stream")

    def _short_session(self, why: str) -> None:
        """A session the coordinator ended within SHORT_SESSION_SECONDS of its reply: its timeline on stderr
        (the run's generators.log), so that a host judged lost soon after it registered shows whether its
        reply came late or its heartbeats went out on time (bench.scale reads it back: lost_host_timelines)."""
        ended = time.time()
        reply = self.timeline.get("reply")
        timeline, self.timeline = self.timeline, {}  # printed at most once
        if reply is None or ended - reply > SHORT_SESSION_SECONDS:
            return
        line = {"t": round(ended, 3), "first": self.gen.workers[0].index, "short_session": self.index}
        line |= {"slice": self.slice, "host": self.host, "why": why, "ended": round(ended, 4)}
        line |= {k: round(v, 4) for k, v in timeline.items() if isinstance(v, float)}
        line["stream_heartbeats"] = [round(t, 4) for t in timeline.get("stream_heartbeats", [])]
        print(json.dumps(line), file=sys.stderr, flush=True)

    def command(self, cmd: peer_pb2.PeerCommand, via: str, arrived: float | None = None) -> None:
        """A PeerCommand's arrival (the stream's copy or the datagram's); ``counts`` holds first copies only.

        Recorded: kind, generation, when this process got to it, the way it came, and for a datagram
        the kernel's receive time (``arrived``; None where the kernel gives none).
        """
        key = (cmd.kind, int(cmd.generation))
        self.generation_seen = max(self.generation_seen, int(cmd.generation))
        self.received.append((cmd.kind, int(cmd.generation), time.time(), via, arrived))
        if key not in self.heard:
            self.heard.add(key)
            self.gen.counts[key] += 1
        if via == "stream":
            self.gen.stream_counts[key] += 1

    async def disconnect(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        self.connected = False


class CoordinatorGate:
    """Whether the coordinator's port accepts connections, as of a probe at most ``FRESH`` s old.

    A worker whose stream broke (the coordinator was killed) tries again with backoff until the
    restarted coordinator answers; each try opens a gRPC channel, and a refused one costs a real host
    next to nothing. Here one process stands in for 2,500 hosts on a quarter of a core: during a
    few seconds of downtime their tries (0.6-0.8 ms of this process's CPU each, measured over 50
    and 400 refused tries; 2,500 a second per generator at the 1 s backoff cap, four generators on
    one core) queued up tens of seconds of work, and the first re-registration reached
    the restarted coordinator 14.6 s after it was serving, past its rejoin grace: a delay of the
    stand-in's own making. So a retry first asks this gate, whose one TCP connect (to the same port,
    closed at once) answers for every worker of the process within ``FRESH`` s; a worker whose
    coordinator is down counts the try as failed and backs off as before. Only retries ask (never
    a first registration), and a probe runs only while some worker is retrying.

    Not enough on its own: with this gate and the clock process, a large restart run still saw the
    first re-registration long after the restarted coordinator's first log line, and re-registered
    hosts lost within seconds. The causes were the
    generators' own: every retry of a process set up its connection at once (see FakeWorker._session)
    and hosts re-registered while their process was still behind (see LoadGen._watch_lag).
    """

    FRESH = 0.05

    def __init__(self, address: str) -> None:
        self.host = target_host(address)
        self.port = int(address.rsplit(":", 1)[1])
        self._probe: asyncio.Future[bool] | None = None
        self._probed_at = 0.0
        self.probes = 0

    async def reachable(self) -> bool:
        stale = time.monotonic() - self._probed_at >= self.FRESH
        if self._probe is None or (self._probe.done() and stale):
            self._probed_at = time.monotonic()
            self._probe = asyncio.ensure_future(self._connect())
        return await asyncio.shield(self._probe)

    async def _connect(self) -> bool:
        self.probes += 1
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 1.0)
        except (OSError, TimeoutError):
            return False
        writer.close()
        return True


class LoadGen:
    def __init__(self, ns: argparse.Namespace) -> None:
        self.coordinator = ns.coordinator
        self.gate = CoordinatorGate(ns.coordinator)
        self.job = ns.job
        self.hosts_per_slice = ns.hosts_per_slice
        self.concurrency = ns.concurrency
        self.rate = ns.rate
        self.keepalive_ms = ns.keepalive_ms
        self.streams_per_connection = ns.streams_per_connection
        self.datagrams = not ns.no_datagrams
        self.datagram_host = target_host(ns.coordinator)
        self.sock: socket.socket | None = None
        self.clock: HeartbeatClock | None = None
        self.port = 0
        self.workers = [FakeWorker(self, i) for i in range(ns.first, ns.first + ns.count)]
        self.by_index = {w.index: w for w in self.workers}
        self.counts: Counter[tuple[str, int]] = Counter()
        self.stream_counts: Counter[tuple[str, int]] = Counter()
        self.command_datagrams_refused = 0
        self.commands: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.joining = asyncio.Semaphore(ns.concurrency)
        """Connections being set up at once (see FakeWorker._session)."""
        self.tally: Counter[str] = Counter()
        """What this process's stand-in hosts did, by kind; :meth:`_progress` logs it."""
        self.caught_up = asyncio.Event()
        """Set while this process's event loop runs its work within :data:`LAG_OK` (see :meth:`_watch_lag`)."""
        self.caught_up.set()
        self.lag_max = 0.0
        self.loop_beat = time.monotonic()
        """When this process's event loop last ran its lag probe (see :meth:`_stall_watchdog`)."""

    def options_for(self, index: int) -> list[tuple[str, int]]:
        """Host ``index``'s channel options: a connection of its own, or one shared with its group."""
        return shared_channel_options(index, self.streams_per_connection, self.keepalive_ms)

    def heartbeat_by_datagram(self, w: FakeWorker, port: int, data: bytes, interval: float) -> None:
        """Send ``w``'s heartbeat datagrams every ``interval`` from now on: the process's clock
        (:class:`HeartbeatClock`, a process of its own) sends them from this process's one socket."""
        self.port = port
        if self.clock is None:
            self._open_datagram_socket()
            assert self.sock is not None
            self.clock = HeartbeatClock(self.sock, self.datagram_host, self.workers[0].index)
        self.clock.add(w.index, port, interval, data)

    def stop_datagrams(self, w: FakeWorker) -> None:
        if self.clock is not None:
            self.clock.remove(w.index)

    @property
    def clock_late_max(self) -> float:
        """The datagram clock's worst lateness (s): how long this process left its workers silent."""
        return self.clock.late_max if self.clock is not None else 0.0

    def _open_datagram_socket(self) -> None:
        family = socket.AF_INET6 if ":" in self.datagram_host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        # The coordinator sends each worker's command datagrams back to where its heartbeats come from:
        # here, this one socket for all of them, so each is told apart by the slice and host it names.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
        except OSError:
            pass  # no kernel receive times here: the records keep the processing time alone
        asyncio.get_running_loop().add_reader(self.sock.fileno(), self._read_commands)

    def _read_commands(self) -> None:
        """Reads up to COMMANDS_PER_WAKE datagrams, then lets the loop run: a fan-out brings 2,500 at
        once, and read in one go they held back this process's other stand-in hosts, such as one
        whose registration reply had just come (its first heartbeat waits for that reply). The
        selector calls again while datagrams wait."""
        assert self.sock is not None
        for _ in range(COMMANDS_PER_WAKE):
            try:
                data, anc, _, _ = self.sock.recvmsg(MAX_COMMAND_DATAGRAM, socket.CMSG_SPACE(16))
            except OSError:
                return
            arrived = None
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMP and len(cdata) >= 16:
                    sec, usec = struct.unpack("qq", cdata[:16])
                    arrived = sec + usec / 1e6
            try:
                body = peer_pb2.CommandDatagramBody.FromString(peer_pb2.CommandDatagram.FromString(data).body)
            except DecodeError:
                self.command_datagrams_refused += 1
                continue
            w = self.by_index.get(body.slice * self.hosts_per_slice + body.host)
            cmd = None if w is None else open_command_datagram(w.token, body.slice, body.host, data)
            if w is None or cmd is None or not w.connected:
                self.command_datagrams_refused += 1
                continue
            # Acknowledged at once, as agent.sources.heartbeat_datagrams.DatagramSender does.
            try:
                self.sock.sendto(heartbeat_datagram(w.token, w.slice, w.host, cmd), (self.datagram_host, self.port))
            except OSError:
                pass  # unacknowledged: the coordinator sends the stream's copy
            w.command(cmd, "datagram", arrived)

    def _stdin_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        for line in sys.stdin:
            line = line.strip()
            if line:
                loop.call_soon_threadsafe(self.commands.put_nowait, json.loads(line))
        loop.call_soon_threadsafe(self.commands.put_nowait, {"cmd": "quit"})

    async def register_all(self) -> None:
        t0 = time.time()
        sem = asyncio.Semaphore(self.concurrency)

        rate = self.rate
        gap = 1.0 / rate if rate else 0.0

        async def one(w: FakeWorker) -> bool:
            if gap:
                # Registrations start at most ``rate`` a second (pods do not all start at once).
                await asyncio.sleep((w.index - self.workers[0].index) * gap)
            async with sem:
                w.start()
                waiter = asyncio.create_task(w.registered.wait())
                done, _ = await asyncio.wait({waiter, w.task}, timeout=120, return_when=asyncio.FIRST_COMPLETED)  # type: ignore[arg-type]
                waiter.cancel()
                return w.registered.is_set()

        oks = await asyncio.gather(*(one(w) for w in self.workers))
        emit({"event": "registered", "ok": sum(oks), "failed": len(oks) - sum(oks), "t0": t0, "t1": time.time()})

    async def _watch_lag(self) -> None:
        """Keeps :attr:`caught_up`: whether a timer of this loop fires within :data:`LAG_OK` of its time.

        A killed coordinator breaks all 2,500 of this process's streams at once, and the process takes
        seconds of its shared core to wind them up. A stand-in host that re-registered meanwhile read
        the coordinator's reply only after that backlog, so it started its heartbeats late and the
        coordinator rightly judged it lost (126 hosts 1.2-1.4 s after re-registering in one
        10,000-worker diagnostic run). The same at the first registration: with four generators on
        one core, each ran 0.25-0.7 s late while registering at about 50 hosts a second, and in one
        run of three, hosts timed out 22 s into the registration and took thousands with them. A
        real host, with its own CPU, answers at once. So a host starts a registration (the first or
        a retry) only while this process is caught up: the registration rate is then what the
        generators can serve, and the page reports it (``registration_seconds``)."""
        loop = asyncio.get_running_loop()
        calm_since: float | None = loop.time()
        while True:
            t = loop.time()
            await asyncio.sleep(LAG_PROBE)
            now = loop.time()
            self.loop_beat = time.monotonic()
            lag = now - t - LAG_PROBE
            self.lag_max = max(self.lag_max, lag)
            if lag > LAG_OK:
                calm_since = None
                self.caught_up.clear()
            else:
                # One timer on time between two batches of a backlog is not the end of it (it let
                # some hosts through too early in a 10,000-worker run): on time for LAG_CALM seconds.
                calm_since = now if calm_since is None else calm_since
                if now - calm_since >= LAG_CALM:
                    self.caught_up.set()

    def _stall_watchdog(self, main_id: int, main_tid: int) -> None:
        """A thread: when the loop has not run its lag probe for :data:`STALL_REPORT_SECONDS`, writes once per
        stall where the main thread is (its Python stack, and from /proc its state and kernel wait channel:
        waiting in a system call or for the CPU) and the process's CPU seconds, as a JSON line."""
        import traceback

        reported = 0.0
        while True:
            time.sleep(0.1)
            beat = self.loop_beat
            silent = time.monotonic() - beat
            if silent < STALL_REPORT_SECONDS or beat == reported:
                continue
            reported = beat
            frame = sys._current_frames().get(main_id)
            proc = {}
            for name in ("wchan", "stat"):
                try:
                    with open(f"/proc/self/task/{main_tid}/{name}") as f:
                        proc[name] = f.read().strip()
                except OSError as e:
                    proc[name] = f"unreadable: {e}"
            line = {
                "t": round(time.time(), 3),
                "first": self.workers[0].index,
                "stalled_s": round(silent, 3),
                "cpu": round(time.process_time(), 2),
                "main_thread_wchan": proc["wchan"],
                # /proc/PID/task/TID/stat, field 3: R running or runnable, S sleeping (a wait), D disk wait.
                "main_thread_state": proc["stat"].rsplit(")", 1)[-1].split()[0] if ")" in proc["stat"] else "?",
                "stack": traceback.format_stack(frame)[-6:] if frame is not None else [],
            }
            print(json.dumps(line), file=sys.stderr, flush=True)

    async def _progress(self) -> None:
        """One line a second on stderr (the run's generators.log) while anything happens: what the
        stand-in hosts did since the last line, the gate's probes and this process's CPU seconds, so a
        slow restart can be told apart from a busy generator."""
        last: Counter[str] = Counter()
        while True:
            await asyncio.sleep(1.0)
            new = self.tally - last
            if not new:
                continue
            last = self.tally.copy()
            line = {"t": round(time.time(), 3), "first": self.workers[0].index, "cpu": round(time.process_time(), 2)}
            line |= {"connected": sum(1 for w in self.workers if w.connected), "gate_probes": self.gate.probes}
            line |= {"lag_max": round(self.lag_max, 3), "caught_up": self.caught_up.is_set()}
            self.lag_max = 0.0
            print(json.dumps(line | {"since_last": dict(sorted(new.items()))}), file=sys.stderr, flush=True)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._stdin_thread, args=(loop,), daemon=True).start()
        threading.Thread(
            target=self._stall_watchdog, args=(threading.get_ident(), threading.get_native_id()), daemon=True
        ).start()
        progress = asyncio.create_task(self._progress())
        # Not caught up until its timers have kept time for LAG_CALM: at 25,000 workers, ten generators
        # starting together on one core let 918 hosts register before any had measured its lag, and
        # those read their replies too late to heartbeat in time.
        self.caught_up.clear()
        watch = asyncio.create_task(self._watch_lag())
        await self.register_all()
        while True:
            cmd = await self.commands.get()
            c = cmd.get("cmd")
            if c == "quit":
                break
            if c == "disconnect":
                w = self.by_index[int(cmd["index"])]
                # "t": when the disconnect began. The coordinator can see the stream end and decide before
                # this busy process gets back from closing the channel ("t_done").
                t = time.time()
                await w.disconnect()
                emit({"event": "disconnected", "index": w.index, "t": t, "t_done": time.time()})
            elif c == "reconnect":
                w = self.by_index[int(cmd["index"])]
                # A replaced host: a new incarnation. The coordinator keeps a slice down when the same
                # process comes back after it was declared lost (not a repair), so the hold would never end.
                w.incarnation = f"loadgen-{os.getpid()}-{w.index}-r{time.monotonic_ns()}"
                w.start()
                await asyncio.wait_for(w.registered.wait(), 60)
                emit({"event": "reconnected", "index": w.index, "t": time.time()})
            elif c == "report":
                w = self.by_index[int(cmd["index"])]
                await w.report(bool(cmd["healthy"]))
                emit({"event": "reported", "index": w.index, "t": time.time()})
            elif c == "wait":
                key = (str(cmd["kind"]), int(cmd["generation"]))
                expected = sum(1 for w in self.workers if w.connected)
                deadline = time.monotonic() + float(cmd.get("timeout", 30))
                while self.counts[key] < expected and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                emit(
                    {
                        "event": "waited",
                        "have": self.counts[key],
                        "expected": expected,
                        "stream_have": self.stream_counts[key],
                        "command_datagrams_refused": self.command_datagrams_refused,
                    }
                )
            elif c == "datagrams":
                live = [w for w in self.workers if w.connected]
                emit(
                    {
                        "event": "datagrams",
                        "confirmed": sum(1 for w in live if w.datagrams_confirmed),
                        "connected": len(live),
                        "reregistered": sum(1 for w in self.workers if w.sessions > 1),
                        "clock_late_max_s": round(self.clock_late_max, 3),
                        "gate_probes": self.gate.probes,
                    }
                )
            elif c == "dump":
                data = {str(w.index): w.received for w in self.workers}
                with open(cmd["path"], "w", encoding="utf-8") as f:
                    json.dump(data, f)
                emit({"event": "dumped", "path": cmd["path"]})
        progress.cancel()
        watch.cancel()
        if self.clock is not None:
            self.clock.close()
        for w in self.workers:
            if w.task is not None:
                w.task.cancel()
        await asyncio.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--job", default="bench-scale")
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--hosts-per-slice", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=100, help="registrations in flight at once")
    ap.add_argument("--rate", type=float, default=0.0, help="registrations started per second at most (0: no limit)")
    ap.add_argument("--keepalive-ms", type=int, default=None, help="override the worker's keepalive (what-if)")
    ap.add_argument(
        "--no-datagrams", action="store_true", help="heartbeat on the streams even when datagrams are offered"
    )
    ap.add_argument(
        "--streams-per-connection",
        type=int,
        default=1,
        help="hosts whose streams share one TCP connection (default 1: a connection each, as real hosts); "
        "see shared_channel_options",
    )
    ns = ap.parse_args(argv)
    if ns.streams_per_connection < 1:
        ap.error(f"--streams-per-connection {ns.streams_per_connection}: expected 1 or more")
    raise_nofile()
    asyncio.run(LoadGen(ns).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
