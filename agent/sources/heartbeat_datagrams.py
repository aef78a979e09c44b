"""Worker heartbeats as UDP datagrams (``HeartbeatDatagram`` in protos/.../peer.proto).

Why: at thousands of workers a heartbeat that arrives as a message on a gRPC
stream costs the coordinator tens of microseconds of Python (the asyncio
stream read) plus gRPC's own HTTP/2 work, four times a second per worker, and
that was most of its CPU (docs/benchmarks.md, scale). A datagram is read here
with one ``recv`` and one protobuf parse, many per event-loop wake-up.

What stays on the stream: registration, every report (health changes,
notices), every command, and the stream's end, which is how a killed host is
noticed. A datagram only proves that its sender still runs, which is all a
heartbeat proves. The worker keeps heartbeating on its stream until the
coordinator has received its first datagram (``DatagramsReceived``), so a path
that drops UDP never costs a worker its liveness.

Each registration gets a random token; a datagram counts only for the stream
whose token it carries, so a stale worker process (or anybody else) cannot keep
another registration alive by accident. The token travels on the (possibly
authenticated, possibly TLS) stream; the datagram itself is plaintext, so on a
network where an attacker can read UDP between the hosts, turn datagrams off
(``--heartbeat-datagrams off``).

Commands come back the same way (``CommandDatagram``): the coordinator sends
every worker command to the address the worker's heartbeat datagrams come
from, and the worker acknowledges it at once in a heartbeat (``ack_generation``,
``ack_kind``). Only a worker that has not acknowledged it within
``COMMAND_ACK_SECONDS`` (and one without datagrams) gets it on its stream. Ten
thousand stream writes from one Python thread take seconds; ten thousand
``sendto`` calls take tens of milliseconds. A command datagram carries an
HMAC-SHA256 of its body keyed with the registration's token, so nobody without
the token can steer a worker by UDP.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from agent import constants as C
from agent import log as logmod
from protos.elastic_sidecar.v1 import peer_pb2

log = logmod.get("heartbeat-datagrams")

MAX_PER_WAKE = 4096
"""Most datagrams read per wake-up, so that a flood cannot starve the event loop."""
BUSY_READ = 32
"""A wake-up that found at least this many datagrams pauses reading for PAUSE_SECONDS: at 10,000
workers (40,000 a second) the loop otherwise woke for a few dozen each time, and the wake-ups cost
as much as the reading. A quiet socket is read at once, as before."""
PAUSE_SECONDS = 0.01
"""Ten milliseconds of heartbeats wait in the socket buffer (400 at 10,000 workers): nothing next to a
1.2 s timeout."""
RECV_BUFFER_BYTES = 64 * 1024 * 1024
"""Socket receive buffer asked for (the kernel caps it at net.core.rmem_max; deploy/gke/node-system-config.yaml
raises that to this): room for an event-loop stall's worth of heartbeats at tens of thousands of workers,
such as a full garbage collection while every worker registers after a restart (the scale benchmark in
docs/benchmarks.md reports the drops on this socket). The kernel charges each datagram's
bookkeeping too, not just its 40 bytes (socket(7), SO_RCVBUF), so a buffer holds far fewer heartbeats than
its size over 40."""
TOKEN_BYTES = 16
MAX_DATAGRAM = 256
"""A HeartbeatDatagram is about 40 bytes; anything longer is not one."""
MAX_COMMAND_DATAGRAM = 2048
"""A CommandDatagram: a PeerCommand (its reason is short text) and a 32-byte mac."""

SO_RXQ_OVFL = 40
"""Linux (socket(7)): each datagram read carries the socket's count of datagrams the kernel dropped
for want of buffer space. Python's socket module does not name it."""

Reply = tuple[socket.socket, Any]
"""Where a worker's heartbeat datagrams came from: the coordinator's socket that read them and the sender's address."""


class Target(Protocol):
    """What a live registration's heartbeat datagram updates (the coordinator's connection)."""

    last_seen: float
    datagram_key: bytes
    """The exact bytes its heartbeat datagrams repeat (empty: not matched that way)."""


def new_token() -> bytes:
    """A registration's datagram token."""
    return os.urandom(TOKEN_BYTES)


def same_token(expected: bytes, got: bytes) -> bool:
    return bool(expected) and hmac.compare_digest(expected, got)


def command_position(generation: int, kind: str) -> tuple[int, int]:
    """Where a worker command stands among all of them: by generation, then COMMAND_ORDER within it."""
    return (generation, C.COMMAND_ORDER.get(kind, 0))


