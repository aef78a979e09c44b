"""Stalls of the coordinator's own event loop, and heartbeat datagrams the kernel dropped: time in which
nobody can be judged silent, because the loop could not read what arrived. And the decision loop's
watchdog: events waiting with nothing decided."""

from __future__ import annotations

import time
from collections.abc import Callable

from agent import log as logmod
from agent.gc_freeze import GcClock
from agent.metrics import Metrics

log = logmod.get("coordinator")
STALL_KEPT = 20
"""Durations of the newest stalls kept for the status page."""
DROPS_LOG_SECONDS = 10.0
"""At most one warning about dropped datagrams this often."""
DECISIONS_WEDGED_SECONDS = 10.0
"""Events waiting and nothing decided for this long (or twice --durability-bound, if longer): the
decision loop is wedged; readiness and gRPC health say so (see DecisionWatch)."""


class LoopWatch:
    """Where liveness deadlines restart from (:attr:`resumed_at`), and what the stalls were."""

    def __init__(self, metrics: Metrics, dropped: Callable[[], int]) -> None:
        self.metrics = metrics
        self._dropped = dropped
        """Heartbeat datagrams the kernel dropped so far (DatagramReceiver.dropped)."""
        self.resumed_at = 0.0
        """End of the newest event-loop stall or kernel drop (monotonic): nobody is late for time before it."""
        self._drops_seen = 0
        self._drops_logged_at = -1e9
        self.stalls: list[float] = []
        """Durations of event-loop stalls seen (newest last)."""
        self.gc_clock = GcClock()
        """How long Python's garbage collector held the process (a stall's warning says how much was it)."""

    def note_datagram_drops(self, now: float) -> None:
        """Heartbeats the kernel dropped (a full socket buffer: this process fell behind) prove no
        silence: like a stall, nobody is judged lost for that time."""
        dropped = self._dropped()
        if dropped <= self._drops_seen:
            return
        new, self._drops_seen = dropped - self._drops_seen, dropped
        self.resumed_at = now
        self.metrics.heartbeat_datagrams.labels("dropped").inc(new)
        if now - self._drops_logged_at >= DROPS_LOG_SECONDS:
            self._drops_logged_at = now
            log.warning(
                "heartbeat datagrams dropped by the kernel (the socket buffer was full: the coordinator fell "
                "behind); liveness deadlines restart from now and nobody is judged lost for it",
                dropped=new,
                dropped_total=dropped,
            )

    def note_stall(self, lag: float, now: float) -> None:
        self.resumed_at = now
        self.stalls.append(lag)
        del self.stalls[:-STALL_KEPT]
        self.metrics.loop_stalls.inc()
        self.metrics.loop_stall_seconds.inc(lag)
        log.warning(
            "event loop was blocked; liveness deadlines restart from now and nobody is judged lost for it",
            stall_seconds=round(lag, 3),
            # Of which Python's garbage collector (full collections grow with the objects live: the workers).
            gc_seconds=round(self.gc_clock.seconds_since(time.monotonic() - lag), 3),
        )


class DecisionWatch:
    """Events waiting and nothing decided for long: the decision loop is wedged (awaiting something that
    never returns). The coordinator then reports not ready, and NOT_SERVING on gRPC health, the liveness
    probe's, so that a loop that cannot recover by itself is restarted; SERVING again if it moves."""

    def __init__(self, durability_bound: float) -> None:
        self.durability_bound = durability_bound
        self.decided_at = time.monotonic()
        """When the decision loop last finished a batch (monotonic)."""
        self.wedged = False
        """Events have waited past DECISIONS_WEDGED_SECONDS with nothing decided."""

    def changed(self, now: float, queued: int) -> bool:
        """Whether :attr:`wedged` changed with this check (``queued``: events waiting to be decided)."""
        limit = max(DECISIONS_WEDGED_SECONDS, 2 * self.durability_bound)
        wedged = queued > 0 and now - self.decided_at > limit
        if wedged == self.wedged:
            return False
        self.wedged = wedged
        if wedged:
            log.error(
                "decision loop wedged: events are waiting and nothing was decided; not ready, NOT_SERVING",
                seconds=round(now - self.decided_at, 1),
                queued=queued,
            )
        else:
            log.warning("decision loop deciding again")
        return True
