"""What a real cluster does with ``inject``'s output, checked on xpk 1.16.0's own renderings.

* Pod validation (the API server's, pkg/apis/core/validation): a volumeMount naming no volume of
  its pod, two containers (init or not) of one name, two volumes of one name, or a
  ``restartPolicy`` on a container that is not an init container refuses the pod, so every Job
  create of the JobSet fails and the job never starts. The JobSet itself is accepted, so only
  these rules catch it.
* JobSet copies the exclusive-placement annotation from the JobSet and from each replicated
  job's template to the Jobs it makes (``labelAndAnnotateObject``, kubernetes-sigs/jobset
  pkg/controllers/jobset_controller.go); only slice Jobs may get it.
* An exit 42 restarts the JobSet only while ``maxRestarts`` allows one.
* The worker sidecars read their node through the Kubernetes API as the pod's service account,
  which the companions bind to ``get`` on nodes and nothing else, with the kustomize names.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import cli, inject
from agent.sources import heartbeat_datagrams
from tests.deploy.test_inject import XPK, injected, pod_specs, validate_jobset

REPO = Path(__file__).resolve().parents[2]
MODES = list(XPK)
EXCLUSIVE_KEYS = (inject.EXCLUSIVE_TOPOLOGY, inject.NODE_SELECTOR_STRATEGY)


def pod_rule_errors(doc: dict[str, Any]) -> list[str]:
    """What the API server's pod validation would refuse in each replicated job's pod template."""
    errors = []
    for name, pod in pod_specs(doc).items():
        volumes = [v["name"] for v in pod.get("volumes") or []]
        if len(set(volumes)) != len(volumes):
            errors.append(f"{name}: volume names repeat: {volumes}")
        inits, mains = pod.get("initContainers") or [], pod.get("containers") or []
        names = [c["name"] for c in [*inits, *mains]]
        if len(set(names)) != len(names):
            errors.append(f"{name}: container names repeat: {names}")
        for c in [*inits, *mains]:
            for m in c.get("volumeMounts") or []:
                if m["name"] not in volumes:
                    errors.append(f"{name}/{c['name']}: mounts {m['name']!r}, which is no volume of the pod {volumes}")
            paths = [m["mountPath"] for m in c.get("volumeMounts") or []]
            if len(set(paths)) != len(paths):
                errors.append(f"{name}/{c['name']}: mount paths repeat: {paths}")
        for c in mains:
            if "restartPolicy" in c:
                errors.append(f"{name}/{c['name']}: restartPolicy is only for init containers")
        for c in inits:
            if c.get("restartPolicy") not in (None, "Always"):
                errors.append(f"{name}/{c['name']}: an init container's restartPolicy can only be Always")
        ports = [p["name"] for c in [*inits, *mains] for p in c.get("ports") or [] if "name" in p]
        if len(set(ports)) != len(ports) or any(len(p) > 15 for p in ports):
            errors.append(f"{name}: port names repeat or are over 15 characters: {ports}")
    return errors


def job_annotations(doc: dict[str, Any], rj_name: str) -> dict[str, str]:
    """The annotations JobSet gives the Jobs of a replicated job (the JobSet's, then the replicated job's)."""
    out = {k: v for k, v in ((doc["metadata"].get("annotations") or {}).items()) if k in EXCLUSIVE_KEYS}
    rj = next(r for r in doc["spec"]["replicatedJobs"] if r["name"] == rj_name)
    own = ((rj["template"].get("metadata") or {}).get("annotations")) or {}
    out.update({k: v for k, v in own.items() if k in EXCLUSIVE_KEYS})
    return out


def tpu_job_names(doc: dict[str, Any]) -> list[str]:
    return [
        n
        for n, p in pod_specs(doc).items()
        if any("google.com/tpu" in ((c.get("resources") or {}).get("limits") or {}) for c in p["containers"])
    ]


# --- pod rules ---------------------------------------------------------------------------


@pytest.mark.parametrize("quota", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_every_mount_has_its_volume_and_the_pods_are_valid(mode: str, quota: bool) -> None:
    src, _, doc = injected(mode, cpu_memory_quota=quota)
    assert pod_rule_errors(yaml.safe_load(src)) == [], "xpk's own rendering passes the pod rules"
    assert pod_rule_errors(doc) == []


@pytest.mark.parametrize("mode", MODES)
def test_the_pod_rules_catch_a_mount_without_its_volume(mode: str) -> None:
    """The check itself: the trainer-token volume removed from the trainer's pod (the bug of issue 25)."""
    _, _, doc = injected(mode)
    for pod in pod_specs(doc).values():
        mounts = {m["name"] for c in pod["containers"] for m in c.get("volumeMounts") or []}
        if "elastic-sidecar-trainer-token" in mounts:
            pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "elastic-sidecar-trainer-token"]
            break
    else:
        pytest.fail("no pod mounts the trainer token into a main container")
    errors = pod_rule_errors(doc)
    assert errors and all("elastic-sidecar-trainer-token" in e for e in errors), errors