def heartbeat_datagram(token: bytes, slice_: int, host: int, ack: peer_pb2.PeerCommand | None = None) -> bytes:
    """A worker's HeartbeatDatagram (``seq`` left 0, so the same bytes every time); with ``ack``, the
    one sent at once to acknowledge that command datagram."""
    dg = peer_pb2.HeartbeatDatagram(slice=slice_, host=host, token=token)
    if ack is not None:
        dg.ack_generation, dg.ack_kind = ack.generation, ack.kind
    return dg.SerializeToString()


def _mac(token: bytes, body: bytes) -> bytes:
    return hmac.digest(token, body, hashlib.sha256)


def command_datagram(token: bytes, slice_: int, host: int, command: peer_pb2.PeerCommand) -> bytes:
    """One worker's copy of ``command`` as a CommandDatagram, authenticated with its registration's token."""
    body = peer_pb2.CommandDatagramBody(slice=slice_, host=host, command=command).SerializeToString()
    return peer_pb2.CommandDatagram(body=body, mac=_mac(token, body)).SerializeToString()


def open_command_datagram(token: bytes, slice_: int, host: int, data: bytes) -> peer_pb2.PeerCommand | None:
    """The PeerCommand in ``data`` when it is a CommandDatagram for this worker under ``token``; else None."""
    try:
        dg = peer_pb2.CommandDatagram.FromString(data)
    except DecodeError:
        return None
    if not token or not hmac.compare_digest(_mac(token, dg.body), dg.mac):
        return None
    try:
        body = peer_pb2.CommandDatagramBody.FromString(dg.body)
    except DecodeError:
        return None
    if (body.slice, body.host) != (slice_, host) or not body.HasField("command"):
        return None
    return body.command


def _bind_addresses(listen: str) -> list[tuple[int, str]]:
    """(family, host) pairs to bind for the gRPC listen address ``HOST:PORT``, as gRPC binds it."""
    host = listen.rpartition(":")[0].strip("[]")
    if host in ("", "*"):
        host = "::"
    if host == "localhost":
        return [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE | socket.AI_NUMERICHOST)
    except socket.gaierror:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
    out: list[tuple[int, str]] = []
    for family, _, _, _, addr in infos:
        pair = (int(family), str(addr[0]))
        if pair not in out:
            out.append(pair)
    return out


