"""Turn one Pub/Sub message about GKE or GCE into a typed node event.

Two kinds of message reach the job's subscription (FACTS section 4):

* **GKE cluster notifications** (``source="gke_notification"``). The facts are
  in the attributes: ``project_id`` (the project *number*), ``cluster_location``,
  ``cluster_name``, ``type_url`` and ``payload`` (camelCase JSON); ``data`` is only
  a sentence for people and is ignored. Of the four types GKE sends, only a
  ``UpgradeEvent`` or ``UpgradeInfoEvent`` about a ``NODE_POOL`` concerns us: the
  upgrade of a TPU slice's node pool recreates the whole slice.
* **Cloud Logging sink entries** (``source="log_sink"``): ``data`` is a LogEntry
  in JSON. We read GCE system events (``resource.type="gce_instance"`` in the
  ``cloudaudit.googleapis.com%2Fsystem_event`` log, one per
  ``compute.instances.*`` method in :data:`GCE_METHODS`) and Kubernetes Events
  about nodes (``resource.type="k8s_node"``, one per reason in :data:`K8S_REASONS`).

:func:`parse` is pure and total: no I/O, no clock, and every input, however
broken, gives a :class:`NodeEvent` or a :class:`Rejected` whose ``reason`` is one of
:data:`REJECT_REASONS` (a metric label). It never raises.

Deadlines. ``NodeEvent.deadline`` is when the node is expected to be gone. For a
maintenance notice an explicit start time in the payload wins (the earliest of
:data:`EXPLICIT_DEADLINE_KEYS` found anywhere in the payload, or an RFC 3339
time in a Kubernetes Event's message). Where exactly GCE and GKE put that time in
these log entries is unverified, so the search is deliberately broad and an
unreadable explicit time falls back to the default instead of dropping the
notice. Otherwise ``deadline = event_time + DEFAULT_NOTICE[kind]``: 60 s for host
maintenance (the metadata server's notice), 30 s for a Spot/preemptible VM,
zero for what is already happening (host error, guest terminate, node deletion,
a started maintenance window, an upgrade in progress), and none for a cleared
window or an informational upgrade notice.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, Final, Literal


class NoticeKind(enum.StrEnum):
    """What happened (or is about to happen) to a node or node pool."""

    TERMINATE_ON_HOST_MAINTENANCE = "terminate_on_host_maintenance"
    UPCOMING_MAINTENANCE = "upcoming_maintenance"
    PREEMPTED = "preempted"
    HOST_ERROR = "host_error"
    AUTOMATIC_RESTART = "automatic_restart"
    GUEST_TERMINATE = "guest_terminate"
    MAINTENANCE_WINDOW_SCHEDULED = "maintenance_window_scheduled"
    MAINTENANCE_WINDOW_STARTED = "maintenance_window_started"
    MAINTENANCE_WINDOW_CLEARED = "maintenance_window_cleared"
    NODE_DELETING = "node_deleting"
    NODE_POOL_UPGRADE = "node_pool_upgrade"
    NODE_POOL_UPGRADE_INFO = "node_pool_upgrade_info"


Source = Literal["gke_notification", "log_sink"]


@dataclass(frozen=True)
class NodeEvent:
    """A notice about one GKE node (``node``) or a whole node pool (``node == ""``).

    ``identity`` names the underlying event, not the Pub/Sub message: the same
    LogEntry published twice, or redelivered, has the same identity, so the
    intake can drop the copies. Times are timezone-aware UTC or ``None``.
    """

    kind: NoticeKind
    node: str
    node_pool: str
    cluster: str
    location: str
    project: str
    event_time: datetime | None
    deadline: datetime | None
    cleared: bool
    source: Source
    identity: str
    summary: str
    message_id: str = ""


@dataclass(frozen=True)
class Rejected:
    """A message that carries no node event for us, and why (``reason`` is a metric label)."""

    reason: str
    detail: str


REJECT_REASONS: Final = frozenset(
    {
        "not_json",  # data (or a GKE payload attribute) is not JSON
        "not_utf8",  # data is not UTF-8
        "unknown_type",  # a message type or log we do not read (other GKE notification types, other logs)
        "unknown_method",  # a GCE method or Kubernetes Event reason we do not read
        "missing_field",  # a field we need is absent
        "bad_field",  # a field has the wrong type or an unreadable value
        "unsupported_resource",  # a resource we do not read (MASTER upgrades, other monitored resources)
        "empty",  # nothing to read
    }
)

PARSER_ERROR_PREFIX: Final = "parser error"
"""Starts the detail of a ``bad_field`` produced by the last-resort guard in :func:`parse`.