# --- restarts ----------------------------------------------------------------------------


def test_xpks_default_of_no_restarts_is_raised_so_42_restarts() -> None:
    src = XPK[inject.MULTI_CONTROLLER].read_text()
    assert yaml.safe_load(src)["spec"]["failurePolicy"]["maxRestarts"] == 0, "xpk's default"
    r = inject.inject(src)
    assert yaml.safe_load(r.text)["spec"]["failurePolicy"]["maxRestarts"] == inject.DEFAULT_MAX_RESTARTS
    assert any("maxRestarts was 0" in w for w in r.warnings), r.warnings


@pytest.mark.parametrize("mode", MODES)
def test_max_restarts_flag_sets_the_value(mode: str) -> None:
    _, out, doc = injected(mode, max_restarts=7)
    assert doc["spec"]["failurePolicy"]["maxRestarts"] == 7
    validate_jobset(doc)
    assert inject.inject(out, inject.InjectOptions(max_restarts=7)).text == out


def test_a_jobsets_own_max_restarts_is_kept_without_the_flag() -> None:
    src = XPK[inject.MULTI_CONTROLLER].read_text().replace("    maxRestarts: 0\n", "    maxRestarts: 2\n")
    doc = yaml.safe_load(inject.inject(src).text)
    assert doc["spec"]["failurePolicy"]["maxRestarts"] == 2


