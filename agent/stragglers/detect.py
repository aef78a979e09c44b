"""The straggler detector: ``detect(state, window, now) -> Detection``, pure.

In a synchronous step the slow slice arrives last at the cross-slice collective and waits least
there; the others wait for it. So a window's evidence is each slice's lateness (how much less it
waited than the others, as a share of the step), corroborated by the step time's slowdown against
the job's own recent baseline. One window proves nothing: a slice is a straggler only when it stands
out in most of the last few counted windows, and recovers only when it has stood out in almost none.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Literal

Status = Literal["straggler", "suspect", "healthy", "blind", "job_wide"]


def _finite(owner: str, name: str, v: object, *, low: float = 0.0) -> None:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= low):
        raise ValueError(f"{owner}.{name} must be a finite number >= {low}, got {v!r}")


@dataclass(frozen=True)
class Thresholds:
    """The detector's thresholds; each default says why it is what it is (docs/stragglers.md)."""

    lateness_min: float = 0.05
    """A slice stands out when it waited at the collective this share of the step less than the
    median of the others. The slowdowns worth finding are 10-50%; a 10% slower slice arrives about
    9% of the step late, and half of that leaves room for input-pipeline and host jitter."""
    slowdown_min: float = 0.05
    """The step time must be this much above the job's baseline to corroborate a lateness, or to
    call a job-wide slowdown: lateness that costs no step time is not worth a drain."""
    windows: int = 5
    """How many of the latest counted windows are remembered per slice (the n of k-of-n)."""
    enter_hits: int = 3
    """A slice becomes a straggler when it stood out in this many of the last ``windows`` (most of
    them): one noisy window either way neither makes nor spoils the call."""
    leave_hits: int = 1
    """A straggler recovers when it stood out in at most this many of the last ``windows``. Below
    ``enter_hits`` on purpose (hysteresis): a slice that flaps around the line is not drained and
    undrained on alternate windows."""
    baseline_windows: int = 10
    """Step times of this many recent normal windows make the baseline (their median): recent enough
    to follow the job's own pace, long enough that one window does not move it."""
    baseline_min: int = 3
    """Windows of baseline needed before a slowdown is judged at all; until then nothing counts."""
    throttle_score_min: float = 0.0
    """With only two slices seen, lateness alone cannot say which side is at fault, so a second
    signal on the late slice is required; a ``tpu_throttle_score`` above this is one. The score's
    scale is not documented, so any score above zero counts."""

    def __post_init__(self) -> None:
        for f in fields(self):
            _finite("Thresholds", f.name, getattr(self, f.name))
        for name in ("windows", "enter_hits", "baseline_windows", "baseline_min"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"Thresholds.{name} must be a whole number >= 1, got {v!r}")
        if not self.windows // 2 < self.enter_hits <= self.windows:
            raise ValueError(
                f"Thresholds.enter_hits must be most of windows={self.windows} "
                f"(from {self.windows // 2 + 1} to {self.windows}), got {self.enter_hits}"
            )
        if not isinstance(self.leave_hits, int) or not 0 <= self.leave_hits < self.enter_hits:
            raise ValueError(
                f"Thresholds.leave_hits must be a whole number from 0 to enter_hits - 1 = {self.enter_hits - 1}, "
                f"got {self.leave_hits!r}"
            )
        if self.baseline_min > self.baseline_windows:
            raise ValueError(
                f"Thresholds.baseline_min must be at most baseline_windows={self.baseline_windows}, "
                f"got {self.baseline_min}"
            )


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class SliceSummary:
    """One slice over one window, from its hosts' libtpu metrics (docs/stragglers.md names them).

    ``collective_wait_seconds`` is the median time per step the slice spent waiting at the
    cross-slice collective (or idle, where that is the signal the source has); None when not seen.
    A slice whose source could not see is ``blind``: it is never called healthy.
    """

    slice: int
    collective_wait_seconds: float | None
    blind: bool = False
    throttle_score: float | None = None
    links_unhealthy: bool = False
    """``ici_link_health`` reported a bad link on one of the slice's hosts."""
    host_pressure: bool = False
    """The host itself is starved (input pipeline, memory): ``host_compute_latency`` and the like."""

    def __post_init__(self) -> None:
        if not isinstance(self.slice, int) or self.slice < 0:
            raise ValueError(f"SliceSummary.slice must be a whole number >= 0, got {self.slice!r}")
        if self.collective_wait_seconds is not None:
            _finite("SliceSummary", "collective_wait_seconds", self.collective_wait_seconds)
        if self.throttle_score is not None:
            _finite("SliceSummary", "throttle_score", self.throttle_score)

    @property
    def seen(self) -> bool:
        return not self.blind and self.collective_wait_seconds is not None

    def second_signal(self, t: Thresholds) -> str | None:
        """What besides lateness says this slice is slow, or None."""
        if self.throttle_score is not None and self.throttle_score > t.throttle_score_min:
            return f"tpu_throttle_score {self.throttle_score:g}"
        if self.links_unhealthy:
            return "ici_link_health reports a bad link"
        if self.host_pressure:
            return "host pressure"
        return None


