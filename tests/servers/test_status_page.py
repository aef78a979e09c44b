"""The status page in a real browser: headless Chromium renders ``/`` of an in-process coordinator.

The page's HTML holds no job data; its script builds the slice boxes from
``/status``. So the test checks the DOM after the script ran (``--dump-dom``)
for what only ``/status`` knows (slice states, node names, reasons), and the
screenshot for boxes in the state colours. A missing Chromium fails the test
with the install command; it is never skipped.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import struct
import zlib
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from agent.core.model import OperatorCommand, WorkerLost
from tests.servers.conftest import Job, wait_for

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = "headless Chromium is needed: `apt-get install -y chromium` (Debian/Ubuntu) and run again"
# The page's state colours (agent/servers/page.py).
COLOURS = {"active": (0x1E, 0x8E, 0x3E), "draining": (0xE3, 0x74, 0x00), "down": (0xC5, 0x22, 0x1F)}


def browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(INSTALL_HINT)


async def chromium(tmp_path: Path, url: str, *mode: str) -> str:
    argv = [
        browser(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1200,800",
        # Let the page's fetch of /status finish before the DOM or the pixels are taken.
        "--virtual-time-budget=3000",
        *mode,
        url,
    ]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"chromium did not finish within 60 s: {argv}") from None
    assert proc.returncode == 0, f"chromium exited {proc.returncode}:\n{err.decode()[-2000:]}"
    return out.decode()


def png_pixels(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Width, height and RGB pixels of an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert header is not None
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    pixels: list[tuple[int, int, int]] = []
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        pixels.extend(tuple(line[i : i + 3]) for i in range(0, stride, bpp))  # type: ignore[misc]
        prev = line
    return width, height, pixels


async def test_the_page_renders_slices_notices_and_the_timeline_from_status(job: Job, tmp_path: Path) -> None:
    await job.running()
    job.coord.submit(OperatorCommand("drain", "bad ICI link on slice 1", slice=1))
    await wait_for(lambda: job.coord.state.active == frozenset({0, 2, 3}), 5.0, "the drain of slice 1")
    job.coord.submit(WorkerLost(3, 0, "inc-3", "stream_closed", 0.0))
    await wait_for(
        lambda: job.coord.state.active == frozenset({0, 2}) and not job.coord.state.trainer.resume_pending,
        5.0,
        "training to continue on slices 0 and 2",
    )
    url = job.http_url + "/"
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        html = await r.text()
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
        assert "connect-src 'self'" in r.headers["Content-Security-Policy"]
    # No job data in the HTML itself, and nothing loaded from elsewhere.
    assert "node-1" not in html and "data-slice=" not in html and "bad ICI link" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "the page must not load external assets"

    dom = await chromium(tmp_path, url, "--dump-dom")
    boxes = re.findall(r'<div class="slice state-(\w+)" data-slice="(\d+)" data-state="(\w+)">', dom)
    assert [(int(n), st) for _, n, st in boxes] == [(0, "active"), (1, "draining"), (2, "active"), (3, "down")], dom
    assert all(cls == st for cls, _, st in boxes)
    for text in ("node-0", "node-1", "node-2", "h0 ? (not registered)", "operator_drain from operator: bad ICI link"):
        assert text in dom, text
    assert re.search(r'<span class="phase phase-running" id="phase">running</span>', dom)
    assert "generation <b>3</b>" in dom
    # Pending notices and the recovery timeline, with the decisions' reasons.
    assert "<td>bad ICI link on slice 1</td>" in dom
    assert "operator drain: bad ICI link on slice 1; draining slice 1" in dom
    assert "host 3.0 lost (stream_closed)" in dom
    assert '<div id="error" style="display: none;"></div>' in dom, "the page reports a failed /status fetch"

    shot = tmp_path / "status.png"
    await chromium(tmp_path, url, f"--screenshot={shot}", "--hide-scrollbars")
    width, height, pixels = png_pixels(shot.read_bytes())
    assert (width, height) == (1200, 800)
    counts = Counter(pixels)
    for state, rgb in COLOURS.items():
        # A box is 150 px wide and at least 84 px high; most of it is the state colour.
        assert counts[rgb] > 5000, f"no {state} box in the screenshot ({counts[rgb]} px of {rgb})"
    assert counts[COLOURS["active"]] > 1.5 * counts[COLOURS["down"]], "two active boxes, one down"


async def test_the_page_says_when_status_is_unreachable(job: Job, tmp_path: Path) -> None:
    """The page keeps its last view and shows an error line when /status fails."""
    url = job.http_url + "/"
    await job.coord.http.stop()
    # Serve the page from a server whose /status fails.
    from aiohttp import web

    from agent.servers.page import STATUS_PAGE

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=STATUS_PAGE, content_type="text/html")

    async def broken(_: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_get("/status", broken)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001
    try:
        dom = await chromium(tmp_path, f"http://127.0.0.1:{port}/", "--dump-dom")
    finally:
        await runner.cleanup()
        job.coord.http = None
    assert '<div id="error" style="display: block;">status unavailable: HTTP 500 (retrying every second)</div>' in dom
    assert url  # the coordinator's page address was valid before it was stopped
