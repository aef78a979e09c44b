"""gke_events.parse: every format GKE and the Logging sink publish, and everything that is not."""

from __future__ import annotations

import json
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.sources.gke_events import (
    GCE_METHODS,
    K8S_REASONS,
    PARSER_ERROR_PREFIX,
    REJECT_REASONS,
    Kind,
    NodeEvent,
    Rejected,
    Target,
    parse,
)
from simjob import notice_samples as S

T0 = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
PUBLISHED = T0 + timedelta(seconds=7)


def _parse(msg: tuple[bytes, dict[str, str]], mid: str = "m-1", pt: datetime | None = PUBLISHED) -> Any:
    return parse(msg[0], msg[1], mid, pt)


def _event(msg: tuple[bytes, dict[str, str]], **kw: Any) -> NodeEvent:
    ev = _parse(msg, **kw)
    assert isinstance(ev, NodeEvent), ev
    return ev


def _rejected(msg: tuple[bytes, dict[str, str]], reason: str, *, mentions: str = "") -> Rejected:
    r = _parse(msg)
    assert isinstance(r, Rejected), r
    assert r.reason == reason, r
    assert mentions in r.detail, r
    return r


def _entry(msg: tuple[bytes, dict[str, str]]) -> dict[str, Any]:
    return json.loads(msg[0])


def _with_entry(msg: tuple[bytes, dict[str, str]], entry: Any) -> tuple[bytes, dict[str, str]]:
    return json.dumps(entry).encode(), msg[1]


# --------------------------------------------------------------------------
# GCE system events (shapes: Cloud Audit Logs system_event entries; maintenance
# metadata as NVIDIA NVSentinel csp-health-monitor gcp_normalizer.go reads it)
# --------------------------------------------------------------------------

GCE_EXPECT: dict[str, tuple[Kind, timedelta | None]] = {
    "compute.instances.preempted": (Kind.IMMINENT, timedelta(seconds=30)),
    "compute.instances.terminateOnHostMaintenance": (Kind.IMMINENT, timedelta(seconds=60)),
    "compute.instances.hostError": (Kind.IN_PROGRESS, None),
    "compute.instances.guestTerminate": (Kind.IN_PROGRESS, None),
    "compute.instances.automaticRestart": (Kind.COMPLETED, None),
    "compute.instances.migrateOnHostMaintenance": (Kind.INFORMATIONAL, None),
    # Pending with no window: about the metadata server's 60 s.
    "compute.instances.upcomingMaintenance": (Kind.IMMINENT, timedelta(seconds=60)),
    "compute.instances.upcomingInfraMaintenance": (Kind.IMMINENT, timedelta(seconds=60)),
}


def test_every_gce_method_is_covered() -> None:
    assert set(GCE_EXPECT) == set(GCE_METHODS)


@pytest.mark.parametrize("method", sorted(GCE_EXPECT))
def test_gce_system_event(method: str) -> None:
    msg = S.gce_system_event(method, "gke-tpu-np-0-a1b2-x7k2", project="proj-a", zone="us-east5-b", timestamp=T0)
    ev = _event(msg, mid="42")
    kind, notice = GCE_EXPECT[method]
    assert ev.kind is kind and ev.target is Target.NODE and ev.what == method
    assert ev.node == "gke-tpu-np-0-a1b2-x7k2" and ev.project == "proj-a" and ev.location == "us-east5-b"
    assert ev.event_time == T0 and ev.message_id == "42" and ev.source == "log_sink"
    assert ev.start == (None if notice is None else T0 + notice)
    assert ev.cleared is (kind is Kind.COMPLETED)


@pytest.mark.parametrize("method", ["upcomingMaintenance", "upcomingInfraMaintenance"])
def test_gce_maintenance_scheduled_a_week_ahead_is_scheduled_with_its_window(method: str) -> None:
    start, end = T0 + timedelta(days=7), T0 + timedelta(days=7, hours=4)
    ev = _event(
        S.gce_system_event(method, "n-1", timestamp=T0, window_start=start, window_end=end, can_reschedule=False)
    )
    assert ev.kind is Kind.SCHEDULED and ev.start == start and ev.end == end
    assert ev.maintenance_type == "SCHEDULED" and ev.can_reschedule is False
    assert ev.key == "maintenance:n-1"


