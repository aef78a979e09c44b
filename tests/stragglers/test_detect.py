"""The straggler detector as tables: a script of windows in, each window's status of one slice out.

A script has one letter a window (see ``KINDS``); a status string one letter a window (see
``Run.statuses``). The job has three normal windows first, so the baseline is known.
"""

from __future__ import annotations

import pytest

from agent.stragglers import SliceSummary, Thresholds, WindowSummary
from tests.stragglers.job import Run, window

SLOW = 1.5  # the late slice computes 50% longer
ALL = 1.3  # every slice computes 30% longer


def kinds(n: int) -> dict[str, dict]:
    """What each letter of a script means for an n-slice job; the late slice is the last one."""
    late = n - 1

    def f(slow: int | None = None, factor: float = SLOW) -> list[float]:
        return [factor if i == slow else 1.0 for i in range(n)]

    return {
        ".": {"factors": f()},
        "x": {"factors": f(late)},  # the last slice is late
        "a": {"factors": [ALL] * n},  # every slice is slower alike
        "c": {"factors": f(), "checkpoint": True},
        "k": {"factors": f(0), "checkpoint": True},  # slice 0 saves longer than the others
        "p": {"factors": f(0), "compile": True},
        "e": {"factors": f(0), "evaluation": True},
        "r": {"factors": f(late), "resize": True},
        "b": {"factors": f(), "blind": [late]},
        "B": {"factors": f(late), "blind": [late]},  # the late slice is the one that cannot be seen
        "t": {"factors": f(late), "second": {late: {"throttle_score": 2.0}}},
        "l": {"factors": f(late), "second": {late: {"links_unhealthy": True}}},
    }


def run(n: int, script: str) -> Run:
    r = Run()
    table = kinds(n)
    for letter in "..." + script:
        r.feed(window(**table[letter]))
    return r


CASES = [
    # id, slices, script, the late slice's statuses (after the three normal windows)
    ("enters-at-3-of-5", 4, "xxxxx", "ssSSS"),
    ("leaves-with-hysteresis", 4, "xxx......", "ssSSSSs.."),
    ("flapping-below-the-line-never-enters", 4, "x..x..x..x..", "ssssssssssss"),
    ("flapping-at-the-line-enters-and-stays", 4, "x.x.x.x.x.x.", "ssssSSSSSSSS"),
    ("transient-of-two-windows", 4, "xx.......", "ssssss..."),
    ("job-wide-is-no-slice", 4, "aaaaa", "....."),
    ("skipped-windows-count-neither-way", 4, "xcccxx", "sssssS"),
    ("compile-and-evaluation-skipped", 4, "xpxex", "ssssS"),
    ("resize-restarts-the-baseline", 4, "xxrxxxx", "sssssss"),
    ("blind-is-never-healthy", 4, "bbb", "bbb"),
    ("blind-and-late", 4, "BBBBB", "bbbbb"),
    ("a-straggler-gone-blind-stays-unjudged", 4, "xxxBBx", "ssSbbS"),
    ("three-slices", 3, "xxxxx", "ssSSS"),
    ("two-slices-need-a-second-signal", 2, "xxxxx", "....."),
    ("two-slices-with-throttle", 2, "ttttt", "ssSSS"),
    ("two-slices-with-a-bad-link", 2, "lllll", "ssSSS"),
]


@pytest.mark.parametrize(("n", "script", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_late_slice(n: int, script: str, want: str) -> None:
    r = run(n, script)
    assert r.statuses(n - 1)[3:] == want


JOB_CASES = [
    # id, script, the job's statuses, slice 0's statuses
    ("job-wide-enters-at-3-of-5", "aaaaa", "..JJJ", "....."),
    ("job-wide-leaves-with-hysteresis", "aaa.....", "..JJJJ..", "........"),
    ("a-straggler-is-not-job-wide", "xxxxx", ".....", "....."),
    ("blind-slice-may-be-the-cause", "BBBBB", ".....", "....."),
    ("checkpoint-late-slice-0-ignored", "kkkkk", ".....", "....."),
    ("skipped-windows-do-not-end-it", "aaacccc", "..JJJJJ", "......."),
]


@pytest.mark.parametrize(("script", "job", "slice0"), [c[1:] for c in JOB_CASES], ids=[c[0] for c in JOB_CASES])
def test_the_job_and_the_others(script: str, job: str, slice0: str) -> None:
    r = run(4, script)
    assert r.statuses(None)[3:] == job
    assert r.statuses(0)[3:] == slice0


def test_no_baseline_no_verdict_and_the_reason_says_why() -> None:
    r = Run()
    for _ in range(6):
        r.feed(window([1.0, 1.0, SLOW]))  # late from the first window: no normal window to compare with
    assert r.statuses(2) == "......"
    late = next(f for f in r.detections[-1].findings if f.slice == 2)
    assert "no baseline" in late.reason and "without a late slice" in late.reason


def test_a_finding_says_what_it_saw() -> None:
    r = run(4, "xxx")
    late = next(f for f in r.detections[-1].findings if f.slice == 3)
    assert late.entered and late.since == r.now
    assert late.lateness == pytest.approx(0.5 / 1.6)  # it waited 0.5 s of a 1.6 s step less than the others
    assert late.slowdown == pytest.approx(1.6 / 1.1 - 1)
    assert "straggler" in late.reason and "3 of the last 3" in late.reason


def test_a_blind_slice_that_may_be_late_is_named_in_the_job_finding() -> None:
    r = run(4, "B")
    job = r.detections[-1].findings[-1]
    assert job.status == "healthy" and "[3] are blind and may be the cause" in job.reason


def test_two_slices_without_a_second_signal_say_so() -> None:
    r = run(2, "x")
    late = r.detections[-1].findings[1]
    assert late.status == "healthy" and "late, but" in late.reason and "second signal" in late.reason


def test_a_skipped_window_says_why() -> None:
    r = run(4, "xc")
    assert all("checkpoint" in f.reason for f in r.detections[-1].findings)


def test_a_slice_that_leaves_is_forgotten() -> None:
    r = run(4, "xxx")
    r.feed(window([1.0, 1.0, 1.0], resize=True))
    assert set(r.state.slices) == {0, 1, 2} and r.state.baseline == ()


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"enter_hits": 2}, "enter_hits"),
        ({"leave_hits": 3}, "leave_hits"),
        ({"lateness_min": float("nan")}, "lateness_min"),
        ({"baseline_min": 11}, "baseline_min"),
        ({"windows": 0}, "windows"),
    ],
    ids=["enter-not-most", "leave-not-below-enter", "nan", "baseline-min-above-windows", "no-windows"],
)
def test_bad_thresholds_name_the_field(kw: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        Thresholds(**kw)


def test_bad_summaries_name_the_value() -> None:
    with pytest.raises(ValueError, match="collective_wait_seconds"):
        SliceSummary(0, -1.0)
    with pytest.raises(ValueError, match="twice"):
        WindowSummary(0.0, 60.0, 1.0, (SliceSummary(0, 0.1), SliceSummary(0, 0.1)))
