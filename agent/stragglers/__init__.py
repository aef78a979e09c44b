"""Stragglers: find the slice that slows every step, and drain it when that is cheaper than keeping it.

Two pure stages, as the decision core: :func:`detect` turns per-window summaries into findings
(which slice stands out, for how long, or a job-wide slowdown), and :func:`decide` weighs each
finding's cost into a verdict (drain, alert or keep). Detecting is not acting: neither does I/O or
reads a clock. The rules and what is not verified are in docs/stragglers.md.
"""

from agent.stragglers.cost import CostParams, Outlook, Verdict, decide, drain_cost_seconds, keep_cost_seconds
from agent.stragglers.detect import (
    Detection,
    DetectorState,
    Finding,
    SliceSummary,
    SliceTrack,
    Thresholds,
    WindowSummary,
    detect,
)

__all__ = [
    "CostParams",
    "Detection",
    "DetectorState",
    "Finding",
    "Outlook",
    "SliceSummary",
    "SliceTrack",
    "Thresholds",
    "Verdict",
    "WindowSummary",
    "decide",
    "detect",
    "drain_cost_seconds",
    "keep_cost_seconds",
]
