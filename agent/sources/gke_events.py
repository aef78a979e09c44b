"""Turn one Pub/Sub message about GKE or GCE into a typed notice with real semantics.

Two kinds of message reach the job's subscription (FACTS section 4; each source,
its fields and what the daemon does with it are in ``docs/notices.md``):

* **GKE cluster notifications** (``source="gke_notification"``). The facts are
  in the attributes: ``project_id`` (the project *number*), ``cluster_location``,
  ``cluster_name``, ``type_url`` and ``payload`` (camelCase JSON); ``data`` is only
  a sentence for people and is ignored.
* **Cloud Logging sink entries** (``source="log_sink"``): ``data`` is a LogEntry
  in JSON carrying the project *id*. We read GCE system events
  (``resource.type="gce_instance"`` in the ``cloudaudit.googleapis.com%2Fsystem_event``
  log) and Kubernetes Events about nodes (``resource.type="k8s_node"``).

A :class:`NodeEvent` says what a notice *means*, not only what it is called:

* :class:`Kind`: ``imminent`` (the VM is being stopped now, e.g. preempted),
  ``scheduled`` (a window with a start and perhaps an end, not begun yet),
  ``in_progress`` (the disruption is under way: an upgrade recreating the pool,
  an ongoing maintenance window, a node being drained), ``completed`` (over: lift
  what it started), ``cancelled`` (it will not happen) and ``informational``
  (nothing happens to any node: end-of-support notices, control-plane upgrades,
  security bulletins, available upgrades).
* :class:`Target`: a ``node``, a ``node_pool`` (a TPU slice) or the ``cluster``.
* ``start`` / ``end``: the window, when the source names one. GKE's
  ``operationStartTime`` / ``startTime`` is when an operation *began* (already
  past on arrival): it is ``event_time``, never a deadline.
* ``key``: which notice this is for rescheduling: a later notice with the same key
  (the same node's maintenance, the same upgrade operation) supersedes it.

:func:`parse` is pure and total: no I/O, no clock, and every input, however
broken, gives a :class:`NodeEvent` or a :class:`Rejected` whose ``reason`` is one of
:data:`REJECT_REASONS` (a metric label). It never raises.
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


class Kind(enum.StrEnum):
    """What a notice means for the node(s) it names."""

    IMMINENT = "imminent"
    SCHEDULED = "scheduled"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    INFORMATIONAL = "informational"

    @property
    def lifts(self) -> bool:
        """True when the notice ends an earlier one (its drain is lifted)."""
        return self in (Kind.COMPLETED, Kind.CANCELLED)


class Target(enum.StrEnum):
    NODE = "node"
    NODE_POOL = "node_pool"
    CLUSTER = "cluster"


Source = Literal["gke_notification", "log_sink"]


@dataclass(frozen=True)
class NodeEvent:
    """A notice about one node, one node pool, or the cluster.

    ``what`` names the source's own type (``compute.instances.upcomingMaintenance``,
    ``UpgradeInfoEvent/DISRUPTION_EVENT``): a metric label and a log field.
    ``identity`` names the underlying event, not the Pub/Sub message: the same
    LogEntry published twice, or redelivered, has the same identity, so the
    intake can drop the copies. Times are timezone-aware UTC or ``None``.
    """

    kind: Kind
    target: Target
    what: str
    node: str
    node_pool: str
    cluster: str
    location: str
    project: str
    event_time: datetime | None
    start: datetime | None
    """When the disruption begins, if the source says (a window's start, a forced eviction)."""
    end: datetime | None
    """When the window closes, if the source says."""
    key: str
    source: Source
    identity: str
    summary: str
    maintenance_type: str = ""
    """GCE ``type``: SCHEDULED or UNSCHEDULED (empty when not given)."""
    can_reschedule: bool | None = None
    message_id: str = ""
    received_at: float | None = None
    """Wall-clock time this subscriber received the message (set by the Pub/Sub intake; None elsewhere)."""
    delivery_seconds: float | None = None
    """``received_at`` less the message's Pub/Sub ``publish_time`` (the service's clock): how long Pub/Sub
    took to deliver it. None where either is unknown."""

    @property
    def cleared(self) -> bool:
        return self.kind.lifts


@dataclass(frozen=True)
class Rejected:
    """A message that carries no node event for us, and why (``reason`` is a metric label)."""

    reason: str
    detail: str


REJECT_REASONS: Final = frozenset(
    {
        "not_json",  # data (or a GKE payload attribute) is not JSON
        "not_utf8",  # data is not UTF-8
        "unknown_type",  # a message type or log we do not read (other logs, other message types)
        "unknown_method",  # a GCE method or Kubernetes Event reason we do not read
        "missing_field",  # a field we need is absent
        "bad_field",  # a field has the wrong type or an unreadable value
        "unsupported_resource",  # a monitored resource we do not read
        "empty",  # nothing to read
    }
)

PARSER_ERROR_PREFIX: Final = "parser error"
"""Starts the detail of a ``bad_field`` produced by the last-resort guard in :func:`parse`.

Seeing it means the parser has a bug; the tests assert it never appears."""

MAINTENANCE_COMPLETED_TEXT: Final = "Maintenance window has completed"
"""What ``protoPayload.status.message`` of an upcomingMaintenance entry says once the window is over
(the same test as NVIDIA NVSentinel's csp-health-monitor ``gcp_normalizer.go``)."""

GCE_METHODS: Final[Mapping[str, Kind | None]] = MappingProxyType(
    {
        # Spot / preemptible VM stopped: about 30 s before the VM is gone.
        "compute.instances.preempted": Kind.IMMINENT,
        # The VM is being stopped for host maintenance (TPU VMs cannot live-migrate).
        "compute.instances.terminateOnHostMaintenance": Kind.IMMINENT,
        # The host failed; the VM is restarted elsewhere. The loss itself is learnt
        # from the worker's stream and the trainer, not from this entry.
        "compute.instances.hostError": Kind.IN_PROGRESS,
        "compute.instances.guestTerminate": Kind.IN_PROGRESS,
        # The VM is running again after a host error.
        "compute.instances.automaticRestart": Kind.COMPLETED,
        # A live migration keeps the VM running: nothing to drain.
        "compute.instances.migrateOnHostMaintenance": Kind.INFORMATIONAL,
        # Read from protoPayload.metadata (maintenanceStatus, window, completion text).
        "compute.instances.upcomingMaintenance": None,
        "compute.instances.upcomingInfraMaintenance": None,
    }
)
"""GCE system-event methods: their meaning, or ``None`` where the entry's metadata decides."""

DEFAULT_NOTICE: Final[Mapping[str, timedelta]] = MappingProxyType(
    {
        "compute.instances.preempted": timedelta(seconds=30),
        "compute.instances.terminateOnHostMaintenance": timedelta(seconds=60),
    }
)
"""How long after ``event_time`` an imminent VM stop completes (Spot: 30 s; host maintenance: 60 s)."""

K8S_REASONS: Final[Mapping[str, Kind]] = MappingProxyType(
    {
        # Unverified reason strings (FACTS section 4): kept as a plug-in point.
        "MaintenanceWindowScheduled": Kind.SCHEDULED,
        "MaintenanceWindowStarted": Kind.IN_PROGRESS,
        "MaintenanceWindowCleared": Kind.COMPLETED,
        # node-controller: the node's VM no longer exists.
        "DeletingNode": Kind.IN_PROGRESS,
    }
)

GKE_INFORMATIONAL_TYPES: Final = frozenset({"UpgradeAvailableEvent", "SecurityBulletinEvent"})
"""GKE notification types that never disrupt a node by themselves."""

UPGRADE_INFO_STATES: Final[Mapping[str, Kind]] = MappingProxyType(
    {
        "STARTED": Kind.IN_PROGRESS,
        "SUCCEEDED": Kind.COMPLETED,
        "FAILED": Kind.COMPLETED,
        "CANCELED": Kind.COMPLETED,
    }
)
"""UpgradeInfoEvent ``state`` of a node-pool UPGRADE_LIFECYCLE event; anything else is informational."""

GCE_MAINTENANCE_STATUS: Final[Mapping[str, Kind]] = MappingProxyType(
    {
        "PENDING": Kind.SCHEDULED,
        "ONGOING": Kind.IN_PROGRESS,
        # Not in Google's documents seen so far; read in case GCE sends them.
        "COMPLETED": Kind.COMPLETED,
        "CANCELLED": Kind.CANCELLED,
        "CANCELED": Kind.CANCELLED,
    }
)

SYSTEM_EVENT_LOG_SUFFIXES: Final = (
    "cloudaudit.googleapis.com%2Fsystem_event",
    "cloudaudit.googleapis.com/system_event",
)
LOG_TIMESTAMP_ATTRIBUTE: Final = "logging.googleapis.com/timestamp"

_GKE_TYPE_URL = re.compile(r"type\.googleapis\.com/google\.container\.v1(?:beta1|alpha1)?\.([A-Za-z]+)")
_NODE_POOL_RESOURCE = re.compile(r"projects/([^/]+)/(?:locations|zones)/([^/]+)/clusters/([^/]+)/nodePools/([^/]+)")
_CLUSTER_RESOURCE = re.compile(r"projects/([^/]+)/(?:locations|zones)/([^/]+)/clusters/([^/]+)")
_INSTANCE_RESOURCE = re.compile(r"projects/([^/]+)/zones/([^/]+)/instances/([^/]+)")
_METHOD_VERSION_PREFIX = re.compile(r"(?:v1|beta|alpha)\.")
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)s")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_NODE_POOL_KEYS = ("node_pool_name", "nodepool_name", "goog-k8s-node-pool-name", "cloud.google.com/gke-nodepool")
_CLUSTER_KEYS = ("cluster_name", "goog-k8s-cluster-name")


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
        return replace(ev, message_id=message_id if isinstance(message_id, str) else "")
    except _Reject as r:
        return Rejected(r.reason, r.detail)
    except Exception as e:  # last line of defence: one odd message must never stall the stream
        return Rejected("bad_field", f"{PARSER_ERROR_PREFIX} {type(e).__name__}: {e}")


