"""``elastic-sidecar inject``: add elastic-sidecar to a JobSet that xpk (or anyone) made.

    xpk workload create ... --output-manifest-file job.yaml   # or any JobSet of that shape
    elastic-sidecar inject job.yaml > job-elastic.yaml         # stderr: what changed, what it needs
    elastic-sidecar inject --companions-only job.yaml > companions.yaml
    kubectl create -f companions.yaml
    elastic-sidecar inject --secrets job.yaml | kubectl create -f -   # tokens into no file

Everything the job refers to is named after the JobSet and lives in its namespace
(``metadata.namespace``, else ``--namespace``, else ``default``; written into the JobSet where
absent): the service account ``JOB-elastic-sidecar``, the Secrets ``JOB-elastic-sidecar-{admin,
peer,trainer}-token`` and the cluster-wide ``elastic-sidecar-get-nodes:NAMESPACE:JOB``
(``CompanionNames``), so two jobs side by side create and delete their own objects.

Two shapes are understood (xpk's templates, ``src/xpk/templates/pathways_workload_create.yaml.j2``
and ``WORKLOAD_CREATE_YAML`` in ``src/xpk/commands/workload.py``):

* ``pathways``: a replicated job ``pathways-head`` whose pod has exactly one main container
  (the trainer, with ``JAX_PLATFORMS=proxy``), and one or more replicated jobs whose pods ask
  for ``google.com/tpu`` (xpk's ``worker``: ``pathways-worker`` on every TPU host). The
  coordinator becomes a native sidecar of the head pod; the trainer reaches it on loopback.
* ``multi-controller``: no ``pathways-head`` and exactly one replicated job whose pods ask for
  ``google.com/tpu`` in one container (the trainer on every TPU host). The coordinator gets a
  replicated job of its own (``es-coordinator``), so losing a slice never takes it along; the
  trainer reaches it over the pod network with a bearer token.

In both, every TPU pod gets a worker native sidecar (an ``initContainers`` entry with
``restartPolicy: Always``) that reads its node's GKE node pool through the Kubernetes API
(``--node-pool-source=kubernetes``: ``GET /api/v1/nodes/{name}``, agent/sources/node_pool.py)
under the job's service account, which the pod gets where it names none; the
trainer's MaxText entry point (``python3 -m MaxText.train``,
``python3 -m maxtext.trainers.pre_train.train`` or their ``train.py`` paths) is replaced by
``python3 -m trainer_hooks.maxtext`` with the same arguments, and the trainer gets
``ELASTIC_SIDECAR_ADDRESS``, ``ELASTIC_SIDECAR_JOB`` and ``ELASTIC_SIDECAR_TOKEN_FILE``.

How the text is changed: the input is parsed only to find positions; the output is the
input's own text with lines inserted, plus these in-place edits: the entry point in the
trainer's command; an empty ``env:``/``volumes:`` turned into a list; an empty
``serviceAccountName:`` given ours; ``failurePolicy.maxRestarts`` where it is below 1 or
``--max-restarts`` names another value; and, multi-controller only, a JobSet-wide
exclusive-placement annotation turned into a comment and given to the input's replicated jobs
instead (JobSet copies a JobSet-wide one to every Job, ``es-coordinator``'s included:
``labelAndAnnotateObject`` in kubernetes-sigs/jobset pkg/controllers/jobset_controller.go, which
also reads the per-replicated-job ``template.metadata.annotations``). Every other byte, comments
and odd indentation included, stays as it was. A JobSet that already has an ``elastic-sidecar``
container comes back unchanged (injecting twice equals injecting once). On stderr: what was
changed, what the trainer's image needs (``trainer_hooks`` importable, versions that
``python -m trainer_hooks.maxtext --check`` accepts), and a warning where the trainer's MaxText
arguments leave the job unable to shrink (no ``elastic_min_slice_count``) or to restart from a
checkpoint (``enable_checkpointing=false``).

Kueue: xpk's ClusterQueue covers only ``google.com/tpu`` in the TPU resource group (cpu and
memory only with ``xpk cluster create --cpu-limit/--memory-limit``); Pathways clusters add a
``cpu-user`` flavor (node pool ``cpu-np``) for cpu and memory. A cpu or memory request on a TPU
pod would be assigned ``cpu-user`` (whose node label then pins the TPU pod to the CPU pool) or,
without that flavor, make the workload inadmissible. A zero request is no way out: Kueue still
assigns a flavor to a zero request of a resource its ClusterQueue covers (it skips it only when
no resource group covers it), and a limit without a request defaults the request to the limit.
So, unless ``--cpu-memory-quota`` says the queue covers them, the sidecars in TPU pods and the
multi-controller coordinator carry no cpu/memory requests or limits at all; the Pathways
coordinator sits in the head pod, which the ``cpu-user`` flavor already covers, and gets a
1 GiB memory request and limit (tests/deploy checks it against the RSS that docs/benchmarks.json's
scale rows measure at, or extrapolate to, 10,000 workers).

Exit codes follow xpk (``get_restart_exit_codes``): the trainer restarts the JobSet on 42 and
127-255 and fails it on every other code, so ``admin abort`` (exit 3) ends the job.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import secrets
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

from agent import constants as C

PATHWAYS = "pathways"
MULTI_CONTROLLER = "multi-controller"
MODES = (PATHWAYS, MULTI_CONTROLLER)

SIDECAR_NAME = "elastic-sidecar"
COORDINATOR_JOB = "es-coordinator"
PATHWAYS_HEAD = "pathways-head"
TPU_RESOURCE = "google.com/tpu"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
NODE_SELECTOR_STRATEGY = "alpha.jobset.sigs.k8s.io/node-selector"
"""Goes with EXCLUSIVE_TOPOLOGY (JobSet copies both from the same level)."""
SERVICE_ACCOUNT = "elastic-sidecar"
"""deploy/common's service account; inject's companions use ``CompanionNames.service_account``."""
NODE_READER = "elastic-sidecar-get-nodes"
"""ClusterRole and ClusterRoleBinding: ``get`` on nodes, the one API call the daemon makes
(agent/sources/node_pool.py); deploy/common/rbac.yaml's name, the prefix of inject's."""
DEFAULT_MAX_RESTARTS = 3
NAME_LIMIT = 63
"""Companion names stay within an RFC 1123 label (63 characters), the strictest limit Kubernetes
puts on object names and on label values ("Object Names and IDs",
https://kubernetes.io/docs/concepts/overview/working-with-objects/names/)."""
TOKEN_DIR = "/var/run/elastic-sidecar"
STATE_DIR = "/var/lib/elastic-sidecar"
TRAINER_MODULE = "trainer_hooks.maxtext"
PATHWAYS_WORKER_PORT = 29005
METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"

RESTART_EXIT_CODES = (C.EXIT_RESTART, *range(127, 256))
"""xpk restarts a workload on these trainer exit codes and fails it on any other."""

COORDINATOR_MEMORY = "1Gi"
"""At least 1.5x the coordinator's RSS at 10,000 workers (docs/benchmarks.json; tests/deploy checks it)."""
COORDINATOR_CPU = "500m"
"""The target (half a core at 10,000 workers, docs/benchmarks.md says whether it is met); no cpu
limit, so a burst of re-registrations is never throttled."""

# MaxText's elastic flags and their defaults (src/maxtext/configs/base.yml).
MAXTEXT_ELASTIC_DEFAULTS = {"elastic_min_slice_count": -1, "elastic_timeout_seconds": 300, "elastic_max_retries": 10}

_ENTRY_POINT = re.compile(
    r"(?P<py>\bpython(?:3(?:\.\d+)?)?)\s+"
    r"(?:-m\s+(?:MaxText\.train|maxtext\.trainers\.pre_train\.train)(?![\w.])"
    r"|(?:[\w./-]*/)?(?:MaxText/train\.py|maxtext/trainers/pre_train/train\.py)(?![\w.]))"
)
_MODULES = frozenset({"MaxText.train", "maxtext.trainers.pre_train.train"})


class InjectError(Exception):
    """The input is not a JobSet this command understands; the message says what it expected."""


@dataclass(frozen=True)
class InjectOptions:
    """What ``inject`` adds beyond the input itself."""

    mode: str | None = None
    """``pathways``, ``multi-controller`` or None (decided from the shape)."""
    image: str = SIDECAR_NAME
    pubsub_subscription: str | None = None
    cluster_name: str | None = None
    cpu_memory_quota: bool = False
    """The ClusterQueue covers cpu and memory for these pods: give the sidecars requests and limits."""
    max_restarts: int | None = None
    """``failurePolicy.maxRestarts`` (at least 1: an exit 42 restarts the JobSet and counts against
    it). None keeps the JobSet's own where it is at least 1, and sets DEFAULT_MAX_RESTARTS where it
    is absent or 0 (xpk's default)."""
    health_check: str = "tcp"
    namespace: str | None = None
    """Where the JobSet and its companions go; must agree with ``metadata.namespace`` where set."""


def _bounded(head: str, tail: str = "") -> str:
    """``head + tail``, or where that exceeds NAME_LIMIT, ``head`` cut short and followed by a hash
    of the whole name before ``tail``: two long names that differ still get different results."""
    name = head + tail
    if len(name) <= NAME_LIMIT:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{head[: NAME_LIMIT - len(tail) - len(digest) - 1].rstrip('-.:')}-{digest}{tail}"


@dataclass(frozen=True)
class CompanionNames:
    """The objects one injected JobSet refers to, named after it, so that two jobs side by side
    create and delete their own. Namespaced objects are in the JobSet's namespace; the cluster-wide
    node reader also names the namespace (Kubernetes names cannot hold ``:``, so none is ambiguous)."""

    jobset: str
    namespace: str

    @property
    def service_account(self) -> str:
        return _bounded(self.jobset, f"-{SIDECAR_NAME}")

    def secret(self, token: str) -> str:
        """The Secret of the ``admin``, ``peer`` or ``trainer`` token (key ``token``)."""
        return _bounded(self.jobset, f"-{SIDECAR_NAME}-{token}-token")

    @property
    def secrets(self) -> list[str]:
        return [self.secret(t) for t in TOKENS]

    @property
    def network_policy(self) -> str:
        return _bounded(self.jobset, f"-{SIDECAR_NAME}")

    @property
    def node_reader(self) -> str:
        """The ClusterRole and its ClusterRoleBinding."""
        return _bounded(f"{NODE_READER}:{self.namespace}:{self.jobset}")

    @property
    def instance(self) -> str:
        """``app.kubernetes.io/instance`` on every companion (a label value: 63 characters at most)."""
        return _bounded(self.jobset)


TOKENS = ("admin", "peer", "trainer")


@dataclass
class Result:
    text: str
    mode: str
    jobset_name: str
    namespace: str
    changed: bool
    warnings: list[str] = field(default_factory=list)
    service_accounts: list[str] = field(default_factory=list)
    """Every service account a worker sidecar runs as: each needs the node-reading binding."""
    notes: list[str] = field(default_factory=list)
    """What was changed and what the job needs besides the file (stderr, before the warnings)."""

    @property
    def names(self) -> CompanionNames:
        return CompanionNames(self.jobset_name, self.namespace)


# --- positions in the source text ------------------------------------------------


@dataclass
class _Edit:
    line: int
    seq: int
    replace: bool
    lines: list[str]


class _Text:
    """The input's lines and the edits to make to them, applied bottom-up at the end."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines(keepends=True)
        if self.lines and not self.lines[-1].endswith("\n"):
            self.lines[-1] += "\n"
        self._edits: list[_Edit] = []

    def insert(self, line: int, block: list[str]) -> None:
        self._edits.append(_Edit(line, len(self._edits), False, block))

    def replace(self, line: int, new: list[str]) -> None:
        if any(e.replace and e.line == line for e in self._edits):
            raise AssertionError(f"line {line + 1} edited twice")
        self._edits.append(_Edit(line, len(self._edits), True, new))

    def comment_start(self, line: int) -> int:
        """The first of the comment lines right above ``line`` (they belong to it)."""
        while line > 0 and self.lines[line - 1].lstrip().startswith("#"):
            line -= 1
        return line

    def render(self) -> str:
        out = list(self.lines)
        # Bottom-up so earlier line numbers stay valid; at one line the replacement first, then the
        # inserts, last-made first, so they end up in the order they were made.
        for e in sorted(self._edits, key=lambda e: (e.line, e.replace, e.seq), reverse=True):
            if e.replace:
                out[e.line : e.line + 1] = e.lines
            else:
                out[e.line : e.line] = e.lines
        return "".join(out)


class _Dumper(yaml.SafeDumper):
    """Block style, except lists of numbers (exit codes) on one line."""


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    numbers = bool(data) and all(isinstance(x, int) and not isinstance(x, bool) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=numbers)


_Dumper.add_representer(list, _represent_list)


def _dump(obj: Any, indent: int) -> list[str]:
    text = yaml.dump(
        obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1_000_000, allow_unicode=True
    )
    pad = " " * indent
    return [pad + ln + "\n" if ln else "\n" for ln in text.splitlines()]


def _get(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return v
    return None


def _key(node: yaml.MappingNode, key: str) -> yaml.ScalarNode:
    for k, _ in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return k
    raise KeyError(key)


def _is_null(node: yaml.Node | None) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def _own_line_key(t: _Text, m: yaml.MappingNode) -> yaml.ScalarNode:
    """A key of ``m`` that starts its own line (not after a sequence dash)."""
    for k, _ in m.value:
        ln, col = k.start_mark.line, k.start_mark.column
        if t.lines[ln][:col].strip() == "":
            return k
    raise InjectError(f"line {m.start_mark.line + 1}: cannot add a field to a mapping written on one line")


def _add_fields(t: _Text, m: yaml.MappingNode, fields: dict[str, Any]) -> None:
    """Add keys to a block mapping, above its first key that has a line of its own."""
    if m.flow_style:
        raise InjectError(f"line {m.start_mark.line + 1}: cannot add to a mapping in flow style {{...}}")
    anchor = _own_line_key(t, m)
    t.insert(t.comment_start(anchor.start_mark.line), _dump(fields, anchor.start_mark.column))


def _prepend_items(t: _Text, parent: yaml.MappingNode, key: str, items: list[Any]) -> None:
    """Put ``items`` first in the list ``parent[key]``, creating the list if there is none."""
    node = _get(parent, key)
    if node is None:
        _add_fields(t, parent, {key: items})
        return
    if isinstance(node, yaml.SequenceNode) and not node.flow_style and node.value:
        first = node.value[0]
        dash_line = first.start_mark.line
        line = t.lines[dash_line]
        dash_col = line.rfind("-", 0, first.start_mark.column)
        if dash_col < 0 or line[:dash_col].strip():
            raise InjectError(f"line {dash_line + 1}: expected a block list item ('- ...') for {key!r}")
        t.insert(t.comment_start(dash_line), _dump(items, dash_col))
        return
    if _is_null(node) or (isinstance(node, yaml.SequenceNode) and not node.value):
        k = _key(parent, key)
        ln = k.start_mark.line
        head = t.lines[ln]
        m = re.match(rf"^(\s*{re.escape(key)}:)\s*(\[\s*\])?\s*(#.*)?$", head.rstrip("\n"))
        if m is None or node.start_mark.line != ln and not _is_null(node):
            raise InjectError(f"line {ln + 1}: expected {key}: to be a list, empty, or absent")
        block = _dump(items, k.start_mark.column + 2)
        if m.group(2) is None:  # `key:` with nothing after it: the line stays as it is
            t.insert(ln + 1, block)
        else:
            t.replace(ln, [m.group(1) + (" " + m.group(3) if m.group(3) else "") + "\n", *block])
        return
    raise InjectError(f"line {node.start_mark.line + 1}: expected {key}: to be a block list")


def _set_scalar(t: _Text, node: yaml.Node, new: str, where: str) -> None:
    """Replace a one-line scalar's text by ``new``; the rest of its line (a comment) stays."""
    if not isinstance(node, yaml.ScalarNode) or node.start_mark.line != node.end_mark.line:
        raise InjectError(f"line {node.start_mark.line + 1}: expected {where} to be a value on one line")
    ln, a, b = node.start_mark.line, node.start_mark.column, node.end_mark.column
    line = t.lines[ln]
    if a == b:  # an empty value (`key:` with nothing after it)
        rest = line[a:].strip()
        t.replace(ln, [f"{line[:a].rstrip()} {new}" + (f" {rest}" if rest else "") + "\n"])
    else:
        t.replace(ln, [line[:a] + new + line[b:]])


def _comment_out(t: _Text, key: yaml.ScalarNode, value: yaml.Node, note: str) -> None:
    """Turn a one-line ``key: value`` entry of a block mapping into a comment that says why."""
    ln = key.start_mark.line
    if value.end_mark.line != ln or t.lines[ln][: key.start_mark.column].strip():
        raise InjectError(f"line {ln + 1}: expected {key.value}: VALUE on a line of its own")
    line = t.lines[ln].rstrip("\n")
    t.replace(ln, [f"{line[: key.start_mark.column]}# {line[key.start_mark.column :].strip()}  ({note})\n"])


# --- the input's shape -------------------------------------------------------------


@dataclass
class _Pod:
    rj_name: str
    rj: yaml.MappingNode
    job_spec: yaml.MappingNode
    spec: yaml.MappingNode
    data: dict[str, Any]

    def containers(self) -> list[dict[str, Any]]:
        return list(self.data.get("containers") or [])

    def container_node(self, name: str) -> yaml.MappingNode:
        for c in _get(self.spec, "containers").value:  # type: ignore[union-attr]
            n = _get(c, "name")
            if isinstance(n, yaml.ScalarNode) and n.value == name:
                return c  # type: ignore[return-value]
        raise KeyError(name)


def _asks_for_tpu(container: dict[str, Any]) -> bool:
    res = container.get("resources") or {}
    return any(TPU_RESOURCE in (res.get(k) or {}) for k in ("limits", "requests"))


def _has_sidecar(pod: _Pod) -> bool:
    names = {c.get("name") for c in [*(pod.data.get("initContainers") or []), *pod.containers()]}
    return SIDECAR_NAME in names


def _load(text: str) -> tuple[yaml.MappingNode, dict[str, Any]]:
    try:
        nodes = [n for n in yaml.compose_all(text, Loader=yaml.SafeLoader) if n is not None]
        datas = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise InjectError(f"not YAML: {e}") from None
    if len(nodes) != 1:
        raise InjectError(f"expected one YAML document (a JobSet), found {len(nodes)}")
    data = datas[0]
    if not isinstance(data, dict) or data.get("kind") != "JobSet":
        kind = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise InjectError(f"expected kind: JobSet (apiVersion jobset.x-k8s.io/v1alpha2), found {kind!r}")
    if data.get("apiVersion") != "jobset.x-k8s.io/v1alpha2":
        raise InjectError(f"expected apiVersion: jobset.x-k8s.io/v1alpha2, found {data.get('apiVersion')!r}")
    return nodes[0], data  # type: ignore[return-value]


def _pods(root: yaml.MappingNode, data: dict[str, Any]) -> list[_Pod]:
    rj_nodes = _get(_get(root, "spec"), "replicatedJobs")
    rjs = (data.get("spec") or {}).get("replicatedJobs")
    if not isinstance(rj_nodes, yaml.SequenceNode) or not isinstance(rjs, list) or not rjs:
        raise InjectError("expected spec.replicatedJobs: a non-empty list")
    pods = []
    for node, rj in zip(rj_nodes.value, rjs, strict=True):
        job_spec = _get(_get(node, "template"), "spec")
        spec = _get(_get(job_spec, "template"), "spec")
        pod = ((((rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")) or {}
        if not isinstance(spec, yaml.MappingNode) or not pod.get("containers"):
            raise InjectError(
                f"replicated job {rj.get('name')!r}: expected template.spec.template.spec.containers (a Job's pod)"
            )
        pods.append(_Pod(str(rj.get("name")), node, job_spec, spec, pod))  # type: ignore[arg-type]
    return pods


def _detect(pods: list[_Pod], wanted: str | None) -> tuple[str, _Pod | None, list[_Pod]]:
    head = next((p for p in pods if p.rj_name == PATHWAYS_HEAD), None)
    tpu = [p for p in pods if any(_asks_for_tpu(c) for c in p.containers())]
    names = [p.rj_name for p in pods]
    mode = wanted or (PATHWAYS if head is not None else MULTI_CONTROLLER)
    if mode == PATHWAYS:
        if head is None:
            raise InjectError(
                f"--mode pathways expects a replicated job named {PATHWAYS_HEAD!r} (xpk's Pathways JobSet); found {names}"
            )
        if len(head.containers()) != 1:
            raise InjectError(
                f"expected exactly one main container (the trainer) in {PATHWAYS_HEAD}, found "
                f"{[c.get('name') for c in head.containers()]} (a headless Pathways job has no trainer to serve)"
            )
        if not tpu:
            raise InjectError(
                f"expected a replicated job whose pods ask for {TPU_RESOURCE} (Pathways workers); found none"
            )
        return mode, head, tpu
    if mode != MULTI_CONTROLLER:
        raise InjectError(f"--mode must be one of {list(MODES)}, got {mode!r}")
    if head is not None:
        raise InjectError(f"--mode multi-controller expects no {PATHWAYS_HEAD!r} replicated job; use --mode pathways")
    if len(tpu) != 1:
        raise InjectError(
            f"expected exactly one replicated job whose pods ask for {TPU_RESOURCE} (xpk's 'slice-job'), "
            f"found {[p.rj_name for p in tpu] or 'none'} among {names}"
        )
    trainers = [c.get("name") for c in tpu[0].containers() if _asks_for_tpu(c)]
    if len(trainers) != 1:
        raise InjectError(f"expected one container asking for {TPU_RESOURCE} in {tpu[0].rj_name}, found {trainers}")
    if COORDINATOR_JOB in names:
        raise InjectError(f"a replicated job is already named {COORDINATOR_JOB!r}")
    return mode, None, tpu


def _int_field(d: dict[str, Any], key: str, where: str) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise InjectError(f"{where}.{key}: expected a positive integer, found {v!r}")
    return v


# --- what gets added -----------------------------------------------------------------


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _label(key: str) -> str:
    return f"metadata.labels['{key}']"


def _security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _secret_volume(name: str, secret: str) -> dict[str, Any]:
    # 0444: the sidecar runs as uid 65532 and the pods get no fsGroup from us; only the
    # containers that mount the volume see the file.
    return {"name": name, "secret": {"secretName": secret, "defaultMode": 0o444}}


def _mount(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "mountPath": path, "readOnly": True}


def _http_probe(path: str, period: int, failures: int, timeout: int = 1) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": C.HTTP_PORT},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _coordinator_resources(opts: InjectOptions, in_head: bool) -> dict[str, Any] | None:
    if in_head or opts.cpu_memory_quota:
        return {
            "requests": {"cpu": COORDINATOR_CPU, "memory": COORDINATOR_MEMORY},
            "limits": {"memory": COORDINATOR_MEMORY},
        }
    return None


def _worker_resources(opts: InjectOptions) -> dict[str, Any] | None:
    if opts.cpu_memory_quota:
        return {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
    return None


@dataclass(frozen=True)
class _Job:
    mode: str
    num_slices: int
    hosts_per_slice: int
    policy: dict[str, int]
    coordinator_host: str
    """``$(ES_JOB)``-relative DNS name of the coordinator's pod."""
    names: CompanionNames


def _coordinator_container(job: _Job, opts: InjectOptions, in_head: bool) -> dict[str, Any]:
    trainer_listen = (
        f"127.0.0.1:{C.TRAINER_PORT}" if job.mode == PATHWAYS else f"0.0.0.0:{C.TRAINER_PORT}"  # noqa: S104
    )
    args = [
        "coordinator",
        f"--listen=0.0.0.0:{C.COORDINATOR_PORT}",
        f"--trainer-listen={trainer_listen}",
        f"--trainer-token-file={TOKEN_DIR}/trainer/token",
        f"--num-slices={job.num_slices}",
        f"--hosts-per-slice={job.hosts_per_slice}",
        f"--elastic-min-slice-count={job.policy['elastic_min_slice_count']}",
        f"--elastic-timeout-seconds={job.policy['elastic_timeout_seconds']}",
        f"--elastic-max-retries={job.policy['elastic_max_retries']}",
        f"--state-dir={STATE_DIR}",
        f"--admin-listen=127.0.0.1:{C.ADMIN_PORT}",
        f"--http-listen=0.0.0.0:{C.HTTP_PORT}",
        f"--peer-token-file={TOKEN_DIR}/peer/token",
        "--log-format=json",
    ]
    if job.mode == MULTI_CONTROLLER:
        # One JAX process per TPU host, each with its own trainer link (docs/multi-controller.md).
        args.insert(6, f"--trainer-processes={job.num_slices * job.hosts_per_slice}")
    if opts.pubsub_subscription:
        args.append(f"--pubsub-subscription={opts.pubsub_subscription}")
    if opts.cluster_name:
        args.append(f"--cluster-name={opts.cluster_name}")
    c: dict[str, Any] = {"name": SIDECAR_NAME, "image": opts.image, "imagePullPolicy": "IfNotPresent"}
    if in_head:
        c["restartPolicy"] = "Always"
    c["args"] = args
    c["env"] = [
        _field_env("ES_JOB", _label(C.LABEL_JOBSET_NAME)),
        _field_env("ES_POD", "metadata.name"),
        _field_env("ES_NODE", "spec.nodeName"),
        # A FAILED state stays failed only within one JobSet restart attempt (--restart-attempt).
        _field_env("ES_RESTART_ATTEMPT", _label(C.LABEL_RESTART_ATTEMPT)),
        # The coordinator reads it as --admin-token-file, and so does `kubectl exec ... elastic-sidecar admin`.
        {"name": "ES_ADMIN_TOKEN_FILE", "value": f"{TOKEN_DIR}/admin/token"},
    ]
    c["ports"] = [
        {"name": "es-peer", "containerPort": C.COORDINATOR_PORT, "protocol": "TCP"},
        # Worker heartbeat datagrams (--heartbeat-datagrams, on by default).
        {"name": "es-peer-udp", "containerPort": C.COORDINATOR_PORT, "protocol": "UDP"},
        {"name": "es-http", "containerPort": C.HTTP_PORT, "protocol": "TCP"},
    ]
    if job.mode == MULTI_CONTROLLER:
        c["ports"].insert(2, {"name": "es-trainer", "containerPort": C.TRAINER_PORT, "protocol": "TCP"})
    # The startupProbe holds the trainer (a later container of the head pod) until peers are served.
    c["startupProbe"] = {"grpc": {"port": C.COORDINATOR_PORT}, "periodSeconds": 1, "failureThreshold": 60}
    c["livenessProbe"] = {"grpc": {"port": C.COORDINATOR_PORT}, "periodSeconds": 5, "timeoutSeconds": 2}
    c["livenessProbe"]["failureThreshold"] = 3
    c["readinessProbe"] = _http_probe("/readyz", 2, 3)
    res = _coordinator_resources(opts, in_head)
    if res is not None:
        c["resources"] = res
    c["securityContext"] = _security_context()
    c["volumeMounts"] = [
        {"name": "elastic-sidecar-state", "mountPath": STATE_DIR},
        {"name": "elastic-sidecar-tmp", "mountPath": "/tmp"},
        _mount("elastic-sidecar-admin-token", f"{TOKEN_DIR}/admin"),
        _mount("elastic-sidecar-peer-token", f"{TOKEN_DIR}/peer"),
        _mount("elastic-sidecar-trainer-token", f"{TOKEN_DIR}/trainer"),
    ]
    return c


def _coordinator_volumes(names: CompanionNames) -> list[dict[str, Any]]:
    return [
        # emptyDir lives as long as the pod: a coordinator container restart (crash, OOM,
        # liveness) finds its state and journal again. A new pod starts empty and rebuilds
        # its view from what the workers and the trainer report when they re-register.
        {"name": "elastic-sidecar-state", "emptyDir": {"sizeLimit": "64Mi"}},
        {"name": "elastic-sidecar-tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        *(_secret_volume(f"elastic-sidecar-{t}-token", names.secret(t)) for t in TOKENS),
    ]


def _worker_container(job: _Job, opts: InjectOptions) -> dict[str, Any]:
    args = ["worker", f"--coordinator=$(ES_COORDINATOR_HOST):{C.COORDINATOR_PORT}"]
    if job.mode == PATHWAYS:
        args += [f"--health-target=127.0.0.1:{PATHWAYS_WORKER_PORT}", f"--health-check={opts.health_check}"]
    args += [
        f"--http-listen=0.0.0.0:{C.HTTP_PORT}",
        f"--peer-token-file={TOKEN_DIR}/peer/token",
        f"--metadata-url={METADATA_URL}",
        # The node pool (= the slice, for GKE's node-pool notices) and the node's maintenance label
        # and taints come from the Kubernetes API: GET /api/v1/nodes/{name} as the pod's service
        # account (ClusterRole elastic-sidecar-get-nodes); the downward API does not show node labels.
        "--node-pool-source=kubernetes",
        "--log-format=json",
    ]
    c: dict[str, Any] = {
        "name": SIDECAR_NAME,
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "args": args,
        "env": [
            _field_env("ES_JOB", _label(C.LABEL_JOBSET_NAME)),
            _field_env("ES_SLICE", _label(C.LABEL_JOB_INDEX)),
            _field_env("ES_HOST", "metadata.annotations['batch.kubernetes.io/job-completion-index']"),
            _field_env("ES_NODE", "spec.nodeName"),
            _field_env("ES_POD", "metadata.name"),
            {"name": "ES_COORDINATOR_HOST", "value": job.coordinator_host},
        ],
        "ports": [{"name": "es-http", "containerPort": C.HTTP_PORT, "protocol": "TCP"}],
        # Only the process: it must not wait for the Pathways worker (started after it) or the coordinator.
        "startupProbe": _http_probe("/healthz", 1, 60),
        "livenessProbe": _http_probe("/healthz", 5, 3, timeout=2),
        "readinessProbe": _http_probe("/readyz", 2, 3),
    }
    res = _worker_resources(opts)
    if res is not None:
        c["resources"] = res
    c["securityContext"] = _security_context()
    c["volumeMounts"] = [
        {"name": "elastic-sidecar-tmp", "mountPath": "/tmp"},
        _mount("elastic-sidecar-peer-token", f"{TOKEN_DIR}/peer"),
    ]
    return c


def _worker_volumes(names: CompanionNames) -> list[dict[str, Any]]:
    return [
        {"name": "elastic-sidecar-tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        _secret_volume("elastic-sidecar-peer-token", names.secret("peer")),
    ]


def _trainer_env(job: _Job) -> list[dict[str, Any]]:
    address = (
        f"127.0.0.1:{C.TRAINER_PORT}"
        if job.mode == PATHWAYS
        else job.coordinator_host.replace("$(ES_JOB)", "$(ELASTIC_SIDECAR_JOB)") + f":{C.TRAINER_PORT}"
    )
    return [
        _field_env("ELASTIC_SIDECAR_JOB", _label(C.LABEL_JOBSET_NAME)),
        {"name": "ELASTIC_SIDECAR_ADDRESS", "value": address},
        {"name": "ELASTIC_SIDECAR_TOKEN_FILE", "value": f"{TOKEN_DIR}/trainer/token"},
    ]


def _trainer_pod_failure_policy(trainer: str) -> dict[str, Any]:
    return {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": trainer, "operator": "NotIn", "values": list(RESTART_EXIT_CODES)},
            }
        ]
    }


def pod_failure_action(policy: dict[str, Any] | None, container: str, code: int) -> str | None:
    """The action a Job's podFailurePolicy takes when ``container`` exits ``code`` (None: no rule matches)."""
    for rule in (policy or {}).get("rules") or []:
        on = rule.get("onExitCodes")
        if not on or on.get("containerName") not in (None, container):
            continue
        values = set(on.get("values") or [])
        if (on.get("operator") == "In") == (code in values):
            return str(rule.get("action"))
    return None


def _rewrite_entry_point(t: _Text, container: yaml.MappingNode, where: str) -> None:
    found = False
    for key in ("command", "args"):
        node = _get(container, key)
        if node is None:
            continue
        scalars = node.value if isinstance(node, yaml.SequenceNode) else [node]
        prev = None
        for s in scalars:
            if not isinstance(s, yaml.ScalarNode):
                continue
            if TRAINER_MODULE in s.value:
                found = True
            if s.value in _MODULES and prev == "-m":
                ln = s.start_mark.line
                t.replace(ln, [t.lines[ln].replace(s.value, TRAINER_MODULE, 1)])
                found = True
            elif _ENTRY_POINT.search(s.value):
                for ln in range(s.start_mark.line, s.end_mark.line + 1):
                    new = _ENTRY_POINT.sub(lambda m: f"{m.group('py')} -m {TRAINER_MODULE}", t.lines[ln])
                    if new != t.lines[ln]:
                        t.replace(ln, [new])
                        found = True
            prev = s.value
    if not found:
        raise InjectError(
            f"{where}: expected the trainer's command to start MaxText's pre-training "
            "(python3 -m MaxText.train ..., python3 -m maxtext.trainers.pre_train.train ..., or a path to "
            "MaxText/train.py) so it can be started through python3 -m trainer_hooks.maxtext; found none"
        )


_MAXTEXT_FLAGS = (*MAXTEXT_ELASTIC_DEFAULTS, "enable_checkpointing")


def _maxtext_flags(container: dict[str, Any]) -> dict[str, str]:
    """The MaxText ``key=value`` arguments inject reads, as the trainer's command writes them (the
    last one wins, as on MaxText's command line)."""
    text = " ".join(str(x) for x in [*(container.get("command") or []), *(container.get("args") or [])])
    found = {}
    for key in _MAXTEXT_FLAGS:
        values = re.findall(rf"(?<![\w.]){key}=([^\s;)'\"]*)", text)
        if values:
            found[key] = values[-1]
    return found


def _policy(flags: dict[str, str], mode: str) -> dict[str, int]:
    policy = dict(MAXTEXT_ELASTIC_DEFAULTS)
    for key in policy:
        if key in flags:
            try:
                policy[key] = int(flags[key])
            except ValueError:
                raise InjectError(
                    f"the trainer's command has {key}={flags[key]}: expected a whole number "
                    "(the coordinator needs the value itself, not a shell variable)"
                ) from None
    if mode == MULTI_CONTROLLER:
        # MaxText's elastic training needs Pathways: without it the job cannot run on fewer slices.
        policy["elastic_min_slice_count"] = -1
    return policy


def _policy_warnings(flags: dict[str, str], job: _Job) -> list[str]:
    """What the trainer's MaxText arguments make of the injected job, where it is not what a user
    adding elastic-sidecar would expect (MaxText's defaults: src/maxtext/configs/base.yml)."""
    out = []
    given = flags.get("elastic_min_slice_count")
    if job.mode == PATHWAYS and given is None:
        fix = (
            f"Add elastic_min_slice_count=K (K below {job.num_slices}) to the command to go on with K or more slices"
            if job.num_slices > 1
            else "(a job of one slice cannot shrink in any case)"
        )
        out.append(
            "the trainer's command has no elastic_min_slice_count, so the coordinator gets MaxText's default "
            "elastic_min_slice_count=-1 (wait for every slice): the injected job cannot shrink; a lost slice holds "
            f"training until it is back or elastic_timeout_seconds={job.policy['elastic_timeout_seconds']} "
            f"passes. {fix}"
        )
    elif job.mode == MULTI_CONTROLLER and given not in (None, "-1"):
        out.append(
            f"elastic_min_slice_count={given} is ignored without Pathways: the coordinator gets -1, and a lost "
            "slice ends in a checkpoint and exit 42 (a JobSet restart)"
        )
    ckpt = flags.get("enable_checkpointing")
    if ckpt is not None and yaml.safe_load(ckpt or "null") in (False, 0):
        out.append(
            f"the trainer's command sets enable_checkpointing={ckpt}: a hold cannot flush a checkpoint, and an "
            "exit 42 (the JobSet restart the sidecar asks for when the job cannot go on with the slices it has) "
            "restarts training from step 0. Set enable_checkpointing=true with a checkpoint_period"
        )
    return out


@dataclass
class _Ctx:
    """One injection under way: the text being edited, the parsed input, and what to report."""

    t: _Text
    root: yaml.MappingNode
    data: dict[str, Any]
    opts: InjectOptions
    names: CompanionNames
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    accounts: list[str] = field(default_factory=list)

    @property
    def spec_node(self) -> yaml.MappingNode:
        return _get(self.root, "spec")  # type: ignore[return-value]

    @property
    def spec(self) -> dict[str, Any]:
        return self.data["spec"]  # type: ignore[no-any-return]

    def replicated_job(self, name: str) -> dict[str, Any]:
        return next(rj for rj in self.spec["replicatedJobs"] if rj.get("name") == name)


def _check_options(opts: InjectOptions) -> None:
    mr = opts.max_restarts
    if mr is not None and (not isinstance(mr, int) or isinstance(mr, bool) or mr < 1):
        raise InjectError(
            f"max_restarts must be at least 1 (an exit 42 restarts the JobSet and counts against maxRestarts), got {mr!r}"
        )


def _name_and_namespace(t: _Text, root: yaml.MappingNode, data: dict[str, Any], opts: InjectOptions) -> CompanionNames:
    """The JobSet's name and namespace: ``metadata.namespace``, else ``--namespace``, else ``default``,
    written into the JobSet where it was absent, so that the JobSet and its companions (which name
    theirs) land in one namespace whatever kubectl's context says."""
    meta = data.get("metadata") or {}
    name = str(meta.get("name") or "")
    if not name:
        raise InjectError("expected metadata.name")
    have = meta.get("namespace")
    if have and opts.namespace and opts.namespace != have:
        raise InjectError(
            f"--namespace {opts.namespace} differs from the JobSet's metadata.namespace {have}: "
            "the companions must be in the JobSet's namespace"
        )
    namespace = str(have or opts.namespace or "default")
    if not have:
        meta_node = _get(root, "metadata")
        if not isinstance(meta_node, yaml.MappingNode):
            raise InjectError("expected metadata to be a mapping")
        _add_fields(t, meta_node, {"namespace": namespace})
    return CompanionNames(name, namespace)


def _already_injected(text: str, pods: list[_Pod], names: CompanionNames, opts: InjectOptions) -> Result | None:
    if not any(_has_sidecar(p) for p in pods) and COORDINATOR_JOB not in {p.rj_name for p in pods}:
        return None
    mode = opts.mode or (PATHWAYS if any(p.rj_name == PATHWAYS_HEAD for p in pods) else MULTI_CONTROLLER)
    accounts = [names.service_account] + [
        str(p.data["serviceAccountName"])
        for p in pods
        if p.data.get("serviceAccountName")
        and any(
            c.get("name") == SIDECAR_NAME and (c.get("args") or [None])[0] == "worker"
            for c in p.data.get("initContainers") or []
        )
    ]
    return Result(
        text,
        mode,
        names.jobset,
        names.namespace,
        changed=False,
        warnings=["already injected: output = input"],
        service_accounts=list(dict.fromkeys(accounts)),
    )


def inject(text: str, opts: InjectOptions | None = None) -> Result:
    """The JobSet in ``text`` with elastic-sidecar added (see the module docstring)."""
    opts = opts or InjectOptions()
    _check_options(opts)
    root, data = _load(text)
    pods = _pods(root, data)
    t = _Text(text)
    names = _name_and_namespace(t, root, data, opts)
    done = _already_injected(text, pods, names, opts)
    if done is not None:
        return done
    mode, head, tpu_pods = _detect(pods, opts.mode)
    ctx = _Ctx(t, root, data, opts, names, accounts=[names.service_account])
    trainer_pod = head if head is not None else tpu_pods[0]
    trainer = next(c for c in trainer_pod.containers() if mode == PATHWAYS or _asks_for_tpu(c))  # _detect: one
    flags = _maxtext_flags(trainer)
    job = _plan(ctx, mode, tpu_pods[0], flags)
    _add_workers(ctx, job, tpu_pods, trainer_pod)
    _wire_trainer(ctx, job, trainer_pod, str(trainer.get("name")))
    _restart_policy(ctx, mode)
    if head is not None:
        _add_coordinator_to_head(ctx, job, head)
    else:
        _add_coordinator_job(ctx, job, tpu_pods[0], pods)
    ctx.warnings[:0] = _policy_warnings(flags, job)
    ctx.notes += _image_notes(trainer_pod, trainer, names)
    return Result(
        t.render(),
        mode,
        names.jobset,
        names.namespace,
        changed=True,
        warnings=ctx.warnings,
        service_accounts=ctx.accounts,
        notes=ctx.notes,
    )


def _plan(ctx: _Ctx, mode: str, first_tpu: _Pod, flags: dict[str, str]) -> _Job:
    """Sizes and policy the coordinator is started with, from the TPU job and the trainer's arguments."""
    subdomain = (ctx.spec.get("network") or {}).get("subdomain") or "$(ES_JOB)"
    coordinator_rj = PATHWAYS_HEAD if mode == PATHWAYS else COORDINATOR_JOB
    rj_data = ctx.replicated_job(first_tpu.rj_name)
    job = _Job(
        mode=mode,
        num_slices=_int_field(rj_data, "replicas", f"replicatedJobs[{first_tpu.rj_name}]"),
        hosts_per_slice=_int_field(
            rj_data["template"]["spec"], "parallelism", f"replicatedJobs[{first_tpu.rj_name}].template.spec"
        ),
        policy=_policy(flags, mode),
        coordinator_host=f"$(ES_JOB)-{coordinator_rj}-0-0.{subdomain}",
        names=ctx.names,
    )

    def origin(key: str) -> str:
        if mode == MULTI_CONTROLLER and key == "elastic_min_slice_count":
            return " (no Pathways: cannot shrink)"
        return "" if key in flags else " (MaxText's default)"

    policy = " ".join(f"{k}={v}{origin(k)}" for k, v in job.policy.items())
    ctx.notes.append(
        f"{mode}: {job.num_slices} slices x {job.hosts_per_slice} hosts (replicatedJobs[{first_tpu.rj_name}]); "
        f"coordinator policy {policy}"
    )
    return job


def _add_workers(ctx: _Ctx, job: _Job, tpu_pods: list[_Pod], trainer_pod: _Pod) -> None:
    """A worker sidecar in every TPU pod, each under a service account that may get its node."""
    for pod in tpu_pods:
        _prepend_items(ctx.t, pod.spec, "initContainers", [_worker_container(job, ctx.opts)])
        volumes = _worker_volumes(ctx.names)
        if pod is trainer_pod and job.mode == MULTI_CONTROLLER:
            # The trainer (jax-tpu) mounts the trainer token in this pod.
            volumes.append(_secret_volume("elastic-sidecar-trainer-token", ctx.names.secret("trainer")))
        _prepend_items(ctx.t, pod.spec, "volumes", volumes)
        account = _ensure_service_account(ctx, pod)
        if account not in ctx.accounts:
            ctx.accounts.append(account)
    ctx.notes.append(f"worker sidecar (native, initContainers) added to {', '.join(p.rj_name for p in tpu_pods)}")


def _wire_trainer(ctx: _Ctx, job: _Job, trainer_pod: _Pod, trainer_name: str) -> None:
    """The trainer: entry point, env, token, and exit codes (restart on 42 and 127-255, fail on the
    rest: exit 3 is the operator's abort)."""
    where = f"{trainer_pod.rj_name}/{trainer_name}"
    node = trainer_pod.container_node(trainer_name)
    _rewrite_entry_point(ctx.t, node, where)
    _prepend_items(ctx.t, node, "env", _trainer_env(job))
    _prepend_items(ctx.t, node, "volumeMounts", [_mount("elastic-sidecar-trainer-token", f"{TOKEN_DIR}/trainer")])
    ctx.notes.append(
        f"{where}: MaxText's entry point now python3 -m {TRAINER_MODULE} (same arguments); "
        "env ELASTIC_SIDECAR_JOB, ELASTIC_SIDECAR_ADDRESS, ELASTIC_SIDECAR_TOKEN_FILE and the trainer token mounted"
    )
    pfp = ctx.replicated_job(trainer_pod.rj_name)["template"]["spec"].get("podFailurePolicy")
    if pfp is None:
        _add_fields(ctx.t, trainer_pod.job_spec, {"podFailurePolicy": _trainer_pod_failure_policy(trainer_name)})
        ctx.notes.append(f"{trainer_pod.rj_name}: podFailurePolicy added (restart on exit 42 and 127-255)")
        return
    for code, want in ((C.EXIT_ABORTED, "FailJob"), (C.EXIT_USAGE, "FailJob")):
        if pod_failure_action(pfp, trainer_name, code) != want:
            raise InjectError(
                f"{trainer_pod.rj_name}: podFailurePolicy must fail the Job when {trainer_name} exits {code} "
                "(xpk: FailJob unless the exit code is 42 or 127-255); it does not"
            )
    if pod_failure_action(pfp, trainer_name, C.EXIT_RESTART) == "FailJob":
        raise InjectError(f"{trainer_pod.rj_name}: podFailurePolicy fails the Job on exit 42 (must restart)")


def _add_coordinator_to_head(ctx: _Ctx, job: _Job, head: _Pod) -> None:
    _prepend_items(ctx.t, head.spec, "initContainers", [_coordinator_container(job, ctx.opts, in_head=True)])
    _prepend_items(ctx.t, head.spec, "volumes", _coordinator_volumes(ctx.names))
    # Ours where it names none: the identity Workload Identity gives the coordinator's Pub/Sub pull.
    _ensure_service_account(ctx, head, worker=False)
    ctx.notes.append(f"coordinator added as a native sidecar of {PATHWAYS_HEAD}")
    if head.data.get("hostNetwork"):
        ctx.warnings.append(
            f"{PATHWAYS_HEAD} uses hostNetwork: Workload Identity does not serve host-network pods, so the "
            "coordinator's Pub/Sub pull runs as the node's service account (see deploy/README.md)"
        )


def _add_coordinator_job(ctx: _Ctx, job: _Job, first_tpu: _Pod, pods: list[_Pod]) -> None:
    _prepend_items(ctx.t, ctx.spec_node, "replicatedJobs", [_coordinator_job(job, ctx.opts, first_tpu)])
    _exclusive_placement_per_job(ctx.t, ctx.root, ctx.data, pods)
    ctx.notes.append(f"coordinator added as replicated job {COORDINATOR_JOB}")
    if "successPolicy" not in ctx.spec:
        # Without it the JobSet would wait for the coordinator to complete too.
        _add_fields(
            ctx.t, ctx.spec_node, {"successPolicy": {"operator": "All", "targetReplicatedJobs": [first_tpu.rj_name]}}
        )
    elif not (ctx.spec["successPolicy"] or {}).get("targetReplicatedJobs"):
        raise InjectError(
            "spec.successPolicy has no targetReplicatedJobs: it would wait for the coordinator's job; "
            f"expected none or one naming {first_tpu.rj_name!r}"
        )


def _image_notes(trainer_pod: _Pod, trainer: dict[str, Any], names: CompanionNames) -> list[str]:
    """What the job needs that the file does not hold: the trainer image's packages and the Secrets."""
    image = trainer.get("image") or "the trainer's image"
    ns = names.namespace
    return [
        f"{image} ({trainer_pod.rj_name}/{trainer.get('name')}) must have {TRAINER_MODULE} importable (the "
        "elastic-sidecar-trainer package, deploy/README.md step 1) and MaxText, pathwaysutils, orbax-checkpoint "
        f"and jax within the versions it was tested with: check with docker run --rm {image} "
        f"python -m {TRAINER_MODULE} --check (exit 0: compatible)",
        f"namespace {ns}: the pods run as service account {names.service_account} (--companions or "
        f"--companions-only makes it, with its RBAC) and read the Secrets {', '.join(names.secrets)}, which no "
        f"output of inject holds but this: elastic-sidecar inject --secrets --jobset-name {names.jobset} "
        f"--namespace {ns} | kubectl create -f -",
    ]


def _ensure_service_account(ctx: _Ctx, pod: _Pod, *, worker: bool = True) -> str:
    """The pod's service account: ours where it names none (xpk: none, or an empty one); a named one
    is kept (xpk's ``xpk-sa`` serves its storage drivers) and, in a pod with a worker sidecar, must
    get the node-reading binding too."""
    ours = ctx.names.service_account
    node = _get(pod.spec, "serviceAccountName")
    value = pod.data.get("serviceAccountName")
    if node is None:
        _add_fields(ctx.t, pod.spec, {"serviceAccountName": ours})
        value = ours
    elif value in (None, ""):
        _set_scalar(ctx.t, node, ours, "serviceAccountName")
        value = ours
    elif value != ours and worker:
        ctx.warnings.append(
            f"{pod.rj_name} keeps its service account {value!r}: the worker sidecar runs as it and needs "
            f"get on nodes (ClusterRoleBinding {ctx.names.node_reader}: --companions adds it as a subject)"
        )
    if worker and pod.data.get("automountServiceAccountToken") is False:
        ctx.warnings.append(
            f"{pod.rj_name} sets automountServiceAccountToken: false: the worker sidecar cannot read its node "
            "(node-pool notices will not map to the slice)"
        )
    return str(value)


def _restart_policy(ctx: _Ctx, mode: str) -> None:
    """A ``FailJobSet`` rule on the trainer's podFailurePolicy failures, and ``maxRestarts`` at least 1.

    Any other Job failure (the trainer's exit 42: its Job has ``backoffLimit: 0``) restarts the
    JobSet while restarts are left (JobSet's failurePolicy, ``maxRestarts``); with 0 the first exit
    42 fails it.
    """
    rule: dict[str, Any] = {
        "name": "ElasticSidecarFailOnTrainerExit",
        "action": "FailJobSet",
        "onJobFailureReasons": ["PodFailurePolicy"],
    }
    if mode == PATHWAYS:
        rule["targetReplicatedJobs"] = [PATHWAYS_HEAD]
    t, spec_node, spec, opts = ctx.t, ctx.spec_node, ctx.spec, ctx.opts
    want = opts.max_restarts if opts.max_restarts is not None else DEFAULT_MAX_RESTARTS
    fp = spec.get("failurePolicy")
    fp_node = _get(spec_node, "failurePolicy")
    if fp is None:
        _add_fields(t, spec_node, {"failurePolicy": {"maxRestarts": want, "rules": [rule]}})
        return
    if not isinstance(fp_node, yaml.MappingNode):
        raise InjectError("expected spec.failurePolicy to be a mapping")
    rules = fp.get("rules") or []
    if not any(
        r.get("action") == "FailJobSet" and "PodFailurePolicy" in (r.get("onJobFailureReasons") or []) for r in rules
    ):
        _prepend_items(t, fp_node, "rules", [rule])
    if "maxRestarts" not in fp:
        _add_fields(t, fp_node, {"maxRestarts": want})
        return
    have = fp.get("maxRestarts")
    if not isinstance(have, int) or isinstance(have, bool) or have < 0:
        raise InjectError(f"spec.failurePolicy.maxRestarts: expected a non-negative integer, found {have!r}")
    if opts.max_restarts is None and have >= 1:
        return  # the JobSet's own choice
    if have != want:
        _set_scalar(t, _get(fp_node, "maxRestarts"), str(want), "spec.failurePolicy.maxRestarts")  # type: ignore[arg-type]
        if have < 1:
            ctx.warnings.append(
                f"spec.failurePolicy.maxRestarts was {have}: with it an exit 42 (restart) would fail the JobSet; "
                f"set to {want} (--max-restarts)"
            )


def _exclusive_placement_per_job(t: _Text, root: yaml.MappingNode, data: dict[str, Any], pods: list[_Pod]) -> None:
    """Move a JobSet-wide exclusive placement to the input's replicated jobs, so that JobSet does not
    also copy it to es-coordinator (whose pod would then take a CPU node pool to itself against
    every other exclusive job of its priority). Where a replicated job names its own, that one
    already wins (JobSet reads the replicated job's after the JobSet's)."""
    ann = (data.get("metadata") or {}).get("annotations") or {}
    keys = [k for k in (EXCLUSIVE_TOPOLOGY, NODE_SELECTOR_STRATEGY) if k in ann]
    if not keys:
        return
    ann_node = _get(_get(root, "metadata"), "annotations")
    if not isinstance(ann_node, yaml.MappingNode) or ann_node.flow_style:
        raise InjectError("expected metadata.annotations to be a block mapping")
    rjs = {rj.get("name"): rj for rj in data["spec"]["replicatedJobs"]}
    names = ", ".join(p.rj_name for p in pods)
    for pod in pods:
        rj_template = _get(pod.rj, "template")
        assert isinstance(rj_template, yaml.MappingNode)
        meta = _get(rj_template, "metadata")
        have = ((rjs[pod.rj_name].get("template") or {}).get("metadata") or {}).get("annotations") or {}
        add = {k: str(ann[k]) for k in keys if k not in have}
        if not add:
            continue
        if meta is None or _is_null(meta):
            if meta is not None:
                raise InjectError(f"replicated job {pod.rj_name!r}: template.metadata is empty; expected a mapping")
            _add_fields(t, rj_template, {"metadata": {"annotations": add}})
            continue
        if not isinstance(meta, yaml.MappingNode):
            raise InjectError(f"replicated job {pod.rj_name!r}: expected template.metadata to be a mapping")
        a_node = _get(meta, "annotations")
        if a_node is None:
            _add_fields(t, meta, {"annotations": add})
        elif isinstance(a_node, yaml.MappingNode) and a_node.value:
            _add_fields(t, a_node, add)
        else:
            raise InjectError(
                f"replicated job {pod.rj_name!r}: expected template.metadata.annotations to be a non-empty mapping"
            )
    for k, v in ann_node.value:
        if isinstance(k, yaml.ScalarNode) and k.value in keys:
            _comment_out(
                t, k, v, f"elastic-sidecar inject: moved to the replicated jobs {names}, not {COORDINATOR_JOB}"
            )


def _coordinator_job(job: _Job, opts: InjectOptions, tpu_pod: _Pod) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "serviceAccountName": job.names.service_account,
        # A crashed coordinator restarts in place (same pod, same emptyDir state).
        "restartPolicy": "OnFailure",
        "terminationGracePeriodSeconds": 30,
    }
    # The TPU pods' priority: a lower one would let the scheduler preempt the coordinator for
    # other pods. It does not make the pod exclusive: JobSet's exclusive placement (restricted to
    # pods of the same priority) applies only to Jobs with the annotation, which this one does
    # not get (_exclusive_placement_per_job).
    if tpu_pod.data.get("priorityClassName"):
        pod["priorityClassName"] = tpu_pod.data["priorityClassName"]
    pod["containers"] = [_coordinator_container(job, opts, in_head=False)]
    pod["volumes"] = _coordinator_volumes(job.names)
    return {
        "name": COORDINATOR_JOB,
        "replicas": 1,
        "template": {
            "spec": {
                "backoffLimit": 6,
                "completionMode": "Indexed",
                "completions": 1,
                "parallelism": 1,
                "template": {
                    "metadata": {
                        "labels": {
                            "app.kubernetes.io/name": SIDECAR_NAME,
                            "app.kubernetes.io/component": "coordinator",
                        }
                    },
                    "spec": pod,
                },
            }
        },
    }


# --- companions -------------------------------------------------------------------------


def _labels(names: CompanionNames) -> dict[str, str]:
    # `kubectl delete ... -l app.kubernetes.io/instance=JOB` finds one job's companions and Secrets.
    return {
        "app.kubernetes.io/name": SIDECAR_NAME,
        "app.kubernetes.io/part-of": SIDECAR_NAME,
        "app.kubernetes.io/instance": names.instance,
    }


def _meta(names: CompanionNames, name: str) -> dict[str, Any]:
    return {"name": name, "namespace": names.namespace, "labels": _labels(names)}


def companions(
    jobset_name: str,
    namespace: str = "default",
    *,
    podmonitoring: bool = False,
    service_accounts: list[str] | None = None,
) -> str:
    """The ServiceAccount, RBAC and NetworkPolicy one injected JobSet refers to, named after it.

    The rules of deploy/common (serviceaccount.yaml, rbac.yaml): ``get`` on nodes and nothing
    else, the one call the daemon makes (a worker reads its own node, agent/sources/node_pool.py),
    bound to every service account a worker sidecar runs as (``service_accounts``: ours, and any
    the JobSet's TPU pods keep). Each job gets its own ClusterRole and binding, so deleting one
    job's companions leaves every other job's in place. No tokens: those are ``token_secrets``,
    made straight into the cluster, never into a file kept beside the job. The PodMonitoring
    (Managed Prometheus) only with ``podmonitoring``.
    """
    names = CompanionNames(jobset_name, namespace)
    accounts = list(dict.fromkeys([names.service_account, *(service_accounts or [])]))
    cluster_meta = {"name": names.node_reader, "labels": _labels(names)}
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(names, names.service_account)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": cluster_meta,
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": dict(cluster_meta),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": names.node_reader},
            "subjects": [{"kind": "ServiceAccount", "name": a, "namespace": namespace} for a in accounts],
        },
        network_policy(jobset_name, namespace),
    ]
    if podmonitoring:
        docs.append(
            {
                "apiVersion": "monitoring.googleapis.com/v1",
                "kind": "PodMonitoring",
                "metadata": _meta(names, names.network_policy),
                "spec": {
                    "selector": {"matchLabels": {C.LABEL_JOBSET_NAME: jobset_name}},
                    "endpoints": [{"port": C.HTTP_PORT, "path": "/metrics", "interval": "30s", "timeout": "10s"}],
                },
            }
        )
    return "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)


def token_secrets(jobset_name: str, namespace: str = "default") -> str:
    """The admin, peer and trainer token Secrets of one JobSet, each with a fresh random ``token``.

    For ``kubectl create -f -`` straight from the pipe: the tokens then exist only in the cluster.
    Create, never apply: new tokens under a running job lock its sidecars out until they restart.
    """
    names = CompanionNames(jobset_name, namespace)
    docs = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": _meta(names, names.secret(t)),
            "type": "Opaque",
            "stringData": {"token": secrets.token_urlsafe(32)},
        }
        for t in TOKENS
    ]
    return "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)


