"""The coordinator's straggler collector: worker windows and step reports in, verdicts out.

Workers report their hosts' metrics windows (peer.proto ``MetricsWindow``). The collector groups
them into job windows (a slice's value: the median of its hosts'), takes the trainer's step time
over the same span, marks a window a hold, a resize, a checkpoint or a compile touched, and runs the
pure detector and cost rule (:mod:`agent.stragglers`). Only a verdict that changes something leaves
it, as a :class:`~agent.core.model.StragglerVerdict` for the decision core. Its memory is the newest
window per host plus bounded histories (docs/stragglers.md, "Where the detector lives").
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.core.model import (
    Decision,
    Event,
    FlushTrainer,
    Phase,
    State,
    StragglerVerdict,
    TrainerFlushed,
    TrainerHeld,
    TrainerStepped,
)
from agent.stragglers.cost import DEFAULT_COST, CostParams, Outlook, Verdict, decide
from agent.stragglers.detect import (
    DEFAULT_THRESHOLDS,
    Detection,
    DetectorState,
    Finding,
    SliceSummary,
    Thresholds,
    WindowSummary,
    detect,
)

PHASE_SECONDS_UNMEASURED = 120.0
"""A drain's or a grow's cost before one was measured in this job: a hold at a step boundary, a
resume and a compile of a large model take minutes, not seconds (docs/stragglers.md)."""
STEPS_KEPT = 4096
"""Step reports kept to find a window's step time (the trainer sends at most 20 a second)."""
DISTURBANCES_KEPT = 256
VERDICTS_KEPT = 50
LATE_WINDOW_FACTOR = 1.5
"""A job window closes once every host in service reported, or when the first report waited this
many window lengths: a host that did not report by then is blind for that window."""


@dataclass(frozen=True)
class HostWindow:
    """One host's window as its worker reported it (peer.proto ``MetricsWindow``)."""

    start: float
    end: float
    blind: str = ""
    collective: float | None = None
    """Median wait at the collective, seconds (its p50, else its mean)."""
    throttle_score: float | None = None
    links_unhealthy: bool = False

    @classmethod
    def from_message(cls, m: Any) -> HostWindow:
        collective = None
        if not m.blind and m.collective_count:
            if m.HasField("collective_p50_seconds"):
                collective = m.collective_p50_seconds
            elif m.HasField("collective_mean_seconds"):
                collective = m.collective_mean_seconds
        return cls(
            m.start_unix,
            m.end_unix,
            m.blind,
            collective,
            m.throttle_score if m.HasField("throttle_score") else None,
            m.HasField("links_unhealthy") and m.links_unhealthy,
        )


def slice_summary(slice_: int, windows: Iterable[HostWindow | None]) -> SliceSummary:
    """A slice over one window: the median of its hosts that saw; blind when none did.

    A synchronous slice waits as one at the cross-slice collective, so its hosts agree; the median
    keeps one odd host from moving the slice. A second signal on any host counts for the slice.
    """
    ws = [w for w in windows if w is not None]
    seen = [w.collective for w in ws if not w.blind and w.collective is not None]
    throttles = [w.throttle_score for w in ws if w.throttle_score is not None]
    return SliceSummary(
        slice_,
        statistics.median(seen) if seen else None,
        blind=not seen,
        throttle_score=max(throttles) if throttles else None,
        links_unhealthy=any(w.links_unhealthy for w in ws),
    )


@dataclass
class _Track:
    """What the collector shows of one slice and remembers to word its verdicts."""

    lateness: deque[float] = field(default_factory=lambda: deque(maxlen=DEFAULT_THRESHOLDS.windows))
    first_hit: float | None = None
    """Start of the first window of the current run of windows it stood out in."""
    finding: Finding | None = None
    said: tuple[str, str] | None = None
    """(status, action) of the last verdict sent about it."""