@dataclass(frozen=True)
class WindowSummary:
    """One window of the job: its median step time (the trainer hook's) and each slice's summary.

    A window that held a checkpoint, a compile, a resize or an evaluation is not a normal step's
    evidence (one slice may save or compile longer than the others): it counts neither way.
    """

    start: float
    end: float
    step_seconds: float | None
    slices: tuple[SliceSummary, ...]
    checkpoint: bool = False
    compile: bool = False
    resize: bool = False
    evaluation: bool = False

    def __post_init__(self) -> None:
        _finite("WindowSummary", "start", self.start, low=-math.inf)
        _finite("WindowSummary", "end", self.end, low=self.start)
        if self.step_seconds is not None:
            _finite("WindowSummary", "step_seconds", self.step_seconds)
        ids = [s.slice for s in self.slices]
        if len(set(ids)) != len(ids):
            raise ValueError(f"WindowSummary.slices names a slice twice: {sorted(ids)}")

    def disturbances(self) -> tuple[str, ...]:
        return tuple(n for n in ("checkpoint", "compile", "resize", "evaluation") if getattr(self, n))


@dataclass(frozen=True)
class SliceTrack:
    """What the detector remembers of one slice: its last counted windows (True: stood out)."""

    hits: tuple[bool, ...] = ()
    slowdowns: tuple[float, ...] = ()
    """The step slowdown of the windows it stood out in, latest last (at most ``windows``)."""
    straggler: bool = False
    since: float | None = None
    """When it became a straggler."""


@dataclass(frozen=True)
class DetectorState:
    """Everything the detector carries from one window to the next; rebuilt from nothing on restart
    (a restarted coordinator only waits a few windows longer)."""

    slices: Mapping[int, SliceTrack] = field(default_factory=lambda: MappingProxyType({}))
    baseline: tuple[float, ...] = ()
    """Step seconds of recent normal windows on the current set of slices."""
    job_hits: tuple[bool, ...] = ()
    job_wide: bool = False
    job_since: float | None = None


@dataclass(frozen=True)
class Finding:
    """The detector's word on one slice (``scope`` ``slice``) or on the job (``scope`` ``job``)."""

    scope: Literal["slice", "job"]
    slice: int | None
    status: Status
    reason: str
    lateness: float | None = None
    """Share of the step this slice arrived later than the median of the others, this window."""
    slowdown: float | None = None
    """Step time over the baseline, less one: this window's, or for a straggler the median over the
    windows it stood out in."""
    hits: int = 0
    counted: int = 0
    since: float | None = None
    entered: bool = False
    left: bool = False


@dataclass(frozen=True)
class Detection:
    state: DetectorState
    findings: tuple[Finding, ...]
    """One per slice of the window, by slice, then one for the job."""
    reason: str