def network_policy(jobset_name: str, namespace: str) -> dict[str, Any]:
    """The sidecars' unauthenticated HTTP port (/status, /metrics) only for the job's own pods.

    Peers (29310) and the trainer link (29313) carry bearer tokens and must stay reachable from
    the TPU pods, which run on the host network and so arrive from node addresses that no
    podSelector names; every other port the pods serve (Pathways' own) stays as open as before.
    Kubelet probes are always let through. A NetworkPolicy does not govern host-network pods at
    all: it protects the coordinator's pod where that pod is on the pod network (this project's
    deploy/ manifests, the multi-controller es-coordinator); for host-network pods use a VPC
    firewall rule (deploy/README.md).
    """
    job_pods = {C.LABEL_JOBSET_NAME: jobset_name}
    names = CompanionNames(jobset_name, namespace)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(names, names.network_policy),
        "spec": {
            "podSelector": {"matchLabels": dict(job_pods)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {"podSelector": {"matchLabels": dict(job_pods)}},
                        # Managed Prometheus' collectors (PodMonitoring).
                        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gmp-system"}}},
                    ],
                    "ports": [{"protocol": "TCP", "port": C.HTTP_PORT}],
                },
                {
                    "ports": [
                        {"protocol": "TCP", "port": 1, "endPort": C.HTTP_PORT - 1},
                        {"protocol": "TCP", "port": C.HTTP_PORT + 1, "endPort": 65535},
                        {"protocol": "UDP", "port": 1, "endPort": 65535},
                    ]
                },
            ],
        },
    }


