"""Python's garbage collector in the coordinator: keep registered workers out of full collections, and time them.

Why. CPython 3.12 runs a full collection, which walks every object the collector tracks, when the
objects that survived into its oldest generation since the last full collection reach a quarter
of those that one kept (``long_lived_pending > long_lived_total / 4``, Modules/gcmodule.c). The
coordinator keeps about 100 tracked objects for each registered worker for as long as the worker
stays (its ``Join`` stream's tasks, futures and contexts, and grpc.aio's call objects), so a
registration storm, every worker at once after a coordinator restart, grows that generation a
quarter at a time and pays a dozen full collections of an ever larger heap, each holding the event
loop longer as the workers grow (``python -m bench scale --scenarios coordinator_restart`` shows it).

What. Every :data:`FREEZE_EVERY_REGISTRATIONS` registrations (checked on the coordinator's tick),
collect the two young generations (the recent registrations' cyclic garbage) and ``gc.freeze()``
what is left: https://docs.python.org/3.12/library/gc.html#gc.freeze moves every tracked object to
a permanent generation that later collections ignore. That is a list splice, not a walk, and the
registration storm then runs without those stalls (docs/design.md, "When the sidecar itself fails").

What it costs. Reference counting still frees a frozen object that is no longer used: a worker that
leaves gives its memory back as before. Only garbage *in a reference cycle* is left to the
collector, and it skips frozen objects: a departed worker's cycles stay in memory until unfrozen.
So once the streams that ended since the last full collection reach a quarter of the workers
frozen (the interpreter's own quarter), everything is unfrozen, collected once, and frozen again;
that collection walks every object (about a second at 19,000 workers), so it waits until no stream
has started or ended for :data:`QUIET_SECONDS` (many streams ending at once is an incident, whose
hold should not wait behind a collection), or until as many streams have ended as were frozen. In
the runs above the coordinator's whole frozen heap held 128 unreachable objects when unfrozen at
its stop (33 without freezing). ``--gc-freeze off`` leaves the collector as Python has it.
"""

from __future__ import annotations

import collections
import gc
import time
from collections.abc import Callable
from typing import Any

from agent import log as logmod

log = logmod.get("coordinator")

FREEZE_EVERY_REGISTRATIONS = 256
"""Registrations between two freezes: at about 100 objects each, the young collections before a
freeze walk some 25,000 objects (milliseconds), and a storm of 25,000 workers freezes about 100 times."""


QUIET_SECONDS = 5.0
"""How long no stream may have started or ended before the collection of departed workers' cycles runs."""


class GcFreezer:
    """Decides, on each tick, whether to freeze the collector's objects or to collect them all once.

    ``registered()`` and ``ended()`` are called as workers' streams start and end; ``tick(workers)``
    with the number registered now. ``gc_module`` is :mod:`gc` (a test may pass a recorder).
    """

    def __init__(
        self,
        *,
        enabled: bool = True,
        every: int = FREEZE_EVERY_REGISTRATIONS,
        quiet: float = QUIET_SECONDS,
        gc_module: Any = gc,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if every < 1:
            raise ValueError(f"every={every}: registrations between freezes must be at least 1")
        self.enabled = enabled
        self.every = every
        self.quiet = quiet
        self._gc = gc_module
        self._clock = clock
        self._changed_at = clock()
        """When a stream last started or ended."""
        self._registered = 0
        """Registrations since the last freeze."""
        self._ended = 0
        """Streams ended since the last full collection (or since the start)."""
        self._frozen_workers = 0
        """Workers registered at the last freeze."""
        self.freezes = 0

    def registered(self) -> None:
        self._registered += 1
        self._changed_at = self._clock()

    def ended(self) -> None:
        self._ended += 1
        self._changed_at = self._clock()

    def tick(self, workers: int) -> str | None:
        """Freeze, collect all, or nothing ("freeze", "collect" or None)."""
        if not self.enabled:
            return None
        quarter_gone = self._frozen_workers and 4 * self._ended >= self._frozen_workers
        settled = self._clock() - self._changed_at >= self.quiet or self._ended >= self._frozen_workers
        if quarter_gone and settled:
            # Their cyclic garbage can only be found unfrozen (GcClock times this collection like any other).
            started = time.monotonic()
            self._gc.unfreeze()
            found = self._gc.collect()
            self._gc.freeze()
            took = time.monotonic() - started
            log.info(
                "workers left since the collector's objects were frozen: unfrozen, collected and frozen again",
                ended=self._ended,
                frozen_workers=self._frozen_workers,
                unreachable=found,
                seconds=round(took, 3),
            )
            self._ended = self._registered = 0
            self._frozen_workers = workers
            return "collect"
        if self._registered >= self.every:
            self._gc.collect(1)  # the young generations: cycles the recent registrations left behind
            self._gc.freeze()
            self.freezes += 1
            self._registered = 0
            self._frozen_workers = workers
            return "freeze"
        return None


class GcClock:
    """Python's garbage collections (``gc.callbacks``): when each ended and how long it held the process."""

    def __init__(self) -> None:
        self._started: float | None = None
        self.recent: collections.deque[tuple[float, float, int]] = collections.deque(maxlen=256)
        """(monotonic end, seconds, generation) of the newest collections."""

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        now = time.monotonic()
        if phase == "start":
            self._started = now
        elif self._started is not None:
            self.recent.append((now, now - self._started, int(info.get("generation", -1))))
            self._started = None

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def uninstall(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def seconds_since(self, since: float) -> float:
        """Seconds of collection after ``since`` (monotonic): each collection's part after it."""
        return sum(min(d, end - since) for end, d, _ in self.recent if end > since)
