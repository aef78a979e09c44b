"""The state directory's lock: two coordinators on one state directory cannot run at once (``flock``)."""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from agent import log as logmod

log = logmod.get("coordinator")
WAIT_SECONDS = 0.5
"""How often a second coordinator tries the lock again while the first holds it."""


def lock_path(state_dir: Path | None, state_file: Path | None) -> Path | None:
    """Where the lock lives: in the state directory, else beside the state file (None: no state kept)."""
    if state_dir is not None:
        return state_dir / "lock"
    if state_file is not None:
        return state_file.with_name(state_file.name + ".lock")
    return None


class StateLock:
    """Held from before the state file is read until shutdown; the second coordinator waits for it."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.fd: int | None = None

    async def acquire(self, unusable: Callable[[str], None]) -> None:
        """Wait for the lock. A lock file that cannot be opened at all is reported to ``unusable``."""
        path = self.path
        if path is None:
            return
        try:
            fd = open_lock(path)
        except OSError as e:
            unusable(f"state lock {path}: {e.strerror or e}")
            return
        waited = 0.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if waited == 0.0 or waited % 30 < WAIT_SECONDS:
                    log.warning(
                        "another coordinator holds the state lock; waiting for it to go",
                        lock=str(path),
                        waited_seconds=round(waited, 1),
                    )
                await asyncio.sleep(WAIT_SECONDS)
                waited += WAIT_SECONDS
        note_lock_holder(fd)
        self.fd = fd

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                os.close(fd)  # releases the flock
            except OSError as e:
                log.warning("state lock could not be closed at shutdown", error=str(e))


def open_lock(path: Path) -> int:
    """A descriptor of the lock file ``path`` to ``flock``: created read-write when it can be, else an
    existing one opened read-only (``flock`` works on either, so a read-only state directory still keeps
    a second coordinator off). OSError when neither works (the directory is missing and cannot be made)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        try:
            return os.open(path, os.O_RDONLY)
        except OSError:
            raise e from None


def note_lock_holder(fd: int) -> None:
    """Write this process's id into the lock file, for a person; nothing depends on it."""
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        pass  # opened read-only (a read-only state directory)
