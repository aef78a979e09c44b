"""The trainer's stream to its sidecar, kept on a background thread.

Plain synchronous grpcio (no asyncio, no aiohttp, no Pub/Sub client): the
training process only pays for a queue put per report and a deque check per
step. The link reconnects with backoff and greets the sidecar again with what
the trainer holds, so a restarted sidecar can pick up where it was.

The link also knows how long the sidecar has been gone (``down_since``), so a
trainer blocked on it can give up after ``elastic_timeout_seconds`` instead of
waiting for ever. The link counts as up only once the sidecar has accepted the
stream: its response headers or a first command arrived, or the stream stayed
open on a ready channel for :data:`SETTLE_SECONDS` (a sidecar that refuses the
stream, e.g. for a wrong token, answers in milliseconds). With
``wait_for_ready`` a call to an address where nothing listens simply waits,
and the link stays down.
"""

from __future__ import annotations

import collections
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from protos.elastic_sidecar.v1 import trainer_pb2, trainer_pb2_grpc

_OPTIONS = [
    ("grpc.keepalive_time_ms", 500),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.http2.ping_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # gRPC's own reconnect backoff grows to 120 s by default: a sidecar back
    # after a minute would then be seen up to two minutes late.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_CLOSE = object()
SETTLE_SECONDS = 0.3
"""A stream still open this long on a ready channel counts as accepted by the sidecar."""
REFUSED_RETRY_SECONDS = 2.0
"""Wait before trying again after the sidecar refused the link because another trainer's link is attached."""
_SERVICE = trainer_pb2.DESCRIPTOR.services_by_name["TrainerLink"].full_name


def wrong_service_error(address: str, details: str) -> str:
    """What to tell a trainer whose address answers gRPC without the trainer link (UNIMPLEMENTED)."""
    return (
        f"{address} answers gRPC but does not serve the trainer link ({_SERVICE}; it said UNIMPLEMENTED: "
        f"{details}): it is another port of the sidecar (the coordinator's --listen peer port or its "
        f"--admin-listen) or another program. Set ELASTIC_SIDECAR_ADDRESS to the coordinator's "
        f"--trainer-listen address (default 127.0.0.1:29313)"
    )


def read_token_file(path: str) -> str:
    """The bearer token in ``path`` (surrounding whitespace stripped); OSError/ValueError if unusable."""
    with open(path, encoding="utf-8") as f:
        token = f.read().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


class SidecarLink:
    """Sends :class:`TrainerMessage` s, collects :class:`SidecarCommand` s.

    ``hello`` is called at every (re)connect to build the greeting. ``token``
    (or the file ``token_file``, re-read at every connect so a rotated secret
    is picked up) is presented as ``authorization: Bearer <token>``.
    """

    def __init__(
        self,
        address: str,
        hello: Callable[[], trainer_pb2.TrainerHello],
        *,
        token: str | None = None,
        token_file: str | None = None,
        on_command: Callable[[trainer_pb2.SidecarCommand], None] | None = None,
    ) -> None:
        self.address = address
        self._on_command = on_command
        """Called on the link thread for every command as it arrives, before the
        training loop can see it: what must act while the main thread is blocked
        (the multi-controller abort watchdog in :mod:`trainer_hooks.session`)."""
        self._hello = hello
        self._token = token
        self._token_file = token_file
        self.inbox: collections.deque[trainer_pb2.SidecarCommand] = collections.deque()
        self._arrived = threading.Condition()
        self._q: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._closed = threading.Event()
        self.connected = threading.Event()
        self.down_since: float | None = time.monotonic()
        """``time.monotonic()`` when the link was last seen up (creation if never); None while up."""
        self.last_error = ""
        """Why the last stream ended or could not start (empty: none yet)."""
        self.wrong_service = ""
        """Set when the address answered that it does not serve the trainer link (a misconfigured
        address, not a sidecar that is away): waiting for it would be waiting for ever."""
        self._stream = 0
        self._channel_ready = threading.Event()
        self._call: grpc.Future | None = None
        self._thread = threading.Thread(target=self._run, name="sidecar-link", daemon=True)

    def start(self) -> SidecarLink:
        self._thread.start()
        return self

    def send(self, msg: trainer_pb2.TrainerMessage) -> None:
        self._q.put(msg)

    def down_for(self, since: float | None = None) -> float:
        """Seconds the link has been down without a break, counted from ``since`` at the earliest (0: up)."""
        down = self.down_since
        if down is None:
            return 0.0
        return max(0.0, time.monotonic() - max(down, since if since is not None else down))

    def next_command(
        self, timeout: float | None = None, *, down_limit: float | None = None, since: float | None = None
    ) -> trainer_pb2.SidecarCommand | None:
        """Block until a command arrives; None when ``timeout`` passes, when the
        link has been down for ``down_limit`` seconds without a break (counted from
        ``since`` at the earliest), or at once when the address serves no trainer
        link (:attr:`wrong_service`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._arrived:
            while not self.inbox:
                if self.wrong_service:
                    return None
                now = time.monotonic()
                wait = 1.0
                if deadline is not None:
                    if deadline <= now:
                        return None
                    wait = min(wait, deadline - now)
                if down_limit is not None and self.down_since is not None:
                    left = down_limit - self.down_for(since)
                    if left <= 0:
                        return None
                    wait = min(wait, left)
                self._arrived.wait(wait)
            return self.inbox.popleft()

    def close(self, timeout: float = 3.0) -> None:
        """Stop for good: half-close the stream (what is queued still leaves), or give up
        waiting for a sidecar that is not there, so the link never attaches later.

        Waits up to ``timeout`` for the link's thread to end and close its channel (cancelling the
        stream if the sidecar has not ended it by then): a thread left inside gRPC while the
        interpreter exits can crash the process (grpc/grpc#18456: channels must be closed)."""
        self._closed.set()
        self._q.put(_CLOSE)
        call = self._call
        if call is not None and not self.connected.is_set():
            call.cancel()
        if not self._thread.is_alive() or self._thread is threading.current_thread():
            return
        self._thread.join(max(0.0, timeout - 1.0))
        call = self._call
        if self._thread.is_alive() and call is not None:
            call.cancel()
        self._thread.join(1.0)

    def flush_outbox(self, timeout: float = 2.0, *, wait_for_link: bool = False) -> None:
        """Best effort: let queued reports leave before the process exits.

        With ``wait_for_link``, a link that is down (the sidecar restarting) is
        waited for, up to ``timeout``: what was queued goes out on the next stream.
        """
        deadline = time.monotonic() + timeout
        while not self._q.empty() and time.monotonic() < deadline and (wait_for_link or self.connected.is_set()):
            time.sleep(0.01)

    def deliver(self, msg: trainer_pb2.TrainerMessage, timeout: float) -> bool:
        """Send ``msg`` and wait, up to ``timeout``, until it has left on a stream that is up.

        A message queued on a stream that then breaks (the sidecar restarting) is
        lost with that stream, so it is sent again on each new stream until one
        takes it. For reports that must arrive once training is over (Finished);
        a duplicate is harmless there.
        """
        deadline = time.monotonic() + timeout
        with self._arrived:
            stream = self._stream
        self.send(msg)
        sent_at = time.monotonic()
        while time.monotonic() < deadline:
            with self._arrived:
                current, up = self._stream, self.down_since is None
            if current != stream:
                stream = current
                self.send(msg)
                sent_at = time.monotonic()
                continue
            if up and self._q.empty() and time.monotonic() - sent_at >= SETTLE_SECONDS:
                return True
            time.sleep(0.01)
        return False

    # -- the background thread ---------------------------------------------------

    def _requests(self, q: queue.SimpleQueue[object]) -> Iterator[trainer_pb2.TrainerMessage]:
        yield trainer_pb2.TrainerMessage(hello=self._hello())
        while True:
            m = q.get()
            if m is _CLOSE:
                return
            yield m  # type: ignore[misc]

    def _metadata(self) -> list[tuple[str, str]]:
        token = self._token
        if token is None and self._token_file:
            token = read_token_file(self._token_file)
        return [("authorization", f"Bearer {token}")] if token else []

    def _set_up(self, stream: int) -> None:
        with self._arrived:
            if stream != self._stream or self.down_since is None:
                return
            self.down_since = None
            self.connected.set()
            self._arrived.notify_all()

    def _set_down(self, stream: int, error: str) -> None:
        with self._arrived:
            if error:
                self.last_error = error
            if stream == self._stream and self.down_since is None:
                self.down_since = time.monotonic()
            self.connected.clear()
            self._arrived.notify_all()

    def _on_connectivity(self, state: grpc.ChannelConnectivity) -> None:
        if state == grpc.ChannelConnectivity.READY:
            self._channel_ready.set()
        else:
            self._channel_ready.clear()

    def _settle(self, call: grpc.Future, stream: int) -> None:
        """Mark the link up once the stream has stayed open on a ready channel for a moment."""
        while not call.done() and not self._closed.is_set():
            if not self._channel_ready.wait(0.2):
                continue
            end = time.monotonic() + SETTLE_SECONDS
            while time.monotonic() < end and self._channel_ready.is_set() and not call.done():
                time.sleep(0.02)
            if time.monotonic() >= end and self._channel_ready.is_set() and not call.done():
                self._set_up(stream)
                return

    def _run(self) -> None:
        # One channel for the link's life (its reconnect backoff is capped in the options).
        ch = grpc.insecure_channel(self.address, options=_OPTIONS)
        ch.subscribe(self._on_connectivity, try_to_connect=True)
        try:
            self._attach_loop(ch)
        finally:
            ch.unsubscribe(self._on_connectivity)
            time.sleep(0.3)  # gRPC's connectivity poller looks every 0.2 s; closing under it raises there
            ch.close()

    def _attach_loop(self, ch: grpc.Channel) -> None:
        stub = trainer_pb2_grpc.TrainerLinkStub(ch)
        delay = 0.05
        while not self._closed.is_set():
            q = self._q
            with self._arrived:
                self._stream += 1
                stream = self._stream
            error = ""
            refused = False
            try:
                metadata = self._metadata()
            except (OSError, ValueError) as e:
                metadata = None
                error = f"cannot read the trainer link token: {e}"
            if metadata is not None:
                try:
                    responses = stub.Attach(self._requests(q), wait_for_ready=True, metadata=metadata)
                    self._call = responses
                    if self._closed.is_set():
                        responses.cancel()
                    threading.Thread(
                        target=self._settle, args=(responses, stream), name="sidecar-link-settle", daemon=True
                    ).start()
                    for cmd in responses:
                        delay = 0.05
                        if self._on_command is not None:
                            self._on_command(cmd)
                        with self._arrived:
                            self.inbox.append(cmd)
                            self._arrived.notify_all()
                        self._set_up(stream)
                    error = "the sidecar ended the stream"
                except grpc.RpcError as e:
                    code = e.code() if hasattr(e, "code") else None
                    details = e.details() if hasattr(e, "details") else str(e)
                    error = f"{getattr(code, 'name', code)}: {details}"
                    if code == grpc.StatusCode.UNIMPLEMENTED and not self.wrong_service:
                        self.wrong_service = wrong_service_error(self.address, details)
                        print(f"trainer_hooks: {self.wrong_service}", file=sys.stderr, flush=True)
                    if code == grpc.StatusCode.ALREADY_EXISTS:
                        # Another trainer's link holds this job at the sidecar: try again only slowly (it may
                        # be this trainer's own old link, about to go), and say so each time.
                        refused = True
                        print(
                            f"trainer_hooks: the sidecar at {self.address} refused this trainer's link: {details} "
                            f"(retrying in {REFUSED_RETRY_SECONDS:g} s)",
                            file=sys.stderr,
                            flush=True,
                        )
            self._set_down(stream, error)
            if self._closed.is_set():
                return
            # A fresh queue per stream: the old request iterator may still be
            # blocked on the old one.
            self._q = queue.SimpleQueue()
            q.put(_CLOSE)
            if refused:
                self._closed.wait(REFUSED_RETRY_SECONDS)
                continue
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
