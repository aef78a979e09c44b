"""A stall's warning says how much of it was Python's garbage collector: at 19,000 workers in the scale
benchmark the coordinator's event loop stalled 0.5-1.1 s during registration, all of it in full collections."""

from __future__ import annotations

import gc
import time

import pytest

from agent.gc_freeze import GcClock
from tests.agent.coordinators import in_memory_coordinator


def _cycles(n: int) -> None:
    for _ in range(n):
        a: dict[str, object] = {}
        a["self"] = a  # garbage only a collection frees


def test_the_clock_times_the_collections_it_was_installed_for() -> None:
    clock = GcClock()
    clock.install()
    try:
        clock.install()  # once only
        assert gc.callbacks.count(clock) == 1
        before = time.monotonic()
        _cycles(100_000)
        gc.collect(2)
        ended = [(end, d, gen) for end, d, gen in clock.recent if end >= before]
        assert ended and ended[-1][2] == 2 and ended[-1][1] > 0
        assert clock.seconds_since(before) >= ended[-1][1]
        assert clock.seconds_since(time.monotonic()) == 0
    finally:
        clock.uninstall()
    assert clock not in gc.callbacks
    n = len(clock.recent)
    gc.collect()
    assert len(clock.recent) == n  # uninstalled: no longer called


def test_a_stall_warning_names_the_collectors_share(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.loop_watch as loop_watch_module

    said: list[tuple[str, dict[str, object]]] = []
    monkeypatch.setattr(loop_watch_module.log, "warning", lambda msg, **kw: said.append((msg, kw)))
    coord = in_memory_coordinator("gc-clock", 1)
    coord.loop_watch.gc_clock.install()
    try:
        t0 = time.monotonic()
        _cycles(100_000)
        gc.collect(2)
        lag = time.monotonic() - t0 + 0.01
        coord.loop_watch.note_stall(lag, time.monotonic())
    finally:
        coord.loop_watch.gc_clock.uninstall()
    (warning,) = [kw for msg, kw in said if msg.startswith("event loop was blocked")]
    assert warning["stall_seconds"] == round(lag, 3)
    assert 0 < float(warning["gc_seconds"]) <= float(warning["stall_seconds"]) + 0.001  # type: ignore[arg-type]
