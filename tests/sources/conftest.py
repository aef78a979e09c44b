"""Fixtures for the event-source tests: one real Pub/Sub emulator per session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from simjob.pubsub_emulator import PubSubEmulator

EMULATOR_PROJECT = "elastic-sidecar-test"


@pytest.fixture(scope="session")
def pubsub_emulator() -> Iterator[PubSubEmulator]:
    """The emulator, with PUBSUB_EMULATOR_HOST pointing at it for the session.

    A missing emulator raises EmulatorMissing here, so every test using it fails.
    """
    with PubSubEmulator(project=EMULATOR_PROJECT) as emu:
        old = os.environ.get("PUBSUB_EMULATOR_HOST")
        os.environ["PUBSUB_EMULATOR_HOST"] = emu.host
        try:
            yield emu
        finally:
            if old is None:
                os.environ.pop("PUBSUB_EMULATOR_HOST", None)
            else:
                os.environ["PUBSUB_EMULATOR_HOST"] = old
