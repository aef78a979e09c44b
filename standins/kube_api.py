"""Stand-in for the Kubernetes API server's node read, on a loopback port.

Serves only ``GET /api/v1/nodes/{name}``, answering with the documented Node
object shape (Kubernetes API reference, Node v1: ``kind``, ``apiVersion``,
``metadata.name`` / ``labels`` / ``uid``, ``spec``, ``status``) or, for an
unknown node, a ``Status`` object with ``reason: NotFound`` and HTTP 404, as the
real server does. When built with a token it refuses other bearers with 401,
and it answers 403 (``reason: Forbidden``) for nodes listed in ``forbidden``, to
mimic missing RBAC. A test may put GKE's maintenance label and taints on a node
(``labels``, ``taints``; shapes from GKE "Monitor maintenance events" and the Node
``spec.taints`` schema). Nothing else of the API is served.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from agent.sources.node_pool import NODE_POOL_LABEL


def node_object(
    name: str, pool: str, extra_labels: Mapping[str, str] | None = None, taints: list[dict] | None = None
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
        "spec": {"providerID": f"gce://tpu-proj/us-east5-a/{name}", **({"taints": taints} if taints else {})},
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


class KubeAPIStandIn:
    """``nodes``: node name -> pool. ``token``: the bearer required (None: any)."""

    def __init__(self, nodes: Mapping[str, str], token: str | None = None, forbidden: set[str] | None = None) -> None:
        self.nodes = dict(nodes)
        self.token = token
        self.forbidden = set(forbidden or ())
        self.requests: list[str] = []
        self.labels: dict[str, dict[str, str]] = {}
        """Extra labels per node (e.g. cloud.google.com/scheduled-maintenance-time), set by a test."""
        self.taints: dict[str, list[dict]] = {}
        """Taints per node (``{"key": ..., "effect": "NoSchedule"}``), set by a test."""
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _get_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.requests.append(name)
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        if name in self.forbidden:
            return _status(403, "Forbidden", f'nodes "{name}" is forbidden: cannot get resource "nodes"')
        pool = self.nodes.get(name)
        if pool is None:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        return web.json_response(node_object(name, pool, self.labels.get(name), self.taints.get(name)))

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/api/v1/nodes/{name}", self._get_node)
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
