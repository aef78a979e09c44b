"""The stand-in Kubernetes API's pods and JobSet, read with the official ``kubernetes`` client.

The client deserialises every answer into its typed models (V1Pod, V1PodList, V1Status), so a
shape the real server would not send fails here, as a missing pod's 404 must.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client, config  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from agent import constants as C  # noqa: E402
from standins.kube_api import HostInfo, InThread, KubeAPIStandIn, PodTable, write_kubeconfig  # noqa: E402

JOBSET = "elastic-demo"
TOKEN = "stand-in-token"


def hosts(gen: dict[tuple[int, int], int] | None = None, dead: set[tuple[int, int]] = frozenset()) -> dict:  # type: ignore[assignment]
    gen = gen or {}
    return {
        (s, h): HostInfo(gen.get((s, h), 0), (s, h) not in dead, f"node-{s}-{h}-r{gen.get((s, h), 0)}")
        for s in range(3)
        for h in range(2)
    }


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[PodTable, client.ApiClient, Path]]:
    table = PodTable(JOBSET, num_slices=3, namespace="team-a")
    table.sync(hosts())
    server = InThread(KubeAPIStandIn({}, token=TOKEN, pods=table))
    url = server.start()
    kc = tmp_path / "kubeconfig"
    write_kubeconfig(kc, url, TOKEN, namespace="team-a")
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kc), client_configuration=cfg)
    api_client = client.ApiClient(cfg)
    try:
        yield table, api_client, kc
    finally:
        api_client.close()
        server.stop()


def selector(slice_: int) -> str:
    return f"{C.LABEL_JOBSET_NAME}={JOBSET},{C.LABEL_JOB_INDEX}={slice_}"


def test_lists_a_slices_pods_by_label_selector(api) -> None:
    _, api_client, kc = api
    assert kc.stat().st_mode & 0o777 == 0o600
    core = client.CoreV1Api(api_client)
    pods = core.list_namespaced_pod("team-a", label_selector=selector(1)).items
    assert [p.metadata.labels[C.LABEL_JOB_COMPLETION_INDEX] for p in pods] == ["0", "1"]
    for p in pods:
        assert p.metadata.labels[C.LABEL_JOB_INDEX] == "1"
        assert p.metadata.labels[C.LABEL_JOBSET_NAME] == JOBSET
        assert p.metadata.name.startswith(f"{JOBSET}-worker-1-")
        assert p.status.phase == "Running"
    one = core.list_namespaced_pod("team-a", label_selector=f"{selector(2)},{C.LABEL_JOB_COMPLETION_INDEX}!=0").items
    assert [p.metadata.labels[C.LABEL_JOB_COMPLETION_INDEX] for p in one] == ["1"]
    assert len(core.list_namespaced_pod("team-a").items) == 6
    assert core.list_namespaced_pod("default", label_selector=selector(1)).items == []
    with pytest.raises(ApiException) as e:
        core.list_namespaced_pod("team-a", label_selector=f"{C.LABEL_JOB_INDEX} in (1,2)")
    assert e.value.status == 400


def test_delete_terminates_the_pod_then_it_is_gone_and_a_second_delete_is_404(api) -> None:
    table, api_client, _ = api
    core = client.CoreV1Api(api_client)
    victim = core.list_namespaced_pod("team-a", label_selector=selector(1)).items[0]
    deleted = core.delete_namespaced_pod(victim.metadata.name, "team-a")
    assert deleted.metadata.uid == victim.metadata.uid
    assert deleted.metadata.deletion_timestamp is not None
    assert table.take_deletions() == [(1, 0)]
    assert table.take_deletions() == []
    # Terminating until its host is dead, then gone.
    assert core.read_namespaced_pod(victim.metadata.name, "team-a").metadata.deletion_timestamp is not None
    table.sync(hosts(dead={(1, 0)}))
    with pytest.raises(ApiException) as e:
        core.read_namespaced_pod(victim.metadata.name, "team-a")
    assert e.value.status == 404
    with pytest.raises(ApiException) as e:
        core.delete_namespaced_pod(victim.metadata.name, "team-a")
    assert e.value.status == 404
    status = json.loads(e.value.body)
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "NotFound", 404)
    assert [
        p.metadata.labels[C.LABEL_JOB_COMPLETION_INDEX]
        for p in core.list_namespaced_pod("team-a", label_selector=selector(1)).items
    ] == ["1"]
    # The replacement host is a new pod: new name, new uid, Running.
    table.sync(hosts(gen={(1, 0): 1, (1, 1): 1}))
    new = [
        p
        for p in core.list_namespaced_pod("team-a", label_selector=selector(1)).items
        if p.metadata.labels[C.LABEL_JOB_COMPLETION_INDEX] == "0"
    ]
    assert len(new) == 1
    assert new[0].metadata.name != victim.metadata.name and new[0].metadata.uid != victim.metadata.uid
    assert new[0].status.phase == "Running" and new[0].metadata.deletion_timestamp is None


def test_a_host_that_died_otherwise_shows_its_pod_failed(api) -> None:
    table, api_client, _ = api
    table.sync(hosts(dead={(2, 1)}))
    core = client.CoreV1Api(api_client)
    phases = {
        p.metadata.labels[C.LABEL_JOB_COMPLETION_INDEX]: p.status.phase
        for p in core.list_namespaced_pod("team-a", label_selector=selector(2)).items
    }
    assert phases == {"0": "Running", "1": "Failed"}


def test_jobset_restarts_and_a_missing_jobset_is_404(api) -> None:
    table, api_client, _ = api
    custom = client.CustomObjectsApi(api_client)
    group, version, plural = C.JOBSET_API
    js = custom.get_namespaced_custom_object(group, version, "team-a", plural, JOBSET)
    assert js["kind"] == "JobSet" and js["status"]["restarts"] == 0
    table.restarts = 2
    assert custom.get_namespaced_custom_object(group, version, "team-a", plural, JOBSET)["status"]["restarts"] == 2
    for ns, name in (("team-a", "other"), ("default", JOBSET)):
        with pytest.raises(ApiException) as e:
            custom.get_namespaced_custom_object(group, version, ns, plural, name)
        assert e.value.status == 404


def test_another_token_is_refused(api, tmp_path: Path) -> None:
    _, api_client, _ = api
    cfg = client.Configuration()
    cfg.host = api_client.configuration.host
    cfg.api_key = {"authorization": "Bearer wrong"}
    with client.ApiClient(cfg) as other, pytest.raises(ApiException) as e:
        client.CoreV1Api(other).list_namespaced_pod("team-a")
    assert e.value.status == 401


def test_a_node_patch_cordons_it_as_kubectl_cordon_does_and_refusals_are_the_apis(tmp_path: Path) -> None:
    standin = KubeAPIStandIn({"node-a": "pool-0", "node-b": "pool-1"}, token=TOKEN, refuse=set())
    server = InThread(standin)
    url = server.start()
    cfg = client.Configuration()
    kc = tmp_path / "kubeconfig"
    write_kubeconfig(kc, url, TOKEN)
    config.load_kube_config(config_file=str(kc), client_configuration=cfg)
    try:
        with client.ApiClient(cfg) as api_client:
            core = client.CoreV1Api(api_client)
            patched = core.patch_node("node-a", {"spec": {"unschedulable": True}})
            assert patched.spec.unschedulable is True and standin.unschedulable == {"node-a"}
            assert core.read_node("node-a").spec.unschedulable is True
            assert not core.read_node("node-b").spec.unschedulable
            with pytest.raises(ApiException) as e:
                core.patch_node("node-c", {"spec": {"unschedulable": True}})
            assert e.value.status == 404
            standin.refuse.add("patch nodes")
            with pytest.raises(ApiException) as e:
                core.patch_node("node-b", {"spec": {"unschedulable": True}})
            assert e.value.status == 403 and json.loads(e.value.body)["reason"] == "Forbidden"
            assert standin.unschedulable == {"node-a"}
    finally:
        server.stop()
