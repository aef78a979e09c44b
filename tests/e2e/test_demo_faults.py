"""The demo's fault specifications: the parser, its errors, and the job-process faults end to end.

What the job does under each fault (no shrink, no lost checkpoint, ...) is
checked by ``test_fault_matrix.py``; here: that the demo injects them, in the
order and timing given, and reports them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from simjob.options import FAULT_KINDS, MC_KINDS, FaultSpec, add_demo_args, check_faults, parse_fault


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("kill:1.0@40", FaultSpec("kill", 1, 0, 40)),
        ("hang:2.1@5", FaultSpec("hang", 2, 1, 5)),
        ("sidecar-restart:3.0@7", FaultSpec("sidecar-restart", 3, 0, 7)),
        ("coordinator-restart@12", FaultSpec("coordinator-restart", None, None, 12)),
        ("coordinator-stall:3@9", FaultSpec("coordinator-stall", None, None, 9, 3.0)),
        ("coordinator-stall:0.5@9", FaultSpec("coordinator-stall", None, None, 9, 0.5)),
        ("trainer-kill@30", FaultSpec("trainer-kill", None, None, 30)),
        (" trainer-kill@30 ", FaultSpec("trainer-kill", None, None, 30)),
        ("slow:2:1.5@40", FaultSpec("slow", 2, None, 40, None, 1.5)),
        ("slow:2:1.5@40+5", FaultSpec("slow", 2, None, 40, 5.0, 1.5)),
        ("slow:*:1.3@40", FaultSpec("slow", None, None, 40, None, 1.3)),
        ("slow:0:2@1+0.5", FaultSpec("slow", 0, None, 1, 0.5, 2.0)),
    ],
)
def test_fault_specs_parse_and_print_back(text: str, spec: FaultSpec) -> None:
    assert parse_fault(text) == spec
    assert parse_fault(str(spec)) == spec


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("explode:1.0@3", "kind 'explode' is not one of"),
        ("kill@3", "kill needs SLICE.HOST"),
        ("kill:1@3", "kill needs SLICE.HOST"),
        ("sidecar-restart@3", "sidecar-restart needs SLICE.HOST"),
        ("kill:1.0@x", "step 'x' is not a whole number"),
        ("kill:1.0", "expected KIND:SLICE.HOST@STEP"),
        ("coordinator-stall@3", "coordinator-stall needs SECONDS"),
        ("coordinator-stall:abc@3", "seconds 'abc' is not a number"),
        ("coordinator-stall:0@3", "seconds '0' must be above 0"),
        ("coordinator-stall:-1@3", "seconds '-1' must be above 0"),
        ("coordinator-stall:nan@3", "seconds 'nan' must be above 0"),
        ("coordinator-restart:1.0@3", "coordinator-restart takes no argument"),
        ("trainer-kill:2@3", "trainer-kill takes no argument"),
        ("trainer-kill@-3", "step '-3' is not a whole number"),
        ("slow@40", "slow needs SLICE:FACTOR"),
        ("slow:2@40", "slow needs SLICE:FACTOR"),
        ("slow:2.0:1.5@40", "slow needs SLICE:FACTOR"),
        ("slow:x:1.5@40", "slow needs SLICE:FACTOR"),
        ("slow:2:fast@40", "factor 'fast' is not a number"),
        ("slow:2:1@40", "factor '1' must be above 1"),
        ("slow:2:0.5@40", "factor '0.5' must be above 1"),
        ("slow:2:inf@40", "factor 'inf' must be above 1"),
        ("slow:2:nan@40", "factor 'nan' must be above 1"),
        ("slow:2:1.5@x", "step 'x' is not a whole number"),
        ("slow:2:1.5@40+", "seconds '' is not a number"),
        ("slow:2:1.5@40+0", "seconds '0' must be above 0"),
        ("slow:2:1.5@40+abc", "seconds 'abc' is not a number"),
        ("slow:2:1.5@+5", "step '' is not a whole number"),
    ],
)
def test_bad_fault_specs_name_the_value(text: str, needle: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as e:
        parse_fault(text)
    assert repr(text) in str(e.value), e.value
    assert needle in str(e.value), e.value


def test_range_checks_skip_the_host_for_job_faults() -> None:
    check_faults([parse_fault("coordinator-restart@5"), parse_fault("trainer-kill@9")], 4, 1, 10)
    with pytest.raises(ValueError, match="step 10 is outside 1..9"):
        check_faults([parse_fault("trainer-kill@10")], 4, 1, 10)
    with pytest.raises(ValueError, match="slice 4 does not exist"):
        check_faults([parse_fault("sidecar-restart:4.0@3")], 4, 1, 10)
    with pytest.raises(ValueError, match="kind 'trainer-kill' is not supported here"):
        check_faults([parse_fault("trainer-kill@3")], 4, 1, 10, kinds=("kill", "hang"))


def test_a_slow_fault_names_an_existing_slice_or_every_slice() -> None:
    check_faults([parse_fault("slow:3:1.5@4"), parse_fault("slow:*:1.2@5+2")], 4, 1, 10)
    with pytest.raises(ValueError, match=r"--fault slow:4:1.5@4: slice 4 does not exist \(slices 0..3\)"):
        check_faults([parse_fault("slow:4:1.5@4")], 4, 1, 10)
    with pytest.raises(ValueError, match="step 10 is outside 1..9"):
        check_faults([parse_fault("slow:*:1.5@10")], 4, 1, 10)
    with pytest.raises(ValueError, match="kind 'slow' is not supported here"):
        check_faults([parse_fault("slow:1:1.5@4")], 4, 1, 10, kinds=MC_KINDS)


def test_help_names_every_fault_kind() -> None:
    p = argparse.ArgumentParser()
    add_demo_args(p)
    # argparse wraps at hyphens too ("sidecar-" at a line's end, "stall" on the next one).
    text = " ".join(p.format_help().split()).replace("- ", "-")
    for kind in FAULT_KINDS:
        assert kind in text, kind
    assert "coordinator-stall:SECONDS@STEP" in text and "0.2 s apart" in text
    for form in ("slow:SLICE:FACTOR@STEP", "slow:SLICE:FACTOR@STEP+SECONDS", "slow:*:FACTOR@STEP"):
        assert form in text, form
    assert "--straggler-window-seconds" in text


def test_bad_fault_on_the_command_line_exits_2_naming_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agent", "demo", "--workdir", str(tmp_path), "--fault", "coordinator-stall:zz@4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "coordinator-stall:zz@4" in proc.stderr and "seconds 'zz'" in proc.stderr, proc.stderr


def test_bad_fault_on_the_command_line_slow_on_a_missing_slice_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agent", "demo", "--workdir", str(tmp_path), "--slices", "2", "--fault", "slow:2:1.5@4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "slow:2:1.5@4" in proc.stderr and "slice 2 does not exist" in proc.stderr, proc.stderr


@pytest.mark.e2e
def test_job_process_faults_are_injected_in_order_and_reported(tmp_path: Path) -> None:
    """Two faults at one step go in the order given, 0.2 s apart; each is in the summary with its figures."""
    summary = tmp_path / "summary.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent",
            "demo",
            "--workdir",
            str(tmp_path / "job"),
            "--summary-json",
            str(summary),
            "--steps",
            "50",
            "--step-seconds",
            "0.1",
            "--checkpoint-period",
            "10",
            "--timeout",
            "20",
            "--run-timeout",
            "150",
            "--fault",
            "trainer-kill@15",
            "--fault",
            "coordinator-restart@15",
            "--fault",
            "coordinator-stall:0.5@30",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = proc.stdout + proc.stderr
    s = json.loads(summary.read_text())
    kinds = [f["fault"] for f in s["faults"]]
    assert kinds == ["trainer-kill@15", "coordinator-restart@15", "coordinator-stall:0.5@30"], out
    gap = s["faults"][1]["time"] - s["faults"][0]["time"]
    assert 0.2 <= gap < 1.0, (gap, out)
    assert s["process_exits"]["trainer"][0] == -9 and s["process_exits"]["coordinator"][0] == -9, s
    assert "[harness] trainer started again" in out and "[harness] coordinator started again" in out, out
    assert "coordinator continued (SIGCONT)" in out, out
    # The restarted trainer picked up from the work directory's checkpoints, not from step 0.
    tev = [json.loads(x) for x in (tmp_path / "job" / "trainer-events.jsonl").read_text().splitlines() if x]
    starts = [e for e in tev if e["kind"] == "start"]
    assert len(starts) == 2, starts
    again = next(e for e in tev if e["kind"] == "resumed" and e["t"] > starts[1]["t"])
    assert again["restored_from"] == "checkpoint" and again["from_step"] >= 10, again
    assert isinstance(s["failure_recoveries"], int) and s["failure_recoveries_source"] == "state file", s
    assert s["faults"][0]["detection_source"] in ("TrainerDetached", None), s["faults"][0]
    for key in ("detection_seconds", "hold_seconds", "recovery_seconds", "stall_seconds", "lost_steps"):
        assert all(key in f for f in s["faults"]), key
