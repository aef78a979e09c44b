"""--straggler-replace's executor against the stand-in Kubernetes API, through the official client:
the slice's nodes cordoned and its pods deleted, the other slices untouched; an API that refuses, is
absent or too slow is logged and counted, never raised, and the coordinator goes on."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("kubernetes")

from agent.core.model import Policy, ReplaceSlice, Tick  # noqa: E402
from agent.slice_replace import SliceReplacer, requests_tpu  # noqa: E402
from standins.kube_api import HostInfo, KubeAPIStandIn, PodTable, write_kubeconfig  # noqa: E402
from tests.agent.coordinators import coordinator_config, wait_for  # noqa: E402

JOB = "elastic-demo"
TOKEN = "stand-in-token"
SLICES, HOSTS = 3, 2


def node(s: int, h: int) -> str:
    return f"node-{s}-{h}"


class Cluster:
    def __init__(self, tmp_path: Path, refuse: set[str]) -> None:
        self.table = PodTable(JOB, num_slices=SLICES, namespace="team-a")
        self.table.sync({(s, h): HostInfo(0, True, node(s, h)) for s in range(SLICES) for h in range(HOSTS)})
        nodes = {node(s, h): f"pool-{s}" for s in range(SLICES) for h in range(HOSTS)}
        self.api = KubeAPIStandIn(nodes, token=TOKEN, pods=self.table, refuse=refuse)
        self.kubeconfig = tmp_path / "kubeconfig"
        self.outcomes: list[str] = []

    def replacer(self, **kw: float) -> SliceReplacer:
        return SliceReplacer(JOB, self.kubeconfig, self.outcomes.append, **kw)

    def terminating(self) -> set[tuple[int, int]]:
        return set(self.table.take_deletions())


@pytest.fixture
async def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, getattr(request, "param", set()))
    write_kubeconfig(c.kubeconfig, await c.api.start(), TOKEN, namespace="team-a")
    try:
        yield c
    finally:
        await c.api.stop()


async def test_cordons_the_slices_nodes_and_deletes_its_pods_and_nothing_else(cluster: Cluster) -> None:
    r = cluster.replacer()
    done = await r.replace(ReplaceSlice(1, "straggler"))
    r.close()
    assert done.outcome == "replaced" and cluster.outcomes == ["replaced"], done
    assert cluster.api.unschedulable == {node(1, 0), node(1, 1)}
    assert cluster.terminating() == {(1, 0), (1, 1)}
    assert len(done.pods) == HOSTS and all(p.startswith(f"{JOB}-worker-1-") for p in done.pods)
    # The other slices' pods are running as before.
    listed = cluster.table.list([])
    assert {p["metadata"]["name"] for p in listed if "deletionTimestamp" in p["metadata"]} == set(done.pods)


@pytest.mark.parametrize(
    ("cluster", "cordoned", "deleted"),
    [
        # Without a cordon the pods would come back on the same slow nodes: nothing is deleted.
        ({"patch nodes"}, set(), set()),
        ({"delete pods"}, {node(2, 0), node(2, 1)}, set()),
        ({"list pods"}, set(), set()),
    ],
    indirect=["cluster"],
)
async def test_a_refusal_is_counted_and_leaves_the_slice_drained(
    cluster: Cluster, cordoned: set[str], deleted: set[tuple[int, int]]
) -> None:
    done = await cluster.replacer().replace(ReplaceSlice(2, "straggler"))
    assert done.outcome == "failed" and "403" in done.error and cluster.outcomes == ["failed"], done
    assert cluster.api.unschedulable == cordoned and cluster.terminating() == deleted


async def test_a_slice_without_pods_is_counted(cluster: Cluster) -> None:
    cluster.table.num_slices = 4
    done = await cluster.replacer().replace(ReplaceSlice(3, "straggler"))
    assert done.outcome == "no_pods" and cluster.outcomes == ["no_pods"]
    assert cluster.api.unschedulable == set() and cluster.terminating() == set()


async def test_an_absent_api_is_counted(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kc = tmp_path / "kubeconfig"
    write_kubeconfig(kc, f"http://127.0.0.1:{port}", TOKEN)
    outcomes: list[str] = []
    done = await SliceReplacer(JOB, kc, outcomes.append).replace(ReplaceSlice(0, "straggler"))
    assert done.outcome == "failed" and outcomes == ["failed"] and done.error, done


async def test_the_replacement_is_bounded_by_its_timeout(cluster: Cluster) -> None:
    done = await cluster.replacer(timeout=1e-9).replace(ReplaceSlice(1, "straggler"))
    assert done.outcome == "failed" and "not done within" in done.error, done
    assert cluster.api.unschedulable == set() and cluster.terminating() == set()


def test_only_tpu_pods_are_a_slices_hosts() -> None:
    """A Pathways JobSet's head pod (the coordinator's own) shares job-index 0 with slice 0's workers."""

    def pod(limits: dict[str, str] | None) -> SimpleNamespace:
        res = SimpleNamespace(limits=limits, requests=None)
        return SimpleNamespace(spec=SimpleNamespace(containers=[SimpleNamespace(resources=res)]))

    assert requests_tpu(pod({"google.com/tpu": "4"}))
    assert not requests_tpu(pod({"cpu": "8"})) and not requests_tpu(pod(None))


