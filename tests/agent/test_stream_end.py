"""How the coordinator classifies a worker stream that ended by itself (agent.sources.peers): the
host's Pathways worker is probed first, also for a worker silent before the break (a paused or cut
off sidecar on a healthy host is no loss), except with a TCP check, which a hung host's kernel
still answers for its stopped processes. Silence the coordinator's own stall or dropped heartbeat
datagrams can explain is no evidence of a hang. Every result names the registration it is about."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agent.coordinator import Coordinator
from agent.core.model import WorkerAway, WorkerLost
from agent.links import Link
from protos.elastic_sidecar.v1 import peer_pb2
from tests.agent.coordinators import in_memory_coordinator


def coordinator() -> Coordinator:
    return in_memory_coordinator("stream-end", 2)


async def ended(
    coord: Coordinator, silent: float, stalled_ago: float | None, check: str = "grpc", answers: bool = True
) -> tuple[list[Any], list[Any]]:
    """Run _ended for a stream that closed after ``silent`` s without a message; the coordinator's
    loop resumed from a stall ``stalled_ago`` s ago (None: never stalled). (events submitted, probes)"""
    submitted: list[Any] = []
    probes: list[Any] = []

    async def probe_host(key: Any, conn: Any, peer: str, *, silent: bool = False) -> tuple[bool, str]:
        probes.append((key, silent))  # silent: one check only (the host was silent already)
        return (True, "SERVING") if answers else (False, "DEADLINE_EXCEEDED")

    async def watch_away(key: Any, conn: Any, peer: str) -> None:
        return None

    coord.submit = submitted.append  # type: ignore[method-assign]
    coord.peers.probe_host = probe_host  # type: ignore[method-assign]
    coord.peers.watch_away = watch_away  # type: ignore[method-assign]
    now = time.monotonic()
    if stalled_ago is not None:
        coord.loop_watch.resumed_at = now - stalled_ago  # noqa: SLF001
    conn = Link(incarnation="inc-1", health_address="127.0.0.1:1", health_check=check, registration=4)
    conn.last_seen = now - silent
    ident = peer_pb2.HostIdentity(slice=1, host=0, incarnation="inc-1")
    await coord.peers._ended(ident, conn, "stream_closed", "ipv4:127.0.0.1:5555")  # noqa: SLF001
    return submitted, probes


async def test_a_stream_that_breaks_while_the_worker_talks_is_probed_first() -> None:
    submitted, probes = await ended(coordinator(), silent=0.05, stalled_ago=None)
    assert probes == [((1, 0), False)]
    assert [type(e) for e in submitted] == [WorkerAway]


async def test_a_silent_worker_whose_host_answers_is_away_not_lost() -> None:
    # A paused or partitioned sidecar: silent, its stream ended, its Pathways worker healthy.
    submitted, probes = await ended(coordinator(), silent=3.0, stalled_ago=None)
    assert probes == [((1, 0), True)]
    assert [type(e) for e in submitted] == [WorkerAway]
    assert submitted[0].registration == 4 and "heartbeat_timeout" in submitted[0].detail


async def test_a_silent_worker_whose_host_does_not_answer_is_lost_as_hung() -> None:
    submitted, probes = await ended(coordinator(), silent=3.0, stalled_ago=None, answers=False)
    assert probes == [((1, 0), True)]
    assert len(submitted) == 1 and isinstance(submitted[0], WorkerLost)
    assert submitted[0].cause == "heartbeat_timeout" and submitted[0].registration == 4


async def test_a_silent_worker_checked_only_by_tcp_is_lost_as_hung_without_a_probe() -> None:
    submitted, probes = await ended(coordinator(), silent=3.0, stalled_ago=None, check="tcp")
    assert probes == []
    assert len(submitted) == 1 and isinstance(submitted[0], WorkerLost)
    assert submitted[0].cause == "heartbeat_timeout"


@pytest.mark.parametrize("stalled_ago", [0.1, 0.4])
async def test_silence_while_the_coordinator_stalled_is_not_taken_for_a_hang(stalled_ago: float) -> None:
    # Silent 3 s, but the coordinator's loop only resumed (or the kernel last dropped its heartbeat
    # datagrams) moments ago: it could not have heard the worker, so the host is probed.
    submitted, probes = await ended(coordinator(), silent=3.0, stalled_ago=stalled_ago)
    assert probes == [((1, 0), False)]
    assert [type(e) for e in submitted] == [WorkerAway]
