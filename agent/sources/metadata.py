"""The GCE metadata server's advance notices, watched from a worker sidecar.

Two long-polls (FACTS section 4), each with ``wait_for_change=true`` and the
last ETag, header ``Metadata-Flavor: Google``:

* ``instance/maintenance-event``: ``NONE``, ``MIGRATE_ON_HOST_MAINTENANCE`` or
  ``TERMINATE_ON_HOST_MAINTENANCE`` (about 60 s of notice);
* ``instance/preempted``: ``TRUE`` / ``FALSE`` (Spot: about 30 s).

A non-200 answer or a broken connection means *unknown*, never *clear*: the
watcher reports nothing and retries with backoff. The base address is
configurable (``--metadata-url``), which is also how tests point it at the
stand-in in :mod:`standins.metadata_server`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from agent import log as logmod

log = logmod.get("metadata")

DEFAULT_BASE_URL = "http://metadata.google.internal/computeMetadata/v1"
MAINTENANCE_KEY = "instance/maintenance-event"
PREEMPTED_KEY = "instance/preempted"
HEADERS = {"Metadata-Flavor": "Google"}


@dataclass(frozen=True)
class MetadataChange:
    key: str  # MAINTENANCE_KEY or PREEMPTED_KEY
    value: str


class MetadataWatcher:
    """Calls ``on_change`` with each new value of the watched keys."""

    def __init__(
        self,
        base_url: str,
        on_change: Callable[[MetadataChange], None],
        *,
        keys: tuple[str, ...] = (MAINTENANCE_KEY, PREEMPTED_KEY),
        poll_timeout: float = 60.0,
        backoff_max: float = 5.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.on_change = on_change
        self.keys = keys
        self.poll_timeout = poll_timeout
        self.backoff_max = backoff_max
        self.values: dict[str, str | None] = {k: None for k in keys}
        self.errors = 0

    async def run(self) -> None:
        async with aiohttp.ClientSession(headers=HEADERS) as session:
            await asyncio.gather(*(self._watch(session, k) for k in self.keys))

    async def _watch(self, session: aiohttp.ClientSession, key: str) -> None:
        etag = "0"
        delay = 0.1
        url = f"{self.base_url}/{key}"
        timeout = aiohttp.ClientTimeout(total=self.poll_timeout + 10)
        while True:
            params = {"wait_for_change": "true", "last_etag": etag, "timeout_sec": str(int(self.poll_timeout))}
            try:
                async with session.get(url, params=params, timeout=timeout) as resp:
                    if resp.status != 200:
                        # Unknown, not clear: keep the last verdict.
                        self.errors += 1
                        log.warning("metadata server answered non-200", key=key, status=resp.status)
                        raise _Retry
                    value = (await resp.text()).strip()
                    etag = resp.headers.get("ETag", etag)
            except (_Retry, aiohttp.ClientError, TimeoutError) as e:
                if not isinstance(e, _Retry):
                    self.errors += 1
                    log.warning("metadata server unreachable", key=key, error=f"{type(e).__name__}: {e}"[:200])
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff_max)
                continue
            delay = 0.1
            if value != self.values[key]:
                first = self.values[key] is None
                self.values[key] = value
                if not (first and value in ("NONE", "FALSE")):
                    self.on_change(MetadataChange(key, value))


class _Retry(Exception):
    pass