@pytest.mark.parametrize("bad", [-1, 0])
def test_max_restarts_below_one_is_refused_naming_the_value(bad: int, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(inject.InjectError, match=f"got {bad}"):
        inject.inject(XPK[inject.PATHWAYS].read_text(), inject.InjectOptions(max_restarts=bad))
    with pytest.raises(SystemExit) as e:
        cli.main(["inject", "--max-restarts", str(bad), str(XPK[inject.PATHWAYS])])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--max-restarts" in err and f"got {bad}" in err


# --- exclusive placement -----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_exclusive_placement_binds_the_slice_jobs_only(mode: str) -> None:
    src, out, doc = injected(mode)
    before = yaml.safe_load(src)
    slices = tpu_job_names(doc)
    assert slices
    for rj in slices:
        assert job_annotations(doc, rj) == job_annotations(before, rj), "each slice keeps its exclusivity"
        assert job_annotations(doc, rj).get(inject.EXCLUSIVE_TOPOLOGY) == "cloud.google.com/gke-nodepool"
    if mode == inject.MULTI_CONTROLLER:
        assert inject.EXCLUSIVE_TOPOLOGY in (before["metadata"]["annotations"] or {}), "xpk puts it JobSet-wide"
        assert job_annotations(doc, inject.COORDINATOR_JOB) == {}
        assert inject.EXCLUSIVE_TOPOLOGY not in (doc["metadata"].get("annotations") or {})
    else:
        # The coordinator is in the head pod: its job keeps what xpk gave it.
        assert job_annotations(doc, inject.PATHWAYS_HEAD) == job_annotations(before, inject.PATHWAYS_HEAD)
    assert inject.inject(out).text == out


def test_a_jobset_wide_node_selector_strategy_moves_with_it() -> None:
    src = (
        XPK[inject.MULTI_CONTROLLER]
        .read_text()
        .replace(
            "    alpha.jobset.sigs.k8s.io/exclusive-topology: cloud.google.com/gke-nodepool\n",
            "    alpha.jobset.sigs.k8s.io/exclusive-topology: cloud.google.com/gke-nodepool\n"
            "    alpha.jobset.sigs.k8s.io/node-selector: 'true'\n"
            "    example.com/other: kept\n",
        )
    )
    doc = yaml.safe_load(inject.inject(src).text)
    validate_jobset(doc)
    assert job_annotations(doc, "slice-job") == {
        inject.EXCLUSIVE_TOPOLOGY: "cloud.google.com/gke-nodepool",
        inject.NODE_SELECTOR_STRATEGY: "true",
    }
    assert job_annotations(doc, inject.COORDINATOR_JOB) == {}
    assert doc["metadata"]["annotations"] == {"example.com/other": "kept"}


# --- node pools through the Kubernetes API -------------------------------------------------


def workers(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [
        (p, c)
        for p in pod_specs(doc).values()
        for c in p.get("initContainers") or []
        if c["name"] == inject.SIDECAR_NAME and c["args"][0] == "worker"
    ]


def rbac(companions: str) -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(companions)}


@pytest.mark.parametrize("mode", MODES)
def test_workers_read_their_node_as_a_service_account_bound_to_get_nodes(
    mode: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(XPK[mode].read_text()))
    assert cli.main(["inject", "--companions", "-"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    jobset, objs = docs[0], {f"{d['kind']}/{d['metadata']['name']}": d for d in docs[1:]}
    names = inject.CompanionNames(jobset["metadata"]["name"], jobset["metadata"]["namespace"])
    found = workers(jobset)
    assert len(found) == len(tpu_job_names(jobset))
    binding = objs[f"ClusterRoleBinding/{names.node_reader}"]
    bound = {s["name"] for s in binding["subjects"]}
    for pod, c in found:
        assert "--node-pool-source=kubernetes" in c["args"]
        assert pod.get("automountServiceAccountToken", True)
        assert pod["serviceAccountName"] == names.service_account and pod["serviceAccountName"] in bound
    role = objs[f"ClusterRole/{names.node_reader}"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    assert binding["roleRef"]["name"] == names.node_reader
    assert not [k for k in objs if k.split("/")[0] in ("Role", "RoleBinding")], "nothing namespaced is needed"


def test_a_service_account_the_pods_keep_is_bound_too(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """xpk names ``xpk-sa`` when the workload mounts storage (its CSI drivers authenticate as it)."""
    src = XPK[inject.MULTI_CONTROLLER].read_text().replace("serviceAccountName: \n", "serviceAccountName: xpk-sa\n")
    r = inject.inject(src)
    ours = inject.CompanionNames("llama-mc", "team").service_account
    assert r.service_accounts == [ours, "xpk-sa"]
    assert inject.inject(r.text).service_accounts == r.service_accounts, "a second inject still binds it"
    assert any("xpk-sa" in w and inject.NODE_READER in w for w in r.warnings), r.warnings
    doc = yaml.safe_load(r.text)
    assert pod_specs(doc)["slice-job"]["serviceAccountName"] == "xpk-sa"
    f = tmp_path / "job.yaml"
    f.write_text(src)
    assert cli.main(["inject", "--companions", "--namespace", "team", str(f)]) == 0
    objs = rbac(capsys.readouterr().out.split("---\n", 1)[1])
    subjects = objs[f"ClusterRoleBinding/{inject.CompanionNames('llama-mc', 'team').node_reader}"]["subjects"]
    assert {(s["name"], s["namespace"]) for s in subjects} == {(ours, "team"), ("xpk-sa", "team")}


def test_a_pathways_head_keeps_a_named_service_account_without_a_warning() -> None:
    """The head has no worker sidecar: its service account needs no node binding."""
    src = XPK[inject.PATHWAYS].read_text()
    src = src.replace(
        "            hostNetwork: true\n", "            serviceAccountName: head-sa\n            hostNetwork: true\n", 1
    )
    r = inject.inject(src)
    assert pod_specs(yaml.safe_load(r.text))[inject.PATHWAYS_HEAD]["serviceAccountName"] == "head-sa"
    assert r.service_accounts == [r.names.service_account] and not any("head-sa" in w for w in r.warnings)


def test_companions_have_the_kustomize_rules() -> None:
    """Named after the job, but with deploy/common's rules, role reference and token keys."""
    names = inject.CompanionNames("llama", "default")
    ours = rbac(inject.companions("llama", "default"))
    ours.update(rbac(inject.token_secrets("llama", "default")))
    theirs = {
        f"ServiceAccount/{inject.SERVICE_ACCOUNT}": f"ServiceAccount/{names.service_account}",
        f"ClusterRole/{inject.NODE_READER}": f"ClusterRole/{names.node_reader}",
        f"ClusterRoleBinding/{inject.NODE_READER}": f"ClusterRoleBinding/{names.node_reader}",
        **{f"Secret/elastic-sidecar-{t}-token": f"Secret/{names.secret(t)}" for t in inject.TOKENS},
    }
    kustomize: dict[str, dict[str, Any]] = {}
    for f in ("rbac.yaml", "serviceaccount.yaml", "secrets.yaml"):
        for d in yaml.safe_load_all((REPO / "deploy" / "common" / f).read_text()):
            kustomize[f"{d['kind']}/{d['metadata']['name']}"] = d
    assert set(kustomize) == set(theirs), sorted(set(kustomize) ^ set(theirs))
    for key, want in kustomize.items():
        got = ours[theirs[key]]
        for field in ("rules", "type"):
            assert got.get(field) == want.get(field), (key, field)
        if "roleRef" in want:
            assert got["roleRef"] | {"name": ""} == want["roleRef"] | {"name": ""}
            assert got["roleRef"]["name"] == names.node_reader
        if "subjects" in want:
            assert [s["kind"] for s in got["subjects"]] == [s["kind"] for s in want["subjects"]]
            assert [s["name"] for s in got["subjects"]] == [names.service_account]
        if "stringData" in want:
            assert set(got["stringData"]) == set(want["stringData"])


# --- the receive buffer ----------------------------------------------------------------------


def test_node_system_config_lets_the_coordinator_have_its_receive_buffer() -> None:
    """The coordinator asks for RECV_BUFFER_BYTES; the kernel caps the request at net.core.rmem_max."""
    cfg = yaml.safe_load((REPO / "deploy" / "gke" / "node-system-config.yaml").read_text())
    assert set(cfg) == {"linuxConfig"} and set(cfg["linuxConfig"]) == {"sysctl"}
    value = cfg["linuxConfig"]["sysctl"]["net.core.rmem_max"]
    assert isinstance(value, str), "GKE takes sysctl values as strings"
    assert int(value) >= heartbeat_datagrams.RECV_BUFFER_BYTES
    readme = (REPO / "deploy" / "README.md").read_text()
    assert "net.core.rmem_max" in readme and "node-system-config.yaml" in readme


# --- docs agree ------------------------------------------------------------------------------


def test_docs_say_create_never_apply_for_companions() -> None:
    readme = (REPO / "deploy" / "README.md").read_text()
    for text in (inject.__doc__ or "", readme):
        assert "kubectl apply -f -" not in text
        assert "kubectl create -f companions.yaml" in text
    assert not re.search(r"\bpending\b", readme, re.IGNORECASE), "every flag deploy/ uses exists"
