"""A registration the coordinator refuses before the Register is written is reported, not retried.

Seen in CI: the peer-token interceptor aborts ``Join`` with UNAUTHENTICATED without reading the
request, so the call can end before the worker's first ``write``. grpc.aio then raises
``asyncio.InvalidStateError`` ("RPC already finished"), which the worker took for a lost link and
retried once before reading the refusal. The race is forced here: the write waits until the
call has ended.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agent.auth import BearerAuthInterceptor, BearerToken
from agent.worker import _write_or_raise_status
from protos.elastic_sidecar.v1 import peer_pb2, peer_pb2_grpc


@pytest.fixture
async def refusing_port():
    server = grpc.aio.server(
        interceptors=[BearerAuthInterceptor(BearerToken("right", "test"), ["elastic_sidecar.v1.Peer"], label="peer")]
    )
    peer_pb2_grpc.add_PeerServicer_to_server(peer_pb2_grpc.PeerServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield port
    await server.stop(None)


async def test_a_write_on_a_call_already_refused_raises_the_refusal(refusing_port: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{refusing_port}") as ch:
        call = peer_pb2_grpc.PeerStub(ch).Join(metadata=BearerToken("wrong", "test").metadata())
        assert await asyncio.wait_for(call.code(), 10.0) == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(asyncio.InvalidStateError):  # what grpc.aio does on its own
            await call.write(peer_pb2.WorkerMessage())
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _write_or_raise_status(call, peer_pb2.WorkerMessage())
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "token does not match" in (refused.value.details() or "")


async def test_a_write_on_a_live_call_still_goes_out(refusing_port: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{refusing_port}") as ch:
        call = peer_pb2_grpc.PeerStub(ch).Join(metadata=BearerToken("right", "test").metadata())
        await _write_or_raise_status(call, peer_pb2.WorkerMessage())  # no error: the call is open
        # The base servicer answers UNIMPLEMENTED once it runs: the write did reach a live call.
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(call.read(), 10.0)
        assert ended.value.code() == grpc.StatusCode.UNIMPLEMENTED
