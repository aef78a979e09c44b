"""Sample notices for the demo and the tests, in the formats GKE and Cloud Logging publish.

Each builder returns ``(data, attributes)`` exactly as a subscriber receives
them, so the demo and the tests can publish real-format messages to the
emulator and feed :func:`agent.sources.gke_events.parse` the same bytes.
Where each shape comes from:

* GKE cluster notifications: the attributes and payload of "Cluster
  notifications" (cloud.google.com/kubernetes-engine/docs/concepts/cluster-notifications)
  and the GKE REST reference for the payload types (``UpgradeEvent``,
  ``UpgradeInfoEvent`` with ``EventType``, ``State`` and ``DisruptionEvent``,
  ``UpgradeAvailableEvent``, ``SecurityBulletinEvent``).
* GCE system events: the LogEntry / AuditLog JSON of Cloud Logging (Cloud Audit
  Logs "System Event audit logs" for Compute Engine); the maintenance fields in
  ``protoPayload.metadata`` (``maintenanceStatus``, ``type``, ``canReschedule``,
  ``windowStartTime``, ``windowEndTime``) and the completion text in
  ``protoPayload.status.message`` as NVIDIA NVSentinel's csp-health-monitor
  reads them (``pkg/event/gcp_normalizer.go``).
* Kubernetes node Events: the core/v1 Event object as GKE's ``events`` log
  carries it; the maintenance reason strings are unverified (FACTS section 4).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

DEFAULT_PROJECT = "tpu-training"
DEFAULT_PROJECT_NUMBER = "123456789012"
DEFAULT_ZONE = "us-east5-b"
DEFAULT_REGION = "us-east5"
DEFAULT_CLUSTER = "tpu-cluster"

Message = tuple[bytes, dict[str, str]]

_GCE_STATUS = {
    "preempted": "Instance was preempted.",
    "hostError": "Instance terminated by Compute Engine due to a host error.",
    "terminateOnHostMaintenance": "Instance terminated during Compute Engine maintenance.",
    "upcomingMaintenance": "Maintenance is scheduled for this instance.",
    "upcomingInfraMaintenance": "Maintenance is scheduled for this instance.",
    "migrateOnHostMaintenance": "Instance migrated during Compute Engine maintenance.",
    "automaticRestart": "Instance restarted after a Compute Engine host error.",
    "guestTerminate": "Instance terminated by guest OS shutdown.",
}

_K8S_MESSAGES = {
    "MaintenanceWindowScheduled": "Maintenance window scheduled to start at {time}",
    "MaintenanceWindowStarted": "Maintenance window started",
    "MaintenanceWindowCleared": "Maintenance window cleared",
    "DeletingNode": "Deleting node {node} because it does not exist in the cloud provider",
}
_K8S_COMPONENT = {"DeletingNode": "node-controller"}


def rfc3339(t: datetime) -> str:
    """Cloud Logging's timestamp form: UTC, 'Z', nanosecond digits."""
    t = t.astimezone(UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond:06d}000Z"


def _time(t: datetime | str | None) -> str:
    if t is None:
        return rfc3339(datetime.now(UTC))
    return t if isinstance(t, str) else rfc3339(t)


def _log_message(entry: dict[str, Any]) -> Message:
    return json.dumps(entry, separators=(",", ":")).encode(), {"logging.googleapis.com/timestamp": entry["timestamp"]}


def gce_system_event(
    method: str,
    instance: str,
    *,
    project: str = DEFAULT_PROJECT,
    zone: str = DEFAULT_ZONE,
    timestamp: datetime | str | None = None,
    insert_id: str | None = None,
    instance_id: str = "4567890123456789012",
    window_start: datetime | None = None,
    window_end: datetime | None = None,
    maintenance_status: str | None = None,
    maintenance_type: str = "SCHEDULED",
    can_reschedule: bool = True,
    completed: bool = False,
) -> Message:
    """A GCE system-event audit LogEntry as a Logging sink publishes it.

    ``method`` is ``"preempted"`` or ``"compute.instances.preempted"``. For the
    maintenance methods, ``window_start`` / ``window_end`` / ``maintenance_status``
    (PENDING or ONGOING) fill ``protoPayload.metadata``; ``completed`` puts GCE's
    "Maintenance window has completed" text in ``protoPayload.status.message``.
    """
    full = method if method.startswith("compute.instances.") else f"compute.instances.{method}"
    short = full.rsplit(".", 1)[-1]
    ts = _time(timestamp)
    proto: dict[str, Any] = {
        "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
        "status": {"message": _GCE_STATUS.get(short, "System event.")},
        "authenticationInfo": {"principalEmail": "system@google.com"},
        "serviceName": "compute.googleapis.com",
        "methodName": full,
        "resourceName": f"projects/{project}/zones/{zone}/instances/{instance}",
        "request": {"@type": f"type.googleapis.com/{full}"},
    }
    if window_start is not None or maintenance_status is not None:
        md: dict[str, Any] = {"type": maintenance_type, "canReschedule": can_reschedule}
        md["maintenanceStatus"] = maintenance_status or "PENDING"
        if window_start is not None:
            md["windowStartTime"] = rfc3339(window_start)
            md["windowEndTime"] = rfc3339(window_end or window_start + timedelta(hours=1))
        proto["metadata"] = md
    if completed:
        proto["status"] = {"message": "Maintenance window has completed for this instance."}
    entry = {
        "protoPayload": proto,
        "insertId": insert_id or f"-{uuid.uuid4().hex[:12]}",
        "resource": {
            "type": "gce_instance",
            "labels": {"instance_id": instance_id, "project_id": project, "zone": zone},
        },
        "timestamp": ts,
        "severity": "INFO",
        "logName": f"projects/{project}/logs/cloudaudit.googleapis.com%2Fsystem_event",
        "operation": {"id": f"systemevent-{uuid.uuid4().int % 10**13}", "producer": full, "first": True, "last": True},
        "receiveTimestamp": ts,
    }
    return _log_message(entry)


