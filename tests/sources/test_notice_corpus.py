"""Done-when test of issue 10: real-format notices, published with the official client
through the Pub/Sub emulator, into a running coordinator of 8 slices.

Every message comes from :mod:`simjob.notice_samples`; the comment on each says
which document its shape follows. Asserted:

* informational notices, garbage, a foreign project and a duplicate change nothing;
* no healthy slice leaves training except for an imminent or in-progress
  disruption, or a scheduled one whose lead time has come;
* failure recoveries stay 0 (no retry is spent, no slice error is recorded);
* each scheduled drain begins before its window starts;
* a completion and a cancellation lift what they should, and the job grows back;
* a duplicate makes no second decision; garbage is counted and acked once.

Windows are seconds long and the lead time 2 s, so the whole run takes about 15 s.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from agent.config import WorkerConfig
from agent.coordinator import Coordinator
from agent.core.model import Phase
from agent.worker import Worker
from simjob import notice_samples as S
from simjob.pubsub_emulator import PubSubEmulator, publish_all
from tests.servers.conftest import JOB, FakeTrainer, coordinator_config, wait_for

N = 8
LEAD = 2.0
CLUSTER = "tpu-cluster"
PROJECT, NUMBER = "tpu-proj", "123456789012"
ZONE = "us-east5-a"


def node(s: int) -> str:
    return f"gke-{CLUSTER}-tpu-np-{s}-7f3a-w0"


def pool(s: int) -> str:
    # Slices 6 and 7 share a pool here only so the test can tell "one node" from "its pool".
    return "tpu-np-67" if s in (6, 7) else f"tpu-np-{s}"


class TimedList(list):
    """The fake trainer's command list, remembering when each command arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, item: Any) -> None:
        self.times.append(time.monotonic())
        super().append(item)


def holds(trainer: FakeTrainer) -> list[tuple[float, Any]]:
    cmds: TimedList = trainer.commands  # type: ignore[assignment]
    return [(t, c.hold) for t, c in zip(cmds.times, list(cmds), strict=False) if c.WhichOneof("cmd") == "hold"]


def worker_config(port: int, s: int) -> WorkerConfig:
    return WorkerConfig(
        job=JOB,
        coordinator=f"127.0.0.1:{port}",
        slice=s,
        host=0,
        node=node(s),
        node_pool=pool(s),
        pod=f"w-{s}",
        health_target=None,
        health_check="grpc",
        log_format="json",
        log_level="warning",
    )


def gce(method: str, s: int, **kw: Any) -> tuple[bytes, dict[str, str]]:
    # Cloud Audit Logs system_event LogEntry for a GCE instance (GKE node name == instance name);
    # maintenance fields in protoPayload.metadata as NVSentinel's gcp_normalizer.go reads them.
    return S.gce_system_event(method, node(s), project=PROJECT, zone=ZONE, **kw)


