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
from typing import Literal, NamedTuple

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


@dataclass(frozen=True)
class _Evidence:
    """What one counted window says, before any slice's memory is consulted."""

    step: float
    slowdown: float | None
    """Step time over the baseline, less one; None until the baseline is long enough."""
    slow: bool
    lateness: Mapping[int, float]
    standing: frozenset[int]
    """Slices that stand out this window, after the majority and two-slice rules."""
    note: str
    """Why a late slice was not counted as standing out, or empty."""
    second: Mapping[int, str]
    """The second signal of each standing slice, where two slices are seen."""


class _Turn(NamedTuple):
    on: bool
    since: float | None
    entered: bool
    left: bool


def _turn(on: bool, since: float | None, hits: tuple[bool, ...], now: float, t: Thresholds) -> _Turn:
    """k-of-n with hysteresis: on at ``enter_hits`` of the last windows, off at ``leave_hits`` or fewer."""
    n = sum(hits)
    entered = not on and n >= t.enter_hits
    left = on and n <= t.leave_hits
    return _Turn((on or entered) and not left, now if entered else (None if left else since), entered, left)


def _slowdown(state: DetectorState, step: float, t: Thresholds) -> float | None:
    if len(state.baseline) < t.baseline_min:
        return None
    return step / statistics.median(state.baseline) - 1


def _lateness(seen: Mapping[int, SliceSummary], step: float) -> dict[int, float]:
    """The others' median wait less this slice's, as a share of the step."""
    waits = {i: s.collective_wait_seconds for i, s in seen.items() if s.collective_wait_seconds is not None}
    if len(waits) < 2:
        return {}
    return {i: (statistics.median(x for j, x in waits.items() if j != i) - w) / step for i, w in waits.items()}


def _two_slice_rule(
    seen: Mapping[int, SliceSummary], standing: set[int], t: Thresholds
) -> tuple[frozenset[int], str, dict[int, str]]:
    """With two slices seen, lateness cannot say which side is at fault: keep only a late slice
    that has a second signal."""
    kept, note, second = set(standing), "", {}
    for i in list(standing):
        sig = seen[i].second_signal(t)
        if sig is None:
            kept.discard(i)
            note = f"slice {i} is late, but with two slices seen lateness needs a second signal and none came"
        else:
            second[i] = sig
    return frozenset(kept), note, second


def _standing_out(
    seen: Mapping[int, SliceSummary], lateness: Mapping[int, float], t: Thresholds
) -> tuple[frozenset[int], str, dict[int, str]]:
    """The slices late enough to stand out, a note on any late slice left out, and second signals."""
    standing = {i for i, x in lateness.items() if x >= t.lateness_min}
    if standing and 2 * len(standing) > len(seen):
        return frozenset(), f"slices {sorted(standing)} all stand out, which is no one slice's lateness", {}
    if len(seen) != 2:
        return frozenset(standing), "", {}
    return _two_slice_rule(seen, standing, t)


def _evidence(state: DetectorState, window: WindowSummary, step: float, t: Thresholds) -> _Evidence:
    seen = {s.slice: s for s in window.slices if s.seen}
    slowdown = _slowdown(state, step, t)
    lateness = _lateness(seen, step)
    standing, note, second = _standing_out(seen, lateness, t)
    slow = slowdown is not None and slowdown >= t.slowdown_min
    return _Evidence(step, slowdown, slow, lateness, standing, note, second)


def _blind_finding(i: int, tr: SliceTrack) -> Finding:
    tail = f"; a straggler since {tr.since:g}" if tr.straggler else ""
    why = f"blind: its metrics could not be read this window{tail}"
    return Finding("slice", i, "blind", why, hits=sum(tr.hits), counted=len(tr.hits), since=tr.since)


def _no_baseline_finding(i: int, tr: SliceTrack, ev: _Evidence) -> Finding:
    why = (
        "no baseline step time yet"
        + (": the job has had too few windows without a late slice" if i in ev.standing else "")
        + ", so nothing counts"
    )
    return Finding("slice", i, _standing(tr), why, ev.lateness.get(i), None, sum(tr.hits), len(tr.hits), tr.since)


def _lateness_why(i: int, ev: _Evidence, slowdown: float, hit: bool, t: Thresholds) -> str:
    late = ev.lateness.get(i)
    if hit:
        why = f"arrived {late:.0%} of the step late while the step ran {slowdown:.0%} over its baseline"
        return why + (f", with {ev.second[i]}" if i in ev.second else "")
    if i in ev.standing:
        return f"arrived {late:.0%} of the step late but the step ran only {slowdown:.0%} over its baseline"
    if late is not None and late >= t.lateness_min:
        return f"arrived {late:.0%} of the step late, but {ev.note}"
    return "not late at the collective" + (f" ({ev.note})" if ev.note else "")