class DatagramReceiver:
    """Reads heartbeat datagrams on the coordinator's UDP sockets.

    ``on_heartbeat(datagram, now, reply)`` returns the live registration the
    (parsed) datagram belongs to, or None (``reply``: where to send that worker
    command datagrams, :meth:`send`); ``on_counts(accepted, refused)`` is called once per
    wake-up with what it read.

    A worker sends the same bytes every time (``seq`` left 0), so once one of its
    datagrams was accepted, the next ones are matched by their bytes alone, without
    parsing: one dict lookup. At 10,000 workers and four heartbeats a second that is
    most of the coordinator's steady work. The bytes hold the registration's token,
    so a match is as good as the token check; the dict hashes bytes with SipHash keyed
    per process, so a lookup's timing tells a sender nothing about a token it does not
    have. :meth:`forget` drops a registration when its stream ends.
    """

    def __init__(
        self,
        on_heartbeat: Callable[[peer_pb2.HeartbeatDatagram, float, Reply], Target | None],
        on_counts: Callable[[int, int], None] | None = None,
    ) -> None:
        self.on_heartbeat = on_heartbeat
        self.on_counts = on_counts
        self.socks: list[socket.socket] = []
        self.port = 0
        self.known: dict[bytes, Target] = {}
        """A registration's heartbeat datagram, byte for byte -> the registration."""
        self._paused: dict[int, asyncio.TimerHandle] = {}
        """Sockets whose reading pauses after a busy wake-up (BUSY_READ), by file descriptor."""
        self._drops: dict[int, int] = {}
        """Datagrams the kernel dropped on each socket (SO_RXQ_OVFL), by file descriptor."""
        self._loop: asyncio.AbstractEventLoop | None = None

    def forget(self, target: Target) -> None:
        """``target``'s datagrams no longer count (its stream ended)."""
        if target.datagram_key and self.known.get(target.datagram_key) is target:
            del self.known[target.datagram_key]
        target.datagram_key = b""

    def open(self, listen: str, port: int) -> int:
        """Bind UDP ``port`` on the hosts of ``listen`` (another free port if it is taken); return the port.

        Every address of ``listen`` that can be bound on one port is (``localhost``: 127.0.0.1 and
        ::1, either alone where the other is missing). Returns 0 (datagrams off) when none could be.
        """
        self._loop = asyncio.get_running_loop()
        addrs = _bind_addresses(listen)
        for want in dict.fromkeys((port, 0)):
            socks: list[socket.socket] = []
            bound = want
            errors: list[str] = []
            for family, host in addrs:
                s = socket.socket(family, socket.SOCK_DGRAM)
                try:
                    if family == socket.AF_INET6 and host == "::":
                        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER_BYTES)
                    try:
                        s.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
                    except OSError:
                        pass  # not Linux: drops go unseen (dropped() stays 0)
                    s.bind((host, bound))
                except OSError as e:
                    s.close()
                    errors.append(f"{host}: {e}")
                    continue
                bound = s.getsockname()[1]
                s.setblocking(False)
                socks.append(s)
            if not socks:
                log.warning(
                    "could not bind the heartbeat datagram port", listen=listen, port=want or "any", errors=errors
                )
                continue
            if errors:
                log.warning("heartbeat datagrams not on every address of --listen", port=bound, errors=errors)
            if port and bound != port:
                log.warning("heartbeat datagrams on another port than --listen's", port=bound, listen=listen)
            self.socks = socks
            self.port = bound
            for s in socks:
                self._loop.add_reader(s.fileno(), self._drain, s)
            granted = min(s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) for s in socks)
            # Linux reports twice what it grants for bookkeeping (socket(7)), capped at twice rmem_max.
            if granted < 2 * RECV_BUFFER_BYTES:
                log.warning(
                    "heartbeat socket receive buffer capped by net.core.rmem_max: datagrams may be dropped at scale "
                    "(deploy/gke/node-system-config.yaml)",
                    asked_bytes=RECV_BUFFER_BYTES,
                    granted_bytes=granted // 2,
                )
            return bound
        log.warning("heartbeat datagrams are off: no UDP port could be bound; workers heartbeat on their streams")
        return 0

    @staticmethod
    def send(reply: Reply, data: bytes) -> bool:
        """Send one datagram back to where a worker's heartbeats come from; False when it could not go."""
        sock, addr = reply
        try:
            sock.sendto(data, addr)
            return True
        except OSError:  # a full send buffer or a closed socket: the stream's copy still goes
            return False

    def close(self) -> None:
        for handle in self._paused.values():
            handle.cancel()
        self._paused.clear()
        for s in self.socks:
            if self._loop is not None:
                self._loop.remove_reader(s.fileno())
            s.close()
        self.socks = []

    def dropped(self) -> int:
        """Heartbeat datagrams the kernel dropped so far because the sockets' buffers were full (seen
        with the datagrams read after them). A heartbeat dropped is a silence nobody kept."""
        return sum(self._drops.values())

    def read_now(self) -> None:
        """Read everything that has arrived, paused or not: before judging anybody silent. (One
        wake-up reads at most MAX_PER_WAKE; a full buffer holds more.)"""
        for sock in self.socks:
            for _ in range(16):
                if self._drain(sock) < MAX_PER_WAKE:
                    break

    def _read_again(self, sock: socket.socket) -> None:
        self._paused.pop(sock.fileno(), None)
        if self._loop is not None and sock in self.socks:
            self._loop.add_reader(sock.fileno(), self._drain, sock)

    def _drain(self, sock: socket.socket) -> int:
        """Read up to MAX_PER_WAKE datagrams; how many were read."""
        now = time.monotonic()
        accepted = refused = 0
        parse = peer_pb2.HeartbeatDatagram.FromString
        seen = self.on_heartbeat
        known = self.known
        recvfrom = sock.recvfrom
        for i in range(MAX_PER_WAKE):
            try:
                if i == 0:
                    # The first with its ancillary data: the kernel's count of drops on this socket.
                    data, anc, _, addr = sock.recvmsg(MAX_DATAGRAM, socket.CMSG_SPACE(4))
                    for level, kind, cdata in anc:
                        if level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(cdata) >= 4:
                            fd = sock.fileno()
                            self._drops[fd] = max(self._drops.get(fd, 0), int.from_bytes(cdata[:4], sys.byteorder))
                else:
                    data, addr = recvfrom(MAX_DATAGRAM)
            except OSError:  # BlockingIOError: nothing left to read
                break
            target = known.get(data)
            if target is not None:
                target.last_seen = now
                accepted += 1
                continue
            try:
                dg = parse(data)
            except DecodeError:
                refused += 1
                continue
            target = seen(dg, now, (sock, addr))
            if target is None:
                refused += 1
                continue
            accepted += 1
            if dg.seq == 0 and not dg.ack_kind and not target.datagram_key:
                target.datagram_key = data
                known[data] = target
        if self.on_counts is not None and (accepted or refused):
            self.on_counts(accepted, refused)
        if accepted + refused >= BUSY_READ and self._loop is not None and sock.fileno() not in self._paused:
            fd = sock.fileno()
            self._loop.remove_reader(fd)
            self._paused[fd] = self._loop.call_later(PAUSE_SECONDS, self._read_again, sock)
        return accepted + refused


