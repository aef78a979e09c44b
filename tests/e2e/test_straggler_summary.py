"""The summary's ``stragglers``: each StragglerVerdict journal line with the step rates around it,
from synthetic journal and trainer event lines written as the coordinator and the trainer write them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simjob.summary import FaultRecord, render, summarize


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _verdict(t: float, slice_: int, scope: str, action: str, reason: str = "why") -> dict[str, Any]:
    detail = {"slice": slice_, "scope": scope, "action": action, "reason": reason, "slowdown": 0.5}
    detail |= {"lateness": 0.3, "since": t - 3}
    return {"time": t, "trigger": "StragglerVerdict", "up_slices": [0, 1, 2, 3], "actions": [], "event_detail": detail}


def _steps(first: int, start: float, every: float, n: int, slices: list[int]) -> list[dict[str, Any]]:
    """``n`` steps, one each ``every`` seconds after ``start``."""
    return [
        {"t": round(start + every * (i + 1), 6), "kind": "step", "step": first + i, "seconds": every, "slices": slices}
        for i in range(n)
    ]


ALL = [0, 1, 2, 3]


def _run(tmp_path: Path, journal: list[dict[str, Any]], events: list[dict[str, Any]], faults: list[FaultRecord]):
    _write(tmp_path / "journal.jsonl", journal)
    _write(tmp_path / "trainer-events.jsonl", events)
    return summarize(tmp_path, faults, 90.0, 30.0, {"trainer": 0, "coordinator": 0})


def test_a_drain_reports_the_rate_before_during_and_after_its_resume(tmp_path: Path) -> None:
    # 10 steps/s from the first resume (t=100) to the slowdown of slice 2 at t=104, then one step per
    # 0.15 s until the drain verdict at t=110, a resume on the other three slices at t=110.5, then
    # 10 steps/s again until t=115.5.
    events: list[dict[str, Any]] = [
        {"t": 100.0, "kind": "resumed", "from_step": 0, "slices": ALL, "restored_from": "memory"}
    ]
    events += _steps(1, 100.0, 0.1, 40, ALL)
    events += _steps(41, 104.0, 0.15, 40, ALL)
    events.append({"t": 110.5, "kind": "resumed", "from_step": 80, "slices": [0, 1, 3], "restored_from": "memory"})
    events += _steps(81, 110.5, 0.1, 50, [0, 1, 3])
    keep = _verdict(107.0, 1, "slice", "keep")
    drain = _verdict(110.0, 2, "slice", "drain", "slice 2 arrived 30% late")
    slow = FaultRecord("slow", 2, None, 40, 104.0, 40, None, 1.5)
    out = _run(tmp_path, [keep, drain], events, [slow])

    got = {(v["slice"], v["action"]): v for v in out["stragglers"]}
    assert set(got) == {(1, "keep"), (2, "drain")}
    d = got[(2, "drain")]
    assert d["scope"] == "slice" and d["fault"] == "slow:2:1.5@40"
    assert d["seconds_from_slowdown"] == 6.0
    assert d["step_rate_before"] == 10.0
    assert d["step_rate_during"] == round(40 / 6, 3)
    assert d["step_rate_after"] == 10.0
    assert d["step_rate_after"] > d["step_rate_during"]
    # A keep on a slice the slowdown was not on still reads from slice 2's slowdown (the only one).
    assert got[(1, "keep")]["seconds_from_slowdown"] == 3.0 and got[(1, "keep")]["step_rate_after"] is None

    # The fault's own row: seen when the coordinator decided to drain its slice.
    (fault,) = out["faults"]
    assert fault["detection_seconds"] == 6.0 and fault["detection_source"] == "StragglerVerdict"
    assert fault["slices_before"] == 4 and fault["slices_after"] == 3
    text = " ".join(render(out, 90.0, tmp_path, timeline=False).split())  # unwrapped
    assert "not back on its slice" in text  # the drained slice stays drained
    assert "drain slice 2, 6.000 s after the slowdown (slow:2:1.5@40)" in text
    assert "slice 2 arrived 30% late" in text


def test_a_job_wide_alert_and_a_transient_that_ended(tmp_path: Path) -> None:
    # slow:*:1.3 from t=102 for good: the alert has no "after" span. A transient slow:1:2@10+1 at
    # t=101 ended at t=102: a keep answering it has its "after" from t=102 to the last step.
    events: list[dict[str, Any]] = [
        {"t": 100.0, "kind": "resumed", "from_step": 0, "slices": ALL, "restored_from": "memory"}
    ]
    events += _steps(1, 100.0, 0.1, 40, ALL)
    events += _steps(41, 104.0, 0.13, 30, ALL)
    transient = FaultRecord("slow", 1, None, 10, 101.0, 10, 1.0, 2.0)
    everyone = FaultRecord("slow", None, None, 20, 102.0, 20, None, 1.3)
    keep = _verdict(101.5, 1, "slice", "keep")
    alert = _verdict(106.0, -1, "job", "alert", "every slice slower alike")
    out = _run(tmp_path, [alert, keep], events, [transient, everyone])

    assert [f["detection_seconds"] for f in out["faults"]] == [None, None]  # nothing drained
    k, a = out["stragglers"]  # in the order of their time
    assert (k["action"], a["action"]) == ("keep", "alert")
    assert k["fault"] == "slow:1:2@10+1" and k["seconds_from_slowdown"] == 0.5
    assert k["step_rate_after"] == round(sum(1 for e in events if e.get("kind") == "step" and e["t"] > 102) / 5.9, 3)
    assert a["scope"] == "job" and a["slice"] == -1 and a["fault"] == "slow:*:1.3@20"
    assert a["seconds_from_slowdown"] == 4.0
    assert a["step_rate_before"] == 10.0
    assert a["step_rate_after"] is None
    text = " ".join(render(out, 90.0, tmp_path, timeline=False).split())
    assert "alert job-wide, 4.000 s after the slowdown" in text
    assert "not back on its slice" not in text  # a slowdown without a drain costs no slice


def test_a_verdict_with_no_slowdown_injected_has_no_spans(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = [
        {"t": 100.0, "kind": "resumed", "from_step": 0, "slices": ALL, "restored_from": "memory"}
    ]
    events += _steps(1, 100.0, 0.1, 20, ALL)
    out = _run(tmp_path, [_verdict(101.0, 3, "slice", "alert")], events, [FaultRecord("kill", 1, 0, 5, 100.5, 5)])
    (v,) = out["stragglers"]
    assert v["fault"] is None and v["seconds_from_slowdown"] is None
    assert v["step_rate_before"] is None and v["step_rate_during"] is None and v["step_rate_after"] is None


def test_a_drain_the_trainer_never_resumed_from_has_no_after(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = [
        {"t": 100.0, "kind": "resumed", "from_step": 0, "slices": ALL, "restored_from": "memory"}
    ]
    events += _steps(1, 100.0, 0.1, 30, ALL)
    slow = FaultRecord("slow", 2, None, 10, 101.0, 10, None, 1.5)
    out = _run(tmp_path, [_verdict(102.0, 2, "slice", "drain")], events, [slow])
    (v,) = out["stragglers"]
    assert v["step_rate_during"] == 10.0 and v["step_rate_after"] is None


def test_no_verdicts_no_stragglers_section(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = [
        {"t": 100.0, "kind": "resumed", "from_step": 0, "slices": ALL, "restored_from": "memory"}
    ]
    events += _steps(1, 100.0, 0.1, 5, ALL)
    out = _run(tmp_path, [], events, [])
    assert out["stragglers"] == []
    assert "Straggler verdicts" not in render(out, 90.0, tmp_path, timeline=False)


def test_many_keep_verdicts_are_counted_in_the_text_not_listed(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = [
        {"t": 100.0, "kind": "resumed", "from_step": 0, "slices": ALL, "restored_from": "memory"}
    ]
    events += _steps(1, 100.0, 0.1, 50, ALL)
    journal = [_verdict(100.5 + 0.3 * i, i % 4, "slice", "keep") for i in range(12)]
    journal.append(_verdict(105.0, 2, "slice", "alert", "below the margin"))
    out = _run(tmp_path, journal, events, [])
    assert len(out["stragglers"]) == 13
    text = " ".join(render(out, 90.0, tmp_path, timeline=False).split())
    assert "alert slice 2" in text and "and 12 keep verdicts" in text and "keep slice 0" not in text