# --------------------------------------------------------------------------
# GKE cluster notifications
# --------------------------------------------------------------------------


def _gke_payload(attrs: Mapping[str, Any], type_name: str) -> dict[str, Any]:
    """The notification's ``payload`` attribute: a JSON object."""
    raw = _attr(attrs, "payload", required=True)
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise _Reject("not_json", f"payload attribute of {type_name} is not JSON: {e}") from None
    if not isinstance(payload, dict):
        raise _Reject("bad_field", f"payload of {type_name} must be a JSON object, got {type(payload).__name__}")
    return payload


def _from_gke_notification(attrs: Mapping[str, Any], publish_time: datetime | None) -> NodeEvent:
    type_url = _attr(attrs, "type_url", required=True)
    m = _GKE_TYPE_URL.fullmatch(type_url)
    if m is None:
        raise _Reject("unknown_type", f"type_url {type_url!r} is not a GKE cluster notification type")
    type_name = m.group(1)
    payload = _gke_payload(attrs, type_name)
    cluster = _attr(attrs, "cluster_name")
    location = _attr(attrs, "cluster_location")
    project = _attr(attrs, "project_id")
    if type_name in GKE_INFORMATIONAL_TYPES:
        return _gke_info(type_name, type_name, payload, cluster, location, project, publish_time, type_url)
    if type_name not in ("UpgradeEvent", "UpgradeInfoEvent"):
        raise _Reject(
            "unknown_type",
            f"GKE notification {type_name} is not one of UpgradeEvent, UpgradeInfoEvent, "
            f"{', '.join(sorted(GKE_INFORMATIONAL_TYPES))}",
        )
    resource_type = _field(payload, "resourceType", "payload")
    resource = _field(payload, "resource", "payload")
    operation = _field(payload, "operation", "payload")
    started = _time_field(payload, "operationStartTime" if type_name == "UpgradeEvent" else "startTime", "payload")
    event_time = started or publish_time
    event_type = _field(payload, "eventType", "payload") if type_name == "UpgradeInfoEvent" else ""
    what = f"{type_name}/{event_type}" if event_type else type_name

    if event_type == "DISRUPTION_EVENT":
        return _gke_disruption(payload, what, cluster, location, project, event_time, type_url, resource, operation)
    if resource_type != "NODE_POOL":
        # Control-plane upgrades, end-of-support and COS notices touch no node.
        return _gke_info(type_name, what, payload, cluster, location, project, event_time, type_url)
    rm = _NODE_POOL_RESOURCE.fullmatch(resource)
    if rm is None:
        raise _Reject(
            "bad_field", f"payload.resource {resource!r} is not projects/P/locations/L/clusters/C/nodePools/NP"
        )
    r_project, r_location, r_cluster, node_pool = rm.groups()
    if cluster and cluster != r_cluster:
        raise _Reject("bad_field", f"cluster_name attribute {cluster!r} does not match payload.resource {resource!r}")
    current = _field(payload, "currentVersion", "payload")
    target_v = _field(payload, "targetVersion", "payload")
    versions = f" from {current or '?'} to {target_v or '?'}" if (current or target_v) else ""
    if type_name == "UpgradeEvent":
        kind = Kind.IN_PROGRESS
        state = "STARTED"
        how = "is being upgraded (its nodes are recreated)"
    else:
        state = _field(payload, "state", "payload")
        if event_type not in ("", "EVENT_TYPE_UNSPECIFIED", "UPGRADE_LIFECYCLE"):
            return _gke_info(type_name, what, payload, cluster, location, project, event_time, type_url)
        kind = UPGRADE_INFO_STATES.get(state, Kind.INFORMATIONAL)
        how = f"upgrade {state.lower() or 'state unspecified'}"
    parts = [type_url, resource, operation, state]
    if not operation:
        parts += [target_v, _iso(started)]
    summary = f"Node pool {node_pool} of cluster {r_cluster} ({location or r_location}) {how}{versions}"
    summary += f", operation {operation}." if operation else "."
    return NodeEvent(
        kind=kind,
        target=Target.NODE_POOL,
        what=what,
        node="",
        node_pool=node_pool,
        cluster=cluster or r_cluster,
        location=location or r_location,
        project=project or r_project,
        event_time=event_time,
        start=None,
        end=_time_field(payload, "endTime", "payload") if type_name == "UpgradeInfoEvent" else None,
        key=f"upgrade:{node_pool}:{operation}",
        source="gke_notification",
        identity="gke:" + "|".join(parts),
        summary=summary,
    )


