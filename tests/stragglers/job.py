"""A synchronous multi-slice job on paper: windows whose waits follow from each slice's compute time.

Each step every slice computes, then meets the others at the cross-slice collective: the step takes
the slowest slice's compute plus the collective itself, and each slice waits there for the slowest.
Tests describe a window by each slice's slowdown factor and get the summary a source would report.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.stragglers import Detection, DetectorState, SliceSummary, Thresholds, WindowSummary, detect

COMPUTE = 1.0  # seconds of a healthy slice's compute per step
COLLECTIVE = 0.1  # seconds the collective itself takes once every slice is there
WINDOW = 60.0


def window(
    factors: Iterable[float],
    *,
    start: float = 0.0,
    blind: Iterable[int] = (),
    second: Mapping[int, dict[str, Any]] | None = None,
    **flags: bool,
) -> WindowSummary:
    """The window of a job whose slice i computes ``factors[i]`` times as long as a healthy one."""
    compute = [COMPUTE * f for f in factors]
    slowest = max(compute)
    slices = tuple(
        SliceSummary(
            i,
            None if i in set(blind) else slowest - c + COLLECTIVE,
            blind=i in set(blind),
            **(second or {}).get(i, {}),
        )
        for i, c in enumerate(compute)
    )
    return WindowSummary(start, start + WINDOW, slowest + COLLECTIVE, slices, **flags)


@dataclass
class Run:
    """Feeds windows to ``detect`` one a minute and keeps every detection."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    state: DetectorState = field(default_factory=DetectorState)
    now: float = 0.0
    detections: list[Detection] = field(default_factory=list)

    def feed(self, w: WindowSummary) -> Detection:
        self.now += WINDOW
        d = detect(self.state, w, self.now, self.thresholds)
        assert all(f.reason.strip() for f in d.findings), d
        self.state = d.state
        self.detections.append(d)
        return d

    def status(self, i: int | None, k: int = -1) -> str:
        """Slice i's status (None: the job's) after the k-th window."""
        return next(f.status for f in self.detections[k].findings if f.slice == i)

    def statuses(self, i: int | None) -> str:
        """Slice i's status after each window, one letter a window: S straggler, s suspect, . healthy,
        b blind, J job-wide."""
        letter = {"straggler": "S", "suspect": "s", "healthy": ".", "blind": "b", "job_wide": "J"}
        return "".join(letter[self.status(i, k)] for k in range(len(self.detections)))
