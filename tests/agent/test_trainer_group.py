"""The trainer group: N trainer process links presented to the core as one trainer (no gRPC here)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.model import (
    TrainerAttached,
    TrainerDetached,
    TrainerFinished,
    TrainerFlushed,
    TrainerHeld,
    TrainerResumed,
    TrainerSliceError,
    TrainerStepped,
)
from agent.trainer_group import TrainerGroup


def whole(n: int = 3, step: int = -1) -> TrainerGroup:
    g = TrainerGroup(n)
    for i in range(n - 1):
        assert g.attached(i, TrainerAttached(0, step), f"host-{i}") == []
    (ev,) = g.attached(n - 1, TrainerAttached(0, step), f"host-{n - 1}")
    assert isinstance(ev, TrainerAttached)
    return g


def test_one_process_passes_everything_through_and_holds_name_no_step() -> None:
    g = TrainerGroup(1)
    a = TrainerAttached(3, 7, frozenset({0}))
    assert g.attached(0, a) == [a]
    s = TrainerStepped(8, 3, 0.1)
    assert g.message(0, s) == [s]
    h = TrainerHeld(4, 8, 8)
    assert g.message(0, h) == [h]
    assert g.detached(0) == [TrainerDetached()]
    assert g.hold_step(4) == 0


def test_hello_is_checked_against_the_configured_process_count() -> None:
    g = TrainerGroup(4)
    assert g.check_hello(3, 4) == ""
    assert "--trainer-processes 4" in g.check_hello(0, 1)
    assert "outside" in g.check_hello(4, 4)
    assert "--trainer-processes 1" in TrainerGroup(1).check_hello(0, 4)
    assert TrainerGroup(1).check_hello(0, 0) == ""  # an older trainer that does not say


def test_attached_only_once_every_process_is_and_detached_when_any_goes() -> None:
    g = TrainerGroup(3)
    assert g.attached(0, TrainerAttached(0, -1)) == []
    assert g.attached(0, TrainerAttached(0, -1)) == []  # the same process again is not a second one
    assert g.attached(2, TrainerAttached(0, -1)) == []
    (ev,) = g.attached(1, TrainerAttached(0, -1))
    assert ev == TrainerAttached(0, -1, frozenset(), None, -1, False)
    assert g.detached(1) == [TrainerDetached()]
    assert g.detached(0) == []  # already told
    assert g.attached(1, TrainerAttached(0, 5)) == []
    (again,) = g.attached(0, TrainerAttached(0, 5))
    assert isinstance(again, TrainerAttached)


def test_aggregate_attach_takes_the_newest_generation_and_the_lowest_step() -> None:
    g = TrainerGroup(2)
    g.attached(0, TrainerAttached(4, 20, frozenset({0, 1}), committed_step=20, held=True))
    (ev,) = g.attached(1, TrainerAttached(5, 21, frozenset({0, 1}), committed_step=10, held=True))
    assert (ev.generation, ev.step_in_memory, ev.committed_step, ev.held) == (5, 20, 10, True)


def test_a_step_counts_once_every_process_completed_it() -> None:
    g = whole(2)
    assert g.message(0, TrainerStepped(1, 1, 0.1)) == []
    assert g.message(1, TrainerStepped(1, 1, 0.1)) == [TrainerStepped(1, 1, 0.1)]
    assert g.message(1, TrainerStepped(2, 1, 0.1)) == []


def test_held_only_when_every_process_held_at_the_same_step() -> None:
    g = whole(3)
    assert g.message(0, TrainerHeld(2, 10, 10, 0.2, 100)) == []
    assert g.message(1, TrainerHeld(2, 10, 10, 0.5, 100)) == []
    (ev,) = g.message(2, TrainerHeld(2, 10, 9, 0.3, 100, flush_error="disk full"))
    assert isinstance(ev, TrainerHeld) and not ev.disagreement
    assert (ev.step, ev.committed_step, ev.flush_seconds, ev.flush_bytes) == (10, 9, 0.5, 300)
    assert ev.flush_error == "process 2: disk full"


def test_held_at_different_steps_is_reported_as_a_disagreement() -> None:
    g = whole(2)
    g.message(0, TrainerHeld(2, 10, 10))
    (ev,) = g.message(1, TrainerHeld(2, 11, 11))
    assert ev.disagreement == "process 0 at step 10, process 1 at step 11"


def test_an_older_hold_acknowledgement_does_not_count_towards_a_newer_hold() -> None:
    g = whole(2)
    g.message(0, TrainerHeld(3, 10, 10))
    assert g.message(1, TrainerHeld(2, 9, 9)) == []
    (ev,) = g.message(1, TrainerHeld(3, 10, 10))
    assert ev.generation == 3


def test_committed_only_when_every_process_committed() -> None:
    g = whole(2)
    assert g.message(0, TrainerFlushed(1, 50)) == []
    (ev,) = g.message(1, TrainerFlushed(1, 50))
    assert ev.committed_step == 50 and not ev.flush_error
    (err,) = g.message(0, TrainerFlushed(1, 50, flush_error="ENOSPC"))
    assert err.flush_error == "process 0: ENOSPC" and err.committed_step == 50


def test_resumed_and_finished_wait_for_every_process() -> None:
    g = whole(2)
    assert g.message(1, TrainerResumed(2, 10, frozenset({0, 1}), "memory")) == []
    (ev,) = g.message(0, TrainerResumed(2, 10, frozenset({0, 1}), "memory"))
    assert ev == TrainerResumed(2, 10, frozenset({0, 1}), "memory")
    assert g.message(0, TrainerFinished(100)) == []
    assert g.message(1, TrainerFinished(100)) == [TrainerFinished(100)]


def test_slice_errors_pass_through() -> None:
    g = whole(2)
    e = TrainerSliceError(frozenset({1}), "DATA_LOSS", 5, 1)
    assert g.message(1, e) == [e]


def test_hold_step_is_above_the_highest_report_by_a_margin_and_stable_per_generation() -> None:
    g = whole(2)
    for s in range(1, 21):
        g.message(0, TrainerStepped(s, 1, 0.1))
    g.message(1, TrainerStepped(18, 1, 0.1))
    at = g.hold_step(5)
    # 0.5 s of 0.1 s steps: 5 steps past the highest report (20).
    assert at == 25
    g.message(0, TrainerStepped(23, 1, 0.1))
    assert g.hold_step(5) == 25  # a repeated hold names the same step
    assert g.hold_step(6) == 28


def test_hold_step_of_slow_steps_is_the_minimum_margin() -> None:
    g = whole(2)
    g.message(0, TrainerStepped(7, 1, 3.0))
    g.message(1, TrainerStepped(7, 1, 3.0))
    assert g.hold_step(2) == 7 + 2


def test_hold_step_of_processes_all_held_is_where_they_are() -> None:
    g = whole(2)
    g.message(0, TrainerHeld(2, 10, 10))
    g.message(1, TrainerHeld(2, 10, 10))
    assert g.hold_step(3) == 10


# --- property: any interleaving of the processes' acknowledgements -------------------------


@settings(deadline=None)
@given(
    n=st.integers(2, 6),
    data=st.data(),
)
def test_a_hold_completes_once_all_acknowledged_in_any_order_and_flags_any_split(n: int, data: st.DataObject) -> None:
    g = whole(n)
    steps = data.draw(st.lists(st.integers(5, 8), min_size=n, max_size=n), label="held steps")
    order = data.draw(st.permutations(range(n)), label="arrival order")
    stale = data.draw(st.lists(st.sampled_from(range(n)), max_size=3), label="stale acks")
    out = []
    for i in stale:  # acknowledgements of an older hold, interleaved first
        out += g.message(i, TrainerHeld(1, 3, 3))
    for k, i in enumerate(order):
        ev = g.message(i, TrainerHeld(2, steps[i], steps[i]))
        if k < n - 1:
            assert ev == [] or all(e.generation == 1 for e in ev), "told the core before every process held"
        out += [e for e in ev if e.generation == 2]
    held = [e for e in out if isinstance(e, TrainerHeld) and e.generation == 2]
    assert len(held) == 1
    (h,) = held
    assert h.step == min(steps) and h.committed_step == min(steps)
    assert bool(h.disagreement) == (len(set(steps)) > 1)
