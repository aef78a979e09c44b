"""gke_events.parse: every format GKE and the Logging sink publish, and everything that is not."""

from __future__ import annotations

import json
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.sources import gke_samples as S
from agent.sources.gke_events import (
    DEFAULT_NOTICE,
    GCE_METHODS,
    K8S_REASONS,
    PARSER_ERROR_PREFIX,
    REJECT_REASONS,
    NodeEvent,
    NoticeKind,
    Rejected,
    parse,
)

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
# GCE system events
# --------------------------------------------------------------------------

GCE_EXPECT = {
    "compute.instances.preempted": (NoticeKind.PREEMPTED, timedelta(seconds=30)),
    "compute.instances.hostError": (NoticeKind.HOST_ERROR, timedelta(0)),
    "compute.instances.terminateOnHostMaintenance": (NoticeKind.TERMINATE_ON_HOST_MAINTENANCE, timedelta(seconds=60)),
    "compute.instances.upcomingMaintenance": (NoticeKind.UPCOMING_MAINTENANCE, timedelta(seconds=60)),
    "compute.instances.automaticRestart": (NoticeKind.AUTOMATIC_RESTART, timedelta(0)),
    "compute.instances.guestTerminate": (NoticeKind.GUEST_TERMINATE, timedelta(0)),
}


def test_every_gce_method_is_covered() -> None:
    assert set(GCE_EXPECT) == set(GCE_METHODS)


@pytest.mark.parametrize("method", sorted(GCE_EXPECT))
def test_gce_system_event(method: str) -> None:
    msg = S.gce_system_event(method, "gke-tpu-np-0-a1b2-x7k2", project="proj-a", zone="us-east5-b", timestamp=T0)
    ev = _event(msg, mid="42")
    kind, notice = GCE_EXPECT[method]
    assert ev.kind is kind
    assert (ev.node, ev.node_pool, ev.cluster) == ("gke-tpu-np-0-a1b2-x7k2", "", "")
    assert (ev.location, ev.project) == ("us-east5-b", "proj-a")
    assert ev.event_time == T0
    assert ev.deadline == T0 + notice
    assert not ev.cleared
    assert ev.source == "log_sink"
    assert ev.message_id == "42"
    entry = _entry(msg)
    assert ev.identity == f"log:{entry['logName']}|{entry['insertId']}"
    assert "gke-tpu-np-0-a1b2-x7k2" in ev.summary and method.rsplit(".", 1)[-1] in ev.summary


def test_gce_upcoming_maintenance_uses_the_window_start() -> None:
    window = T0 + timedelta(hours=6)
    ev = _event(S.gce_system_event("upcomingMaintenance", "n-1", timestamp=T0, window_start=window))
    assert ev.deadline == window
    assert "2026-05-01T18:00:00Z" in ev.summary


def test_gce_explicit_time_anywhere_in_payload_and_unix_seconds() -> None:
    msg = S.gce_system_event("terminateOnHostMaintenance", "n-1", timestamp=T0)
    entry = _entry(msg)
    at = T0 + timedelta(minutes=3)
    entry["protoPayload"]["request"]["notBefore"] = str(int(at.timestamp()))
    assert _event(_with_entry(msg, entry)).deadline == at


def test_gce_unreadable_explicit_time_falls_back_to_default_notice() -> None:
    msg = S.gce_system_event("upcomingMaintenance", "n-1", timestamp=T0, window_start=T0)
    entry = _entry(msg)
    entry["protoPayload"]["metadata"]["upcomingMaintenance"]["windowStartTime"] = "soon"
    ev = _event(_with_entry(msg, entry))
    assert ev.deadline == T0 + timedelta(seconds=60)
    assert "windowStartTime" in ev.summary


def test_gce_node_pool_and_cluster_from_labels_when_present() -> None:
    msg = S.gce_system_event("preempted", "n-1", timestamp=T0)
    entry = _entry(msg)
    entry["labels"] = {"goog-k8s-node-pool-name": "np-3", "goog-k8s-cluster-name": "c-1"}
    ev = _event(_with_entry(msg, entry))
    assert (ev.node_pool, ev.cluster) == ("np-3", "c-1")


def test_gce_versioned_method_name() -> None:
    msg = S.gce_system_event("preempted", "n-1", timestamp=T0)
    entry = _entry(msg)
    entry["protoPayload"]["methodName"] = "v1.compute.instances.preempted"
    assert _event(_with_entry(msg, entry)).kind is NoticeKind.PREEMPTED


def test_gce_unknown_method() -> None:
    msg = S.gce_system_event("compute.instances.insert", "n-1", timestamp=T0)
    _rejected(msg, "unknown_method", mentions="compute.instances.insert")


