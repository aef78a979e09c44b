"""The intake never blocks the job: a coordinator whose subscription is missing starts,
trains, stays ready, and says why notices are degraded (real emulator, real servers)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import aiohttp

from simjob.pubsub_emulator import PubSubEmulator
from tests.servers.conftest import start_job, wait_for


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.text()


async def test_missing_subscription_job_starts_trains_and_says_why(
    tmp_path: Path, pubsub_emulator: PubSubEmulator
) -> None:
    sub = f"projects/{pubsub_emulator.project}/subscriptions/never-created-{uuid.uuid4().hex[:8]}"
    job = await start_job(tmp_path, pubsub_subscription=sub)
    try:
        await job.running()  # every slice up, the trainer resumed: the job is not held back
        await job.trainer.advance(5)
        await wait_for(lambda: job.coord.state.trainer.last_step == 5, 5, "five steps")
        status, body = await get(job.http_url + "/readyz")
        assert status == 200 and "pubsub" not in json.loads(body)["checks"], body

        reg = job.coord.metrics.registry
        await wait_for(
            lambda: (
                (reg.get_sample_value("elastic_sidecar_pubsub_stream_errors_total", {"code": "NOT_FOUND"}) or 0) >= 1
            ),
            20,
            "a NOT_FOUND stream error counted",
        )
        assert reg.get_sample_value("elastic_sidecar_pubsub_streaming") == 0
        status, body = await get(job.http_url + "/status")
        intake = json.loads(body)["notice_intake"]
        assert status == 200 and intake["degraded"] and not intake["streaming"]
        assert intake["error_code"] == "NOT_FOUND" and "does not exist" in intake["hint"] and sub in intake["hint"]
        assert job.coord.state.phase == "running" and job.coord.state.retries_used == 0
    finally:
        await job.trainer.close()
        await job.coord.stop(grace=0.1)
