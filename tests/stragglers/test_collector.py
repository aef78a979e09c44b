"""The coordinator's straggler collector: slice medians, job windows from worker windows and step
reports, disturbed and blind windows, and the verdicts that leave it."""

from __future__ import annotations

from agent.core.model import OperatorCommand, Phase, StragglerVerdict, TrainerStepped
from agent.stragglers.collector import HostWindow, StragglerCollector, slice_summary
from protos.elastic_sidecar.v1 import peer_pb2
from tests.core.driver import Job, Policy
from tests.stragglers.job import COLLECTIVE, COMPUTE

WINDOW = 10.0


def running(n: int = 4, hosts: int = 2, min_slices: int = 2) -> Job:
    job = Job(Policy(num_slices=n, hosts_per_slice=hosts, elastic_min_slice_count=min_slices), dt=0.1)
    job.join_all()
    job.attach_and_start("fresh")
    assert job.state.phase == Phase.RUNNING
    return job


def msg(start: float, wait: float | None, *, blind: str = "", throttle: float | None = None) -> peer_pb2.MetricsWindow:
    m = peer_pb2.MetricsWindow(start_unix=start, end_unix=start + WINDOW, source="service", blind=blind)
    if wait is not None and not blind:
        m.collective_count = 50
        m.collective_p50_seconds = wait
        m.collective_mean_seconds = wait
    if throttle is not None:
        m.throttle_score = throttle
    return m


def report(c: StragglerCollector, job: Job, start: float, factors: list[float], blind: set[int] = frozenset()) -> None:
    """Every host of every slice reports the window of a job whose slice i computes factors[i] times as long,
    and the trainer reports its steps inside it."""
    slowest = COMPUTE * max(factors)
    for s, f in enumerate(factors):
        for h in range(job.state.policy.hosts_per_slice):
            wait = slowest - COMPUTE * f + COLLECTIVE
            c.add_window(s, h, msg(start, wait, blind="refused" if s in blind else ""))
    step = TrainerStepped(job.state.trainer.last_step + 1, job.state.generation, slowest + COLLECTIVE)
    c.note(step, job.feed(step), job.state, start + WINDOW / 2, job.now)


def test_a_slice_is_the_median_of_its_hosts_that_saw_and_blind_when_none_did() -> None:
    w = [HostWindow(0, 10, collective=x) for x in (1.0, 2.0, 10.0)]
    assert slice_summary(3, w).collective_wait_seconds == 2.0
    mixed = [HostWindow(0, 10, blind="refused"), HostWindow(0, 10, collective=4.0), None]
    s = slice_summary(3, mixed)
    assert s.collective_wait_seconds == 4.0 and not s.blind
    blind = slice_summary(3, [HostWindow(0, 10, blind="refused"), None])
    assert blind.blind and not blind.seen
    assert slice_summary(1, [HostWindow(0, 10, collective=1.0, throttle_score=0.4)]).throttle_score == 0.4


def test_a_blind_message_is_never_a_seen_host() -> None:
    m = msg(0, 0.5, blind="UNAVAILABLE: connection refused")
    m.collective_count, m.collective_p50_seconds = 3, 0.5  # a blind window's numbers are not read
    assert HostWindow.from_message(m).collective is None


def test_the_job_window_spans_its_hosts_and_takes_the_step_time_inside_it() -> None:
    job, c = running(), StragglerCollector()
    for at, sec in ((95.0, 9.0), (102.0, 1.0), (104.0, 1.2), (108.0, 1.4), (111.0, 9.0)):
        c.steps.append((at, sec))
    for s in range(4):
        for h in range(2):
            c.add_window(s, h, msg(100.0 + 0.1 * h, 0.2 + s))
    w = c.job_window(job.state, 110.5)
    assert w is not None and (w.start, w.end) == (100.0, 110.1)
    assert w.step_seconds == 1.2
    assert [s.collective_wait_seconds for s in w.slices] == [0.2, 1.2, 2.2, 3.2]
    assert not c.pending and c.job_window(job.state, 111.0) is None  # each window is used once


def test_a_window_waits_for_every_host_then_counts_the_silent_ones_blind() -> None:
    job, c = running(), StragglerCollector()
    for s in range(3):
        for h in range(2):
            c.add_window(s, h, msg(100.0, 0.2))
    assert c.job_window(job.state, 111.0) is None  # slice 3 may still report
    w = c.job_window(job.state, 100.0 + WINDOW * 2.6)
    assert w is not None
    assert [s.blind for s in w.slices] == [False, False, False, True]


