"""Issue 56: one host, one voice, and a slice the trainer named comes back only whole.

Two sidecars claiming one host cost no retry (the newer speaks for it; one coming back after the other
is flapping, reported); a replacement after a real loss still repairs; a slice named in a trainer's
slice error needs every one of its hosts registered since the error.
"""

from __future__ import annotations

from agent.core.model import (
    HoldTrainer,
    Phase,
    Policy,
    ResumeTrainer,
    Tick,
    TrainerSliceError,
    WorkerAway,
    WorkerJoined,
    WorkerLost,
)
from tests.core.driver import Job, of


def running(policy: Policy) -> Job:
    job = Job(policy)
    job.start()
    return job


def test_a_second_sidecar_for_a_live_host_costs_no_hold_and_no_retry() -> None:
    job = running(Policy(num_slices=4, elastic_min_slice_count=3, settle_seconds=1.0))
    before = job.state
    d = job.feed(WorkerJoined(1, 0, "b1.0", node="n-new", registration=7), dt=1)
    assert d.actions == () and d.state.retries_used == 0 and d.state.phase == Phase.RUNNING
    rec = d.state.hosts[(1, 0)]
    assert (rec.incarnation, rec.rival, rec.registration) == ("b1.0", "a1.0", 7)
    assert rec.registered_at == before.hosts[(1, 0)].registered_at  # no repair either
    assert d.state.up_slices() == d.state.active == frozenset(range(4))
    # The older one's stream (ended by the coordinator) is stale: its end is no loss of the host.
    d = job.feed(WorkerLost(1, 0, "a1.0", "stream_closed", registration=0), dt=0.1)
    assert d.actions == () and "stale" in d.reason


def test_two_sidecars_flapping_are_recognised_and_never_spend_a_retry() -> None:
    job = running(Policy(num_slices=4, elastic_min_slice_count=3, settle_seconds=1.0))
    reasons = []
    # A, B, A, B ...: each takes over from the other, through an away record or a live one.
    for i, (inc, away_of) in enumerate([("b1.0", None), ("a1.0", "b1.0"), ("b1.0", None), ("a1.0", None)]):
        reg = 10 + i
        if away_of is not None:
            job.feed(WorkerAway(1, 0, away_of, "stream_closed; SERVING", job.state.hosts[(1, 0)].registration))
        d = job.feed(WorkerJoined(1, 0, inc, registration=reg), dt=1)
        assert d.actions == () and d.state.retries_used == 0 and 1 in d.state.up_slices()
        reasons.append(d.reason)
    assert "flapping" not in reasons[0]  # the first takeover is a second sidecar, not yet a flap
    assert all("flapping" in r and "two sidecars" in r for r in reasons[1:]), reasons
    assert job.state.phase == Phase.RUNNING and job.state.retries_used == 0


def test_a_replacement_after_a_real_loss_still_repairs_the_slice() -> None:
    job = running(Policy(num_slices=4, elastic_min_slice_count=3, settle_seconds=1.0))
    d = job.feed(WorkerLost(1, 0, "a1.0", "heartbeat_timeout"), dt=1)
    assert of(d, HoldTrainer) and d.state.retries_used == 1
    d = job.ack_hold(d)
    job.ack_resume(d)
    d = job.feed(WorkerJoined(1, 0, "b1.0"), dt=1)
    assert 1 not in d.state.up_slices()  # not settled yet
    d = job.feed(Tick(), dt=1.5)
    assert of(d, HoldTrainer) and d.state.retries_used == 1  # grows back, spending no retry


def test_a_new_sidecar_for_a_slice_already_out_may_repair_it() -> None:
    job = running(Policy(num_slices=4, elastic_min_slice_count=3, settle_seconds=1.0))
    d = job.feed(TrainerSliceError(frozenset({2}), "DATA_LOSS", 10, job.state.generation), dt=1)
    d = job.ack_hold(d)
    job.ack_resume(d)
    d = job.feed(WorkerJoined(2, 0, "b2.0"), dt=1)  # its pod replaced while the old stream still looked open
    assert d.state.retries_used == 1
    d = job.feed(Tick(), dt=1.5)
    assert of(d, HoldTrainer) and 2 in d.state.up_slices()


