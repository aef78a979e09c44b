"""Turns the coordinator's journal and the trainer's event log into figures.

Per fault:
* ``detection_seconds``: fault until the coordinator first records the slice as
  down (``detection_source`` says which signal got there first);
* ``hold_seconds``: the coordinator's hold command until its resume command;
* ``recovery_seconds``: fault until the trainer completes a step numbered above
  the last step it completed before the fault (progress regained);
* ``stall_seconds``: fault until the first step completed after the trainer
  resumed on the new slice set (a hung host lets the step in flight finish,
  so progress can be "regained" before the stall shows);
* ``lost_steps``: completed steps that had to be recomputed (the rewind of the
  first resume after the fault, from the highest step completed before it);
  ``interrupted_step`` says whether the step in flight failed with DATA_LOSS
  and was redone (the work of at most that one step);
* ``flush_bytes``: what the trainer wrote to storage for the fault's holds (0 for a
  drain served from memory).
Faults on the job's own processes (``coordinator-restart``, ``coordinator-stall``,
``trainer-kill``) name no slice: their detection is the coordinator noticing
the trainer gone (``TrainerDetached``, for a trainer kill) and nothing for the
coordinator's own faults; the other figures read the same.
For the run: ``final_step``, ``wall_seconds``, ``goodput`` (time of the steps
that count over wall time), ``slices_timeline``, ``rewinds`` and their sum
``lost_steps`` (every resume from below the highest step completed before it),
and ``failure_recoveries``:
the recoveries counted against ``elastic_max_retries`` (``retries_used`` of the
coordinator's final state file, else of its last ``/status``), with
``failure_recoveries_journal``, the failure holds its journal records
("recovery N of M"; one per operation, see :func:`failure_recoveries`), as a
cross-check across coordinator restarts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simjob.demo_common import fit, round_floats, width


@dataclass(frozen=True)
class FaultRecord:
    kind: str
    slice: int | None
    host: int | None
    at_step: int
    time: float
    step_seen: int
    seconds: float | None = None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every JSON line of an event or journal file (a line cut short by a kill is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
    return out


_RECOVERY = re.compile(r"\(recovery (\d+) of (\d+)\)")


def failure_recoveries(
    journal: list[dict[str, Any]], state_path: Path | None, status: dict[str, Any] | None
) -> tuple[int | None, str | None, int]:
    """Recoveries spent: (value, where it was read, failure holds in the journal).

    The journal records a decision before its state is durable (agent/coordinator.py: decide,
    journal, write the state file, then act). A coordinator killed between its journal line and
    its state write never carried that hold out, and its successor decides the same hold again,
    under the same operation (``recovery-<generation>``): one recovery, two lines. So holds are
    counted by operation; a line without one counts alone.
    """
    ops = {
        str(j.get("operation") or f"line {i}")
        for i, j in enumerate(journal)
        if _RECOVERY.search(str(j.get("reason", "")))
    }
    in_journal = len(ops)
    if state_path is not None and state_path.exists():
        try:
            return int(json.loads(state_path.read_text())["retries_used"]), "state file", in_journal
        except (ValueError, KeyError, TypeError, OSError):
            pass
    if status is not None and "retries_used" in status:
        return int(status["retries_used"]), "status", in_journal
    return None, None, in_journal


def _fault_detection(f: FaultRecord, journal: list[dict[str, Any]], t_next: float) -> dict[str, Any] | None:
    """The journal record where the coordinator first saw fault ``f``, if it did before the next fault."""
    window = [j for j in journal if f.time <= j["time"] < t_next]
    if f.slice is not None:
        return next((j for j in window if f.slice not in j.get("up_slices", [])), None)
    if f.kind == "trainer-kill":
        return next((j for j in window if j.get("trigger") == "TrainerDetached"), None)
    return None


def summarize(
    workdir: Path,
    faults: list[FaultRecord],
    t_start: float,
    wall: float,
    codes: dict[str, int | None],
    *,
    journal_path: Path | None = None,
    state_path: Path | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    journal = read_jsonl(journal_path or workdir / "journal.jsonl")
    tev = read_jsonl(workdir / "trainer-events.jsonl")
    steps = [e for e in tev if e["kind"] == "step"]
    resumes = [e for e in tev if e["kind"] == "resumed"]
    failures = [e for e in tev if e["kind"] == "step_failed"]
    helds = [e for e in tev if e["kind"] == "held"]

    # Every rewind of the run: a resume from below the highest step completed before it.
    rewinds = []
    position = 0  # the step the trainer's state is at
    for e in sorted(steps + resumes, key=lambda e: e["t"]):
        if e["kind"] == "step":
            position = int(e["step"])
            continue
        if position > int(e["from_step"]):
            rewinds.append({"t": round(e["t"] - t_start, 3), "from_step": int(e["from_step"]), "completed": position})
        position = int(e["from_step"])
    out_faults = []
    for i, f in enumerate(faults):
        t_next = faults[i + 1].time if i + 1 < len(faults) else float("inf")
        before = [e for e in steps if e["t"] <= f.time]
        last_before = max((e["step"] for e in before), default=0)
        slices_before = len(before[-1]["slices"]) if before else None
        # What happens after the next fault is that fault's, not this one's (a fault the job
        # absorbs without a hold, e.g. a sidecar restart, must not borrow the next one's hold).
        detect = _fault_detection(f, journal, t_next)
        hold = None
        if detect is not None or f.slice is None:
            t_from = detect["time"] if detect is not None else f.time
            hold = next(
                (
                    j
                    for j in journal
                    if t_from <= j["time"] < t_next and any(a["type"] == "HoldTrainer" for a in j["actions"])
                ),
                None,
            )
        resume = None
        if hold is not None:
            resume = next(
                (
                    j
                    for j in journal
                    if j["time"] >= hold["time"] and any(a["type"] == "ResumeTrainer" for a in j["actions"])
                ),
                None,
            )
        regained = next((e for e in steps if e["t"] > f.time and e["step"] > last_before), None)
        first_resume = next((r for r in resumes if f.time < r["t"] < t_next), None)
        flowing = None
        if first_resume is not None:
            flowing = next((e for e in steps if e["t"] > first_resume["t"]), None)
        in_flight = sum(
            1 for e in failures if f.time <= e["t"] < min(t_next, first_resume["t"] if first_resume else t_next)
        )
        lost = None
        if first_resume is not None:
            rewind = next((r for r in rewinds if r["t"] == round(first_resume["t"] - t_start, 3)), None)
            lost = rewind["completed"] - rewind["from_step"] if rewind else 0
        source = None
        if detect is not None:
            d = detect.get("event_detail", {})
            source = detect["trigger"] + (
                f"({d['cause']})" if "cause" in d else f"({d['source']})" if "source" in d else ""
            )
        out_faults.append(
            {
                "kind": f.kind,
                "fault": _name(f),
                "time": round(f.time, 4),
                "slice": f.slice,
                "host": f.host,
                "at_step": f.at_step,
                "step_at_fault": last_before,
                "detection_seconds": round(detect["time"] - f.time, 4) if detect else None,
                "detection_source": source,
                "hold_seconds": round(resume["time"] - hold["time"], 4) if hold and resume else None,
                "recovery_seconds": round(regained["t"] - f.time, 4) if regained else None,
                "stall_seconds": round(flowing["t"] - f.time, 4) if flowing else None,
                "lost_steps": lost,
                "interrupted_step": in_flight > 0,
                "restored_from": first_resume["restored_from"] if first_resume else None,
                "flush_bytes": sum(int(e.get("flush_bytes") or 0) for e in helds if f.time <= e["t"] < t_next),
                "slices_before": slices_before,
                "slices_after": len(first_resume["slices"]) if first_resume else None,
            }
        )

    # Goodput: the last completion of each step number counts, redone ones don't.
    last_by_step: dict[int, float] = {}
    for e in steps:
        last_by_step[e["step"]] = e["seconds"]
    productive = sum(last_by_step.values())
    final_step = max(last_by_step, default=0)
    recoveries, rec_source, rec_journal = failure_recoveries(journal, state_path, status)
    timeline = [
        {"t": round(r["t"] - t_start, 3), "slices": r["slices"], "restored_from": r["restored_from"]} for r in resumes
    ]
    return {
        "faults": out_faults,
        "final_step": final_step,
        "wall_seconds": round(wall, 3),
        "goodput": round(productive / wall, 4) if wall > 0 else 0.0,
        "productive_seconds": round(productive, 3),
        "slices_timeline": timeline,
        "rewinds": rewinds,
        "lost_steps": sum(r["completed"] - r["from_step"] for r in rewinds),
        "failure_recoveries": recoveries,
        "failure_recoveries_source": rec_source,
        "failure_recoveries_journal": rec_journal,
        "exit_codes": codes,
        "decisions": len(journal),
        "workdir": str(workdir),
    }


TIMELINE_TRIGGERS = ("WorkerLost", "TrainerSliceError", "WorkerHealth")
TRAINER_KINDS = ("resumed", "step_failed", "held", "abort", "finished")


def journal_row(j: dict[str, Any]) -> str | None:
    """A coordinator decision as a timeline line (None: not one worth a line)."""
    if not (j.get("actions") or j.get("trigger") in TIMELINE_TRIGGERS):
        return None
    return f"[coordinator g{j.get('generation')} {j.get('phase')}] {j.get('reason')}"


def trainer_row(e: dict[str, Any]) -> str | None:
    """A trainer event as a timeline line: its fields as key=value, floats rounded."""
    if e.get("kind") not in TRAINER_KINDS:
        return None
    detail = " ".join(f"{k}={json.dumps(round_floats(v), default=str)}" for k, v in e.items() if k not in ("t", "kind"))
    return f"[trainer] {e['kind']} {detail}"


def _name(f: FaultRecord) -> str:
    if f.slice is not None:
        return f"{f.kind}:{f.slice}.{f.host}@{f.at_step}"
    if f.seconds is not None:
        return f"{f.kind}:{f.seconds:g}@{f.at_step}"
    return f"{f.kind}@{f.at_step}"


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}{unit}"
    return f"{v}{unit}"


def render(
    summary: dict[str, Any],
    t_start: float,
    workdir: Path,
    *,
    timeline: bool = True,
    journal_path: Path | None = None,
) -> str:
    lines: list[str] = []
    if timeline:
        lines.append("\nTimeline (coordinator decisions and trainer resumes):")
        journal = read_jsonl(journal_path or workdir / "journal.jsonl")
        tev = read_jsonl(workdir / "trainer-events.jsonl")
        rows: list[tuple[float, str]] = []
        for j in journal:
            row = journal_row(j)
            if row is not None:
                rows.append((j["time"], row))
        for e in tev:
            row = trainer_row(e)
            if row is not None:
                rows.append((e["t"], row))
        for t, text in sorted(rows):
            lines.append(fit(f"  +{t - t_start:7.3f}s  ", text))
    lines.append("\nFaults:")
    hdr = (
        f"  {'fault':<26}{'detect':>9}  {'via':<30}{'hold':>9}{'recover':>10}{'stall':>9}{'lost':>6}"
        f"{'slices':>9}  restored"
    )
    table = len(hdr) + 8 <= width()
    if table:
        lines.append(hdr)
    for f in summary["faults"]:
        name = f.get("fault") or f"{f['kind']}:{f['slice']}.{f['host']}@{f['at_step']}"
        sl = f"{_fmt(f['slices_before'])}->{_fmt(f['slices_after'])}"
        if not table:  # a narrow terminal: one wrapped line per fault
            lines.append(
                fit(
                    "  ",
                    f"{name}: detected {_fmt(f['detection_seconds'], 's')} via {_fmt(f['detection_source'])}, "
                    f"hold {_fmt(f['hold_seconds'], 's')}, recovered {_fmt(f['recovery_seconds'], 's')}, stall "
                    f"{_fmt(f['stall_seconds'], 's')}, lost steps {_fmt(f['lost_steps'])}, slices {sl}, "
                    f"restored from {_fmt(f['restored_from'])}",
                )
            )
            continue
        lines.append(
            f"  {name:<26}{_fmt(f['detection_seconds'], 's'):>9}  {_fmt(f['detection_source']):<30}"
            f"{_fmt(f['hold_seconds'], 's'):>9}{_fmt(f['recovery_seconds'], 's'):>10}{_fmt(f['stall_seconds'], 's'):>9}"
            f"{_fmt(f['lost_steps']):>6}{sl:>9}"
            f"  {_fmt(f['restored_from'])}"
        )
    if not summary["faults"]:
        lines.append("  (none)")
    codes = ", ".join(f"{k} {v}" for k, v in summary["exit_codes"].items())
    lines.append("")
    lines.append(
        fit(
            "Run: ",
            f"final step {summary['final_step']}, wall {summary['wall_seconds']:.1f} s, goodput "
            f"{summary['goodput']:.1%}, failure recoveries {_fmt(summary.get('failure_recoveries'))}, "
            f"exit codes: {codes or 'none'}; logs in {workdir}/logs",
        )
    )
    return "\n".join(lines)
