"""A Pub/Sub notice's timing in the coordinator's metrics: Pub/Sub's own delivery apart from the
coordinator's notice-to-decision time, which counts from the subscriber's receipt."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from agent.coordinator import Coordinator
from agent.core.model import WorkerJoined
from agent.sources.gke_events import NodeEvent, parse
from agent.sources.pubsub import decide_notice
from simjob import notice_samples as S
from tests.agent.coordinators import in_memory_coordinator


def sample(coord: Coordinator, name: str, labels: dict[str, str] | None = None) -> float:
    v = coord.metrics.registry.get_sample_value(f"elastic_sidecar_{name}", labels or {})
    return 0.0 if v is None else v


async def test_pubsub_notice_metrics_count_delivery_and_decision_from_receipt() -> None:
    coord = in_memory_coordinator("timing-job", 2)
    await coord.start()
    try:
        for s in range(2):
            await coord.request(WorkerJoined(s, 0, f"inc-{s}", node=f"node-{s}"))
        data, attrs = S.gce_system_event("terminateOnHostMaintenance", "node-1")
        published = datetime.now(UTC) - timedelta(seconds=0.4)
        ev = parse(data, attrs, "m-1", published)
        assert isinstance(ev, NodeEvent)
        # As the intake hands it on: received 0.3 s ago, 0.1 s after Pub/Sub published it.
        received = time.time() - 0.3
        ev = replace(ev, received_at=received, delivery_seconds=0.1)
        await decide_notice(ev, coord.request, coord.metrics)
    finally:
        await coord.stop(grace=0.1)
    assert sample(coord, "pubsub_delivery_seconds_count") == 1
    assert abs(sample(coord, "pubsub_delivery_seconds_sum") - 0.1) < 1e-9
    # The decision counts from the receipt, 0.3 s before the handler ran, not from the handler.
    assert sample(coord, "detection_seconds_count", {"source": "pubsub"}) == 1
    assert 0.3 <= sample(coord, "detection_seconds_sum", {"source": "pubsub"}) < 5.0