def _gke_disruption(
    payload: dict[str, Any],
    what: str,
    cluster: str,
    location: str,
    project: str,
    event_time: datetime | None,
    type_url: str,
    resource: str,
    operation: str,
) -> NodeEvent:
    """A node whose drain is blocked by a PodDisruptionBudget: that one node is going."""
    dis = _obj(payload, "disruptionEvent", "payload")
    node = _name(_field(dis, "pdbBlockedNode", "payload.disruptionEvent", required=True), "pdbBlockedNode")
    dtype = _field(dis, "disruptionType", "payload.disruptionEvent")
    timeout = _duration(dis, "pdbViolationTimeout", "payload.disruptionEvent")
    forced = _plus(event_time, timeout) if timeout is not None else None
    rm = _NODE_POOL_RESOURCE.fullmatch(resource)
    node_pool = rm.group(4) if rm else ""
    when = f"; pods are evicted regardless at {_iso(forced)}" if forced else ""
    return NodeEvent(
        kind=Kind.IN_PROGRESS,
        target=Target.NODE,
        what=what,
        node=node,
        node_pool=node_pool,
        cluster=cluster,
        location=location,
        project=project,
        event_time=event_time,
        start=None,
        end=forced,
        key=f"disruption:{node}",
        source="gke_notification",
        identity="gke:" + "|".join([type_url, resource, operation, node, dtype, _iso(event_time)]),
        summary=f"Node {node} is being drained by GKE ({dtype or 'disruption'}), blocked by a PodDisruptionBudget{when}.",
    )


