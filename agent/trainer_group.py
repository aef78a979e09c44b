"""The processes of one trainer, presented to the decision core as one trainer.

A multi-controller JAX job runs one trainer process per host, joined by
``jax.distributed``; each opens its own trainer link and says which process it
is (``TrainerHello.process_index`` / ``process_count``). The decision core
(:mod:`agent.core`) keeps seeing ONE trainer; this layer, pure and without
I/O (the coordinator feeds it and carries out what it returns), turns N
process links into the events the core understands and says at which step a
hold must happen:

* ``TrainerAttached`` once every process is attached (a process that attaches
  again replaces only its own earlier link), ``TrainerDetached`` as soon as any
  process link goes away;
* ``TrainerStepped`` with the lowest step every process has completed;
* ``TrainerHeld`` once every process acknowledged the hold of one generation:
  at one step, or with ``disagreement`` naming who held where (the core then
  fails the job: such processes cannot resume together); its committed step is
  the lowest any process committed, and any process's flush error is the hold's;
* ``TrainerFlushed`` when the lowest committed step of all processes rises (a
  collective flush counts only when every process committed it), or at once
  with the error of a process whose flush failed;
* ``TrainerResumed`` and ``TrainerFinished`` once every process said so.

Slice errors pass through. Every command goes to every process;
:meth:`TrainerGroup.hold_step` chooses the agreed step boundary of a hold: the
highest step any process reported plus a margin that covers the time a command
takes to reach a process (``lead_seconds`` of steps at the median step time,
at least ``min_margin_steps``), remembered per generation so a repeated hold
names the same step. With one process everything passes through unchanged and
holds name no step (the next boundary), as before multi-controller support.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from agent.core.model import (
    Event,
    TrainerAttached,
    TrainerDetached,
    TrainerFinished,
    TrainerFlushed,
    TrainerHeld,
    TrainerResumed,
    TrainerStepped,
)

MIN_MARGIN_STEPS = 2
"""Fewest steps between the highest reported step and a hold's agreed step."""
LEAD_SECONDS = 0.5
"""Time a hold needs to reach every process (report lag, link, a step in flight): the margin covers this much."""
MAX_MARGIN_STEPS = 1000
RECENT_STEPS = 15


@dataclass
class ProcessView:
    """What the coordinator knows of one trainer process."""

    index: int
    host: str = ""
    attached: bool = False
    generation: int = 0
    step: int = -1
    """Newest step it completed (hello, step reports, acknowledgements)."""
    committed: int = -1
    held: bool = False
    active: frozenset[int] = frozenset()
    finished: int | None = None


