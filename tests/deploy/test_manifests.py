"""Static checks of the deploy manifests, the Pub/Sub set-up script and the Dockerfile.

There is no API server and no Docker engine here, so:

* every kustomization is rendered with ``kubectl kustomize`` (client only);
* built-in kinds (ServiceAccount, Role, RoleBinding, ClusterRole,
  ClusterRoleBinding, Secret, ConfigMap) and every Job and Pod template inside
  the JobSets are validated against the Kubernetes JSON schemas bundled with
  ``kubernetes-validate`` (strict: unknown fields are errors);
* the JobSets (a CRD) and the PodMonitoring get structural checks written
  from their API types;
* the elastic-sidecar containers are checked against the daemon itself: their
  arguments, with the pod's environment resolved as the kubelet would, must be
  accepted by ``agent.cli.build_parser()`` and the role's config class;
* ``deploy/pubsub/setup.sh`` runs against a stand-in ``gcloud`` first on PATH,
  so the real one is never called;
* the Dockerfile is parsed and checked instruction by instruction.

A missing tool (kubectl, bash, kubernetes-validate) fails these tests; nothing
is skipped.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import secrets as pysecrets
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate  # in the `test` extra: a missing validator must fail, not skip
import pytest
import yaml

from agent import cli, inject
from agent import constants as C
from agent.config import ConfigError, CoordinatorConfig, WorkerConfig
from tests.deploy import kueue_model
from tests.deploy.measured import assert_limit_covers, coordinator_rss

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SETUP_SH = DEPLOY / "pubsub" / "setup.sh"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"

# Every kustomization meant to be applied (deploy/common is only included by them).
KUSTOMIZATIONS = ("deploy/base", "deploy/overlays/pathways", "deploy/overlays/multi-controller")
INCLUDED_ONLY = ("deploy/common", "deploy/components/podmonitoring", "deploy/components/straggler-replace")

# Flags of `elastic-sidecar coordinator|worker` that the manifests already pass
# but that agent/config.py does not define yet (none at present: every flag the
# manifests use is implemented). A flag in the manifests must be accepted by the
# current parser or be in this list; the test below also parses their values.
PENDING_FLAGS: frozenset[str] = frozenset()


# Ports Pathways and the TPU runtime take on the host network (FACTS section 5,
# xpk's JobSets). Written out here, not imported, so a wrong constant is caught.
RESERVED_PORTS = frozenset({8080, 8471, 50051, *range(29000, 29007)})

# MaxText's real elastic flags (src/maxtext/configs/base.yml) and names that do not exist.
MAXTEXT_ELASTIC_FLAGS = ("elastic_enabled", "elastic_min_slice_count", "elastic_timeout_seconds", "elastic_max_retries")
MAXTEXT_KNOWN_ELASTIC_KEYS = frozenset({*MAXTEXT_ELASTIC_FLAGS, "elastic_backup_kind"})
INVENTED_MAXTEXT_FLAGS = frozenset({"dynamic_loading", "recovery"})

# The PriorityClasses xpk creates (src/xpk/templates/kueue_config.yaml.j2).
XPK_PRIORITY_CLASSES = frozenset({"very-low", "low", "medium", "high", "very-high"})


SIDECAR_IMAGE = "elastic-sidecar"
SIDECAR_UID = 65532
TRAINER_COMMAND = ["python", "-m", "trainer_hooks.maxtext"]

# Oldest Kubernetes with native sidecars on by default, and the newest schema bundled.
SCHEMA_VERSIONS = ("1.29.0", max(kubernetes_validate.utils.all_versions(), key=lambda v: tuple(map(int, v.split(".")))))
SCHEMA_KINDS = frozenset(
    {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Secret",
        "ConfigMap",
        "NetworkPolicy",
    }
)
# PodMonitoring is an optional component (deploy/components/podmonitoring): without Managed
# Prometheus its CRD is missing and `kubectl apply -k` would fail partway.
EXPECTED_KINDS = SCHEMA_KINDS | {"JobSet"}

# JobSet v1alpha2 API (sigs.k8s.io/jobset api/jobset/v1alpha2/jobset_types.go).
JOBSET_SPEC_FIELDS = frozenset(
    {
        "replicatedJobs",
        "network",
        "successPolicy",
        "failurePolicy",
        "startupPolicy",
        "suspend",
        "coordinator",
        "managedBy",
        "ttlSecondsAfterFinished",
        "volumeClaimPolicies",
    }
)
REPLICATED_JOB_FIELDS = frozenset({"name", "groupName", "template", "replicas", "dependsOn"})
FAILURE_POLICY_FIELDS = frozenset({"maxRestarts", "restartStrategy", "rules"})
FAILURE_RULE_FIELDS = frozenset(
    {"name", "action", "onJobFailureReasons", "onJobFailureMessagePatterns", "targetReplicatedJobs"}
)
FAILURE_ACTIONS = frozenset(
    {"FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts", "RestartJob", "RestartJobAndIgnoreMaxRestarts"}
)
RESTART_ACTIONS = FAILURE_ACTIONS - {"FailJobSet"}
FAILURE_RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
NETWORK_FIELDS = frozenset({"enableDNSHostnames", "subdomain", "publishNotReadyAddresses"})

# Downward API fields an env var may reference (Kubernetes docs, "Downward API").
DOWNWARD_ENV_FIELDS = re.compile(
    r"^(metadata\.(name|namespace|uid)|metadata\.(labels|annotations)\['[^']+'\]"
    r"|spec\.(nodeName|serviceAccountName)|status\.(hostIP|hostIPs|podIP|podIPs))$"
)

# Strings no file may contain: package-registry hosts and index options, and
# paths of the machine these files were written on (pieces joined so that this
# file does not match itself).
FORBIDDEN_TEXT = (
    "pypi" + ".org",
    "pythonhosted" + ".org",
    "registry.npmjs" + ".org",
    "deb.debian" + ".org",
    "--index" + "-url",
    "--extra-index" + "-url",
    "/wo" + "rk/",
    "/ro" + "ot/",
)


# --------------------------------------------------------------------------
# rendering and walking the manifests
# --------------------------------------------------------------------------


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` is not on PATH; these tests need it (they never skip)")
    return path


@functools.cache
def render(kustomization: str) -> tuple[dict[str, Any], ...]:
    proc = subprocess.run(
        [_tool("kubectl"), "kustomize", str(REPO / kustomization)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"kubectl kustomize {kustomization} failed:\n{proc.stderr}"
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    assert docs, f"{kustomization} rendered nothing"
    return docs


def of_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def by_name(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in of_kind(docs, kind)}


@dataclass
class Pod:
    """One pod template of a replicated job of a JobSet."""

    kustomization: str
    docs: tuple[dict[str, Any], ...]
    jobset: dict[str, Any]
    rjob: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.kustomization}: JobSet {self.jobset['metadata']['name']} / {self.rjob['name']}"

    @property
    def job_spec(self) -> dict[str, Any]:
        return self.rjob["template"]["spec"]

    @property
    def template(self) -> dict[str, Any]:
        return self.job_spec["template"]

    @property
    def spec(self) -> dict[str, Any]:
        return self.template["spec"]

    @property
    def labels(self) -> dict[str, str]:
        return self.template.get("metadata", {}).get("labels", {})

    @property
    def init_containers(self) -> list[dict[str, Any]]:
        return self.spec.get("initContainers", [])

    @property
    def containers(self) -> list[dict[str, Any]]:
        return self.spec.get("containers", [])

    def all_containers(self) -> list[dict[str, Any]]:
        return [*self.init_containers, *self.containers]

    @property
    def tpu(self) -> bool:
        """A TPU pod: some container asks for google.com/tpu."""
        return any(kueue_model.TPU in (c.get("resources") or {}).get("limits", {}) for c in self.containers)

    def volume(self, name: str) -> dict[str, Any]:
        vols = {v["name"]: v for v in self.spec.get("volumes", [])}
        assert name in vols, f"{self.where}: volume {name!r} is mounted but not defined"
        return vols[name]

    # --- the pod's environment as the kubelet would resolve it ---------------

    def field_value(self, path: str) -> str:
        assert DOWNWARD_ENV_FIELDS.match(path), f"{self.where}: {path!r} is not a downward API env field"
        js = self.jobset["metadata"]["name"]
        coord = self.jobset["spec"].get("coordinator", {}).get("replicatedJob")
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if m:
            key = m.group(2)
            values = {
                C.LABEL_JOBSET_NAME: js,
                "jobset.sigs.k8s.io/replicatedjob-name": self.rjob["name"],
                "jobset.sigs.k8s.io/replicatedjob-replicas": str(self.rjob.get("replicas", 1)),
                C.LABEL_JOB_INDEX: "1",
                "jobset.sigs.k8s.io/job-global-index": "1",
                C.LABEL_RESTART_ATTEMPT: "0",
                "batch.kubernetes.io/job-completion-index": "0",
            }
            if coord:
                values["jobset.sigs.k8s.io/coordinator"] = f"{js}-{coord}-0-0.{js}"
            values.update(self.labels if m.group(1) == "labels" else {})
            assert key in values, f"{self.where}: {path} is not set on JobSet pods"
            return values[key]
        return {
            "metadata.name": f"{js}-{self.rjob['name']}-1-0-abcde",
            "metadata.namespace": self.jobset["metadata"].get("namespace", "default"),
            "metadata.uid": "00000000-0000-0000-0000-000000000000",
            "spec.nodeName": "gke-test-tpu-np-1-abcd-0",
            "spec.serviceAccountName": self.spec.get("serviceAccountName", "default"),
            "status.hostIP": "192.0.2.10",
            "status.hostIPs": "192.0.2.10",
            "status.podIP": "192.0.2.11",
            "status.podIPs": "192.0.2.11",
        }[path]

    def env(self, container: dict[str, Any]) -> dict[str, str]:
        configmaps = by_name(self.docs, "ConfigMap")
        secrets = by_name(self.docs, "Secret")
        env: dict[str, str] = {}
        for src in container.get("envFrom", []):
            if "configMapRef" in src:
                name = src["configMapRef"]["name"]
                assert name in configmaps, f"{self.where}: envFrom ConfigMap {name!r} is not in the rendering"
                env.update({src.get("prefix", "") + k: v for k, v in configmaps[name].get("data", {}).items()})
        for e in container.get("env", []):
            name = e["name"]
            if "value" in e:
                env[name] = expand(str(e["value"]), env)
                continue
            ref = e.get("valueFrom", {})
            if "fieldRef" in ref:
                env[name] = self.field_value(ref["fieldRef"]["fieldPath"])
            elif "configMapKeyRef" in ref:
                cm, key = ref["configMapKeyRef"]["name"], ref["configMapKeyRef"]["key"]
                assert cm in configmaps, f"{self.where}: env {name} reads ConfigMap {cm!r}, not in the rendering"
                assert key in configmaps[cm].get("data", {}), f"{self.where}: env {name}: ConfigMap {cm} has no {key!r}"
                env[name] = configmaps[cm]["data"][key]
            elif "secretKeyRef" in ref:
                s = ref["secretKeyRef"]["name"]
                assert s in secrets, f"{self.where}: env {name} reads Secret {s!r}, not in the rendering"
                env[name] = "secret"
            else:
                pytest.fail(f"{self.where}: env {name} has an unsupported source {ref}")
        return env

    def args(self, container: dict[str, Any]) -> list[str]:
        env = self.env(container)
        return [expand(a, env) for a in [*container.get("command", []), *container.get("args", [])]]


_VAR_REF = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_]*)\))")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, undefined ones kept, $$ is a literal $."""

    def sub(m: re.Match[str]) -> str:
        if m.group(1) == "$":
            return "$"
        return env.get(m.group(2), m.group(0))

    return _VAR_REF.sub(sub, text)


