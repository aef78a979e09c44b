"""Heartbeat datagrams on real loopback UDP sockets: binding, the sender's address rotation, refusals.

The end-to-end behaviour (a worker switching to datagrams, a hung worker still lost, UDP that
never arrives) is in tests/agent/test_liveness.py with real worker processes.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import socket
from dataclasses import dataclass

import pytest

from agent.sources.heartbeat_datagrams import (
    DatagramReceiver,
    DatagramSender,
    Reply,
    command_datagram,
    new_token,
    open_command_datagram,
    same_token,
    target_host,
)
from protos.elastic_sidecar.v1 import peer_pb2


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


HAS_V6 = _has_ipv6_loopback()


@dataclass
class Live:
    """A registration as the receiver sees it (the coordinator's connection)."""

    last_seen: float = 0.0
    datagram_key: bytes = b""


@pytest.mark.parametrize(
    ("target", "host"),
    [
        ("127.0.0.1:29310", "127.0.0.1"),
        ("[::1]:29310", "::1"),
        ("coord-0-0.job:29310", "coord-0-0.job"),
        ("dns:///coord-0-0.job:29310", "coord-0-0.job"),
    ],
)
def test_target_host(target: str, host: str) -> None:
    assert target_host(target) == host


def test_tokens_are_random_and_an_empty_one_matches_nothing() -> None:
    a, b = new_token(), new_token()
    assert len(a) == 16 and a != b
    assert same_token(a, a) and not same_token(a, b)
    assert not same_token(b"", b"")


async def test_localhost_binds_both_loopbacks_on_one_port_and_counts_what_it_reads() -> None:
    seen: list[tuple[int, int, bytes]] = []
    counts: list[tuple[int, int]] = []
    replies: list[Reply] = []
    token = new_token()

    def on_heartbeat(dg: peer_pb2.HeartbeatDatagram, now: float, reply: Reply) -> Live | None:
        seen.append((dg.slice, dg.host, dg.token))
        replies.append(reply)
        return Live() if dg.token == token else None

    rx = DatagramReceiver(on_heartbeat, lambda a, r: counts.append((a, r)))
    port = rx.open("localhost:0", 0)
    try:
        assert port > 0 and len(rx.socks) == (2 if HAS_V6 else 1)
        assert {s.getsockname()[1] for s in rx.socks} == {port}
        families = [(socket.AF_INET, "127.0.0.1"), *([(socket.AF_INET6, "::1")] if HAS_V6 else [])]
        good = peer_pb2.HeartbeatDatagram(slice=1, host=2, token=token, seq=1).SerializeToString()  # parsed each time
        wrong = peer_pb2.HeartbeatDatagram(slice=1, host=2, token=b"y" * 16, seq=2).SerializeToString()
        for family, addr in families:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.sendto(good, (addr, port))
                s.sendto(wrong, (addr, port))
                s.sendto(b"\xff\xff\xff\xff", (addr, port))
        for _ in range(200):
            if sum(a + r for a, r in counts) >= 3 * len(families):
                break
            await asyncio.sleep(0.01)
        n = len(families)
        assert sum(a for a, _ in counts) == n and sum(r for _, r in counts) == 2 * n, counts
        assert seen.count((1, 2, token)) == n
        # Each read names the socket that read it and the sender's address, to answer to.
        assert {r[0].family for r in replies} == {f for f, _ in families}
        assert all(r[1][0] == dict(families)[r[0].family] for r in replies)
    finally:
        rx.close()
    assert rx.socks == []


async def test_a_taken_port_falls_back_to_another_one() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        rx = DatagramReceiver(lambda *a: Live())
        try:
            port = rx.open(f"127.0.0.1:{taken}", taken)
            assert port not in (0, taken)
        finally:
            rx.close()


async def test_the_sender_tries_each_address_in_turn_until_confirmed() -> None:
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as dead,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as live,
    ):
        dead.bind(("127.0.0.1", 0))
        live.bind(("127.0.0.1", 0))
        live.setblocking(False)
        addrs = [(int(socket.AF_INET), dead.getsockname()), (int(socket.AF_INET), live.getsockname())]
        tx = DatagramSender(addrs, b"t" * 16, 3, 4)
        try:
            per = DatagramSender.TRIES_PER_ADDRESS
            dead.setblocking(False)

            def drain(sock: socket.socket) -> list[bytes]:
                out = []
                while True:
                    try:
                        out.append(sock.recv(256))
                    except BlockingIOError:
                        return out

            for _ in range(2 * per):
                assert tx.send()
            await asyncio.sleep(0.05)
            # The first address got the first few; the second one the rest.
            assert len(drain(dead)) == per
            got = drain(live)
            assert len(got) == per
            # Every heartbeat the same bytes, seq left out: the coordinator matches them without parsing.
            assert len(set(got)) == 1
            d = peer_pb2.HeartbeatDatagram.FromString(got[0])
            assert (d.slice, d.host, d.token, d.seq) == (3, 4, b"t" * 16, 0)
            tx.confirmed = True
            for _ in range(3 * per):
                tx.send()
            await asyncio.sleep(0.05)
            later = 0
            while True:
                try:
                    live.recv(256)
                    later += 1
                except BlockingIOError:
                    break
            assert later == 3 * per  # confirmed: it stays on the address that worked
        finally:
            tx.close()