def test_gce_maintenance_ongoing_is_in_progress() -> None:
    start = T0 - timedelta(minutes=5)
    ev = _event(
        S.gce_system_event("upcomingMaintenance", "n-1", timestamp=T0, window_start=start, maintenance_status="ONGOING")
    )
    assert ev.kind is Kind.IN_PROGRESS and ev.start == start


def test_gce_maintenance_completion_message_completes_it() -> None:
    msg = S.gce_system_event(
        "upcomingMaintenance", "n-1", timestamp=T0, window_start=T0 - timedelta(hours=1), completed=True
    )
    ev = _event(msg)
    assert ev.kind is Kind.COMPLETED and ev.cleared


def test_gce_maintenance_cancelled_status() -> None:
    msg = S.gce_system_event(
        "upcomingMaintenance", "n-1", timestamp=T0, window_start=T0 + timedelta(days=1), maintenance_status="CANCELLED"
    )
    assert _event(msg).kind is Kind.CANCELLED


def test_gce_unreadable_window_start_is_a_bad_field() -> None:
    msg = S.gce_system_event("upcomingMaintenance", "n-1", timestamp=T0, window_start=T0)
    entry = _entry(msg)
    entry["protoPayload"]["metadata"]["windowStartTime"] = "next tuesday"
    _rejected(_with_entry(msg, entry), "bad_field", mentions="windowStartTime")


def test_gce_node_pool_and_cluster_from_labels_when_present() -> None:
    msg = S.gce_system_event("preempted", "n-1", timestamp=T0)
    entry = _entry(msg)
    entry["labels"] = {"goog-k8s-node-pool-name": "np-7", "goog-k8s-cluster-name": "c-1"}
    ev = _event(_with_entry(msg, entry))
    assert ev.node_pool == "np-7" and ev.cluster == "c-1"


def test_gce_versioned_method_name() -> None:
    msg = S.gce_system_event("preempted", "n-1", timestamp=T0)
    entry = _entry(msg)
    entry["protoPayload"]["methodName"] = "v1.compute.instances.preempted"
    assert _event(_with_entry(msg, entry)).kind is Kind.IMMINENT


def test_gce_unknown_method() -> None:
    msg = S.gce_system_event("compute.instances.setMetadata", "n-1", timestamp=T0)
    _rejected(msg, "unknown_method", mentions="setMetadata")


def test_gce_entry_from_another_log() -> None:
    msg = S.gce_system_event("preempted", "n-1", timestamp=T0)
    entry = _entry(msg)
    entry["logName"] = "projects/p/logs/cloudaudit.googleapis.com%2Factivity"
    _rejected(_with_entry(msg, entry), "unknown_type", mentions="activity")


def test_event_time_falls_back_to_attribute_then_publish_time() -> None:
    msg = S.gce_system_event("hostError", "n-1", timestamp=T0)
    entry = _entry(msg)
    del entry["timestamp"]
    ev = _event(_with_entry(msg, entry))
    assert ev.event_time == T0  # from the logging.googleapis.com/timestamp attribute
    ev = _event((json.dumps(entry).encode(), {}))
    assert ev.event_time == PUBLISHED
    ev = parse(json.dumps(entry).encode(), {}, "m", None)
    assert isinstance(ev, NodeEvent) and ev.event_time is None


def test_nanosecond_and_offset_timestamps() -> None:
    ev = _event(S.gce_system_event("preempted", "n-1", timestamp="2026-05-01T14:00:00.123456789+02:00"))
    assert ev.event_time == T0 + timedelta(microseconds=123456)


def test_identity_is_stable_across_publishes_and_distinct_across_entries() -> None:
    a = S.gce_system_event("preempted", "n-1", timestamp=T0, insert_id="abc")
    b = S.gce_system_event("preempted", "n-1", timestamp=T0, insert_id="abd")
    assert _event(a).identity == _event(a, mid="other").identity
    assert _event(a).identity != _event(b).identity
    entry = _entry(a)
    del entry["insertId"]
    assert _event(_with_entry(a, entry)).identity.startswith("sha256:")