def pods(kustomization: str) -> list[Pod]:
    docs = render(kustomization)
    return [Pod(kustomization, docs, js, rj) for js in of_kind(docs, "JobSet") for rj in js["spec"]["replicatedJobs"]]


def all_pods() -> list[Pod]:
    return [p for k in KUSTOMIZATIONS for p in pods(k)]


def image_name(image: str) -> str:
    """Last path component without tag or digest: REG/PATH/NAME:TAG@sha256:... -> NAME."""
    last = image.split("@")[0].rsplit("/", 1)[-1]
    return last.split(":")[0]


def is_sidecar(container: dict[str, Any]) -> bool:
    return container.get("name") == SIDECAR_IMAGE or image_name(container.get("image", "")) == SIDECAR_IMAGE


def sidecars() -> Iterator[tuple[Pod, dict[str, Any]]]:
    for pod in all_pods():
        for c in pod.all_containers():
            if is_sidecar(c):
                yield pod, c


def role(pod: Pod, c: dict[str, Any]) -> str:
    args = c.get("args", [])
    assert args and args[0] in ("coordinator", "worker"), f"{pod.where}: elastic-sidecar args must start with the role"
    return args[0]


def flag_values(pod: Pod, c: dict[str, Any]) -> dict[str, str]:
    """--flag=value pairs of a sidecar, with the pod's environment expanded."""
    out: dict[str, str] = {}
    for a in pod.args(c)[1:]:
        assert a.startswith("--") and "=" in a, (
            f"{pod.where}: sidecar argument {a!r} should be --flag=value (one list item per flag)"
        )
        k, _, v = a.partition("=")
        assert k not in out, f"{pod.where}: {k} given twice"
        out[k] = v
    return out


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def host_of(address: str) -> str:
    return address.rpartition(":")[0]


def coordinator_pod(pod: Pod) -> tuple[Pod, dict[str, Any]]:
    found = [
        (p, c)
        for p in pods(pod.kustomization)
        if p.jobset is pod.jobset
        for c in p.all_containers()
        if is_sidecar(c) and role(p, c) == "coordinator"
    ]
    assert len(found) == 1, f"{pod.where}: expected exactly one coordinator sidecar in the JobSet, found {len(found)}"
    return found[0]


def trainer_containers(pod: Pod) -> list[dict[str, Any]]:
    return [c for c in pod.containers if c.get("command", [])[:3] == TRAINER_COMMAND or c["name"] == "jax-tpu"]


def maxtext_args(pod: Pod, c: dict[str, Any]) -> dict[str, str]:
    args = pod.args(c)[len(TRAINER_COMMAND) :]
    out: dict[str, str] = {}
    for a in args:
        assert "=" in a and not a.startswith("-"), f"{pod.where}: MaxText argument {a!r} should be key=value"
        k, _, v = a.partition("=")
        out[k] = v
    return out


def cpu(q: str | int | float) -> float:
    s = str(q)
    return float(s[:-1]) / 1000 if s.endswith("m") else float(s)


_MEM_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def memory(q: str | int) -> int:
    s = str(q)
    for unit, factor in sorted(_MEM_UNITS.items(), key=lambda kv: -len(kv[0])):
        if s.endswith(unit):
            return int(float(s[: -len(unit)]) * factor)
    return int(s)


# --------------------------------------------------------------------------
# rendering and schemas
# --------------------------------------------------------------------------


def test_every_kustomization_is_covered() -> None:
    found = {str(p.parent.relative_to(REPO)) for p in DEPLOY.rglob("kustomization.yaml")}
    assert found == set(KUSTOMIZATIONS) | set(INCLUDED_ONLY), (
        f"kustomizations under deploy/ changed: {sorted(found)}; add new ones to KUSTOMIZATIONS"
    )


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_renders_with_expected_kinds(kustomization: str) -> None:
    docs = render(kustomization)
    kinds = {d["kind"] for d in docs}
    assert kinds == EXPECTED_KINDS, f"{kustomization}: kinds {sorted(kinds)}"
    assert len(of_kind(docs, "JobSet")) == 1
    ids = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(ids) == len(set(ids)), f"{kustomization}: duplicate objects"
    for d in docs:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"].get("namespace"), (
                f"{kustomization}: {d['kind']} {d['metadata']['name']} has no namespace"
            )


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_core_kinds_match_kubernetes_schema(kustomization: str, version: str) -> None:
    checked = 0
    for d in render(kustomization):
        if d["kind"] in SCHEMA_KINDS:
            _validate(d, version, f"{kustomization}: {d['kind']} {d['metadata']['name']}")
            checked += 1
    assert checked >= 6  # ServiceAccount, ClusterRole(Binding), 2 Secrets, ConfigMap


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_job_and_pod_templates_match_kubernetes_schema(kustomization: str, version: str) -> None:
    for pod in pods(kustomization):
        meta = {"name": f"{pod.jobset['metadata']['name']}-{pod.rjob['name']}-0"}
        job_meta = {**meta, **pod.rjob["template"].get("metadata", {})}
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta, "spec": pod.job_spec}
        _validate(job, version, f"{pod.where} (as a batch/v1 Job)")
        pod_obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**meta, **pod.template.get("metadata", {})},
            "spec": pod.spec,
        }
        _validate(pod_obj, version, f"{pod.where} (pod template as a v1 Pod)")


def _validate(obj: dict[str, Any], version: str, what: str) -> None:
    problem = None
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = "/".join(str(p) for p in e.absolute_path)
        problem = f"{what} fails the Kubernetes {version} schema at /{path}: {e.message}"
    if problem:
        pytest.fail(problem, pytrace=False)


