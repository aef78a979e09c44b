"""Stand-in for the GCE metadata server's notice keys, on a loopback port.

Serves ``/computeMetadata/v1/instance/maintenance-event`` and
``/computeMetadata/v1/instance/preempted`` as the real server does: the
``Metadata-Flavor: Google`` header is required (403 without it), an ``ETag``
comes with every answer, and ``?wait_for_change=true&last_etag=E`` blocks until
the value differs from E (or ``timeout_sec`` passes). Nothing else is served.

The harness changes a value with ``PUT /stand-in/<key>`` (body: the new value);
that path is the stand-in's own control, not part of the real API.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib

from aiohttp import web

KEYS = ("instance/maintenance-event", "instance/preempted")
DEFAULTS = {"instance/maintenance-event": "NONE", "instance/preempted": "FALSE"}


class MetadataStandIn:
    def __init__(self) -> None:
        self.values = dict(DEFAULTS)
        self.changed = asyncio.Condition()

    @staticmethod
    def etag(value: str) -> str:
        return hashlib.sha1(value.encode()).hexdigest()[:16]

    async def get(self, request: web.Request) -> web.Response:
        if request.headers.get("Metadata-Flavor") != "Google":
            return web.Response(status=403, text="Missing Metadata-Flavor:Google header.")
        key = request.match_info["key"]
        if key not in self.values:
            return web.Response(status=404, text="not found")
        if request.query.get("wait_for_change") == "true":
            last = request.query.get("last_etag", "0")
            timeout = float(request.query.get("timeout_sec", "300"))
            async with self.changed:
                try:
                    await asyncio.wait_for(self.changed.wait_for(lambda: self.etag(self.values[key]) != last), timeout)
                except TimeoutError:
                    pass
        value = self.values[key]
        return web.Response(text=value, headers={"ETag": self.etag(value), "Metadata-Flavor": "Google"})

    async def put(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        if key not in self.values:
            return web.Response(status=404, text=f"unknown key {key!r}; known: {', '.join(KEYS)}")
        value = (await request.text()).strip()
        async with self.changed:
            self.values[key] = value
            self.changed.notify_all()
        return web.Response(text=value)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/computeMetadata/v1/{key:instance/[a-z-]+}", self.get)
        app.router.add_put("/stand-in/{key:instance/[a-z-]+}", self.put)
        return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ns = ap.parse_args(argv)
    web.run_app(
        MetadataStandIn().app(), host=ns.host, port=ns.port, print=None, handle_signals=True, shutdown_timeout=1.0
    )


if __name__ == "__main__":
    main()