def _push(xs: tuple, x: object, n: int) -> tuple:
    return (*xs, x)[-n:]


def _standing(tr: SliceTrack) -> Status:
    return "straggler" if tr.straggler else "suspect" if any(tr.hits) else "healthy"


def _follow_membership(state: DetectorState, window: WindowSummary) -> DetectorState:
    """Forget slices that left; a new set of slices, or a resize, runs at a new pace: new baseline."""
    ids = {s.slice for s in window.slices}
    if window.resize or set(state.slices) != ids:
        kept = {i: state.slices.get(i, SliceTrack()) for i in sorted(ids)}
        return replace(state, slices=MappingProxyType(kept), baseline=(), job_hits=(), job_wide=False, job_since=None)
    return state


def _unchanged(state: DetectorState, window: WindowSummary, why: str) -> Detection:
    """A window that counts neither way: each slice keeps its standing; a blind one still says so."""
    out = []
    for s in sorted(window.slices, key=lambda s: s.slice):
        tr = state.slices[s.slice]
        hits = sum(tr.hits)
        if not s.seen:
            status: Status = "blind"
        else:
            status = _standing(tr)
        out.append(Finding("slice", s.slice, status, why, hits=hits, counted=len(tr.hits), since=tr.since))
    job: Status = "job_wide" if state.job_wide else "healthy"
    out.append(Finding("job", None, job, why, hits=sum(state.job_hits), counted=len(state.job_hits)))
    return Detection(state, tuple(out), why)


