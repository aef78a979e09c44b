"""A coordinator stopped while workers are connected says so in one line, not with tracebacks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.common import free_port

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
            [*base, "coordinator", "--num-slices=2", f"--listen=127.0.0.1:{port}", "--admin-listen=127.0.0.1:0",
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
