"""The demo's ``slow`` faults: the slices' pace, the trainer's step, and what each host's libtpu shows.

The harness keeps each slice's slowdown factor (:class:`Slowdowns`) and writes it to a small JSON
file that the trainer reads at every step (:class:`SlowFile`): a synchronous step takes as long as
its slowest active slice makes it, so a drained slow slice slows no one. Each host gets a stand-in
``RuntimeMetricService`` (:class:`MetricsHosts`, :mod:`standins.tpu_metrics`) that advances one step
per step the trainer reports, with its own slowdown and its slowest active peer's: what a real host
of that step would show, nothing more.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from simjob.ports import free_port
from standins.tpu_metrics import HostModel, TpuMetricsStandIn


@dataclass
class Slowdowns:
    """Each slice's factor: the largest of the slow faults on it now (1.0: none)."""

    path: Path
    slices: int
    _active: dict[int, tuple[int | None, float]] = field(default_factory=dict)
    _next: int = 0

    def __post_init__(self) -> None:
        self._write()

    def start(self, slice_: int | None, factor: float) -> int:
        """Slow ``slice_`` (None: every slice) by ``factor``; returns a handle for :meth:`end`."""
        handle, self._next = self._next, self._next + 1
        self._active[handle] = (slice_, factor)
        self._write()
        return handle

    def end(self, handle: int) -> None:
        self._active.pop(handle, None)
        self._write()

    def factors(self) -> dict[int, float]:
        out = dict.fromkeys(range(self.slices), 1.0)
        for where, factor in self._active.values():
            for s in range(self.slices) if where is None else [where]:
                out[s] = max(out[s], factor)
        return out

    def _write(self) -> None:
        # Replaced whole, so the trainer never reads half a file (rename is atomic on POSIX).
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({str(s): f for s, f in self.factors().items() if f != 1.0}))
        os.replace(tmp, self.path)


class SlowFile:
    """The trainer's side: the factors in the harness's file, read again only when it changed."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._factors: dict[int, float] = {}

    def factors(self) -> dict[int, float]:
        if self.path is None:
            return {}
        try:
            st = self.path.stat()
            # Each write is a new file (os.replace): a new inode even within one mtime tick.
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen != self._seen:
                self._factors = {int(s): float(f) for s, f in json.loads(self.path.read_text()).items()}
                self._seen = seen
        except (OSError, ValueError):
            pass  # not written yet: no slowdown; a write in progress cannot be seen (os.replace)
        return self._factors

    def step_factor(self, active: Iterable[int]) -> tuple[float, dict[int, float]]:
        """The step's factor (its slowest active slice's) and the active slices slowed."""
        f = self.factors()
        slowed = {s: f[s] for s in active if f.get(s, 1.0) > 1.0}
        return max(slowed.values(), default=1.0), slowed


TRANSFER_SECONDS = 0.005
"""The cross-slice collective's own transfer in the stand-in's model, with nobody to wait for."""


class MetricsHosts:
    """One stand-in libtpu metrics service per host, served from a thread of the harness.

    :meth:`step` advances the hosts of the step's active slices by one step; a drained slice's
    hosts run no step and their distributions stand still, as a real idle host's would.
    """

    def __init__(self, hosts: Iterable[tuple[int, int]]) -> None:
        self.ports = {k: free_port() for k in hosts}
        self._services: dict[tuple[int, int], TpuMetricsStandIn] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tpu-metrics-stand-ins", daemon=True)

    def start(self) -> None:
        self._thread.start()
        for key, port in self.ports.items():
            service = TpuMetricsStandIn(HostModel(transfer_seconds=TRANSFER_SECONDS))
            asyncio.run_coroutine_threadsafe(service.start(port), self._loop).result(timeout=30)
            self._services[key] = service

    def target(self, s: int, h: int) -> str:
        return f"127.0.0.1:{self.ports[(s, h)]}"

    def step(self, seconds: float, active: Iterable[int], factors: dict[int, float]) -> None:
        """One step of ``seconds`` on ``active`` slices, slice ``s``'s work ``factors[s]`` times as long."""
        act = list(active)
        f = {s: factors.get(s, 1.0) for s in act}
        slowest = max(f.values(), default=1.0)
        # The step is the slowest slice's compute plus the transfer; the others' compute is theirs.
        compute = max(seconds - TRANSFER_SECONDS, 1e-6) / slowest
        moves = []
        for (s, _h), service in self._services.items():
            if s in f:
                peer = max((f[o] for o in act if o != s), default=1.0)
                moves.append((service, f[s], peer))

        def advance() -> None:  # in the services' loop: their reads and this never interleave
            for service, own, peer in moves:
                m = service.model
                m.compute_seconds, m.slowdown, m.slowest_peer = compute, own, peer
                service.advance()

        self._loop.call_soon_threadsafe(advance)

    def reset(self, s: int) -> None:
        """Slice ``s`` was recreated: its new hosts' libtpu counts from zero."""
        for (slice_, _h), service in self._services.items():
            if slice_ == s:
                self._loop.call_soon_threadsafe(service.reset)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        for service in self._services.values():
            asyncio.run_coroutine_threadsafe(service.stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
