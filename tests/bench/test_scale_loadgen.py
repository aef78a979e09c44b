"""The scale benchmark's stand-in hosts set up at most ``--concurrency`` connections at once, after a
coordinator restart as at their first registration, share connections only when asked, and register
only while their process keeps time."""

from __future__ import annotations

import argparse
import asyncio
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
    one = dict(scale_loadgen.shared_channel_options(7, 1))
    assert one["grpc.use_local_subchannel_pool"] == 1 and scale_loadgen.CONNECTION_ARG not in one
    four = dict(scale_loadgen.shared_channel_options(7, 4))
    assert "grpc.use_local_subchannel_pool" not in four
    assert four[scale_loadgen.CONNECTION_ARG] == 1  # hosts 4-7 share the second connection
    assert four["grpc.keepalive_time_ms"] * 4 == one["grpc.keepalive_time_ms"]


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
        assert not gen.caught_up.is_set()
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
        assert calls == 2
    finally:
        await w.disconnect()
        await server.stop(None)
