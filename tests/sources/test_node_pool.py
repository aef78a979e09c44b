"""Node -> node pool -> slice along the path the shipped manifests use.

A worker sidecar started with ``--node-pool-source=kubernetes`` reads its node's
``cloud.google.com/gke-nodepool`` label from the Kubernetes API (here the
loopback stand-in :mod:`standins.kube_api`, answering with the documented Node
object), registers with that pool, and a real-format GKE node-pool
``UpgradeEvent`` published through the Pub/Sub emulator drains exactly that
slice in a running coordinator.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from agent.config import WorkerConfig
from agent.coordinator import Coordinator
from agent.core.model import Phase
from agent.servers.status import coordinator_status
from agent.sources.node_pool import KubernetesAPI, NodeLookupError, node_pool_of
from agent.worker import Worker
from simjob import notice_samples as S
from simjob.pubsub_emulator import PubSubEmulator, publish_all
from standins.kube_api import KubeAPIStandIn
from tests.servers.conftest import JOB, FakeTrainer, coordinator_config, wait_for

NODES = {f"gke-tpu-{s}-abcd-w{s}": f"tpu-np-{s}" for s in range(4)}
TOKEN = "stand-in-service-account-token"


@pytest.fixture
async def kube(tmp_path: Any) -> AsyncIterator[tuple[KubeAPIStandIn, KubernetesAPI]]:
    standin = KubeAPIStandIn(NODES, token=TOKEN, forbidden={"gke-locked"})
    url = await standin.start()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    try:
        yield standin, KubernetesAPI(url, str(token_file))
    finally:
        await standin.stop()


async def test_node_pool_label_is_read_with_the_service_account_token(
    kube: tuple[KubeAPIStandIn, KubernetesAPI],
) -> None:
    standin, api = kube
    assert await node_pool_of(api, "gke-tpu-2-abcd-w2") == "tpu-np-2"
    with pytest.raises(NodeLookupError, match="no node named 'gke-missing'"):
        await node_pool_of(api, "gke-missing")
    with pytest.raises(NodeLookupError, match="rbac.yaml"):
        await node_pool_of(api, "gke-locked")
    with pytest.raises(NodeLookupError, match="token was refused"):
        await node_pool_of(KubernetesAPI(api.base_url, None), "gke-tpu-2-abcd-w2")
    assert standin.requests.count("gke-tpu-2-abcd-w2") == 2


def worker_config(coord_port: int, slice_: int, node: str, api: KubernetesAPI) -> WorkerConfig:
    return WorkerConfig(
        job=JOB,
        coordinator=f"127.0.0.1:{coord_port}",
        slice=slice_,
        host=0,
        node=node,
        node_pool="",
        pod=f"worker-{slice_}",
        health_target=None,
        health_check="grpc",
        log_format="json",
        log_level="warning",
        node_pool_source="kubernetes",
        kubernetes_api=api.base_url,
        kubernetes_token_file=api.token_file,
    )


async def test_a_node_pool_upgrade_reaches_the_slice_whose_worker_read_that_pool(
    kube: tuple[KubeAPIStandIn, KubernetesAPI], pubsub_emulator: PubSubEmulator
) -> None:
    _, api = kube
    name = uuid.uuid4().hex[:8]
    topic, sub = pubsub_emulator.create_topic_and_subscription(
        pubsub_emulator.project, f"np-{name}", f"np-{name}", ack_deadline_seconds=10
    )
    cfg = coordinator_config(
        4, admin=False, http=False, min_slices=2, pubsub_subscription=sub, cluster_name="tpu-cluster"
    )
    coord = Coordinator(cfg)
    await coord.start()
    trainer = FakeTrainer(f"127.0.0.1:{coord.trainer_port}", JOB)
    stop = asyncio.Event()
    workers = [Worker(worker_config(coord.port, s, node, api)) for s, node in enumerate(NODES)]
    tasks = [asyncio.create_task(w._run(stop)) for w in workers]  # noqa: SLF001
    publisher = pubsub_emulator.publisher_client()
    try:
        await trainer.attach()
        await wait_for(lambda: coord.state.phase == Phase.RUNNING, 20, "the job to run on 4 slices")
        pools = {s: r.node_pool for (s, _), r in coord.state.hosts.items()}
        assert pools == {s: f"tpu-np-{s}" for s in range(4)}, pools  # learnt from the API, not a flag
        assert coord.metrics.registry.get_sample_value("elastic_sidecar_workers_connected") == 4
        msg = S.gke_upgrade_event("tpu-np-2", "tpu-cluster", operation=f"op-{name}")
        await asyncio.to_thread(publish_all, publisher, topic, [msg])
        await wait_for(lambda: 2 in coord.state.drains, 20, "the upgrade to drain slice 2")
        assert set(coord.state.drains) == {2} and coord.state.retries_used == 0
        await wait_for(lambda: [c for c in trainer.commands if c.WhichOneof("cmd") == "hold"], 5, "a hold")
        holds = [c.hold for c in trainer.commands if c.WhichOneof("cmd") == "hold"]
        # Three of four slices remain (minimum 2): the state stays in memory, nothing is written to storage.
        assert holds[0].snapshot and not holds[0].flush and list(holds[0].down_slices) == [2]
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        publisher.transport.close()
        await trainer.close()
        await coord.stop(grace=0.1)


async def test_gke_maintenance_label_plans_a_drain_and_the_taint_drains_now(
    kube: tuple[KubeAPIStandIn, KubernetesAPI],
) -> None:
    """The worker polls its node: scheduled-maintenance-time (unix seconds) plans the drain for
    start - lead; the label going away lifts the plan; impending-node-termination drains now."""
    standin, api = kube
    cfg = coordinator_config(4, admin=False, http=False, min_slices=2)
    cfg = replace(cfg, policy=replace(cfg.policy, notice_lead_seconds=60.0))
    coord = Coordinator(cfg)
    await coord.start()
    trainer = FakeTrainer(f"127.0.0.1:{coord.trainer_port}", JOB)
    stop = asyncio.Event()
    workers = [
        Worker(replace(worker_config(coord.port, s, node, api), node_watch_seconds=0.1)) for s, node in enumerate(NODES)
    ]
    tasks = [asyncio.create_task(w._run(stop)) for w in workers]  # noqa: SLF001
    n1, n3 = list(NODES)[1], list(NODES)[3]
    try:
        await trainer.attach()
        await wait_for(lambda: coord.state.phase == Phase.RUNNING, 20, "the job to run on 4 slices")
        start = time.time() + 3600
        standin.labels[n1] = {"cloud.google.com/scheduled-maintenance-time": str(int(start))}
        await wait_for(lambda: 1 in coord.state.planned, 10, "a planned drain of slice 1")
        begins_in = coord.state.planned[1].since - time.monotonic()
        assert 3600 - 60 - 5 < begins_in < 3600 - 60 + 5, begins_in
        assert not coord.state.drains and coord.state.active == frozenset(range(4))
        (pending,) = coordinator_status(coord).pending_notices
        assert pending.slice == 1 and "(planned)" in pending.kind and abs(pending.deadline_unix - start) < 5
        standin.labels[n1] = {}
        await wait_for(lambda: 1 not in coord.state.planned, 10, "the plan lifted with the label")
        standin.taints[n3] = [{"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}]
        await wait_for(lambda: 3 in coord.state.drains, 10, "slice 3 drained")
        assert coord.state.retries_used == 0 and not coord.state.slice_errors
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await trainer.close()
        await coord.stop(grace=0.1)