def test_a_window_a_hold_touched_counts_as_a_resize_until_the_first_step_after_it() -> None:
    job, c = running(), StragglerCollector()
    before = job.state
    d = job.feed(OperatorCommand("hold", "look"))
    c.note(OperatorCommand("hold", "look"), d, before, 105.0, job.now)
    for s in range(4):
        for h in range(2):
            c.add_window(s, h, msg(100.0, 0.2))
    assert c.job_window(job.state, 111.0) is None and not c.pending  # not running: nothing compared
    assert c.disturbances[-1] == (105.0, None, "resize")
    # Back to running: the window still touches the open hold until a step is reported after it.
    job.state = before
    for s in range(4):
        for h in range(2):
            c.add_window(s, h, msg(110.0, 0.2))
    w = c.job_window(job.state, 121.0)
    assert w is not None and w.resize and w.disturbances() == ("resize",)
    step = TrainerStepped(job.state.trainer.last_step + 1, job.state.generation, 1.0)
    c.note(step, job.feed(step), job.state, 122.0, job.now)
    for s in range(4):
        for h in range(2):
            c.add_window(s, h, msg(123.0, 0.2))
    w = c.job_window(job.state, 134.0)
    assert w is not None and not w.resize


def _slow_slice_2(replacement: float | None, windows: int = 12, factor: float = 1.5) -> list[StragglerVerdict]:
    job = running()
    c = StragglerCollector(replacement_seconds=replacement)
    out: list[StragglerVerdict] = []
    for k in range(windows):
        start = 100.0 + k * WINDOW
        report(c, job, start, [1.0, 1.0, factor if k >= 4 else 1.0, 1.0])
        out += c.tick(job.state, start + WINDOW + 0.1, job.now)
    return out


def test_a_slow_slice_gets_one_drain_verdict_when_a_replacement_is_expected() -> None:
    verdicts = _slow_slice_2(replacement=600.0)
    assert [(v.slice, v.scope, v.action) for v in verdicts] == [(2, "slice", "drain")]
    v = verdicts[0]
    assert v.slowdown is not None and v.slowdown > 0.4 and v.lateness == 0.5 / 1.6  # 0.5 s later, of a 1.6 s step
    assert v.since == 140.0  # the start of the first window it stood out in


def test_without_a_replacement_a_four_slice_job_drains_a_45_percent_straggler() -> None:
    """Three slices at full pace outrun four at a 45% slower one: 0.45 of the day against a third,
    above the margin of 1.25."""
    verdicts = _slow_slice_2(replacement=None)
    assert [(v.slice, v.action) for v in verdicts] == [(2, "drain")]
    assert "over 1.25 times" in verdicts[0].reason


def test_without_a_replacement_a_four_slice_job_keeps_a_20_percent_straggler_and_alerts() -> None:
    """A fifth slower costs less than a day on three slices of four: alert, keep it."""
    verdicts = _slow_slice_2(replacement=None, factor=1.2)
    assert [(v.slice, v.action) for v in verdicts] == [(2, "alert")]
    assert "not 1.25 times" in verdicts[0].reason


def test_a_slowdown_on_every_slice_is_one_job_wide_alert() -> None:
    job, c = running(), StragglerCollector(replacement_seconds=600.0)
    out: list[StragglerVerdict] = []
    for k in range(12):
        start = 100.0 + k * WINDOW
        report(c, job, start, [1.3 if k >= 4 else 1.0] * 4)
        out += c.tick(job.state, start + WINDOW + 0.1, job.now)
    assert [(v.slice, v.scope, v.action) for v in out] == [(-1, "job", "alert")]


def test_blind_hosts_give_no_verdict_and_show_blind() -> None:
    job, c = running(), StragglerCollector(replacement_seconds=600.0)
    out: list[StragglerVerdict] = []
    for k in range(12):
        start = 100.0 + k * WINDOW
        report(c, job, start, [1.0, 1.0, 1.5 if k >= 4 else 1.0, 1.0], blind={0, 1, 2, 3})
        out += c.tick(job.state, start + WINDOW + 0.1, job.now)
    assert out == []
    assert {s["status"] for s in c.status()["slices"]} == {"blind"}
    assert c.status()["windows"] == 12
