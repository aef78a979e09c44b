"""The straggler decision by cost: ``decide(detection, outlook, now) -> verdicts``, pure.

Both costs are seconds by which the job's end moves. Keeping a straggler costs its slowdown over
the expected remaining time (capped at a day: beyond that the estimate is a guess and a node change
is likely anyway). Draining it costs the drain and grow phases, during which no slice trains, plus
the time on one slice fewer until a replacement arrives: with data parallel across slices, n - 1
slices run at (n - 1)/n of the pace, so each second there loses 1/n of a second.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Literal

from agent.stragglers.detect import Detection, Finding

Action = Literal["drain", "alert", "keep"]


@dataclass(frozen=True)
class CostParams:
    """The decision's parameters; each default says why."""

    horizon_cap_seconds: float = 86_400.0
    """Keeping a straggler is costed over the time left or this, whichever is less: a day is as far
    as a slowdown's persistence and the job's end can be guessed."""
    margin: float = 1.25
    """Drain only when keeping costs this many times what draining costs. The drain's disruption of
    every slice is already in its cost (the measured drain and grow phases); the margin covers the
    estimates' error, so a near tie keeps the slice. A quarter: the slowdown weighed is already the
    median over the windows the slice stood out in, not one window's."""
    drain_interval_seconds: float = 3_600.0
    """At most one straggler drain in this long unless an operator asks: a detector that is wrong
    must not drain the job down a slice at a time."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"CostParams.{f.name} must be a finite number > 0, got {v!r}")
        if self.margin < 1:
            raise ValueError(f"CostParams.margin must be >= 1 (drain only when it pays), got {self.margin}")


DEFAULT_COST = CostParams()


@dataclass(frozen=True)
class Outlook:
    """What the decision knows of the job beyond the window: its size, its policy, its timings."""

    slices_in_service: int
    min_slices: int
    """``Policy.min_slices``: ``elastic_min_slice_count`` resolved (all slices when it is -1)."""
    remaining_seconds: float | None
    """Until the job ends at its healthy pace; None when unknown (then the day cap)."""
    drain_seconds: float
    """The measured drain phase: from the hold to training again on fewer slices."""
    grow_seconds: float
    """The measured grow phase: from a replacement being up to training on it."""
    replacement_seconds: float | None
    """Expected time until a replacement slice is up; None when none is expected."""
    last_straggler_drain_at: float | None = None
    operator_asked: bool = False

    def __post_init__(self) -> None:
        for name in ("remaining_seconds", "drain_seconds", "grow_seconds", "replacement_seconds"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"Outlook.{name} must be a finite number >= 0, got {v!r}")
        if self.slices_in_service < 1 or self.min_slices < 1:
            raise ValueError(
                f"Outlook.slices_in_service and min_slices must be >= 1, got {self.slices_in_service} "
                f"and {self.min_slices}"
            )


@dataclass(frozen=True)
class Verdict:
    """What to do about one finding, with everything it was decided from."""

    action: Action
    scope: Literal["slice", "job"]
    slice: int | None
    status: str
    reason: str
    inputs: Mapping[str, float | int | str | bool | None]


def horizon_seconds(outlook: Outlook, p: CostParams = DEFAULT_COST) -> float:
    r = outlook.remaining_seconds
    return p.horizon_cap_seconds if r is None else min(r, p.horizon_cap_seconds)


def keep_cost_seconds(slowdown: float, outlook: Outlook, p: CostParams = DEFAULT_COST) -> float:
    """How much later the job ends if the straggler stays: its slowdown over the horizon."""
    return max(slowdown, 0.0) * horizon_seconds(outlook, p)


def drain_cost_seconds(outlook: Outlook, p: CostParams = DEFAULT_COST) -> float:
    """How much later the job ends if the straggler is drained (and it is replaced when expected)."""
    n = outlook.slices_in_service
    h = horizon_seconds(outlook, p)
    if n < 2:
        return math.inf
    # Work of h seconds on n - 1 slices takes h * n/(n - 1): h/(n - 1) later. A replacement after
    # r seconds cuts that to r/n, plus its grow phase.
    fewer = h / (n - 1)
    r = outlook.replacement_seconds
    if r is not None and r / n < fewer:
        return outlook.drain_seconds + r / n + outlook.grow_seconds
    return outlook.drain_seconds + fewer


def _one(f: Finding, outlook: Outlook, now: float, last_drain: float | None, p: CostParams) -> Verdict:
    inputs: dict[str, float | int | str | bool | None] = {
        "lateness": f.lateness,
        "slowdown": f.slowdown,
        "hits": f.hits,
        "counted": f.counted,
        "since": f.since,
        "slices_in_service": outlook.slices_in_service,
        "min_slices": outlook.min_slices,
        "remaining_seconds": outlook.remaining_seconds,
        "drain_seconds": outlook.drain_seconds,
        "grow_seconds": outlook.grow_seconds,
        "replacement_seconds": outlook.replacement_seconds,
        "last_straggler_drain_at": last_drain,
        "operator_asked": outlook.operator_asked,
    }

    def v(action: Action, reason: str) -> Verdict:
        return Verdict(action, f.scope, f.slice, f.status, reason, MappingProxyType(dict(inputs)))

    if f.scope == "job":
        if f.status == "job_wide":
            return v("alert", f"job-wide slowdown, never a drain (no one slice to blame): {f.reason}")
        return v("keep", f.reason)
    if f.status != "straggler":
        return v("keep", f.reason)  # blind, suspect or healthy: the reason says which
    keep = keep_cost_seconds(f.slowdown or 0.0, outlook, p)
    drain = drain_cost_seconds(outlook, p)
    inputs["keep_cost_seconds"], inputs["drain_cost_seconds"] = keep, drain
    if outlook.slices_in_service - 1 < outlook.min_slices:
        return v(
            "alert",
            f"straggler kept: draining it leaves {outlook.slices_in_service - 1} slices, below "
            f"elastic_min_slice_count's {outlook.min_slices}; {f.reason}",
        )
    if last_drain is not None and now - last_drain < p.drain_interval_seconds and not outlook.operator_asked:
        return v(
            "alert",
            f"straggler kept: a straggler was drained {now - last_drain:.0f} s ago, and at most one drain "
            f"in {p.drain_interval_seconds:.0f} s goes without an operator; {f.reason}",
        )
    if not keep > p.margin * drain:
        return v(
            "alert",
            f"straggler kept: keeping it costs {keep:.0f} s, draining {drain:.0f} s, not {p.margin:g} times "
            f"less; {f.reason}",
        )
    return v(
        "drain",
        f"drain: keeping it costs {keep:.0f} s, over {p.margin:g} times the {drain:.0f} s a drain costs; {f.reason}",
    )


def decide(detection: Detection, outlook: Outlook, now: float, p: CostParams = DEFAULT_COST) -> tuple[Verdict, ...]:
    """A verdict for each finding, in the detection's order. At most one drain: the straggler that
    arrived latest is weighed first, and the others are kept for a later window."""
    order = sorted(detection.findings, key=lambda f: (f.status != "straggler", -(f.lateness or 0.0)))
    out: dict[int, Verdict] = {}
    drained = False
    for f in order:
        verdict = _one(f, outlook, now, outlook.last_straggler_drain_at, p)
        if verdict.action == "drain" and drained:
            verdict = Verdict(
                "alert",
                f.scope,
                f.slice,
                f.status,
                f"straggler kept: another straggler is drained in this window, one at a time; {f.reason}",
                verdict.inputs,
            )
        drained = drained or verdict.action == "drain"
        out[id(f)] = verdict
    return tuple(out[id(f)] for f in detection.findings)
