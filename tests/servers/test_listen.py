"""Listeners that cannot be shared, clients at the wrong port, and the size limit on messages.

Real processes for the held ports (a running coordinator, then a second one
given one of its addresses), real gRPC servers on loopback for the rest.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
import structlog

from agent import constants as C
from protos.elastic_sidecar.v1 import admin_pb2, admin_pb2_grpc, peer_pb2, peer_pb2_grpc, trainer_pb2, trainer_pb2_grpc
from simjob.ports import free_port
from tests.servers.conftest import Job, start_job, wait_for

REPO = Path(__file__).resolve().parents[2]
FLAGS = {"peer": "--listen", "trainer": "--trainer-listen", "admin": "--admin-listen", "http": "--http-listen"}


def coordinator_argv(ports: dict[str, int], state_dir: Path) -> list[str]:
    argv = [sys.executable, "-m", "agent", "coordinator", "--num-slices", "2", "--log-format", "json"]
    for server, flag in FLAGS.items():
        argv += [flag, f"127.0.0.1:{ports[server]}"]
    return [*argv, "--state-dir", str(state_dir)]


def env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("ES_")}, "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def running_coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """A coordinator process holding four ports (its peer, trainer-link, admin and HTTP listeners)."""
    ports = {server: free_port() for server in FLAGS}
    p = subprocess.Popen(
        coordinator_argv(ports, tmp_path_factory.mktemp("first")),
        cwd=REPO,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert p.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            assert line, "the first coordinator ended before it listened"
            if "coordinator listening" in line:
                break
        else:
            raise AssertionError("the first coordinator did not listen within 60 s")
        yield ports
        assert p.poll() is None, "the first coordinator died while a second one tried its port"
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.mark.parametrize("server", list(FLAGS))
def test_a_second_coordinator_on_a_held_port_exits_2_naming_the_port_and_flag(
    running_coordinator: dict[str, int], server: str, tmp_path: Path
) -> None:
    """grpcio shares ports by default (SO_REUSEPORT); with it off, a held port stops the second process."""
    ports = {s: free_port() for s in FLAGS}
    ports[server] = running_coordinator[server]
    held = f"127.0.0.1:{ports[server]}"
    t0 = time.monotonic()
    r = subprocess.run(
        coordinator_argv(ports, tmp_path / "second"),
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - t0
    print(f"\n[listen] second coordinator on the held {server} port: exit {r.returncode} after {took:.2f} s")
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert took < 15
    lines = [json.loads(line) for line in r.stdout.splitlines()]  # every stdout line is JSON
    (err,) = [rec for rec in lines if rec["message"] == "coordinator could not start"]
    assert err["severity"] == "ERROR"
    assert f"could not listen on {held} ({FLAGS[server]})" in err["error"], err["error"]
    assert "in use" in err["error"]
    assert not any(rec["message"] == "coordinator listening" for rec in lines)
    assert "add_port" not in r.stderr and "Failed to add port" not in r.stderr, r.stderr


async def test_a_grpc_client_on_the_http_port_is_a_warning_not_a_traceback(
    job: Job, caplog: pytest.LogCaptureFixture
) -> None:
    assert job.coord.http is not None
    caplog.set_level(logging.DEBUG)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{job.coord.http.port}") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await admin_pb2_grpc.AdminStub(ch).GetStatus(admin_pb2.GetStatusRequest(), timeout=5)
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    await asyncio.sleep(0.2)
    server_records = [r for r in caplog.records if r.name.startswith("aiohttp.server")]
    assert server_records, "the refused request was not logged at all"
    assert all(r.levelno == logging.WARNING and not r.exc_info for r in server_records), [
        (r.levelname, r.getMessage()[:100]) for r in server_records
    ]
    assert "not HTTP/1" in server_records[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# ---------------------------------------------------------------------------
# the size limit on messages
# ---------------------------------------------------------------------------

TOO_BIG = "x" * (C.MAX_MESSAGE_BYTES + 1024)


@pytest.fixture
async def job_with_peers(tmp_path: Path) -> Iterator[Job]:  # type: ignore[misc]
    j = await start_job(tmp_path)
    try:
        yield j
    finally:
        await j.coord.stop(grace=0.1)


async def test_an_oversized_message_is_refused_on_every_server(job_with_peers: Job) -> None:
    """RESOURCE_EXHAUSTED from gRPC itself, before the message is parsed, logged or journaled; the
    coordinator stays up and still answers a normal call afterwards."""
    coord = job_with_peers.coord
    assert coord.admin is not None
    codes: dict[str, grpc.StatusCode] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{coord.port}") as ch:
        call = peer_pb2_grpc.PeerStub(ch).Join()
        msg = peer_pb2.WorkerMessage()
        msg.register.job = TOO_BIG
        await call.write(msg)
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await asyncio.wait_for(call.read(), 10)
        codes["peer"] = ei.value.code()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{coord.trainer_port}") as ch:
        tcall = trainer_pb2_grpc.TrainerLinkStub(ch).Attach()
        await tcall.write(trainer_pb2.TrainerMessage(hello=trainer_pb2.TrainerHello(job=TOO_BIG)))
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await asyncio.wait_for(tcall.read(), 10)
        codes["trainer"] = ei.value.code()
    async with grpc.aio.insecure_channel(coord.admin.address) as ch:
        stub = admin_pb2_grpc.AdminStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await stub.Hold(admin_pb2.HoldRequest(reason=TOO_BIG), timeout=10)
        codes["admin"] = ei.value.code()
        reply = await stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)
    assert codes == dict.fromkeys(("peer", "trainer", "admin"), grpc.StatusCode.RESOURCE_EXHAUSTED), codes
    assert reply.phase == "starting"
    assert coord.serving and not coord.workers and coord.state.generation == 0


# ---------------------------------------------------------------------------
# a client at the wrong port
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("port", ["trainer", "admin"])
async def test_a_worker_given_another_port_of_the_coordinator_says_which_flag_to_fix(
    job_with_peers: Job, port: str
) -> None:
    """UNIMPLEMENTED from the trainer-link or admin port becomes, within seconds, an ERROR naming
    --coordinator and the coordinator's --listen; the worker keeps trying and is not registered."""
    from agent.worker import Worker
    from tests.servers.test_http import worker_config

    coord = job_with_peers.coord
    assert coord.admin is not None
    address = f"127.0.0.1:{coord.trainer_port}" if port == "trainer" else coord.admin.address
    w = Worker(replace(worker_config(address), http_listen=None))
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(w.run())
        try:
            await wait_for(lambda: "--coordinator" in w.last_reason, 10.0, "the worker to name its flag")
            await asyncio.sleep(0.5)
            assert not task.done(), "the worker gave up"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await w.stop_servers()
    errors = [r["event"] for r in logs if r["log_level"] == "error"]
    assert len(errors) == 1, errors  # once, not at every retry
    assert address in errors[0] and "--listen" in errors[0] and "UNIMPLEMENTED" in errors[0], errors[0]
    assert not w.registered.is_set() and not coord.workers


async def test_bind_refuses_a_port_a_default_grpc_server_shares(capfd: pytest.CaptureFixture[str]) -> None:
    """A server built with grpcio's defaults (SO_REUSEPORT on) holds the port: ours must not join it,
    and grpc's plain-text bind error stays off stderr, its cause in the error instead."""
    from agent.servers.listen import ListenError, bind

    other = grpc.aio.server()  # grpcio's defaults
    port = other.add_insecure_port("127.0.0.1:0")
    await other.start()
    try:
        ours = grpc.aio.server(options=list(C.GRPC_SERVER_OPTIONS))
        capfd.readouterr()
        with pytest.raises(ListenError) as ei:
            bind(ours, f"127.0.0.1:{port}", "--listen")
        assert str(ei.value) == (
            f"could not listen on 127.0.0.1:{port} (--listen): Address already in use (another process holds this port)"
        )
        assert capfd.readouterr().err == ""
        # Without the option, grpcio would have shared the port (FACTS section 6).
        shared = grpc.aio.server()
        assert shared.add_insecure_port(f"127.0.0.1:{port}") == port
    finally:
        await other.stop(0)
