"""``recovery_phase_seconds{phase}``: a loss, the recovery on fewer slices and the grow back, as the
coordinator's decisions show them (decisions built by hand: the phases read only states and actions)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.core.model import (
    Decision,
    HoldTrainer,
    Phase,
    Policy,
    ResumeTrainer,
    State,
    TrainerHeld,
    TrainerResumed,
    TrainerStepped,
    WorkerLost,
    initial_state,
)
from agent.metrics import Metrics
from agent.phase_clock import PhaseClock

BASE = replace(initial_state(Policy(num_slices=2), 0.0), phase=Phase.RUNNING, active=frozenset({0, 1}), generation=1)


def _feed(m: Metrics, steps: list[tuple[float, object, State, tuple[object, ...]]]) -> None:
    before, clock = BASE, PhaseClock()
    for now, ev, after, actions in steps:
        m.recovery_phases.observe(clock.observe(ev, Decision(after, actions, ""), before, now))  # type: ignore[arg-type]
        before = after


def _observed(m: Metrics) -> dict[str, tuple[float, float]]:
    """phase -> (count, sum) of the histogram."""
    out: dict[str, list[float]] = {}
    for metric in m.registry.collect():
        if metric.name != "elastic_sidecar_recovery_phase_seconds":
            continue
        for s in metric.samples:
            if s.name.endswith("_count") or s.name.endswith("_sum"):
                out.setdefault(s.labels["phase"], [0.0, 0.0])[s.name.endswith("_sum")] = s.value
    return {k: (v[0], v[1]) for k, v in out.items()}


def test_a_loss_and_its_grow_back_are_observed_phase_by_phase() -> None:
    m = Metrics()
    g2 = replace(BASE, generation=2)
    on_one = replace(g2, active=frozenset({0}))
    g3 = replace(on_one, generation=3)
    on_two = replace(g3, active=frozenset({0, 1}))
    hold2 = HoldTrainer(2, False, frozenset({1}), "")
    hold3 = HoldTrainer(3, False, frozenset(), "")
    _feed(
        m,
        [
            (10.0, WorkerLost(1, 0, "a", "stream_closed", silent_seconds=0.5), g2, (hold2,)),
            (10.25, TrainerHeld(2, 10, -1), g2, (ResumeTrainer(2, frozenset({0}), "memory", ""),)),
            (11.25, TrainerResumed(2, 10, frozenset({0}), "memory"), on_one, ()),
            (11.5, TrainerStepped(11, 2, 0.2), on_one, ()),
            (20.0, TrainerStepped(30, 2, 0.2), g3, (hold3,)),
            (20.5, TrainerHeld(3, 30, -1), g3, ()),
            (21.0, TrainerStepped(30, 3, 0.2), g3, (ResumeTrainer(3, frozenset({0, 1}), "memory", ""),)),
            (23.0, TrainerResumed(3, 30, frozenset({0, 1}), "memory"), on_two, ()),
            (23.25, TrainerStepped(31, 3, 0.2), on_two, ()),
        ],
    )
    seen = _observed(m)
    expected = {
        "detect": 0.5,
        "hold": 0.25,
        "wait": 0.0,
        "rebuild_restore": 1.0,
        "first_step": 0.25,
        "degraded": 8.5,
        "grow_hold": 0.5,
        "grow_wait": 0.5,
        "grow_rebuild_restore": 2.0,
        "grow_first_step": 0.25,
    }
    assert set(seen) == set(expected)
    for phase, seconds in expected.items():
        assert seen[phase] == (1.0, pytest.approx(seconds)), phase


def test_the_first_resume_of_the_job_is_not_a_recovery() -> None:
    m = Metrics()
    _feed(
        m,
        [
            (1.0, TrainerResumed(1, 0, frozenset({0, 1}), "fresh"), BASE, ()),
            (2.0, TrainerStepped(1, 1, 0.5), BASE, ()),
        ],
    )
    assert _observed(m) == {}
