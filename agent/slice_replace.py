"""``--straggler-replace``: cordon a drained straggler slice's nodes and delete its pods, so that the
JobSet recreates them on other nodes (docs/stragglers.md, "Replacing a straggler").

The official ``kubernetes`` client (the ``drill`` extra) blocks: each replacement runs in a thread,
under a deadline. A failure is logged and counted (``straggler_replacements_total``), never raised:
the slice then stays drained, as without the flag, and nothing else in the job changes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import constants as C
from agent import log as logmod
from agent.core.model import ReplaceSlice

log = logmod.get("coordinator")

REPLACE_TIMEOUT_SECONDS = 60.0
"""Seconds for one slice's replacement, every call included: a slice has a few to a few dozen hosts."""
CALL_TIMEOUT_SECONDS = 10.0
"""Seconds for one Kubernetes API call (never more than the replacement has left)."""
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
TPU_RESOURCE = "google.com/tpu"


def requests_tpu(pod: Any) -> bool:
    """Whether the pod asks for TPU chips: a slice's host. A Pathways JobSet's head Job shares job-index 0
    with slice 0's worker Job (FACTS.md, xpk's Pathways JobSet), and it holds the coordinator itself."""
    for c in pod.spec.containers or []:
        res = c.resources
        if res is not None and TPU_RESOURCE in {**(res.limits or {}), **(res.requests or {})}:
            return True
    return False


class KubeSlices:
    """The job's slice pods and their nodes, through the official client: ``kubeconfig``, or in-cluster."""

    def __init__(self, kubeconfig: Path | None) -> None:
        from kubernetes import client, config

        cfg = client.Configuration()
        if kubeconfig is None:
            config.load_incluster_config(client_configuration=cfg)
            namespace = IN_CLUSTER_NAMESPACE.read_text().strip() if IN_CLUSTER_NAMESPACE.exists() else None
        else:
            config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
            _, current = config.list_kube_config_contexts(config_file=str(kubeconfig))
            namespace = (current or {}).get("context", {}).get("namespace")
        self.namespace: str = namespace or "default"
        # No retries inside a call: each call has its own deadline, and a failure leaves the slice drained.
        cfg.retries = 0
        self.api = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api)
        self.ApiException: Any = client.exceptions.ApiException

    def slice_pods(self, job: str, slice_: int, timeout: float) -> list[Any]:
        # xpk's JobSet labels every pod with its JobSet's name and its Job's index, the slice (FACTS.md).
        selector = f"{C.LABEL_JOBSET_NAME}={job},{C.LABEL_JOB_INDEX}={slice_}"
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector, _request_timeout=timeout)
        return list(pods.items)

    def cordon(self, node: str, timeout: float) -> None:
        # As `kubectl cordon` does: spec.unschedulable = true keeps the scheduler from placing new pods on
        # the node and leaves the pods there running (Kubernetes docs, "Nodes", Manual Node Administration).
        self.core.patch_node(node, {"spec": {"unschedulable": True}}, _request_timeout=timeout)

    def delete(self, pod: str, timeout: float) -> None:
        # A graceful delete: the kubelet sends SIGTERM and the pod's grace period applies; the Job
        # controller creates a pod for the index again, on a schedulable node.
        self.core.delete_namespaced_pod(pod, self.namespace, _request_timeout=timeout)

    def close(self) -> None:
        self.api.close()


@dataclass(frozen=True)
class Replaced:
    """What one replacement did: ``outcome`` replaced, no_pods or failed; the nodes cordoned and pods deleted."""

    outcome: str
    nodes: tuple[str, ...] = ()
    pods: tuple[str, ...] = ()
    error: str = ""


