"""Loopback ports for the simulated job's processes."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


_ports = random.Random()
_given: set[int] = set()
"""Ports this process handed out already: two processes of one job never get the same one."""


def free_port() -> int:
    """A loopback port nothing listens on, below the kernel's ephemeral range.

    The job's processes are given their ports before they start and a restarted
    coordinator binds the same ones again. A port from the ephemeral range can be
    taken meanwhile as the source port of any outgoing connection (seen: a restarted
    coordinator failing with "address already in use"); one below it cannot.
    """
    low, _ = _ephemeral_range()
    for _ in range(200):
        port = _ports.randrange(max(1024, low - 12000), low)
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