# --------------------------------------------------------------------------
# JobSet structure
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_jobset_structure(kustomization: str) -> None:
    (js,) = of_kind(render(kustomization), "JobSet")
    where = f"{kustomization}: JobSet {js['metadata']['name']}"
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2", where
    assert js["metadata"]["labels"].get("kueue.x-k8s.io/queue-name"), f"{where}: no Kueue queue label"
    spec = js["spec"]
    assert set(spec) <= JOBSET_SPEC_FIELDS, f"{where}: unknown spec fields {set(spec) - JOBSET_SPEC_FIELDS}"
    assert set(spec.get("network", {})) <= NETWORK_FIELDS, where
    names = [rj["name"] for rj in spec["replicatedJobs"]]
    assert len(names) == len(set(names)), where
    for rj in spec["replicatedJobs"]:
        assert set(rj) <= REPLICATED_JOB_FIELDS, (
            f"{where}: unknown replicatedJob fields {set(rj) - REPLICATED_JOB_FIELDS}"
        )
        assert isinstance(rj.get("replicas", 1), int) and rj.get("replicas", 1) >= 1, where
        job = rj["template"]["spec"]
        assert job.get("completionMode") == "Indexed", f"{where}/{rj['name']}: pods need JOB_COMPLETION_INDEX"
        assert job["parallelism"] == job["completions"], f"{where}/{rj['name']}: all hosts of a slice run together"
    coord = spec.get("coordinator", {}).get("replicatedJob")
    assert coord in names, f"{where}: spec.coordinator must name a replicated job"
    assert spec["network"].get("enableDNSHostnames") is True, f"{where}: pods are reached by DNS name"
    for target in spec.get("successPolicy", {}).get("targetReplicatedJobs", []):
        assert target in names, where
    if spec.get("startupPolicy", {}).get("startupPolicyOrder") == "InOrder":
        assert names[0] == coord, f"{where}: with InOrder start-up the coordinator's job must come first"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_failure_policy_restarts_on_exit_42_and_fails_on_abort(kustomization: str) -> None:
    """xpk's rule: restart on 42 and 127-255, fail on anything else (3 is `admin abort`)."""
    (js,) = of_kind(render(kustomization), "JobSet")
    where = f"{kustomization}: JobSet failurePolicy"
    fp = js["spec"]["failurePolicy"]
    assert set(fp) <= FAILURE_POLICY_FIELDS, where
    assert isinstance(fp.get("maxRestarts"), int) and fp["maxRestarts"] >= 1, f"{where}: maxRestarts must be >= 1"
    rjobs = {rj["name"]: rj for rj in js["spec"]["replicatedJobs"]}
    for rule in fp.get("rules", []):
        assert set(rule) <= FAILURE_RULE_FIELDS, f"{where}: unknown rule fields {set(rule) - FAILURE_RULE_FIELDS}"
        assert FAILURE_RULE_NAME.match(rule["name"]), f"{where}: bad rule name {rule['name']!r}"
        assert rule["action"] in FAILURE_ACTIONS, f"{where}: unknown action {rule['action']!r}"
        assert set(rule.get("targetReplicatedJobs") or rjobs) <= set(rjobs), where

    def jobset_action(rj_name: str, code: int) -> str:
        """What the JobSet does when the trainer of ``rj_name`` exits ``code`` (backoffLimit 0)."""
        job = rjobs[rj_name]["template"]["spec"]
        assert job.get("backoffLimit") == 0, f"{where}: the trainer's Job must fail on its first failure"
        reason = "PodFailurePolicy" if inject.pod_failure_action(job.get("podFailurePolicy"), "jax-tpu", code) else None
        reason = reason or "BackoffLimitExceeded"
        for rule in fp.get("rules", []):
            if rj_name in (rule.get("targetReplicatedJobs") or rjobs) and reason in rule.get(
                "onJobFailureReasons", [reason]
            ):
                assert not rule.get("onJobFailureMessagePatterns"), where
                return str(rule["action"])
        return "RestartJobSet"  # JobSet's default when no rule matches

    trainer_jobs = [
        n for n, rj in rjobs.items() if "jax-tpu" in str(rj["template"]["spec"]["template"]["spec"]["containers"])
    ]
    assert trainer_jobs, where
    for rj_name in trainer_jobs:
        for code in (C.EXIT_RESTART, 127, 137, 143, 255):
            assert jobset_action(rj_name, code) in RESTART_ACTIONS, f"{where}: exit {code} must restart the JobSet"
        for code in (C.EXIT_ABORTED, C.EXIT_USAGE, 1, 4, 126):
            assert jobset_action(rj_name, code) == "FailJobSet", f"{where}: exit {code} must fail the JobSet"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_pod_failure_policies_are_valid(kustomization: str) -> None:
    for pod in pods(kustomization):
        pfp = pod.job_spec.get("podFailurePolicy")
        if pfp is None:
            continue
        assert pod.spec.get("restartPolicy") == "Never", f"{pod.where}: podFailurePolicy needs restartPolicy Never"
        names = {c["name"] for c in pod.all_containers()}
        for rule in pfp["rules"]:
            codes = rule.get("onExitCodes")
            if codes:
                values = codes["values"]
                assert values == sorted(set(values)), f"{pod.where}: exit codes must be sorted and unique"
                assert not (codes["operator"] == "In" and 0 in values), f"{pod.where}: 0 is not allowed with In"
                assert codes.get("containerName", next(iter(names))) in names, f"{pod.where}: unknown containerName"
            for cond in rule.get("onPodConditions", []):
                assert cond.get("status") in ("True", "False", "Unknown"), f"{pod.where}: onPodConditions need a status"


def test_pathways_variant_matches_xpk_layout() -> None:
    for kustomization in ("deploy/base", "deploy/overlays/pathways"):
        by = {p.rjob["name"]: p for p in pods(kustomization)}
        assert set(by) == {"pathways-head", "worker"}, kustomization
        head, worker = by["pathways-head"], by["worker"]
        assert head.rjob.get("replicas", 1) == 1
        assert [c["name"] for c in head.containers] == ["jax-tpu"]
        inits = {c["name"]: c for c in head.init_containers}
        assert {"pathways-proxy", "pathways-rm", "elastic-sidecar"} <= set(inits), kustomization
        for c in inits.values():
            assert c.get("restartPolicy") == "Always", f"{head.where}: {c['name']} must be a native sidecar"
        head_env = head.env(head.containers[0])
        assert head_env.get("JAX_PLATFORMS") == "proxy"
        assert worker.spec.get("hostNetwork") is True, f"{worker.where}: TPU workers use the host network"
        assert worker.spec.get("dnsPolicy") == "ClusterFirstWithHostNet", worker.where
        pw = {c["name"]: c for c in worker.containers}["pathways-worker"]
        assert 29005 in {p["containerPort"] for p in pw["ports"]}
        rm_args = head.args(inits["pathways-rm"])
        (instances,) = [a.split("=", 1)[1] for a in rm_args if a.startswith("--instance_count=")]
        assert int(instances) == worker.rjob["replicas"], f"{kustomization}: Pathways instance_count != worker replicas"
        (itype,) = [a.split("=", 1)[1] for a in rm_args if a.startswith("--instance_type=")]
        topology = worker.spec["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
        assert itype.endswith(":" + topology), f"{kustomization}: instance type {itype} vs node topology {topology}"


def test_multi_controller_variant_has_no_pathways() -> None:
    by = {p.rjob["name"]: p for p in pods("deploy/overlays/multi-controller")}
    assert set(by) == {"coordinator", "slice"}
    for pod in by.values():
        for c in pod.all_containers():
            assert "pathways" not in c["name"] and "pathways" not in c["image"], f"{pod.where}: {c['name']}"
    sl = by["slice"]
    assert sl.spec.get("hostNetwork") is True
    (trainer,) = trainer_containers(sl)
    assert sl.env(trainer).get("JAX_PLATFORMS") != "proxy"
    # One trainer link per JAX process: the coordinator expects every host's process.
    coord = by["coordinator"]
    (daemon,) = [c for c in coord.all_containers() if is_sidecar(c)]
    flags = dict(a.split("=", 1) for a in coord.args(daemon) if a.startswith("--") and "=" in a)
    hosts = int(sl.rjob.get("replicas", 1)) * int(sl.rjob["template"]["spec"]["parallelism"])
    assert int(flags["--num-slices"]) * int(flags["--hosts-per-slice"]) == hosts
    assert int(flags["--trainer-processes"]) == hosts


# --------------------------------------------------------------------------
# the elastic-sidecar containers
# --------------------------------------------------------------------------


def test_every_pod_has_a_sidecar_and_every_jobset_one_coordinator() -> None:
    for pod in all_pods():
        found = [c for c in pod.all_containers() if is_sidecar(c)]
        assert len(found) == 1, f"{pod.where}: expected one elastic-sidecar container, found {len(found)}"
        coordinator_pod(pod)


def test_sidecars_are_native_sidecars() -> None:
    for pod, c in sidecars():
        others = [x for x in pod.all_containers() if x is not c]
        if not others:
            # The multi-controller coordinator's pod: the daemon is the pod's only
            # (main) container; nothing to run beside.
            assert c in pod.containers, pod.where
            continue
        assert c in pod.init_containers, f"{pod.where}: elastic-sidecar must be an initContainer (native sidecar)"
        assert c.get("restartPolicy") == "Always", f"{pod.where}: elastic-sidecar needs restartPolicy: Always"


def test_sidecar_identity_comes_from_the_downward_api() -> None:
    expected_worker = {
        "ES_SLICE": f"metadata.labels['{C.LABEL_JOB_INDEX}']",
        "ES_HOST": "metadata.annotations['batch.kubernetes.io/job-completion-index']",
        "ES_NODE": "spec.nodeName",
        "ES_POD": "metadata.name",
        "ES_JOB": f"metadata.labels['{C.LABEL_JOBSET_NAME}']",
    }
    for pod, c in sidecars():
        refs = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c.get("env", [])}
        wanted = expected_worker if role(pod, c) == "worker" else {"ES_JOB": expected_worker["ES_JOB"]}
        for name, path in wanted.items():
            assert refs.get(name) == path, f"{pod.where}: env {name} should come from {path}, got {refs.get(name)}"
        pod.env(c)  # every reference resolves


