"""``elastic-sidecar admin`` as a subprocess against an in-process coordinator: output and exit codes.

(The same commands against the full simulated job: tests/e2e/test_admin_cli.py.)
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import time
from pathlib import Path

import grpc
import pytest

from agent.admin_cli import CLEAR_SCREEN, watch_status
from agent.core.model import NodeNotice, Phase
from protos.elastic_sidecar.v1 import admin_pb2
from tests.servers.conftest import Job, wait_for

REPO = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("ES_")}


async def cli(
    job: Job, tmp_path: Path, *argv: str, env: dict[str, str] | None = None, token: bool = True
) -> tuple[int, str, str]:
    cmd = [sys.executable, "-m", "agent", "admin", "--address", job.admin_address]
    if token:
        cmd += ["--token-file", str(tmp_path / "admin-token")]
    p = await asyncio.create_subprocess_exec(
        *cmd, *argv, cwd=REPO, env=env or ENV, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(p.communicate(), 60)
    assert p.returncode is not None
    return p.returncode, out.decode(), err.decode()


async def test_status_readable_and_json(job: Job, tmp_path: Path) -> None:
    await job.running()
    code, out, err = await cli(job, tmp_path, "status")
    assert code == 0, err
    table = out.splitlines()
    assert table[0].split() == ["SLICE", "STATE", "HOSTS", "DETAIL"]
    assert table[1].split() == ["0", "active", "h0:node-0"]
    assert "job servers-job: phase running, generation 1, active slices 0,1,2,3" in out
    assert "steps: last 0, committed none" in out
    # --json before or after the command name.
    for argv in (("status", "--json"), ("--json", "status")):
        code, out, err = await cli(job, tmp_path, *argv)
        assert code == 0, err
        doc = json.loads(out)
        assert doc["active_slices"] == [0, 1, 2, 3] and doc["inactive_slices"] == []
        assert doc["generation"] == 1 and doc["phase"] == "running" and doc["operator_hold"] is False
        assert [s["state"] for s in doc["slices"]] == ["active"] * 4
        assert doc["slices"][0]["hosts"][0]["node"] == "node-0"


async def test_exit_codes(job: Job, tmp_path: Path) -> None:
    await job.running()
    assert (await cli(job, tmp_path, "resume", "--reason", "nothing is held"))[0] == 1
    code, _, err = await cli(job, tmp_path, "drain", "9", "--reason", "x")
    assert code == 2 and "INVALID_ARGUMENT: slice 9 is out of range: this job has slices 0..3" in err
    code, _, err = await cli(job, tmp_path, "hold", "--reason", " ")
    assert code == 2 and "reason is required" in err
    for command in ("hold", "checkpoint"):  # argparse: --reason missing
        code, _, err = await cli(job, tmp_path, command)
        assert code == 2 and "--reason" in err, (command, err)
    code, _, err = await cli(job, tmp_path, "status", token=False)
    assert code == 3 and "UNAUTHENTICATED" in err and "--token-file" in err
    (tmp_path / "wrong").write_text("not-the-token\n")
    code, _, err = await cli(job, tmp_path, "status", "--token-file", str(tmp_path / "wrong"))
    assert code == 3 and "does not match" in err and "not-the-token" not in err
    (tmp_path / "empty").write_text("")
    code, _, err = await cli(job, tmp_path, "status", "--token-file", str(tmp_path / "empty"))
    assert code == 2 and "is empty" in err
    code, _, err = await cli(job, tmp_path, "--address", "127.0.0.1:1", "status")
    assert code == 4 and "UNAVAILABLE" in err
    assert job.coord.state.phase == Phase.RUNNING


async def test_the_peer_or_trainer_port_instead_of_the_admin_port_names_the_right_flag(
    job: Job, tmp_path: Path
) -> None:
    for port in (job.coord.port, job.coord.trainer_port):
        code, _, err = await cli(job, tmp_path, "--address", f"127.0.0.1:{port}", "status")
        assert code == 1 and "UNIMPLEMENTED" in err, err
        assert "--admin-listen" in err and "ES_ADMIN_ADDRESS" in err, err


async def test_token_from_env_and_commands_round_trip(job: Job, tmp_path: Path) -> None:
    await job.running()
    await job.trainer.advance(4)
    await wait_for(lambda: job.coord.state.trainer.last_step == 4, 5.0, "step 4")
    env = {**ENV, "ES_ADMIN_TOKEN_FILE": str(tmp_path / "admin-token")}
    t0 = time.monotonic()
    code, out, err = await cli(job, tmp_path, "checkpoint", "--reason", "before the upgrade", env=env, token=False)
    round_trip = time.monotonic() - t0
    assert code == 0, err
    assert out.startswith("committed step 4 (flush 0.01 s, generation 1"), out
    code, out, err = await cli(job, tmp_path, "hold", "--reason", "maintenance window", env=env, token=False)
    assert code == 0, err
    assert out.startswith("hold: operator hold: maintenance window; hold generation 2 with flush (generation 2"), out
    await wait_for(lambda: job.coord.state.phase == Phase.WAITING, 5.0, "the hold")
    code, out, err = await cli(job, tmp_path, "resume", "--reason", "window over", "--json")
    assert code == 0, err
    assert json.loads(out)["phase"] == "running"
    print(f"\nadmin CLI checkpoint round trip (process start to exit): {round_trip:.3f} s")


async def test_undrain_force_lifts_a_notice_drain(job: Job, tmp_path: Path) -> None:
    await job.running()
    await job.coord.request(NodeNotice("upcomingMaintenance", "pubsub", node="node-2", deadline=1e12))
    code, _, err = await cli(job, tmp_path, "undrain", "2", "--reason", "stale notice")
    assert code == 1 and "--force" in err, err
    code, out, err = await cli(job, tmp_path, "undrain", "2", "--force", "--reason", "stale notice")
    assert code == 0, err
    assert "operator undrain: stale notice; slice 2 no longer drained; forced" in out, out
    assert 2 not in job.coord.state.drains


async def test_events_backlog_and_follow(job: Job, tmp_path: Path) -> None:
    await job.running()
    code, out, err = await cli(job, tmp_path, "events", "--backlog", "3")
    assert code == 0, err
    rows = out.splitlines()
    assert len(rows) == 3 and "trainer resumed at step 0 on slices [0,1,2,3]" in rows[-1], rows
    code, out, _ = await cli(job, tmp_path, "events", "--backlog", "0")
    assert code == 0 and out == ""
    code, out, _ = await cli(job, tmp_path, "events", "--backlog", "2", "--json")
    docs = [json.loads(ln) for ln in out.splitlines()]
    assert [d["trigger"] for d in docs] == ["TrainerAttached", "TrainerResumed"] and docs[0]["generation"] == 1

    follow = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent",
        "admin",
        "--address",
        job.admin_address,
        "--token-file",
        str(tmp_path / "admin-token"),
        "events",
        "--backlog",
        "0",
        "--follow",
        cwd=REPO,
        env=ENV,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await wait_for(lambda: job.coord.feed.subscribers, 30.0, "the follower to subscribe")
        code, _, err = await cli(job, tmp_path, "drain", "3", "--reason", "follow me")
        assert code == 0, err
        assert follow.stdout is not None
        line = (await asyncio.wait_for(follow.stdout.readline(), 10)).decode()
        assert "OperatorCommand" in line and "operator drain: follow me; draining slice 3" in line, line
    finally:
        follow.send_signal(2)  # SIGINT: how a person ends --follow
        await asyncio.wait_for(follow.wait(), 10)
    assert follow.returncode == 0


async def test_status_watch_refreshes_until_ctrl_c_and_exits_130(job: Job, tmp_path: Path) -> None:
    await job.running()
    for as_json in (False, True):
        argv = ["status", "--watch", "0.2"] + (["--json"] if as_json else [])
        p = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "agent", "admin", "--address", job.admin_address],
            *["--token-file", str(tmp_path / "admin-token"), *argv],
            cwd=REPO,
            env=ENV,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert p.stdout is not None
        lines: list[str] = []
        try:
            while sum(("every 0.2 s" in ln or ln.startswith("{")) for ln in lines) < 3:
                lines.append((await asyncio.wait_for(p.stdout.readline(), 30)).decode())
                assert lines[-1], f"the watch ended early: {lines}"
        finally:
            p.send_signal(2)  # SIGINT: Ctrl-C
            out, _ = await asyncio.wait_for(p.communicate(), 10)
        assert p.returncode == 130, (as_json, lines)
        text = "".join(lines) + out.decode()
        assert "\x1b[" not in text, "clear-screen codes on a pipe"
        if as_json:
            docs = [json.loads(ln) for ln in lines]
            assert all(d["phase"] == "running" and d["active_slices"] == [0, 1, 2, 3] for d in docs), docs
        else:
            assert text.count("job servers-job: phase running") >= 3, text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"


def test_status_watch_clears_a_terminal_and_outlives_an_unavailable_coordinator() -> None:
    answers: list[admin_pb2.Status | grpc.RpcError] = [
        admin_pb2.Status(job="j", phase="running", generation=1, last_committed_step=-1),
        _Unavailable(),
        admin_pb2.Status(job="j", phase="waiting", generation=2, last_committed_step=-1),
    ]

    def fetch() -> admin_pb2.Status:
        a = answers.pop(0)
        if isinstance(a, grpc.RpcError):
            raise a
        return a

    def sleep(seconds: float) -> None:
        assert seconds == 3.0
        if not answers:
            raise KeyboardInterrupt

    out = _Terminal()
    assert watch_status(fetch, 3.0, False, out, sleep) == 130
    screens = out.getvalue().split(CLEAR_SCREEN)
    assert screens[0] == "" and len(screens) == 4, screens
    assert "job j: phase running, generation 1" in screens[1]
    assert "UNAVAILABLE: connection refused (asking again in 3 s)" in screens[2]
    assert "job j: phase waiting, generation 2" in screens[3]


def test_status_watch_stops_on_an_error_it_cannot_wait_out() -> None:
    class _Unauthenticated(_Unavailable):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAUTHENTICATED

    def fetch() -> admin_pb2.Status:
        raise _Unauthenticated()

    with pytest.raises(grpc.RpcError):
        watch_status(fetch, 1.0, False, io.StringIO(), lambda s: None)
