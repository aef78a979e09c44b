"""Worker commands onto their streams: paced, in order, after the datagram copies (agent.executors)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from agent import constants as C
from agent import executors
from agent.coordinator import Coordinator
from agent.core.model import TellWorkers
from agent.links import Link
from protos.elastic_sidecar.v1 import peer_pb2
from tests.agent.coordinators import in_memory_coordinator


def _coordinator(workers: int) -> Coordinator:
    coord = in_memory_coordinator("stream-copies", workers, log_level="error")
    for s in range(workers):
        coord.workers[(s, 0)] = Link()
    return coord


def _kinds(conn: Link) -> list[str]:
    out = []
    while not conn.outbox.empty():
        msg = conn.outbox.get_nowait()
        out.append(msg.command.kind)
    return out


async def test_stream_copies_are_queued_a_pass_at_a_time_and_in_order() -> None:
    n = executors.STREAM_COPIES_PER_PASS * 3 + 7
    coord = _coordinator(n)
    conns = list(coord.workers.values())
    closed = conns[5]
    closed.closed.set()
    copier = asyncio.create_task(coord.to_workers.copy_to_streams())  # noqa: SLF001
    try:
        coord._execute(TellWorkers(4, "hold", "slice 1 lost"))  # noqa: SLF001
        coord._execute(TellWorkers(4, "resume", "slice 1 back"))  # noqa: SLF001
        assert all(c.outbox.empty() for c in conns)  # nothing on a stream before the loop runs
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        queued = sum(c.outbox.qsize() for c in conns)
        # One pass queued at most a pass's worth (the copier may have started its second).
        assert 0 < queued <= 2 * executors.STREAM_COPIES_PER_PASS
        for _ in range(50):
            if not coord.to_workers.stream_copies:  # noqa: SLF001
                break
            await asyncio.sleep(0)
        assert not coord.to_workers.stream_copies  # noqa: SLF001
        for c in conns:
            # Every open stream got the hold before the resume; a closed one got nothing.
            assert _kinds(c) == ([] if c is closed else ["hold", "resume"])
    finally:
        copier.cancel()


async def test_a_worker_without_datagrams_still_gets_the_stream_copy() -> None:
    coord = _coordinator(2)
    copier = asyncio.create_task(coord.to_workers.copy_to_streams())  # noqa: SLF001
    try:
        coord._execute(TellWorkers(2, "abort", "retries used up"))  # noqa: SLF001
        for _ in range(10):
            await asyncio.sleep(0)
        for c in coord.workers.values():
            msg = c.outbox.get_nowait()
            assert msg == peer_pb2.CoordinatorMessage(
                command=peer_pb2.PeerCommand(generation=2, kind="abort", reason="retries used up", epoch=coord.epoch)
            )
        # Neither had a heartbeat datagram: no datagram was sent.
        assert coord.metrics.command_datagrams.labels("sent")._value.get() == 0  # noqa: SLF001
    finally:
        copier.cancel()


async def test_only_workers_that_do_not_acknowledge_the_datagram_get_the_stream_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(C, "COMMAND_ACK_SECONDS", 0.2)
    coord = _coordinator(3)
    conns = list(coord.workers.values())
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as worker_sock,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as coord_sock,
    ):
        worker_sock.bind(("127.0.0.1", 0))
        coord_sock.setblocking(False)
        # Workers 0 and 1 heartbeat by datagram; worker 2 only on its stream.
        for c in conns[:2]:
            c.reply = (coord_sock, worker_sock.getsockname())
        copier = asyncio.create_task(coord.to_workers.copy_to_streams())  # noqa: SLF001
        try:
            coord._execute(TellWorkers(6, "hold", "slice 1 lost"))  # noqa: SLF001
            for _ in range(10):
                await asyncio.sleep(0)
            # The one without datagrams has its stream copy at once; the others wait for their acknowledgement.
            assert [c.outbox.qsize() for c in conns] == [0, 0, 1]
            conns[0].acked = (6, C.COMMAND_ORDER["hold"])  # worker 0 acknowledged it; worker 1 did not
            await asyncio.sleep(0.3)
            for _ in range(10):
                await asyncio.sleep(0)
            assert [c.outbox.qsize() for c in conns] == [0, 1, 1]
            m = coord.metrics.command_datagrams
            assert m.labels("sent")._value.get() == 2  # noqa: SLF001
            assert m.labels("unacknowledged")._value.get() == 1  # noqa: SLF001
            # Acknowledging this command, or a later one of its generation, spares the stream copy.
            conns[1].acked = (6, C.COMMAND_ORDER["resume"])
            coord._execute(TellWorkers(6, "hold", "again"))  # noqa: SLF001
            await asyncio.sleep(0.3)
            for _ in range(10):
                await asyncio.sleep(0)
            assert [c.outbox.qsize() for c in conns] == [0, 1, 2]
        finally:
            copier.cancel()


def test_heartbeats_the_kernel_dropped_restart_liveness_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropped heartbeats prove no silence: nobody is judged lost for them (as after a loop stall)."""
    coord = _coordinator(2)
    conns = list(coord.workers.values())
    drops = [0]
    monkeypatch.setattr(coord.datagrams, "dropped", lambda: drops[0])
    for c in conns:
        c.last_seen = 100.0
    coord.loop_watch.resumed_at = 100.0  # noqa: SLF001
    coord.loop_watch.note_datagram_drops(101.0)  # noqa: SLF001
    assert coord.loop_watch.resumed_at == 100.0  # nothing dropped: nothing changes  # noqa: SLF001
    drops[0] = 37
    coord.loop_watch.note_datagram_drops(101.5)  # noqa: SLF001
    coord.peers.check_liveness(102.0)
    assert not any(c.closed.is_set() for c in conns)  # silent 2 s, but their heartbeats may have been dropped
    assert coord.metrics.heartbeat_datagrams.labels("dropped")._value.get() == 37  # noqa: SLF001
    coord.loop_watch.note_datagram_drops(103.0)  # noqa: SLF001  no new drops
    coord.peers.check_liveness(103.0)
    assert all(c.cause == "heartbeat_timeout" for c in conns)  # 1.5 s since the drops: now they are late