async def test_real_format_notices_through_the_emulator_into_eight_slices(pubsub_emulator: PubSubEmulator) -> None:
    name = uuid.uuid4().hex[:8]
    topic, sub = pubsub_emulator.create_topic_and_subscription(
        pubsub_emulator.project, f"corpus-{name}", f"corpus-{name}", ack_deadline_seconds=10
    )
    cfg = coordinator_config(
        N,
        admin=False,
        http=False,
        min_slices=1,
        pubsub_subscription=sub,
        cluster_name=CLUSTER,
        pubsub_project=(PROJECT, NUMBER),
    )
    cfg = replace(cfg, policy=replace(cfg.policy, notice_lead_seconds=LEAD))
    coord = Coordinator(cfg)
    await coord.start()
    trainer = FakeTrainer(f"127.0.0.1:{coord.trainer_port}", JOB)
    trainer.commands = TimedList()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(Worker(worker_config(coord.port, s))._run(stop)) for s in range(N)]  # noqa: SLF001
    publisher = pubsub_emulator.publisher_client()

    async def publish(*msgs: tuple[bytes, dict[str, str]]) -> float:
        await asyncio.to_thread(publish_all, publisher, topic, list(msgs))
        return time.monotonic()

    def settled(n: int) -> bool:
        return coord.intake.stats["acked"] >= n

    try:
        await trainer.attach()
        await wait_for(lambda: coord.state.phase == Phase.RUNNING, 20, "the job to run on 8 slices")
        gen0 = coord.state.generation
        now = datetime.now(UTC)

        # -- 1. nothing of this may touch training ---------------------------------
        harmless = [
            # GKE REST reference UpgradeInfoEvent, EventType END_OF_SUPPORT (cluster-wide).
            S.gke_upgrade_info("END_OF_SUPPORT", CLUSTER, project=PROJECT, project_number=NUMBER),
            # EventType COS_MILESTONE_VERSION_UPDATE, naming a node pool of the job.
            S.gke_upgrade_info(
                "COS_MILESTONE_VERSION_UPDATE", CLUSTER, node_pool=pool(0), project=PROJECT, project_number=NUMBER
            ),
            # Cluster notifications: UpgradeAvailableEvent and SecurityBulletinEvent.
            S.gke_upgrade_available(CLUSTER, project_number=NUMBER),
            S.gke_security_bulletin(CLUSTER, project_number=NUMBER),
            # UpgradeEvent with resourceType MASTER: the control plane, no node.
            S.gke_upgrade_event("", CLUSTER, resource_type="MASTER", project=PROJECT, project_number=NUMBER),
            # GCE compute.instances.migrateOnHostMaintenance: a live migration keeps the VM running.
            gce("migrateOnHostMaintenance", 0),
            # A GCE system event of another project (the project filter says so).
            S.gce_system_event("preempted", node(1), project="someone-else"),
        ]
        garbage = [(b"\xff\xfe not utf-8", {}), (b"{not json", {}), (b"", {"n": "1"})]
        await publish(*harmless, *garbage)
        await wait_for(lambda: settled(len(harmless) + len(garbage)), 20, "the harmless messages acked")
        await asyncio.sleep(0.5)
        assert coord.state.generation == gen0 and coord.state.active == frozenset(range(N))
        assert not coord.state.drains and not coord.state.planned and not holds(trainer)

        # -- 2. scheduled windows: drain LEAD s before each starts, not now ----------
        start1 = now + timedelta(seconds=6)
        far = now + timedelta(days=7)
        await publish(
            # compute.instances.upcomingMaintenance, maintenanceStatus PENDING, window in 6 s.
            gce("upcomingMaintenance", 1, timestamp=now, window_start=start1, insert_id=f"m1-{name}"),
            # compute.instances.upcomingInfraMaintenance a week ahead (later moved, below).
            gce("upcomingInfraMaintenance", 2, timestamp=now, window_start=far, insert_id=f"m2-{name}"),
            # upcomingMaintenance a day ahead for slice 3 (later cancelled, below).
            gce("upcomingMaintenance", 3, timestamp=now, window_start=now + timedelta(days=1), insert_id=f"m3-{name}"),
        )
        await wait_for(lambda: set(coord.state.planned) == {1, 2, 3}, 10, "three planned drains")
        assert not coord.state.drains and coord.state.active == frozenset(range(N)), "scheduled drains began early"

        # The week-ahead window moves to 5 s from now (canReschedule: the customer or GCE moved it).
        start2 = datetime.now(UTC) + timedelta(seconds=5)
        later = datetime.now(UTC)
        await publish(gce("upcomingInfraMaintenance", 2, timestamp=later, window_start=start2, insert_id=f"m2b-{name}"))
        # Cancelled (maintenanceStatus CANCELLED: read defensively, not seen in Google's documents).
        await publish(
            gce(
                "upcomingMaintenance",
                3,
                timestamp=later,
                window_start=now + timedelta(days=1),
                maintenance_status="CANCELLED",
                insert_id=f"m3c-{name}",
            )
        )
        await wait_for(lambda: set(coord.state.planned) <= {1, 2} and 3 not in coord.state.planned, 10, "3 cancelled")

        mono_of = lambda t: time.monotonic() + (t - datetime.now(UTC)).total_seconds()  # noqa: E731
        win1, win2 = mono_of(start1), mono_of(start2)
        await wait_for(lambda: {1, 2} <= set(coord.state.drains), 15, "both scheduled drains to begin")
        # Drain.since is when the decision core began the drain, on the coordinator's monotonic clock.
        drained_at = {s: coord.state.drains[s].since for s in (1, 2)}
        assert drained_at[1] < win1 - LEAD + 0.5 and drained_at[1] < win1, (drained_at, win1)
        assert drained_at[2] < win2 - LEAD + 0.5 and drained_at[2] < win2, (drained_at, win2)
        assert drained_at[1] >= win1 - LEAD - 0.3, "slice 1 drained long before its lead time"

        # -- 3. disruptions due now: drain (from memory: 1 slice suffices), never a failure --
        t_pub = await publish(
            # GCE compute.instances.preempted: the Spot VM goes in ~30 s. Published twice (a duplicate).
            gce("preempted", 7, timestamp=datetime.now(UTC), insert_id=f"p7-{name}"),
            gce("preempted", 7, timestamp=datetime.now(UTC), insert_id=f"p7-{name}"),
        )
        await wait_for(lambda: any(7 in h.down_slices for _, h in holds(trainer)), 10, "slice 7 held out")
        t_hold = next(t for t, h in holds(trainer) if 7 in h.down_slices)
        latency = t_hold - t_pub
        print(f"\nnotice-to-hold latency (preempted, emulator -> coordinator -> trainer): {latency * 1000:.0f} ms")
        await publish(
            # GKE cluster notification UpgradeEvent for node pool tpu-np-5: the pool's nodes are recreated.
            S.gke_upgrade_event(pool(5), CLUSTER, project=PROJECT, project_number=NUMBER, operation=f"op5-{name}"),
            # UpgradeInfoEvent DISRUPTION_EVENT: disruptionEvent.pdbBlockedNode names one node of tpu-np-67.
            S.gke_upgrade_info(
                "DISRUPTION_EVENT", CLUSTER, node_pool=pool(6), disrupted_node=node(6), project_number=NUMBER
            ),
            # UpgradeInfoEvent UPGRADE_LIFECYCLE state STARTED for tpu-np-4 (cancelled below).
            S.gke_upgrade_event(
                pool(4), CLUSTER, info=True, state="STARTED", operation=f"op4-{name}", project_number=NUMBER
            ),
            # upcomingMaintenance already ONGOING on slice 0 whose node is still up: drain now.
            gce(
                "upcomingMaintenance",
                0,
                timestamp=datetime.now(UTC),
                window_start=datetime.now(UTC) - timedelta(seconds=30),
                maintenance_status="ONGOING",
                insert_id=f"m0-{name}",
            ),
        )
        await wait_for(lambda: {0, 4, 5, 6} <= set(coord.state.drains), 10, "slices 0, 4, 5, 6 drained")
        assert 7 in coord.state.drains
        # The slices that remain may train on (min_slices=1): every drain so far holds with a snapshot.
        assert all(h.snapshot and not h.flush for _, h in holds(trainer)), "a drain here must go on from memory"

        # -- 4. completions and cancellations lift --------------------------------
        await publish(
            # upcomingMaintenance whose status.message says the window has completed.
            gce(
                "upcomingMaintenance",
                1,
                timestamp=datetime.now(UTC),
                window_start=start1,
                completed=True,
                insert_id=f"m1d-{name}",
            ),
            # UpgradeInfoEvent state CANCELED for the tpu-np-4 upgrade.
            S.gke_upgrade_event(
                pool(4), CLUSTER, info=True, state="CANCELED", operation=f"op4-{name}", project_number=NUMBER
            ),
            # GCE automaticRestart: slice 0's VM is running again (completes its disruption).
            gce("automaticRestart", 0, timestamp=datetime.now(UTC), insert_id=f"r0-{name}"),
        )
        await wait_for(
            lambda: not {0, 1, 4} & set(coord.state.drains) and {0, 1, 4} <= coord.state.active,
            15,
            "slices 0, 1, 4 back in training",
        )

        # -- the invariants of the whole run ----------------------------------------
        st = coord.state
        assert st.retries_used == 0 and not st.slice_errors
        assert (
            coord.metrics.registry.get_sample_value("elastic_sidecar_recoveries_total", {"cause": "failure"}) or 0
        ) == 0
        left = set().union(*(set(h.down_slices) for _, h in holds(trainer)))
        assert 3 not in left, "the cancelled window's slice left training"
        assert left <= {0, 1, 2, 4, 5, 6, 7}, left
        notice_decisions = [r for r in coord.feed.recent if r["trigger"] == "NodeNotice" and node(7) in r["reason"]]
        assert len(notice_decisions) == 1, [r["reason"] for r in notice_decisions]
        # A message is acked by a callback once the core has acted on it, so the last one's ack can
        # trail the state the waits above saw (CI saw 23 acked of 24): wait for it, then check them all.
        await wait_for(
            lambda: coord.intake.stats["acked"] >= coord.intake.stats["received"], 10, "every received message acked"
        )
        stats = coord.intake.stats
        assert stats["duplicate"] == 1 and stats["handler_error"] == 0 and stats["nacked"] == 0
        assert stats["rejected:not_utf8"] == 1 and stats["rejected:not_json"] == 1 and stats["rejected:empty"] == 1
        assert stats["informational"] == 6 and stats["foreign_project"] == 1
        assert stats["acked"] == stats["received"], stats
        reg = coord.metrics.registry
        assert reg.get_sample_value("elastic_sidecar_pubsub_message_outcomes_total", {"outcome": "duplicate"}) == 1
        assert reg.get_sample_value("elastic_sidecar_pubsub_messages_received_total") == stats["received"]
        print(
            f"planned drains began {win1 - drained_at[1]:.2f} s and {win2 - drained_at[2]:.2f} s before their windows"
        )
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        publisher.transport.close()
        await trainer.close()
        await coord.stop(grace=0.1)
