"""A recovery's phases reach the coordinator's journal and the admin ``events`` stream (issue 52).

The decisions are built by hand (``decide`` replaced): what is tested is that each phase the
:class:`agent.phase_clock.PhaseClock` ends at a decision is written with that decision; the clock's own
arithmetic is tests/agent/test_metrics_phases.py's.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import agent.coordinator as coordinator_module
from agent.admin_cli import render_event
from agent.config import CoordinatorConfig
from agent.coordinator import Coordinator
from agent.core.model import (
    Decision,
    HoldTrainer,
    Phase,
    Policy,
    ResumeTrainer,
    TrainerHeld,
    TrainerResumed,
    TrainerStepped,
    WorkerLost,
    initial_state,
)
from agent.servers.status import decision_event


def test_the_journal_and_the_events_stream_carry_each_phase_with_the_decision_that_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = replace(
        initial_state(Policy(num_slices=2), 0.0), phase=Phase.RUNNING, active=frozenset({0, 1}), generation=1
    )
    g2 = replace(base, generation=2)
    on_one = replace(g2, active=frozenset({0}))
    steps: list[tuple[float, Any, Any, tuple[Any, ...]]] = [
        (
            10.0,
            WorkerLost(1, 0, "a", "stream_closed", silent_seconds=0.5),
            g2,
            (HoldTrainer(2, False, frozenset({1}), ""),),
        ),
        (10.25, TrainerHeld(2, 10, -1), g2, (ResumeTrainer(2, frozenset({0}), "memory", ""),)),
        (11.25, TrainerResumed(2, 10, frozenset({0}), "memory"), on_one, ()),
        (11.5, TrainerStepped(11, 2, 0.2), on_one, ()),  # quiet, but it ends the first_step phase
        (12.0, TrainerStepped(12, 2, 0.2), on_one, ()),  # quiet: not recorded
    ]
    after = {id(ev): (state, actions) for _, ev, state, actions in steps}
    monkeypatch.setattr(
        coordinator_module,
        "decide",
        lambda before, ev, now: Decision(after[id(ev)][0], after[id(ev)][1], type(ev).__name__),
    )
    journal = tmp_path / "journal.jsonl"
    cfg = CoordinatorConfig(
        job="j",
        listen="127.0.0.1:0",
        policy=Policy(num_slices=2),
        state_file=None,
        journal=journal,
        log_level="warning",
        heartbeat_interval=0.25,
        heartbeat_timeout=1.2,
        log_format="json",
    )

    async def run() -> list[dict[str, Any]]:
        coord = Coordinator(cfg)
        coord.state = base
        q = coord.feed.subscribe()
        coord.journal.open()
        try:
            for now, ev, _, _ in steps:
                coord.apply(ev, now)
        finally:
            coord.journal.close()
        return [q.get_nowait() for _ in range(q.qsize())]

    fed = asyncio.run(run())
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    assert [x["trigger"] for x in lines] == ["WorkerLost", "TrainerHeld", "TrainerResumed", "TrainerStepped"]
    assert [x.get("phases") for x in lines] == [
        {"detect": 0.5},
        None,
        {"hold": 0.25, "wait": 0.0, "rebuild_restore": 1.0},
        {"first_step": 0.25},
    ]
    events = [decision_event(r) for r in fed]
    assert [dict(e.phases) for e in events] == [
        {"detect": 0.5},
        {},
        {"hold": 0.25, "wait": 0.0, "rebuild_restore": 1.0},
        {"first_step": 0.25},
    ]
    assert render_event(events[-1]).endswith("(first_step 0.250 s)")
