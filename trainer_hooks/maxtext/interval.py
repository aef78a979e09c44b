"""How often to snapshot: by measurement, so that snapshots cost at most :data:`BUDGET` of the step time,
less what the hook itself costs at every step boundary (:attr:`SnapshotInterval.fixed`).

A snapshot's cost is not the time ``Snapshotter.save`` takes to return: the
copy to pinned host memory runs on after it, beside the following steps (on
a TPU over the host link, here on the same CPU cores as the step), and slows
them. So the cost of a snapshot is measured over its *window*: from the
boundary where ``save`` was called to the boundary where the next one is due,
against the same number of steps without snapshots::

    overhead fraction = (sum of the window's step slots - n x baseline slot) / (n x baseline slot)

(in a window longer than ``2 x COPY_SLOTS``, the sum of its first ``COPY_SLOTS``
slots against the median of the others, which serves as that window's own
baseline: on a shared host the step time drifts by more than 2% within a
few hundred steps),

where a slot is the wall time from one step boundary (just before the save
call, if any) to the next one, so it holds the save call, the step, and any
slowdown the copy causes. Holds, rebuilds and slots in which MaxText started a
periodic checkpoint are not counted.

Per train attempt (a new mesh): ``WARMUP_SLOTS`` slots are skipped
(compilation, first metrics), ``BASELINE_SLOTS`` without snapshots give the
baseline (their median), then snapshots run at the current interval and every
``ROUND_WINDOWS`` windows the interval is corrected: up by the measured
factor (at most ``MAX_GROWTH`` times) when the round's median window is over
budget, down by at most half when two rounds in a row are well under it.

The first interval is a probe, ``PROBE_EVERY`` steps: its windows are long
enough to hold a snapshot's whole copy and a baseline of their own, so the
first round measures what one snapshot costs in seconds, and the interval
goes straight to what that cost asks for (at most ``PROBE_MAX_GROWTH`` times
the probe). Started from one step and grown at most ``MAX_GROWTH`` times a
round, a snapshot costing 2.6 steps (the tiny MaxText model here: about 64 ms
against a 25 ms step) took about 300 steps, at several times the budget, to
reach its interval; from the probe it takes one round. The
baseline is measured again before every round once the interval is
``FRESH_BASELINE_FROM`` steps or more (a round then lasts long enough for the
step time to drift), else every ``REBASELINE_WINDOWS`` windows.

The probe's correction goes either way: a snapshot that costs next to nothing
(a small state) goes straight to the interval its cost allows, down to every
step, instead of halving every other round.

With periodic checkpoints every ``ceiling`` steps, a snapshot only helps when
it is newer than the newest checkpoint. When the interval a round asks for
reaches the ceiling, snapshots stop (:attr:`SnapshotInterval.off`): they would
cost the whole budget for a crash loss the checkpoints already bound as tightly
(a 1 GiB state copied in 0.17 s against a 56 ms step asks for about 200 steps,
with a checkpoint every 50). They stay off for the process's later attempts;
a restore then comes from the newest committed checkpoint.

Pure: no clock, no JAX; the hook feeds it the slot times.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

TARGET = 0.02
"""The steady step overhead a user accepts for being protected (issue 23): the sidecar's whole cost."""
BUDGET = 0.015
"""Steady step overhead that ``auto`` keeps the hook and its snapshots within: :data:`TARGET` less a quarter
for what the windows cannot see, being in the baseline as well (the sidecar daemon's CPU and the link's thread
on a shared host, which the recovery benchmark counts and the hook's own windows do not)."""
WARMUP_SLOTS = 3
BASELINE_SLOTS = 8
ROUND_WINDOWS = 3
REBASELINE_WINDOWS = 24
COPY_SLOTS = 4
"""In a window longer than twice this, the snapshot's cost is read from its first ``COPY_SLOTS`` slots
(the save call and the steps its copy runs beside) against the median of the rest."""
MAX_GROWTH = 4
"""The interval grows at most this many times per round (a noisy round must not jump it far)."""
PROBE_EVERY = 2 * COPY_SLOTS + 1
"""The first interval of ``auto``: the shortest window that carries its own baseline (see :data:`COPY_SLOTS`)."""
PROBE_MAX_GROWTH = 64
"""The probe round's correction is bounded by this factor instead of :data:`MAX_GROWTH`: its windows measure
the whole copy, not the part of it that fits in a short window, and their median leaves out a burst."""
FRESH_BASELINE_FROM = 8
"""From this interval on, every round is preceded by a fresh baseline (its cost, ``BASELINE_SLOTS``
steps without a snapshot, is then small beside the round's ``ROUND_WINDOWS`` x interval steps)."""
MAX_EVERY = 100_000


