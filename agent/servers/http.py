"""HTTP endpoints of a sidecar (aiohttp), on ``--http-listen`` (port 29312).

==============  ===========================================================
``/healthz``    200 while the process's event loop answers (liveness)
``/readyz``     200 when the role's dependencies are up, else 503; JSON
                ``{"ready": bool, "checks": {name: bool}}`` says which,
                and ``"reasons": {name: text}`` why a failing one fails
``/metrics``    Prometheus text format of the sidecar's registry
``/status``     JSON: what the admin API's GetStatus returns, plus
                ``recent_decisions`` (newest last) for the timeline
``/``           a self-contained status page that polls ``/status``
==============  ===========================================================

Readiness by role:

* coordinator: its gRPC server serves, it is not fenced, its decisions are
  durable (``state_durable``: false while the state file cannot be written, a
  hung write included), its decision loop decides (``deciding``), and, once
  training has started, the trainer link is attached. Not the Pub/Sub intake
  (notices are an optimisation). It does *not* wait for worker sidecars: the
  head pod starts first, and JobSet's ``startupPolicyOrder: InOrder`` waits
  for it to be ready.
* worker: registered with the coordinator.

Nothing here is authenticated: it reports, it never changes the job. Keep it
off public networks (the manifests expose it to the cluster for Prometheus
and kubelet probes only).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from agent import log as logmod
from agent.servers.page import STATUS_PAGE

log = logmod.get("http")


class _NotHttp1(logging.Filter):
    """Bytes that are not an HTTP/1 request (most often a gRPC client given this port: HTTP/2's
    preface) are the client's mistake: one WARNING line saying so, not an ERROR with aiohttp's traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = (
                "refused a request that is not HTTP/1 (a gRPC client given the HTTP port? the admin API is on "
                "--admin-listen, workers register on the coordinator's --listen): %s"
            )
            record.args = ((str(exc.message or exc).strip().splitlines() or [""])[0][:200],)
            record.exc_info = None
            record.exc_text = None
        return True


_server_log = logging.getLogger("aiohttp.server.elastic_sidecar")
_server_log.addFilter(_NotHttp1())

Checks = dict[str, bool]
Reasons = dict[str, str]

IDLE_TIMEOUT_SECONDS = 75.0
"""How long a connection may sit without a complete request before it is closed: idle between requests, or
silent in the middle of one (a half-sent request would otherwise hold its socket for ever). aiohttp's
``keepalive_timeout`` (passed through ``web.AppRunner``'s keyword arguments to its ``RequestHandler``, "number
of seconds before closing an idle keep-alive connection") does both: from aiohttp 3.14 the timer is armed
when the connection opens and is not put back by bytes of an unfinished request (aio-libs/aiohttp#13681).
Longer than a Prometheus scrape interval of a minute, so that scrapes keep reusing their connection."""


@dataclass
class HttpServer:
    runner: web.AppRunner
    port: int
    address: str

    async def stop(self) -> None:
        await self.runner.cleanup()


def build_app(
    *,
    status: Callable[[], dict[str, Any]],
    ready: Callable[[], Checks],
    registry: CollectorRegistry,
    reasons: Callable[[], Reasons] | None = None,
) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        checks = ready()
        ok = all(checks.values())
        body: dict[str, Any] = {"ready": ok, "checks": checks}
        if not ok and reasons is not None:
            why = reasons()
            failing = {k: why[k] for k, passed in checks.items() if not passed and why.get(k)}
            if failing:
                body["reasons"] = failing
        return web.json_response(body, status=200 if ok else 503)

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def status_json(_: web.Request) -> web.Response:
        return web.json_response(status(), dumps=lambda d: json.dumps(d, default=str))

    async def page(_: web.Request) -> web.Response:
        return web.Response(
            text=STATUS_PAGE,
            content_type="text/html",
            headers={"Cache-Control": "no-store", "Content-Security-Policy": _CSP},
        )

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/status", status_json)
    app.router.add_get("/", page)
    return app


# The page loads nothing from elsewhere: inline script and style, data from this origin only.
_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'"


async def start_http_server(
    listen: str,
    *,
    status: Callable[[], dict[str, Any]],
    ready: Callable[[], Checks],
    registry: CollectorRegistry,
    reasons: Callable[[], Reasons] | None = None,
    idle_timeout: float = IDLE_TIMEOUT_SECONDS,
) -> HttpServer:
    """Serve on ``listen``; OSError when the address cannot be bound (fatal at start-up, as for the admin API)."""
    app = build_app(status=status, ready=ready, registry=registry, reasons=reasons)
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, logger=_server_log, keepalive_timeout=idle_timeout
    )
    await runner.setup()
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    site = web.TCPSite(runner, host, int(port), reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise OSError(f"HTTP server: could not listen on {listen} (--http-listen): {e.strerror or e}") from None
    bound = int(runner.addresses[0][1])  # the real port when listen asked for :0
    addr = f"{listen.rpartition(':')[0]}:{bound}"
    log.info("HTTP server listening", address=addr, endpoints=["/healthz", "/readyz", "/metrics", "/status", "/"])
    return HttpServer(runner, bound, addr)
