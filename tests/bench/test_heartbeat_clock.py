"""The load generator's heartbeat clock: a process of its own that sends from the generator's socket."""

from __future__ import annotations

import socket
import time
from collections import Counter

import pytest

from bench import heartbeat_clock
from bench.heartbeat_clock import HeartbeatClock


def _collect(rx: socket.socket, seconds: float) -> list[tuple[bytes, tuple[str, int]]]:
    got = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        rx.settimeout(left)
        try:
            got.append(rx.recvfrom(64))
        except TimeoutError:
            break
    return got


def test_the_clock_sends_each_workers_heartbeats_from_the_generators_socket_until_told_to_stop() -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    port = rx.getsockname()[1]
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind(("127.0.0.1", 0))
    clock = HeartbeatClock(tx, "127.0.0.1", 0)
    try:
        clock.add(1, port, 0.1, b"one")
        clock.add(2, port, 0.1, b"two")
        got = _collect(rx, 1.0)
        counts = Counter(data for data, _ in got)
        # Every 0.1 s each: about 10 in the second (generous bounds, a busy machine).
        assert 5 <= counts[b"one"] <= 13 and 5 <= counts[b"two"] <= 13, counts
        assert set(counts) == {b"one", b"two"}
        # From the generator's own socket: the coordinator's command datagrams come back to it.
        assert {addr for _, addr in got} == {tx.getsockname()}
        clock.remove(1)
        time.sleep(0.2)  # anything already sent has arrived by now
        _collect(rx, 0.05)
        later = Counter(data for data, _ in _collect(rx, 0.5))
        assert later[b"one"] == 0 and later[b"two"] >= 2, later
    finally:
        clock.close()
    assert clock.proc.returncode == 0  # it ends when its stdin closes
    rx.close()
    tx.close()


def test_a_line_the_clock_cannot_read_is_named() -> None:
    c = heartbeat_clock._Clock(socket.socket(socket.AF_INET, socket.SOCK_DGRAM), "127.0.0.1", "0")
    with pytest.raises(ValueError, match="'\\* 1'"):
        c.apply("* 1")
    c.apply("+ 7 9 0.5 0a0b")
    assert c.beats[7] == (b"\n\x0b", ("127.0.0.1", 9)) and c.interval == 0.5
    assert 7 in c.slots[7 % heartbeat_clock.DATAGRAM_SLOTS]
    c.apply("- 7")
    assert 7 not in c.beats and not any(c.slots)


def test_lateness_is_reported_once_it_grows(capsys: pytest.CaptureFixture[str]) -> None:
    c = heartbeat_clock._Clock(socket.socket(socket.AF_INET, socket.SOCK_DGRAM), "127.0.0.1", "2500")
    for late in (0.001, 0.01, 0.012, 0.5, 0.4):
        c.note_late(late)
    assert capsys.readouterr().out.split() == ["late", "0.0100", "late", "0.5000"]
    assert c.late_max == 0.5


def test_the_gate_answers_for_every_retrying_worker_with_one_probe_while_fresh() -> None:
    import asyncio

    from bench.scale_loadgen import CoordinatorGate

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        gate = CoordinatorGate(f"127.0.0.1:{port}")
        assert await asyncio.gather(*(gate.reachable() for _ in range(50))) == [True] * 50
        assert gate.probes == 1  # one probe answered all fifty
        server.close()
        await server.wait_closed()
        assert await gate.reachable() is True  # still fresh
        await asyncio.sleep(CoordinatorGate.FRESH * 2)
        assert await gate.reachable() is False  # the port is closed now
        assert gate.probes == 2

    asyncio.run(main())
