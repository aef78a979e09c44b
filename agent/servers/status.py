"""The status a sidecar reports: one ``admin_pb2.Status``, for gRPC and for HTTP alike.

A slice is, in this order of precedence:

* ``draining``: a notice or an operator excludes it while its hosts are still up;
* ``down``: a host is missing or unhealthy, or the trainer reported it lost;
* ``active``: training runs on it (or, while held, last ran on it);
* ``up``: ready but not in use (waiting to be grown back onto).
"""

from __future__ import annotations

import time
from typing import Any

from google.protobuf import descriptor, json_format

from agent.core.model import Phase, State
from agent.servers.contract import CoordinatorView, WorkerView
from agent.servers.feed import Feed, Record
from protos.elastic_sidecar.v1 import admin_pb2


def slice_state(s: State, i: int) -> tuple[str, str]:
    """(state, detail) of slice ``i``; see the module docstring."""
    hosts = [s.hosts.get((i, h)) for h in range(s.policy.hosts_per_slice)]
    missing = [h for h, r in enumerate(hosts) if r is None]
    sick = [h for h, r in enumerate(hosts) if r is not None and not r.healthy]
    drain = s.drains.get(i)
    if drain is not None and not missing and not sick and not s.slice_up(i):
        return "draining", f"{drain.kind} from {drain.source}: {drain.reason}"
    if not s.slice_up(i):
        parts = []
        if missing:
            parts.append(f"host(s) {','.join(map(str, missing))} not registered")
        if sick:
            parts.append(f"host(s) {','.join(map(str, sick))} unhealthy")
        if not parts and (i in s.slice_errors or i in s.trainer_errors):
            parts.append("the trainer reported it lost; " + _replacement(s, i, hosts))
        if not parts and drain is not None:
            parts.append(f"drained ({drain.kind}); " + _replacement(s, i, hosts))
        return "down", "; ".join(parts)
    if i in s.active:
        return "active", ""
    return "up", ""


def _replacement(s: State, i: int, hosts: list[Any]) -> str:
    """Where the repair of slice ``i`` (every host registered and healthy) stands, by State.slice_up's rule:
    a slice error or a drain is repaired by one host registered after it, a trainer's error by all, each
    once settled (settle_seconds)."""
    drain = s.drains.get(i)
    marks = [(s.slice_errors.get(i), False), (getattr(drain, "since", None), False), (s.trainer_errors.get(i), True)]
    unreplaced: set[int] = set()
    settling = False
    for mark, whole in marks:
        if mark is None:
            continue
        after = [h for h, r in enumerate(hosts) if r.registered_at > mark]
        if whole and len(after) < len(hosts):
            unreplaced |= {h for h in range(len(hosts)) if h not in after}
        elif not after:
            unreplaced |= set(range(len(hosts)))
        elif not (all if whole else any)(hosts[h].settled for h in after):
            settling = True
    if unreplaced == set(range(len(hosts))):
        return "waiting for a replacement"
    if unreplaced:
        return f"waiting for host(s) {','.join(map(str, sorted(unreplaced)))} to be replaced"
    if settling:
        return f"its replacement registered; settling ({s.policy.settle_seconds:g} s healthy before use)"
    return "its replacement is up; waiting for the next decision"


