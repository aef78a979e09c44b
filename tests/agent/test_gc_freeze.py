"""The coordinator freezes the collector's objects as workers register, and collects them once a
quarter of the frozen workers have left (agent.gc_freeze)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from agent.gc_freeze import FREEZE_EVERY_REGISTRATIONS, GcFreezer
from protos.elastic_sidecar.v1 import peer_pb2, peer_pb2_grpc
from tests.agent.coordinators import in_memory_coordinator


class Recorder:
    """Stands in for the gc module: records the calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def collect(self, generation: int = 2) -> int:
        self.calls.append(f"collect({generation})")
        return 0

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_registrations_are_frozen_every_so_many_after_a_young_collection() -> None:
    rec = Recorder()
    f = GcFreezer(every=4, gc_module=rec)
    for _ in range(3):
        f.registered()
    assert f.tick(3) is None and rec.calls == []
    f.registered()
    assert f.tick(4) == "freeze"
    assert rec.calls == ["collect(1)", "freeze"]  # the young generations' garbage first, then freeze
    assert f.tick(4) is None and f.freezes == 1


def test_a_quarter_of_the_frozen_workers_gone_and_quiet_unfreezes_collects_all_and_freezes_again() -> None:
    rec, clock = Recorder(), Clock()
    f = GcFreezer(every=4, quiet=5.0, gc_module=rec, clock=clock)
    for _ in range(100):
        f.registered()
    assert f.tick(100) == "freeze"
    rec.calls.clear()
    for _ in range(24):
        f.ended()
    clock.now += 60
    assert f.tick(76) is None and rec.calls == []  # quiet, but not a quarter
    f.ended()
    clock.now += 4.9
    assert f.tick(75) is None and rec.calls == []  # a quarter, but a stream ended 4.9 s ago
    clock.now += 0.1
    assert f.tick(75) == "collect"
    assert rec.calls == ["unfreeze", "collect(2)", "freeze"]
    rec.calls.clear()
    # The count starts again from the 75 frozen now.
    for _ in range(18):
        f.ended()
    clock.now += 5
    assert f.tick(57) is None
    f.ended()
    clock.now += 5
    assert f.tick(56) == "collect"


def test_streams_that_never_stop_ending_are_collected_after_as_many_as_were_frozen() -> None:
    rec, clock = Recorder(), Clock()
    f = GcFreezer(every=8, quiet=5.0, gc_module=rec, clock=clock)
    for _ in range(8):
        f.registered()
    assert f.tick(8) == "freeze"
    for i in range(8):  # a stream ends every second, and another starts: never quiet
        clock.now += 1
        f.ended()
        f.registered()
        assert f.tick(8) == ("collect" if i == 7 else None)


def test_nothing_is_collected_for_ends_before_anything_was_frozen() -> None:
    rec = Recorder()
    f = GcFreezer(every=4, gc_module=rec)
    for _ in range(3):
        f.registered()
        f.ended()
    assert f.tick(0) is None and rec.calls == []


def test_off_leaves_the_collector_alone() -> None:
    rec = Recorder()
    f = GcFreezer(enabled=False, every=1, gc_module=rec)
    for _ in range(10):
        f.registered()
    assert f.tick(10) is None and rec.calls == []


def test_a_bad_interval_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="every=0"):
        GcFreezer(every=0)


def test_the_shipped_interval() -> None:
    assert FREEZE_EVERY_REGISTRATIONS == 256


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def unfrozen_after() -> Iterator[None]:
    yield
    gc.unfreeze()


def test_with_the_real_collector_frozen_cycles_wait_for_the_quarter(unfrozen_after: None) -> None:
    f = GcFreezer(every=1, quiet=0.0)
    kept = Cycle()
    ref = weakref.ref(kept)
    f.registered()
    assert f.tick(4) == "freeze"
    assert gc.get_freeze_count() > 0
    del kept
    gc.collect()
    assert ref() is not None, "a frozen cycle is left to the collector, which skips frozen objects"
    f.ended()
    assert f.tick(3) == "collect"  # 1 of 4 frozen workers gone: a quarter
    assert ref() is None, "unfrozen and collected"
    assert gc.get_freeze_count() > 0, "frozen again"


async def test_the_coordinator_counts_real_registrations_and_ends() -> None:
    coord = in_memory_coordinator("gc-freeze", 16)
    assert coord.gc_freezer.enabled  # --gc-freeze defaults to on
    rec = Recorder()
    coord.gc_freezer = GcFreezer(every=8, quiet=0.5, gc_module=rec)
    await coord.start()
    calls: list[Any] = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{coord.port}") as ch:
            for s in range(10):
                call = peer_pb2_grpc.PeerStub(ch).Join()
                ident = peer_pb2.HostIdentity(slice=s, host=0, incarnation=f"w-{s}")
                await call.write(peer_pb2.WorkerMessage(register=peer_pb2.Register(identity=ident, job="gc-freeze")))
                assert (await call.read()).HasField("registered")
                calls.append(call)
            for _ in range(100):
                if "freeze" in rec.calls:
                    break
                await asyncio.sleep(0.05)
            assert rec.calls == ["collect(1)", "freeze"]
            for call in calls[:3]:  # 3 of the 10 frozen: past a quarter
                call.cancel()
            for _ in range(100):
                if "unfreeze" in rec.calls:
                    break
                await asyncio.sleep(0.05)
            assert rec.calls[2:] == ["unfreeze", "collect(2)", "freeze"]
            for call in calls[3:]:
                call.cancel()
    finally:
        await coord.stop(grace=0.1)
