"""The decision journal: one JSON line a decision, a record for people, not intent."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from agent import log as logmod
from agent.core.model import Action, Event, ResumeSource

log = logmod.get("coordinator")


class Journal:
    """Appends decision lines to ``path`` (rotated to ``<path>.1`` past ``max_bytes``; 0: never).

    A failed open, append or close is counted through ``failed`` and logged, never fatal.
    """

    def __init__(self, path: Path | None, max_bytes: int, failed: Callable[[], None]) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._failed = failed
        self.file: IO[str] | None = None

    def open(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        except OSError as e:  # a record for people, not intent: never a reason not to run
            self._failed()
            log.error("journal cannot be opened; running without it", journal=str(self.path), error=str(e))

    def append(self, line: str) -> None:
        """The journal is a record for people, not intent: a failed append is counted, never fatal."""
        j = self.file
        assert j is not None
        try:
            if self.max_bytes and j.tell() + len(line) > self.max_bytes:
                self._rotate()
                j = self.file
                assert j is not None
            j.write(line)
            j.flush()
        except (OSError, ValueError) as e:
            self._failed()
            log.warning("journal append failed; the decision stands", error=str(e))

    def _rotate(self) -> None:
        path = self.path
        assert path is not None and self.file is not None
        self.file.close()
        os.replace(path, path.with_name(path.name + ".1"))
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def close(self) -> None:
        """A full, read-only or vanished state directory fails the last flush: logged and counted, never the
        exit code the run earned. Python's buffered file closes its descriptor even when that flush fails
        (io.BufferedWriter.close)."""
        j, self.file = self.file, None
        if j is not None:
            try:
                j.close()
            except (OSError, ValueError) as e:
                self._failed()
                log.error("journal could not be flushed at shutdown; its last lines are lost", error=str(e))


def action_record(a: Action) -> dict[str, Any]:
    """An action as a journal (and log) record: sets as sorted lists, enums as strings."""
    d: dict[str, Any] = {"type": type(a).__name__}
    for k, v in vars(a).items():
        d[k] = sorted(v) if isinstance(v, frozenset) else (str(v) if isinstance(v, ResumeSource) else v)
    return d


def event_detail(ev: Event) -> dict[str, Any]:
    """An event's fields as a journal record."""
    return {k: (sorted(v) if isinstance(v, frozenset) else v) for k, v in vars(ev).items()}