@dataclass
class SnapshotInterval:
    """``every``: a fixed interval (>= 1), 0 for none, or ``AUTO`` (-1) to choose it by measurement."""

    every: int
    budget: float = BUDGET
    ceiling: int = 0
    """Steps between periodic checkpoints (0: none): ``auto`` stops snapshotting when the interval it needs
    reaches it (see the module's docstring)."""
    auto: bool = field(init=False)
    current: int = field(init=False)
    """The interval in force (auto: the one being measured; 0 once :attr:`off`)."""
    off: bool = False
    """Auto found that snapshots would need an interval of at least :attr:`ceiling`: none are taken."""
    baseline: float | None = None
    """Median slot seconds without snapshots, this attempt."""
    last_fraction: float | None = None
    """The overhead fraction of the newest measurement round."""
    fixed: float = 0.0
    """The fraction of a step that the hook itself costs at every boundary (its bookkeeping and step
    report, measured by the hook): in every slot, baseline included, so the windows cannot see it.
    The snapshots get the rest of the budget (:attr:`snapshot_budget`)."""
    _phase: str = "warmup"
    _slots: list[float] = field(default_factory=list)
    _window: list[float] = field(default_factory=list)
    _round: list[tuple[float, float]] = field(default_factory=list)
    """(overhead seconds, the same slots' seconds without snapshots) of the round's complete windows."""
    _windows_since_baseline: int = 0
    _since_save: int = 0
    _in_window: bool = False
    _announced: bool = False
    _low_rounds: int = 0

    def __post_init__(self) -> None:
        self.auto = self.every < 0
        self.current = PROBE_EVERY if self.auto else self.every

    @property
    def snapshot_budget(self) -> float:
        """What the snapshots may cost: the budget less the hook's own fixed cost, at least a quarter of it
        (a hook that costs the whole budget by itself still snapshots, at a sparse interval)."""
        return max(self.budget / 4, self.budget - max(0.0, self.fixed))

    # -- what the hook asks --------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether to snapshot at the boundary before step index ``step``."""
        if not self.auto:
            return self.every > 0 and step > 0 and step % self.every == 0
        if self.off or self._phase != "measure":
            return False
        return self._since_save + 1 >= self.current

    def new_attempt(self) -> None:
        """A new train attempt (a new mesh): measure again from the warm-up."""
        self._phase = "warmup"
        self._slots.clear()
        self._window.clear()
        self._round.clear()
        self._in_window = False
        self._since_save = 0
        self.baseline = None

    def slot(self, seconds: float, *, saved: bool, counted: bool = True) -> int | None:
        """The slot that just ended: ``saved`` if a save was handed over at its start. Returns the new
        interval when this slot completed a round that changed it (auto only), else None."""
        if not self.auto or self.off:
            return None
        if saved:
            self._window = [seconds] if counted else []
            self._in_window = counted
            self._since_save = 0
            return self._close_window()
        self._since_save += 1
        if self._phase == "warmup":
            self._slots.append(seconds)
            if len(self._slots) >= WARMUP_SLOTS:
                self._phase, self._slots = "baseline", []
            return None
        if self._phase == "baseline":
            if counted:
                self._slots.append(seconds)
            if len(self._slots) >= BASELINE_SLOTS:
                self.baseline = statistics.median(self._slots)
                self._phase, self._slots = "measure", []
                self._since_save = self.current  # the next boundary saves
            return None
        if self._in_window:
            if counted:
                self._window.append(seconds)
            else:  # a hold or a checkpoint inside the window: it cannot be measured
                self._in_window, self._window = False, []
        return self._close_window()

    def skipped(self) -> int | None:
        """A due save was skipped because the previous one was still copying: the copy takes longer
        than the interval, so the interval doubles (auto only). Returns the new interval, or None."""
        if not self.auto or self.off or self._phase != "measure":
            return None
        self.current = min(MAX_EVERY, self.current * 2)
        self._round.clear()
        self._in_window, self._window = False, []
        return 0 if self._reached_ceiling() else self.current

    # -- measuring -------------------------------------------------------------------

    def _close_window(self) -> int | None:
        """A window ends after ``current`` slots (where the next save is due), not at the next save,
        so that a fresh baseline can follow it before any new copy starts."""
        if not self._in_window or self.baseline is None or len(self._window) < self.current:
            return None
        w, n = self._window, len(self._window)
        if n > 2 * COPY_SLOTS:
            # A long window carries its own baseline: the median of its slots past the copy's reach,
            # so that the step time drifting (other work on the host) is not read as the snapshot's cost.
            local = statistics.median(w[COPY_SLOTS:])
            self._round.append((sum(w[:COPY_SLOTS]) - COPY_SLOTS * local, n * local))
        else:
            self._round.append((sum(w) - n * self.baseline, n * self.baseline))
        self._windows_since_baseline += 1
        self._window, self._in_window = [], False
        if len(self._round) < ROUND_WINDOWS:
            return None
        # The median window of the round: one window hit by a burst of other work on the host (or
        # straddling its end) does not decide the interval.
        fraction = max(0.0, statistics.median(o / b if b > 0 else 0.0 for o, b in self._round))
        self._round.clear()
        # The first round to close is the probe's (no fraction measured before it).
        probe = self.last_fraction is None
        growth = PROBE_MAX_GROWTH if probe else MAX_GROWTH
        self.last_fraction = fraction
        before = self.current
        budget = self.snapshot_budget
        wanted = max(1, math.ceil(self.current * fraction / budget))
        low = fraction < budget / 2
        if fraction > budget:
            self.current = min(MAX_EVERY, max(self.current + 1, min(wanted, growth * self.current)))
            if self._reached_ceiling():
                return 0
        elif low and probe:  # nearly free: straight to what the cost allows
            self.current = wanted
        elif low and self._low_rounds >= 1:  # twice in a row well under budget: snapshot more often
            self.current = max(wanted, self.current // 2, 1)
        self._low_rounds = self._low_rounds + 1 if low and self.current == before else 0
        if self.current >= FRESH_BASELINE_FROM or self._windows_since_baseline >= REBASELINE_WINDOWS:
            # A round of long windows lasts long enough for the step time to drift (other work on
            # the host, a slower phase of training): measure the baseline again right before it.
            self._windows_since_baseline = 0
            self._phase, self._slots = "baseline", []
        if self.current != before or not self._announced:
            self._announced = True
            return self.current
        return None

    def _reached_ceiling(self) -> bool:
        """Whether the interval now reaches the checkpoint period: if so snapshots stop (see :attr:`off`)."""
        if self.ceiling <= 0 or self.current < self.ceiling:
            return False
        self.off, self.current, self._announced = True, 0, True
        return True