@dataclass
class TrainerGroup:
    """N process links -> one trainer's events; see the module docstring."""

    process_count: int = 1
    min_margin_steps: int = MIN_MARGIN_STEPS
    lead_seconds: float = LEAD_SECONDS
    procs: dict[int, ProcessView] = field(default_factory=dict)
    complete: bool = False
    """Every process is attached and the core was told so."""
    _first: TrainerAttached | None = None
    _hold_steps: dict[int, int] = field(default_factory=dict)
    _held: dict[int, TrainerHeld] = field(default_factory=dict)
    _held_generation: int = -1
    _resumed: dict[int, TrainerResumed] = field(default_factory=dict)
    _resumed_generation: int = -1
    _stepped: int = -1
    """Lowest completed step told to the core."""
    _committed: int = -1
    """Lowest committed step told to the core."""
    _step_seconds: list[float] = field(default_factory=list)

    @property
    def single(self) -> bool:
        return self.process_count <= 1

    def check_hello(self, index: int, count: int) -> str:
        """Why a hello naming process ``index`` of ``count`` cannot join this trainer ("" if it can)."""
        count = max(1, count)
        if count != self.process_count:
            return (
                f"the trainer process says the job has {count} JAX process(es); this coordinator runs with "
                f"--trainer-processes {self.process_count}"
            )
        if not 0 <= index < count:
            return f"process_index {index} is outside 0..{count - 1}"
        return ""

    def attached_processes(self) -> list[int]:
        return sorted(i for i, p in self.procs.items() if p.attached)

    # -- events from the links ------------------------------------------------------

    def attached(self, index: int, ev: TrainerAttached, host: str = "") -> list[Event]:
        """Process ``index`` attached (a later link of the same index replaces the earlier one)."""
        if self.single:
            return [ev]
        p = self.procs.get(index) or ProcessView(index)
        self.procs[index] = replace(
            p,
            host=host,
            attached=True,
            generation=ev.generation,
            step=ev.step_in_memory,
            committed=max(p.committed, ev.committed_step),
            held=ev.held,
            active=ev.active,
            finished=None,
        )
        if index == 0 or self._first is None:
            self._first = ev
        attached = [self.procs[i] for i in self.attached_processes()]
        if len(attached) < self.process_count:
            return []
        self.complete = True
        steps = [q.step for q in attached]
        first = self._first
        active = frozenset.intersection(*(q.active for q in attached))
        return [
            TrainerAttached(
                generation=max(q.generation for q in attached),
                step_in_memory=-1 if min(steps) < 0 else min(steps),
                active=active,
                settings=first.settings if first is not None else None,
                committed_step=min(q.committed for q in attached),
                held=all(q.held for q in attached),
            )
        ]

    def detached(self, index: int) -> list[Event]:
        """Process ``index``'s link closed (not replaced)."""
        if self.single:
            return [TrainerDetached()]
        p = self.procs.get(index)
        if p is not None:
            p.attached = False
        if not self.complete:
            return []
        self.complete = False
        return [TrainerDetached()]

    def message(self, index: int, ev: Event) -> list[Event]:
        """An event from process ``index``'s link: what the core hears of it (maybe nothing yet)."""
        if self.single:
            return [ev]
        p = self.procs.setdefault(index, ProcessView(index))
        match ev:
            case TrainerStepped():
                p.step = max(p.step, ev.step)
                p.held = False
                if ev.seconds > 0:
                    self._step_seconds = [*self._step_seconds, ev.seconds][-RECENT_STEPS:]
                low = self._lowest_step()
                if low is None or low <= self._stepped:
                    return []
                self._stepped = low
                return [TrainerStepped(low, ev.generation, ev.seconds)]
            case TrainerHeld():
                return self._on_held(p, ev)
            case TrainerResumed():
                return self._on_resumed(p, ev)
            case TrainerFlushed():
                p.committed = max(p.committed, ev.committed_step)
                if ev.flush_error:
                    error = f"process {index}: {ev.flush_error}"
                    return [replace(ev, committed_step=self._lowest_committed(), flush_error=error)]
                low = self._lowest_committed()
                if low <= self._committed:
                    return []
                self._committed = low
                return [replace(ev, committed_step=low)]
            case TrainerFinished():
                p.finished = ev.step
                done = [q.finished for q in self.procs.values() if q.finished is not None]
                if len(done) < self.process_count:
                    return []
                return [TrainerFinished(min(done))]
        return [ev]

    def _lowest_step(self) -> int | None:
        if len(self.procs) < self.process_count:
            return None
        return min(q.step for q in self.procs.values())

    def _lowest_committed(self) -> int:
        if len(self.procs) < self.process_count:
            return -1
        return min(q.committed for q in self.procs.values())

    def _on_held(self, p: ProcessView, ev: TrainerHeld) -> list[Event]:
        if ev.generation < self._held_generation:
            return []
        if ev.generation > self._held_generation:
            self._held, self._held_generation = {}, ev.generation
        p.step = max(p.step, ev.step)
        p.committed = max(p.committed, ev.committed_step)
        p.held = True
        p.generation = ev.generation
        self._held[p.index] = ev
        if len(self._held) < self.process_count:
            return []
        acks = [self._held[i] for i in sorted(self._held)]
        self._held = {}
        steps = {a.step for a in acks}
        disagreement = ""
        if len(steps) > 1:
            disagreement = ", ".join(f"process {i} at step {a.step}" for i, a in enumerate(acks))
        errors = [f"process {i}: {a.flush_error}" for i, a in enumerate(acks) if a.flush_error]
        return [
            TrainerHeld(
                generation=ev.generation,
                step=min(steps),
                committed_step=min(a.committed_step for a in acks),
                flush_seconds=max(a.flush_seconds for a in acks),
                flush_bytes=sum(a.flush_bytes for a in acks),
                flush_error="; ".join(errors)[:1000],
                disagreement=disagreement,
            )
        ]

    def _on_resumed(self, p: ProcessView, ev: TrainerResumed) -> list[Event]:
        if ev.generation < self._resumed_generation:
            return []
        if ev.generation > self._resumed_generation:
            self._resumed, self._resumed_generation = {}, ev.generation
        p.step = ev.step
        p.held = False
        p.generation = ev.generation
        p.active = ev.active
        self._resumed[p.index] = ev
        if len(self._resumed) < self.process_count:
            return []
        acks = [self._resumed[i] for i in sorted(self._resumed)]
        self._resumed = {}
        self._stepped = min(a.step for a in acks)
        return [
            TrainerResumed(
                ev.generation,
                min(a.step for a in acks),
                frozenset.intersection(*(a.active for a in acks)),
                acks[0].restored_from,
            )
        ]

    # -- commands -------------------------------------------------------------------

    def hold_step(self, generation: int) -> int:
        """The step boundary every process holds at for the hold of ``generation`` (0: the next one)."""
        if self.single:
            return 0
        if generation in self._hold_steps:
            return self._hold_steps[generation]
        views = list(self.procs.values())
        highest = max((q.step for q in views), default=0)
        if views and all(q.held for q in views):
            at = max(highest, 0)  # already stopped at one boundary: hold there
        else:
            ordered = sorted(self._step_seconds)
            median = ordered[len(ordered) // 2] if ordered else 0.0
            by_time = math.ceil(self.lead_seconds / median) if median > 0 else self.min_margin_steps
            margin = min(MAX_MARGIN_STEPS, max(self.min_margin_steps, by_time))
            at = max(highest, 0) + margin
        self._hold_steps = {g: s for g, s in self._hold_steps.items() if g > generation - 8}
        self._hold_steps[generation] = at
        return at
