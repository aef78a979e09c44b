"""Sizes: log lines and journal lines have a maximum, whatever a peer sends.

(The gRPC servers' receive limit, RESOURCE_EXHAUSTED above ``constants.MAX_MESSAGE_BYTES``,
is tested in test_listen.py.)
"""

from __future__ import annotations

import io
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from agent import constants as C
from agent import log as logmod
from agent.coordinator import Coordinator
from protos.elastic_sidecar.v1 import trainer_pb2
from tests.servers.conftest import JOB, FakeTrainer, Job, coordinator_config, wait_for


def test_a_short_record_is_one_plain_json_line() -> None:
    rec = {"time": 1.5, "reason": "host 1.0 lost", "actions": [{"type": "HoldTrainer"}]}
    assert logmod.bounded(rec) == json.dumps(rec)


def test_long_values_are_cut_with_a_marker_and_the_line_stays_under_its_maximum() -> None:
    big = "E" * (2 << 20)  # a 2 MiB error text
    rec = {"time": 1.5, "generation": 3, "reason": "slice error", "event_detail": {"message": big, "step": 7}}
    line = logmod.bounded(rec)
    assert len(line.encode()) <= logmod.MAX_LINE_BYTES
    out = json.loads(line)
    assert out["generation"] == 3 and out["reason"] == "slice error" and out["event_detail"]["step"] == 7
    msg = out["event_detail"]["message"]
    assert msg.startswith("E" * 100) and msg.endswith(
        f"[cut {len(big) - logmod.MAX_VALUE_CHARS} of {len(big)} characters]"
    )
    assert "long values cut" in out[logmod.TRUNCATED_KEY]


def test_a_record_of_many_values_keeps_its_short_fields() -> None:
    rec = {"time": 2.0, "phase": "holding", "hosts": {f"h{i}": "x" * 4000 for i in range(100)}}
    line = logmod.bounded(rec, max_bytes=16 * 1024)
    assert len(line.encode()) <= 16 * 1024
    out = json.loads(line)
    assert out["time"] == 2.0 and out["phase"] == "holding" and "hosts" not in out
    assert "only its short fields" in out[logmod.TRUNCATED_KEY]


def test_log_lines_cut_long_values(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    try:
        logmod.configure("json", "info", role="test")
        logmod.get("sizes").warning("a peer said something long", detail="z" * 500_000)
    finally:
        monkeypatch.undo()
        logmod.configure("json", "warning")  # back onto the real stdout for later tests
    (line,) = [ln for ln in out.getvalue().splitlines() if "a peer said" in ln]
    rec = json.loads(line)
    assert len(line.encode()) < 2 * logmod.MAX_VALUE_CHARS
    assert rec["detail"].endswith(f"[cut {500_000 - logmod.MAX_VALUE_CHARS} of 500000 characters]")


async def test_a_large_slice_error_is_journaled_cut(tmp_path: Path) -> None:
    """Just under the servers' receive limit: accepted, decided on, and journaled as a bounded line."""
    journal = tmp_path / "journal.jsonl"
    coord = Coordinator(replace(coordinator_config(), journal=journal))
    await coord.start()
    job = Job(coord, FakeTrainer(f"127.0.0.1:{coord.trainer_port}", JOB))
    try:
        await job.running()
        text = "DATA_LOSS: " + "x" * (C.MAX_MESSAGE_BYTES - 4096)
        err = trainer_pb2.SliceError(slices=[1], message=text, step=job.trainer.step, generation=job.trainer.generation)
        await job.trainer._send(trainer_pb2.TrainerMessage(slice_error=err))  # noqa: SLF001
        await wait_for(lambda: "TrainerSliceError" in journal.read_text(), 10.0, "the slice error's journal line")
    finally:
        await job.trainer.close()
        await job.coord.stop(grace=0.1)
    lines = journal.read_text().splitlines()
    assert all(len(ln.encode()) <= logmod.MAX_LINE_BYTES for ln in lines), max(len(ln) for ln in lines)
    (rec,) = [json.loads(ln) for ln in lines if '"TrainerSliceError"' in ln]
    assert rec["event_detail"]["message"].startswith("DATA_LOSS: xxx")
    assert "[cut " in rec["event_detail"]["message"]
