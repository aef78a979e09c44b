"""A coordinator stops cleanly: workers connected say so in one line, not with tracebacks; a full,
read-only or vanished state directory at exit is logged, and the exit code stays the one the run earned."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent import constants as C
from agent.config import CoordinatorConfig
from agent.coordinator import Coordinator
from agent.core.model import ExitCoordinator
from simjob.ports import free_port
from tests.agent.coordinators import coordinator_config

REPO = Path(__file__).resolve().parents[2]


def test_sigterm_with_workers_connected_prints_no_cancelled_error_traceback(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ES_")} | {
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
    }
    base = [sys.executable, "-m", "agent"]
    out = tmp_path / "coordinator.log"
    with out.open("w") as log:
        coord = subprocess.Popen(
            [*base, "coordinator", "--num-slices=2", f"--listen=127.0.0.1:{port}",
             f"--trainer-listen=127.0.0.1:{free_port()}", "--admin-listen=127.0.0.1:0",
             "--http-listen=127.0.0.1:0", "--log-format=json"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        workers = [
            subprocess.Popen(
                [*base, "worker", f"--slice={s}", f"--coordinator=127.0.0.1:{port}", "--log-format=json"],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            for s in range(2)
        ]
        try:
            deadline = time.monotonic() + 30
            while out.read_text().count("registered") < 2:
                assert time.monotonic() < deadline, out.read_text()[-2000:]
                time.sleep(0.1)
            coord.send_signal(signal.SIGTERM)
            assert coord.wait(timeout=20) == 0
        finally:
            for p in (coord, *workers):
                if p.poll() is None:
                    p.kill()
                p.wait()
    text = out.read_text()
    assert "coordinator stopping" in text
    assert "CancelledError" not in text and "Traceback" not in text, text[-3000:]


# -- a broken state directory at exit -------------------------------------------------------------------


class _FailingJournal(io.StringIO):
    """A journal whose directory went read-only: every flush, the last one at close included, fails."""

    def __init__(self, err: int) -> None:
        super().__init__()
        self.err = err

    def flush(self) -> None:
        raise OSError(self.err, os.strerror(self.err))

    def close(self) -> None:
        super().close()
        raise OSError(self.err, os.strerror(self.err))


def _config(state_dir: Path) -> CoordinatorConfig:
    return coordinator_config(
        "shutdown-job",
        state_file=state_dir / "state.json",
        journal=state_dir / "journal.jsonl",
        state_dir=state_dir,
    )


async def _completes_with(coord: Coordinator, break_it: Callable[[Coordinator], None]) -> int:
    """Run ``coord``, break its state directory, then let it exit as after a completed job."""
    run = asyncio.create_task(coord.run())
    while not coord.serving:
        assert not run.done(), run.result()
        await asyncio.sleep(0.01)
    break_it(coord)
    coord._execute(ExitCoordinator(C.EXIT_OK, "job completed"))  # noqa: SLF001  (what the core decides at the end)
    return await asyncio.wait_for(run, 30)


def _journal_failures(coord: Coordinator) -> float:
    return coord.metrics.registry.get_sample_value("elastic_sidecar_journal_write_failures_total") or 0.0


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full (every write: ENOSPC)")
async def test_a_full_state_directory_at_exit_keeps_the_exit_code_the_job_earned(tmp_path: Path) -> None:
    """Writes to /dev/full fail with ENOSPC (man 4 full): the journal's buffered last line fails
    again when it is closed at shutdown, which must not turn a completed job into exit 1."""
    coord = Coordinator(_config(tmp_path))

    def fill(c: Coordinator) -> None:
        assert c.journal.file is not None  # noqa: SLF001
        c.journal.file.close()  # noqa: SLF001
        c.journal.file = open("/dev/full", "a", encoding="utf-8")  # noqa: SIM115, SLF001
        c.journal.append("a decision\n")  # noqa: SLF001  (fails and is counted; the line stays buffered)

    assert await _completes_with(coord, fill) == C.EXIT_OK
    assert _journal_failures(coord) >= 2  # the append, then the close
    assert coord.journal.file is None and coord.lock.fd is None  # noqa: SLF001


async def test_a_read_only_state_directory_at_exit_keeps_the_exit_code_the_job_earned(tmp_path: Path) -> None:
    """EROFS injected (chmod does not stop root): the journal's close fails, the lock is still released."""
    coord = Coordinator(_config(tmp_path))

    def read_only(c: Coordinator) -> None:
        assert c.journal.file is not None  # noqa: SLF001
        c.journal.file.close()  # noqa: SLF001
        c.journal.file = _FailingJournal(errno.EROFS)  # noqa: SLF001

    assert await _completes_with(coord, read_only) == C.EXIT_OK
    assert _journal_failures(coord) == 1
    assert coord.lock.fd is None  # noqa: SLF001
    fd = os.open(tmp_path / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: a next coordinator is not kept waiting
    finally:
        os.close(fd)


async def test_a_vanished_state_directory_at_exit_keeps_the_exit_code_the_job_earned(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    coord = Coordinator(_config(state_dir))
    assert await _completes_with(coord, lambda c: shutil.rmtree(state_dir)) == C.EXIT_OK
    assert not state_dir.exists()
