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
Each fault's ``phases`` split its recovery, and the grow back onto its slice, into
seconds from one mark to the next (:mod:`simjob.phases`); ``phase_restores`` says where
each restore took the state from and its bytes.
For the run: ``final_step``, ``wall_seconds``, ``goodput`` (time of the steps
that count over wall time), ``startup_seconds`` (until the trainer's first resume:
processes, JAX, the first compile), ``training_goodput`` (the steps that count over the
time from then to the last step), ``slices_timeline``, ``rewinds`` and their sum
``lost_steps`` (every resume from below the highest step completed before it),
and ``failure_recoveries``:
the recoveries counted against ``elastic_max_retries`` (``retries_used`` of the
coordinator's final state file, else of its last ``/status``), with
``failure_recoveries_journal``, the failure holds its journal records
("recovery N of M"; one per operation, see :func:`failure_recoveries`), as a
cross-check across coordinator restarts.
``stragglers``: each straggler verdict of the coordinator's journal (:func:`stragglers`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simjob.phases import grow_of, recovery_phases, restore_of
from simjob.text import fit, round_floats, width


@dataclass(frozen=True)
class FaultRecord:
    kind: str
    slice: int | None
    host: int | None
    at_step: int
    time: float
    step_seen: int
    seconds: float | None = None
    factor: float | None = None


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
    if f.kind == "slow":  # seen when the coordinator decided to drain the slow slice (one of them, for *)
        return next(
            (
                j
                for j in window
                if j.get("trigger") == VERDICT
                and (j.get("event_detail") or {}).get("action") == "drain"
                and f.slice in (None, (j.get("event_detail") or {}).get("slice"))
            ),
            None,
        )
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
        if detect is not None or (f.slice is None and f.kind != "slow"):
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
        record = {
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
        record |= _fault_phases(f, hold, first_resume, slices_before, resumes, rewinds, t_start, journal, tev)
        out_faults.append(record)

    # Goodput: the last completion of each step number counts, redone ones don't.
    last_by_step: dict[int, float] = {}
    for e in steps:
        last_by_step[e["step"]] = e["seconds"]
    productive = sum(last_by_step.values())
    final_step = max(last_by_step, default=0)
    recoveries, rec_source, rec_journal = failure_recoveries(journal, state_path, status)
    # Start-up (processes, JAX, the first compile, the initial state) until the trainer's first resume;
    # training from there to its last step.
    started = resumes[0]["t"] if resumes else None
    ended = max((e["t"] for e in steps), default=None)
    training = ended - started if started is not None and ended is not None and ended > started else None
    timeline = [
        {"t": round(r["t"] - t_start, 3), "slices": r["slices"], "restored_from": r["restored_from"]} for r in resumes
    ]
    return {
        "faults": out_faults,
        "final_step": final_step,
        "wall_seconds": round(wall, 3),
        "goodput": round(productive / wall, 4) if wall > 0 else 0.0,
        "productive_seconds": round(productive, 3),
        "startup_seconds": round(started - t_start, 3) if started is not None else None,
        "training_seconds": round(training, 3) if training else None,
        "training_goodput": round(min(1.0, productive / training), 4) if training else None,
        "slices_timeline": timeline,
        "rewinds": rewinds,
        "lost_steps": sum(r["completed"] - r["from_step"] for r in rewinds),
        "failure_recoveries": recoveries,
        "failure_recoveries_source": rec_source,
        "failure_recoveries_journal": rec_journal,
        "stragglers": stragglers(journal, tev, faults),
        "exit_codes": codes,
        "decisions": len(journal),
        "workdir": str(workdir),
    }


VERDICT = "StragglerVerdict"
MAX_VERDICT_LINES = 10


def _rate(steps: list[float], start: float | None, end: float | None) -> float | None:
    """Steps a second completed in (start, end]; None where there is no such span."""
    if start is None or end is None or end <= start:
        return None
    return round(sum(1 for t in steps if start < t <= end) / (end - start), 3)


def _slowdown_of(t: float, where: int | None, slows: list[FaultRecord]) -> FaultRecord | None:
    """The injected slowdown a verdict answers: the latest begun by then on its slice (or on every
    slice), for a job-wide verdict the latest of all."""
    begun = [f for f in slows if f.time <= t]
    if where is not None and where >= 0:
        begun = [f for f in begun if f.slice in (None, where)] or begun
    return begun[-1] if begun else None


def stragglers(
    journal: list[dict[str, Any]], tev: list[dict[str, Any]], faults: list[FaultRecord]
) -> list[dict[str, Any]]:
    """One object per ``StragglerVerdict`` line of the journal, with the step rate around it.

    ``seconds_from_slowdown``: the verdict's time less the start of the injected slowdown it answers.
    Step rates (steps a second, the trainer's completed steps): ``before`` from the first resume to the
    slowdown, ``during`` from the slowdown to the verdict, ``after`` from the trainer's resume without
    the slice (a drain) or from the slowdown's end (otherwise) to the last step; None where there is no
    such span (no slowdown injected, one that never ended, a drain the trainer never resumed from).
    """
    steps = sorted(float(e["t"]) for e in tev if e.get("kind") == "step")
    resumes = sorted((e for e in tev if e.get("kind") == "resumed"), key=lambda e: e["t"])
    first = float(resumes[0]["t"]) if resumes else None
    end = steps[-1] if steps else None
    slows = sorted((f for f in faults if f.kind == "slow"), key=lambda f: f.time)
    out = []
    for v in sorted((j for j in journal if j.get("trigger") == VERDICT), key=lambda j: j["time"]):
        d = v.get("event_detail") or {}
        t = float(v["time"])
        slow = _slowdown_of(t, d.get("slice"), slows)
        began = slow.time if slow is not None else None
        if d.get("action") == "drain":
            back = next((r for r in resumes if r["t"] > t and d.get("slice") not in r.get("slices", [])), None)
            after_from = float(back["t"]) if back is not None else None
        else:
            after_from = began + slow.seconds if slow is not None and slow.seconds is not None else None
        out.append(
            {
                "time": round(t, 4),
                "slice": d.get("slice"),
                "scope": d.get("scope"),
                "action": d.get("action"),
                "reason": d.get("reason"),
                "slowdown": d.get("slowdown"),
                "lateness": d.get("lateness"),
                "fault": _name(slow) if slow is not None else None,
                "seconds_from_slowdown": round(t - began, 3) if began is not None else None,
                "step_rate_before": _rate(steps, first, began),
                "step_rate_during": _rate(steps, began, t),
                "step_rate_after": _rate(steps, after_from, end),
            }
        )
    return out


def straggler_lines(verdicts: list[dict[str, Any]]) -> list[str]:
    """A line per verdict: what, when from the slowdown, the step rate around it, and why."""
    if not verdicts:
        return []
    lines = ["\nStraggler verdicts (step rates in steps/s before, during and after the slowdown):"]
    shown = verdicts
    if len(verdicts) > MAX_VERDICT_LINES:  # keep verdicts can come every window: counted, not listed
        shown = [v for v in verdicts if v.get("action") != "keep"]
    for v in shown:
        who = "job-wide" if v.get("scope") == "job" else f"slice {v.get('slice')}"
        rates = "/".join(_fmt(v.get(k)) for k in ("step_rate_before", "step_rate_during", "step_rate_after"))
        text = f"{v.get('action')} {who}, {_fmt(v.get('seconds_from_slowdown'), ' s')} after the slowdown"
        text += f" ({v.get('fault') or 'none injected'}); steps/s {rates}: {v.get('reason') or '-'}"
        lines.append(fit("  ", text))
    if len(shown) < len(verdicts):
        lines.append(f"  and {len(verdicts) - len(shown)} keep verdicts (all in --summary-json)")
    return lines


def _fault_phases(
    f: FaultRecord,
    hold: dict[str, Any] | None,
    first_resume: dict[str, Any] | None,
    slices_before: int | None,
    resumes: list[dict[str, Any]],
    rewinds: list[dict[str, Any]],
    t_start: float,
    journal: list[dict[str, Any]],
    tev: list[dict[str, Any]],
) -> dict[str, Any]:
    """A fault's ``phases`` (:mod:`simjob.phases`), where each restore took the state from, and the
    steps the grow's resume redid."""
    grow = grow_of(first_resume, resumes, f.slice, slices_before)
    shrunk = first_resume is not None and slices_before is not None and len(first_resume["slices"]) < slices_before
    phases = recovery_phases(
        f.time, hold["time"] if hold else None, first_resume, grow, shrunk=shrunk, journal=journal, tev=tev
    )
    grow_lost = grow_slices = None
    if grow is not None:
        rewind = next((r for r in rewinds if r["t"] == round(grow["t"] - t_start, 3)), None)
        grow_lost = rewind["completed"] - rewind["from_step"] if rewind else 0
        before = [r for r in resumes if r["t"] < grow["t"]]
        grow_slices = [len(before[-1]["slices"]) if before else None, len(grow["slices"])]
    return {
        "phases": phases,
        "phase_restores": {"recovery": restore_of(first_resume), "grow": restore_of(grow)},
        "grow_lost_steps": grow_lost,
        "grow_slices": grow_slices,
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
    # The phase marks (``*_t``, wall-clock times) are for the summary; their phases are printed there.
    detail = " ".join(
        f"{k}={json.dumps(round_floats(v), default=str)}"
        for k, v in e.items()
        if k not in ("t", "kind") and not k.endswith("_t")
    )
    return f"[trainer] {e['kind']} {detail}"


def _name(f: FaultRecord) -> str:
    if f.kind == "slow":
        until = "" if f.seconds is None else f"+{f.seconds:g}"
        return f"slow:{'*' if f.slice is None else f.slice}:{f.factor:g}@{f.at_step}{until}"
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
    lines += fault_table(summary["faults"])
    lines += straggler_lines(summary.get("stragglers") or [])
    codes = ", ".join(f"{k} {v}" for k, v in summary["exit_codes"].items())
    lines.append("")
    lines.append(
        fit(
            "Run: ",
            f"final step {summary['final_step']}, wall {summary['wall_seconds']:.1f} s of which start-up "
            f"{_fmt(summary.get('startup_seconds'), ' s')}, goodput {_pct(summary.get('training_goodput'))} of "
            f"training ({summary['goodput']:.1%} of the wall time), failure recoveries {_fmt(summary.get('failure_recoveries'))}, "
            f"exit codes: {codes or 'none'}; logs in {workdir}/logs",
        )
    )
    return "\n".join(lines)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _size(n: int | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _source(r: dict[str, Any] | None) -> str:
    if not r:
        return "-"
    return f"{r.get('source') or '-'} {_size(r.get('bytes'))}".strip()


TABLE_COLUMNS = (
    ("slices", "slices the job trained on before and after the recovery, or the grow back onto the slice"),
    ("detect", "the fault (or notice) until the coordinator decided to hold the trainer"),
    ("degraded", "first step on fewer slices until the coordinator decided to grow back"),
    ("hold", "that decision until the trainer stopped at a step boundary"),
    ("wait", "stopped until the trainer got the coordinator's resume (waiting for enough slices)"),
    ("rebuild", "resume received until the new mesh's train step was compiled (0: kept from before)"),
    ("restore", "the state put back on the new mesh's devices"),
    ("first", "the first step on the new mesh (first_step)"),
    ("lost", "completed steps done again after this resume"),
    ("state from", "where the restored state came from (live replicas, snapshot, checkpoint) and its size"),
)


def fault_table(faults: list[dict[str, Any]]) -> list[str]:
    """Each fault's recovery and its grow back, a row each, in seconds, with one line defining each column."""
    hdr = (
        f"  {'fault':<14}{'slices':>6}{'detect':>7}{'degraded':>9}{'hold':>6}{'wait':>6}{'rebuild':>8}"
        f"{'restore':>8}{'first':>6}{'lost':>5}  state from"
    )
    lines = ["\nFaults (phases in seconds):"]
    table = len(hdr) + 8 <= width()
    if table:
        lines.append(hdr)
    for f in faults:
        name = f.get("fault") or f"{f['kind']}@{f['at_step']}"
        ph = f.get("phases") or {}
        rs = f.get("phase_restores") or {}
        sl = f"{_fmt(f['slices_before'])}->{_fmt(f['slices_after'])}"
        rows = [("recovery", sl, ph.get("detect"), None, "", f.get("lost_steps"), rs.get("recovery"))]
        if rs.get("grow") is not None:
            back = "->".join(_fmt(n) for n in f.get("grow_slices") or [None, None])
            rows.append(("grow", back, None, ph.get("degraded"), "grow_", f.get("grow_lost_steps"), rs.get("grow")))
        if table and len(name) > 14:
            lines.append(f"  {name}")
        for stage, slices, detect, degraded, pre, lost, src in rows:
            if not table:  # a narrow terminal: one wrapped line per stage
                parts = [f"detect {_fmt(detect)}"] if stage == "recovery" else [f"degraded {_fmt(degraded)}"]
                parts += [f"{k} {_fmt(ph.get(pre + k))}" for k in ("hold", "wait", "rebuild", "restore", "first_step")]
                text = f"{stage} {slices}: {', '.join(parts)}, lost steps {_fmt(lost)}, state from {_source(src)}"
                lines.append(fit(f"  {name} ", text))
                continue
            label = name if stage == "recovery" and len(name) <= 14 else f"  {stage}"
            lines.append(
                f"  {label:<14}{slices:>6}{_fmt(detect):>7}{_fmt(degraded):>9}{_fmt(ph.get(pre + 'hold')):>6}"
                f"{_fmt(ph.get(pre + 'wait')):>6}{_fmt(ph.get(pre + 'rebuild')):>8}{_fmt(ph.get(pre + 'restore')):>8}"
                f"{_fmt(ph.get(pre + 'first_step')):>6}{_fmt(lost):>5}  {_source(src)}"
            )
        via = f"detected via {_fmt(f.get('detection_source'))}"
        if ph.get("total") is not None:
            via += f"; back on its slice {ph['total']:.3f} s after the fault"
        elif (
            rs.get("grow") is None
            and (f.get("kind") != "slow" or f.get("slices_after") is not None)  # a slowdown costs no slice
            and (f.get("slices_after") or 0) < (f.get("slices_before") or 0)
        ):
            via += "; not back on its slice before the run ended"
        lines.append(fit("    ", via))
    if not faults:
        lines.append("  (none)")
    else:
        lines += [f"  {name:<11}{text}" for name, text in TABLE_COLUMNS]
    return lines
