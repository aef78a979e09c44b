"""``auto``: the snapshot interval chosen from measured slot times (pure; no JAX, no clock).

A simulated loop feeds :class:`SnapshotInterval` the slot times a job would
show: a baseline step, plus the cost of a snapshot spread over the slots
after its save (the save call itself, then the copy slowing the following
steps). The interval it settles on must keep the overhead within the budget,
and not be needlessly sparse.
"""

from __future__ import annotations

import math

import pytest

from trainer_hooks.maxtext.interval import BUDGET, PROBE_EVERY, TARGET, SnapshotInterval


def simulate(
    iv: SnapshotInterval, steps: int, step_s: float, cost: list[float], measure_from: int | None = None
) -> tuple[list[int], float]:
    """Run ``steps`` boundaries; ``cost[i]``: extra seconds in the i-th slot after a save (0: the save's own).

    Returns the save steps and the measured overhead fraction from step ``measure_from`` on (default: the
    last half of the run)."""
    saves: list[int] = []
    pending: list[float] = []
    total = base = 0.0
    for step in range(steps):
        saved = iv.due(step)
        if saved:
            saves.append(step)
            pending = list(cost)
        extra = pending.pop(0) if pending else 0.0
        slot = step_s + extra
        if step >= (steps // 2 if measure_from is None else measure_from):
            total, base = total + slot, base + step_s
        iv.slot(slot, saved=saved)
    return saves, total / base - 1


@pytest.mark.parametrize(
    ("step_s", "cost"),
    [
        (1.0, [0.3]),  # a save that costs 30% of its step, all in the step after it
        (0.05, [0.02, 0.01, 0.01, 0.01]),  # the copy slows four steps after the save
        (2.0, [0.001]),  # a TPU-like step: a save every step is within budget
    ],
)
def test_auto_settles_on_an_interval_within_the_budget(step_s: float, cost: list[float]) -> None:
    iv = SnapshotInterval(-1)
    saves, overhead = simulate(iv, 3000, step_s, cost)
    per_snapshot = sum(cost) / step_s
    smallest = max(1, math.ceil(per_snapshot / BUDGET))
    assert overhead <= BUDGET + 1e-9, (iv.current, overhead)
    assert smallest <= iv.current <= 2 * smallest + 1, (iv.current, smallest)
    assert iv.last_fraction is not None and iv.baseline == pytest.approx(step_s)
    assert saves, "auto must snapshot"


def test_the_probe_round_goes_straight_to_the_interval_a_costly_snapshot_asks_for() -> None:
    # The tiny MaxText model here: a 25 ms step, a snapshot costing about 64 ms of the steps its copy
    # runs beside. Started from one step and grown at most 4 times a round, the interval was still 64
    # about 300 steps in; a checkpoint period of 1,000 steps measured its steady overhead over those.
    step_s, cost = 0.025, [0.03, 0.015, 0.01, 0.009]
    smallest = math.ceil(sum(cost) / step_s / BUDGET)
    iv = SnapshotInterval(-1)
    assert iv.current == PROBE_EVERY
    probed = 3 + 8 + 3 * PROBE_EVERY + 2  # warm-up, baseline, the probe round's three windows (no copy runs on)
    simulate(iv, probed, step_s, cost)
    assert smallest <= iv.current <= 2 * smallest + 1, (iv.current, smallest)
    # The recovery benchmark's steady window starts 100 steps past the warm-up.
    _, overhead = simulate(iv, 1100 - probed, step_s, cost, measure_from=100 - probed)
    assert overhead <= TARGET, iv.current


def test_auto_measures_after_a_warm_up_and_a_baseline_without_snapshots() -> None:
    iv = SnapshotInterval(-1)
    saves, _ = simulate(iv, 40, 1.0, [0.0])
    assert saves[0] >= 3 + 8, "no snapshot before the warm-up and the baseline"
    iv.new_attempt()  # a new mesh: measured again
    assert iv.baseline is None and not iv.due(100)


def test_slots_with_a_hold_or_a_checkpoint_are_not_counted() -> None:
    # Every tenth slot takes 5 s (MaxText's periodic checkpoint) but is marked not counted:
    # the interval stays where the snapshots' own cost puts it.
    excluded = {s for s in range(3000) if s % 10 == 7}
    iv = SnapshotInterval(-1)
    for step in range(3000):
        saved = iv.due(step)
        extra = 5.0 if step in excluded else (0.01 if saved else 0.0)
        iv.slot(1.0 + extra, saved=saved, counted=step not in excluded)
    assert iv.current == 1, iv.current


@pytest.mark.parametrize("every", [0, 1, 7])
def test_a_fixed_interval_is_kept(every: int) -> None:
    iv = SnapshotInterval(every)
    saves, _ = simulate(iv, 50, 1.0, [10.0])
    assert saves == ([s for s in range(1, 50) if s % every == 0] if every else [])
    assert iv.current == every


def test_a_save_skipped_because_the_copy_still_runs_doubles_the_interval() -> None:
    iv = SnapshotInterval(-1)
    simulate(iv, 12, 1.0, [0.0])  # warm-up and baseline done
    before = iv.current
    assert iv.skipped() == 2 * before
    assert SnapshotInterval(5).skipped() is None, "a fixed interval is the operator's"


def test_a_drifting_step_time_is_not_read_as_the_snapshots_cost() -> None:
    # The step time drifts up and, for 40 steps in every 300, runs 30% slower (other work on the
    # host); a snapshot costs 0.3 of a step in the step after it. The interval must stay near what
    # the snapshot's cost alone asks for (15 to 31 steps), not jump with the host's load.
    iv = SnapshotInterval(-1)
    chosen = []
    for step in range(6000):
        step_s = (1.0 + 0.00005 * step) * (1.3 if step % 300 >= 260 else 1.0)
        saved = iv.due(step)
        changed = iv.slot(step_s + (0.3 if saved else 0.0), saved=saved)
        if changed is not None:
            chosen.append(changed)
    assert 15 <= iv.current <= 31, chosen
    assert max(chosen) <= 62, chosen


def test_the_hooks_own_cost_leaves_the_snapshots_the_rest_of_the_budget() -> None:
    cost = [0.75 * BUDGET]  # a snapshot costs three quarters of the budget: within it at every step
    free = SnapshotInterval(-1)
    simulate(free, 3000, 1.0, cost)
    assert free.current == 1
    shared = SnapshotInterval(-1)
    shared.fixed = 0.5 * BUDGET  # the hook's own bookkeeping: half the budget, at every step
    assert shared.snapshot_budget == pytest.approx(0.5 * BUDGET)
    _, overhead = simulate(shared, 3000, 1.0, cost)
    assert shared.current >= 2 and overhead <= 0.5 * BUDGET + 1e-9
    assert SnapshotInterval(-1, fixed=0.5).snapshot_budget == BUDGET / 4  # never nothing left


def test_a_snapshot_that_costs_nothing_goes_to_every_step_after_the_probe() -> None:
    # A small state (the demo's): a copy costs a thousandth of its step, so the probe round's
    # measurement allows a snapshot every step at once, not after halving every other round.
    iv = SnapshotInterval(-1)
    probed = 3 + 8 + 3 * PROBE_EVERY + 2
    simulate(iv, probed, 0.05, [0.00005])
    assert iv.current == 1, iv.current


def test_snapshots_stop_when_the_interval_they_need_reaches_the_checkpoint_period() -> None:
    # The example trainer's benchmark state: 1 GiB copied in 0.165 s against a 56 ms step asks for
    # about 200 steps; with a checkpoint every 50, a snapshot would cost the budget for nothing.
    iv = SnapshotInterval(-1, ceiling=50)
    saves, _ = simulate(iv, 600, 0.0564, [0.165])
    assert iv.off and iv.current == 0 and not iv.due(iv.ceiling), iv.current
    assert len(saves) == 3, "the probe round's three snapshots, then none"
    iv.new_attempt()  # a new mesh: still off (the cost per step does not shrink with fewer slices)
    more, _ = simulate(iv, 600, 0.05, [0.165])
    assert more == [] and iv.current == 0
    # Without a checkpoint period, or with one the interval stays below, snapshots go on.
    for ceiling in (0, 1000):
        kept = SnapshotInterval(-1, ceiling=ceiling)
        saves, overhead = simulate(kept, 3000, 0.0564, [0.165])
        assert not kept.off and kept.current < 1000 and len(saves) > 3 and overhead <= BUDGET + 1e-9


def test_a_skipped_save_that_doubles_the_interval_to_the_checkpoint_period_stops_snapshots() -> None:
    iv = SnapshotInterval(-1, ceiling=2 * PROBE_EVERY)
    simulate(iv, 12, 1.0, [0.0])  # warm-up and baseline done
    assert iv.skipped() == 0 and iv.off and not iv.due(100)


def test_a_fixed_interval_ignores_the_checkpoint_period() -> None:
    iv = SnapshotInterval(1, ceiling=5)
    saves, _ = simulate(iv, 20, 1.0, [10.0])
    assert saves == list(range(1, 20)) and not iv.off