Seeing it means the parser has a bug; the tests assert it never appears."""

GCE_METHODS: Final[Mapping[str, NoticeKind]] = MappingProxyType(
    {
        "compute.instances.preempted": NoticeKind.PREEMPTED,
        "compute.instances.hostError": NoticeKind.HOST_ERROR,
        "compute.instances.terminateOnHostMaintenance": NoticeKind.TERMINATE_ON_HOST_MAINTENANCE,
        "compute.instances.upcomingMaintenance": NoticeKind.UPCOMING_MAINTENANCE,
        "compute.instances.automaticRestart": NoticeKind.AUTOMATIC_RESTART,
        "compute.instances.guestTerminate": NoticeKind.GUEST_TERMINATE,
    }
)

K8S_REASONS: Final[Mapping[str, NoticeKind]] = MappingProxyType(
    {
        "MaintenanceWindowScheduled": NoticeKind.MAINTENANCE_WINDOW_SCHEDULED,
        "MaintenanceWindowStarted": NoticeKind.MAINTENANCE_WINDOW_STARTED,
        "MaintenanceWindowCleared": NoticeKind.MAINTENANCE_WINDOW_CLEARED,
        "DeletingNode": NoticeKind.NODE_DELETING,
    }
)

GKE_NOTIFICATION_TYPES: Final[Mapping[str, NoticeKind]] = MappingProxyType(
    {"UpgradeEvent": NoticeKind.NODE_POOL_UPGRADE, "UpgradeInfoEvent": NoticeKind.NODE_POOL_UPGRADE_INFO}
)

_S = timedelta(seconds=1)
DEFAULT_NOTICE: Final[Mapping[NoticeKind, timedelta | None]] = MappingProxyType(
    {
        NoticeKind.TERMINATE_ON_HOST_MAINTENANCE: 60 * _S,
        NoticeKind.UPCOMING_MAINTENANCE: 60 * _S,
        NoticeKind.PREEMPTED: 30 * _S,
        NoticeKind.HOST_ERROR: timedelta(0),
        NoticeKind.AUTOMATIC_RESTART: timedelta(0),
        NoticeKind.GUEST_TERMINATE: timedelta(0),
        NoticeKind.MAINTENANCE_WINDOW_SCHEDULED: 60 * _S,
        NoticeKind.MAINTENANCE_WINDOW_STARTED: timedelta(0),
        NoticeKind.MAINTENANCE_WINDOW_CLEARED: None,
        NoticeKind.NODE_DELETING: timedelta(0),
        NoticeKind.NODE_POOL_UPGRADE: timedelta(0),
        NoticeKind.NODE_POOL_UPGRADE_INFO: None,
    }
)
"""How long after ``event_time`` the node is expected to go when the payload names no time.

