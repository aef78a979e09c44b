"""The worker's side of straggler detection: its host's libtpu metrics, one compact window at a time.

Every ``window_seconds`` the reporter reads the host through a :class:`MetricsSource`, closes a
window with the :class:`Windower` and hands a ``MetricsWindow`` message to ``send`` (the worker
puts it on its Peer stream). A source that cannot see yields a window that says ``blind`` and why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from agent import log as logmod
from agent.sources.tpu_metrics import Blind, MetricsSource, Windower, WindowSummary
from protos.elastic_sidecar.v1 import peer_pb2

log = logmod.get("worker")
COLLECTIVE = "collective_e2e_latency"
MICROSECONDS = 1e-6
"""libtpu names the distribution ``megascale.collective_end_to_end_latencies.microsecond...``
(tpu-info's ``MetricName.COLLECTIVE_E2E_LATENCY_US``): its values are microseconds."""
THROTTLE, LINK_HEALTH = "tpu_throttle_score", "ici_link_health"
"""Gauges read when a source serves them (tpu-info does not name them; their scales are unverified:
docs/stragglers.md). A link health below 1 is read as a bad link."""


def window_message(w: WindowSummary | Blind, start: float, end: float) -> peer_pb2.MetricsWindow:
    """One window as the worker sends it; ``start``/``end`` frame a blind one (it has no times of its own)."""
    if isinstance(w, Blind):
        return peer_pb2.MetricsWindow(start_unix=start, end_unix=end, source=w.source, blind=w.reason or "blind")
    msg = peer_pb2.MetricsWindow(start_unix=w.start, end_unix=w.end, source=w.source)
    c = w.distributions.get(COLLECTIVE)
    if c is not None and c.count:
        msg.collective_count = c.count
        if c.p50 is not None:
            msg.collective_p50_seconds = c.p50 * MICROSECONDS
        if c.mean is not None:
            msg.collective_mean_seconds = c.mean * MICROSECONDS
    if THROTTLE in w.gauges:
        msg.throttle_score = w.gauges[THROTTLE]
    if LINK_HEALTH in w.gauges:
        msg.links_unhealthy = w.gauges[LINK_HEALTH] < 1.0
    return msg


class WindowReporter:
    """Reads ``source`` every ``window_seconds`` and sends each closed window; ``run`` until cancelled."""

    def __init__(
        self,
        source: MetricsSource,
        window_seconds: float,
        send: Callable[[peer_pb2.MetricsWindow], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.window_seconds = window_seconds
        self.send = send
        self.clock = clock
        self.windower = Windower()
        self.sent = 0
        self._last = clock()

    async def once(self) -> peer_pb2.MetricsWindow | None:
        """One read; the window it closes (sent), or None for the first reading after a gap."""
        reading = await self.source.read()
        now = self.clock()
        out = self.windower.push(reading)
        start, self._last = self._last, now
        if out is None:
            return None
        msg = window_message(out, start, now)
        self.send(msg)
        self.sent += 1
        return msg

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                began = loop.time()
                try:
                    await self.once()
                except Exception:  # one bad reading must not end the reports: the next starts afresh
                    log.exception("metrics window failed; starting the next one afresh")
                    self.windower = Windower()
                # Keep the cadence: a slow read (at most its deadline) shortens the wait after it.
                await asyncio.sleep(max(0.0, self.window_seconds - (loop.time() - began)))
        finally:
            await self.source.stop()
