"""Stand-in for the parts of the Kubernetes API server that elastic-sidecar calls, on a loopback port.

Nodes (the worker's node-pool read): ``GET /api/v1/nodes/{name}``, answering with the documented
Node object shape (Kubernetes API reference, Node v1) or, for an unknown node, a ``Status`` object
with ``reason: NotFound`` and HTTP 404, as the real server does. When built with a token it refuses
other bearers with 401, and it answers 403 (``reason: Forbidden``) for nodes listed in
``forbidden``, to mimic missing RBAC. A test may put GKE's maintenance label and taints on a node
(``labels``, ``taints``; shapes from GKE "Monitor maintenance events" and the Node ``spec.taints``
schema). ``PATCH /api/v1/nodes/{name}`` takes a merge or strategic-merge patch of
``spec.unschedulable`` (what ``kubectl cordon`` sends) and records the node in ``unschedulable``.
``refuse`` names calls ("patch nodes", "list pods", "delete pods") answered 403, as without RBAC.

Pods and the JobSet (``elastic-sidecar drill``), when built with a :class:`PodTable`: list pods in
a namespace with a ``labelSelector`` (equality, inequality and existence terms), get and delete one
pod, and get the JobSet (``jobset.x-k8s.io/v1alpha2``). The shapes are the API's own (Pod v1,
PodList, Status, the JobSet CRD's ``status.restarts``), so the official client reads them unchanged.
Nothing else of the API is served.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from aiohttp import web

from agent import constants as C
from agent.sources.node_pool import NODE_POOL_LABEL


def node_object(
    name: str,
    pool: str,
    extra_labels: Mapping[str, str] | None = None,
    taints: list[dict] | None = None,
    unschedulable: bool = False,
) -> dict:
    labels = {
        "kubernetes.io/hostname": name,
        NODE_POOL_LABEL: pool,
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
        "cloud.google.com/gke-tpu-topology": "2x2x1",
        **(extra_labels or {}),
    }
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1", "labels": labels},
        "spec": {
            "providerID": f"gce://tpu-proj/us-east5-a/{name}",
            **({"taints": taints} if taints else {}),
            **({"unschedulable": True} if unschedulable else {}),
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


def _rfc3339(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class HostInfo(NamedTuple):
    """What the owner of a :class:`PodTable` knows of one TPU host."""

    generation: int
    """A new generation is a new VM, hence a new pod (new name and uid)."""
    alive: bool
    node: str


@dataclass
class _Pod:
    key: tuple[int, int]
    generation: int
    obj: dict[str, Any]
    deleting: bool = False
    gone: bool = False


_SELECTOR_TERM = re.compile(r"^(?P<neg>!)?(?P<key>[A-Za-z0-9./_-]+)(?:(?P<op>==|!=|=)(?P<value>[A-Za-z0-9._-]*))?$")


def parse_label_selector(text: str) -> list[tuple[str, str, str]]:
    """``labelSelector``'s equality-based terms as (key, op, value), op one of ``=``, ``!=``,
    ``exists``, ``!exists``; a ValueError names a term this stand-in cannot read (set-based
    terms included: the real server reads them, this one refuses rather than ignore them)."""
    terms: list[tuple[str, str, str]] = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        m = _SELECTOR_TERM.match(raw)
        if not m or (m["neg"] and m["op"]):
            raise ValueError(f"unable to parse requirement: {raw!r}")
        if m["op"] is None:
            terms.append((m["key"], "!exists" if m["neg"] else "exists", ""))
        else:
            terms.append((m["key"], "!=" if m["op"] == "!=" else "=", m["value"]))
    return terms


def _matches(labels: Mapping[str, str], terms: list[tuple[str, str, str]]) -> bool:
    for key, op, value in terms:
        have = labels.get(key)
        if (
            (op == "=" and have != value)
            or (op == "!=" and have == value)
            or (op == "exists" and have is None)
            or (op == "!exists" and have is not None)
        ):
            return False
    return True


class PodTable:
    """The pods of one JobSet's TPU hosts (one replicated job, one Job per slice), kept in step with
    the hosts by their owner, which calls :meth:`sync` with what it knows of each host.

    A host of a new generation gets a new pod (new name and uid) that is Running while its host is
    alive; a host that died otherwise shows its pod Failed. DELETE marks the pod terminating
    (``deletionTimestamp``, as a graceful delete does) and queues its host for the owner to kill
    (:meth:`take_deletions`); once the host is dead the pod is gone, as when the kubelet confirms
    the deletion. Thread-safe: the server and the owner run in different threads.
    """

    def __init__(
        self,
        jobset: str,
        num_slices: int,
        *,
        namespace: str = "default",
        replicated_job: str = "worker",
        tpu_chips_per_host: int = 4,
    ) -> None:
        self.jobset = jobset
        self.namespace = namespace
        self.num_slices = num_slices
        self.replicated_job = replicated_job
        self.tpu_chips_per_host = tpu_chips_per_host
        self.restarts = 0
        """The JobSet's ``status.restarts``, set by the owner."""
        self.jobset_uid = str(uuid.uuid4())
        self._lock = threading.Lock()
        self._pods: dict[tuple[int, int], _Pod] = {}
        self._deletions: list[tuple[int, int]] = []
        self._version = 0

    def _rv(self) -> str:
        self._version += 1
        return str(self._version)

    def sync(self, hosts: Mapping[tuple[int, int], HostInfo]) -> None:
        with self._lock:
            for key, info in hosts.items():
                pod = self._pods.get(key)
                if pod is None or pod.generation != info.generation:
                    self._pods[key] = self._new_pod(key, info)
                    continue
                if pod.gone or info.alive:
                    continue
                if pod.deleting:
                    pod.gone = True
                elif pod.obj["status"]["phase"] != "Failed":
                    self._fail(pod)

    def take_deletions(self) -> list[tuple[int, int]]:
        """The hosts whose pods were deleted since the last call (the owner kills them)."""
        with self._lock:
            out, self._deletions = self._deletions, []
            return out

    def list(self, terms: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
        with self._lock:
            return [
                p.obj
                for _, p in sorted(self._pods.items())
                if not p.gone and _matches(p.obj["metadata"]["labels"], terms)
            ]

    def get(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            pod = self._by_name(name)
            return None if pod is None else pod.obj

    def delete(self, name: str, grace_seconds: int = 30) -> dict[str, Any] | None:
        """The pod, now terminating; None when there is no such pod (the API's 404)."""
        with self._lock:
            pod = self._by_name(name)
            if pod is None:
                return None
            if not pod.deleting:
                pod.deleting = True
                meta = pod.obj["metadata"]
                meta["deletionTimestamp"] = _rfc3339(datetime.now(UTC))
                meta["deletionGracePeriodSeconds"] = grace_seconds
                meta["resourceVersion"] = self._rv()
                self._deletions.append(pod.key)
            return pod.obj

    def jobset_object(self) -> dict[str, Any]:
        with self._lock:
            running = {s for (s, _), p in self._pods.items() if not p.gone and p.obj["status"]["phase"] == "Running"}
            return {
                "apiVersion": f"{C.JOBSET_API[0]}/{C.JOBSET_API[1]}",
                "kind": "JobSet",
                "metadata": {
                    "name": self.jobset,
                    "namespace": self.namespace,
                    "uid": self.jobset_uid,
                    "generation": 1,
                    "resourceVersion": str(self._version),
                },
                "spec": {
                    "failurePolicy": {"maxRestarts": 10},
                    "replicatedJobs": [{"name": self.replicated_job, "replicas": self.num_slices}],
                },
                "status": {
                    "restarts": self.restarts,
                    "restartsCountTowardsMax": self.restarts,
                    "replicatedJobsStatus": [
                        {
                            "name": self.replicated_job,
                            "ready": len(running),
                            "active": self.num_slices,
                            "succeeded": 0,
                            "failed": 0,
                            "suspended": 0,
                        }
                    ],
                },
            }

    def _by_name(self, name: str) -> _Pod | None:
        for p in self._pods.values():
            if not p.gone and p.obj["metadata"]["name"] == name:
                return p
        return None

    def _fail(self, pod: _Pod) -> None:
        status = pod.obj["status"]
        status["phase"] = "Failed"
        status["conditions"][0]["status"] = "False"
        for cs in status["containerStatuses"]:
            cs["ready"] = False
            cs["state"] = {
                "terminated": {"exitCode": 137, "reason": "Error", "finishedAt": _rfc3339(datetime.now(UTC))}
            }
        pod.obj["metadata"]["resourceVersion"] = self._rv()

    def _new_pod(self, key: tuple[int, int], info: HostInfo) -> _Pod:
        # An Indexed Job's pods are named <job>-<completion index>-<random suffix> (generateName), and
        # JobSet names each Job <jobset>-<replicated job>-<job index>.
        s, h = key
        job = f"{self.jobset}-{self.replicated_job}-{s}"
        name = f"{job}-{h}-{secrets.token_hex(3)[:5]}"
        now = _rfc3339(datetime.now(UTC))
        jobset_labels = {
            C.LABEL_JOBSET_NAME: self.jobset,
            C.LABEL_REPLICATED_JOB_NAME: self.replicated_job,
            "jobset.sigs.k8s.io/replicatedjob-replicas": str(self.num_slices),
            C.LABEL_JOB_INDEX: str(s),
            "jobset.sigs.k8s.io/job-global-index": str(s),
            C.LABEL_RESTART_ATTEMPT: str(self.restarts),
        }
        labels = {
            **jobset_labels,
            C.LABEL_JOB_COMPLETION_INDEX: str(h),
            "batch.kubernetes.io/job-name": job,
            "job-name": job,
        }
        chips = {"google.com/tpu": str(self.tpu_chips_per_host)}
        phase = "Running" if info.alive else "Pending"
        obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "generateName": f"{job}-{h}-",
                "namespace": self.namespace,
                "uid": str(uuid.uuid4()),
                "resourceVersion": self._rv(),
                "creationTimestamp": now,
                "labels": labels,
                "annotations": {**jobset_labels, C.LABEL_JOB_COMPLETION_INDEX: str(h)},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": job,
                        "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.jobset_uid}/{job}")),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "nodeName": info.node,
                "hostNetwork": True,
                "restartPolicy": "Never",
                "containers": [
                    {"name": "pathways-worker", "image": "stand-in", "resources": {"limits": chips, "requests": chips}}
                ],
            },
            "status": {
                "phase": phase,
                "hostIP": "127.0.0.1",
                "podIP": "127.0.0.1",
                "startTime": now,
                "conditions": [
                    {"type": "Ready", "status": "True" if info.alive else "False", "lastTransitionTime": now}
                ],
                "containerStatuses": [
                    {
                        "name": "pathways-worker",
                        "image": "stand-in",
                        "imageID": "",
                        "ready": info.alive,
                        "restartCount": 0,
                        "started": info.alive,
                        "state": {"running": {"startedAt": now}}
                        if info.alive
                        else {"waiting": {"reason": "ContainerCreating"}},
                    }
                ],
            },
        }
        return _Pod(key, info.generation, obj)