def test_sidecar_flags_are_known_to_the_daemon() -> None:
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for pod, c in sidecars():
        r = role(pod, c)
        known = set(sub.choices[r]._option_string_actions)
        for flag in flag_values(pod, c):
            assert flag in known or flag in PENDING_FLAGS, (
                f"{pod.where}: `elastic-sidecar {r} {flag}` is neither accepted by agent.cli.build_parser() "
                f"nor in PENDING_FLAGS"
            )


def test_sidecar_arguments_parse_with_the_daemon(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The container's command line, with its environment, is what the daemon accepts."""
    checked = 0
    for n, (pod, c) in enumerate(sidecars()):
        r = role(pod, c)
        env = pod.env(c)
        values = {k: _local_path(pod, c, v, tmp_path / str(n)) for k, v in flag_values(pod, c).items()}
        for k in list(os.environ):
            if k.startswith("ES_") or k in ("NODE_NAME", "POD_NAME"):
                monkeypatch.delenv(k)
        for k, v in env.items():
            if k.startswith("ES_") and k.endswith("_FILE"):
                v = _local_path(pod, c, v, tmp_path / str(n))
            monkeypatch.setenv(k, v)
        parser = cli.build_parser()  # ES_* defaults are read when the parser is built
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        known = set(sub.choices[r]._option_string_actions)
        argv = [r] + [f"{k}={v}" for k, v in values.items() if k in known]
        for a in argv[1:]:
            assert "$(" not in a, f"{pod.where}: unresolved variable in {a!r}"
        try:
            ns = parser.parse_args(argv)
            cfg = (CoordinatorConfig if r == "coordinator" else WorkerConfig).from_args(ns)
        except SystemExit:
            pytest.fail(f"{pod.where}: elastic-sidecar refused {argv}")
        except ConfigError as e:
            pytest.fail(f"{pod.where}: elastic-sidecar {r} configuration refused: {e}")
        assert cfg.job == pod.jobset["metadata"]["name"], f"{pod.where}: the sidecar must know its JobSet's name"
        if isinstance(cfg, WorkerConfig):
            assert (cfg.slice, cfg.host) == (1, 0) and cfg.node and cfg.pod, f"{pod.where}: identity not taken from env"
        checked += 1
    assert checked >= 5


def _local_path(pod: Pod, c: dict[str, Any], value: str, root: Path) -> str:
    """Map a path inside one of the container's volume mounts to a directory here.

    Secret mounts get their keys as files holding a generated token (not the
    repository's placeholder), so a daemon that reads or checks its token files
    at start-up sees what a real deploy gives it.
    """
    for m in sorted(c.get("volumeMounts", []), key=lambda m: -len(m["mountPath"])):
        mount = m["mountPath"].rstrip("/")
        if value != mount and not value.startswith(mount + "/"):
            continue
        local = root / mount.lstrip("/")
        local.mkdir(parents=True, exist_ok=True)
        vol = pod.volume(m["name"])
        if "secret" in vol:
            secret = by_name(pod.docs, "Secret")[vol["secret"]["secretName"]]
            for key in {**secret.get("stringData", {}), **secret.get("data", {})}:
                (local / key).write_text(pysecrets.token_hex(32))
        return str(local) + value[len(mount) :]
    return value


def test_sidecar_ports_avoid_pathways_and_tpu_ports() -> None:
    assert RESERVED_PORTS <= C.PATHWAYS_RESERVED_PORTS
    for port in (C.COORDINATOR_PORT, C.ADMIN_PORT, C.HTTP_PORT):
        assert port not in RESERVED_PORTS
    for pod, c in sidecars():
        values = flag_values(pod, c)
        ports = {p["containerPort"] for p in c.get("ports", [])}
        for flag, expected in (
            ("--listen", C.COORDINATOR_PORT),
            ("--admin-listen", C.ADMIN_PORT),
            ("--http-listen", C.HTTP_PORT),
        ):
            if flag in values:
                assert port_of(values[flag]) == expected, f"{pod.where}: {flag} should use port {expected}"
                ports.add(port_of(values[flag]))
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            p = c.get(probe, {})
            ports.add(int((p.get("grpc") or p.get("httpGet") or p.get("tcpSocket"))["port"]))
        clash = ports & RESERVED_PORTS
        assert not clash, f"{pod.where}: elastic-sidecar uses ports {sorted(clash)} that Pathways/TPU hosts use"
        if "--admin-listen" in values:
            assert host_of(values["--admin-listen"]) in ("127.0.0.1", "[::1]", "localhost"), (
                f"{pod.where}: the admin API must stay on loopback"
            )


def test_volume_mounts_and_secret_volumes_resolve() -> None:
    for pod in all_pods():
        for c in pod.all_containers():
            for m in c.get("volumeMounts", []):
                pod.volume(m["name"])
        secrets = by_name(pod.docs, "Secret")
        for v in pod.spec.get("volumes", []):
            if "secret" in v:
                assert v["secret"]["secretName"] in secrets, f"{pod.where}: Secret {v['secret']['secretName']} missing"


def test_no_port_is_declared_twice_in_a_pod() -> None:
    for pod in all_pods():
        seen: dict[tuple[int, str], str] = {}
        for c in pod.all_containers():
            for p in c.get("ports", []):
                port = (p["containerPort"], p.get("protocol", "TCP"))
                assert port not in seen, f"{pod.where}: port {port} declared by {seen[port]} and {c['name']}"
                seen[port] = c["name"]


def test_the_coordinator_declares_its_heartbeat_datagram_port() -> None:
    """Workers send UDP heartbeats to the --listen port (agent/sources/heartbeat_datagrams.py)."""
    found = 0
    for pod, c in sidecars():
        if role(pod, c) != "coordinator":
            continue
        values = flag_values(pod, c)
        if values.get("--heartbeat-datagrams", "on") == "off":
            continue
        udp = {p["containerPort"] for p in c.get("ports", []) if p.get("protocol") == "UDP"}
        assert port_of(values["--listen"]) in udp, f"{pod.where}: no UDP port for the heartbeat datagrams"
        found += 1
    assert found >= 2


def test_sidecar_probes() -> None:
    for pod, c in sidecars():
        r = role(pod, c)
        values = flag_values(pod, c)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert probe in c, f"{pod.where}: elastic-sidecar {r} has no {probe}"
        http = values.get("--http-listen")
        assert http, f"{pod.where}: probes need --http-listen"
        assert host_of(http) in ("0.0.0.0", "[::]"), f"{pod.where}: the kubelet probes the pod IP, not loopback"
        ready = c["readinessProbe"].get("httpGet", {})
        assert (ready.get("path"), ready.get("port")) == ("/readyz", port_of(http)), f"{pod.where}: readiness"
        start = c["startupProbe"]
        # The startup probe holds the pod's main containers: it must not wait for
        # them (the local Pathways worker) or for the coordinator.
        assert start.get("httpGet", {}).get("path") != "/readyz", f"{pod.where}: startupProbe must not use /readyz"
        if r == "coordinator":
            listen = values["--listen"]
            assert host_of(listen) in ("0.0.0.0", "[::]"), f"{pod.where}: workers and probes reach --listen"
            assert c["livenessProbe"].get("grpc", {}).get("port") == port_of(listen), f"{pod.where}: gRPC liveness"
        else:
            live = c["livenessProbe"].get("httpGet", {})
            assert (live.get("path"), live.get("port")) == ("/healthz", port_of(http)), f"{pod.where}: liveness"


def test_sidecar_resources_fit_kueue_and_the_measured_load() -> None:
    """TPU pods: no cpu/memory at all (Kueue); the coordinator: room for the measured RSS."""
    for pod, c in sidecars():
        res = c.get("resources", {})
        asked = set(res.get("requests", {})) | set(res.get("limits", {}))
        if pod.tpu:
            assert not asked & {"cpu", "memory"}, f"{pod.where}: cpu/memory on a TPU pod's sidecar: {res}"
        elif role(pod, c) == "coordinator" and pod.rjob["name"] == "pathways-head":
            assert_limit_covers(memory(res["limits"]["memory"]), coordinator_rss(), pod.where)
            assert memory(res["requests"]["memory"]) == memory(res["limits"]["memory"]), pod.where
            assert "cpu" not in res.get("limits", {}), f"{pod.where}: a cpu limit throttles re-registration bursts"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_kueue_admits_every_pod_set_on_an_xpk_cluster(kustomization: str) -> None:
    pathways = kustomization != "deploy/overlays/multi-controller"
    groups = kueue_model.xpk_cluster_queue(pathways=pathways)
    for pod in pods(kustomization):
        a = kueue_model.admit(pod.spec, groups)
        assert a.admissible, f"{pod.where}: {a.reason}"
        if pod.tpu:
            assert kueue_model.schedulable_on_tpu_pool(a), f"{pod.where}: pinned to {a.node_selector}"


def test_every_pod_has_a_priority_class() -> None:
    for pod in all_pods():
        assert pod.spec.get("priorityClassName") in XPK_PRIORITY_CLASSES, f"{pod.where}: priorityClassName"


def test_admin_cli_in_the_coordinator_finds_its_token() -> None:
    """`kubectl exec ... -c elastic-sidecar -- elastic-sidecar admin status` needs ES_ADMIN_TOKEN_FILE."""
    seen = 0
    for pod, c in sidecars():
        if role(pod, c) != "coordinator":
            continue
        env = pod.env(c)
        path = env.get("ES_ADMIN_TOKEN_FILE")
        assert path, f"{pod.where}: ES_ADMIN_TOKEN_FILE is not set"
        assert _mount_of(pod, c, path)["name"] == "elastic-sidecar-admin-token", pod.where
        seen += 1
    assert seen == 3


def test_the_coordinator_knows_the_jobset_restart_attempt() -> None:
    """A FAILED state file stays failed only within one restart attempt (agent/durable/statefile.py)."""
    seen = 0
    for pod, c in sidecars():
        if role(pod, c) != "coordinator":
            continue
        refs = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c.get("env", [])}
        assert refs.get("ES_RESTART_ATTEMPT") == f"metadata.labels['{C.LABEL_RESTART_ATTEMPT}']", pod.where
        assert pod.env(c)["ES_RESTART_ATTEMPT"] == "0"
        seen += 1
    assert seen == 3


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_network_policy_limits_the_http_port(kustomization: str) -> None:
    docs = render(kustomization)
    (np,) = of_kind(docs, "NetworkPolicy")
    selector = np["spec"]["podSelector"]["matchLabels"]
    for pod in pods(kustomization):
        if not pod.spec.get("hostNetwork"):
            assert selector.items() <= pod.labels.items(), f"{pod.where}: a pod-network pod not covered"
    rules = np["spec"]["ingress"]
    for r in rules:
        for p in r["ports"]:
            covers_http = p["protocol"] == "TCP" and p["port"] <= C.HTTP_PORT <= p.get("endPort", p["port"])
            if covers_http:
                assert r.get("from"), "29312 must be limited to listed peers"
    open_tcp = [p for r in rules if not r.get("from") for p in r["ports"] if p["protocol"] == "TCP"]
    for port in (C.COORDINATOR_PORT, C.TRAINER_PORT, 29000, 29001, 29002):
        assert any(p["port"] <= port <= p.get("endPort", p["port"]) for p in open_tcp), f"port {port} closed"


