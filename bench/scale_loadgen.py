"""Load generator of the scale benchmark: many stand-in worker sidecars in one process.

Each stand-in is :mod:`agent.worker` on the wire: a channel (the worker's keepalive, a connection of its
own), one ``Peer.Join`` stream, heartbeats by datagram once the coordinator offers a port (from a clock
process, :mod:`bench.heartbeat_clock`), re-registration with the worker's backoff, and the time each
command reached it (a datagram's from the kernel, ``SO_TIMESTAMP``). Where one process standing in for
thousands of hosts would judge them wrongly, the classes below say what makes up for it.

Driven by :mod:`bench.scale` over stdin/stdout, one JSON object a line (``{"cmd": ...}`` in, ``{"event":
...}`` out: registered, datagrams, disconnect, reconnect, wait, dump, quit).
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
"""Linux (socket(7)): the kernel's receive time of each datagram, a ``struct timeval`` in the ancillary
data; Python's socket module does not name the constant."""
COMMANDS_PER_WAKE = 64
"""Command datagrams read per wake-up of the loop: a fan-out's thousands, read in one go, would hold back
a stand-in whose registration reply had just come."""
LAG_PROBE = 0.05
LAG_OK = 0.1
LAG_CALM = 0.5
"""A stand-in starts a registration only while this loop's timers have fired within LAG_OK for LAG_CALM:
a reply read late means heartbeats sent late, and a host rightly judged lost, as a real one would not be."""
CHANNEL_OPTIONS = [*C.PEER_KEEPALIVE_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
CONNECTION_ARG = "es.loadgen.connection"
"""A channel argument of the generator's own: channels with the same value share one connection."""


def shared_channel_options(index: int, streams_per_connection: int) -> list[tuple[str, int]]:
    """Channel options that put host ``index``'s stream on one TCP connection with the streams of the
    ``streams_per_connection - 1`` hosts beside it (``bench.scale.too_few_open_files``).

    gRPC core pools subchannels (a connection each) process-wide unless a channel sets
    ``grpc.use_local_subchannel_pool``, keyed by the address and the channel arguments
    (src/core/client_channel/subchannel_pool_interface.h): equal arguments share a connection. The
    group shares its keepalive pings, so a connection pings ``streams_per_connection`` times as often."""
    if streams_per_connection <= 1:
        return list(CHANNEL_OPTIONS)
    every = C.PEER_KEEPALIVE_TIME_MS // streams_per_connection
    opts = [(k, every if k == "grpc.keepalive_time_ms" else v) for k, v in C.PEER_KEEPALIVE_OPTIONS]
    return [*opts, (CONNECTION_ARG, index // streams_per_connection)]


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class FakeWorker:
    def __init__(self, gen: LoadGen, index: int) -> None:
        self.gen, self.index = gen, index
        self.slice, self.host = divmod(index, gen.hosts_per_slice)
        self.incarnation = f"loadgen-{os.getpid()}-{index}"
        self.received: list[tuple[str, int, float, str, float | None]] = []
        self.heard: set[tuple[str, int]] = set()
        self.token = b""
        self.registered = asyncio.Event()
        self.connected = self.datagrams_confirmed = False
        self.task: asyncio.Task[None] | None = None
        self.epoch_seen = self.generation_seen = self.sessions = 0

    def start(self) -> None:
        self.registered.clear()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        """Sessions until cancelled (a deliberate disconnect): whatever ends one, the stand-in registers
        again with agent.worker's backoff, a retry only once the gate finds the port open."""
        delay, first = 0.05, True
        while True:
            await self.gen.caught_up.wait()
            if first or await self.gen.gate.reachable():
                try:
                    await self._session()
                    delay = 0.05
                except Exception:  # noqa: BLE001 - as agent.worker, any end of a session is followed by a retry
                    pass
            first = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _session(self) -> None:
        g = self.gen
        async with g.joining:
            await g.caught_up.wait()  # again: those queued at the semaphore would otherwise all start behind it
            channel = grpc.aio.insecure_channel(g.coordinator, options=g.options_for(self.index))
            try:
                call = peer_pb2_grpc.PeerStub(channel).Join()
                ident = peer_pb2.HostIdentity(
                    slice=self.slice, host=self.host, node=f"loadgen-{self.index}", incarnation=self.incarnation
                )
                register = peer_pb2.Register(
                    identity=ident,
                    job=g.job,
                    epoch_seen=self.epoch_seen,
                    generation_seen=self.generation_seen,
                    local_healthy=True,
                )
                await call.write(peer_pb2.WorkerMessage(register=register))
                first = await call.read()
                if first is grpc.aio.EOF or not first.HasField("registered"):
                    raise ConnectionError("no Registered")
                if first.registered.epoch < self.epoch_seen:
                    raise ConnectionError("an older coordinator than one already followed")  # as agent.worker
            except BaseException:
                await channel.close()
                raise
        reader: asyncio.Task[None] | None = None
        reg = first.registered
        try:
            self.epoch_seen = max(self.epoch_seen, reg.epoch)
            self.generation_seen = max(self.generation_seen, reg.generation)
            self.sessions += 1
            interval = reg.heartbeat_interval_seconds or 1.0
            use_datagrams = bool(reg.heartbeat_datagram_port and reg.heartbeat_datagram_token)
            self.token, self.datagrams_confirmed, self.connected = reg.heartbeat_datagram_token, False, True
            self.registered.set()
            # What a registration leaves lives as long as the stand-in: a full collection of the heap would
            # stop every stand-in at once.
            gc.freeze()
            reader = asyncio.create_task(self._read(call))
            if use_datagrams:
                data = heartbeat_datagram(self.token, self.slice, self.host)
                g.heartbeat_by_datagram(self, reg.heartbeat_datagram_port, data, interval)
            await asyncio.sleep(random.uniform(0, interval))
            seq = 0
            while not reader.done() and not (use_datagrams and self.datagrams_confirmed):
                seq += 1
                await call.write(peer_pb2.WorkerMessage(heartbeat=peer_pb2.Heartbeat(seq=seq, local_healthy=True)))
                await asyncio.sleep(interval)
            await asyncio.wait({reader})
        finally:
            if reader is not None and not reader.done():
                reader.cancel()
            elif reader is not None and not reader.cancelled():
                reader.exception()  # the stream's end is read here, not printed as never retrieved
            self.connected = False
            if g.clock is not None:
                g.clock.remove(self.index)
            await channel.close()

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        while (msg := await call.read()) is not grpc.aio.EOF:
            if msg.HasField("datagrams_received"):
                self.datagrams_confirmed = True
            elif msg.HasField("command"):
                self.command(msg.command, "stream")

    def command(self, cmd: peer_pb2.PeerCommand, via: str, arrived: float | None = None) -> None:
        """A command's copy: kind, generation, when this process got to it, the way it came, and for a
        datagram the kernel's receive time (``arrived``). ``counts`` holds first copies only."""
        key = (cmd.kind, int(cmd.generation))
        self.generation_seen = max(self.generation_seen, int(cmd.generation))
        self.received.append((cmd.kind, int(cmd.generation), time.time(), via, arrived))
        if key not in self.heard:
            self.heard.add(key)
            self.gen.counts[key] += 1

    async def disconnect(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        self.connected = False


class CoordinatorGate:
    """Whether the coordinator's port accepts connections, as of a probe at most ``FRESH`` s old: one TCP
    connect for every stand-in, where thousands of refused channels during a restart's downtime would
    queue up tens of seconds of one core's work (a real host's refused channel costs next to nothing)."""

    FRESH = 0.05

    def __init__(self, address: str) -> None:
        self.host, self.port = target_host(address), int(address.rsplit(":", 1)[1])
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
        self.coordinator, self.job, self.hosts_per_slice = ns.coordinator, ns.job, ns.hosts_per_slice
        self.gate = CoordinatorGate(ns.coordinator)
        self.streams_per_connection = ns.streams_per_connection
        self.datagram_host = target_host(ns.coordinator)
        self.sock: socket.socket | None = None
        self.clock: HeartbeatClock | None = None
        self.port = 0
        self.workers = [FakeWorker(self, i) for i in range(ns.first, ns.first + ns.count)]
        self.by_index = {w.index: w for w in self.workers}
        self.counts: Counter[tuple[str, int]] = Counter()
        self.commands: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        # Connections set up at once: unbounded, thousands of handshakes advance in turn and none finishes.
        self.joining = asyncio.Semaphore(ns.concurrency)
        self.caught_up = asyncio.Event()
        """Set while this process's event loop keeps time (see :meth:`_watch_lag`; set until it runs)."""
        self.caught_up.set()

    def options_for(self, index: int) -> list[tuple[str, int]]:
        return shared_channel_options(index, self.streams_per_connection)

    def heartbeat_by_datagram(self, w: FakeWorker, port: int, data: bytes, interval: float) -> None:
        """Send ``w``'s heartbeat datagrams every ``interval`` from now on, by the process's clock."""
        self.port = port
        if self.clock is None:
            family = socket.AF_INET6 if ":" in self.datagram_host else socket.AF_INET
            self.sock = socket.socket(family, socket.SOCK_DGRAM)
            self.sock.setblocking(False)
            # The coordinator sends command datagrams back to where the heartbeats come from: this socket.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
            self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
            asyncio.get_running_loop().add_reader(self.sock.fileno(), self._read_commands)
            self.clock = HeartbeatClock(self.sock, self.datagram_host, self.workers[0].index)
        self.clock.add(w.index, port, interval, data)

    def _read_commands(self) -> None:
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
                continue
            w = self.by_index.get(body.slice * self.hosts_per_slice + body.host)
            cmd = None if w is None else open_command_datagram(w.token, body.slice, body.host, data)
            if w is None or cmd is None or not w.connected:
                continue
            try:  # acknowledged at once, as agent.sources.heartbeat_datagrams.DatagramSender does
                self.sock.sendto(heartbeat_datagram(w.token, w.slice, w.host, cmd), (self.datagram_host, self.port))
            except OSError:
                pass  # unacknowledged: the coordinator sends the stream's copy
            w.command(cmd, "datagram", arrived)

    def _stdin_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        for line in sys.stdin:
            if line.strip():
                loop.call_soon_threadsafe(self.commands.put_nowait, json.loads(line))
        loop.call_soon_threadsafe(self.commands.put_nowait, {"cmd": "quit"})

    async def register_all(self) -> None:
        t0 = time.time()

        async def one(w: FakeWorker) -> bool:
            w.start()
            waiter = asyncio.create_task(w.registered.wait())
            await asyncio.wait({waiter, w.task}, timeout=120, return_when=asyncio.FIRST_COMPLETED)  # type: ignore[arg-type,type-var]
            waiter.cancel()
            return w.registered.is_set()

        oks = await asyncio.gather(*(one(w) for w in self.workers))
        emit({"event": "registered", "ok": sum(oks), "failed": len(oks) - sum(oks), "t0": t0, "t1": time.time()})

    async def _watch_lag(self) -> None:
        """Keeps :attr:`caught_up`: set once this loop's timers have fired within LAG_OK of their time for
        LAG_CALM, cleared by the first late one (one timer on time between two batches of a backlog is not
        the end of it)."""
        loop = asyncio.get_running_loop()
        calm_since: float | None = loop.time()
        while True:
            t = loop.time()
            await asyncio.sleep(LAG_PROBE)
            now = loop.time()
            if now - t - LAG_PROBE > LAG_OK:
                calm_since = None
                self.caught_up.clear()
            else:
                calm_since = now if calm_since is None else calm_since
                if now - calm_since >= LAG_CALM:
                    self.caught_up.set()

    async def run(self) -> None:
        threading.Thread(target=self._stdin_thread, args=(asyncio.get_running_loop(),), daemon=True).start()
        # Not caught up until its timers have kept time for LAG_CALM: generators starting together on one
        # core let hundreds of hosts register before any had measured its lag.
        self.caught_up.clear()
        watch = asyncio.create_task(self._watch_lag())
        await self.register_all()
        while (cmd := await self.commands.get()).get("cmd") != "quit":
            c = cmd["cmd"]
            if c in ("disconnect", "reconnect"):
                w = self.by_index[int(cmd["index"])]
                t = time.time()
                if c == "disconnect":
                    await w.disconnect()
                else:
                    # A replaced host: a new incarnation (the same one back after it was declared lost
                    # is not a repair, and its slice would stay down).
                    w.incarnation = f"loadgen-{os.getpid()}-{w.index}-r{time.monotonic_ns()}"
                    w.start()
                    await asyncio.wait_for(w.registered.wait(), 60)
                emit({"event": f"{c}ed", "index": w.index, "t": t})
            elif c == "wait":
                key = (str(cmd["kind"]), int(cmd["generation"]))
                expected = sum(1 for w in self.workers if w.connected)
                deadline = time.monotonic() + float(cmd.get("timeout", 30))
                while self.counts[key] < expected and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                emit({"event": "waited", "have": self.counts[key], "expected": expected})
            elif c == "datagrams":
                live = [w for w in self.workers if w.connected]
                late = self.clock.late_max if self.clock is not None else 0.0
                confirmed = sum(1 for w in live if w.datagrams_confirmed)
                emit({"event": c, "confirmed": confirmed, "connected": len(live), "clock_late_max_s": round(late, 3)})
            elif c == "dump":
                with open(cmd["path"], "w", encoding="utf-8") as f:
                    json.dump({str(w.index): w.received for w in self.workers}, f)
                emit({"event": "dumped", "path": cmd["path"]})
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
    ap.add_argument("--concurrency", type=int, default=100, help="connections set up at once")
    ap.add_argument("--streams-per-connection", type=int, default=1, help="see shared_channel_options")
    ns = ap.parse_args(argv)
    if ns.streams_per_connection < 1:
        ap.error(f"--streams-per-connection {ns.streams_per_connection}: expected 1 or more")
    raise_nofile()
    asyncio.run(LoadGen(ns).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