# --------------------------------------------------------------------------
# Kubernetes node Events (reason strings unverified, FACTS section 4)
# --------------------------------------------------------------------------


def test_every_k8s_reason_is_covered() -> None:
    assert set(K8S_REASONS) == {
        "MaintenanceWindowScheduled",
        "MaintenanceWindowStarted",
        "MaintenanceWindowCleared",
        "DeletingNode",
    }


def test_k8s_node_events() -> None:
    at = T0 + timedelta(hours=3)
    ev = _event(S.k8s_node_event("MaintenanceWindowScheduled", "n-2", "c", timestamp=T0, scheduled_time=at))
    assert ev.kind is Kind.SCHEDULED and ev.start == at and ev.node == "n-2" and ev.cluster == "c"
    assert _event(S.k8s_node_event("MaintenanceWindowStarted", "n-2", timestamp=T0)).kind is Kind.IN_PROGRESS
    assert _event(S.k8s_node_event("MaintenanceWindowCleared", "n-2", timestamp=T0)).cleared
    assert _event(S.k8s_node_event("DeletingNode", "n-2", timestamp=T0)).kind is Kind.IN_PROGRESS
    no_time = S.k8s_node_event("MaintenanceWindowScheduled", "n-2", timestamp=T0, message="soon")
    ev = _event(no_time)
    assert ev.kind is Kind.IMMINENT and ev.start == T0 + timedelta(seconds=60)


def test_k8s_node_name_from_involved_object() -> None:
    msg = S.k8s_node_event("DeletingNode", "n-3", timestamp=T0)
    entry = _entry(msg)
    del entry["resource"]["labels"]["node_name"]
    assert _event(_with_entry(msg, entry)).node == "n-3"


def test_k8s_other_reason() -> None:
    _rejected(S.k8s_node_event("NodeReady", "n-1"), "unknown_method", mentions="NodeReady")


# --------------------------------------------------------------------------
# GKE cluster notifications (shapes: GKE "Cluster notifications" attributes and
# the GKE REST reference for UpgradeEvent, UpgradeInfoEvent, DisruptionEvent)
# --------------------------------------------------------------------------


def test_gke_node_pool_upgrade_is_in_progress_and_operation_start_is_not_a_deadline() -> None:
    ev = _event(S.gke_upgrade_event("np-1", "c-1", start_time=T0, operation="op-1"))
    assert ev.kind is Kind.IN_PROGRESS and ev.target is Target.NODE_POOL
    assert ev.node_pool == "np-1" and ev.cluster == "c-1" and ev.node == ""
    assert ev.event_time == T0 and ev.start is None and ev.end is None
    assert ev.project == S.DEFAULT_PROJECT_NUMBER and ev.source == "gke_notification"
    assert "op-1" in ev.summary and ev.key == "upgrade:np-1:op-1"


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        ("STARTED", Kind.IN_PROGRESS),
        ("SUCCEEDED", Kind.COMPLETED),
        ("FAILED", Kind.COMPLETED),
        ("CANCELED", Kind.COMPLETED),
        ("STATE_UNSPECIFIED", Kind.INFORMATIONAL),
    ],
)
def test_gke_upgrade_info_lifecycle_by_state(state: str, kind: Kind) -> None:
    ev = _event(S.gke_upgrade_event("np", "c", start_time=T0, info=True, state=state))
    assert ev.kind is kind and ev.node_pool == "np" and ev.start is None


@pytest.mark.parametrize("event_type", ["END_OF_SUPPORT", "COS_MILESTONE_VERSION_UPDATE", "SOMETHING_NEW"])
def test_gke_informational_upgrade_info_types_do_nothing(event_type: str) -> None:
    for msg in (S.gke_upgrade_info(event_type, "c"), S.gke_upgrade_info(event_type, "c", node_pool="np")):
        ev = _event(msg)
        assert ev.kind is Kind.INFORMATIONAL and ev.target is Target.CLUSTER and ev.node_pool == ""
        assert ev.what == f"UpgradeInfoEvent/{event_type}"