def test_sidecar_runs_non_root_with_a_read_only_root() -> None:
    for pod, c in sidecars():
        sc = c.get("securityContext", {})
        assert sc.get("runAsNonRoot") is True, f"{pod.where}: runAsNonRoot"
        assert sc.get("runAsUser") == SIDECAR_UID and sc.get("runAsGroup") == SIDECAR_UID, f"{pod.where}: uid/gid"
        assert sc.get("allowPrivilegeEscalation") is False, f"{pod.where}: allowPrivilegeEscalation"
        assert sc.get("readOnlyRootFilesystem") is True, f"{pod.where}: readOnlyRootFilesystem"
        assert "ALL" in sc.get("capabilities", {}).get("drop", []), f"{pod.where}: drop all capabilities"
        assert not sc.get("privileged"), pod.where


def test_coordinator_state_dir_is_on_an_emptydir() -> None:
    for pod, c in sidecars():
        if role(pod, c) != "coordinator":
            continue
        values = flag_values(pod, c)
        assert "--state-file" not in values and "--journal" not in values, f"{pod.where}: one --state-dir"
        path = values.get("--state-dir")
        assert path, f"{pod.where}: the coordinator needs --state-dir"
        mount = _mount_of(pod, c, path.rstrip("/") + "/state.json")
        # An emptyDir outlives container restarts, not the pod; not in memory (sizeLimit counts against RAM).
        vol = pod.volume(mount["name"])
        assert "emptyDir" in vol and vol["emptyDir"].get("medium") != "Memory", f"{pod.where}: --state-dir volume"
        assert not mount.get("readOnly"), pod.where


