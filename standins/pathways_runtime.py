"""Stand-in for what Pathways tells a JAX program about its slices.

The real Pathways client learns from its resource manager when a worker goes
away, and the program finds out when a computation touches that worker's
devices: a ``JaxRuntimeError`` with ``DATA_LOSS``. Here one thread per host
follows that host's stand-in Pathways worker over ``grpc.health.v1`` Watch
(with keepalive, so a hung host is noticed too), and the training thread
applies the changes to pathwaysutils' ``DeviceLossSimulator`` before each step,
so the error is raised by pathwaysutils' own fault injection at the next touch
of a lost device. Nothing here talks to the sidecar.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent.constants import GRPC_KEEPALIVE_OPTIONS

_RECONNECT_BACKOFF = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 250),
]
"""gRPC's reconnect backoff, kept short. By default a channel whose connection failed waits 1 s,
then 1.6 times longer after each failed attempt (jitter 0.2, up to 120 s: gRPC's
doc/connection-backoff.md; these three channel arguments are ``GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS``,
``GRPC_ARG_MIN_RECONNECT_BACKOFF_MS`` and ``GRPC_ARG_MAX_RECONNECT_BACKOFF_MS`` in grpc_types.h), and
channels to one address with the same arguments share that state (the global subchannel pool), so a
fresh channel inherits it. Measured here: a Pathways worker back after a 6-12 s outage was seen up
2.3-3.8 s late, which the example trainer paid before growing back. The real Pathways client does
not poll a dead worker: its resource manager learns of the replacement when it registers. A stand-in
must not add a delay the real system lacks, so the stand-in's channels retry within 250 ms."""
_CHANNEL_OPTIONS = [*GRPC_KEEPALIVE_OPTIONS, *_RECONNECT_BACKOFF]
"""Keepalive fast (a hung host must fail the step within ~1.5 s) and reconnects prompt."""


class PathwaysRuntime:
    def __init__(self, targets: Mapping[int, Sequence[str]], collective_timeout: float = 2.0) -> None:
        """``targets``: slice -> the Pathways worker address of each of its hosts."""
        self._targets = {s: list(t) for s, t in targets.items()}
        self.collective_timeout = collective_timeout
        self._channels: dict[str, grpc.Channel] = {}
        self._up: dict[tuple[int, int], bool] = {(s, h): False for s, t in targets.items() for h in range(len(t))}
        self._lock = threading.Condition()
        self._applied: set[int] = set()  # slices marked lost in the simulator
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: dict[tuple[int, int], grpc.Future] = {}
        """Each watcher's stream in progress, cancelled by :meth:`stop`."""

    def start(self) -> PathwaysRuntime:
        for s, hosts in self._targets.items():
            for h, target in enumerate(hosts):
                t = threading.Thread(target=self._watch, args=(s, h, target), daemon=True, name=f"pw-{s}.{h}")
                t.start()
                self._threads.append(t)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Ends the watchers and closes every channel before the process exits.

        A thread still inside a gRPC stream while the interpreter finalizes can crash the process
        (grpc/grpc#18456: channels must be closed; a trainer's SIGSEGV after its last step, seen once
        in CI, is the suspected case), so the streams are cancelled and their threads joined here
        rather than left to die with the process."""
        self._stop.set()
        with self._lock:
            watches = list(self._watches.values())
        for call in watches:
            call.cancel()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()

    def _set(self, key: tuple[int, int], up: bool) -> None:
        with self._lock:
            if self._up[key] != up:
                self._up[key] = up
                self._lock.notify_all()

    def _watch(self, s: int, h: int, target: str) -> None:
        delay = 0.05
        while not self._stop.is_set():
            try:
                with grpc.insecure_channel(target, options=_CHANNEL_OPTIONS) as ch:
                    call = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""))
                    with self._lock:
                        self._watches[(s, h)] = call
                    if self._stop.is_set():  # stop() ran before this stream was registered
                        call.cancel()
                    try:
                        for resp in call:
                            delay = 0.05
                            self._set((s, h), resp.status == health_pb2.HealthCheckResponse.SERVING)
                    finally:
                        with self._lock:
                            self._watches.pop((s, h), None)
            except grpc.RpcError:
                pass
            self._set((s, h), False)
            self._stop.wait(delay)
            delay = min(delay * 2, 0.5)

    def collective(self, slices: Sequence[int], error: type[Exception] | None = None) -> None:
        """A step's collective over the hosts of ``slices``.

        Every host must take part: a dead host fails it at once, a hung one
        after ``collective_timeout``, each with the status Pathways reports.
        Raises ``error`` (default ``JaxRuntimeError``, as a real computation
        would; JAX is imported only then, so a trainer without JAX passes its own).
        """
        if error is None:
            import jax

            error = jax.errors.JaxRuntimeError
        calls = []
        for s in slices:
            for target in self._targets.get(s, []):
                ch = self._channels.get(target)
                if ch is None:
                    ch = self._channels[target] = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
                stub = health_pb2_grpc.HealthStub(ch)
                calls.append(
                    (s, stub.Check.future(health_pb2.HealthCheckRequest(service=""), timeout=self.collective_timeout))
                )
        for s, fut in calls:
            try:
                resp = fut.result()
            except grpc.RpcError as e:
                code = e.code()  # type: ignore[attr-defined]
                status = "DEADLINE_EXCEEDED" if code == grpc.StatusCode.DEADLINE_EXCEEDED else "DATA_LOSS"
                raise error(f"{status}: slice {s} did not take part in the step ({code.name})") from None
            if resp.status != health_pb2.HealthCheckResponse.SERVING:
                raise error(f"DATA_LOSS: slice {s} worker is not serving")

    def available_slices(self) -> frozenset[int]:
        with self._lock:
            return frozenset(
                s for s, hosts in self._targets.items() if all(self._up[(s, h)] for h in range(len(hosts)))
            )

    def lost_slices(self) -> frozenset[int]:
        return frozenset(self._targets) - self.available_slices()

    def wait_available(self, slices: Sequence[int], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                avail = {s for s, hosts in self._targets.items() if all(self._up[(s, h)] for h in range(len(hosts)))}
                if set(slices) <= avail:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)

    def apply(self, simulator: object, slice_devices: Mapping[int, Sequence[object]]) -> frozenset[int]:
        """Bring the simulator in line with what the workers say; returns the lost slices."""
        lost = self.lost_slices()
        for s in lost - self._applied:
            simulator.mark_slice_lost(s, slice_devices)  # type: ignore[attr-defined]
        for s in self._applied - lost:
            simulator.mark_slice_connected(s, slice_devices)  # type: ignore[attr-defined]
        self._applied = set(lost)
        return lost

    def reset_applied(self) -> None:
        """A fresh simulator knows nothing yet."""
        self._applied = set()
