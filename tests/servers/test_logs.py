"""The daemons' stdout in Cloud Logging's JSON format, from real processes.

A coordinator and two worker sidecars run as subprocesses with
``--log-format json``; a trainer (the TrainerLink protocol, in this process)
attaches; a worker is killed, so one recovery runs from hold to resume. Every
stdout line must be one JSON object with ``severity``, ``message``, ``time``
and ``logging.googleapis.com/labels`` (``jobset``, ``role``; for workers also
``slice`` and ``host``), and the recovery's decision lines must share one
``logging.googleapis.com/operation``, ``first`` on the hold and ``last`` on the
acknowledged resume.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog

from agent import log as logmod
from protos.elastic_sidecar.v1 import admin_pb2, admin_pb2_grpc
from simjob.ports import free_port
from tests.servers.conftest import FakeTrainer, wait_for, write_token

REPO = Path(__file__).resolve().parents[2]
JOB = "logs-job"
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("ES_")}, "PYTHONUNBUFFERED": "1"}
LABELS = "logging.googleapis.com/labels"
OPERATION = "logging.googleapis.com/operation"


def lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in lines(path)]


def spawn(tmp_path: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    out = open(tmp_path / f"{name}.stdout", "wb")  # noqa: SIM115
    err = open(tmp_path / f"{name}.stderr", "wb")  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", "agent", *args], cwd=REPO, stdout=out, stderr=err, env=ENV)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def test_every_line_is_cloud_logging_json_and_a_recovery_is_one_operation(tmp_path: Path) -> None:
    peer = tmp_path / "peer-token"
    write_token(peer)
    admin_token = tmp_path / "admin-token"
    write_token(admin_token)
    port, admin_port, trainer_port = free_port(), free_port(), free_port()
    coord = spawn(
        tmp_path,
        "coordinator",
        "coordinator",
        f"--job={JOB}",
        f"--listen=127.0.0.1:{port}",
        f"--trainer-listen=127.0.0.1:{trainer_port}",
        "--num-slices=2",
        "--elastic-min-slice-count=1",
        f"--admin-listen=127.0.0.1:{admin_port}",
        f"--admin-token-file={admin_token}",
        "--http-listen=none",
        f"--peer-token-file={peer}",
        "--log-format=json",
    )
    procs = [coord]
    trainer = FakeTrainer(f"127.0.0.1:{trainer_port}", job=JOB)
    cout = tmp_path / "coordinator.stdout"
    try:
        await wait_for(
            lambda: any('"coordinator listening"' in ln for ln in lines(cout)) or coord.poll() is not None,
            30.0,
            "the coordinator to listen",
        )
        assert coord.poll() is None, (tmp_path / "coordinator.stderr").read_text()
        workers = [
            spawn(
                tmp_path,
                f"worker-{s}",
                "worker",
                f"--job={JOB}",
                f"--coordinator=127.0.0.1:{port}",
                f"--slice={s}",
                f"--node=node-{s}",
                f"--peer-token-file={peer}",
                "--log-format=json",
            )
            for s in (0, 1)
        ]
        procs += workers
        await trainer.attach()
        await wait_for(lambda: trainer.kinds() == ["resume"], 30.0, "the trainer to be started")
        await trainer.advance(5)
        # An admin call without the token: a refused attempt is a WARNING line with labels too.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{admin_port}") as ch:
            try:
                await admin_pb2_grpc.AdminStub(ch).GetStatus(admin_pb2.GetStatusRequest())
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.UNAUTHENTICATED
        # The trainer can start before a worker has printed its registration (the coordinator
        # decides on the registration it received; the worker logs on the reply): wait for
        # the line, or the kill below can leave that worker's output empty.
        await wait_for(
            lambda: all(
                any('"registered with coordinator"' in ln for ln in lines(tmp_path / f"worker-{s}.stdout"))
                for s in (0, 1)
            ),
            30.0,
            "both workers to log their registration",
        )
        workers[1].kill()
        workers[1].wait()
        await wait_for(lambda: trainer.kinds() == ["resume", "hold", "resume"], 10.0, "hold and resume after the kill")
        await wait_for(
            lambda: any('"trainer resumed at step 5 on slices [0]' in ln for ln in lines(cout)),
            10.0,
            "the resume acknowledgement to be logged",
        )
    finally:
        await trainer.close()
        stop(procs)

    outputs = {p.name.removesuffix(".stdout"): p for p in tmp_path.glob("*.stdout")}
    assert set(outputs) == {"coordinator", "worker-0", "worker-1"}
    for name, path in outputs.items():
        raw = lines(path)
        assert raw, f"{name} wrote nothing"
        for ln in raw:
            rec = json.loads(ln)  # every line is one JSON object
            assert rec["severity"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), rec
            assert rec["message"] and rec["time"].endswith("Z"), rec
            labels = rec[LABELS]
            assert labels["jobset"] == JOB, rec
            if name == "coordinator":
                assert labels["role"] == "coordinator", rec
            else:
                assert (labels["role"], labels["slice"], labels["host"]) == ("worker", name[-1], "0"), rec
            assert "logging.googleapis.com/sourceLocation" in rec

    log = records(outputs["coordinator"])
    refused = [r for r in log if r["message"] == "admin call refused: missing bearer token"]
    assert len(refused) == 1 and refused[0]["severity"] == "WARNING"
    assert refused[0]["method"] == "/elastic_sidecar.v1.Admin/GetStatus" and refused[0]["token"] == "missing"
    assert admin_token.read_text().strip() not in outputs["coordinator"].read_text()

    decisions = [r for r in log if "trigger" in r]
    assert decisions, "no decision lines"
    for r in decisions:
        assert r[LABELS]["generation"].isdigit(), r  # moved into the labels: filterable in the Logs Explorer
        assert "generation" not in r, r
    start = next(r for r in decisions if "resume generation 1" in r["message"])
    assert OPERATION not in start, "the first start is not a recovery"
    op = [r for r in decisions if OPERATION in r and r[OPERATION]["id"] == "recovery-2"]
    assert [r["trigger"] for r in op] == ["WorkerLost", "TrainerHeld", "TrainerResumed"], [r["message"] for r in op]
    assert {r[LABELS]["generation"] for r in op} == {"2"}
    assert all(r[OPERATION]["producer"] == "elastic-sidecar" for r in op)
    assert op[0][OPERATION].get("first") is True and "last" not in op[0][OPERATION]
    assert "first" not in op[1][OPERATION] and "last" not in op[1][OPERATION]
    assert op[-1][OPERATION].get("last") is True and "hold generation 2" in op[0]["message"]
    # Lines before the hold and after the acknowledged resume are outside it (the shutdown
    # at the end of the test may start a recovery of its own: another operation id).
    i, j = decisions.index(op[0]), decisions.index(op[-1])
    assert decisions[i : j + 1] == op
    assert all(OPERATION not in r for r in decisions[:i])
    assert all(OPERATION not in r for r in decisions[j + 1 : j + 2]), "the line after the recovery is outside it"


async def test_console_format_is_readable_text(tmp_path: Path) -> None:
    port = free_port()
    p = spawn(
        tmp_path,
        "coordinator",
        "coordinator",
        f"--job={JOB}",
        f"--listen=127.0.0.1:{port}",
        f"--trainer-listen=127.0.0.1:{free_port()}",
        "--num-slices=1",
        "--admin-listen=none",
        "--http-listen=none",
        "--log-format=console",
    )
    out = tmp_path / "coordinator.stdout"
    try:
        await wait_for(
            lambda: any("coordinator listening" in ln for ln in lines(out)) or p.poll() is not None,
            30.0,
            "the coordinator to listen",
        )
    finally:
        stop([p])
    (line,) = [ln for ln in lines(out) if "coordinator listening" in ln]
    assert not line.startswith("{") and "[info" in line and "role=coordinator" in line, line
    assert "jobset=" not in line, "the job name is noise at a terminal"


def test_library_records_become_the_same_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    """grpc, aiohttp and the Pub/Sub client log through the standard logging module: same format, same labels."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        logmod.configure("json", "info", jobset=JOB, role="worker", slice=3, host=1)
        logging.getLogger("google.api_core.bidi").warning("stream %s reopened", "s-1")
        logging.getLogger("google.api_core.bidi").info("chatty library detail")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logging.getLogger("aiohttp.server").exception("Error handling request")
        out = capsys.readouterr().out
    finally:
        structlog.reset_defaults()
        root.handlers[:] = handlers
        root.setLevel(level)
    recs = [json.loads(ln) for ln in out.splitlines()]
    assert [(r["severity"], r["message"], r["logger"]) for r in recs] == [
        ("WARNING", "stream s-1 reopened", "google.api_core.bidi"),
        ("ERROR", "Error handling request", "aiohttp.server"),
    ]
    for r in recs:
        assert r[LABELS] == {"jobset": JOB, "role": "worker", "slice": "3", "host": "1"}
        assert r["logging.googleapis.com/sourceLocation"]["file"] == __file__, "points at the caller, not the bridge"
    assert "RuntimeError: boom" in recs[1]["exception"]
