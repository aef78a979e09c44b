"""What the status says of a slice being repaired, and the coordinator's status as JSON."""

from __future__ import annotations

from dataclasses import replace

from agent.core.model import HostRecord, Hosts, Phase, Policy, State, initial_state
from agent.servers.status import WORKER_FIELDS, slice_state, status_dict
from protos.elastic_sidecar.v1 import admin_pb2

LOST_AT = 100.0


def _state(records: dict[int, HostRecord], *, named: bool) -> State:
    """Slice 1 of two (two hosts each), which the trainer reported lost at LOST_AT (``named``: it named
    the slice, so every host must be replaced; otherwise one replacement will do)."""
    s = initial_state(Policy(num_slices=2, hosts_per_slice=2, settle_seconds=5.0), 0.0)
    old = HostRecord("old", registered_at=1.0, settled=True)
    hosts = {(0, 0): old, (0, 1): old, **{(1, h): r for h, r in records.items()}}
    errors = {1: LOST_AT}
    return replace(
        s,
        phase=Phase.RUNNING,
        active=frozenset({0}),
        hosts=Hosts(hosts),
        slice_errors=errors,
        trainer_errors=errors if named else {},
    )


OLD = HostRecord("old", registered_at=1.0, settled=True)
NEW = HostRecord("new", registered_at=LOST_AT + 1, settled=False)
NEW_SETTLED = replace(NEW, settled=True)


def test_a_lost_slice_waits_for_a_replacement_until_one_registers() -> None:
    assert slice_state(_state({0: OLD, 1: OLD}, named=False), 1) == (
        "down",
        "the trainer reported it lost; waiting for a replacement",
    )
    state, detail = slice_state(_state({0: NEW, 1: OLD}, named=False), 1)
    assert state == "down" and "waiting for a replacement" not in detail, detail
    assert detail == "the trainer reported it lost; its replacement registered; settling (5 s healthy before use)"
    assert slice_state(_state({0: NEW_SETTLED, 1: OLD}, named=False), 1) == ("up", "")


def test_a_slice_the_trainer_named_waits_for_each_host_to_be_replaced() -> None:
    _, detail = slice_state(_state({0: NEW_SETTLED, 1: OLD}, named=True), 1)
    assert detail == "the trainer reported it lost; waiting for host(s) 1 to be replaced", detail
    _, detail = slice_state(_state({0: NEW_SETTLED, 1: NEW}, named=True), 1)
    assert detail.endswith("its replacement registered; settling (5 s healthy before use)"), detail


def test_a_coordinators_status_json_has_no_worker_fields() -> None:
    coordinator = status_dict(admin_pb2.Status(role="coordinator", job="j", phase="running"))
    assert not set(WORKER_FIELDS) & coordinator.keys(), coordinator
    assert coordinator["phase"] == "running" and "active_slices" in coordinator
    worker = status_dict(admin_pb2.Status(role="worker", job="j", slice=2, host=0))
    assert (worker["slice"], worker["host"], worker["coordinator_connected"]) == (2, 0, False)