class StragglerCollector:
    """Feeds the detector from worker windows and decisions; :meth:`tick` returns new verdicts."""

    def __init__(
        self,
        thresholds: Thresholds = DEFAULT_THRESHOLDS,
        cost: CostParams = DEFAULT_COST,
        *,
        replacement_seconds: float | None = None,
        on_window: Callable[[Detection, tuple[Verdict, ...]], None] | None = None,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        """--straggler-detect: off, windows are dropped and nothing is judged."""
        self.thresholds = thresholds
        self.cost = cost
        self.replacement_seconds = replacement_seconds
        self.on_window = on_window
        self.detector = DetectorState()
        self.pending: dict[tuple[int, int], HostWindow] = {}
        """The newest unused window of each host."""
        self.steps: deque[tuple[float, float]] = deque(maxlen=STEPS_KEPT)
        """(wall time of the report, seconds a step) of the trainer's step reports."""
        self.disturbances: deque[tuple[float, float | None, str]] = deque(maxlen=DISTURBANCES_KEPT)
        """(from, until or None while it lasts, kind): spans no window may count in."""
        self.tracks: dict[int | None, _Track] = {}
        self.verdicts: deque[dict[str, Any]] = deque(maxlen=VERDICTS_KEPT)
        self.phase_seconds: dict[str, float] = {}
        """The newest measured drain and grow, hold decision to first step after (decision clock)."""
        self._hold: tuple[float, frozenset[int]] | None = None
        self._resumed_on: frozenset[int] | None = None
        self._flush_at: float | None = None
        self.windows = 0

    @classmethod
    def from_config(cls, cfg: Any, metrics: Any) -> StragglerCollector:
        """The coordinator's collector, as its flags (``CoordinatorConfig.straggler_*``) ask."""
        return cls(
            cfg.straggler_thresholds,
            cfg.straggler_cost,
            replacement_seconds=cfg.straggler_replacement_seconds,
            on_window=lambda detection, _: metrics.observe_straggler_window(detection),
            enabled=cfg.straggler_detect,
        )

    # -- inputs ----------------------------------------------------------------

    def add_window(self, slice_: int, host: int, msg: Any) -> None:
        """A worker's window (``peer_pb2.MetricsWindow``); a newer one replaces an unused older one."""
        if not self.enabled:
            return
        self.pending[(slice_, host)] = HostWindow.from_message(msg)

    def note(self, ev: Event, d: Decision, before: State, wall: float, mono: float) -> None:
        """One decision of the core: step times, disturbances, measured phases, verdict outcomes."""
        s = d.state
        if isinstance(ev, TrainerStepped) and ev.seconds > 0:
            self.steps.append((wall, ev.seconds))
        self._note_disturbance(ev, d, before, wall)
        self._note_phases(ev, s, before, mono)
        if isinstance(ev, StragglerVerdict):
            for v in reversed(self.verdicts):
                if v["slice"] == ev.slice and v["action"] == ev.action and not v["outcome"]:
                    v["outcome"] = outcome(ev, d, before)
                    break

    def _note_disturbance(self, ev: Event, d: Decision, before: State, wall: float) -> None:
        s = d.state
        # Not running, and until the first step after it runs again (its compile): a resize or a hold.
        if before.phase == Phase.RUNNING and s.phase != Phase.RUNNING:
            self.disturbances.append((wall, None, "resize"))
        elif isinstance(ev, TrainerStepped) and s.phase == Phase.RUNNING:
            self._close("resize", wall)
        if any(isinstance(a, FlushTrainer) for a in d.actions):
            self._flush_at = wall
        if isinstance(ev, TrainerFlushed | TrainerHeld) and ev.flush_seconds > 0:
            began = wall - ev.flush_seconds
            if self._flush_at is not None:
                began, self._flush_at = min(began, self._flush_at), None
            self.disturbances.append((began, wall, "checkpoint"))

    def _close(self, kind: str, wall: float) -> None:
        for i, (a, b, k) in enumerate(self.disturbances):
            if k == kind and b is None:
                self.disturbances[i] = (a, wall, k)

    def _note_phases(self, ev: Event, s: State, before: State, mono: float) -> None:
        """A drain's and a grow's cost as measured: from the hold decision to the first step after it."""
        if before.phase == Phase.RUNNING and s.phase == Phase.HOLDING and self._hold is None:
            self._hold = (mono, before.active)
        elif isinstance(ev, TrainerStepped) and self._hold is not None and s.phase == Phase.RUNNING:
            began, was = self._hold
            self._hold = None
            if len(s.active) != len(was):
                self.phase_seconds["drain" if len(s.active) < len(was) else "grow"] = mono - began

    # -- windows -----------------------------------------------------------------

    def _due(self, expected: set[tuple[int, int]], now: float) -> bool:
        got = expected & self.pending.keys()
        if not got:
            return False
        if got == expected:
            return True
        first = min(self.pending[k].end for k in got)
        length = statistics.median(self.pending[k].end - self.pending[k].start for k in got)
        return now - first > LATE_WINDOW_FACTOR * max(length, 0.0)

    def job_window(self, state: State, now: float) -> WindowSummary | None:
        """The job window due now from the windows pending, or None while it is not due."""
        if state.phase != Phase.RUNNING or not state.active:
            self.pending.clear()  # nothing to compare while no step runs on a known set of slices
            return None
        hosts = state.policy.hosts_per_slice
        expected = {(s, h) for s in state.active for h in range(hosts)}
        if not self._due(expected, now):
            return None
        used = {k: self.pending.pop(k) for k in expected & self.pending.keys()}
        start = min(w.start for w in used.values())
        end = max(w.end for w in used.values())
        summaries = tuple(slice_summary(s, (used.get((s, h)) for h in range(hosts))) for s in sorted(state.active))
        steps = [sec for at, sec in self.steps if start < at <= end]
        kinds = {k for a, b, k in self.disturbances if a <= end and (b is None or b >= start)}
        return WindowSummary(
            start,
            max(end, start),
            statistics.median(steps) if steps else None,
            summaries,
            checkpoint="checkpoint" in kinds,
            compile="compile" in kinds,
            resize="resize" in kinds,
        )

    def outlook(self, state: State) -> Outlook:
        p = state.policy
        return Outlook(
            slices_in_service=max(1, len(state.active)),
            min_slices=p.min_slices,
            remaining_seconds=None,
            drain_seconds=self.phase_seconds.get("drain", PHASE_SECONDS_UNMEASURED),
            grow_seconds=self.phase_seconds.get("grow", PHASE_SECONDS_UNMEASURED),
            replacement_seconds=self.replacement_seconds,
            last_straggler_drain_at=state.straggler_drained_at,
        )

    def tick(self, state: State, wall: float, mono: float) -> list[StragglerVerdict]:
        """Close the job window if it is due; the verdicts that change something."""
        if not self.enabled:
            return []
        window = self.job_window(state, wall)
        if window is None:
            return []
        self.windows += 1
        detection = detect(self.detector, window, window.end, self.thresholds)
        self.detector = detection.state
        verdicts = decide(detection, self.outlook(state), mono, self.cost)
        if self.on_window is not None:
            self.on_window(detection, verdicts)
        out = []
        for f, v in zip(detection.findings, verdicts, strict=True):
            ev = self._changed(f, v, window)
            if ev is not None:
                out.append(ev)
                self.verdicts.append(verdict_record(ev, wall))
        return out

    def _changed(self, f: Finding, v: Verdict, window: WindowSummary) -> StragglerVerdict | None:
        """The verdict as an event when it says something new about its slice or the job."""
        tr = self.tracks.setdefault(f.slice, _Track())
        tr.finding = f
        if f.lateness is not None:
            tr.lateness.append(f.lateness)
        if f.hits and tr.first_hit is None:
            tr.first_hit = window.start
        elif not f.hits and f.status != "blind":
            tr.first_hit = None
        if f.status in ("blind", "suspect") or (f.status == "healthy" and tr.said is None):
            return None  # nothing to act on, and nothing said yet to take back
        said = (f.status, v.action)
        if said == tr.said:
            return None
        tr.said = None if f.status == "healthy" else said
        if f.status == "healthy":
            reason = f"recovered: {f.reason}"
            action = "keep"
        else:
            reason, action = v.reason, v.action
        since = tr.first_hit if tr.first_hit is not None else f.since
        return StragglerVerdict(
            -1 if f.slice is None else f.slice, f.scope, action, reason, f.slowdown, f.lateness, since
        )

    def status(self) -> dict[str, Any]:
        """Each slice's recent lateness and standing, and the newest verdicts (admin status, the page)."""
        slices = []
        for s, tr in sorted((k, v) for k, v in self.tracks.items() if k is not None):
            f = tr.finding
            slices.append(
                {
                    "slice": s,
                    "status": f.status if f else "",
                    "lateness": list(tr.lateness),
                    "hits": f.hits if f else 0,
                    "counted": f.counted if f else 0,
                    "reason": f.reason if f else "",
                }
            )
        return {"slices": slices, "verdicts": list(self.verdicts), "windows": self.windows}


def outcome(ev: StragglerVerdict, d: Decision, before: State) -> str:
    """What the decision core made of a verdict, in a few words."""
    if d.rejected:
        return f"refused: {d.rejected}"
    if ev.action != "drain":
        return "no action"
    if d.outcome == "duplicate":
        return "already draining"
    return f"draining slice {ev.slice}" if ev.slice in d.state.drains and ev.slice not in before.drains else d.reason


def verdict_record(ev: StragglerVerdict, wall: float) -> dict[str, Any]:
    return {
        "time": wall,
        "slice": ev.slice,
        "scope": ev.scope,
        "action": ev.action,
        "reason": ev.reason,
        "slowdown": ev.slowdown,
        "lateness": ev.lateness,
        "since": ev.since,
        "outcome": "",
    }