def k8s_node_event(
    reason: str,
    node: str,
    cluster: str = DEFAULT_CLUSTER,
    *,
    project: str = DEFAULT_PROJECT,
    location: str = DEFAULT_REGION,
    timestamp: datetime | str | None = None,
    insert_id: str | None = None,
    message: str | None = None,
    component: str | None = None,
    scheduled_time: datetime | None = None,
) -> Message:
    """A Kubernetes Event about a node, as GKE's ``events`` log reaches a sink.

    ``scheduled_time`` (for MaintenanceWindowScheduled) goes into the message
    text as RFC 3339 (assumed wording; the parser searches the text for a time).
    """
    ts = _time(timestamp)
    when = rfc3339(scheduled_time) if scheduled_time else ts
    text = message if message is not None else _K8S_MESSAGES.get(reason, reason).format(time=when, node=node)
    event = {
        "kind": "Event",
        "apiVersion": "v1",
        "metadata": {
            "name": f"{node}.{uuid.uuid4().hex[:16]}",
            "namespace": "default",
            "uid": str(uuid.uuid4()),
            "resourceVersion": str(uuid.uuid4().int % 10**8),
            "creationTimestamp": ts[:19] + "Z",
        },
        "involvedObject": {"kind": "Node", "name": node, "uid": node, "apiVersion": "v1"},
        "reason": reason,
        "message": text,
        "source": {"component": component or _K8S_COMPONENT.get(reason, "NodeTerminationHandler"), "host": node},
        "firstTimestamp": ts[:19] + "Z",
        "lastTimestamp": ts[:19] + "Z",
        "count": 1,
        "type": "Normal" if reason == "MaintenanceWindowCleared" else "Warning",
        "eventTime": None,
        "reportingComponent": "",
        "reportingInstance": "",
    }
    entry = {
        "insertId": insert_id or uuid.uuid4().hex[:14],
        "jsonPayload": event,
        "resource": {
            "type": "k8s_node",
            "labels": {"node_name": node, "cluster_name": cluster, "location": location, "project_id": project},
        },
        "timestamp": ts,
        "severity": "WARNING",
        "logName": f"projects/{project}/logs/events",
        "receiveTimestamp": ts,
    }
    return _log_message(entry)


def gke_notification(
    type_name: str,
    payload: dict[str, Any],
    cluster: str = DEFAULT_CLUSTER,
    *,
    project_number: str = DEFAULT_PROJECT_NUMBER,
    location: str = DEFAULT_REGION,
    data: str | None = None,
    api_version: str = "v1beta1",
) -> Message:
    """A GKE cluster notification of any type (``UpgradeEvent``, ``SecurityBulletinEvent``, ...)."""
    attrs = {
        "project_id": project_number,
        "cluster_location": location,
        "cluster_name": cluster,
        "type_url": f"type.googleapis.com/google.container.{api_version}.{type_name}",
        "payload": json.dumps(payload, separators=(",", ":")),
    }
    return (data if data is not None else f"{type_name} for cluster {cluster}.").encode(), attrs


