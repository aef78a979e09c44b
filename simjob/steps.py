"""The end of a trained step and of a resume, the same in every example trainer (JAX, NumPy,
multi-controller).

A step is padded to ``--step-seconds``, stretched by the demo's slow faults, reported to the
elastic session, and described by the fields of its ``step`` event; a resume is reported to the
session and logged as a ``resumed`` event. Each trainer process writes its events as JSON lines
(:class:`EventLog`), which the demo harness reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simjob.slowdowns import SlowFile


class EventLog:
    def __init__(self, path: Path) -> None:
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def __call__(self, kind: str, fields: dict[str, Any]) -> None:
        self._f.write(json.dumps({"t": time.time(), "kind": kind, **fields}, default=str) + "\n")
        self._f.flush()


def events_path(base: Path, index: int) -> Path:
    """Process ``index``'s event log: ``base`` for process 0, ``-p<index>`` before the suffix for the others."""
    return base if index == 0 else base.with_name(f"{base.stem}-p{index}{base.suffix}")


def end_step(
    session: Any, step: int, t0: float, step_seconds: float, active: Sequence[int], slow: SlowFile, loss: float
) -> dict[str, Any]:
    """Ends ``step`` (the step just trained, started at monotonic ``t0``) on the ``active`` slices;
    returns its ``step`` event's fields. ``session`` None: a trainer without the hooks."""
    pad = step_seconds - (time.monotonic() - t0)
    if pad > 0:
        time.sleep(pad)
    # A synchronous step waits for its slowest slice: the step's work, that many times as long.
    factor, slowed = slow.step_factor(active)
    if factor > 1.0:
        time.sleep((time.monotonic() - t0) * (factor - 1.0))
    dt = time.monotonic() - t0
    if session is not None:
        session.report_step(step, dt)
    return {
        "step": step,
        "seconds": dt,
        "loss": loss,
        "slices": list(active),
        "generation": 0 if session is None else session.generation,
        # The demo's slow faults on this step's slices (the harness's stand-in metrics follow them).
        **({"slowdowns": {str(k): v for k, v in slowed.items()}} if slowed else {}),
    }


def resumed(
    session: Any, events: Any, d: Any, step: int, restored_from: str, t0: float, fields: dict[str, Any]
) -> None:
    """Reports the resume on directive ``d`` (begun at monotonic ``t0``) from ``step`` to the session
    and the event log; ``fields``: what this trainer adds to its ``resumed`` event."""
    dt = time.monotonic() - t0
    session.resumed(d, step, restored_from, dt)
    events(
        "resumed",
        {
            "generation": d.generation,
            "from_step": step,
            "slices": list(d.active_slices),
            "restored_from": restored_from,
            "rebuild_seconds": dt,
            "reason": d.reason,
            **fields,
        },
    )