@pytest.mark.parametrize("cluster", [set(), {"delete pods"}], indirect=True)
async def test_the_coordinator_carries_it_out_and_counts_it_and_goes_on(cluster: Cluster) -> None:
    from agent.coordinator import Coordinator

    policy = Policy(num_slices=SLICES, hosts_per_slice=HOSTS, straggler_replace=True)
    coord = Coordinator(coordinator_config(JOB, policy, kubeconfig=cluster.kubeconfig))
    await coord.start()
    try:
        coord._execute(ReplaceSlice(0, "straggler"))  # noqa: SLF001  (the loop's executor step)
        outcome = "failed" if cluster.api.refuse else "replaced"
        name, labels = "elastic_sidecar_straggler_replacements_total", {"outcome": outcome}
        await wait_for(lambda: coord.metrics.registry.get_sample_value(name, labels) == 1, 30.0, outcome)
        assert cluster.api.unschedulable == {node(0, 0), node(0, 1)}
        assert cluster.terminating() == (set() if cluster.api.refuse else {(0, 0), (0, 1)})
        # The coordinator still decides.
        await asyncio.wait_for(coord.request(Tick()), 10.0)
    finally:
        await coord.stop(grace=0)


async def test_a_straggler_drain_replaces_the_slice_and_the_job_grows_back_onto_the_new_pods(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A real coordinator and trainer link: the verdict drains slice 1, the resume on the others sends the
    replacement (journaled), the stand-in's pods of slice 1 are deleted and its nodes cordoned, and the
    new pods' hosts registering bring the job back onto three slices, spending no retry."""
    from agent.coordinator import Coordinator
    from agent.core.model import Phase, StragglerVerdict, WorkerJoined, WorkerLost
    from tests.agent.coordinators import FakeTrainer

    policy = Policy(
        num_slices=SLICES, hosts_per_slice=HOSTS, elastic_min_slice_count=2, settle_seconds=0.0, straggler_replace=True
    )
    journal = tmp_path / "journal.jsonl"
    coord = Coordinator(coordinator_config(JOB, policy, kubeconfig=cluster.kubeconfig, journal=journal))
    await coord.start()
    trainer = FakeTrainer(f"127.0.0.1:{coord.trainer_port}", JOB)
    try:
        for s in range(SLICES):
            for h in range(HOSTS):
                await coord.request(WorkerJoined(s, h, f"a{s}.{h}", node=node(s, h)))
        await trainer.attach()
        await wait_for(lambda: coord.state.phase == Phase.RUNNING, 10.0, "running")
        await trainer.advance(3)
        d = await coord.request(StragglerVerdict(1, "slice", "drain", "late 30% for 3 windows"))
        assert 1 in coord.state.drains and not d.rejected, d.reason
        await wait_for(
            lambda: coord.state.active == frozenset({0, 2}) and not coord.state.trainer.resume_pending,
            10.0,
            "resumed on 0, 2",
        )
        name, labels = "elastic_sidecar_straggler_replacements_total", {"outcome": "replaced"}
        await wait_for(lambda: coord.metrics.registry.get_sample_value(name, labels) == 1, 30.0, "replaced")
        assert cluster.api.unschedulable == {node(1, 0), node(1, 1)}
        assert cluster.terminating() == {(1, 0), (1, 1)}
        lines = [json.loads(x) for x in journal.read_text().splitlines()]
        asked = [a for rec in lines for a in rec["actions"] if a["type"] == "ReplaceSlice"]
        assert [a["slice"] for a in asked] == [1]
        # The JobSet's new pods: the old sidecars go, new ones register on other nodes.
        for h in range(HOSTS):
            await coord.request(WorkerLost(1, h, f"a1.{h}", "stream_closed"))
        for h in range(HOSTS):
            await coord.request(WorkerJoined(1, h, f"b1.{h}", node=f"spare-{h}"))
        await wait_for(lambda: coord.state.active == frozenset({0, 1, 2}), 10.0, "grown back onto slice 1")
        assert 1 not in coord.state.drains and coord.state.retries_used == 0
    finally:
        await trainer.close()
        await coord.stop(grace=0)
