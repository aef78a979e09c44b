"""A loopback TCP forwarder standing in for the pod network between sidecars.

The demo can route the worker sidecars' and the trainer's links to the
coordinator through one of these, so a test can cut every connection at once
(a stream blip: the same processes reconnect) or send new connections to
another coordinator (a replacement pod behind the same Service name).

:class:`HostLink` stands in for one host's network path to the coordinator: a
forwarder for its stream and a relay for its heartbeat datagrams, on a loopback
address of its own, that a test can *partition* for some seconds: nothing
passes either way meanwhile (TCP bytes wait, as a real partition's
retransmissions do; datagrams are lost), then traffic flows again.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Forwarder:
    """Listens on 127.0.0.1:<port>; each connection is piped to the current target."""

    def __init__(self, target: str, bind: str = "127.0.0.1", port: int = 0) -> None:
        self.target = target
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind((bind, port))
        self._lsock.listen(128)
        self.port = int(self._lsock.getsockname()[1])
        self.address = f"{bind}:{self.port}"
        self.flowing = threading.Event()
        """Cleared while partitioned: nothing is connected or passed on."""
        self.flowing.set()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._closed = False
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True, name=f"forwarder-{self.port}").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._lsock.accept()
            except OSError:
                return
            self.flowing.wait()  # a partitioned link answers no new connection either (until it heals)
            host, _, port = self.target.rpartition(":")
            try:
                upstream = socket.create_connection((host, int(port)), timeout=2.0)
                upstream.settimeout(None)
            except OSError:
                client.close()  # nothing listens there: the client sees a refused/closed link
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self.flowing.wait()
                data = src.recv(65536)
                if not data:
                    break
                self.flowing.wait()  # read during a partition: held until it heals
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> int:
        """Reset every open connection (both ends see it close); returns how many were cut."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
            self.cuts += 1
        for a, b in pairs:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()
        return len(pairs)

    def retarget(self, target: str, *, cut: bool = True) -> None:
        """New connections go to ``target``; with ``cut``, the open ones are reset."""
        self.target = target
        if cut:
            self.cut()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        with contextlib.suppress(OSError):
            self._lsock.close()
        self.cut()


class DatagramRelay:
    """Relays UDP datagrams between one client and ``target`` (both ways); drops them while partitioned."""

    def __init__(self, target: tuple[str, int], bind: str, port: int) -> None:
        self.target = target
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind((bind, port))
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.connect(target)
        self.client: tuple[str, int] | None = None
        self.flowing = threading.Event()
        self.flowing.set()
        self.dropped = 0
        threading.Thread(target=self._forward, daemon=True, name=f"relay-out-{port}").start()
        threading.Thread(target=self._backward, daemon=True, name=f"relay-in-{port}").start()

    def _forward(self) -> None:
        while True:
            try:
                data, addr = self.front.recvfrom(65536)
            except OSError:
                return
            if not self.flowing.is_set():
                self.dropped += 1
                continue
            self.client = addr
            with contextlib.suppress(OSError):
                self.back.send(data)

    def _backward(self) -> None:
        while True:
            try:
                data = self.back.recv(65536)
            except ConnectionRefusedError:
                continue  # nothing listened there for a moment (the coordinator restarting)
            except OSError:
                return
            if not self.flowing.is_set() or self.client is None:
                self.dropped += 1
                continue
            with contextlib.suppress(OSError):
                self.front.sendto(data, self.client)

    def close(self) -> None:
        for sock in (self.front, self.back):
            with contextlib.suppress(OSError):
                sock.close()


class HostLink:
    """One host's path to the coordinator at ``127.0.0.1:port``: its stream and its heartbeat datagrams.

    Listens on ``bind`` (a loopback address of the host's own, 127.0.0.N) on the coordinator's port
    number for both, since the worker sends its datagrams to the address it connects to, on the
    port the coordinator names (its gRPC port, unless that was taken).
    """

    def __init__(self, port: int, bind: str) -> None:
        self.tcp = Forwarder(f"127.0.0.1:{port}", bind=bind, port=port)
        self.udp = DatagramRelay(("127.0.0.1", port), bind, port)
        self.address = self.tcp.address
        self.partitions = 0

    def partition(self, seconds: float) -> None:
        """Pass nothing either way for ``seconds`` (a network partition of this host), then heal."""
        self.partitions += 1
        for e in (self.tcp.flowing, self.udp.flowing):
            e.clear()
        timer = threading.Timer(seconds, self.heal)
        timer.daemon = True
        timer.start()

    def heal(self) -> None:
        for e in (self.tcp.flowing, self.udp.flowing):
            e.set()

    def close(self) -> None:
        self.heal()
        self.tcp.close()
        self.udp.close()
