"""Recent decisions (or a worker's local events) with live subscribers.

Readers take the backlog from :attr:`EventFeed.recent` and then get every new
record through a queue from :meth:`EventFeed.subscribe`. A reader that falls
more than ``queue_size`` records behind is dropped (its queue leaves
:attr:`EventFeed.subscribers`) rather than slowing the daemon down.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Protocol

Record = dict[str, Any]
"""``time`` (unix), ``trigger``, ``reason``, ``phase``, ``generation``, ``active_slices``, ``actions``."""


class Feed(Protocol):
    recent: collections.deque[Record]
    subscribers: set[asyncio.Queue[Record]]

    def subscribe(self) -> asyncio.Queue[Record]: ...

    def unsubscribe(self, q: asyncio.Queue[Record]) -> None: ...


class EventFeed:
    def __init__(self, keep: int = 500, queue_size: int = 1000) -> None:
        self.recent: collections.deque[Record] = collections.deque(maxlen=keep)
        self.subscribers: set[asyncio.Queue[Record]] = set()
        self._queue_size = queue_size

    def publish(self, rec: Record) -> None:
        self.recent.append(rec)
        for q in list(self.subscribers):
            try:
                q.put_nowait(rec)
            except asyncio.QueueFull:
                self.subscribers.discard(q)

    def subscribe(self) -> asyncio.Queue[Record]:
        q: asyncio.Queue[Record] = asyncio.Queue(maxsize=self._queue_size)
        self.subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[Record]) -> None:
        self.subscribers.discard(q)
