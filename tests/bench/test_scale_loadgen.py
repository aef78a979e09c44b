"""The scale benchmark's stand-in hosts set up at most ``--concurrency`` connections at once, after a
coordinator restart as at their first registration, and log what they did."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import grpc
import pytest

from bench import scale_loadgen
from protos.elastic_sidecar.v1 import peer_pb2, peer_pb2_grpc


class SlowPeer(peer_pb2_grpc.PeerServicer):
    """Answers each Join's Register after a pause, counting the Joins waiting for their answer at once."""

    def __init__(self) -> None:
        self.waiting = 0
        self.most_waiting = 0
        self.joins = 0
        self.peers: set[str] = set()
        """The client addresses (one a TCP connection) the Joins came from."""

    async def Join(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        async for msg in request_iterator:
            if msg.HasField("register"):
                self.joins += 1
                self.peers.add(context.peer())
                self.waiting += 1
                self.most_waiting = max(self.most_waiting, self.waiting)
                await asyncio.sleep(0.05)
                self.waiting -= 1
                # No datagram port: heartbeats stay on the stream.
                yield peer_pb2.CoordinatorMessage(
                    registered=peer_pb2.Registered(generation=1, heartbeat_interval_seconds=0.5, epoch=1)
                )


async def serve(peer: SlowPeer) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    peer_pb2_grpc.add_PeerServicer_to_server(peer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def serve_on(peer: SlowPeer, port: int) -> tuple[grpc.aio.Server, int]:
    """A coordinator back on the same port."""
    server = grpc.aio.server()
    peer_pb2_grpc.add_PeerServicer_to_server(peer, server)
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    await server.start()
    return server, port


def loadgen(port: int, count: int, concurrency: int, streams_per_connection: int = 1) -> scale_loadgen.LoadGen:
    ns = argparse.Namespace(
        coordinator=f"127.0.0.1:{port}",
        job="bench-scale",
        first=0,
        count=count,
        hosts_per_slice=4,
        concurrency=concurrency,
        rate=0.0,
        keepalive_ms=None,
        no_datagrams=True,
        streams_per_connection=streams_per_connection,
    )
    return scale_loadgen.LoadGen(ns)


async def wait_for(cond: Any, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("concurrency", [1, 3])
async def test_reregistrations_after_a_restart_are_capped_like_the_first(concurrency: int) -> None:
    peer = SlowPeer()
    server, port = await serve(peer)
    gen = loadgen(port, 12, concurrency)
    try:
        for w in gen.workers:
            w.start()
        await wait_for(lambda: all(w.connected for w in gen.workers))
        assert peer.most_waiting <= concurrency
        # The coordinator goes away and comes back on the same port: every stream breaks at once.
        await server.stop(None)
        await wait_for(lambda: not any(w.connected for w in gen.workers))
        peer2 = SlowPeer()
        server, _ = await serve_on(peer2, port)
        await wait_for(lambda: all(w.connected for w in gen.workers))
        assert peer2.joins == 12
        assert 1 <= peer2.most_waiting <= concurrency
        assert all(w.sessions == 2 for w in gen.workers)
        assert gen.tally["registered"] == 24
        assert sum(v for k, v in gen.tally.items() if k.startswith(("stream_ended:", "session_failed:"))) >= 12
    finally:
        for w in gen.workers:
            await w.disconnect()
        await server.stop(None)


@pytest.mark.parametrize(("share", "connections"), [(1, 12), (4, 3), (5, 3)])
async def test_hosts_share_connections_only_when_asked(share: int, connections: int) -> None:
    """With --streams-per-connection N each N neighbouring hosts' Join streams come over one TCP
    connection, before and after a coordinator restart; with 1 (the default) each host has its own."""
    peer = SlowPeer()
    server, port = await serve(peer)
    gen = loadgen(port, 12, 12, share)
    try:
        for w in gen.workers:
            w.start()
        await wait_for(lambda: all(w.connected for w in gen.workers))
        assert peer.joins == 12 and len(peer.peers) == connections, peer.peers
        await server.stop(None)
        await wait_for(lambda: not any(w.connected for w in gen.workers))
        peer2 = SlowPeer()
        server, _ = await serve_on(peer2, port)
        await wait_for(lambda: all(w.connected for w in gen.workers))
        assert peer2.joins == 12 and len(peer2.peers) == connections, peer2.peers
    finally:
        for w in gen.workers:
            await w.disconnect()
        await server.stop(None)


def test_shared_connections_ping_as_often_as_a_connection_a_host() -> None:
    one = dict(scale_loadgen.shared_channel_options(7, 1, None))
    assert one["grpc.use_local_subchannel_pool"] == 1 and scale_loadgen.CONNECTION_ARG not in one
    four = dict(scale_loadgen.shared_channel_options(7, 4, None))
    assert "grpc.use_local_subchannel_pool" not in four
    assert four[scale_loadgen.CONNECTION_ARG] == 1  # hosts 4-7 share the second connection
    assert four["grpc.keepalive_time_ms"] * 4 == one["grpc.keepalive_time_ms"]


async def test_progress_lines_say_what_the_hosts_did(capsys: pytest.CaptureFixture[str]) -> None:
    peer = SlowPeer()
    server, port = await serve(peer)
    gen = loadgen(port, 3, 3)
    progress = asyncio.create_task(gen._progress())
    try:
        for w in gen.workers:
            w.start()
        await wait_for(lambda: all(w.connected for w in gen.workers))
        await asyncio.sleep(1.2)
        lines = [json.loads(ln) for ln in capsys.readouterr().err.splitlines() if ln.startswith("{")]
        assert lines, "no progress line"
        assert sum(ln["since_last"].get("registered", 0) for ln in lines) == 3
        assert lines[-1]["connected"] == 3 and lines[-1]["first"] == 0
    finally:
        progress.cancel()
        for w in gen.workers:
            await w.disconnect()
        await server.stop(None)


async def test_registrations_wait_while_the_generators_loop_is_behind() -> None:
    peer = SlowPeer()
    server, port = await serve(peer)
    gen = loadgen(port, 2, 2)
    watch = asyncio.create_task(gen._watch_lag())
    try:
        await asyncio.sleep(0.2)
        assert gen.caught_up.is_set()
        asyncio.get_running_loop().call_soon(time.sleep, 0.4)  # a backlog: the loop runs 0.4 s late
        await asyncio.sleep(0.1)
        assert not gen.caught_up.is_set() and gen.lag_max >= 0.3
        # Caught up again only once its timers have fired on time for LAG_CALM.
        await asyncio.sleep(scale_loadgen.LAG_CALM / 2)
        assert not gen.caught_up.is_set()
        await wait_for(gen.caught_up.is_set, timeout=scale_loadgen.LAG_CALM * 4)
        # A registration, the first or a retry after a broken stream, waits until the loop keeps time.
        watch.cancel()
        gen.caught_up.clear()
        w = gen.workers[0]
        w.start()
        await asyncio.sleep(1.0)
        assert not w.connected and peer.joins == 0
        gen.caught_up.set()
        await wait_for(lambda: w.connected)
        await server.stop(None)
        await wait_for(lambda: not w.connected)
        gen.caught_up.clear()
        server, _ = await serve_on(peer, port)
        await asyncio.sleep(1.5)
        assert not w.connected and peer.joins == 1  # held back while the process is behind
        gen.caught_up.set()
        await wait_for(lambda: w.connected)
        assert peer.joins == 2
    finally:
        watch.cancel()
        for w in gen.workers:
            await w.disconnect()
        await server.stop(None)


async def test_a_session_that_fails_in_any_way_is_followed_by_a_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    peer = SlowPeer()
    server, port = await serve(peer)
    gen = loadgen(port, 1, 1)
    w = gen.workers[0]
    real = scale_loadgen.FakeWorker._session
    calls = 0

    async def flaky(self: scale_loadgen.FakeWorker) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            # What grpc.aio raises for a heartbeat written on a stream the coordinator already ended.
            raise asyncio.InvalidStateError("RPC already finished.")
        await real(self)

    monkeypatch.setattr(scale_loadgen.FakeWorker, "_session", flaky)
    try:
        w.start()
        await wait_for(lambda: w.connected)
        assert calls == 2 and gen.tally["session_failed:InvalidStateError"] == 1
    finally:
        await w.disconnect()
        await server.stop(None)


class EndingPeer(SlowPeer):
    """Answers the Register, reads the stream's heartbeats for ``keep`` seconds, then ends the stream (a
    coordinator that judged the host lost)."""

    def __init__(self, keep: float) -> None:
        super().__init__()
        self.keep = keep

    async def Join(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        first = await context.read()
        assert first.HasField("register")
        await context.write(
            peer_pb2.CoordinatorMessage(registered=peer_pb2.Registered(heartbeat_interval_seconds=0.1, epoch=1))
        )
        await asyncio.sleep(self.keep)


@pytest.mark.parametrize("keep", [1.0, 11.0])
async def test_a_session_the_coordinator_ends_soon_after_its_reply_prints_its_timeline(
    keep: float, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scale_loadgen, "SHORT_SESSION_SECONDS", 10.0 if keep <= 1 else 0.3)
    server, port = await serve(EndingPeer(min(keep, 1.0)))
    gen = loadgen(port, 1, 1)
    w = gen.workers[0]
    try:
        t0 = time.time()
        w.start()
        await wait_for(lambda: gen.tally.get("stream_ended:EOF", 0) >= 1)
        lines = [json.loads(ln) for ln in capsys.readouterr().err.splitlines() if ln.startswith("{")]
        short = [ln for ln in lines if "short_session" in ln]
        if keep > 1:  # ended after SHORT_SESSION_SECONDS: nothing printed
            assert short == []
            return
        assert len(short) == 1, lines
        s = short[0]
        assert s["short_session"] == 0 and s["why"] == "EOF" and (s["slice"], s["host"]) == (0, 0)
        # The timeline is printed rounded to 0.1 ms: a start within 50 us of t0 may print below it.
        assert t0 - 1e-4 <= s["started"] <= s["reply"] <= s["ended"], s
        # Heartbeats went out on the stream (no datagram port) every 0.1 s until the stream ended (the
        # timeline keeps the first 8).
        assert 1 <= len(s["stream_heartbeats"]) <= 8, s
        assert all(s["reply"] <= t <= s["ended"] for t in s["stream_heartbeats"]), s
        assert "datagrams_from" not in s and "confirmed" not in s
    finally:
        await w.disconnect()
        await server.stop(None)
