"""The decision core under the coordinator's own failures and membership edge cases.

Each test pins one defect that was seen before the write-ahead/fencing work:
it fails on the old rules and passes on the new ones.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.core.model import (
    HoldTrainer,
    OperatorCommand,
    Phase,
    Policy,
    ResumeTrainer,
    Tick,
    TrainerAttached,
    TrainerDetached,
    TrainerHeld,
    TrainerResumed,
    TrainerSettings,
    TrainerSliceError,
    TrainerStepped,
    WorkerAway,
    WorkerHealth,
    WorkerJoined,
    WorkerLost,
    initial_state,
)
from tests.core.driver import Job as _Job


class Job(_Job):
    """Membership tests start with five timed steps, so the hang rule has a median."""

    def start(self) -> None:  # type: ignore[override]
        super().start(timed_steps=5)


def holds(d) -> list[HoldTrainer]:  # noqa: ANN001
    return [a for a in d.actions if isinstance(a, HoldTrainer)]


def resumes(d) -> list[ResumeTrainer]:  # noqa: ANN001
    return [a for a in d.actions if isinstance(a, ResumeTrainer)]


def test_a_lost_slice_comes_back_only_after_its_new_incarnation_settles() -> None:
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, settle_seconds=2.0))
    job.start()
    job.feed(TrainerHeld(holds(job.feed(WorkerLost(2, 0, "a2.0", "stream_closed"), dt=1))[0].generation, 5, -1))
    job.feed(TrainerResumed(job.state.generation, 5, frozenset({0, 1}), "memory"))
    d = job.feed(WorkerJoined(2, 0, "b2.0"), dt=1)
    assert not holds(d) and 2 not in d.state.up_slices()  # registered, not settled
    assert not holds(job.feed(Tick(), dt=1.5))
    assert holds(job.feed(Tick(), dt=0.6))  # settled: grow


def test_the_same_process_back_from_a_loss_repairs_once_healthy_for_the_settle_time() -> None:
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, settle_seconds=2.0))
    job.start()
    job.feed(TrainerHeld(holds(job.feed(WorkerLost(2, 0, "a2.0", "heartbeat_timeout"), dt=1))[0].generation, 5, -1))
    job.feed(TrainerResumed(job.state.generation, 5, frozenset({0, 1}), "memory"))
    d = job.feed(WorkerJoined(2, 0, "a2.0"), dt=1)  # the hung process woke up
    assert 2 not in d.state.up_slices() and not holds(d)  # not yet: it has to stay healthy first
    assert not holds(job.feed(Tick(), dt=1.0))
    d = job.feed(Tick(), dt=1.1)
    assert holds(d) and d.state.retries_used == 1  # grows back; a grow spends no retry


def test_a_flapping_host_coming_back_repairs_nothing_only_a_new_incarnation_does() -> None:
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, settle_seconds=0.0, flap_losses=2))
    job.start()
    for _ in range(2):
        d = job.feed(WorkerLost(2, 0, "a2.0", "heartbeat_timeout"), dt=1)
        if holds(d):
            job.feed(TrainerHeld(holds(d)[0].generation, 5, -1))
            job.feed(TrainerResumed(job.state.generation, 5, job.state.active, "memory"))
        d = job.feed(WorkerJoined(2, 0, "a2.0"), dt=1)
        if holds(d):  # the first return is a repair: grow back
            job.feed(TrainerHeld(holds(d)[0].generation, 6, -1))
            job.feed(TrainerResumed(job.state.generation, 6, job.state.active, "memory"))
    # Lost twice within the window: the same process back again repairs nothing.
    assert 2 not in job.state.up_slices() and "flapping" in d.reason
    assert not holds(job.feed(Tick(), dt=5))
    assert 2 in job.feed(WorkerJoined(2, 0, "b2.0"), dt=1).state.up_slices()  # a new incarnation does


def test_an_observation_about_an_older_registration_never_touches_the_newer_one() -> None:
    # The coordinator stalled: the worker re-registered (registration 7) before the old stream's
    # (registration 3) end and its probe result were decided.
    job = Job(Policy(num_slices=2, settle_seconds=0.0))
    job.start()
    job.feed(WorkerJoined(1, 0, "a1.0", registration=7), dt=1)
    before = job.state
    for stale in (
        WorkerAway(1, 0, "a1.0", "stream_closed; SERVING", registration=3),
        WorkerLost(1, 0, "a1.0", "sidecar_gone", registration=3),
        WorkerHealth(1, 0, "a1.0", False, "old stream", registration=3),
    ):
        d = job.feed(stale, dt=1)
        assert d.actions == () and "ignored" in d.reason
        assert d.state.hosts == before.hosts and d.state.retries_used == 0
    # The current registration's own observations still count.
    d = job.feed(WorkerLost(1, 0, "a1.0", "stream_closed", registration=7), dt=1)
    assert d.state.phase == Phase.HOLDING and d.state.retries_used == 1


def test_a_paused_sidecar_on_a_healthy_host_comes_back_with_no_hold_and_no_retry() -> None:
    job = Job(Policy(num_slices=2, settle_seconds=1.0))
    job.start()
    job.feed(WorkerJoined(1, 0, "a1.0", registration=2), dt=1)
    d = job.feed(WorkerAway(1, 0, "a1.0", "heartbeat_timeout; SERVING", registration=2), dt=1)
    assert not holds(d) and 1 in d.state.up_slices()
    d = job.feed(WorkerJoined(1, 0, "a1.0", registration=5), dt=3)  # SIGCONT: the same process re-registers
    assert not holds(d) and d.state.hosts[(1, 0)].away_since is None and d.state.retries_used == 0
    assert d.state.phase == Phase.RUNNING and d.state.active == frozenset({0, 1})


def test_a_new_incarnation_over_a_live_record_is_a_second_sidecar_not_a_loss() -> None:
    # Issue 56: this was "the loss of the old one", and two sidecars for one host spent a retry per swap.
    # A replacement after a real loss comes after a WorkerLost (the coordinator checks the old host).
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, settle_seconds=1.0))
    job.start()
    d = job.feed(WorkerJoined(1, 0, "b1.0"), dt=1)  # the old stream never closed here
    assert not holds(d) and d.state.retries_used == 0 and d.state.up_slices() == frozenset({0, 1, 2})
    assert d.state.hosts[(1, 0)].incarnation == "b1.0" and "second sidecar" in d.reason


def test_a_sidecar_restart_on_a_healthy_host_neither_shrinks_nor_spends_a_retry() -> None:
    job = Job(Policy(num_slices=2, settle_seconds=1.0))
    job.start()
    before = job.state
    d = job.feed(WorkerAway(1, 0, "a1.0", "stream_closed; 127.0.0.1:1 SERVING"), dt=1)
    assert d.actions == () and d.state.up_slices() == before.up_slices()
    d = job.feed(WorkerJoined(1, 0, "c1.0"), dt=2)
    assert d.actions == () and d.state.retries_used == 0 and d.state.phase == Phase.RUNNING
    assert 1 in d.state.up_slices() and d.state.hosts[(1, 0)].away_since is None
    # and a host whose sidecar is away and then is found dead is an ordinary loss
    job.feed(WorkerAway(0, 0, "a0.0"), dt=1)
    assert holds(job.feed(WorkerLost(0, 0, "a0.0", "sidecar_gone_host_down"), dt=0.25))


def test_a_stream_blip_of_the_same_process_is_neither_loss_nor_repair() -> None:
    job = Job(Policy(num_slices=2))
    job.start()
    job.feed(WorkerAway(0, 0, "a0.0"), dt=1)
    d = job.feed(WorkerJoined(0, 0, "a0.0"), dt=0.1)
    assert d.actions == () and d.state.hosts[(0, 0)].registered_at == 0.0


def test_the_policy_cannot_be_rewritten_after_start() -> None:
    job = Job(Policy(num_slices=2, elastic_max_retries=10))
    job.start()
    job.feed(TrainerDetached(), dt=1)
    d = job.feed(TrainerAttached(1, 5, frozenset({0, 1}), TrainerSettings(1, 5.0, 1)), dt=1)
    assert d.state.policy.elastic_max_retries == 10 and "refused the trainer's settings" in d.reason


def test_a_hung_trainer_is_held_then_failed_by_the_policy() -> None:
    job = Job(Policy(num_slices=2, hang_min_seconds=10.0, hang_step_factor=20.0, elastic_timeout_seconds=30))
    job.start()
    assert not holds(job.feed(Tick(), dt=9.0))
    d = job.feed(Tick(), dt=2.0)  # 11 s without a step; median 0.5 s -> limit max(10, 10)
    (hold,) = holds(d)
    assert hold.flush and "suspected hang" in d.reason and d.state.retries_used == 1
    assert job.feed(Tick(), dt=30 + 600).state.phase == Phase.FAILED


def test_a_trainer_gone_for_good_fails_the_job() -> None:
    job = Job(Policy(num_slices=2, start_timeout_seconds=60, elastic_timeout_seconds=30))
    job.start()
    job.feed(TrainerDetached(), dt=1)
    assert job.feed(Tick(), dt=59).state.phase == Phase.RUNNING
    d = job.feed(Tick(), dt=1.5)
    assert d.state.phase == Phase.FAILED and d.state.exit_code == 42


def test_a_frozen_trainer_whose_link_dropped_is_judged_by_the_hang_rule_not_the_start_timeout() -> None:
    policy = Policy(num_slices=2, hang_min_seconds=10.0, start_timeout_seconds=600, elastic_timeout_seconds=30)
    job = Job(policy)
    job.start()
    job.feed(TrainerDetached(), dt=4.0)  # keepalives unanswered: the link drops 4 s after the last step
    assert not holds(job.feed(Tick(), dt=9.0))  # 9 s since the link dropped: within the reattach window
    d = job.feed(Tick(), dt=2.0)
    (hold,) = holds(d)
    assert hold.flush and "link has been gone for 11 s" in d.reason and "suspected hang" in d.reason, d.reason
    assert d.state.phase == Phase.HOLDING and d.state.retries_used == 1
    # The hold waits for it no longer than the link's own limit (not the hold's 30 + 600 s).
    assert job.feed(Tick(), dt=600 - 11 - 1.0).state.phase == Phase.HOLDING
    d = job.feed(Tick(), dt=1.5)
    assert d.state.phase == Phase.FAILED and "link has been gone" in d.reason and d.state.exit_code == 42


def test_a_trainer_link_back_within_the_reattach_window_costs_nothing() -> None:
    job = Job(Policy(num_slices=2, hang_min_seconds=10.0))
    job.start()
    job.feed(TrainerDetached(), dt=1.0)
    job.feed(TrainerAttached(job.state.generation, 5, frozenset({0, 1})), dt=8.0)
    job.feed(TrainerStepped(6, job.state.generation, 0.5), dt=0.5)
    assert not holds(job.feed(Tick(), dt=5.0)) and job.state.retries_used == 0
    assert job.state.phase == Phase.RUNNING


def test_a_second_loss_while_held_without_flush_flushes() -> None:
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, settle_seconds=0.0))
    job.start()
    d = job.feed(WorkerLost(2, 0, "a2.0", "stream_closed"), dt=1)
    (first,) = holds(d)
    assert not first.flush
    d = job.feed(WorkerLost(1, 0, "a1.0", "stream_closed"), dt=0.01)  # before the trainer held
    (second,) = holds(d)
    assert second.flush and second.down_slices == frozenset({1, 2})
    # and in WAITING too: held without flush on 2 slices of 3 with min 2, a resume pending...
    job2 = Job(Policy(num_slices=3, elastic_min_slice_count=3, settle_seconds=0.0))
    job2.start()
    job2.feed(OperatorCommand("hold", "look"), dt=1)
    job2.state = replace(job2.state, hold_flush=False)
    job2.feed(TrainerHeld(job2.state.generation, 5, -1), dt=0.1)
    d = job2.feed(WorkerLost(0, 0, "a0.0", "stream_closed"), dt=1)
    (h,) = holds(d)
    assert h.flush


def test_restored_waiting_gives_the_rejoin_grace_and_repeats_a_pending_resume() -> None:
    p = Policy(num_slices=2, rejoin_grace_seconds=5.0, settle_seconds=0.0)
    job = Job(p)
    job.start()
    # As agent/durable/statefile.restore leaves it: RUNNING with a resume decided and
    # not acknowledged, every host expected back.
    job.state = replace(
        job.state,
        trainer=replace(job.state.trainer, attached=False, resume_pending=True),
        expected_rejoin=frozenset(job.state.hosts),
        rejoin_deadline=job.now + 5.0,
    )
    d = job.feed(TrainerAttached(job.state.generation, 5, job.state.active, held=True), dt=0.5)
    # nobody has rejoined yet, but the restored records count: no one is judged during the grace
    assert d.state.phase == Phase.RUNNING and not holds(d)
    job.feed(WorkerJoined(0, 0, "a0.0"), dt=0.5)
    d = job.feed(Tick(), dt=5)  # grace over: host 1.0 never came back
    assert holds(d) and 1 in holds(d)[0].down_slices


def test_a_reregistration_storm_keeps_the_grace_open_and_who_never_returns_is_lost_after_the_last() -> None:
    """The grace counts from the newest re-registration: a restarted coordinator working through
    thousands of reconnections does not judge the hosts it has not read yet."""
    p = Policy(num_slices=4, hosts_per_slice=3, rejoin_grace_seconds=5.0, settle_seconds=0.0)
    job = Job(p)
    job.start()
    restored_at = job.now
    job.state = replace(
        job.state,
        trainer=replace(job.state.trainer, attached=False),
        expected_rejoin=frozenset(job.state.hosts),
        rejoin_deadline=restored_at + 5.0,
    )
    back = [k for k in sorted(job.state.hosts) if k != (3, 2)]
    for s, h in back:  # one every 2 s: 22 s in all, four times the grace
        d = job.feed(WorkerJoined(s, h, f"a{s}.{h}"), dt=2.0)
        assert not holds(d) and d.state.retries_used == 0, d.reason
        assert not holds(job.feed(Tick(), dt=0.1))
    assert job.now - restored_at > 4 * p.rejoin_grace_seconds
    last = job.now - 0.1
    d = job.feed(Tick(), dt=last + 4.9 - job.now)
    assert not holds(d) and d.state.expected_rejoin == frozenset({(3, 2)})
    d = job.feed(Tick(), dt=0.2)  # 5.1 s after the last one came back
    assert "did not rejoin within the grace" in d.reason
    assert holds(d) and holds(d)[0].down_slices == frozenset({3}) and d.state.retries_used == 1


def test_in_a_wait_the_sliding_grace_never_outlasts_the_phase_deadline() -> None:
    p = Policy(num_slices=2, rejoin_grace_seconds=5.0, settle_seconds=0.0)
    job = Job(p)
    job.start()
    t0 = job.now
    job.state = replace(
        job.state,
        phase=Phase.WAITING,
        deadline=t0 + 3.0,
        expected_rejoin=frozenset(job.state.hosts),
        rejoin_deadline=t0 + 2.0,
    )
    d = job.feed(WorkerJoined(0, 0, "a0.0"), dt=1.0)
    assert d.state.rejoin_deadline == pytest.approx(t0 + 3.0)  # not t0 + 1 + 5


def test_a_pending_resume_goes_out_again_once_the_trainer_says_it_is_held() -> None:
    job = Job(Policy(num_slices=2, settle_seconds=0.0))
    job.start()
    job.feed(OperatorCommand("hold", "look"), dt=1)
    job.feed(TrainerHeld(job.state.generation, 5, 5), dt=0.1)
    d = job.feed(OperatorCommand("resume", "go"), dt=1)
    (r,) = resumes(d)
    # the coordinator restarted before the resume left: the trainer re-attaches, held
    job.feed(TrainerDetached(), dt=0.1)
    d = job.feed(TrainerAttached(r.generation, 5, frozenset({0, 1}), held=True), dt=0.1)
    assert [a.generation for a in resumes(d)] == [r.generation]
    assert resumes(job.feed(Tick(), dt=0.2)) == []  # once per report of being held


def test_an_unhealthy_then_healthy_replacement_settles_again() -> None:
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, settle_seconds=1.0))
    job.start()
    job.feed(TrainerHeld(holds(job.feed(WorkerLost(2, 0, "a2.0", "stream_closed"), dt=1))[0].generation, 5, -1))
    job.feed(TrainerResumed(job.state.generation, 5, frozenset({0, 1}), "memory"))
    job.feed(WorkerJoined(2, 0, "b2.0"), dt=1)
    job.feed(WorkerHealth(2, 0, "b2.0", False), dt=0.5)
    job.feed(WorkerHealth(2, 0, "b2.0", True), dt=0.5)
    assert not holds(job.feed(Tick(), dt=0.6))  # only 0.6 s healthy since
    assert holds(job.feed(Tick(), dt=0.5))


def test_a_drain_the_policy_cannot_absorb_is_refused_naming_the_setting() -> None:
    job = Job(Policy(num_slices=2))  # elastic_min_slice_count=-1: every slice
    job.start()
    d = job.feed(OperatorCommand("drain", "kernel upgrade", slice=1), dt=1)
    assert d.rejected and "elastic_min_slice_count=-1" in d.rejected and d.actions == ()
    assert d.state == job.state and d.state.drains == {}
    ok = Job(Policy(num_slices=3, elastic_min_slice_count=2))
    ok.start()
    assert holds(ok.feed(OperatorCommand("drain", "kernel upgrade", slice=1), dt=1))


def test_registering_looks_again_only_at_the_joining_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each registration re-judges its own slice, not every slice (State.carry_up): 10,000 took minutes."""
    from agent.core import model as modelmod
    from agent.core.decide import decide as decide_
    from agent.core.model import Policy, WorkerJoined, WorkerLost

    slices, hosts = 40, 3
    calls: list[int] = []
    real = modelmod.State.slice_up

    def counted(self: modelmod.State, s: int) -> bool:
        calls.append(s)
        return real(self, s)

    monkeypatch.setattr(modelmod.State, "slice_up", counted)
    state = initial_state(Policy(num_slices=slices, hosts_per_slice=hosts, settle_seconds=0), 0.0)
    state.up_slices()
    now = 1.0
    for s in range(slices):
        for h in range(hosts):
            calls.clear()
            d = decide_(state, WorkerJoined(s, h, f"i{s}.{h}"), now)
            state = d.state
            now += 0.01
            assert set(calls) <= {s}, (s, h, sorted(set(calls)))
    monkeypatch.setattr(modelmod.State, "slice_up", real)
    assert state.up_slices() == state.up_slices_afresh() == frozenset(range(slices))
    # A loss is judged right too.
    d = decide_(state, WorkerLost(7, 1, "i7.1", "stream_closed", 0.0), now)
    assert 7 not in d.state.up_slices() and d.state.up_slices() == d.state.up_slices_afresh()