def coordinator_status(c: CoordinatorView) -> admin_pb2.Status:
    s = c.state
    p = s.policy
    to_unix = time.time() - time.monotonic()
    slices = []
    for i in range(p.num_slices):
        hosts = []
        for h in range(p.hosts_per_slice):
            r = s.hosts.get((i, h))
            hosts.append(
                admin_pb2.HostStatus(
                    host=h,
                    registered=r is not None,
                    healthy=r is not None and r.healthy,
                    node=r.node if r else "",
                    node_pool=r.node_pool if r else "",
                    incarnation=r.incarnation if r else "",
                    sidecar_away=r is not None and r.away_since is not None,
                )
            )
        state, detail = slice_state(s, i)
        slices.append(admin_pb2.SliceStatus(slice=i, state=state, hosts=hosts, detail=detail))
    notices = [
        admin_pb2.PendingNotice(
            slice=i,
            node=d.node,
            kind=d.kind,
            source=d.source,
            deadline_unix=0.0 if d.deadline is None else d.deadline + to_unix,
            reason=d.reason,
        )
        for i, d in sorted(s.drains.items())
        if not s.slice_up(i)  # a replacement host lifted it
    ]
    notices += [
        admin_pb2.PendingNotice(
            slice=i,
            node=d.node,
            kind=f"{d.kind} (planned)",
            source=d.source,
            deadline_unix=0.0 if d.starts_at is None else d.starts_at + to_unix,
            reason=f"drain begins in {max(0.0, d.since - time.monotonic()):.0f} s: {d.reason}",
        )
        for i, d in sorted(s.planned.items())
    ]
    return admin_pb2.Status(
        role="coordinator",
        job=c.cfg.job,
        generation=s.generation,
        phase=str(s.phase),
        slices=slices,
        active_slices=sorted(s.active),
        inactive_slices=sorted(p.all_slices - s.active),
        last_step=s.trainer.last_step,
        last_committed_step=s.trainer.committed_step,
        pending_notices=notices,
        retries_used=s.retries_used,
        elastic_min_slice_count=p.elastic_min_slice_count,
        elastic_timeout_seconds=p.elastic_timeout_seconds,
        elastic_max_retries=p.elastic_max_retries,
        trainer_attached=s.trainer.attached,
        operator_hold=s.operator_hold,
        last_reason=c.last_reason,
        epoch=c.epoch,
        fenced_by_epoch=c.fenced_by,
        state_durable=c.durable,
        state_problem=c.durability_problem or c.state_file_problem,
        trainer_processes=p.trainer_processes,
        trainer_processes_attached=sorted(c.trainer_conns),
        **straggler_fields(getattr(c, "stragglers", None)),
    )


def coordinator_readiness(c: CoordinatorView) -> dict[str, bool]:
    """What /readyz checks. Worker sidecars are not waited for: this pod starts first."""
    # Not the Pub/Sub intake: notices are an optimisation, and a subscription or
    # permission mistake must not keep the job from starting (it shows in /status).
    checks = {
        "grpc": c.serving,
        "not_fenced": not c.fenced_by,
        "state_durable": c.durable,
        "deciding": not c.decisions_wedged,
    }
    if c.state.phase in (Phase.RUNNING, Phase.HOLDING, Phase.WAITING):
        checks["trainer"] = c.state.trainer.attached
    return checks


def readiness_reasons(c: CoordinatorView) -> dict[str, str]:
    """Why a failing readiness check fails (/readyz shows it beside the check)."""
    return {
        "not_fenced": f"a newer coordinator (epoch {c.fenced_by}) took over" if c.fenced_by else "",
        "state_durable": c.durability_problem,
        "deciding": "the decision loop is wedged: events wait and nothing was decided" if c.decisions_wedged else "",
    }


def straggler_fields(collector: Any) -> dict[str, Any]:
    """The straggler detector's part of the coordinator's Status (:mod:`agent.stragglers.collector`)."""
    if collector is None:
        return {}
    st = collector.status()
    slices = [
        admin_pb2.StragglerSlice(
            slice=x["slice"],
            status=x["status"],
            lateness=x["lateness"],
            hits=x["hits"],
            counted=x["counted"],
            reason=x["reason"],
        )
        for x in st["slices"]
    ]
    verdicts = []
    for v in st["verdicts"]:
        msg = admin_pb2.StragglerVerdict(
            time_unix=v["time"],
            slice=v["slice"],
            scope=v["scope"],
            action=v["action"],
            reason=v["reason"],
            outcome=v["outcome"],
        )
        for name, field_name in (("slowdown", "slowdown"), ("lateness", "lateness"), ("since", "since_unix")):
            if v[name] is not None:
                setattr(msg, field_name, v[name])
        verdicts.append(msg)
    return {"straggler_detect": collector.enabled, "straggler_slices": slices, "straggler_verdicts": verdicts}