def run(ns: Any) -> int:
    """The ``inject`` subcommand: the injected JobSet (and its companions), the companions alone or
    the token Secrets on stdout; on stderr what was changed and what the job needs besides."""
    r: Result | None = None
    if ns.file is not None:
        r_or_rc = _inject_file(ns)
        if isinstance(r_or_rc, int):
            return r_or_rc
        r = r_or_rc
        if ns.jobset_name and ns.jobset_name != r.jobset_name:
            return _usage(f"--jobset-name {ns.jobset_name} differs from the JobSet's metadata.name {r.jobset_name}")
        name, namespace = r.jobset_name, r.namespace
    elif not (ns.companions_only or ns.secrets):
        return _usage("give a FILE or - for standard input")
    elif not ns.jobset_name:
        return _usage("--companions-only and --secrets need --jobset-name NAME (or the JobSet's FILE)")
    else:
        name, namespace = ns.jobset_name, ns.namespace or "default"
    accounts = r.service_accounts if r is not None else None
    if ns.secrets:
        sys.stdout.write(token_secrets(name, namespace))
    elif ns.companions_only:
        sys.stdout.write(companions(name, namespace, podmonitoring=ns.podmonitoring, service_accounts=accounts))
    else:
        assert r is not None
        for note in r.notes:
            print(f"elastic-sidecar inject: {note}", file=sys.stderr)
        for w in r.warnings:
            print(f"elastic-sidecar inject: warning: {w}", file=sys.stderr)
        sys.stdout.write(r.text)
        if ns.companions:
            out = companions(name, namespace, podmonitoring=ns.podmonitoring, service_accounts=accounts)
            sys.stdout.write("---\n" + out)
    return C.EXIT_OK


