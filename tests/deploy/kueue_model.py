"""How Kueue would admit a JobSet on a cluster that xpk set up: a small model for the tests.

What it models, from the sources (no API server here):

* A pod's requests, as Kubernetes computes them (``resourcehelper.PodRequests``): a container's
  limit stands in for a missing request (API defaulting), regular containers and native
  sidecars (init containers with ``restartPolicy: Always``) add up, and a plain init container
  counts only where it is larger.
* xpk's ClusterQueue (``src/xpk/core/kueue_manager.py``, ``__build_template_context``): one
  resource group for the accelerator that covers ``google.com/tpu`` only (``cpu``/``memory``
  only with ``--cpu-limit``/``--memory-limit``), and on Pathways clusters a second group,
  flavor ``cpu-user`` with node label ``cloud.google.com/gke-nodepool: cpu-np``, for cpu and
  memory.
* Kueue's flavor assignment (``pkg/scheduler/flavorassigner/flavorassigner.go``): every
  requested resource needs a flavor of the group that covers it; a zero request of a resource
  that no group covers is skipped (#8079), a zero request of a covered resource still gets
  the group's flavor; a non-zero request of an uncovered resource makes the workload
  inadmissible. The pod set then gets every assigned flavor's node labels as node selectors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TPU = "google.com/tpu"
CPU_POOL_LABEL = {"cloud.google.com/gke-nodepool": "cpu-np"}

_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity(q: Any) -> float:
    s = str(q)
    if s.endswith("m"):
        return float(s[:-1]) / 1000
    for unit, mult in _UNITS.items():
        if s.endswith(unit):
            return float(s[: -len(unit)]) * mult
    return float(s)


def _container_requests(c: dict[str, Any]) -> dict[str, float]:
    res = c.get("resources") or {}
    out = {k: quantity(v) for k, v in (res.get("limits") or {}).items()}
    out.update({k: quantity(v) for k, v in (res.get("requests") or {}).items()})
    return out


def pod_requests(pod_spec: dict[str, Any]) -> dict[str, float]:
    total: dict[str, float] = {}
    for c in [*(pod_spec.get("containers") or [])]:
        for k, v in _container_requests(c).items():
            total[k] = total.get(k, 0.0) + v
    sidecar_sum: dict[str, float] = {}
    for c in pod_spec.get("initContainers") or []:
        req = _container_requests(c)
        if c.get("restartPolicy") == "Always":
            for k, v in req.items():
                sidecar_sum[k] = sidecar_sum.get(k, 0.0) + v
                total[k] = total.get(k, 0.0) + v
        else:
            for k, v in req.items():
                total[k] = max(total.get(k, 0.0), v + sidecar_sum.get(k, 0.0))
    return total


@dataclass(frozen=True)
class ResourceGroup:
    covered: frozenset[str]
    flavor: str
    node_labels: dict[str, str] = field(default_factory=dict)


def xpk_cluster_queue(pathways: bool, cpu_memory_in_tpu_group: bool = False) -> list[ResourceGroup]:
    tpu_covered = {TPU} | ({"cpu", "memory"} if cpu_memory_in_tpu_group else set())
    groups = [
        ResourceGroup(
            frozenset(tpu_covered),
            "2xv6e-16",
            {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "4x4"},
        )
    ]
    if pathways:
        groups.append(ResourceGroup(frozenset({"cpu", "memory"}), "cpu-user", dict(CPU_POOL_LABEL)))
    return groups


@dataclass
class Admission:
    admissible: bool
    reason: str
    node_selector: dict[str, str]


def admit(pod_spec: dict[str, Any], groups: list[ResourceGroup]) -> Admission:
    """Flavor assignment for one pod set, and the node selector the pods end up with."""
    selector = dict(pod_spec.get("nodeSelector") or {})
    for res, q in sorted(pod_requests(pod_spec).items()):
        group = next((g for g in groups if res in g.covered), None)
        if group is None:
            if q == 0:
                continue
            return Admission(False, f"resource {res} ({q:g}) is not covered by the ClusterQueue", selector)
        for k, v in group.node_labels.items():
            if selector.get(k, v) != v:
                return Admission(
                    False, f"{res} got flavor {group.flavor} whose {k}={v} conflicts with the pod's {k}", selector
                )
            selector[k] = v
    return Admission(True, "", selector)


def schedulable_on_tpu_pool(admission: Admission) -> bool:
    """A TPU pod must keep the TPU node selectors and never be pinned to the CPU pool."""
    return admission.admissible and admission.node_selector.get("cloud.google.com/gke-nodepool") != "cpu-np"