def worker_status(w: WorkerView) -> admin_pb2.Status:
    cfg = w.cfg
    registered = w.registered.is_set()
    if not w.healthy:
        phase = "local worker unhealthy"
    elif registered:
        phase = "registered"
    else:
        phase = "connecting"
    host = admin_pb2.HostStatus(
        host=cfg.host,
        registered=registered,
        healthy=w.healthy,
        node=cfg.node,
        node_pool=w.node_pool,
        incarnation=w.incarnation,
    )
    notices = [
        admin_pb2.PendingNotice(
            slice=cfg.slice,
            node=cfg.node,
            kind=r.detail,
            source="metadata",
            deadline_unix=r.deadline_unix,
            reason=f"metadata server: {r.detail}",
        )
        for _, r in sorted(w.notices.items())
        if r.deadline_unix
    ]
    return admin_pb2.Status(
        role="worker",
        job=cfg.job,
        generation=w.generation,
        phase=phase,
        slices=[
            admin_pb2.SliceStatus(
                slice=cfg.slice,
                state="up" if registered and w.healthy else "down",
                hosts=[host],
                detail=cfg.health_target or "",
            )
        ],
        pending_notices=notices,
        last_reason=w.last_reason,
        slice=cfg.slice,
        host=cfg.host,
        coordinator_connected=registered,
    )


def _action_text(a: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={v}" for k, v in a.items() if k not in ("type", "reason"))
    return f"{a.get('type', '?')}({args})"


def decision_event(rec: Record) -> admin_pb2.DecisionEvent:
    """A feed record as the admin API's DecisionEvent."""
    return admin_pb2.DecisionEvent(
        time_unix=float(rec.get("time", 0.0)),
        trigger=str(rec.get("trigger", "")),
        reason=str(rec.get("reason", "")),
        phase=str(rec.get("phase", "")),
        generation=int(rec.get("generation", 0)),
        active_slices=list(rec.get("active_slices", [])),
        actions=[_action_text(a) if isinstance(a, dict) else str(a) for a in rec.get("actions", [])],
        phases={str(k): float(v) for k, v in (rec.get("phases") or {}).items()},
    )


WORKER_FIELDS = ("slice", "host", "coordinator_connected")
"""Status fields a worker sidecar fills about itself (admin.proto): a coordinator leaves them out."""
STRAGGLER_FIELDS = ("straggler_detect", "straggler_slices", "straggler_verdicts")
"""Status fields only the coordinator fills (its straggler detector): a worker leaves them out."""


def status_dict(status: admin_pb2.Status) -> dict[str, Any]:
    """A Status as JSON-ready data, without the worker's own fields when a coordinator answers
    (proto3 would show them as zeros: slice 0, host 0, coordinator not connected)."""
    doc = to_dict(status)
    for name in WORKER_FIELDS if status.role == "coordinator" else STRAGGLER_FIELDS:
        doc.pop(name, None)
    return doc


def status_document(status: admin_pb2.Status, feed: Feed, recent: int = 30) -> dict[str, Any]:
    """``/status``: the GetStatus fields plus the newest ``recent`` decisions (oldest first)."""
    doc = status_dict(status)
    doc["recent_decisions"] = [to_dict(decision_event(r)) for r in list(feed.recent)[-recent:]]
    return doc


def to_dict(msg: Any) -> dict[str, Any]:
    """A message as JSON-ready data: proto field names, zero values included, 64-bit integers as numbers.

    (Canonical proto3 JSON writes int64 as strings; scripts comparing
    ``.generation > 2`` should not have to know that.)
    """
    d = json_format.MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    _ints(msg.DESCRIPTOR, d)
    return d


_INT64 = {
    descriptor.FieldDescriptor.TYPE_INT64,
    descriptor.FieldDescriptor.TYPE_UINT64,
    descriptor.FieldDescriptor.TYPE_SINT64,
    descriptor.FieldDescriptor.TYPE_FIXED64,
    descriptor.FieldDescriptor.TYPE_SFIXED64,
}


def _ints(desc: descriptor.Descriptor, d: dict[str, Any]) -> None:
    for f in desc.fields:
        if f.name not in d:
            continue
        v = d[f.name]
        if f.type in _INT64:
            d[f.name] = [int(x) for x in v] if isinstance(v, list) else int(v)
        elif f.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
            for item in v if isinstance(v, list) else [v]:
                if isinstance(item, dict):
                    _ints(f.message_type, item)