def test_gke_disruption_event_names_one_node_and_its_pdb_timeout() -> None:
    ev = _event(
        S.gke_upgrade_info(
            "DISRUPTION_EVENT",
            "c",
            node_pool="np",
            start_time=T0,
            disrupted_node="gke-np-n7",
            pdb_violation_timeout="600s",
        )
    )
    assert ev.kind is Kind.IN_PROGRESS and ev.target is Target.NODE
    assert ev.node == "gke-np-n7" and ev.node_pool == "np"  # the node, not its whole pool
    assert ev.end == T0 + timedelta(seconds=600)
    bad = S.gke_upgrade_info("DISRUPTION_EVENT", "c", node_pool="np", disrupted_node="")
    _rejected(bad, "missing_field", mentions="pdbBlockedNode")
    worse = S.gke_upgrade_info("DISRUPTION_EVENT", "c", node_pool="np", disrupted_node="n", pdb_violation_timeout="1h")
    _rejected(worse, "bad_field", mentions="pdbViolationTimeout")


def test_gke_v1_type_url_and_publish_time_fallback() -> None:
    data, attrs = S.gke_upgrade_event("np", "c", start_time=T0)
    payload = json.loads(attrs["payload"])
    del payload["operationStartTime"]
    attrs = {**attrs, "payload": json.dumps(payload), "type_url": attrs["type_url"].replace("v1beta1", "v1")}
    ev = _event((data, attrs))
    assert ev.event_time == PUBLISHED and ev.kind is Kind.IN_PROGRESS


def test_gke_master_upgrade_bulletins_and_available_upgrades_are_informational() -> None:
    for msg in (
        S.gke_upgrade_event("", "c", resource_type="MASTER"),
        S.gke_security_bulletin(),
        S.gke_upgrade_available(),
    ):
        ev = _event(msg)
        assert ev.kind is Kind.INFORMATIONAL and not ev.node and not ev.node_pool


def test_gke_other_notification_type_is_unknown() -> None:
    data, attrs = S.gke_security_bulletin()
    _rejected(
        (data, {**attrs, "type_url": attrs["type_url"].replace("SecurityBulletinEvent", "FancyEvent")}),
        "unknown_type",
        mentions="FancyEvent",
    )


def test_gke_notification_bad_fields() -> None:
    data, attrs = S.gke_upgrade_event("np", "c", start_time=T0)
    _rejected((data, {**attrs, "payload": '{"resourceType": "NODE_POOL", '}), "not_json", mentions="payload")
    _rejected((data, {**attrs, "payload": "[1, 2]"}), "bad_field", mentions="list")
    _rejected((data, {k: v for k, v in attrs.items() if k != "payload"}), "missing_field", mentions="payload")
    _rejected((data, {k: v for k, v in attrs.items() if k != "type_url"}), "missing_field", mentions="type_url")
    _rejected((data, {**attrs, "type_url": "type.googleapis.com/foo.Bar"}), "unknown_type", mentions="foo.Bar")
    payload = json.loads(attrs["payload"])
    for key, value, reason in [
        ("resource", "projects/p/locations/l/clusters/c", "bad_field"),
        ("resource", 7, "bad_field"),
        ("operationStartTime", "yesterday", "bad_field"),
        ("operationStartTime", 1714564800, "bad_field"),
    ]:
        _rejected((data, {**attrs, "payload": json.dumps({**payload, key: value})}), reason, mentions=key)
    _rejected((data, {**attrs, "cluster_name": "other"}), "bad_field", mentions="cluster_name")


# --------------------------------------------------------------------------
# garbage
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"  \n", "empty"),
        (b"\xff\xfe\x00garbage", "not_utf8"),
        (b"hello world", "not_json"),
        (b'{"logName": "projects/p/logs/events", "resource": {"type": "k8s_node"', "not_json"),
        (b"[" * 100_000, "not_json"),
        (b"1" * 5000, "not_json"),
        (b"[1, 2]", "unknown_type"),
        (b'"a string"', "unknown_type"),
        (b"{}", "missing_field"),
        (b'{"resource": {"type": "k8s_container"}, "logName": "x"}', "unsupported_resource"),
    ],
)
def test_garbage(data: bytes, reason: str) -> None:
    _rejected((data, {}), reason)


