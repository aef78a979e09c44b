"""A worker gone while its registration reply is written is a stream that ended, not a host kept forever.

grpc.aio cancels a server handler when its client goes away, at whatever the handler awaits then.
The coordinator registered the worker (``workers`` and the core's hosts) before writing its reply,
and only the code after the write ended a registration: a worker cancelled during that write
stayed registered, unwatched, and the core counted its host as up until a replacement took its
place. Seen with real clients that register and cancel at once (2 of 100 registrations); forced
here: the reply's write waits until the client has cancelled.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from agent.core.model import WorkerLost
from agent.sources.peers import PeerService
from protos.elastic_sidecar.v1 import peer_pb2, peer_pb2_grpc
from tests.agent.coordinators import in_memory_coordinator


class ReplyWaitsForCancel:
    """grpc's servicer context, whose registration reply is written only after ``cancelled``."""

    def __init__(self, context: grpc.aio.ServicerContext, writing: asyncio.Event) -> None:
        self._context = context
        self._writing = writing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def write(self, message: peer_pb2.CoordinatorMessage) -> None:
        if message.HasField("registered"):
            self._writing.set()
            while not self._context.cancelled():  # grpc cancels this handler here once the client has gone
                await asyncio.sleep(0.01)
        await self._context.write(message)


async def test_a_worker_cancelled_during_its_registration_reply_is_not_left_registered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writing = asyncio.Event()
    join = PeerService.Join

    async def slow_reply_join(self: PeerService, requests: Any, context: grpc.aio.ServicerContext) -> None:
        await join(self, requests, ReplyWaitsForCancel(context, writing))  # type: ignore[arg-type]

    monkeypatch.setattr(PeerService, "Join", slow_reply_join)
    coord = in_memory_coordinator("reply-cancelled", 2)
    decided: list[Any] = []
    decide = coord.submit

    def submit(event: Any) -> None:
        decided.append(event)
        decide(event)

    coord.submit = submit  # type: ignore[method-assign]
    await coord.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{coord.port}") as ch:
            call = peer_pb2_grpc.PeerStub(ch).Join()
            ident = peer_pb2.HostIdentity(slice=1, host=0, incarnation="w-1")
            await call.write(peer_pb2.WorkerMessage(register=peer_pb2.Register(identity=ident, job="reply-cancelled")))
            await asyncio.wait_for(writing.wait(), 10)
            assert (1, 0) in coord.workers  # registered, its reply being written
            call.cancel()
        for _ in range(200):
            if not coord.workers and any(isinstance(e, WorkerLost) for e in decided):
                break
            await asyncio.sleep(0.05)
        assert coord.workers == {}, "the cancelled registration is still in the coordinator's workers"
        lost = [e for e in decided if isinstance(e, WorkerLost)]
        assert [(e.slice, e.host) for e in lost] == [(1, 0)]
        for _ in range(100):
            if (1, 0) not in coord.state.hosts:
                break
            await asyncio.sleep(0.05)
        assert (1, 0) not in coord.state.hosts
    finally:
        await coord.stop(grace=0.1)
