"""An in-process coordinator for tests that drive its parts directly (no worker processes)."""

from __future__ import annotations

from agent.config import CoordinatorConfig
from agent.coordinator import Coordinator
from agent.core.model import Policy


def in_memory_coordinator(job: str, num_slices: int, log_level: str = "warning") -> Coordinator:
    """Loopback on an ephemeral port, one host a slice, the shipped heartbeat timings, no state file."""
    return Coordinator(
        CoordinatorConfig(
            job=job,
            listen="127.0.0.1:0",
            policy=Policy(num_slices=num_slices, hosts_per_slice=1),
            heartbeat_interval=0.25,
            heartbeat_timeout=1.2,
            state_file=None,
            journal=None,
            log_format="json",
            log_level=log_level,
        )
    )
