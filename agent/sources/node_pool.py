"""Which GKE node pool (= TPU slice) a node belongs to, from the Kubernetes API.

The downward API cannot expose a node's labels to a pod, and the GCE metadata
server's instance attributes are not guaranteed to name the GKE node pool, so a
worker sidecar asks the API server: ``GET /api/v1/nodes/{name}`` and reads the
label ``cloud.google.com/gke-nodepool`` from ``metadata.labels`` (Kubernetes API
reference, Node v1; GKE "About node pools"). It authenticates with the pod's
service account token; the manifests grant ``get`` on ``nodes`` and nothing else
(``deploy/common/rbac.yaml``).

The answer goes into the worker's Register so the coordinator can map a
node-pool notice (a GKE upgrade) to the slice. Failures are retried with
backoff a few times; without an answer the worker registers with no pool, and
only node-named notices (GCE, Kubernetes Events) reach its slice.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from agent import log as agent_log

NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
log = agent_log.get("elastic-sidecar.node-pool")


class NodeLookupError(RuntimeError):
    """The API server did not say which pool the node is in; the message says why and what to check."""


@dataclass(frozen=True)
class KubernetesAPI:
    """Where the API server is and how to authenticate (a service account, in a pod)."""

    base_url: str
    token_file: str | None = None
    ca_file: str | None = None
    timeout: float = 5.0

    def _headers(self) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if self.token_file and Path(self.token_file).exists():
            # Re-read each time: bound service account tokens are rotated on disk.
            token = Path(self.token_file).read_text().strip()
            if token:
                h["Authorization"] = f"Bearer {token}"
        return h

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.base_url.startswith("https://"):
            return False
        if self.ca_file and Path(self.ca_file).exists():
            return ssl.create_default_context(cafile=self.ca_file)
        return True

    async def get_node(self, name: str) -> dict:
        """The Node object as JSON."""
        url = f"{self.base_url.rstrip('/')}/api/v1/nodes/{quote(name, safe='')}"
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout)) as s,
                s.get(url, headers=self._headers(), ssl=self._ssl()) as r,
            ):
                if r.status == 200:
                    body = await r.json(content_type=None)
                    if not isinstance(body, dict):
                        raise NodeLookupError(f"GET {url} returned a JSON {type(body).__name__}, not a Node object")
                    return body
                text = (await r.text())[:300]
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise NodeLookupError(f"GET {url} failed: {type(e).__name__}: {e}") from e
        hint = {
            401: "the service account token was refused",
            403: "the service account may not get nodes: apply deploy/common/rbac.yaml (ClusterRole with get on nodes)",
            404: f"no node named {name!r}: is --node (NODE_NAME from spec.nodeName) right?",
        }.get(r.status, "")
        raise NodeLookupError(f"GET {url} returned HTTP {r.status}{': ' + hint if hint else ''}; body: {text}")


async def node_pool_of(api: KubernetesAPI, node: str) -> str:
    """The node's ``cloud.google.com/gke-nodepool`` label; NodeLookupError when it has none or the call fails."""
    body = await api.get_node(node)
    meta = body.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    pool = labels.get(NODE_POOL_LABEL) if isinstance(labels, dict) else None
    if not isinstance(pool, str) or not pool:
        raise NodeLookupError(f"node {node!r} has no {NODE_POOL_LABEL} label: not a GKE node pool node?")
    return pool


async def lookup_with_retries(api: KubernetesAPI, node: str, attempts: int = 5, first_delay: float = 0.5) -> str:
    """:func:`node_pool_of` retried with doubling delays; "" (logged as an error) when every attempt fails."""
    delay = first_delay
    for i in range(1, attempts + 1):
        try:
            pool = await node_pool_of(api, node)
            log.info("node pool from the Kubernetes API", node=node, node_pool=pool)
            return pool
        except NodeLookupError as e:
            if i == attempts:
                log.error(
                    "could not learn this node's pool; node-pool notices (GKE upgrades) will not reach this slice",
                    node=node,
                    error=str(e),
                    attempts=attempts,
                )
                return ""
            log.warning("node pool lookup failed; retrying", node=node, error=str(e), retry_in=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
    return ""


# --------------------------------------------------------------------------
# the node's own maintenance signals (same GET, polled)
# --------------------------------------------------------------------------

SCHEDULED_MAINTENANCE_LABEL = "cloud.google.com/scheduled-maintenance-time"
"""Unix seconds of the next host maintenance window (GKE "Monitor maintenance events")."""
IMPENDING_TERMINATION_TAINT = "cloud.google.com/impending-node-termination"
MAINTENANCE_STARTED_TAINT = "cloud.google.com/maintenance-window-started"

SIGNAL_SCHEDULED = "node/scheduled-maintenance-time"
SIGNAL_TERMINATION = "node/impending-node-termination"
SIGNAL_STARTED = "node/maintenance-window-started"


@dataclass(frozen=True)
class NodeSignal:
    """One change of a GKE maintenance label or taint on this node.

    ``value`` is the label's unix time (``starts_unix`` too), ``"TRUE"`` for a taint that
    appeared, ``"NONE"`` / ``"FALSE"`` when the label / taint went away (the disruption is over).
    """

    key: str
    value: str
    starts_unix: float = 0.0


def node_signals(body: dict) -> dict[str, NodeSignal]:
    """The maintenance signals a Node object carries now (absent ones are not listed)."""
    out: dict[str, NodeSignal] = {}
    meta = body.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    raw = labels.get(SCHEDULED_MAINTENANCE_LABEL) if isinstance(labels, dict) else None
    if isinstance(raw, str) and raw.strip().isdigit():
        out[SIGNAL_SCHEDULED] = NodeSignal(SIGNAL_SCHEDULED, raw.strip(), float(raw))
    spec = body.get("spec")
    taints = spec.get("taints") if isinstance(spec, dict) else None
    keys = {t.get("key") for t in taints if isinstance(t, dict)} if isinstance(taints, list) else set()
    if IMPENDING_TERMINATION_TAINT in keys:
        out[SIGNAL_TERMINATION] = NodeSignal(SIGNAL_TERMINATION, "TRUE")
    if MAINTENANCE_STARTED_TAINT in keys:
        out[SIGNAL_STARTED] = NodeSignal(SIGNAL_STARTED, "TRUE")
    return out


class NodeSignalWatcher:
    """Polls the node every ``interval`` s and reports each signal that appears, changes or goes away.

    A failed GET is *unknown*, never *clear*: nothing is reported and the next poll retries.
    """

    def __init__(self, api: KubernetesAPI, node: str, on_signal: Any, interval: float = 30.0) -> None:
        self.api = api
        self.node = node
        self.on_signal = on_signal
        self.interval = interval
        self.current: dict[str, NodeSignal] = {}
        self.errors = 0

    async def poll_once(self) -> None:
        try:
            body = await self.api.get_node(self.node)
        except NodeLookupError as e:
            self.errors += 1
            log.warning("node maintenance signals unknown", node=self.node, error=str(e))
            return
        now = node_signals(body)
        for key, sig in now.items():
            if self.current.get(key) != sig:
                self.on_signal(sig)
        for key in set(self.current) - set(now):
            self.on_signal(NodeSignal(key, "NONE" if key == SIGNAL_SCHEDULED else "FALSE"))
        self.current = now

    async def run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval)
