"""The metadata-server watcher against the stand-in metadata server (real HTTP on loopback)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web

from agent.sources.metadata import MAINTENANCE_KEY, PREEMPTED_KEY, MetadataChange, MetadataWatcher
from standins.metadata_server import MetadataStandIn


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def _until(pred, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_long_poll_reports_changes_fast_and_not_the_initial_clear_values() -> None:
    standin = MetadataStandIn()
    runner, base = await _serve(standin.app())
    seen: list[tuple[float, MetadataChange]] = []
    watcher = MetadataWatcher(f"{base}/computeMetadata/v1", lambda c: seen.append((time.monotonic(), c)))
    task = asyncio.create_task(watcher.run())
    try:
        await _until(lambda: watcher.values[MAINTENANCE_KEY] == "NONE" and watcher.values[PREEMPTED_KEY] == "FALSE")
        assert seen == [], "the initial NONE/FALSE is not a notice"
        async with aiohttp.ClientSession() as s:
            t0 = time.monotonic()
            await s.put(f"{base}/stand-in/{MAINTENANCE_KEY}", data="TERMINATE_ON_HOST_MAINTENANCE")
            await _until(lambda: len(seen) == 1)
            assert seen[0][1] == MetadataChange(MAINTENANCE_KEY, "TERMINATE_ON_HOST_MAINTENANCE")
            latency = seen[0][0] - t0
            print(f"metadata change seen after {latency * 1000:.1f} ms")
            assert latency < 0.5
            await s.put(f"{base}/stand-in/{PREEMPTED_KEY}", data="TRUE")
            await _until(lambda: len(seen) == 2)
            assert seen[1][1] == MetadataChange(PREEMPTED_KEY, "TRUE")
            await s.put(f"{base}/stand-in/{MAINTENANCE_KEY}", data="NONE")
            await _until(lambda: len(seen) == 3)
            assert seen[2][1].value == "NONE", "a clear after a notice is reported"
    finally:
        task.cancel()
        await runner.cleanup()


async def test_non_200_and_unreachable_mean_unknown_not_clear() -> None:
    status = {"code": 200, "value": "TERMINATE_ON_HOST_MAINTENANCE"}

    async def handler(request: web.Request) -> web.Response:
        assert request.headers.get("Metadata-Flavor") == "Google"
        if status["code"] != 200:
            return web.Response(status=status["code"], text="boom")
        if request.query.get("last_etag") == status["value"]:
            await asyncio.sleep(0.2)
        return web.Response(text=status["value"], headers={"ETag": status["value"]})

    app = web.Application()
    app.router.add_get("/v1/{key:.*}", handler)
    runner, base = await _serve(app)
    seen: list[MetadataChange] = []
    watcher = MetadataWatcher(f"{base}/v1", seen.append, keys=(MAINTENANCE_KEY,), backoff_max=0.1)
    task = asyncio.create_task(watcher.run())
    try:
        await _until(lambda: len(seen) == 1)
        status["code"] = 503
        await _until(lambda: watcher.errors >= 2)
        assert watcher.values[MAINTENANCE_KEY] == "TERMINATE_ON_HOST_MAINTENANCE"
        assert len(seen) == 1, "a failing metadata server must not clear the notice"
    finally:
        task.cancel()
        await runner.cleanup()


async def test_standin_requires_the_metadata_flavor_header() -> None:
    runner, base = await _serve(MetadataStandIn().app())
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/computeMetadata/v1/{MAINTENANCE_KEY}") as r:
                assert r.status == 403
            async with s.get(
                f"{base}/computeMetadata/v1/{MAINTENANCE_KEY}", headers={"Metadata-Flavor": "Google"}
            ) as r:
                assert r.status == 200 and (await r.text()) == "NONE" and r.headers["ETag"]
            async with s.put(f"{base}/stand-in/instance/bogus", data="x") as r:
                assert r.status == 404
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("bad", ["", "not a url"])
def test_watcher_keeps_a_configured_base(bad: str) -> None:
    w = MetadataWatcher(bad + "/", lambda c: None)
    assert not w.base_url.endswith("/")