``None``: no deadline (nothing is going away, or the notice is informational)."""

EXPLICIT_DEADLINE_KINDS: Final = frozenset(
    {
        NoticeKind.UPCOMING_MAINTENANCE,
        NoticeKind.TERMINATE_ON_HOST_MAINTENANCE,
        NoticeKind.MAINTENANCE_WINDOW_SCHEDULED,
    }
)
"""Kinds whose payload may name when the maintenance starts."""

EXPLICIT_DEADLINE_KEYS: Final = (
    "windowStartTime",  # GCE UpcomingMaintenance
    "latestWindowStartTime",
    "maintenanceScheduledStartTime",  # Unified Maintenance
    "maintenanceStartTime",
    "scheduledMaintenanceTime",
    "notBefore",
    "cloud.google.com/scheduled-maintenance-time",  # GKE node label (unix seconds)
)

SYSTEM_EVENT_LOG_SUFFIXES: Final = (
    "cloudaudit.googleapis.com%2Fsystem_event",
    "cloudaudit.googleapis.com/system_event",
)
LOG_TIMESTAMP_ATTRIBUTE: Final = "logging.googleapis.com/timestamp"

_GKE_TYPE_URL = re.compile(r"type\.googleapis\.com/google\.container\.v1(?:beta1|alpha1)?\.([A-Za-z]+)")
_NODE_POOL_RESOURCE = re.compile(r"projects/([^/]+)/(?:locations|zones)/([^/]+)/clusters/([^/]+)/nodePools/([^/]+)")
_INSTANCE_RESOURCE = re.compile(r"projects/([^/]+)/zones/([^/]+)/instances/([^/]+)")
_METHOD_VERSION_PREFIX = re.compile(r"(?:v1|beta|alpha)\.")
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_UNIX_SECONDS = re.compile(r"[0-9]{9,11}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_NODE_POOL_KEYS = ("node_pool_name", "nodepool_name", "goog-k8s-node-pool-name", "cloud.google.com/gke-nodepool")
_CLUSTER_KEYS = ("cluster_name", "goog-k8s-cluster-name")
_WALK_LIMIT = 2000


class _Reject(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def parse(
    data: bytes, attributes: Mapping[str, str], message_id: str, publish_time: datetime | None
) -> NodeEvent | Rejected:
    """Read one Pub/Sub message; see the module docstring for the formats.

    ``publish_time`` is the last fallback for ``event_time``; a naive datetime is
    taken as UTC. ``message_id`` is only carried into ``NodeEvent.message_id``.
    """
    try:
        pt = _aware(publish_time) if isinstance(publish_time, datetime) else None
        attrs = attributes if isinstance(attributes, Mapping) else {}
        if any(k in attrs for k in ("type_url", "payload", "cluster_name")):
            ev = _from_gke_notification(attrs, pt)
        else:
            ev = _from_log_entry(data, attrs, pt)
        return _with_message_id(ev, message_id)
    except _Reject as r:
        return Rejected(r.reason, r.detail)
    except Exception as e:  # last line of defence: one odd message must never stall the stream
        return Rejected("bad_field", f"{PARSER_ERROR_PREFIX} {type(e).__name__}: {e}")


def _with_message_id(ev: NodeEvent, message_id: str) -> NodeEvent:
    return replace(ev, message_id=message_id if isinstance(message_id, str) else "")


# --------------------------------------------------------------------------
# GKE cluster notifications
# --------------------------------------------------------------------------


def _from_gke_notification(attrs: Mapping[str, Any], publish_time: datetime | None) -> NodeEvent:
    type_url = _attr(attrs, "type_url", required=True)
    m = _GKE_TYPE_URL.fullmatch(type_url)
    if m is None:
        raise _Reject("unknown_type", f"type_url {type_url!r} is not a GKE cluster notification type")
    kind = GKE_NOTIFICATION_TYPES.get(m.group(1))
    if kind is None:
        raise _Reject(
            "unknown_type",
            f"GKE notification {m.group(1)} carries no node event (only UpgradeEvent and UpgradeInfoEvent do)",
        )
    raw = _attr(attrs, "payload", required=True)
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise _Reject("not_json", f"payload attribute of {m.group(1)} is not JSON: {e}") from None
    if not isinstance(payload, dict):
        raise _Reject("bad_field", f"payload of {m.group(1)} must be a JSON object, got {type(payload).__name__}")
    resource_type = _field(payload, "resourceType", "payload", required=True)
    if resource_type != "NODE_POOL":
        raise _Reject(
            "unsupported_resource", f"{m.group(1)} for resourceType {resource_type!r}: only NODE_POOL recreates nodes"
        )
    resource = _field(payload, "resource", "payload", required=True)
    rm = _NODE_POOL_RESOURCE.fullmatch(resource)
    if rm is None:
        raise _Reject(
            "bad_field", f"payload.resource {resource!r} is not projects/P/locations/L/clusters/C/nodePools/NP"
        )
    r_project, r_location, r_cluster, node_pool = rm.groups()
    cluster = _attr(attrs, "cluster_name") or r_cluster
    if cluster != r_cluster:
        raise _Reject("bad_field", f"cluster_name attribute {cluster!r} does not match payload.resource {resource!r}")
    location = _attr(attrs, "cluster_location") or r_location
    project = _attr(attrs, "project_id") or r_project
    operation = _field(payload, "operation", "payload")
    start_key = "operationStartTime" if kind is NoticeKind.NODE_POOL_UPGRADE else "startTime"
    started = _time_field(payload, start_key, "payload") or _time_field(payload, "operationStartTime", "payload")
    event_time = started or publish_time
    current = _field(payload, "currentVersion", "payload")
    target = _field(payload, "targetVersion", "payload")
    state = _field(payload, "state", "payload")
    event_type = _field(payload, "eventType", "payload")

    if kind is NoticeKind.NODE_POOL_UPGRADE:
        deadline = event_time
        what = "is being upgraded"
    else:
        # An info event is a heads-up; only one naming a start time has a deadline.
        deadline = started if state in ("", "STARTED") else None
        what = f"upgrade info ({', '.join(x for x in (event_type, state) if x) or 'no state'})"
    versions = f" from {current or '?'} to {target or '?'}" if (current or target) else ""
    parts = [type_url, resource, operation]
    if kind is NoticeKind.NODE_POOL_UPGRADE_INFO:
        parts += [state, event_type]
    if not operation:
        parts += [target, _iso(started) if started else ""]
    summary = f"Node pool {node_pool} of cluster {cluster} ({location}) {what}{versions}"
    summary += f", operation {operation}." if operation else "."
    return NodeEvent(
        kind=kind,
        node="",
        node_pool=node_pool,
        cluster=cluster,
        location=location,
        project=project,
        event_time=event_time,
        deadline=deadline,
        cleared=False,
        source="gke_notification",
        identity="gke:" + "|".join(parts),
        summary=summary,
    )


# --------------------------------------------------------------------------
# Cloud Logging sink entries
# --------------------------------------------------------------------------


def _from_log_entry(data: Any, attrs: Mapping[str, Any], publish_time: datetime | None) -> NodeEvent:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise _Reject("bad_field", f"message data must be bytes, got {type(data).__name__}")
    raw = bytes(data)
    if not raw.strip():
        raise _Reject(
            "empty", "message has no data and no type_url attribute: neither a LogEntry nor a GKE notification"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Reject("not_utf8", f"data is not UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        entry = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise _Reject("not_json", f"data is not JSON: {str(e)[:200]}") from None
    if not isinstance(entry, dict):
        raise _Reject("unknown_type", f"data is a JSON {type(entry).__name__}, not a LogEntry object")
    resource = _obj(entry, "resource", "LogEntry")
    rtype = _field(resource, "type", "resource", required=True)
    labels = _obj(resource, "labels", "resource", required=False)
    log_name = _field(entry, "logName", "LogEntry", required=True)
    event_time = (
        _time_field(entry, "timestamp", "LogEntry") or _time_attr(attrs, LOG_TIMESTAMP_ATTRIBUTE) or publish_time
    )
    insert_id = _field(entry, "insertId", "LogEntry")
    if insert_id:
        identity = f"log:{log_name}|{insert_id}"
    else:  # Logging always sets insertId; without one, the content is the identity
        identity = "sha256:" + hashlib.sha256(raw).hexdigest()
    raw_labels = entry.get("labels")
    entry_labels: dict[str, Any] = raw_labels if isinstance(raw_labels, dict) else {}
    if rtype == "gce_instance":
        return _gce_system_event(entry, log_name, labels, entry_labels, event_time, identity)
    if rtype == "k8s_node":
        return _k8s_node_event(entry, labels, entry_labels, event_time, identity)
    raise _Reject("unsupported_resource", f"resource.type {rtype!r}: only gce_instance and k8s_node are read")


def _gce_system_event(
    entry: dict[str, Any],
    log_name: str,
    labels: dict[str, Any],
    entry_labels: dict[str, Any],
    event_time: datetime | None,
    identity: str,
) -> NodeEvent:
    if not log_name.endswith(SYSTEM_EVENT_LOG_SUFFIXES):
        raise _Reject("unknown_type", f"logName {log_name!r} is not the GCE system_event audit log")
    proto = _obj(entry, "protoPayload", "LogEntry")
    method = _field(proto, "methodName", "protoPayload", required=True)
    kind = GCE_METHODS.get(_METHOD_VERSION_PREFIX.sub("", method, count=1))
    if kind is None:
        raise _Reject("unknown_method", f"protoPayload.methodName {method!r} is not one of {sorted(GCE_METHODS)}")
    resource_name = _field(proto, "resourceName", "protoPayload", required=True)
    m = _INSTANCE_RESOURCE.fullmatch(resource_name)
    if m is None:
        raise _Reject("bad_field", f"protoPayload.resourceName {resource_name!r} is not projects/P/zones/Z/instances/I")
    r_project, r_zone, instance = m.groups()
    node = _name(instance, "protoPayload.resourceName instance")
    project = _field(labels, "project_id", "resource.labels") or r_project
    zone = _field(labels, "zone", "resource.labels") or r_zone
    node_pool = _first_label(_NODE_POOL_KEYS, labels, entry_labels)
    cluster = _first_label(_CLUSTER_KEYS, labels, entry_labels)
    deadline, note = _deadline(kind, event_time, proto, "")
    status = proto.get("status")
    status_msg = status.get("message") if isinstance(status, dict) else None
    said = f' ("{status_msg[:160]}")' if isinstance(status_msg, str) and status_msg else ""
    summary = f"GCE system event {method.rsplit('.', 1)[-1]} on node {node} in {zone}{said}{_by(deadline, kind)}{note}."
    return NodeEvent(
        kind=kind,
        node=node,
        node_pool=node_pool,
        cluster=cluster,
        location=zone,
        project=project,
        event_time=event_time,
        deadline=deadline,
        cleared=False,
        source="log_sink",
        identity=identity,
        summary=summary,
    )


def _k8s_node_event(
    entry: dict[str, Any],
    labels: dict[str, Any],
    entry_labels: dict[str, Any],
    event_time: datetime | None,
    identity: str,
) -> NodeEvent:
    payload = _obj(entry, "jsonPayload", "LogEntry")
    reason = _field(payload, "reason", "jsonPayload", required=True)
    kind = K8S_REASONS.get(reason)
    if kind is None:
        raise _Reject("unknown_method", f"k8s Event reason {reason!r} is not one of {sorted(K8S_REASONS)}")
    involved = _obj(payload, "involvedObject", "jsonPayload", required=False)
    node = _field(labels, "node_name", "resource.labels") or _field(involved, "name", "jsonPayload.involvedObject")
    if not node:
        raise _Reject("missing_field", "neither resource.labels.node_name nor jsonPayload.involvedObject.name is set")
    node = _name(node, "node name")
    if event_time is None:
        event_time = _time_field(payload, "lastTimestamp", "jsonPayload") or _time_field(
            payload, "eventTime", "jsonPayload"
        )
    raw_message = payload.get("message")
    message = raw_message if isinstance(raw_message, str) else ""
    src = payload.get("source")
    component = src.get("component") if isinstance(src, dict) and isinstance(src.get("component"), str) else ""
    deadline, note = _deadline(kind, event_time, payload, message)
    summary = f"Kubernetes {reason} on node {node}"
    summary += f" from {component}" if component else ""
    summary += f': "{message[:160]}"' if message else ""
    summary += f"{_by(deadline, kind)}{note}."
    cluster = _field(labels, "cluster_name", "resource.labels")
    return NodeEvent(
        kind=kind,
        node=node,
        node_pool=_first_label(_NODE_POOL_KEYS, labels, entry_labels),
        cluster=cluster or _first_label(_CLUSTER_KEYS, {}, entry_labels),
        location=_field(labels, "location", "resource.labels"),
        project=_field(labels, "project_id", "resource.labels"),
        event_time=event_time,
        deadline=deadline,
        cleared=kind is NoticeKind.MAINTENANCE_WINDOW_CLEARED,
        source="log_sink",
        identity=identity,
        summary=summary,
    )


# --------------------------------------------------------------------------
# deadlines
# --------------------------------------------------------------------------


def _deadline(kind: NoticeKind, event_time: datetime | None, payload: Any, text: str) -> tuple[datetime | None, str]:
    """(deadline, note for the summary). See the module docstring."""
    note = ""
    if kind in EXPLICIT_DEADLINE_KINDS:
        explicit, bad = _explicit_time(payload)
        if explicit is None and text:
            m = _RFC3339.search(text)
            explicit = _rfc3339(m.group(0)) if m else None
        if explicit is not None:
            return explicit, ""
        if bad:
            note = f" (unreadable {bad} ignored)"
    notice = DEFAULT_NOTICE[kind]
    if notice is None or event_time is None:
        return None, note
    try:
        return event_time + notice, note
    except OverflowError:
        raise _Reject("bad_field", f"event time {_iso(event_time)} + {notice} is past year 9999") from None


def _explicit_time(payload: Any) -> tuple[datetime | None, str]:
    """Earliest explicit maintenance start found anywhere in ``payload``, and the first unreadable key."""
    found: list[datetime] = []
    bad = ""
    stack: list[Any] = [payload]
    seen = 0
    while stack and seen < _WALK_LIMIT:
        node = stack.pop()
        seen += 1
        if isinstance(node, dict):
            for k, v in node.items():
                if k in EXPLICIT_DEADLINE_KEYS and not isinstance(v, dict | list):
                    t = _time_value(v)
                    if t is not None:
                        found.append(t)
                    elif not bad:
                        bad = str(k)
                elif isinstance(v, dict | list):
                    stack.append(v)
        elif isinstance(node, list):
            stack.extend(x for x in node if isinstance(x, dict | list))
    return (min(found) if found else None), bad


def _by(deadline: datetime | None, kind: NoticeKind) -> str:
    if kind is NoticeKind.MAINTENANCE_WINDOW_CLEARED:
        return "; the node is no longer expected to go"
    return f"; expected gone by {_iso(deadline)}" if deadline else ""


# --------------------------------------------------------------------------
# field access: each names the bad field and what was expected
# --------------------------------------------------------------------------


def _attr(attrs: Mapping[str, Any], key: str, *, required: bool = False) -> str:
    v = attrs.get(key)
    if v is None or v == "":
        if required:
            raise _Reject("missing_field", f"attribute {key!r} is missing")
        return ""
    if not isinstance(v, str):
        raise _Reject("bad_field", f"attribute {key!r} must be a string, got {type(v).__name__}")
    return v


def _field(obj: dict[str, Any], key: str, where: str, *, required: bool = False) -> str:
    v = obj.get(key)
    if v is None or v == "":
        if required:
            raise _Reject("missing_field", f"{where}.{key} is missing")
        return ""
    if not isinstance(v, str):
        raise _Reject("bad_field", f"{where}.{key} must be a string, got {type(v).__name__} {_short(v)}")
    return v


def _obj(obj: dict[str, Any], key: str, where: str, *, required: bool = True) -> dict[str, Any]:
    v = obj.get(key)
    if v is None:
        if required:
            raise _Reject("missing_field", f"{where}.{key} is missing")
        return {}
    if not isinstance(v, dict):
        raise _Reject("bad_field", f"{where}.{key} must be an object, got {type(v).__name__} {_short(v)}")
    return v


def _time_field(obj: dict[str, Any], key: str, where: str) -> datetime | None:
    s = _field(obj, key, where)
    if not s:
        return None
    t = _rfc3339(s)
    if t is None:
        raise _Reject("bad_field", f"{where}.{key} {_short(s)} is not an RFC 3339 timestamp")
    return t


def _time_attr(attrs: Mapping[str, Any], key: str) -> datetime | None:
    s = _attr(attrs, key)
    if not s:
        return None
    t = _rfc3339(s)
    if t is None:
        raise _Reject("bad_field", f"attribute {key!r} {_short(s)} is not an RFC 3339 timestamp")
    return t


def _time_value(v: Any) -> datetime | None:
    """An RFC 3339 string or unix seconds (number or digit string), else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, str):
        if _UNIX_SECONDS.fullmatch(v):
            v = int(v)
        else:
            return _rfc3339(v)
    if isinstance(v, int | float):
        try:
            return datetime.fromtimestamp(v, UTC)
        except (OverflowError, OSError, ValueError):
            return None
    return None


def _rfc3339(s: str) -> datetime | None:
    m = _RFC3339.fullmatch(s.strip())
    if m is None:
        return None
    frac = (m.group(7) or "")[:7]  # datetime keeps microseconds; Logging sends nanoseconds
    tz = "+00:00" if m.group(8) in ("Z", "z") else m.group(8)
    try:
        return datetime.fromisoformat(
            f"{'-'.join(m.group(1, 2, 3))}T{':'.join(m.group(4, 5, 6))}{frac}{tz}"
        ).astimezone(UTC)
    except (ValueError, OverflowError):
        return None


def _aware(t: datetime) -> datetime | None:
    try:
        return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    except (ValueError, OverflowError):
        return None


def _name(v: str, what: str) -> str:
    if not _NAME.fullmatch(v):
        raise _Reject("bad_field", f"{what} {_short(v)} is not a valid node name")
    return v


def _first_label(keys: tuple[str, ...], *maps: dict[str, Any]) -> str:
    for m in maps:
        for k in keys:
            v = m.get(k)
            if isinstance(v, str) and v:
                return v
    return ""


def _iso(t: datetime | None) -> str:
    return t.isoformat().replace("+00:00", "Z") if t else ""


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."