async def test_create_resolves_the_coordinators_name_and_needs_a_port_and_a_token() -> None:
    assert await DatagramSender.create("127.0.0.1:1", 0, b"t", 0, 0) is None
    assert await DatagramSender.create("127.0.0.1:1", 5000, b"", 0, 0) is None
    tx = await DatagramSender.create("localhost:1", 5000, b"t", 0, 0)
    assert tx is not None
    assert {a[1][1] for a in tx.addrs} == {5000}
    assert {a[1][0] for a in tx.addrs} <= {"127.0.0.1", "::1"}


@pytest.mark.skipif(not HAS_V6, reason="no IPv6 loopback on this machine")
async def test_localhost_with_one_loopback_taken_keeps_the_other_on_the_wanted_port() -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as busy:
        busy.bind(("::1", 0))
        taken = busy.getsockname()[1]
        rx = DatagramReceiver(lambda *a: Live())
        try:
            port = rx.open(f"localhost:{taken}", taken)
            assert port == taken
            assert [s.family for s in rx.socks] == [socket.AF_INET]
        finally:
            rx.close()


def _hold(generation: int = 7) -> peer_pb2.PeerCommand:
    return peer_pb2.PeerCommand(generation=generation, kind="hold", reason="slice 1 lost", epoch=3)


def test_a_command_datagram_opens_only_for_its_worker_under_its_token() -> None:
    token = new_token()
    data = command_datagram(token, 2, 5, _hold())
    assert open_command_datagram(token, 2, 5, data) == _hold()
    assert open_command_datagram(new_token(), 2, 5, data) is None  # another registration's token
    assert open_command_datagram(token, 2, 6, data) is None  # another worker's copy
    assert open_command_datagram(b"", 2, 5, data) is None
    assert open_command_datagram(token, 2, 5, b"\xff\xff\xff") is None
    # A body changed in flight (or forged without the token) fails the mac.
    dg = peer_pb2.CommandDatagram.FromString(data)
    forged = peer_pb2.CommandDatagramBody(slice=2, host=5, command=_hold(8)).SerializeToString()
    assert (
        open_command_datagram(token, 2, 5, peer_pb2.CommandDatagram(body=forged, mac=dg.mac).SerializeToString())
        is None
    )
    # A body with a good mac but no command in it opens to nothing.
    empty = peer_pb2.CommandDatagramBody(slice=2, host=5).SerializeToString()
    no_cmd = peer_pb2.CommandDatagram(body=empty, mac=hmac.digest(token, empty, hashlib.sha256))
    assert open_command_datagram(token, 2, 5, no_cmd.SerializeToString()) is None