def gke_upgrade_event(
    node_pool: str,
    cluster: str = DEFAULT_CLUSTER,
    *,
    project: str = DEFAULT_PROJECT,
    project_number: str = DEFAULT_PROJECT_NUMBER,
    location: str = DEFAULT_REGION,
    current_version: str = "1.31.5-gke.1000000",
    target_version: str = "1.31.6-gke.1020000",
    operation: str | None = None,
    start_time: datetime | str | None = None,
    info: bool = False,
    state: str = "STARTED",
    resource_type: str = "NODE_POOL",
    event_type: str = "UPGRADE_LIFECYCLE",
) -> Message:
    """A node-pool (or, with ``resource_type="MASTER"``, control-plane) upgrade notification.

    ``info=True`` builds an ``UpgradeInfoEvent`` (``startTime``, ``state``) instead
    of an ``UpgradeEvent`` (``operationStartTime``).
    """
    op = operation or f"operation-{uuid.uuid4().int % 10**13}-{uuid.uuid4().hex[:8]}"
    resource = f"projects/{project}/locations/{location}/clusters/{cluster}"
    if resource_type == "NODE_POOL":
        resource += f"/nodePools/{node_pool}"
    payload: dict[str, Any] = {
        "resourceType": resource_type,
        "operation": op,
        "currentVersion": current_version,
        "targetVersion": target_version,
        "resource": resource,
    }
    if info:
        payload |= {"startTime": _time(start_time), "state": state, "eventType": event_type}
        name = "UpgradeInfoEvent"
        data = f"Upgrade of node pool {node_pool} to {target_version}: {state}."
    else:
        payload["operationStartTime"] = _time(start_time)
        name = "UpgradeEvent"
        data = f"{resource_type} upgrade of {node_pool or cluster} to {target_version} is starting."
    return gke_notification(name, payload, cluster, project_number=project_number, location=location, data=data)


def gke_security_bulletin(cluster: str = DEFAULT_CLUSTER, **kw: Any) -> Message:
    """A SecurityBulletinEvent: GKE sends it, we have no use for it."""
    payload = {
        "resourceTypeAffected": "RESOURCE_TYPE_NODE",
        "bulletinId": "GCP-2026-001",
        "cveIds": ["CVE-2026-0001"],
        "severity": "HIGH",
        "bulletinUri": "https://cloud.google.com/kubernetes-engine/security-bulletins#gcp-2026-001",
        "briefDescription": "A vulnerability was found.",
        "affectedSupportedMinors": ["1.31"],
        "patchedVersions": ["1.31.6-gke.1020000"],
        "suggestedUpgradeTarget": "1.31.6-gke.1020000",
        "manualStepsRequired": False,
    }
    return gke_notification("SecurityBulletinEvent", payload, cluster, **kw)


def gke_upgrade_available(cluster: str = DEFAULT_CLUSTER, **kw: Any) -> Message:
    """An UpgradeAvailableEvent: GKE sends it, we have no use for it."""
    payload = {"version": "1.31.6-gke.1020000", "resourceType": "MASTER", "releaseChannel": {"channel": "REGULAR"}}
    return gke_notification("UpgradeAvailableEvent", payload, cluster, **kw)


def gke_upgrade_info(
    event_type: str,
    cluster: str = DEFAULT_CLUSTER,
    *,
    node_pool: str = "",
    project: str = DEFAULT_PROJECT,
    project_number: str = DEFAULT_PROJECT_NUMBER,
    location: str = DEFAULT_REGION,
    description: str = "",
    start_time: datetime | str | None = None,
    disrupted_node: str = "",
    pdb_violation_timeout: str = "3600s",
    disruption_type: str = "POD_PDB_VIOLATION",
) -> Message:
    """An ``UpgradeInfoEvent`` of any ``eventType`` (GKE REST reference: UpgradeInfoEvent, EventType).

    ``END_OF_SUPPORT`` and ``COS_MILESTONE_VERSION_UPDATE`` are about the cluster;
    ``DISRUPTION_EVENT`` carries ``disruptionEvent`` (DisruptionEvent:
    ``disruptionType``, ``pdbBlockedNode``, ``pdbBlockedPod``, ``pdbViolationTimeout``).
    """
    resource = f"projects/{project}/locations/{location}/clusters/{cluster}"
    if node_pool:
        resource += f"/nodePools/{node_pool}"
    payload: dict[str, Any] = {
        "resourceType": "NODE_POOL" if node_pool else "MASTER",
        "operation": f"operation-{uuid.uuid4().int % 10**13}-{uuid.uuid4().hex[:8]}",
        "startTime": _time(start_time),
        "currentVersion": "1.31.5-gke.1000000",
        "targetVersion": "1.31.6-gke.1020000",
        "resource": resource,
        "eventType": event_type,
        "description": description or f"{event_type} for {resource}",
    }
    if event_type == "END_OF_SUPPORT":
        payload["standardSupportEndTime"] = "2027-01-15T00:00:00Z"
        payload["extendedSupportEndTime"] = "2028-01-15T00:00:00Z"
    if event_type == "DISRUPTION_EVENT":
        payload["disruptionEvent"] = {
            "disruptionType": disruption_type,
            "pdbBlockedNode": disrupted_node,
            "pdbBlockedPod": [{"namespace": "default", "name": f"{disrupted_node}-pod"}],
            "pdbViolationTimeout": pdb_violation_timeout,
        }
    data = f"{event_type} for cluster {cluster}."
    return gke_notification(
        "UpgradeInfoEvent", payload, cluster, project_number=project_number, location=location, data=data
    )