class KubeAPIStandIn:
    """``nodes``: node name -> pool. ``token``: the bearer required (None: any). ``pods``: serve
    these pods and their JobSet (None: nodes only)."""

    def __init__(
        self,
        nodes: Mapping[str, str],
        token: str | None = None,
        forbidden: set[str] | None = None,
        pods: PodTable | None = None,
        refuse: set[str] | None = None,
    ) -> None:
        self.nodes = dict(nodes)
        self.token = token
        self.forbidden = set(forbidden or ())
        self.pods = pods
        self.refuse = set(refuse or ())
        """Calls answered 403: "patch nodes", "list pods", "delete pods"."""
        self.unschedulable: set[str] = set()
        """Nodes cordoned through PATCH (``spec.unschedulable: true``)."""
        self.requests: list[str] = []
        self.labels: dict[str, dict[str, str]] = {}
        """Extra labels per node (e.g. cloud.google.com/scheduled-maintenance-time), set by a test."""
        self.taints: dict[str, list[dict]] = {}
        """Taints per node (``{"key": ..., "effect": "NoSchedule"}``), set by a test."""
        self._runner: web.AppRunner | None = None
        self.url = ""

    def _refused(self, request: web.Request) -> web.Response | None:
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        return None

    async def _get_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.requests.append(name)
        if refused := self._refused(request):
            return refused
        if name in self.forbidden:
            return _status(403, "Forbidden", f'nodes "{name}" is forbidden: cannot get resource "nodes"')
        pool = self.nodes.get(name)
        if pool is None:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        return web.json_response(self._node(name, pool))

    def _node(self, name: str, pool: str) -> dict:
        return node_object(name, pool, self.labels.get(name), self.taints.get(name), name in self.unschedulable)

    def _forbidden(self, verb: str, resource: str, name: str) -> web.Response | None:
        if f"{verb} {resource}" not in self.refuse:
            return None
        what = f'{resource} "{name}" is forbidden' if name else f"{resource} is forbidden"
        return _status(403, "Forbidden", f'{what}: cannot {verb} resource "{resource}"')

    async def _patch_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.requests.append(f"patch node {name}")
        if refused := self._refused(request) or self._forbidden("patch", "nodes", name):
            return refused
        if request.content_type not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return _status(
                415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {request.content_type}"
            )
        pool = self.nodes.get(name)
        if pool is None:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        patch = await request.json()
        spec = patch.get("spec") if isinstance(patch, dict) else None
        if not isinstance(spec, dict) or set(spec) - {"unschedulable"}:
            return _status(422, "Invalid", "this stand-in patches spec.unschedulable only")
        if spec.get("unschedulable"):
            self.unschedulable.add(name)
        else:
            self.unschedulable.discard(name)
        return web.json_response(self._node(name, pool))

    def _table(self, request: web.Request) -> PodTable | None:
        """The pod table when the request's namespace is the JobSet's (other namespaces are empty)."""
        if self.pods is not None and request.match_info["ns"] == self.pods.namespace:
            return self.pods
        return None

    async def _list_pods(self, request: web.Request) -> web.Response:
        self.requests.append(f"list pods {request.query_string}")
        if refused := self._refused(request) or self._forbidden("list", "pods", ""):
            return refused
        try:
            terms = parse_label_selector(request.query.get("labelSelector", ""))
        except ValueError as e:
            return _status(400, "BadRequest", str(e))
        table = self._table(request)
        items = table.list(terms) if table is not None else []
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}
        return web.json_response(body)

    async def _pod(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.requests.append(f"{request.method} pod {name}")
        if refused := self._refused(request) or self._forbidden(request.method.lower(), "pods", name):
            return refused
        table = self._table(request)
        if request.method == "DELETE":
            pod = table.delete(name) if table is not None else None
        else:
            pod = table.get(name) if table is not None else None
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        return web.json_response(pod)

    async def _get_jobset(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.requests.append(f"get jobset {name}")
        if refused := self._refused(request):
            return refused
        table = self._table(request)
        if table is None or name != table.jobset:
            return _status(404, "NotFound", f'jobsets.{C.JOBSET_API[0]} "{name}" not found')
        return web.json_response(table.jobset_object())

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/api/v1/nodes/{name}", self._get_node)
        app.router.add_patch("/api/v1/nodes/{name}", self._patch_node)
        if self.pods is not None:
            group, version, plural = C.JOBSET_API
            app.router.add_get("/api/v1/namespaces/{ns}/pods", self._list_pods)
            app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._pod)
            app.router.add_delete("/api/v1/namespaces/{ns}/pods/{name}", self._pod)
            app.router.add_get(f"/apis/{group}/{version}/namespaces/{{ns}}/{plural}/{{name}}", self._get_jobset)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class InThread:
    """A stand-in served from its own event loop in a daemon thread, for a synchronous owner
    (the demo's loop)."""

    def __init__(self, standin: KubeAPIStandIn) -> None:
        self.standin = standin
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kube-api-stand-in", daemon=True)

    def start(self, timeout: float = 10.0) -> str:
        self._thread.start()
        return asyncio.run_coroutine_threadsafe(self.standin.start(), self._loop).result(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self.standin.stop(), self._loop).result(timeout)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._loop.close()


def write_kubeconfig(path: Path, url: str, token: str, *, namespace: str = "default", name: str = "stand-in") -> None:
    """A kubeconfig (``kind: Config``) for ``url`` with a bearer token, readable by the owner alone:
    what ``kubernetes.config.load_kube_config(config_file=path)`` and kubectl load."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": url}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