async def test_command_datagrams_come_back_to_the_senders_heartbeat_socket() -> None:
    token = new_token()
    replies: dict[tuple[int, int], Reply] = {}
    acks: list[tuple[int, str]] = []

    def on_heartbeat(dg: peer_pb2.HeartbeatDatagram, now: float, reply: Reply) -> Live | None:
        replies[(dg.slice, dg.host)] = reply
        acks.append((dg.ack_generation, dg.ack_kind))
        return Live()

    rx = DatagramReceiver(on_heartbeat)
    port = rx.open("127.0.0.1:0", 0)
    got: list[peer_pb2.PeerCommand] = []
    tx = DatagramSender([(int(socket.AF_INET), ("127.0.0.1", port))], token, 1, 4, on_command=got.append)
    tx._loop = asyncio.get_running_loop()
    try:
        assert tx.send()
        for _ in range(200):
            if (1, 4) in replies:
                break
            await asyncio.sleep(0.01)
        reply = replies[(1, 4)]
        assert DatagramReceiver.send(reply, command_datagram(token, 1, 4, _hold()))
        assert DatagramReceiver.send(reply, command_datagram(new_token(), 1, 4, _hold(9)))  # not its token
        assert DatagramReceiver.send(reply, b"junk")
        for _ in range(200):
            if tx.commands_received + tx.commands_refused >= 3:
                break
            await asyncio.sleep(0.01)
        assert got == [_hold()]
        assert (tx.commands_received, tx.commands_refused) == (1, 2)
        # The one it took is acknowledged at once, in a heartbeat from the same socket.
        for _ in range(200):
            if len(acks) >= 2:
                break
            await asyncio.sleep(0.01)
        assert acks == [(0, ""), (7, "hold")]
    finally:
        tx.close()
        rx.close()
    assert not DatagramReceiver.send(reply, b"x")  # the receiver's socket is closed: reported, not raised


async def test_a_repeated_datagram_is_matched_by_its_bytes_until_forgotten() -> None:
    token = new_token()
    live = Live()
    parsed: list[int] = []

    def on_heartbeat(dg: peer_pb2.HeartbeatDatagram, now: float, reply: Reply) -> Live | None:
        parsed.append(dg.host)
        return live if dg.token == token else None

    counts: list[tuple[int, int]] = []
    rx = DatagramReceiver(on_heartbeat, lambda a, r: counts.append((a, r)))
    port = rx.open("127.0.0.1:0", 0)
    same = peer_pb2.HeartbeatDatagram(slice=0, host=1, token=token).SerializeToString()
    with_seq = peer_pb2.HeartbeatDatagram(slice=0, host=1, token=token, seq=5).SerializeToString()
    forged = peer_pb2.HeartbeatDatagram(slice=0, host=1, token=new_token()).SerializeToString()

    async def send(*datagrams: bytes) -> None:
        n0 = sum(a + r for a, r in counts)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for d in datagrams:
                s.sendto(d, ("127.0.0.1", port))
        for _ in range(200):
            if sum(a + r for a, r in counts) >= n0 + len(datagrams):
                return
            await asyncio.sleep(0.01)

    try:
        await send(same)
        assert parsed == [1] and live.datagram_key == same and rx.known == {same: live}
        t0 = live.last_seen
        await asyncio.sleep(0.01)
        await send(same, same, same)
        assert parsed == [1]  # matched by the bytes: not parsed again
        assert live.last_seen > t0
        ack = peer_pb2.HeartbeatDatagram(slice=0, host=1, token=token, ack_generation=3, ack_kind="hold")
        await send(with_seq, forged, ack.SerializeToString())
        # Other bytes (a seq, an acknowledgement) go the parsed way; a forged token is refused.
        assert parsed == [1, 1, 1, 1]
        assert rx.known == {same: live}
        assert sum(r for _, r in counts) == 1
        rx.forget(live)
        assert rx.known == {} and live.datagram_key == b""
        await send(same)
        assert parsed == [1, 1, 1, 1, 1]  # checked again once forgotten
    finally:
        rx.close()