def _usage(message: str) -> int:
    print(f"elastic-sidecar inject: {message}", file=sys.stderr)
    return C.EXIT_USAGE


def _inject_file(ns: Any) -> Result | int:
    """``ns.file`` injected, or the usage exit code after saying why not."""
    opts = InjectOptions(
        mode=ns.mode,
        image=ns.image,
        pubsub_subscription=ns.pubsub_subscription,
        cluster_name=ns.cluster_name,
        cpu_memory_quota=ns.cpu_memory_quota,
        max_restarts=ns.max_restarts,
        health_check=ns.health_check,
        namespace=ns.namespace,
    )
    try:
        if ns.file == "-":
            text = sys.stdin.read()
        else:
            with open(ns.file, encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        return _usage(f"cannot read {ns.file!r}: {e.strerror}")
    try:
        return inject(text, opts)
    except InjectError as e:
        return _usage(f"{ns.file}: {e}")


def _max_restarts(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(
            f"must be at least 1 (an exit 42 restarts the JobSet and counts against maxRestarts), got {n}"
        )
    if n > C.INT32_MAX:  # JobSet's maxRestarts is an int32
        raise argparse.ArgumentTypeError(f"must be at most {C.INT32_MAX}, got {text!r}")
    return n


def add_inject_args(p: Any) -> None:
    p.add_argument("file", nargs="?", metavar="FILE|-", help="the JobSet (YAML); - reads standard input")
    p.add_argument("--mode", choices=MODES, default=None, help="default: pathways if there is a pathways-head job")
    p.add_argument("--image", default=SIDECAR_NAME, help="the elastic-sidecar image (default: %(default)s)")
    p.add_argument("--pubsub-subscription", default=None, help="projects/P/subscriptions/S for the coordinator")
    p.add_argument("--cluster-name", default=None, help="only GKE notices for this cluster count")
    p.add_argument(
        "--cpu-memory-quota",
        action="store_true",
        help="the Kueue ClusterQueue covers cpu and memory for the TPU pods (xpk --cpu-limit/--memory-limit): "
        "give the sidecars requests and limits (default: none, see deploy/README.md, Kueue)",
    )
    p.add_argument(
        "--max-restarts",
        type=_max_restarts,
        default=None,
        metavar="N",
        help="the JobSet's failurePolicy.maxRestarts, at least 1: an exit 42 restarts the JobSet and counts "
        f"against it (default: the JobSet's own if 1 or more, else {DEFAULT_MAX_RESTARTS}; xpk's default is 0)",
    )
    p.add_argument("--health-check", choices=("tcp", "grpc"), default="tcp", help="how workers probe Pathways")
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--companions",
        action="store_true",
        help="also print the job's service account, RBAC and NetworkPolicy (named after the JobSet, in its "
        "namespace); no tokens: see --secrets",
    )
    which.add_argument(
        "--companions-only",
        action="store_true",
        help="print only the companions (of FILE's JobSet, or --jobset-name): > companions.yaml; "
        "kubectl create -f companions.yaml",
    )
    which.add_argument(
        "--secrets",
        action="store_true",
        help="print only the job's three token Secrets, with fresh tokens (of FILE's JobSet, or --jobset-name), "
        "for a pipe into kubectl create -f - so the tokens are in no file; create, never apply (new tokens "
        "under a running job lock its sidecars out)",
    )
    p.add_argument("--jobset-name", default=None, help="the JobSet's name, for --companions-only or --secrets")
    p.add_argument(
        "--namespace",
        default=None,
        help="the JobSet's and its companions' namespace (default: the JobSet's metadata.namespace, else default; "
        "written into the JobSet where it has none)",
    )
    p.add_argument("--podmonitoring", action="store_true", help="add a PodMonitoring (needs Managed Prometheus)")
