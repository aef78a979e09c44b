"""A loopback TCP forwarder standing in for the pod network between sidecars.

The demo can route the worker sidecars' and the trainer's links to the
coordinator through one of these, so a test can cut every connection at once
(a stream blip: the same processes reconnect) or send new connections to
another coordinator (a replacement pod behind the same Service name).
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Forwarder:
    """Listens on 127.0.0.1:<port>; each connection is piped to the current target."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind(("127.0.0.1", 0))
        self._lsock.listen(128)
        self.port = int(self._lsock.getsockname()[1])
        self.address = f"127.0.0.1:{self.port}"
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
            while data := src.recv(65536):
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
