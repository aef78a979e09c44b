"""The goodput gauge counts every step a coalesced step report stands for (trainer_hooks.session
sends at most one report per 50 ms: the newest step and the mean seconds of the steps since the last)."""

from __future__ import annotations

import pytest

from agent.core.decide import decide
from agent.core.model import Policy, TrainerStepped, initial_state
from agent.metrics import Metrics


def test_a_report_of_several_steps_counts_their_seconds_once_each() -> None:
    m = Metrics()
    state = initial_state(Policy(num_slices=2), 0.0)
    seconds = []
    for ev in (TrainerStepped(4, 0, 0.5), TrainerStepped(8, 0, 0.25), TrainerStepped(9, 0, 0.1)):
        d = decide(state, ev, 1.0)
        m.observe(ev, d, state, 1.0, {})
        state = d.state
        seconds.append(m._step_seconds)  # noqa: SLF001 - the gauge's numerator
    assert seconds == pytest.approx([4 * 0.5, 4 * 0.5 + 4 * 0.25, 4 * 0.5 + 4 * 0.25 + 0.1])