def test_a_slice_error_naming_no_slice_costs_one_retry_even_when_the_host_is_found_later() -> None:
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, unnamed_error_wait_seconds=3.0))
    job.start()
    g = job.state.generation
    d = job.feed(TrainerSliceError(frozenset(), "DATA_LOSS: a device went away", 5, g), dt=0.1)
    (hold,) = holds(d)
    assert d.state.retries_used == 1
    d = job.feed(TrainerHeld(hold.generation, 5, -1), dt=0.1)
    assert not resumes(d) and "named no slice" in d.reason  # not straight back onto the same slices
    d = job.feed(WorkerLost(2, 0, "a2.0", "heartbeat_timeout"), dt=1.2)  # the hung host is found meanwhile
    (r,) = resumes(d)
    assert r.active == frozenset({0, 1}) and d.state.retries_used == 1  # inside the same recovery


def test_a_slice_error_naming_no_slice_resumes_the_same_slices_after_the_wait() -> None:
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, unnamed_error_wait_seconds=3.0))
    job.start()
    d = job.feed(TrainerSliceError(frozenset(), "DATA_LOSS", 5, job.state.generation), dt=0.1)
    d = job.feed(TrainerHeld(holds(d)[0].generation, 5, -1), dt=0.1)
    assert not resumes(d)
    assert not resumes(job.feed(Tick(), dt=1.0))
    (r,) = resumes(job.feed(Tick(), dt=2.5))
    assert r.active == frozenset({0, 1, 2}) and job.state.retries_used == 1


def test_a_new_sidecar_on_the_same_node_while_the_coordinator_was_down_is_no_loss() -> None:
    job = Job(Policy(num_slices=2, settle_seconds=1.0, rejoin_grace_seconds=10.0))
    job.start()
    hosts = {k: replace(r, node=f"n{k[0]}") for k, r in job.state.hosts.items()}
    # What a restored state looks like: the known hosts are expected to rejoin.
    job.state = replace(job.state, hosts=hosts, expected_rejoin=frozenset(hosts), rejoin_deadline=job.now + 10.0)
    d = job.feed(WorkerJoined(0, 0, "a0.0", "n0"), dt=0.5)
    d = job.feed(WorkerJoined(1, 0, "b1.0", "n1"), dt=0.5)  # a new incarnation, same node
    assert not holds(d) and d.state.retries_used == 0 and d.state.up_slices() == frozenset({0, 1})
    assert "while the coordinator was down" in d.reason
    # On another node it is a replacement: the old host is lost.
    job.state = replace(job.state, expected_rejoin=frozenset({(1, 0)}), rejoin_deadline=job.now + 10.0)
    d = job.feed(WorkerJoined(1, 0, "c1.0", "n1-new"), dt=0.5)
    assert "replaced live incarnation" in d.reason
