"""These tests drive fake trainers whose steps take microseconds and wait for the sidecar to see
particular steps: every step is reported here (the coalescing of fast steps' reports has its own
tests in test_session.py)."""

from __future__ import annotations

import pytest

from trainer_hooks.session import ENV_REPORT_INTERVAL


@pytest.fixture(autouse=True)
def report_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_REPORT_INTERVAL, "0")