def _count_slice(
    i: int, tr: SliceTrack, ev: _Evidence, slowdown: float, now: float, t: Thresholds
) -> tuple[SliceTrack, Finding]:
    """A seen slice in a counted window: remember whether it stood out and judge it on its last windows."""
    hit = i in ev.standing and ev.slow
    hits = _push(tr.hits, hit, t.windows)
    slowdowns = _push(tr.slowdowns, slowdown, t.windows) if hit else tr.slowdowns
    n_hits = sum(hits)
    turn = _turn(tr.straggler, tr.since, hits, now, t)
    track = SliceTrack(hits, slowdowns if not turn.left else (), turn.on, turn.since)
    why = _lateness_why(i, ev, slowdown, hit, t) + f"; stood out in {n_hits} of the last {len(hits)} counted windows"
    if turn.entered:
        why = f"straggler: {why} (enters at {t.enter_hits})"
    elif turn.left:
        why = f"recovered: {why} (leaves at {t.leave_hits} or fewer)"
    status: Status = "straggler" if turn.on else "suspect" if n_hits else "healthy"
    shown = statistics.median(slowdowns) if turn.on and slowdowns else slowdown
    finding = Finding(
        "slice", i, status, why, ev.lateness.get(i), shown, n_hits, len(hits), turn.since, turn.entered, turn.left
    )
    return track, finding


def _judge_slice(
    s: SliceSummary, tr: SliceTrack, ev: _Evidence, now: float, t: Thresholds
) -> tuple[SliceTrack, Finding]:
    if not s.seen:
        return tr, _blind_finding(s.slice, tr)
    if ev.slowdown is None:
        return tr, _no_baseline_finding(s.slice, tr, ev)
    return _count_slice(s.slice, tr, ev, ev.slowdown, now, t)


def _job_finding(state: DetectorState, why: str, slowdown: float | None) -> Finding:
    status: Status = "job_wide" if state.job_wide else "healthy"
    hits = state.job_hits
    return Finding("job", None, status, why, None, slowdown, sum(hits), len(hits), state.job_since)


def _judge_job(
    state: DetectorState, ev: _Evidence, blind: list[int], now: float, t: Thresholds
) -> tuple[DetectorState, Finding]:
    """A slowdown that no slice explains is job-wide, but only when every slice was seen (a blind
    slice may be the one that is late)."""
    slowdown = ev.slowdown
    if slowdown is None:
        return state, _job_finding(state, "no baseline step time yet", None)
    if blind and ev.slow and not ev.standing:
        why = f"the step ran {slowdown:.0%} over its baseline, but slices {blind} are blind and may be the cause"
        return state, _job_finding(state, why, slowdown)
    job_hit = ev.slow and not ev.standing
    job_hits = _push(state.job_hits, job_hit, t.windows)
    turn = _turn(state.job_wide, state.job_since, job_hits, now, t)
    if job_hit:
        why = f"the step ran {slowdown:.0%} over its baseline on every slice alike"
    elif ev.standing:
        why = f"slices {sorted(ev.standing)} late at the collective explain the step's {slowdown:+.0%}"
    else:
        why = f"the step ran {slowdown:+.0%} against its baseline"
    why += f"; job-wide in {sum(job_hits)} of the last {len(job_hits)} counted windows"
    new = replace(state, job_hits=job_hits, job_wide=turn.on, job_since=turn.since)
    return new, _job_finding(new, why, slowdown)


def _next_baseline(state: DetectorState, ev: _Evidence, blind: list[int], t: Thresholds) -> tuple[float, ...]:
    """Only a normal window (no slice standing out, no slowdown, nothing blind) sets the pace."""
    if ev.standing or ev.slow or blind:
        return state.baseline
    return _push(state.baseline, ev.step, t.baseline_windows)


def _reason(findings: list[Finding], job_wide: bool, blind: list[int]) -> str:
    stragglers = [f.slice for f in findings if f.status == "straggler"]
    said = f"stragglers {stragglers}" if stragglers else "job-wide slowdown" if job_wide else "no straggler"
    return said + (f"; blind {blind}" if blind else "")


def detect(state: DetectorState, window: WindowSummary, now: float, t: Thresholds = DEFAULT_THRESHOLDS) -> Detection:
    """One window's findings, and the state for the next window."""
    state = _follow_membership(state, window)
    skipped = window.disturbances()
    if skipped:
        return _unchanged(state, window, f"window skipped, it held a {' and a '.join(skipped)}: counts neither way")
    step = window.step_seconds
    if step is None or step <= 0:
        return _unchanged(state, window, "window skipped: the trainer reported no step time in it")

    ev = _evidence(state, window, step, t)
    tracks = dict(state.slices)
    findings: list[Finding] = []
    for s in sorted(window.slices, key=lambda s: s.slice):
        tracks[s.slice], finding = _judge_slice(s, tracks[s.slice], ev, now, t)
        findings.append(finding)
    blind = sorted(s.slice for s in window.slices if not s.seen)
    after, job = _judge_job(state, ev, blind, now, t)
    findings.append(job)
    new = replace(after, slices=MappingProxyType(tracks), baseline=_next_baseline(state, ev, blind, t))
    return Detection(new, tuple(findings), _reason(findings, new.job_wide, blind))