def test_gce_entry_from_another_log() -> None:
    msg = S.gce_system_event("preempted", "n-1", timestamp=T0)
    entry = _entry(msg)
    entry["logName"] = "projects/p/logs/cloudaudit.googleapis.com%2Factivity"
    _rejected(_with_entry(msg, entry), "unknown_type", mentions="activity")


def test_event_time_falls_back_to_attribute_then_publish_time() -> None:
    msg = S.gce_system_event("hostError", "n-1", timestamp=T0)
    entry = _entry(msg)
    del entry["timestamp"]
    attr_time = T0 + timedelta(seconds=2)
    data = json.dumps(entry).encode()
    ev = parse(data, {"logging.googleapis.com/timestamp": S.rfc3339(attr_time)}, "1", PUBLISHED)
    assert isinstance(ev, NodeEvent) and ev.event_time == attr_time
    ev = parse(data, {}, "1", PUBLISHED)
    assert isinstance(ev, NodeEvent) and ev.event_time == PUBLISHED
    naive = parse(data, {}, "1", PUBLISHED.replace(tzinfo=None))
    assert isinstance(naive, NodeEvent) and naive.event_time == PUBLISHED
    ev = parse(data, {}, "1", None)
    assert isinstance(ev, NodeEvent) and ev.event_time is None and ev.deadline is None


def test_nanosecond_and_offset_timestamps() -> None:
    msg = S.gce_system_event("preempted", "n-1", timestamp="2026-05-01T14:00:00.123456789+02:00")
    assert _event(msg).event_time == T0 + timedelta(microseconds=123456)


def test_identity_is_stable_across_publishes_and_distinct_across_entries() -> None:
    a = S.gce_system_event("preempted", "n-1", timestamp=T0, insert_id="abc")
    b = S.gce_system_event("preempted", "n-1", timestamp=T0 + timedelta(seconds=1), insert_id="abc")
    c = S.gce_system_event("preempted", "n-1", timestamp=T0, insert_id="abd")
    ia, ib, ic = (_event(m, mid=str(i)).identity for i, m in enumerate((a, b, c)))
    assert ia == ib != ic
    entry = _entry(a)
    del entry["insertId"]
    no_id = _with_entry(a, entry)
    assert _event(no_id, mid="1").identity == _event(no_id, mid="2").identity


# --------------------------------------------------------------------------
# Kubernetes node events
# --------------------------------------------------------------------------

K8S_EXPECT = {
    "MaintenanceWindowScheduled": NoticeKind.MAINTENANCE_WINDOW_SCHEDULED,
    "MaintenanceWindowStarted": NoticeKind.MAINTENANCE_WINDOW_STARTED,
    "MaintenanceWindowCleared": NoticeKind.MAINTENANCE_WINDOW_CLEARED,
    "DeletingNode": NoticeKind.NODE_DELETING,
}


def test_every_k8s_reason_is_covered() -> None:
    assert set(K8S_EXPECT) == set(K8S_REASONS)


@pytest.mark.parametrize("reason", sorted(K8S_EXPECT))
def test_k8s_node_event(reason: str) -> None:
    msg = S.k8s_node_event(
        reason, "gke-tpu-np-1-ffff-abcd", "train-c", project="proj-b", location="us-central2", timestamp=T0
    )
    ev = _event(msg)
    kind = K8S_EXPECT[reason]
    assert ev.kind is kind
    assert (ev.node, ev.cluster, ev.location, ev.project) == (
        "gke-tpu-np-1-ffff-abcd",
        "train-c",
        "us-central2",
        "proj-b",
    )
    assert ev.cleared is (kind is NoticeKind.MAINTENANCE_WINDOW_CLEARED)
    assert ev.event_time == T0
    if kind is NoticeKind.MAINTENANCE_WINDOW_SCHEDULED:
        assert ev.deadline == T0  # the sample message names the event time as the window start
    else:
        notice = DEFAULT_NOTICE[kind]
        assert ev.deadline == (None if notice is None else T0 + notice)
    assert reason in ev.summary


def test_k8s_scheduled_window_time_from_message() -> None:
    at = T0 + timedelta(minutes=10)
    ev = _event(S.k8s_node_event("MaintenanceWindowScheduled", "n-1", timestamp=T0, scheduled_time=at))
    assert ev.deadline == at


def test_k8s_scheduled_without_time_gets_default_notice() -> None:
    ev = _event(S.k8s_node_event("MaintenanceWindowScheduled", "n-1", timestamp=T0, message="Maintenance soon"))
    assert ev.deadline == T0 + timedelta(seconds=60)