def _gke_info(
    type_name: str,
    what: str,
    payload: dict[str, Any],
    cluster: str,
    location: str,
    project: str,
    event_time: datetime | None,
    type_url: str,
) -> NodeEvent:
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    desc = payload.get("description") or payload.get("briefDescription") or ""
    desc = f": {desc[:160]}" if isinstance(desc, str) and desc else ""
    return NodeEvent(
        kind=Kind.INFORMATIONAL,
        target=Target.CLUSTER,
        what=what,
        node="",
        node_pool="",
        cluster=cluster,
        location=location,
        project=project,
        event_time=event_time,
        start=None,
        end=None,
        key=f"info:{what}",
        source="gke_notification",
        identity=f"gke:{type_url}|{digest}",
        summary=f"GKE {what} for cluster {cluster or '?'} (informational, no node is disrupted){desc}.",
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
    raw_method = _field(proto, "methodName", "protoPayload", required=True)
    method = _METHOD_VERSION_PREFIX.sub("", raw_method, count=1)
    if method not in GCE_METHODS:
        raise _Reject("unknown_method", f"protoPayload.methodName {raw_method!r} is not one of {sorted(GCE_METHODS)}")
    resource_name = _field(proto, "resourceName", "protoPayload", required=True)
    m = _INSTANCE_RESOURCE.fullmatch(resource_name)
    if m is None:
        raise _Reject("bad_field", f"protoPayload.resourceName {resource_name!r} is not projects/P/zones/Z/instances/I")
    r_project, r_zone, instance = m.groups()
    node = _name(instance, "protoPayload.resourceName instance")
    project = _field(labels, "project_id", "resource.labels") or r_project
    zone = _field(labels, "zone", "resource.labels") or r_zone
    status = proto.get("status")
    status_msg = status.get("message") if isinstance(status, dict) else None
    status_msg = status_msg if isinstance(status_msg, str) else ""
    short = method.rsplit(".", 1)[-1]
    fixed = GCE_METHODS[method]
    if fixed is None:  # upcomingMaintenance / upcomingInfraMaintenance
        kind, start, end, mtype, can_reschedule = _upcoming_maintenance(proto, status_msg, event_time)
        key = f"maintenance:{node}"
    else:
        kind, end, mtype, can_reschedule = fixed, None, "", None
        notice = DEFAULT_NOTICE.get(method)
        start = _plus(event_time, notice) if notice is not None else None
        key = f"vm:{node}"
    said = f' ("{status_msg[:160]}")' if status_msg else ""
    window = ""
    if start is not None and kind is Kind.SCHEDULED:
        window = f"; window {_iso(start)} to {_iso(end) or '?'}"
    summary = f"GCE {short} on node {node} in {zone}: {kind}{window}{said}."
    return NodeEvent(
        kind=kind,
        target=Target.NODE,
        what=method,
        node=node,
        node_pool=_first_label(_NODE_POOL_KEYS, labels, entry_labels),
        cluster=_first_label(_CLUSTER_KEYS, labels, entry_labels),
        location=zone,
        project=project,
        event_time=event_time,
        start=start,
        end=end,
        key=key,
        source="log_sink",
        identity=identity,
        summary=summary,
        maintenance_type=mtype,
        can_reschedule=can_reschedule,
    )


def _upcoming_maintenance(
    proto: dict[str, Any], status_msg: str, event_time: datetime | None
) -> tuple[Kind, datetime | None, datetime | None, str, bool | None]:
    """The kind, window, maintenance type and canReschedule of an upcoming-maintenance entry."""
    md = _obj(proto, "metadata", "protoPayload", required=False)
    nested = md.get("upcomingMaintenance")
    if isinstance(nested, dict):  # the Compute API's UpcomingMaintenance object, if a sink nests it
        md = nested
    maint_status = _field(md, "maintenanceStatus", "protoPayload.metadata")
    mtype = _field(md, "type", "protoPayload.metadata")
    start = _time_field(md, "windowStartTime", "protoPayload.metadata")
    end = _time_field(md, "windowEndTime", "protoPayload.metadata")
    cr = md.get("canReschedule")
    can_reschedule = cr if isinstance(cr, bool) else None
    if MAINTENANCE_COMPLETED_TEXT.lower() in status_msg.lower():
        kind = Kind.COMPLETED
    elif maint_status:
        kind = GCE_MAINTENANCE_STATUS.get(maint_status.upper(), Kind.SCHEDULED)
    else:
        kind = Kind.SCHEDULED
    if kind is Kind.SCHEDULED and start is None:
        # Pending with no window: all we know is that it is coming; treat it like the
        # metadata server's notice (about 60 s).
        kind = Kind.IMMINENT
        start = _plus(event_time, timedelta(seconds=60))
    return kind, start, end, mtype, can_reschedule


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
    start = None
    if kind is Kind.SCHEDULED:
        found = _RFC3339.search(message)
        start = _rfc3339(found.group(0)) if found else None
        if start is None:
            kind = Kind.IMMINENT
            start = _plus(event_time, timedelta(seconds=60))
    summary = f"Kubernetes {reason} on node {node}: {kind}"
    summary += f' ("{message[:160]}")' if message else ""
    return NodeEvent(
        kind=kind,
        target=Target.NODE,
        what=f"k8s/{reason}",
        node=node,
        node_pool=_first_label(_NODE_POOL_KEYS, labels, entry_labels),
        cluster=_field(labels, "cluster_name", "resource.labels") or _first_label(_CLUSTER_KEYS, {}, entry_labels),
        location=_field(labels, "location", "resource.labels"),
        project=_field(labels, "project_id", "resource.labels"),
        event_time=event_time,
        start=start,
        end=None,
        key=f"maintenance:{node}" if reason.startswith("Maintenance") else f"vm:{node}",
        source="log_sink",
        identity=identity,
        summary=summary + ".",
    )


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


def _duration(obj: dict[str, Any], key: str, where: str) -> timedelta | None:
    """A protobuf Duration in JSON ("3600s", "1.5s"), else None; a malformed one is a bad_field."""
    s = _field(obj, key, where)
    if not s:
        return None
    m = _DURATION.fullmatch(s.strip())
    if m is None:
        raise _Reject("bad_field", f"{where}.{key} {_short(s)} is not a protobuf Duration like '3600s'")
    try:
        return timedelta(seconds=float(m.group(1)))
    except OverflowError:
        raise _Reject("bad_field", f"{where}.{key} {_short(s)} is too large") from None


def _plus(t: datetime | None, d: timedelta) -> datetime | None:
    if t is None:
        return None
    try:
        return t + d
    except OverflowError:
        raise _Reject("bad_field", f"time {_iso(t)} + {d} is past year 9999") from None