def test_truncated_log_entries() -> None:
    for msg in (S.gce_system_event("preempted", "n-1"), S.k8s_node_event("DeletingNode", "n-1")):
        for cut in (1, len(msg[0]) // 3, len(msg[0]) // 2, len(msg[0]) - 1):
            _rejected((msg[0][:cut], msg[1]), "not_json")


WRONG_TYPES = [
    (("resource",), "gce_instance", "bad_field"),
    (("resource", "labels"), ["zone"], "bad_field"),
    (("resource", "labels", "zone"), 5, "bad_field"),
    (("resource", "type"), None, "missing_field"),
    (("logName",), 12, "bad_field"),
    (("timestamp",), 1714564800, "bad_field"),
    (("timestamp",), "2026-13-01T00:00:00Z", "bad_field"),
    (("protoPayload",), "text", "bad_field"),
    (("protoPayload", "methodName"), ["compute.instances.preempted"], "bad_field"),
    (("protoPayload", "resourceName"), "instances/n-1", "bad_field"),
    (("protoPayload", "resourceName"), "projects/p/zones/z/instances/bad name!", "bad_field"),
    (("protoPayload", "resourceName"), None, "missing_field"),
]


@pytest.mark.parametrize(("path", "value", "reason"), WRONG_TYPES)
def test_wrong_types_in_gce_entry(path: tuple[str, ...], value: Any, reason: str) -> None:
    msg = S.gce_system_event("preempted", "n-1", timestamp=T0)
    entry = _entry(msg)
    target = entry
    for k in path[:-1]:
        target = target[k]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    _rejected(_with_entry(msg, entry), reason, mentions=path[-1])


@pytest.mark.parametrize(
    ("path", "value"),
    [(("jsonPayload",), []), (("jsonPayload", "reason"), 3), (("resource", "labels", "node_name"), {"a": 1})],
)
def test_wrong_types_in_k8s_entry(path: tuple[str, ...], value: Any) -> None:
    msg = S.k8s_node_event("DeletingNode", "n-1", timestamp=T0)
    entry = _entry(msg)
    target = entry
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    _rejected(_with_entry(msg, entry), "bad_field", mentions=path[-1])


def test_wrong_attribute_types_and_year_9999() -> None:
    _rejected((b"x", {"type_url": 5}), "bad_field", mentions="type_url")  # type: ignore[dict-item]
    msg = S.gce_system_event("preempted", "n-1", timestamp="9999-12-31T23:59:50Z")
    _rejected(msg, "bad_field", mentions="9999")
    assert isinstance(parse(None, None, None, "x"), Rejected)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# property: parse is total
# --------------------------------------------------------------------------


def _valid_samples() -> list[tuple[bytes, dict[str, str]]]:
    # The same bytes every run (fixed times, seeded ids): the mutations below cut at byte offsets, so
    # a random id's length would change which cases a derandomised run draws.
    rng = random.Random(0)
    with mock.patch.object(S.uuid, "uuid4", lambda: uuid.UUID(int=rng.getrandbits(128), version=4)):
        return (
            [
                S.gce_system_event(m, f"gke-n-{i}", timestamp=T0, window_start=T0 if i else None)
                for i, m in enumerate(GCE_METHODS)
            ]
            + [S.k8s_node_event(r, "gke-n-9", timestamp=T0, scheduled_time=T0) for r in K8S_REASONS]
            + [S.gke_upgrade_event("np-1", start_time=T0), S.gke_upgrade_event("np-1", start_time=T0, info=True)]
            + [S.gke_upgrade_event("", resource_type="MASTER", start_time=T0)]
            + [S.gke_security_bulletin(), S.gke_upgrade_available()]
            + [
                S.gke_upgrade_info("DISRUPTION_EVENT", node_pool="np", disrupted_node="n-3", start_time=T0),
                S.gke_upgrade_info("END_OF_SUPPORT", start_time=T0),
            ]
        )


_VALID = _valid_samples()

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00+01:00", "2026-05-01T12:00:00Z", "1714564800"]),
    st.sampled_from(
        ["compute.instances.preempted", "k8s_node", "gce_instance", "NODE_POOL", "projects/p/zones/z/instances/i"]
    ),
)
_json_value = st.one_of(
    _json_leaf,
    st.lists(_json_leaf, max_size=3),
    st.dictionaries(st.text(max_size=8), _json_leaf, max_size=3),
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _mutate_json(obj: Any, path: tuple[Any, ...], op: str, value: Any) -> Any:
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    if op == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return obj


@st.composite
def messages(draw: st.DrawFn) -> tuple[Any, Any]:
    data, attrs = draw(st.sampled_from(_VALID))
    attrs = dict(attrs)
    mode = draw(st.sampled_from(["valid", "json", "json", "json", "payload", "bytes", "random", "attrs"]))
    if mode == "json" and data.startswith(b"{"):
        entry = json.loads(data)
        path = draw(st.sampled_from(_paths(entry)))
        op = draw(st.sampled_from(["delete", "replace"]))
        data = json.dumps(_mutate_json(entry, path, op, draw(_json_value))).encode()
    elif mode == "payload" and "payload" in attrs:
        payload = json.loads(attrs["payload"])
        path = draw(st.sampled_from(_paths(payload)))
        op = draw(st.sampled_from(["delete", "replace"]))
        attrs["payload"] = json.dumps(_mutate_json(payload, path, op, draw(_json_value)))
    elif mode == "bytes":
        cut = draw(st.integers(0, len(data)))
        data = data[:cut] + draw(st.binary(max_size=8)) + data[cut + draw(st.integers(0, 4)) :]
    elif mode == "random":
        data = draw(st.binary(max_size=64))
        attrs = draw(st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=3))
    elif mode == "attrs":
        key = draw(st.sampled_from([*attrs, "type_url", "payload", "cluster_name", "logging.googleapis.com/timestamp"]))
        if draw(st.booleans()):
            attrs.pop(key, None)
        else:
            attrs[key] = draw(st.one_of(st.text(max_size=20), _json_leaf))
    return data, attrs