def test_k8s_scheduled_time_from_node_label_style_field() -> None:
    msg = S.k8s_node_event("MaintenanceWindowScheduled", "n-1", timestamp=T0, message="scheduled")
    entry = _entry(msg)
    at = T0 + timedelta(hours=1)
    entry["jsonPayload"]["metadata"]["annotations"] = {
        "cloud.google.com/scheduled-maintenance-time": str(int(at.timestamp()))
    }
    assert _event(_with_entry(msg, entry)).deadline == at


def test_k8s_node_name_from_involved_object() -> None:
    msg = S.k8s_node_event("DeletingNode", "n-7", timestamp=T0)
    entry = _entry(msg)
    del entry["resource"]["labels"]["node_name"]
    assert _event(_with_entry(msg, entry)).node == "n-7"
    del entry["jsonPayload"]["involvedObject"]
    _rejected(_with_entry(msg, entry), "missing_field", mentions="node_name")


def test_k8s_other_reason() -> None:
    _rejected(S.k8s_node_event("NodeNotReady", "n-1", timestamp=T0), "unknown_method", mentions="NodeNotReady")


# --------------------------------------------------------------------------
# GKE cluster notifications
# --------------------------------------------------------------------------


def test_gke_node_pool_upgrade_event() -> None:
    msg = S.gke_upgrade_event(
        "tpu-np-2", "train-a", project="proj-a", location="us-east5", start_time=T0, operation="op-1"
    )
    ev = _event(msg)
    assert ev.kind is NoticeKind.NODE_POOL_UPGRADE
    assert (ev.node, ev.node_pool, ev.cluster, ev.location) == ("", "tpu-np-2", "train-a", "us-east5")
    assert ev.project == S.DEFAULT_PROJECT_NUMBER
    assert ev.event_time == T0 and ev.deadline == T0
    assert ev.source == "gke_notification"
    assert "op-1" in ev.identity and "tpu-np-2" in ev.summary
    again = _event(
        S.gke_upgrade_event(
            "tpu-np-2", "train-a", project="proj-a", location="us-east5", start_time=T0, operation="op-1"
        )
    )
    assert again.identity == ev.identity


def test_gke_node_pool_upgrade_info_event() -> None:
    started = _event(S.gke_upgrade_event("np", "c", start_time=T0, info=True, operation="op-9"))
    assert started.kind is NoticeKind.NODE_POOL_UPGRADE_INFO
    assert started.deadline == T0 and started.node_pool == "np"
    done = _event(S.gke_upgrade_event("np", "c", start_time=T0, info=True, operation="op-9", state="SUCCEEDED"))
    assert done.deadline is None
    assert done.identity != started.identity


def test_gke_v1_type_url_and_publish_time_fallback() -> None:
    data, attrs = S.gke_upgrade_event("np", "c", start_time=T0)
    attrs["type_url"] = attrs["type_url"].replace("v1beta1", "v1")
    payload = json.loads(attrs["payload"])
    del payload["operationStartTime"]
    attrs["payload"] = json.dumps(payload)
    ev = _event((data, attrs))
    assert ev.event_time == PUBLISHED


def test_gke_master_upgrade_is_rejected() -> None:
    _rejected(S.gke_upgrade_event("", "c", resource_type="MASTER"), "unsupported_resource", mentions="MASTER")


def test_gke_security_bulletin_and_upgrade_available_are_rejected() -> None:
    _rejected(S.gke_security_bulletin(), "unknown_type", mentions="SecurityBulletinEvent")
    _rejected(S.gke_upgrade_available(), "unknown_type", mentions="UpgradeAvailableEvent")


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
        ("resourceType", None, "missing_field"),
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

_VALID: list[tuple[bytes, dict[str, str]]] = (
    [
        S.gce_system_event(m, f"gke-n-{i}", timestamp=T0, window_start=T0 if i else None)
        for i, m in enumerate(GCE_METHODS)
    ]
    + [S.k8s_node_event(r, "gke-n-9", timestamp=T0, scheduled_time=T0) for r in K8S_REASONS]
    + [S.gke_upgrade_event("np-1", start_time=T0), S.gke_upgrade_event("np-1", start_time=T0, info=True)]
    + [S.gke_upgrade_event("", resource_type="MASTER"), S.gke_security_bulletin(), S.gke_upgrade_available()]
)

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
        database=None,
        derandomize=False,
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
            assert isinstance(out.kind, NoticeKind)
            for t in (out.event_time, out.deadline):
                assert t is None or (isinstance(t, datetime) and t.utcoffset() == timedelta(0))
            assert out.cleared is (out.kind is NoticeKind.MAINTENANCE_WINDOW_CLEARED)
            assert out.source in ("gke_notification", "log_sink")
            assert out.identity and out.summary and out.message_id == mid
            assert all(isinstance(x, str) for x in (out.node, out.node_pool, out.cluster, out.location, out.project))
            assert out.node or out.node_pool
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
