"""The coordinator's small state file, so a restart of its own process resumes.

Only what cannot be re-learnt is kept: the generation (it must never go
backwards), the phase, the active slices, the retries used, the hosts it knew
(they get a grace period to re-register) and the newest committed step the
trainer reported. The Orbax checkpoint directory stays the ground truth for
what is committed; this file is a hint. Written atomically: temp file, fsync,
rename, fsync of the directory.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.core.model import Phase, State, TrainerView

VERSION = 1


def snapshot(state: State) -> dict[str, Any]:
    """The persisted projection of a state (compare two to see if a write is due)."""
    return {
        "version": VERSION,
        "phase": str(state.phase),
        "generation": state.generation,
        "active": sorted(state.active),
        "retries_used": state.retries_used,
        "hosts": sorted([list(k) for k in state.hosts] + [list(k) for k in state.expected_rejoin]),
        "committed_step": state.trainer.committed_step,
        "last_step": state.trainer.last_step,
        "hold_flush": state.hold_flush,
        "hold_reason": state.hold_reason,
        "hold_down": sorted(state.hold_down),
    }


def write(path: Path, state: State) -> None:
    data = json.dumps(snapshot(state), indent=1).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class StateFileError(ValueError):
    pass


def restore(path: Path, fresh: State, now: float) -> State:
    """Merge a saved file into a freshly initialised state.

    A file from a finished or failed job is not resumed from. A job that was
    running keeps running on the same slices while its hosts get
    ``rejoin_grace_seconds`` to re-register; one that was holding or waiting
    repeats its hold, which the trainer acknowledges again.
    """
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise StateFileError(f"state file {path} is not valid JSON ({e}); move it aside to start fresh") from e
    if raw.get("version") != VERSION:
        raise StateFileError(f"state file {path} has version {raw.get('version')!r}, expected {VERSION}")
    try:
        phase = Phase(raw["phase"])
        policy = fresh.policy
        hosts = frozenset(
            (int(s), int(h))
            for s, h in raw["hosts"]
            if 0 <= int(s) < policy.num_slices and 0 <= int(h) < policy.hosts_per_slice
        )
        trainer = TrainerView(committed_step=int(raw["committed_step"]), last_step=int(raw["last_step"]))
        base = replace(fresh, generation=int(raw["generation"]), retries_used=int(raw["retries_used"]), trainer=trainer)
    except (KeyError, TypeError, ValueError) as e:
        raise StateFileError(f"state file {path} is malformed: {e!r}") from e
    if phase.terminal:
        # A restarted job (xpk restarts on exit 42) gets its retries back; the
        # generation still never goes backwards.
        return replace(base, retries_used=0)
    if phase == Phase.STARTING:
        return base
    active = frozenset(int(s) for s in raw["active"]) & policy.all_slices
    if phase == Phase.RUNNING:
        return replace(
            base,
            phase=Phase.RUNNING,
            active=active,
            expected_rejoin=hosts,
            deadline=now + policy.rejoin_grace_seconds,
        )
    return replace(
        base,
        phase=Phase.HOLDING,
        active=active,
        hold_flush=bool(raw["hold_flush"]),
        hold_reason=str(raw["hold_reason"]),
        hold_down=frozenset(int(s) for s in raw["hold_down"]),
        deadline=now + policy.elastic_timeout_seconds,
    )
