"""Loopback ports for the simulated job's processes and the tests' daemons."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Mapping
from pathlib import Path


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def share(low: int, high: int, env: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """This process's part of the ports ``[low, high)``: all of them, or under pytest-xdist its worker's own.

    xdist names its workers gw0 .. gw{N-1} and sets PYTEST_XDIST_WORKER and
    PYTEST_XDIST_WORKER_COUNT in each (the processes a test starts inherit them), so
    two workers draw from disjoint parts and cannot race for one port. A worker that
    replaces a crashed one gets the next free name (gwN and up): it takes the part of
    its number modulo N.
    """
    worker, count = env.get("PYTEST_XDIST_WORKER", ""), env.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1):
        return low, high
    n = int(count)
    i = int(worker[2:]) % n
    size = (high - low) // n
    return low + i * size, low + (i + 1) * size


_ports = random.Random()
_given: set[int] = set()
"""Ports this process handed out already: two processes of one job never get the same one."""


def free_port() -> int:
    """A loopback port nothing listens on, below the kernel's ephemeral range (in this process's share of it).

    The job's processes are given their ports before they start and a restarted
    coordinator binds the same ones again. A port from the ephemeral range can be
    taken meanwhile as the source port of any outgoing connection (seen: a restarted
    coordinator failing with "address already in use"); one below it cannot.
    """
    ephemeral = _ephemeral_range()[0]
    low, high = share(max(1024, ephemeral - 12000), ephemeral)
    for _ in range(200):
        port = _ports.randrange(low, high)
        if port in _given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
