"""``recovery_seconds`` times recoveries, not an operator's hold (decisions built by hand, as the metrics read them)."""

from __future__ import annotations

from dataclasses import replace

from agent.core.model import (
    Decision,
    HoldTrainer,
    OperatorCommand,
    Phase,
    Policy,
    ResumeTrainer,
    State,
    TrainerHeld,
    TrainerResumed,
    WorkerLost,
    initial_state,
)
from agent.metrics import Metrics

BASE = replace(initial_state(Policy(num_slices=2), 0.0), phase=Phase.RUNNING, active=frozenset({0, 1}), generation=1)


def _feed(m: Metrics, before: State, steps: list[tuple[float, object, State, tuple[object, ...]]]) -> State:
    for now, ev, after, actions in steps:
        m.observe(ev, Decision(after, actions, ""), before, now, {})  # type: ignore[arg-type]
        before = after
    return before


def _recovery_seconds(m: Metrics) -> tuple[float | None, float | None]:
    get = m.registry.get_sample_value
    return get("elastic_sidecar_recovery_seconds_count"), get("elastic_sidecar_recovery_seconds_sum")


def test_an_operator_hold_is_not_a_recovery_but_the_failure_after_it_is() -> None:
    m = Metrics()
    held = replace(BASE, generation=2, phase=Phase.HOLDING, operator_hold=True)
    waiting = replace(held, phase=Phase.WAITING)
    resumed = replace(waiting, phase=Phase.RUNNING, operator_hold=False)
    everything = frozenset({0, 1})
    state = _feed(
        m,
        BASE,
        [
            (10.0, OperatorCommand("hold", "upgrade"), held, (HoldTrainer(2, True, frozenset(), ""),)),
            (11.0, TrainerHeld(2, 5, 5), waiting, ()),
            (600.0, OperatorCommand("resume", "done"), resumed, (ResumeTrainer(2, everything, "memory", ""),)),
            (601.0, TrainerResumed(2, 5, everything, "memory"), resumed, ()),
        ],
    )
    assert _recovery_seconds(m) == (0.0, 0.0)
    lost = replace(state, generation=3, phase=Phase.HOLDING, active=frozenset({0}), retries_used=1)
    _feed(
        m,
        state,
        [
            (700.0, WorkerLost(1, 0, "a", "stream_closed"), lost, (HoldTrainer(3, False, frozenset({1}), ""),)),
            (702.5, TrainerResumed(3, 5, frozenset({0}), "memory"), replace(lost, phase=Phase.RUNNING), ()),
        ],
    )
    assert _recovery_seconds(m) == (1.0, 2.5)