def test_after_a_restart_a_new_sidecar_on_another_node_is_still_the_loss_of_the_old_host() -> None:
    job = running(Policy(num_slices=2, settle_seconds=1.0, rejoin_grace_seconds=10.0))
    from dataclasses import replace

    job.state = replace(job.state, expected_rejoin=frozenset({(1, 0)}), rejoin_deadline=job.now + 10.0)
    d = job.feed(WorkerJoined(1, 0, "c1.0", "n1-new"), dt=0.5)
    assert "replaced live incarnation" in d.reason and 1 in d.state.slice_errors


def two_hosts() -> Job:
    return running(Policy(num_slices=3, hosts_per_slice=2, elastic_min_slice_count=2, settle_seconds=1.0))


def test_a_slice_the_trainer_named_does_not_come_back_with_one_host_lost_and_back() -> None:
    job = two_hosts()
    d = job.feed(TrainerSliceError(frozenset({1}), "DATA_LOSS", 10, job.state.generation), dt=1)
    d = job.ack_hold(d)
    job.ack_resume(d)
    d = job.feed(WorkerLost(1, 1, "a1.1", "heartbeat_timeout"), dt=1)
    d = job.feed(WorkerJoined(1, 1, "a1.1"), dt=1)  # the same process back (not flapping)
    for _ in range(5):
        d = job.feed(Tick(), dt=1.0)
        assert not of(d, HoldTrainer) and 1 not in d.state.up_slices(), d.reason
    assert 1 in d.state.trainer_errors
    # Host 1.0 replaced too: now every host of the slice is new since the error, and it grows back.
    job.feed(WorkerLost(1, 0, "a1.0", "stream_closed"), dt=0.5)
    job.feed(WorkerJoined(1, 0, "b1.0"), dt=0.5)
    d = job.feed(Tick(), dt=1.5)
    assert of(d, HoldTrainer) and 1 in d.state.up_slices()
    d = job.ack_hold(d)
    (resume,) = of(d, ResumeTrainer)
    assert resume.active == frozenset({0, 1, 2}) and 1 not in d.state.trainer_errors  # the mark is forgotten


def test_a_trainer_report_after_the_hosts_timeout_still_needs_the_whole_slice() -> None:
    # The host's timeout comes first and starts a new generation; the trainer's DATA_LOSS for the
    # same slice then carries the older one. The slice must still come back only whole.
    job = two_hosts()
    gen = job.state.generation
    hold = job.feed(WorkerLost(1, 1, "a1.1", "heartbeat_timeout"), dt=1)
    assert of(hold, HoldTrainer)
    d = job.feed(TrainerSliceError(frozenset({1}), "DATA_LOSS", 10, gen), dt=0.1)
    assert 1 in d.state.trainer_errors
    d = job.ack_hold(hold)
    job.ack_resume(d)
    d = job.feed(WorkerJoined(1, 1, "a1.1"), dt=1)  # the same process back
    for _ in range(5):
        d = job.feed(Tick(), dt=1.0)
        assert not of(d, HoldTrainer) and 1 not in d.state.up_slices(), d.reason


def test_an_older_trainer_report_for_a_repaired_slice_marks_nothing() -> None:
    job = two_hosts()
    gen = job.state.generation
    d = job.feed(WorkerLost(1, 1, "a1.1", "stream_closed"), dt=1)
    d = job.ack_hold(d)
    job.ack_resume(d)
    job.feed(WorkerJoined(1, 1, "b1.1"), dt=1)
    d = job.feed(Tick(), dt=1.5)
    d = job.ack_hold(d)
    job.ack_resume(d)  # grown back: the slice is no longer marked
    assert 1 in job.state.active and 1 not in job.state.slice_errors
    d = job.feed(TrainerSliceError(frozenset({1}), "DATA_LOSS", 10, gen), dt=0.1)
    assert 1 not in d.state.trainer_errors and 1 not in d.state.slice_errors


def test_a_host_loss_alone_still_needs_only_that_host_back() -> None:
    job = two_hosts()
    d = job.feed(WorkerLost(1, 1, "a1.1", "stream_closed"), dt=1)
    d = job.ack_hold(d)
    job.ack_resume(d)
    job.feed(WorkerJoined(1, 1, "b1.1"), dt=1)
    d = job.feed(Tick(), dt=1.5)
    assert of(d, HoldTrainer) and 1 in d.state.up_slices()  # 1.0 never left: it need not re-register
