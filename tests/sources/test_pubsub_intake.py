"""PubSubIntake against the real Pub/Sub emulator: ack after handling, dedupe, counts, bursts."""

from __future__ import annotations

import asyncio
import json
import os
import random
import stat
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from google.cloud import pubsub_v1

from agent.sources.gke_events import GCE_METHODS, K8S_REASONS, Kind, NodeEvent, parse
from agent.sources.pubsub import PubSubIntake
from simjob import notice_samples as S
from simjob.pubsub_emulator import EmulatorMissing, PubSubEmulator, publish_all

CLUSTER = "train-a"
PROJECT = "tpu-proj"
PROJECT_NUMBER = "123456789012"
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
ACK_DEADLINE = 10  # the smallest Pub/Sub allows

Msg = tuple[bytes, dict[str, str]]


class RecordingIntake(PubSubIntake):
    """Also remembers which message ids it ACKed and NACKed."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.acked_ids: list[str] = []
        self.nacked_ids: list[str] = []

    def _ack(self, message: Any) -> None:
        self.acked_ids.append(message.message_id)
        super()._ack(message)

    def _nack(self, message: Any) -> None:
        self.nacked_ids.append(message.message_id)
        super()._nack(message)


@pytest.fixture
def topic_sub(pubsub_emulator: PubSubEmulator) -> tuple[str, str]:
    name = uuid.uuid4().hex[:10]
    return pubsub_emulator.create_topic_and_subscription(
        pubsub_emulator.project, f"events-{name}", f"sidecar-{name}", ack_deadline_seconds=ACK_DEADLINE
    )


@pytest.fixture
def publisher(pubsub_emulator: PubSubEmulator) -> Iterator[Any]:
    pub = pubsub_emulator.publisher_client(
        batch_settings=pubsub_v1.types.BatchSettings(max_messages=1000, max_bytes=4 * 1024 * 1024, max_latency=0.02)
    )
    yield pub
    pub.transport.close()


async def wait_until(pred: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what()}")
        await asyncio.sleep(0.02)


async def publish(publisher: Any, topic: str, msgs: list[Msg]) -> list[str]:
    return list(await asyncio.to_thread(publish_all, publisher, topic, msgs))


def identity(msg: Msg) -> str:
    ev = parse(msg[0], msg[1], "", None)
    assert isinstance(ev, NodeEvent), ev
    return ev.identity


def recorder() -> tuple[list[NodeEvent], Callable[[NodeEvent], Awaitable[None]]]:
    handled: list[NodeEvent] = []

    async def handle(ev: NodeEvent) -> None:
        await asyncio.sleep(0)
        handled.append(ev)

    return handled, handle


# --------------------------------------------------------------------------
# a mixed stream
# --------------------------------------------------------------------------


def mixed_stream(rng: random.Random) -> tuple[list[Msg], list[Msg], Counter[str]]:
    """(messages to publish in order, the valid unique ones, expected counters)."""
    times = [T0 + timedelta(seconds=i) for i in range(200)]
    rng.shuffle(times)  # event times out of publish order
    t = iter(times)
    methods, reasons = sorted(GCE_METHODS), sorted(K8S_REASONS)
    valid: list[Msg] = []
    for i in range(60):
        valid.append(
            S.gce_system_event(
                methods[i % len(methods)],
                f"gke-tpu-np-{i % 4}-n{i}",
                project=PROJECT,
                timestamp=next(t),
                insert_id=f"gce-{i}",
            )
        )
    for i in range(40):
        valid.append(
            S.k8s_node_event(
                reasons[i % 4],
                f"gke-tpu-np-{i % 4}-k{i}",
                CLUSTER,
                project=PROJECT,
                timestamp=next(t),
                insert_id=f"k8s-{i}",
            )
        )
    for i in range(20):
        valid.append(
            S.gke_upgrade_event(
                f"np-{i}",
                CLUSTER,
                project=PROJECT,
                project_number=PROJECT_NUMBER,
                operation=f"op-{i}",
                start_time=next(t),
                info=bool(i % 2),
            )
        )
    duplicates = rng.sample(valid, 40)  # same bytes again: same insertId / operation

    ts_attr = {"logging.googleapis.com/timestamp": S.rfc3339(T0)}
    k8s_container = json.loads(S.k8s_node_event("DeletingNode", "n")[0])
    k8s_container["resource"]["type"] = "k8s_container"
    bad_labels = json.loads(S.gce_system_event("preempted", "n")[0])
    bad_labels["resource"]["labels"] = ["zone"]
    malformed: list[tuple[Msg, str]] = (
        [((f"not json {i} {{".encode(), ts_attr), "not_json") for i in range(10)]
        + [((b"\xff\xfe" + bytes([i]) * 5, ts_attr), "not_utf8") for i in range(10)]
        + [((S.gce_system_event("preempted", f"n{i}")[0][: 50 + i], ts_attr), "not_json") for i in range(5)]
        + [((b"", {**ts_attr, "n": str(i)}), "empty") for i in range(5)]
        + [
            (S.gce_system_event("compute.instances.insert", f"n{i}", project=PROJECT), "unknown_method")
            for i in range(5)
        ]
        + [(S.k8s_node_event("NodeNotReady", f"n{i}", CLUSTER), "unknown_method") for i in range(5)]
        + [((json.dumps(k8s_container).encode(), ts_attr), "unsupported_resource") for _ in range(5)]
        + [((json.dumps(bad_labels).encode(), ts_attr), "bad_field") for _ in range(5)]
    )
    # Real messages that disrupt no node: counted as informational, never handled.
    informational: list[Msg] = (
        [S.gke_upgrade_event("", CLUSTER, resource_type="MASTER", project_number=PROJECT_NUMBER) for _ in range(5)]
        + [S.gke_security_bulletin(CLUSTER, project_number=PROJECT_NUMBER) for _ in range(5)]
        + [S.gke_upgrade_info("END_OF_SUPPORT", CLUSTER, project_number=PROJECT_NUMBER) for _ in range(5)]
    )
    foreign_cluster: list[Msg] = [
        S.k8s_node_event("DeletingNode", f"o{i}", "other-cluster", project=PROJECT) for i in range(15)
    ] + [S.gke_upgrade_event(f"np-{i}", "other-cluster", project_number=PROJECT_NUMBER) for i in range(10)]
    foreign_project = [S.gce_system_event("preempted", f"o{i}", project="other-project") for i in range(5)]
    stream = valid + duplicates + [m for m, _ in malformed] + informational + foreign_cluster + foreign_project
    rng.shuffle(stream)

    def harmless(m: Msg) -> bool:
        ev = parse(m[0], m[1], "", None)
        return isinstance(ev, NodeEvent) and ev.kind is Kind.INFORMATIONAL

    handled_valid = [m for m in valid if not harmless(m)]
    expect: Counter[str] = Counter(
        received=len(stream),
        accepted=len(handled_valid),
        duplicate=sum(not harmless(m) for m in duplicates),
        informational=len(informational) + sum(harmless(m) for m in valid + duplicates),
        foreign_cluster=len(foreign_cluster),
        foreign_project=len(foreign_project),
        acked=len(stream),
    )
    for _, reason in malformed:
        expect[f"rejected:{reason}"] += 1
    return stream, handled_valid, expect


async def test_mixed_stream_each_event_handled_once_each_message_acked_once(
    topic_sub: tuple[str, str], publisher: Any
) -> None:
    topic, sub = topic_sub
    stream, valid, expect = mixed_stream(random.Random(20260501))
    handled, handle = recorder()
    counted: Counter[str] = Counter()
    intake = RecordingIntake(
        sub, handle, cluster=CLUSTER, project=[PROJECT, PROJECT_NUMBER], on_count=lambda k: counted.update([k])
    )
    intake.start()
    try:
        ids = await publish(publisher, topic, stream)
        await wait_until(
            lambda: intake.stats["acked"] >= len(stream), 60, lambda: f"all {len(stream)} acked, have {intake.stats}"
        )
        # Longer than the ack deadline: a lost ACK would have come back by now.
        await asyncio.sleep(ACK_DEADLINE + 2)
    finally:
        await asyncio.to_thread(intake.stop)

    assert Counter({k: v for k, v in intake.stats.items() if v}) == expect
    assert intake.stats["redelivered"] == 0 and intake.stats["nacked"] == 0
    assert counted == intake.stats
    assert sorted(intake.acked_ids) == sorted(ids)  # every message acked exactly once
    assert len(set(ids)) == len(ids)
    got = Counter(ev.identity for ev in handled)
    assert set(got) == {identity(m) for m in valid}
    assert max(got.values()) == 1, [k for k, v in got.items() if v > 1]
    assert all(ev.cluster in ("", CLUSTER) for ev in handled)


# --------------------------------------------------------------------------
# failure and copies in flight
# --------------------------------------------------------------------------


async def test_handler_that_raises_once_gets_the_message_again(topic_sub: tuple[str, str], publisher: Any) -> None:
    topic, sub = topic_sub
    msgs = [S.gce_system_event("preempted", f"n{i}", insert_id=f"id-{i}") for i in range(5)]
    flaky = identity(msgs[2])
    attempts: Counter[str] = Counter()
    handled: list[str] = []

    async def handle(ev: NodeEvent) -> None:
        attempts[ev.identity] += 1
        if ev.identity == flaky and attempts[ev.identity] == 1:
            raise RuntimeError("decision store unavailable")
        handled.append(ev.identity)

    intake = RecordingIntake(sub, handle)
    intake.start()
    try:
        ids = await publish(publisher, topic, msgs)
        await wait_until(lambda: intake.stats["accepted"] == 5, 30, lambda: f"5 accepted, have {intake.stats}")
    finally:
        await asyncio.to_thread(intake.stop)
    assert sorted(handled) == sorted(identity(m) for m in msgs)
    assert attempts[flaky] == 2
    assert intake.stats["handler_error"] == 1 and intake.stats["nacked"] == 1
    assert intake.nacked_ids == [ids[2]]
    assert intake.stats["received"] == 6  # the NACKed one came back once
    assert sorted(intake.acked_ids) == sorted(ids)


async def test_handler_timeout_nacks_and_retries(topic_sub: tuple[str, str], publisher: Any) -> None:
    topic, sub = topic_sub
    calls = 0

    async def handle(ev: NodeEvent) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(5)

    intake = RecordingIntake(sub, handle, handler_timeout=0.3)
    intake.start()
    try:
        await publish(publisher, topic, [S.gce_system_event("hostError", "n1")])
        await wait_until(lambda: intake.stats["accepted"] == 1, 30, lambda: f"accepted, have {intake.stats}")
    finally:
        await asyncio.to_thread(intake.stop)
    assert calls == 2 and intake.stats["handler_error"] == 1


@pytest.mark.parametrize("first_attempt_fails", [False, True])
async def test_copy_arriving_while_original_is_handled(
    topic_sub: tuple[str, str], publisher: Any, first_attempt_fails: bool
) -> None:
    topic, sub = topic_sub
    msg = S.k8s_node_event("MaintenanceWindowStarted", "n1", CLUSTER, insert_id="same")
    release = asyncio.Event()
    calls = 0
    done: list[str] = []

    async def handle(ev: NodeEvent) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await release.wait()
            if first_attempt_fails:
                raise RuntimeError("lost the decision")
        done.append(ev.identity)

    intake = RecordingIntake(sub, handle)
    intake.start()
    try:
        ids = await publish(publisher, topic, [msg, msg])
        await wait_until(lambda: intake.stats["received"] == 2, 30, lambda: f"2 received, have {intake.stats}")
        await asyncio.sleep(0.2)
        assert calls == 1  # the copy waits for the original instead of reaching the handler
        release.set()
        await wait_until(
            lambda: intake.stats["accepted"] == 1 and intake.stats["duplicate"] == 1,
            30,
            lambda: f"1 accepted + 1 duplicate, have {intake.stats}",
        )
    finally:
        await asyncio.to_thread(intake.stop)
    assert done == [identity(msg)]
    assert sorted(intake.acked_ids) == sorted(ids)
    assert intake.stats["nacked"] == (2 if first_attempt_fails else 0)


async def test_a_notice_carries_when_it_arrived_and_how_long_pubsub_took(
    topic_sub: tuple[str, str], publisher: Any
) -> None:
    """The handler learns when the subscriber got the message and Pub/Sub's delivery time (from the
    server's publish_time): the hold's own latency is measured from there."""
    topic, sub = topic_sub
    handled: list[tuple[NodeEvent, float]] = []

    async def handle(ev: NodeEvent) -> None:
        handled.append((ev, time.time()))

    intake = PubSubIntake(sub, handle)
    intake.start()
    try:
        before = time.time()
        await publish(publisher, topic, [S.gce_system_event("preempted", "n-arrival")])
        await wait_until(lambda: bool(handled), 30, lambda: f"one handled, have {intake.stats}")
    finally:
        await asyncio.to_thread(intake.stop)
    ev, at = handled[0]
    assert ev.received_at is not None and before <= ev.received_at <= at
    # The emulator runs on this machine: its publish_time and our clock agree to well within a second.
    assert ev.delivery_seconds is not None and -1.0 < ev.delivery_seconds <= ev.received_at - before + 1.0


async def test_sync_handler_and_concurrent_future_handler(topic_sub: tuple[str, str], publisher: Any) -> None:
    topic, sub = topic_sub
    seen: list[str] = []
    loop = asyncio.get_running_loop()

    def handle(ev: NodeEvent) -> Any:
        seen.append(ev.node)
        if ev.node == "n0":
            return None  # a plain function
        return asyncio.run_coroutine_threadsafe(asyncio.sleep(0.01), loop)  # a concurrent future

    intake = PubSubIntake(sub, handle)
    intake.start()
    try:
        await publish(publisher, topic, [S.gce_system_event("preempted", f"n{i}") for i in range(3)])
        await wait_until(lambda: intake.stats["accepted"] == 3, 30, lambda: f"3 accepted, have {intake.stats}")
        assert intake.running
    finally:
        await asyncio.to_thread(intake.stop)
    assert sorted(seen) == ["n0", "n1", "n2"]
    assert not intake.running and intake.error is None


async def test_missing_subscription_stops_the_intake_visibly(pubsub_emulator: PubSubEmulator) -> None:
    _, handle = recorder()
    intake = PubSubIntake(f"projects/{pubsub_emulator.project}/subscriptions/does-not-exist", handle)
    intake.start()
    try:
        await wait_until(lambda: not intake.running, 30, lambda: "the stream to fail")
    finally:
        await asyncio.to_thread(intake.stop)
    assert intake.error is not None and "NotFound" in type(intake.error).__name__ + repr(intake.error)


def test_bad_subscription_name() -> None:
    with pytest.raises(ValueError, match="projects/P/subscriptions/S"):
        PubSubIntake("sidecar-events", lambda ev: None)


# --------------------------------------------------------------------------
# burst
# --------------------------------------------------------------------------

BURST = 10_000
# Measured on the 2-core CI machine: about 5.5 s (publish 0.9 s; about 1,900 messages/s end to
# end), well under a minute, so it runs by default and needs no slow marker.


async def test_burst_of_10000_messages_none_lost(topic_sub: tuple[str, str], publisher: Any) -> None:
    topic, sub = topic_sub
    methods = sorted(m for m in GCE_METHODS if "migrate" not in m)  # a live migration disrupts nothing
    reasons = sorted(K8S_REASONS)
    msgs = [
        S.gce_system_event(methods[i % len(methods)], f"gke-tpu-np-{i % 64}-n{i}", project=PROJECT, insert_id=f"b{i}")
        if i % 2
        else S.k8s_node_event(reasons[i % 4], f"gke-tpu-np-{i % 64}-k{i}", CLUSTER, insert_id=f"k{i}")
        for i in range(BURST)
    ]
    handled: set[str] = set()
    calls = 0

    async def handle(ev: NodeEvent) -> None:
        nonlocal calls
        calls += 1
        handled.add(ev.identity)

    intake = RecordingIntake(sub, handle, cluster=CLUSTER)
    intake.start()
    try:
        t0 = time.monotonic()
        ids = await publish(publisher, topic, msgs)
        t_published = time.monotonic() - t0
        await wait_until(lambda: intake.stats["acked"] >= BURST, 120, lambda: f"{BURST} acked, have {intake.stats}")
        t_done = time.monotonic() - t0
    finally:
        await asyncio.to_thread(intake.stop)
    rate = BURST / t_done
    print(
        f"\nburst: {BURST} messages published in {t_published:.1f} s, all handled and acked "
        f"{t_done:.1f} s after the first publish: {rate:.0f} messages/s end to end"
    )
    assert calls == BURST and len(handled) == BURST
    assert intake.stats["accepted"] == BURST and intake.stats["received"] == BURST
    assert sorted(intake.acked_ids) == sorted(ids)


# --------------------------------------------------------------------------
# the emulator harness fails loudly when the emulator is missing
# --------------------------------------------------------------------------


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_harness_names_missing_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EmulatorMissing, match="java.*apt-get install openjdk"):
        PubSubEmulator().start()


def test_harness_names_missing_emulator_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _script(tmp_path / "java", "exit 0")
    _script(tmp_path / "gcloud", f"echo {tmp_path / 'sdk'}")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(EmulatorMissing, match="google-cloud-cli-pubsub-emulator") as e:
        PubSubEmulator().start()
    assert "cloud-pubsub-emulator does not exist" in str(e.value)


# --------------------------------------------------------------------------
# the intake never blocks the job
# --------------------------------------------------------------------------


async def test_missing_subscription_is_reported_with_its_fix_and_the_intake_recovers_once_created(
    pubsub_emulator: PubSubEmulator, publisher: Any
) -> None:
    """NOT_FOUND is not retryable for the client: the intake keeps reopening anyway and says why."""
    name = uuid.uuid4().hex[:10]
    project = pubsub_emulator.project
    sub = f"projects/{project}/subscriptions/missing-{name}"
    handled, handle = recorder()
    states: list[bool] = []
    intake = RecordingIntake(sub, handle, on_state=states.append, retry_first=0.2, retry_max=0.4)
    intake.start()
    try:
        await wait_until(lambda: intake.error_code == "NOT_FOUND", 30, lambda: f"NOT_FOUND, have {intake.status()}")
        st = intake.status()
        assert st["degraded"] and not st["streaming"] and st["error_code"] == "NOT_FOUND"
        assert "does not exist" in st["hint"] and sub in st["hint"] and "setup.sh" in st["hint"]
        await wait_until(lambda: intake.restarts >= 2, 10, lambda: f"two reopen attempts, have {intake.status()}")
        assert intake.stats["stream_error:NOT_FOUND"] >= 2 and False in states
        # The operator fixes it: the intake picks the subscription up by itself.
        topic, _ = pubsub_emulator.create_topic_and_subscription(
            project, f"late-{name}", f"missing-{name}", ack_deadline_seconds=ACK_DEADLINE
        )
        msg = S.gce_system_event("preempted", "gke-n-1", project=PROJECT, insert_id=f"late-{name}")
        await publish(publisher, topic, [msg])
        await wait_until(lambda: len(handled) == 1, 30, lambda: f"the notice handled, have {intake.status()}")
        st = intake.status()
        assert st["streaming"] and not st["degraded"] and st["hint"] == "" and states[-1] is True
    finally:
        await asyncio.to_thread(intake.stop)


def test_stream_error_hints_name_the_fix() -> None:
    from agent.sources.pubsub import stream_error_hint

    sub = "projects/p/subscriptions/s"
    assert "roles/pubsub.subscriber" in stream_error_hint("PERMISSION_DENIED", sub) and sub in stream_error_hint(
        "PERMISSION_DENIED", sub
    )
    assert "Workload Identity" in stream_error_hint("UNAUTHENTICATED", sub)
    assert "does not exist" in stream_error_hint("NOT_FOUND", sub)
    assert stream_error_hint("UNAVAILABLE", sub) == ""  # transient: retried quietly
