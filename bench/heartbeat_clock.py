"""The load generator's heartbeat clock: a process that sends its stand-in hosts' heartbeat datagrams.

Each real host heartbeats from a CPU of its own; from a thread of the generator the heartbeats would
wait for its GIL behind thousands of gRPC channels. The clock runs at a higher priority and sends from
the generator's datagram socket (inherited), so command datagrams still reach the generator. Told over
stdin ``+ INDEX PORT INTERVAL HEXBYTES`` (send these every INTERVAL from now) or ``- INDEX`` (stop); it
prints ``late SECONDS`` each time it has run later than ever, and exits when its stdin closes.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import subprocess
import sys
import threading
import time

DATAGRAM_SLOTS = 125
"""The clock's ticks per heartbeat interval: each tick sends one slot's workers' heartbeats (phases by index)."""
LATE_REPORT_STEP = 0.005
"""A new worst lateness is reported to the generator when it exceeds the last one reported by this much."""
PRIORITY = -10
"""The clock's nice value (the generator's is 0): it stands in for each host's own CPU. Only root may
set it; elsewhere the clock runs at the generator's priority and says so on stderr."""


class HeartbeatClock:
    """The generator's side: starts the clock process and tells it whose heartbeats to send."""

    def __init__(self, sock: socket.socket, host: str, name: int) -> None:
        fd = sock.fileno()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.heartbeat_clock", "--fd", str(fd), "--host", host, "--name", str(name)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=(fd,),
        )
        self.late_max = 0.0
        """The clock's worst lateness so far (s), as it last reported it."""
        threading.Thread(target=self._read_reports, name="heartbeat-clock-reports", daemon=True).start()

    def _read_reports(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            word, _, value = line.decode().partition(" ")
            if word == "late":
                self.late_max = max(self.late_max, float(value))

    def _tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except OSError:
            # Without its clock every stand-in host here falls silent and is (rightly) judged lost: the
            # run would measure nothing. Stop loudly; bench.scale reports the generator's exit.
            print(f"heartbeat clock exited (code {self.proc.poll()}); stopping", file=sys.stderr, flush=True)
            os._exit(3)

    def add(self, index: int, port: int, interval: float, data: bytes) -> None:
        self._tell(f"+ {index} {port} {interval!r} {data.hex()}\n")

    def remove(self, index: int) -> None:
        self._tell(f"- {index}\n")

    def close(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class _Clock:
    """The clock process's state: what to send, to where, and how late it has run."""

    def __init__(self, sock: socket.socket, host: str, name: str) -> None:
        self.sock = sock
        self.host = host
        self.name = name
        self.beats: dict[int, tuple[bytes, tuple[str, int]]] = {}
        self.slots: list[set[int]] = [set() for _ in range(DATAGRAM_SLOTS)]
        self.interval = 0.25
        self.late_max = 0.0
        self.late_reported = 0.0

    def apply(self, line: str) -> None:
        parts = line.split()
        if not parts:
            return
        if parts[0] == "+" and len(parts) == 5:
            index, port = int(parts[1]), int(parts[2])
            self.interval = float(parts[3])
            self.beats[index] = (bytes.fromhex(parts[4]), (self.host, port))
            self.slots[index % DATAGRAM_SLOTS].add(index)
        elif parts[0] == "-" and len(parts) == 2:
            index = int(parts[1])
            self.beats.pop(index, None)
            self.slots[index % DATAGRAM_SLOTS].discard(index)
        else:
            raise ValueError(f"heartbeat clock: cannot read {line!r}")

    def send_slot(self, slot: int) -> None:
        for i in list(self.slots[slot]):
            data, addr = self.beats[i]
            try:
                self.sock.sendto(data, addr)
            except OSError:
                pass  # a worker's stream heartbeats carry on until the coordinator confirms its datagrams

    def note_late(self, late: float) -> None:
        if late <= self.late_max:
            return
        self.late_max = late
        if late >= self.late_reported + LATE_REPORT_STEP:
            self.late_reported = late
            sys.stdout.write(f"late {late:.4f}\n")
            sys.stdout.flush()


def run_clock(sock: socket.socket, host: str, name: str, commands: int) -> int:
    """Sends slot after slot, one every interval / DATAGRAM_SLOTS, reading commands in between; returns at EOF."""
    clock = _Clock(sock, host, name)
    pending = b""
    slot, due = 0, time.monotonic()
    while True:
        # Commands are read on every turn, even while the clock runs late: a worker that has just
        # registered must not wait for its first heartbeat until the clock has caught up.
        ready, _, _ = select.select([commands], [], [], max(0.0, due - time.monotonic()))
        if ready:
            chunk = os.read(commands, 1 << 16)
            if not chunk:
                return 0
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                clock.apply(line.decode())
        if time.monotonic() < due:
            continue
        clock.send_slot(slot)
        slot = (slot + 1) % DATAGRAM_SLOTS
        due += clock.interval / DATAGRAM_SLOTS
        clock.note_late(time.monotonic() - due)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fd", type=int, required=True, help="the generator's datagram socket (inherited)")
    ap.add_argument("--host", required=True, help="the coordinator's address for datagrams")
    ap.add_argument("--name", default="0", help="the generator's first worker index, for its log lines")
    ns = ap.parse_args(argv)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, PRIORITY)
    except OSError as e:
        print(f"heartbeat clock {ns.name}: runs at the generator's priority ({e})", file=sys.stderr, flush=True)
    sock = socket.socket(fileno=ns.fd)
    return run_clock(sock, ns.host, ns.name, sys.stdin.fileno())


if __name__ == "__main__":
    sys.exit(main())
