"""The coordinator holds one socket per worker: started with a small open-file limit (containerd 2.x
gives containers 1024 soft), it raises its own and accepts more connections than it started with room
for; when even the hard limit is short of the job's hosts it says so at start and still serves."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import fdlimit
from simjob.ports import free_port

REPO = Path(__file__).resolve().parents[2]
# HTTP/2's client connection preface and an empty SETTINGS frame (RFC 9113 section 3.4): a connection
# as a gRPC client opens it, which the server keeps.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
START_SOFT = 128
CONNECTIONS = 300


def _start(tmp_path: Path, soft: int, hard: int, *args: str) -> tuple[subprocess.Popen[bytes], int, Path]:
    """A coordinator process started with RLIMIT_NOFILE (soft, hard), as a container runtime would set it."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ES_")} | {
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
    }
    limit_then_exec = (
        "import os, resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard})); "
        "os.execv(sys.executable, [sys.executable, '-m', 'agent', *sys.argv[1:]])"
    )
    out = tmp_path / "coordinator.log"
    with out.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", limit_then_exec, "coordinator", f"--listen=127.0.0.1:{port}",
             f"--trainer-listen=127.0.0.1:{free_port()}", "--admin-listen=none", "--http-listen=none",
             "--log-format=json", *args],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while "coordinator listening" not in out.read_text():
        assert proc.poll() is None, out.read_text()[-2000:]
        assert time.monotonic() < deadline, out.read_text()[-2000:]
        time.sleep(0.05)
    return proc, port, out


def _soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-file limit in /proc")


def _events(log: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]


def test_a_coordinator_started_with_a_small_limit_raises_it_and_accepts_past_it(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < CONNECTIONS + 100:
        pytest.skip(f"this machine's hard open-file limit ({hard}) leaves no room above {START_SOFT}")
    if soft != resource.RLIM_INFINITY and soft < CONNECTIONS + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (CONNECTIONS + 100, hard))  # this test's own sockets
    proc, port, log = _start(tmp_path, START_SOFT, hard, "--num-slices=3", "--hosts-per-slice=100")
    conns: list[socket.socket] = []
    try:
        assert _soft_limit(proc.pid) > START_SOFT
        for _ in range(CONNECTIONS):  # more than the limit it started with
            c = socket.create_connection(("127.0.0.1", port), timeout=5)
            c.sendall(PREFACE)
            conns.append(c)
        # Every connection accepted is a descriptor of the coordinator's (as a worker's stream would be).
        deadline = time.monotonic() + 20
        while (held := len(os.listdir(f"/proc/{proc.pid}/fd"))) < CONNECTIONS:
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, f"the coordinator holds {held} descriptors, not {CONNECTIONS}+"
            time.sleep(0.1)
        raised = [e for e in _events(log) if e.get("message") == "open-file limit raised"]
        assert raised and raised[0]["before"] == START_SOFT, log.read_text()[-2000:]
        assert not [e for e in _events(log) if e.get("severity") == "ERROR"], log.read_text()[-2000:]
    finally:
        for c in conns:
            c.close()
        proc.kill()
        proc.wait()


def test_a_hard_limit_short_of_the_hosts_is_an_error_at_start_and_the_coordinator_still_serves(
    tmp_path: Path,
) -> None:
    hard = 400  # lowering a hard limit needs no privilege
    hosts = 4 * 100
    assert fdlimit.need(hosts) > hard
    proc, port, log = _start(tmp_path, 200, hard, "--num-slices=4", "--hosts-per-slice=100")
    try:
        errors = [e for e in _events(log) if e.get("severity") == "ERROR"]
        assert len(errors) == 1, log.read_text()[-2000:]
        err = errors[0]
        assert "open-file limit too low" in str(err["message"])
        assert (err["hosts"], err["need"], err["limit"], err["hard"]) == (hosts, fdlimit.need(hosts), hard, hard)
        assert _soft_limit(proc.pid) == hard  # raised as far as it goes
        # Still serving: a health check over gRPC answers SERVING.
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        proc.kill()
        proc.wait()
