"""Each decision as people read it: a log line, an entry in the feed (WatchEvents, the status page) and a
line in the decision journal; a recovery's decisions from its hold to its resume share one operation id."""

from __future__ import annotations

import time
from typing import Any

from agent import log as logmod
from agent.core.model import Decision, Event, HoldTrainer, Phase, State, Tick, TrainerResumed, TrainerStepped
from agent.durable.journal import Journal, action_record, event_detail
from agent.servers.feed import EventFeed

log = logmod.get("coordinator")


class DecisionRecord:
    """Writes each decision to the log, the feed and the journal (quiet ticks and steps are skipped)."""

    def __init__(self, feed: EventFeed, journal: Journal) -> None:
        self.feed = feed
        self.journal = journal
        self.last_reason = ""
        self._recovery: int | None = None
        """Generation of the hold that began the recovery in progress (its log operation id)."""

    def record(self, ev: Event, d: Decision, before: State, phases: dict[str, float]) -> None:
        """``phases``: the recovery phases this decision ended (the coordinator's PhaseClock)."""
        quiet = isinstance(ev, (Tick, TrainerStepped)) and not d.actions and d.state.phase == before.phase
        if quiet and not phases:
            return
        s = d.state
        fields: dict[str, Any] = {
            "trigger": type(ev).__name__,
            "phase": str(s.phase),
            "generation": s.generation,
            "active_slices": sorted(s.active),
            "up_slices": sorted(s.up_slices()),
            "actions": [action_record(a) for a in d.actions],
            **({"phases": {k: round(v, 6) for k, v in phases.items()}} if phases else {}),
        }
        flags = self._operation(ev, d, fields)
        log.info(d.reason, **fields, **({"operation_flags": flags} if flags else {}))
        self.last_reason = d.reason
        rec = {"time": time.time(), "reason": d.reason, **{k: v for k, v in fields.items() if k != "operation"}}
        self.feed.publish(rec)
        if self.journal.file is not None:
            rec = {
                "time": time.time(),
                "reason": d.reason,
                **fields,
                "retries_used": s.retries_used,
                "event_detail": event_detail(ev),
            }
            self.journal.append(logmod.bounded(rec) + "\n")  # at most log.MAX_LINE_BYTES

    def _operation(self, ev: Event, d: Decision, fields: dict[str, Any]) -> dict[str, bool]:
        """Tag a recovery's decisions with its operation id; flag its first (the hold) and last (the resume)."""
        s = d.state
        flags: dict[str, bool] = {}
        if self._recovery is None and any(isinstance(a, HoldTrainer) for a in d.actions):
            self._recovery = s.generation
            flags["first"] = True
        if self._recovery is not None:
            fields["operation"] = f"recovery-{self._recovery}"
            resumed = (
                isinstance(ev, TrainerResumed)
                and ev.generation == s.generation
                and s.phase == Phase.RUNNING
                and not s.trainer.resume_pending
            )
            if resumed or s.phase.terminal:
                flags["last"] = True
                self._recovery = None
        return flags
