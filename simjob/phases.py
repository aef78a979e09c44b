"""A recovery split into its phases, from the coordinator's journal and the trainer's event log.

Each phase runs from one mark to the next, so the phases never overlap and add up to the time from
the fault (or the notice) to the first step after the job grew back onto the fault's slice (``total``):

    fault -detect-> hold decided -hold-> trainer held -wait-> resume received -rebuild-> program
    ready -restore-> state on the devices -first_step-> first step done -degraded-> grow decided
    -grow_hold-> held -grow_wait-> resume received -grow_rebuild-> ready -grow_restore-> restored
    -grow_first_step-> first step on the grown mesh

A mark that is missing (a trainer that restarted holds nowhere; a job that never grew back) leaves
the phases on either side of it None. A mark earlier than the one before it (the trainer reported a
failed step before the coordinator decided, so it was held already) counts as that one: 0 s.
"""

from __future__ import annotations

from typing import Any

SHRINK = ("detect", "hold", "wait", "rebuild", "restore", "first_step")
GROW = ("degraded", "grow_hold", "grow_wait", "grow_rebuild", "grow_restore", "grow_first_step")
PHASES = (*SHRINK, *GROW)

DEFINITIONS = {
    "detect": "fault (or notice) until the coordinator decided to hold",
    "hold": "that decision until the trainer was held at a step boundary",
    "wait": "held until the trainer got the coordinator's resume (waiting for enough slices)",
    "rebuild": "resume received until the new mesh's train step was compiled (0 when kept from before)",
    "restore": "program ready until the state was on the new mesh's devices",
    "first_step": "state restored until the first step on the new mesh completed",
    "degraded": "that step until the coordinator decided to grow back onto the fault's slice",
    "grow_hold": "the grow's decision until the trainer was held",
    "grow_wait": "held until the trainer got the grow's resume",
    "grow_rebuild": "resume received until the grown mesh's train step was ready",
    "grow_restore": "program ready until the state was on the grown mesh",
    "grow_first_step": "state restored until the first step on the grown mesh completed",
}


def _held(tev: list[dict[str, Any]], after: float, resumed: dict[str, Any]) -> float | None:
    """The trainer's last ``held`` event from ``after`` until ``resumed``."""
    return next((e["t"] for e in reversed(tev) if e["kind"] == "held" and after <= e["t"] <= resumed["t"]), None)


def _marks(resumed: dict[str, Any], held: float | None, tev: list[dict[str, Any]]) -> list[float | None]:
    """Held, resume received, program ready, state restored, first step done: one resume's marks."""
    step = next((e["t"] for e in tev if e["kind"] == "step" and e["t"] > resumed["t"]), None)
    return [held, resumed.get("directive_t"), resumed.get("program_ready_t"), resumed.get("restored_t"), step]


def recovery_phases(
    fault_time: float,
    decision_time: float | None,
    first_resume: dict[str, Any] | None,
    grow_resume: dict[str, Any] | None,
    *,
    shrunk: bool,
    journal: list[dict[str, Any]],
    tev: list[dict[str, Any]],
) -> dict[str, float | None]:
    """Seconds per phase of one fault's recovery (:data:`PHASES`), and ``total``.

    ``decision_time``: when the coordinator decided the hold for the fault (journal time);
    ``first_resume``: the trainer's ``resumed`` event that ended that hold; ``shrunk``: whether it
    left the job on fewer slices; ``grow_resume``: the later ``resumed`` event that brought the
    fault's slice back (None when there was none). ``journal`` and ``tev`` in time order.
    """
    marks: list[float | None] = [fault_time, decision_time]
    if first_resume is None:
        marks += [None] * 5
    else:
        marks += _marks(first_resume, _held(tev, fault_time, first_resume), tev)
    if grow_resume is not None:
        after = marks[-1] if marks[-1] is not None else fault_time
        held = _held(tev, after, grow_resume)
        decided = next(
            (j["time"] for j in reversed(journal) if _is_hold(j) and held is not None and after <= j["time"] <= held),
            None,
        )
        marks += [decided, *_marks(grow_resume, held, tev)]
    # A mark before the one it follows (held before the decision: the trainer had stopped on a failed
    # step already) counts as that one.
    last: float | None = None
    for i, m in enumerate(marks):
        if m is not None:
            last = marks[i] = m if last is None else max(m, last)
    out: dict[str, float | None] = dict.fromkeys(PHASES)
    for name, a, b in zip(PHASES, marks, marks[1:], strict=False):
        out[name] = None if a is None or b is None else round(b - a, 4)
    if grow_resume is None and not shrunk and all(out[p] is not None for p in SHRINK):
        out["degraded"] = 0.0  # it came back at full size: nothing to grow
    needed = PHASES if grow_resume is not None else SHRINK if not shrunk else PHASES
    whole = all(out[p] is not None for p in needed)
    out["total"] = round(last - fault_time, 4) if whole and last is not None else None
    return out


def _is_hold(j: dict[str, Any]) -> bool:
    return any(a.get("type") == "HoldTrainer" for a in j.get("actions", []))


def grow_of(
    first_resume: dict[str, Any] | None, resumes: list[dict[str, Any]], slice_: int | None, slices_before: int | None
) -> dict[str, Any] | None:
    """The ``resumed`` event that brought the fault's slice back after ``first_resume`` left it out.

    A fault that names no slice grows back when the job is on as many slices as before it again.
    """
    if first_resume is None or slices_before is None or len(first_resume["slices"]) >= slices_before:
        return None
    later = (r for r in resumes if r["t"] > first_resume["t"])
    if slice_ is not None:
        return next((r for r in later if slice_ in r["slices"]), None)
    return next((r for r in later if len(r["slices"]) >= slices_before), None)


def restore_of(resumed: dict[str, Any] | None) -> dict[str, Any] | None:
    """Where a resume took the state from (live replicas, a snapshot, a checkpoint, fresh) and its bytes."""
    if resumed is None:
        return None
    return {
        "source": resumed.get("restore_source", resumed.get("restored_from")),
        "bytes": resumed.get("restore_bytes"),
    }