def target_host(coordinator: str) -> str:
    """The host part of a gRPC target ``[scheme:///]HOST:PORT``."""
    target = coordinator.rpartition("/")[2] if "://" in coordinator or ":///" in coordinator else coordinator
    return target.rpartition(":")[0].strip("[]")


class DatagramSender:
    """A worker's heartbeat datagrams to the coordinator's address.

    The coordinator's name may resolve to several addresses (``localhost``: 127.0.0.1 and
    ::1); until the coordinator confirms, each address is tried for a few heartbeats in turn.
    """

    TRIES_PER_ADDRESS = 4

    def __init__(
        self,
        addrs: list[tuple[int, Any]],
        token: bytes,
        slice_: int,
        host: int,
        on_command: Callable[[peer_pb2.PeerCommand], None] | None = None,
    ) -> None:
        self.addrs = addrs
        self.token = token
        self.slice = slice_
        self.host = host
        self.on_command = on_command
        """Called with each authenticated PeerCommand the coordinator sends back to this socket."""
        self.confirmed = False
        self.commands_received = 0
        self.commands_refused = 0
        self._i = 0
        self._sent = 0
        self._socks: dict[int, socket.socket] = {}
        self._warned = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._data = heartbeat_datagram(token, slice_, host)

    @classmethod
    async def create(
        cls,
        coordinator: str,
        port: int,
        token: bytes,
        slice_: int,
        host: int,
        on_command: Callable[[peer_pb2.PeerCommand], None] | None = None,
    ) -> DatagramSender | None:
        """None when the coordinator offers no datagram port or its name does not resolve."""
        if not port or not token:
            return None
        name = target_host(coordinator)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_DGRAM)
        except OSError as e:
            log.warning("heartbeat datagrams off: cannot resolve the coordinator", host=name, error=str(e))
            return None
        addrs: list[tuple[int, Any]] = []
        for family, _, _, _, addr in infos:
            if (int(family), addr) not in addrs:
                addrs.append((int(family), addr))
        if not addrs:
            return None
        sender = cls(addrs, token, slice_, host, on_command)
        sender._loop = asyncio.get_running_loop()
        return sender

    def send(self) -> bool:
        """Send one heartbeat; False when it could not be sent (the caller heartbeats on the stream then).

        Every heartbeat is the same bytes (``seq`` left 0): the coordinator matches them without parsing.
        """
        if not self.confirmed:
            if self._sent and self._sent % self.TRIES_PER_ADDRESS == 0:
                self._i = (self._i + 1) % len(self.addrs)
            self._sent += 1
        family, addr = self.addrs[self._i]
        sock = self._socks.get(family)
        try:
            if sock is None:
                sock = self._socks[family] = socket.socket(family, socket.SOCK_DGRAM)
                sock.setblocking(False)
                if self.on_command is not None and self._loop is not None:
                    self._loop.add_reader(sock.fileno(), self._read_commands, sock)
            sock.sendto(self._data, addr)
            return True
        except OSError as e:
            if not self._warned:
                self._warned = True
                log.warning("heartbeat datagram not sent; the stream keeps the heartbeats", error=str(e), to=str(addr))
            return False

    def _read_commands(self, sock: socket.socket) -> None:
        """Command datagrams back from the coordinator; anything else on this socket is dropped."""
        for _ in range(64):
            try:
                data = sock.recv(MAX_COMMAND_DATAGRAM)
            except OSError:  # BlockingIOError: nothing left; or an ICMP error from an earlier send
                return
            cmd = open_command_datagram(self.token, self.slice, self.host, data)
            if cmd is None:
                self.commands_refused += 1
                continue
            self.commands_received += 1
            # Acknowledged at once, from this socket: the coordinator then skips the stream copy.
            family, addr = self.addrs[self._i]
            try:
                self._socks[family].sendto(heartbeat_datagram(self.token, self.slice, self.host, cmd), addr)
            except (OSError, KeyError):
                pass  # unacknowledged: the stream's copy follows
            if self.on_command is not None:
                self.on_command(cmd)

    def close(self) -> None:
        for s in self._socks.values():
            if self.on_command is not None and self._loop is not None:
                self._loop.remove_reader(s.fileno())
            s.close()
        self._socks.clear()
