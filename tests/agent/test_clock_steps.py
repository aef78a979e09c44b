"""State-file times survive a wall clock stepped across a coordinator restart, and what is
written is restored (the "away" mark of a host whose sidecar was away)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from agent.core.decide import decide
from agent.core.model import HostRecord, Phase, Policy, State, Tick, WorkerJoined, _frozen, initial_state
from agent.durable import statefile

POLICY = Policy(num_slices=3, elastic_min_slice_count=2, settle_seconds=1.0, rejoin_grace_seconds=10.0)


def running_state(now: float) -> State:
    """Running on slices 0 and 1; slice 2 was lost 30 s ago; host 1.0's sidecar is away."""
    hosts = {
        (0, 0): HostRecord("a0", "n0", registered_at=now - 100, healthy_since=now - 100, settled=True),
        (1, 0): HostRecord("a1", "n1", registered_at=now - 100, healthy_since=now - 100, settled=True, away_since=now),
    }
    return replace(
        initial_state(POLICY, now),
        phase=Phase.RUNNING,
        generation=3,
        active=frozenset({0, 1}),
        hosts=_frozen(hosts),
        slice_errors=_frozen({2: now - 30}),
        lost_incarnations=_frozen({(2, 0): "a2"}),
        retries_used=1,
        deadline=None,
    )


@pytest.mark.parametrize("step", [-3600.0, 3600.0, 0.0])
def test_times_keep_their_order_and_stay_in_the_past_across_a_clock_step(
    step: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.monotonic()
    snap = statefile.snapshot(running_state(now), epoch=5)
    real = time.time
    monkeypatch.setattr(statefile.time, "time", lambda: real() + step)  # the clock stepped before the restore
    later = time.monotonic()
    r = statefile.restore(snap, initial_state(POLICY, later), later)
    st = r.state
    reg = st.hosts[(0, 0)].registered_at
    mark = st.slice_errors[2]
    assert reg <= later and mark <= later, "a restored time lies in the future"
    assert later - reg <= 100 + statefile.MAX_DOWNTIME_SECONDS + 1
    assert mark - reg == pytest.approx(70.0, abs=0.01)  # distances between recorded times are exact
    # The away mark written is restored.
    assert st.hosts[(1, 0)].away_since is not None and st.hosts[(0, 0)].away_since is None


@pytest.mark.parametrize("step", [-3600.0, 3600.0])
def test_a_job_restored_across_a_clock_step_is_repaired_by_a_replacement_and_keeps_running(
    step: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.monotonic()
    snap = statefile.snapshot(running_state(now), epoch=5)
    real = time.time
    monkeypatch.setattr(statefile.time, "time", lambda: real() + step)
    t = time.monotonic()
    st = statefile.restore(snap, initial_state(POLICY, t), t).state
    for ev in (WorkerJoined(0, 0, "a0", "n0"), WorkerJoined(1, 0, "a1-new", "n1"), WorkerJoined(2, 0, "b2", "n2")):
        d = decide(st, ev, t)
        st = d.state
        assert st.phase == Phase.RUNNING, d.reason
    # The new sidecar of the away host is no loss; the replacement of slice 2 repairs it once settled.
    assert st.retries_used == 1 and 1 in st.up_slices()
    d = decide(st, Tick(), t + 1.5)
    assert 2 in d.state.up_slices() and d.state.phase == Phase.RUNNING  # (the trainer has yet to re-attach)
    assert d.state.retries_used == 1
