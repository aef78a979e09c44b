"""deploy/drill/rbac-drill.yaml: valid objects, namespaced, granting what ``elastic-sidecar drill``
calls and nothing the sidecars' own RBAC holds; not part of any kustomization the job applies."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from agent import constants as C

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "deploy" / "drill" / "rbac-drill.yaml"


def docs() -> list[dict]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


@pytest.mark.parametrize("version", ["1.29.0", "1.37.0"])
def test_valid_and_namespaced(version: str) -> None:
    kinds = []
    for d in docs():
        kubernetes_validate.validate(d, version, strict=True)
        assert "namespace" not in d["metadata"], "applied with -n into the JobSet's namespace"
        kinds.append(d["kind"])
    assert kinds == ["ServiceAccount", "Role", "RoleBinding"]


def test_grants_what_the_drill_calls_and_no_more() -> None:
    (role,) = [d for d in docs() if d["kind"] == "Role"]
    grants = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    group, _, plural = C.JOBSET_API
    assert grants == {
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "delete"),
        ("", "pods/portforward", "create"),
        (group, plural, "get"),
    }
    (binding,) = [d for d in docs() if d["kind"] == "RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }


def test_not_in_the_jobs_kustomizations() -> None:
    for k in (REPO / "deploy").rglob("kustomization.yaml"):
        assert "rbac-drill" not in k.read_text() and "drill/" not in k.read_text(), k