def detect(state: DetectorState, window: WindowSummary, now: float, t: Thresholds = DEFAULT_THRESHOLDS) -> Detection:
    """One window's findings, and the state for the next window."""
    state = _follow_membership(state, window)
    skipped = window.disturbances()
    if skipped:
        return _unchanged(state, window, f"window skipped, it held a {' and a '.join(skipped)}: counts neither way")
    if window.step_seconds is None or window.step_seconds <= 0:
        return _unchanged(state, window, "window skipped: the trainer reported no step time in it")

    seen = {s.slice: s for s in window.slices if s.seen}
    step = window.step_seconds
    slowdown = step / statistics.median(state.baseline) - 1 if len(state.baseline) >= t.baseline_min else None
    slow = slowdown is not None and slowdown >= t.slowdown_min

    # Lateness: the others' median wait less this slice's, as a share of the step.
    lateness: dict[int, float] = {}
    waits = {s.slice: s.collective_wait_seconds for s in seen.values() if s.collective_wait_seconds is not None}
    if len(waits) >= 2:
        for i, w in waits.items():
            lateness[i] = (statistics.median(x for j, x in waits.items() if j != i) - w) / step
    standing = {i for i, x in lateness.items() if x >= t.lateness_min}
    note = ""
    if standing and 2 * len(standing) > len(seen):
        note = f"slices {sorted(standing)} all stand out, which is no one slice's lateness"
        standing = set()
    second: dict[int, str] = {}
    if len(seen) == 2:
        for i in list(standing):
            sig = seen[i].second_signal(t)
            if sig is None:
                standing.discard(i)
                note = f"slice {i} is late, but with two slices seen lateness needs a second signal and none came"
            else:
                second[i] = sig

    findings: list[Finding] = []
    tracks = dict(state.slices)
    for s in sorted(window.slices, key=lambda s: s.slice):
        i = s.slice
        tr = tracks[i]
        if not s.seen:
            tail = f"; a straggler since {tr.since:g}" if tr.straggler else ""
            findings.append(
                Finding(
                    "slice",
                    i,
                    "blind",
                    f"blind: its metrics could not be read this window{tail}",
                    hits=sum(tr.hits),
                    counted=len(tr.hits),
                    since=tr.since,
                )
            )
            continue
        late = lateness.get(i)
        if slowdown is None:
            why = (
                "no baseline step time yet"
                + (": the job has had too few windows without a late slice" if i in standing else "")
                + ", so nothing counts"
            )
            findings.append(
                Finding(
                    "slice",
                    i,
                    _standing(tr),
                    why,
                    late,
                    None,
                    sum(tr.hits),
                    len(tr.hits),
                    tr.since,
                )
            )
            continue
        hit = i in standing and slow
        hits_t = _push(tr.hits, hit, t.windows)
        slowdowns = _push(tr.slowdowns, slowdown, t.windows) if hit else tr.slowdowns
        n_hits = sum(hits_t)
        entered = not tr.straggler and n_hits >= t.enter_hits
        left = tr.straggler and n_hits <= t.leave_hits
        straggler = (tr.straggler or entered) and not left
        since = now if entered else (None if left else tr.since)
        tracks[i] = SliceTrack(hits_t, slowdowns if not left else (), straggler, since)
        if hit:
            why = f"arrived {late:.0%} of the step late while the step ran {slowdown:.0%} over its baseline"
            if i in second:
                why += f", with {second[i]}"
        elif i in standing:
            why = f"arrived {late:.0%} of the step late but the step ran only {slowdown:.0%} over its baseline"
        elif late is not None and late >= t.lateness_min:
            why = f"arrived {late:.0%} of the step late, but {note}"
        else:
            why = "not late at the collective" + (f" ({note})" if note else "")
        why += f"; stood out in {n_hits} of the last {len(hits_t)} counted windows"
        if entered:
            why = f"straggler: {why} (enters at {t.enter_hits})"
        elif left:
            why = f"recovered: {why} (leaves at {t.leave_hits} or fewer)"
        status: Status = "straggler" if straggler else "suspect" if n_hits else "healthy"
        findings.append(
            Finding(
                "slice",
                i,
                status,
                why,
                late,
                statistics.median(slowdowns) if straggler and slowdowns else slowdown,
                n_hits,
                len(hits_t),
                since,
                entered,
                left,
            )
        )

    # The job: a slowdown that no slice explains is job-wide, but only when every slice was seen
    # (a blind slice may be the one that is late).
    blind = sorted(set(tracks) - set(seen))
    job_hits, job_wide, job_since = state.job_hits, state.job_wide, state.job_since
    if slowdown is None:
        job_why = "no baseline step time yet"
    elif blind and slow and not standing:
        job_why = f"the step ran {slowdown:.0%} over its baseline, but slices {blind} are blind and may be the cause"
    else:
        job_hit = slow and not standing
        job_hits = _push(job_hits, job_hit, t.windows)
        n = sum(job_hits)
        entered_j = not job_wide and n >= t.enter_hits
        left_j = job_wide and n <= t.leave_hits
        job_wide = (job_wide or entered_j) and not left_j
        job_since = now if entered_j else (None if left_j else job_since)
        job_why = (
            f"the step ran {slowdown:.0%} over its baseline on every slice alike"
            if job_hit
            else f"slices {sorted(standing)} late at the collective explain the step's {slowdown:+.0%}"
            if standing
            else f"the step ran {slowdown:+.0%} against its baseline"
        ) + f"; job-wide in {n} of the last {len(job_hits)} counted windows"
    findings.append(
        Finding(
            "job",
            None,
            "job_wide" if job_wide else "healthy",
            job_why,
            None,
            slowdown,
            sum(job_hits),
            len(job_hits),
            job_since,
        )
    )

    baseline = state.baseline
    if not standing and not slow and not blind:
        baseline = _push(baseline, step, t.baseline_windows)
    new = DetectorState(MappingProxyType(tracks), baseline, job_hits, job_wide, job_since)
    stragglers = [f.slice for f in findings if f.status == "straggler"]
    reason = (f"stragglers {stragglers}" if stragglers else "job-wide slowdown" if job_wide else "no straggler") + (
        f"; blind {blind}" if blind else ""
    )
    return Detection(new, tuple(findings), reason)