def _mount_of(pod: Pod, c: dict[str, Any], path: str) -> dict[str, Any]:
    mounts = [m for m in c.get("volumeMounts", []) if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"{pod.where}: {path} is not under any volume mount of {c['name']}"
    return max(mounts, key=lambda m: len(m["mountPath"]))


def test_token_files_come_from_secrets_mounted_read_only() -> None:
    secrets = {}
    for k in KUSTOMIZATIONS:
        secrets.update(by_name(render(k), "Secret"))
    for pod, c in sidecars():
        r = role(pod, c)
        values = flag_values(pod, c)
        env = pod.env(c)
        if "ES_ADMIN_TOKEN_FILE" in env:
            values.setdefault("--admin-token-file", env["ES_ADMIN_TOKEN_FILE"])
        wanted = ["--peer-token-file"] + (["--admin-token-file", "--trainer-token-file"] if r == "coordinator" else [])
        if r == "worker":
            assert "--admin-token-file" not in values, f"{pod.where}: workers must not get the admin token"
            assert "--trainer-token-file" not in values, f"{pod.where}: workers must not get the trainer token"
        for flag in wanted:
            path = values.get(flag)
            assert path, f"{pod.where}: elastic-sidecar {r} needs {flag}"
            mount = _mount_of(pod, c, path)
            assert mount.get("readOnly") is True, f"{pod.where}: {flag} must be mounted read-only"
            vol = pod.volume(mount["name"])
            assert "secret" in vol, f"{pod.where}: {flag} must come from a Secret"
            secret = secrets.get(vol["secret"]["secretName"])
            assert secret, f"{pod.where}: Secret {vol['secret']['secretName']} is not in the manifests"
            key = path[len(mount["mountPath"].rstrip("/")) + 1 :]
            data = {**secret.get("stringData", {}), **secret.get("data", {})}
            assert key in data, f"{pod.where}: Secret {secret['metadata']['name']} has no key {key!r}"
            assert "REPLACE-ME" in str(secret.get("stringData", {}).get(key, "")), (
                "token Secrets in the repository must stay placeholders (REPLACE-ME...)"
            )
            mode = vol["secret"].get("defaultMode", 0o644)
            readable = bool(mode & 0o004) or (
                bool(mode & 0o040) and pod.spec.get("securityContext", {}).get("fsGroup") == SIDECAR_UID
            )
            assert readable, f"{pod.where}: uid {SIDECAR_UID} cannot read {path} (mode {oct(mode)})"
        # Other containers of the pod do not get the tokens, but for the trainer's own.
        for other in pod.all_containers():
            if other is not c:
                names = {m["name"] for m in other.get("volumeMounts", [])}
                allowed = {"elastic-sidecar-trainer-token"} if other["name"] == "jax-tpu" else set()
                assert not {n for n in names if "token" in n} - allowed, f"{pod.where}: {other['name']} mounts a token"


def test_workers_reach_the_coordinator_by_its_stable_dns_name() -> None:
    for pod, c in sidecars():
        if role(pod, c) != "worker":
            continue
        cpod, cc = coordinator_pod(pod)
        js = pod.jobset["metadata"]["name"]
        coord_rjob = cpod.rjob["name"]
        assert pod.jobset["spec"]["coordinator"]["replicatedJob"] == coord_rjob, pod.where
        assert cpod.rjob.get("replicas", 1) == 1 and cpod.job_spec["parallelism"] == 1, cpod.where
        target = flag_values(pod, c)["--coordinator"]
        listen_port = port_of(flag_values(cpod, cc)["--listen"])
        assert target == f"{js}-{coord_rjob}-0-0.{js}:{listen_port}", f"{pod.where}: --coordinator={target}"
        if pod.spec.get("hostNetwork"):
            assert pod.spec.get("dnsPolicy") == "ClusterFirstWithHostNet", f"{pod.where}: cluster DNS on host network"


def test_slice_count_and_hosts_agree_everywhere() -> None:
    for k in KUSTOMIZATIONS:
        for pod, c in [(p, c) for p, c in sidecars() if p.kustomization == k and role(p, c) == "coordinator"]:
            values = flag_values(pod, c)
            workers = [p for p in pods(k) if any(is_sidecar(x) and role(p, x) == "worker" for x in p.all_containers())]
            assert len(workers) == 1, k
            (tpu,) = workers
            assert int(values["--num-slices"]) == tpu.rjob["replicas"], f"{k}: --num-slices != worker Jobs"
            assert int(values["--hosts-per-slice"]) == tpu.job_spec["parallelism"], (
                f"{k}: --hosts-per-slice != pods per Job"
            )
            k_min = int(values["--elastic-min-slice-count"])
            assert k_min == -1 or 1 <= k_min <= tpu.rjob["replicas"], k


# --------------------------------------------------------------------------
# the trainer
# --------------------------------------------------------------------------


def test_trainer_runs_maxtext_with_its_real_elastic_flags() -> None:
    seen = 0
    for pod in all_pods():
        for c in trainer_containers(pod):
            seen += 1
            assert c.get("command") == TRAINER_COMMAND, f"{pod.where}: the trainer runs {TRAINER_COMMAND}"
            args = maxtext_args(pod, c)
            for flag in MAXTEXT_ELASTIC_FLAGS:
                assert flag in args, f"{pod.where}: MaxText flag {flag} missing"
            bad = (set(args) & INVENTED_MAXTEXT_FLAGS) | {
                k for k in args if k.startswith("elastic_") and k not in MAXTEXT_KNOWN_ELASTIC_KEYS
            }
            assert not bad, f"{pod.where}: MaxText has no flags {sorted(bad)}"
            for k, v in args.items():
                assert "$(" not in v, f"{pod.where}: unresolved variable in {k}={v}"
            env = pod.env(c)
            if args["elastic_enabled"].lower() == "true":
                assert env.get("JAX_PLATFORMS") == "proxy", f"{pod.where}: MaxText's elastic mode needs Pathways"
                assert args.get("enable_single_controller", "").lower() == "true", pod.where
            else:
                assert args["elastic_enabled"].lower() == "false", pod.where
                assert env.get("JAX_PLATFORMS") != "proxy", f"{pod.where}: on Pathways, turn elastic_enabled on"

            # MaxText and the coordinator follow the same policy.
            cpod, cc = coordinator_pod(pod)
            policy = flag_values(cpod, cc)
            for flag in ("elastic_min_slice_count", "elastic_timeout_seconds", "elastic_max_retries"):
                sidecar_value = policy["--" + flag.replace("_", "-")]
                assert float(args[flag]) == float(sidecar_value), f"{pod.where}: {flag} differs from the coordinator's"

            # The trainer link points at the coordinator.
            addr = env.get("ELASTIC_SIDECAR_ADDRESS")
            assert addr, f"{pod.where}: ELASTIC_SIDECAR_ADDRESS is not set"
            trainer_listen = policy["--trainer-listen"]
            listen_port = port_of(trainer_listen)
            assert listen_port == C.TRAINER_PORT and listen_port != port_of(policy["--listen"]), pod.where
            js = pod.jobset["metadata"]["name"]
            if cpod.rjob is pod.rjob:
                assert addr == f"127.0.0.1:{listen_port}", f"{pod.where}: the trainer link stays on loopback"
                assert host_of(trainer_listen) == "127.0.0.1", f"{pod.where}: --trainer-listen must be loopback"
            else:
                assert addr == f"{js}-{cpod.rjob['name']}-0-0.{js}:{listen_port}", f"{pod.where}: {addr}"
            # The token: the coordinator's --trainer-token-file is the trainer's ELASTIC_SIDECAR_TOKEN_FILE.
            token = env.get("ELASTIC_SIDECAR_TOKEN_FILE")
            assert token and token == policy["--trainer-token-file"], f"{pod.where}: trainer token {token!r}"
            assert _mount_of(pod, c, token)["name"] == "elastic-sidecar-trainer-token", pod.where
    assert seen == 3, f"expected a trainer container in each of the 3 JobSets, found {seen}"


# --------------------------------------------------------------------------
# RBAC, monitoring, images, text
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_rbac(kustomization: str) -> None:
    docs = render(kustomization)
    sas = by_name(docs, "ServiceAccount")
    for pod in pods(kustomization):
        assert pod.spec.get("serviceAccountName") in sas, f"{pod.where}: service account not in the manifests"
    (sa,) = sas.values()
    # Workload Identity Federation: the KSA itself is granted (deploy/pubsub/setup.sh), no GSA to impersonate.
    assert "iam.gke.io/gcp-service-account" not in sa["metadata"].get("annotations", {}), "no impersonation"
    subject = {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}

    def rules_for(binding_kind: str, role_kind: str) -> list[dict[str, Any]]:
        out = []
        roles = by_name(docs, role_kind)
        for b in of_kind(docs, binding_kind):
            if subject in b["subjects"] and b["roleRef"]["kind"] == role_kind:
                assert b["roleRef"]["name"] in roles, f"{kustomization}: {binding_kind} refers to a missing {role_kind}"
                out += roles[b["roleRef"]["name"]]["rules"]
        return out

    ns_rules, cluster_rules = rules_for("RoleBinding", "Role"), rules_for("ClusterRoleBinding", "ClusterRole")

    def allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
        return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)

    # Worker sidecars read their node's pool label (--node-pool-source=kubernetes); nothing
    # else of the API is used, so nothing else is granted.
    assert allows(cluster_rules, "", "nodes", "get"), f"{kustomization}: nodes get"
    granted = {
        (g, res, v)
        for r in ns_rules + cluster_rules
        for g in r["apiGroups"]
        for res in r["resources"]
        for v in r["verbs"]
    }
    assert granted == {("", "nodes", "get")}, f"{kustomization}: RBAC nothing uses: {sorted(granted)}"
    workers = [
        (pod, c)
        for pod in pods(kustomization)
        for c in pod.all_containers()
        if is_sidecar(c) and role(pod, c) == "worker"
    ]
    assert workers and all("--node-pool-source=kubernetes" in c.get("args", []) for _, c in workers), (
        f"{kustomization}: worker sidecars must learn their node pool from the Kubernetes API"
    )
    for r in ns_rules + cluster_rules:
        assert "*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"], "no wildcards"
        if {"pods", "nodes", "secrets"} & set(r["resources"]):
            assert set(r["verbs"]) <= {"get", "list", "watch"}, f"{kustomization}: read-only on {r['resources']}"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_podmonitoring_component_scrapes_every_sidecar(kustomization: str, tmp_path: Path) -> None:
    """The optional component, added to each variant the way deploy/README.md says."""
    rel = lambda p: os.path.relpath(REPO / p, tmp_path)  # noqa: E731  (kustomize wants relative roots)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: default\n"
        f"resources:\n  - {rel(kustomization)}\ncomponents:\n  - {rel('deploy/components/podmonitoring')}\n"
    )
    proc = subprocess.run([_tool("kubectl"), "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    (pm,) = of_kind(docs, "PodMonitoring")
    assert pm["apiVersion"] == "monitoring.googleapis.com/v1"
    (js,) = of_kind(docs, "JobSet")
    assert pm["metadata"]["namespace"] == js["metadata"]["namespace"], "PodMonitoring only sees its own namespace"
    endpoints = pm["spec"]["endpoints"]
    assert any(int(e["port"]) == C.HTTP_PORT and e.get("path") == "/metrics" for e in endpoints), endpoints
    selector = pm["spec"]["selector"]["matchLabels"]
    for pod in pods(kustomization):
        assert selector.items() <= pod.labels.items(), f"{pod.where}: not selected by PodMonitoring {selector}"
    assert not of_kind(render(kustomization), "PodMonitoring"), "without the component there is none"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_straggler_replace_component_grants_what_the_replacement_calls(kustomization: str, tmp_path: Path) -> None:
    """deploy/components/straggler-replace, added as deploy/README.md says: the pods' service account may
    patch (cordon) nodes and list and delete pods in the job's namespace (agent/slice_replace.py); without
    the component it may not."""
    rel = lambda p: os.path.relpath(REPO / p, tmp_path)  # noqa: E731  (kustomize wants relative roots)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: team-a\n"
        f"resources:\n  - {rel(kustomization)}\ncomponents:\n  - {rel('deploy/components/straggler-replace')}\n"
    )
    proc = subprocess.run([_tool("kubectl"), "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    (sa,) = by_name(docs, "ServiceAccount").values()
    subject = {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "team-a"}

    def grants(binding_kind: str, role_kind: str, rendered: tuple[dict[str, Any], ...]) -> set[tuple[str, str, str]]:
        roles = by_name(rendered, role_kind)
        return {
            (g, res, v)
            for b in of_kind(rendered, binding_kind)
            if subject in b["subjects"] and b["roleRef"]["kind"] == role_kind
            for r in roles[b["roleRef"]["name"]]["rules"]
            for g in r["apiGroups"]
            for res in r["resources"]
            for v in r["verbs"]
        }

    role = [d for d in of_kind(docs, "Role") if "straggler" in d["metadata"]["name"]]
    assert len(role) == 1 and role[0]["metadata"]["namespace"] == "team-a", "pods: the job's namespace only"
    assert {("", "pods", "list"), ("", "pods", "delete")} <= grants("RoleBinding", "Role", docs)
    assert ("", "nodes", "patch") in grants("ClusterRoleBinding", "ClusterRole", docs)
    alone = render(kustomization)
    subject["namespace"] = by_name(alone, "ServiceAccount")[sa["metadata"]["name"]]["metadata"]["namespace"]
    without = grants("RoleBinding", "Role", alone) | grants("ClusterRoleBinding", "ClusterRole", alone)
    assert not {("", "nodes", "patch"), ("", "pods", "delete")} & without, "off unless the component is added"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_images_are_pinned(kustomization: str) -> None:
    for pod in pods(kustomization):
        for c in pod.all_containers():
            image = c["image"]
            name = image.rsplit("/", 1)[-1]
            assert "@sha256:" in image or ":" in name, f"{pod.where}: {c['name']} image {image} has no tag"
            assert not name.endswith(":latest"), f"{pod.where}: {c['name']} uses :latest"


def _project_text_files() -> list[Path]:
    files = [p for p in DEPLOY.rglob("*") if p.is_file()]
    files += [DOCKERFILE, DOCKERIGNORE, *Path(__file__).parent.glob("*.py")]
    return files


def test_no_registry_hosts_or_local_paths() -> None:
    for path in _project_text_files():
        text = path.read_text()
        for bad in FORBIDDEN_TEXT:
            assert bad not in text, f"{path.relative_to(REPO)} contains {bad!r}"


# --------------------------------------------------------------------------
# deploy/pubsub/setup.sh
# --------------------------------------------------------------------------

SETUP_ARGS = [
    "--project",
    "proj-1",
    "--cluster",
    "tpu-cluster",
    "--location",
    "us-east5",
    "--jobset",
    "maxtext-elastic",
]
WRITER = "serviceAccount:sink-writer@example.iam.gserviceaccount.com"
PROJECT_NUMBER = "123456789012"
# What `gcloud container node-pools list --format=value(instanceGroupUrls)` prints: one TPU
# pool spread over one zone, the CPU pool over two (lists are joined with ';').
NODE_PREFIXES = (
    "gke-tpu-cluster-tpu-np-0-1a2b3c4d",
    "gke-tpu-cluster-cpu-np-5e6f7a8b",
    "gke-tpu-cluster-cpu-np-9c0d1e2f",
)
MIG_URLS = tuple(
    f"https://www.googleapis.com/compute/v1/projects/proj-1/zones/us-east5-{z}/instanceGroupManagers/{p}-grp"
    for z, p in zip("abc", NODE_PREFIXES, strict=True)
)
KSA_PRINCIPAL = (
    f"principal://iam.googleapis.com/projects/{PROJECT_NUMBER}/locations/global/workloadIdentityPools/"
    "proj-1.svc.id.goog/subject/ns/default/sa/elastic-sidecar"
)


@pytest.fixture
def fake_gcloud(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A `gcloud` first on PATH that records its arguments; `describe` finds nothing."""
    log = tmp_path / "gcloud-calls.jsonl"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "gcloud"
    stub.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "args = sys.argv[1:]\n"
        "if args[:3] == ['container', 'node-pools', 'list']:\n"
        f"    print({';'.join(MIG_URLS)!r})\n"
        "    sys.exit(0)\n"
        "if args[:2] == ['projects', 'describe']:\n"
        f"    print({PROJECT_NUMBER!r})\n"
        "    sys.exit(0)\n"
        "if args[:3] == ['container', 'clusters', 'describe']:\n"
        "    print(os.environ.get('FAKE_NOTIFICATION_TOPIC', ''))\n"
        "    sys.exit(0)\n"
        "if 'describe' in args:\n"
        "    if any(a.startswith('--format') and 'writerIdentity' in a for a in args):\n"
        f"        print({WRITER!r})\n"
        "        sys.exit(0)\n"
        "    sys.exit(1)\n"
    )
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    for k in ("PROJECT", "CLUSTER", "LOCATION", "JOBSET"):
        env.pop(k, None)
    return env, log


def _run_setup(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_tool("bash"), str(SETUP_SH), *args], capture_output=True, text=True, env=env, timeout=60)


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_setup_script_syntax_and_strict_mode() -> None:
    proc = subprocess.run([_tool("bash"), "-n", str(SETUP_SH)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    text = SETUP_SH.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in text
    assert os.access(SETUP_SH, os.X_OK), "setup.sh should be executable"


def test_setup_help_and_missing_arguments(fake_gcloud: tuple[dict[str, str], Path]) -> None:
    env, log = fake_gcloud
    proc = _run_setup(["--help"], env)
    assert proc.returncode == 0 and "Usage:" in proc.stdout
    for arg in ("--project", "--cluster", "--location", "--jobset", "--dry-run"):
        assert arg in proc.stdout
    proc = _run_setup(["--project", "p"], env)
    assert proc.returncode == 2
    assert "--cluster" in proc.stderr and "--location" in proc.stderr and "--jobset" in proc.stderr
    proc = _run_setup([*SETUP_ARGS, "--bogus"], env)
    assert proc.returncode == 2 and "unknown argument" in proc.stderr
    assert _calls(log) == [], "gcloud must not run for --help or bad arguments"


def test_sourcing_setup_runs_nothing(fake_gcloud: tuple[dict[str, str], Path]) -> None:
    env, log = fake_gcloud
    proc = subprocess.run(
        [_tool("bash"), "-c", f"source {shlex.quote(str(SETUP_SH))}; declare -F main >/dev/null && echo defined"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "defined", proc.stderr
    assert _calls(log) == []


def _check_commands(cmds: list[list[str]], writer: str) -> None:
    topic = "tpu-cluster-elastic-sidecar-events"
    topic_path = f"projects/proj-1/topics/{topic}"

    def find(*prefix: str) -> list[str]:
        found = [c for c in cmds if c[: len(prefix)] == list(prefix)]
        assert len(found) == 1, f"expected one `gcloud {' '.join(prefix)}`, got {found}"
        return found[0]

    assert topic in find("pubsub", "topics", "create")
    sub = find("pubsub", "subscriptions", "create")
    assert sub[3] == "maxtext-elastic-events" and f"--topic={topic}" in sub
    assert "--ack-deadline=60" in sub and any(a.startswith("--message-retention-duration=") for a in sub), sub
    sink = find("logging", "sinks", "create")
    assert sink[4] == f"pubsub.googleapis.com/{topic_path}"
    (flt,) = [a.split("=", 1)[1] for a in sink if a.startswith("--log-filter=")]
    for needle in (
        "compute.instances.preempted",
        "compute.instances.hostError",
        "compute.instances.terminateOnHostMaintenance",
        "compute.instances.upcomingMaintenance",
        "cloudaudit.googleapis.com/system_event",
        'resource.type="gce_instance"',
        'resource.type="k8s_node"',
        "NodeTerminationHandler",
        'resource.labels.cluster_name="tpu-cluster"',
    ):
        assert needle in flt, f"log filter lacks {needle}: {flt}"
    assert flt.count("(") == flt.count(")"), flt
    gce = flt.split(" OR (resource.type=")[0]
    assert "protoPayload.resourceName:(" in gce, f"Compute Engine events must be scoped to the cluster's VMs: {gce}"
    pub = find("pubsub", "topics", "add-iam-policy-binding")
    assert f"--member={writer}" in pub and "--role=roles/pubsub.publisher" in pub, pub
    upd = find("container", "clusters", "update")
    assert upd[3] == "tpu-cluster" and "--location=us-east5" in upd
    assert f"--notification-config=pubsub=ENABLED,pubsub-topic={topic_path},filter=UpgradeEvent|UpgradeInfoEvent" in upd


def test_setup_dry_run_prints_commands_without_calling_gcloud(fake_gcloud: tuple[dict[str, str], Path]) -> None:
    env, log = fake_gcloud
    proc = _run_setup(["--dry-run", *SETUP_ARGS], env)
    assert proc.returncode == 0, proc.stderr
    assert _calls(log) == [], "--dry-run must not call gcloud"
    cmds = [shlex.split(line)[1:] for line in proc.stdout.splitlines() if line.startswith("gcloud ")]
    assert cmds, proc.stdout
    _check_commands([c for c in cmds if "describe" not in c], "WRITER_IDENTITY_OF_THE_SINK")


def test_setup_runs_the_same_commands_for_real(fake_gcloud: tuple[dict[str, str], Path]) -> None:
    env, log = fake_gcloud
    proc = _run_setup(SETUP_ARGS, env)
    assert proc.returncode == 0, proc.stderr
    calls = _calls(log)
    _check_commands(
        [c for c in calls if "describe" not in c and c[:3] != ["pubsub", "subscriptions", "add-iam-policy-binding"]],
        WRITER,
    )
    (flt,) = [a.split("=", 1)[1] for c in calls for a in c if a.startswith("--log-filter=")]
    for prefix in NODE_PREFIXES:
        assert f'"/instances/{prefix}-"' in flt, f"sink filter misses node pool {prefix}: {flt}"


def test_setup_grants_the_kubernetes_service_account_directly(fake_gcloud: tuple[dict[str, str], Path]) -> None:
    env, log = fake_gcloud
    node_sa = "serviceAccount:nodes@proj-1.iam.gserviceaccount.com"
    proc = _run_setup([*SETUP_ARGS, "--grant", node_sa], env)
    assert proc.returncode == 0, proc.stderr
    calls = _calls(log)
    bindings = [c for c in calls if c[:3] == ["pubsub", "subscriptions", "add-iam-policy-binding"]]
    members = [a.split("=", 1)[1] for c in bindings for a in c if a.startswith("--member=")]
    (sa,) = by_name(render("deploy/overlays/pathways"), "ServiceAccount").values()
    assert members == [KSA_PRINCIPAL.replace("/sa/elastic-sidecar", f"/sa/{sa['metadata']['name']}"), node_sa]
    assert all("--role=roles/pubsub.subscriber" in c for c in bindings)
    assert not [c for c in calls if c[:2] == ["iam", "service-accounts"]], "no impersonation of a Google SA"
    assert "iam.gke.io/gcp-service-account" not in json.dumps(sa), "the KSA itself is the principal"


@pytest.mark.parametrize("current", ["projects/proj-1/topics/someone-elses", ""])
def test_setup_keeps_an_existing_notification_topic(fake_gcloud: tuple[dict[str, str], Path], current: str) -> None:
    env, log = fake_gcloud
    env = {**env, "FAKE_NOTIFICATION_TOPIC": current}
    proc = _run_setup(SETUP_ARGS, env)
    assert proc.returncode == 0, proc.stderr
    updates = [c for c in _calls(log) if c[:3] == ["container", "clusters", "update"]]
    if current:
        assert updates == [], "the cluster's existing notification topic must not be replaced"
        assert "someone-elses" in proc.stderr and "--replace-notifications" in proc.stderr
        proc = _run_setup([*SETUP_ARGS, "--replace-notifications"], env)
        assert proc.returncode == 0, proc.stderr
        updates = [c for c in _calls(log) if c[:3] == ["container", "clusters", "update"]]
    assert len(updates) == 1


def test_subscription_name_matches_the_coordinator_flag() -> None:
    for pod, c in sidecars():
        if role(pod, c) == "coordinator":
            raw = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in c["args"][1:]}
            assert raw["--pubsub-subscription"] == "projects/$(PROJECT)/subscriptions/$(JOBSET_NAME)-events", pod.where
            assert 'subscription="${jobset}-events"' in SETUP_SH.read_text()


# --------------------------------------------------------------------------
# Dockerfile
# --------------------------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or not stripped:
            continue
        buf += (" " if buf else "") + stripped.rstrip("\\").strip()
        if stripped.endswith("\\"):
            continue
        instr, _, rest = buf.partition(" ")
        out.append((instr.upper(), rest.strip()))
        buf = ""
    assert not buf, "Dockerfile ends inside a continued line"
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instr, rest in _dockerfile():
        if instr == "FROM":
            stages.append([])
        assert stages, "Dockerfile must start with FROM"
        stages[-1].append((instr, rest))
    return stages


def test_dockerfile_base_images_are_pinned_and_multi_stage() -> None:
    stages = _stages()
    assert len(stages) >= 2, "build and runtime stages"
    for stage in stages:
        image = stage[0][1].split()[0]
        assert "$" not in image, f"FROM {image}: spell the pinned tag out"
        name, _, tag = image.partition(":")
        assert tag and tag != "latest", f"FROM {image}: pin a tag"
        assert re.fullmatch(r"python:3\.12\.\d+-slim-bookworm", image), (
            f"FROM {image}: expected python:3.12.N-slim-bookworm"
        )
    assert stages[0][0][1].split()[-2:] == ["AS", "build"] or stages[0][0][1].lower().split()[-2:] == ["as", "build"]
    final = stages[-1]
    assert any(i == "COPY" and r.startswith("--from=build ") for i, r in final), (
        "final stage copies the venv from build"
    )
    assert not any(i == "RUN" and "pip install" in r for i, r in final), "nothing is installed in the final stage"


def test_dockerfile_builds_the_wheel_and_installs_with_constraints() -> None:
    build = _stages()[0]
    runs = " && ".join(r for i, r in build if i == "RUN")
    assert "pip wheel --no-deps" in runs
    installs = [s.strip() for s in runs.split("&&") if "pip install" in s]
    assert installs, "the build stage installs the wheel"
    for cmd in installs:
        assert "-c constraints.txt" in cmd, f"pip install without -c constraints.txt: {cmd}"
        extras = set(re.findall(r"\[([a-z0-9_,-]+)\]", cmd))
        # drill: the kubernetes client, for the coordinator's --straggler-replace.
        assert extras == {"pubsub,tpu,drill"}, f"install only the pubsub, tpu and drill extras, got {extras}"
    text = DOCKERFILE.read_text()
    for bad in ("http://", "https://", " -i ", "--find-links", "[demo", "[test", ",test", ",demo"):
        assert bad not in text, f"Dockerfile contains {bad!r}"
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    assert "pubsub" in extras and "tpu" in extras
    # Every runtime dependency has an exact version in constraints.txt.
    pinned = {
        re.sub(r"[-_.]+", "-", line.split("==")[0]).lower()
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    for req in [*pyproject["project"]["dependencies"], *extras["pubsub"], *extras["tpu"]]:
        name = re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0]).lower()
        assert name in pinned, f"{name} is not pinned in constraints.txt"


def test_dockerfile_runs_elastic_sidecar_as_non_root() -> None:
    final = _stages()[-1]
    users = [r for i, r in final if i == "USER"]
    assert users, "the final stage sets USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) == SIDECAR_UID, (
        f"USER {users[-1]}: numeric uid {SIDECAR_UID} (runAsNonRoot checks it)"
    )
    assert not gid or (gid.isdigit() and int(gid) != 0)
    last_user = max(n for n, (i, _) in enumerate(final) if i == "USER")
    assert not any(i == "USER" for i, _ in final[last_user + 1 :])
    entry = [json.loads(r) for i, r in final if i == "ENTRYPOINT"]
    cmd = [json.loads(r) for i, r in final if i == "CMD"]
    assert entry[-1] == ["elastic-sidecar"], "exec-form ENTRYPOINT"
    assert cmd[-1] == ["--help"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "elastic-sidecar" in scripts


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    lines = [ln.strip() for ln in DOCKERIGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*", ".dockerignore starts by excluding everything"
    included = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    for bad in (".git", ".venv", "tests", "deploy"):
        assert bad not in included
    sources: set[str] = set()
    for instr, rest in _stages()[0]:
        if instr == "COPY" and not rest.startswith("--from"):
            sources.update(s.rstrip("/") for s in rest.split()[:-1])
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: no such file"
        assert src in included, f"COPY {src} is excluded by .dockerignore"
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= sources, f"the wheel needs every package: {packages - sources} not copied"
    assert pyproject["project"]["readme"] in sources