class SliceReplacer:
    """Carries out :class:`ReplaceSlice` off the event loop: cordon the nodes of the slice's pods, then delete
    the pods. Cordoning first keeps their replacements off the same nodes; a node that cannot be cordoned
    stops the replacement before any pod is deleted (a slice recreated on the slow nodes gains nothing)."""

    def __init__(
        self,
        job: str,
        kubeconfig: Path | None,
        on_outcome: Callable[[str], None],
        *,
        timeout: float = REPLACE_TIMEOUT_SECONDS,
        call_timeout: float = CALL_TIMEOUT_SECONDS,
    ) -> None:
        self.job = job
        self.kubeconfig = kubeconfig
        self.on_outcome = on_outcome
        self.timeout = timeout
        self.call_timeout = call_timeout
        self._kube: KubeSlices | None = None
        self._tasks: set[asyncio.Task[Replaced]] = set()

    def carry_out(self, a: ReplaceSlice) -> None:
        task = asyncio.get_running_loop().create_task(self.replace(a), name=f"replace-slice-{a.slice}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def replace(self, a: ReplaceSlice) -> Replaced:
        """Replace the slice; the outcome is logged and counted, whatever happens."""
        deadline = time.monotonic() + self.timeout
        try:
            done = await asyncio.wait_for(asyncio.to_thread(self._replace, a.slice, deadline), self.timeout)
        except TimeoutError:
            done = Replaced("failed", error=f"not done within {self.timeout:g} s")
        except Exception as e:  # any answer or none: the slice stays drained, the job goes on
            done = Replaced("failed", error=_describe(e))
        self.on_outcome(done.outcome)
        fields = {"slice": a.slice, "nodes": list(done.nodes), "pods": list(done.pods), "reason": a.reason}
        if done.outcome == "failed":
            log.error(
                "could not replace the straggler slice; it stays drained until an operator undrains it or a new "
                "host registers for it",
                error=done.error,
                **fields,
            )
        elif done.outcome == "no_pods":
            log.warning("no TPU pod of the straggler slice found to replace; it stays drained", **fields)
        else:
            log.warning("replaced the straggler slice: its nodes cordoned, its pods deleted", **fields)
        return done

    def _replace(self, slice_: int, deadline: float) -> Replaced:
        """Blocking: runs in a thread."""
        if self._kube is None:
            self._kube = KubeSlices(self.kubeconfig)
        kube = self._kube
        pods = [
            p
            for p in kube.slice_pods(self.job, slice_, self._left(deadline))
            if p.metadata.deletion_timestamp is None and requests_tpu(p)
        ]
        if not pods:
            return Replaced("no_pods")
        nodes = tuple(sorted({p.spec.node_name for p in pods if p.spec.node_name}))
        cordoned: list[str] = []
        for node in nodes:
            try:
                kube.cordon(node, self._left(deadline))
            except kube.ApiException as e:
                if e.status != 404:  # a node already gone needs no cordon
                    return Replaced("failed", tuple(cordoned), error=f"cordon node {node}: {_api_error(e)}")
            cordoned.append(node)
        deleted: list[str] = []
        for pod in pods:
            name = pod.metadata.name
            try:
                kube.delete(name, self._left(deadline))
            except kube.ApiException as e:
                if e.status != 404:  # already gone: the Job controller replaces it anyway
                    return Replaced("failed", nodes, tuple(deleted), f"delete pod {name}: {_api_error(e)}")
            deleted.append(name)
        return Replaced("replaced", nodes, tuple(deleted))

    def _left(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"not done within {self.timeout:g} s")
        return min(self.call_timeout, left)

    def close(self) -> None:
        if self._kube is not None:
            self._kube.close()


def _api_error(e: Any) -> str:
    return f"HTTP {e.status} {e.reason}"


def _describe(e: BaseException) -> str:
    """One line: the API's status for an answer, the first line of the error for none."""
    if isinstance(getattr(e, "status", None), int):
        return f"list pods: {_api_error(e)}"
    text = str(e).splitlines()[0][:300] if str(e) else ""
    return f"{type(e).__name__}: {text}"