async def test_a_busy_socket_is_read_in_batches_and_nothing_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.sources import heartbeat_datagrams as hd

    monkeypatch.setattr(hd, "PAUSE_SECONDS", 0.2)
    token = new_token()
    wakes: list[int] = []
    rx = DatagramReceiver(lambda dg, now, reply: Live(), lambda a, r: wakes.append(a + r))
    port = rx.open("127.0.0.1:0", 0)
    data = peer_pb2.HeartbeatDatagram(slice=0, host=0, token=token, seq=9).SerializeToString()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _ in range(hd.BUSY_READ * 2):
                s.sendto(data, ("127.0.0.1", port))
            for _ in range(100):
                if wakes:
                    break
                await asyncio.sleep(0.01)
            assert sum(wakes) >= hd.BUSY_READ  # one busy read: the socket now rests
            for _ in range(5):
                s.sendto(data, ("127.0.0.1", port))
            await asyncio.sleep(0.1)
            assert sum(wakes) == hd.BUSY_READ * 2  # the five wait in the buffer during the pause
            await asyncio.sleep(0.3)
            assert sum(wakes) == hd.BUSY_READ * 2 + 5  # and are read after it
            # A quiet socket is read at once.
            n = len(wakes)
            s.sendto(data, ("127.0.0.1", port))
            for _ in range(50):
                if len(wakes) > n:
                    break
                await asyncio.sleep(0.005)
            assert wakes[-1] == 1
    finally:
        rx.close()
    assert rx._paused == {}  # noqa: SLF001


async def test_datagrams_the_kernel_drops_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full socket buffer (the reader fell behind) drops heartbeats; the receiver learns how many."""
    from agent.sources import heartbeat_datagrams as hd

    monkeypatch.setattr(hd, "RECV_BUFFER_BYTES", 4096)  # the kernel's minimum: a few datagrams
    rx = DatagramReceiver(lambda dg, now, reply: Live())
    port = rx.open("127.0.0.1:0", 0)
    data = peer_pb2.HeartbeatDatagram(slice=0, host=0, token=new_token(), seq=1).SerializeToString()
    try:
        assert rx.dropped() == 0
        loop = asyncio.get_running_loop()
        for s in rx.socks:
            loop.remove_reader(s.fileno())  # the reader falls behind
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _ in range(500):
                s.sendto(data, ("127.0.0.1", port))
            rx.read_now()  # what fitted in the buffer: the drops before it are counted
            assert rx.dropped() == 0  # the datagrams read were queued before any drop
            for _ in range(500):
                s.sendto(data, ("127.0.0.1", port))
            rx.read_now()
        assert 0 < rx.dropped() < 1000
    finally:
        rx.close()


async def test_a_receive_buffer_capped_by_rmem_max_is_named_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel grants at most net.core.rmem_max: the coordinator says so, and what it got, when it asked more."""
    import structlog

    from agent.sources import heartbeat_datagrams as hd

    with open("/proc/sys/net/core/rmem_max") as f:
        rmem_max = int(f.read())
    for asked, warned in ((rmem_max * 4, True), (4096, False)):
        monkeypatch.setattr(hd, "RECV_BUFFER_BYTES", asked)
        rx = DatagramReceiver(lambda dg, now, reply: Live())
        with structlog.testing.capture_logs() as logs:
            rx.open("127.0.0.1:0", 0)
        rx.close()
        capped = [e for e in logs if "capped by net.core.rmem_max" in e["event"]]
        assert bool(capped) == warned, logs
        if warned:
            assert capped[0]["asked_bytes"] == asked and capped[0]["granted_bytes"] <= rmem_max