def test_parse_never_raises_on_10000_generated_messages() -> None:
    seen: dict[str, int] = {}
    calls = 0

    @settings(
        max_examples=10_000,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(msg=messages(), mid=st.text(max_size=6), pt=st.one_of(st.none(), st.datetimes()))
    def check(msg: tuple[Any, Any], mid: str, pt: datetime | None) -> None:
        nonlocal calls
        calls += 1
        out = parse(msg[0], msg[1], mid, pt)
        if isinstance(out, Rejected):
            assert out.reason in REJECT_REASONS, out
            assert not out.detail.startswith(PARSER_ERROR_PREFIX), out
            assert isinstance(out.detail, str) and out.detail
            seen[out.reason] = seen.get(out.reason, 0) + 1
        else:
            assert isinstance(out, NodeEvent), out
            assert isinstance(out.kind, Kind) and isinstance(out.target, Target)
            for t in (out.event_time, out.start, out.end):
                assert t is None or (isinstance(t, datetime) and t.utcoffset() == timedelta(0))
            assert out.cleared is out.kind.lifts
            assert out.source in ("gke_notification", "log_sink")
            assert out.identity and out.summary and out.message_id == mid
            assert all(isinstance(x, str) for x in (out.node, out.node_pool, out.cluster, out.location, out.project))
            assert out.node or out.node_pool or out.kind is Kind.INFORMATIONAL
            seen["event"] = seen.get("event", 0) + 1

    started = time.monotonic()
    check()
    elapsed = time.monotonic() - started
    print(f"\nparse property: {calls} cases in {elapsed:.1f} s; outcomes {dict(sorted(seen.items()))}")
    assert calls >= 10_000
    assert seen.get("event", 0) > 500
    assert {"not_json", "not_utf8", "bad_field", "missing_field", "unknown_type", "empty"} <= set(seen)


def test_random_byte_soup_and_mutated_samples_without_hypothesis() -> None:
    """A cheap second net with plain random: byte flips in every sample."""
    rng = random.Random(1234)
    for data, attrs in _VALID:
        for _ in range(200):
            b = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            out = parse(bytes(b), attrs, "1", None)
            assert isinstance(out, NodeEvent) or (
                out.reason in REJECT_REASONS and not out.detail.startswith(PARSER_ERROR_PREFIX)
            ), out
