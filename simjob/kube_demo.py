"""``elastic-sidecar demo --kube-api``: the demo's hosts as a JobSet's pods on a stand-in Kubernetes API.

Each host of slice S, host H is a pod of the JobSet ``elastic-demo`` (replicated job ``worker``, the
Job of index S, completion index H) with xpk's JobSet labels. Deleting a pod kills its host the way
``--fault kill:S.H`` does (:meth:`simjob.harness.Demo.inject`), so the stand-in provisioner brings
the slice back, and the replacement host appears as a new pod. The JobSet's ``status.restarts``
counts the trainer's restarts (``trainer-kill``: the demo's stand-in for a JobSet restart). This is
what ``elastic-sidecar drill`` runs against on this machine.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from simjob.demo_common import SetupError
from simjob.options import FaultSpec
from standins.kube_api import HostInfo, InThread, KubeAPIStandIn, PodTable, write_kubeconfig

NAMESPACE = "default"


def wanted(ns: Any) -> bool:
    return bool(getattr(ns, "kube_api", False) or getattr(ns, "kubeconfig_out", None))


class DemoKubeAPI:
    """The stand-in API server beside a running :class:`simjob.harness.Demo`; :meth:`tick` from its loop."""

    def __init__(self, demo: Any, jobset: str) -> None:
        if getattr(demo.ns, "mode", "single-controller") != "single-controller":
            raise SetupError("--kube-api is for the single-controller demo, not --mode multi-controller")
        self.demo = demo
        self.kubeconfig: Path = getattr(demo.ns, "kubeconfig_out", None) or demo.workdir / "kubeconfig"
        self.table = PodTable(jobset, demo.ns.slices, namespace=NAMESPACE)
        self._token = secrets.token_hex(16)
        self._server = InThread(KubeAPIStandIn({}, token=self._token, pods=self.table))
        self.url = ""

    def start(self) -> str:
        self.sync()
        self.url = self._server.start()
        write_kubeconfig(Path(self.kubeconfig), self.url, self._token, namespace=NAMESPACE, name="elastic-demo")
        return self.url

    def sync(self) -> None:
        job = self.demo.job
        self.table.sync(
            {key: HostInfo(host.generation, host.alive(), job.node(*key)) for key, host in list(job.hosts.items())}
        )
        self.table.restarts = sum(1 for r in self.demo.records if r.kind == "trainer-kill")

    def tick(self) -> None:
        """Kill the hosts whose pods were deleted, then show the hosts as they are now."""
        for s, h in self.table.take_deletions():
            self.demo.inject(FaultSpec("kill", s, h, self.demo.last_step))
        self.sync()

    def stop(self) -> None:
        self._server.stop()
