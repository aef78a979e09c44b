"""``elastic-sidecar inject`` on JobSets rendered by xpk 1.16.0 itself (tests/deploy/fixtures).

The output is validated against the JobSet CRD's schema (made strict: unknown fields are
errors) and its Job and Pod templates against Kubernetes' schemas; the input's lines must all
still be there, in order, apart from the trainer's entry point; injecting twice must equal
injecting once; shapes it does not understand are refused with exit code 2 and a message that
says what was expected; and the result must be admissible by Kueue as xpk sets it up.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from agent import cli, inject
from agent import constants as C
from tests.deploy import kueue_model as K
from tests.deploy.measured import assert_limit_covers, coordinator_rss
from tests.deploy.test_manifests import SCHEMA_VERSIONS, _validate

FIXTURES = Path(__file__).with_name("fixtures")
XPK = {inject.PATHWAYS: FIXTURES / "xpk-pathways.yaml", inject.MULTI_CONTROLLER: FIXTURES / "xpk-multi-controller.yaml"}
REPO = Path(__file__).resolve().parents[2]


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def jobset_validator() -> jsonschema.Draft7Validator:
    schema = _strict(json.loads((FIXTURES / "jobset-v1alpha2.schema.json").read_text()))
    return jsonschema.Draft7Validator(schema)


def _drop_nulls(x: Any) -> Any:
    """The API server treats a null field as absent (xpk's templates leave a few)."""
    if isinstance(x, dict):
        return {k: _drop_nulls(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_nulls(v) for v in x]
    return x


def _webhook_defaults(doc: dict[str, Any]) -> dict[str, Any]:
    """What JobSet's defaulting webhook fills in before the schema is checked (pkg/webhooks/jobset_webhook.go)."""
    for i, rule in enumerate(((doc.get("spec") or {}).get("failurePolicy") or {}).get("rules") or []):
        rule.setdefault("name", f"failurePolicyRule{i}")
    return doc


def validate_jobset(doc: dict[str, Any]) -> None:
    doc = _webhook_defaults(_drop_nulls(doc))
    errors = sorted(jobset_validator().iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:10])


def injected(mode: str, **opts: Any) -> tuple[str, str, dict[str, Any]]:
    src = XPK[mode].read_text()
    r = inject.inject(src, inject.InjectOptions(**opts))
    assert r.mode == mode and r.changed
    return src, r.text, yaml.safe_load(r.text)


def pod_specs(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rj["name"]: rj["template"]["spec"]["template"]["spec"] for rj in doc["spec"]["replicatedJobs"]}


def tpu_pods(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        p for p in pod_specs(doc).values() if any(K.TPU in K.pod_requests({"containers": [c]}) for c in p["containers"])
    ]


def trainer(doc: dict[str, Any], mode: str) -> dict[str, Any]:
    pods = pod_specs(doc)
    if mode == inject.PATHWAYS:
        return pods["pathways-head"]["containers"][0]
    return next(c for p in tpu_pods(doc) for c in p["containers"] if "google.com/tpu" in c["resources"]["limits"])


def coordinator(doc: dict[str, Any]) -> dict[str, Any]:
    found = [
        c
        for p in pod_specs(doc).values()
        for c in [*(p.get("initContainers") or []), *p["containers"]]
        if c["name"] == "elastic-sidecar" and c["args"][0] == "coordinator"
    ]
    assert len(found) == 1, f"expected one coordinator, found {len(found)}"
    return found[0]


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env") or []}


def flags(c: dict[str, Any]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in c["args"][1:] if a.startswith("--") and "=" in a)


MODES = list(XPK)


# --- the fixtures are what xpk renders ---------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_fixture_is_an_xpk_jobset_without_the_sidecar(mode: str) -> None:
    text = XPK[mode].read_text()
    assert text.startswith("# Rendered by xpk 1.16.0 itself"), "each fixture names the xpk that rendered it"
    assert "AI-Hypercomputer/xpk" in text and re.search(r"sha256 [0-9a-f]{64}", text)
    assert "--dry-run --output-manifest-file" in text, "the header gives the command that rendered it"
    doc = yaml.safe_load(text)
    validate_jobset(doc)
    body = "".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith("#"))
    assert "elastic-sidecar" not in body and "trainer_hooks" not in body


# --- the output ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_output_validates_against_the_jobset_crd(mode: str) -> None:
    _, _, doc = injected(mode)
    validate_jobset(doc)


def test_the_crd_check_catches_a_wrong_field() -> None:
    _, _, doc = injected(inject.PATHWAYS)
    doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["initContainers"][0]["restartPolicyy"] = 1
    with pytest.raises(AssertionError, match="restartPolicyy"):
        validate_jobset(doc)


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("mode", MODES)
def test_output_pods_validate_against_kubernetes(mode: str, version: str) -> None:
    _, _, doc = injected(mode)
    for rj in doc["spec"]["replicatedJobs"]:
        job = _drop_nulls({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": rj["name"]}})
        job["spec"] = _drop_nulls(rj["template"]["spec"])
        _validate(job, version, f"{mode}/{rj['name']}")


@pytest.mark.parametrize("mode", MODES)
def test_the_original_text_is_kept_line_for_line(mode: str) -> None:
    src, out, _ = injected(mode)
    a, b = src.splitlines(), out.splitlines()
    changed = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op in ("equal", "insert"):
            continue
        assert op == "replace", f"{op} of input lines {i1 + 1}-{i2}: {a[i1:i2]}"
        changed += a[i1:i2]
        # A replaced line survives with only the entry point changed, the rest is inserted.
        olds = [
            ln.replace("python3 -m MaxText.train", "python3 -m trainer_hooks.maxtext")
            for ln in a[i1:i2]
            if "python3 -m MaxText.train" in ln
        ]
        assert [ln for ln in b[j1:j2] if ln in olds] == olds, f"input lines {i1 + 1}-{i2} changed: {a[i1:i2]}"
    # Besides the entry point, the edits the module docstring lists, and only on these xpk lines.
    allowed = {
        inject.PATHWAYS: set(),
        inject.MULTI_CONTROLLER: {
            "    maxRestarts: 0",
            "              serviceAccountName: ",
            "    alpha.jobset.sigs.k8s.io/exclusive-topology: cloud.google.com/gke-nodepool",
        },
    }[mode]
    entry = [ln for ln in changed if "python3 -m MaxText.train" in ln]
    assert len(entry) == 1 and set(changed) - set(entry) == allowed, changed


@pytest.mark.parametrize("mode", MODES)
def test_injecting_twice_equals_injecting_once(mode: str) -> None:
    _, once, _ = injected(mode)
    twice = inject.inject(once)
    assert twice.text == once and not twice.changed


@pytest.mark.parametrize("mode", MODES)
def test_every_tpu_pod_gets_a_native_worker_sidecar(mode: str) -> None:
    _, _, doc = injected(mode)
    pods = tpu_pods(doc)
    assert pods
    for p in pods:
        first = p["initContainers"][0]
        assert first["name"] == "elastic-sidecar" and first["restartPolicy"] == "Always"
        assert first["args"][0] == "worker"
        volumes = {v["name"] for v in p["volumes"]}
        assert {m["name"] for m in first["volumeMounts"]} <= volumes
        assert flags(first)["--coordinator"].startswith("$(ES_COORDINATOR_HOST):")
        assert env_of(first)["ES_COORDINATOR_HOST"].startswith("$(ES_JOB)-")


@pytest.mark.parametrize("mode", MODES)
def test_trainer_runs_through_the_hooks_with_its_env(mode: str) -> None:
    _, _, doc = injected(mode)
    t = trainer(doc, mode)
    script = " ".join(t["command"])
    assert "python3 -m trainer_hooks.maxtext src/MaxText/configs/base.yml run_name=" in script
    assert "MaxText.train" not in script
    env = env_of(t)
    want = f"127.0.0.1:{C.TRAINER_PORT}" if mode == inject.PATHWAYS else None
    if want:
        assert env["ELASTIC_SIDECAR_ADDRESS"] == want
    else:
        assert env["ELASTIC_SIDECAR_ADDRESS"].endswith(
            f"-{inject.COORDINATOR_JOB}-0-0.$(ELASTIC_SIDECAR_JOB):{C.TRAINER_PORT}"
        )
    names = [e["name"] for e in t["env"]]
    assert names.index("ELASTIC_SIDECAR_JOB") < names.index("ELASTIC_SIDECAR_ADDRESS"), "$(VAR) needs it defined first"
    token = env["ELASTIC_SIDECAR_TOKEN_FILE"]
    mounts = {m["mountPath"]: m["name"] for m in t["volumeMounts"]}
    assert mounts[str(Path(token).parent)] == "elastic-sidecar-trainer-token"


@pytest.mark.parametrize("mode", MODES)
def test_trainer_link_is_loopback_or_carries_a_token(mode: str) -> None:
    _, _, doc = injected(mode)
    f = flags(coordinator(doc))
    host = f["--trainer-listen"].rsplit(":", 1)[0]
    assert f["--trainer-listen"].endswith(f":{C.TRAINER_PORT}")
    if mode == inject.PATHWAYS:
        assert host == "127.0.0.1"
    assert f["--trainer-token-file"].startswith(inject.TOKEN_DIR)


@pytest.mark.parametrize("mode", MODES)
def test_coordinator_admin_token_reaches_kubectl_exec(mode: str) -> None:
    """`kubectl exec POD -c elastic-sidecar -- elastic-sidecar admin status` reads ES_ADMIN_TOKEN_FILE."""
    _, _, doc = injected(mode)
    c = coordinator(doc)
    path = env_of(c)["ES_ADMIN_TOKEN_FILE"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts[str(Path(path).parent)] == "elastic-sidecar-admin-token"
    assert "--admin-token-file" not in flags(c), "one place: the env var, read by the daemon and the admin CLI"


@pytest.mark.parametrize("mode", MODES)
def test_coordinator_state_is_on_a_pod_lifetime_volume(mode: str) -> None:
    _, _, doc = injected(mode)
    c = coordinator(doc)
    state_dir = flags(c)["--state-dir"]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == state_dir)
    pod = next(p for p in pod_specs(doc).values() if c in [*(p.get("initContainers") or []), *p["containers"]])
    vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert "emptyDir" in vol and vol["emptyDir"].get("medium") != "Memory"


@pytest.mark.parametrize("mode", MODES)
def test_sidecar_arguments_parse_with_the_daemon(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, doc = injected(mode)
    env = {"ES_JOB": "llama", "ES_SLICE": "1", "ES_HOST": "0", "ES_COORDINATOR_HOST": "llama-x-0-0.llama"}
    for p in pod_specs(doc).values():
        for c in [*(p.get("initContainers") or []), *p["containers"]]:
            if c["name"] != "elastic-sidecar":
                continue
            args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["args"]]
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            ns = cli.build_parser().parse_args(args)
            assert ns.role == c["args"][0]


# --- exit codes --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_abort_fails_the_jobset_and_42_restarts_it(mode: str) -> None:
    _, _, doc = injected(mode)
    t = trainer(doc, mode)["name"]
    rj = next(
        rj
        for rj in doc["spec"]["replicatedJobs"]
        if t in [c["name"] for c in rj["template"]["spec"]["template"]["spec"]["containers"]]
    )
    pfp = rj["template"]["spec"]["podFailurePolicy"]
    for code in (C.EXIT_ABORTED, C.EXIT_USAGE, 1):
        assert inject.pod_failure_action(pfp, t, code) == "FailJob", code
    for code in (C.EXIT_RESTART, 127, 137, 255):
        assert inject.pod_failure_action(pfp, t, code) is None, code
    assert rj["template"]["spec"]["backoffLimit"] == 0, "any other failure fails the Job, and the JobSet restarts"
    fp = doc["spec"]["failurePolicy"]
    assert fp["maxRestarts"] >= 1
    assert any(
        r["action"] == "FailJobSet"
        and "PodFailurePolicy" in r["onJobFailureReasons"]
        and rj["name"] in r.get("targetReplicatedJobs", [rj["name"]])
        for r in fp["rules"]
    )


def test_warnings_name_what_inject_cannot_fix() -> None:
    pw = inject.inject(XPK[inject.PATHWAYS].read_text())
    assert any("hostNetwork" in w and "Workload Identity" in w for w in pw.warnings), pw.warnings
    mc = inject.inject(XPK[inject.MULTI_CONTROLLER].read_text())
    assert any("maxRestarts was 0" in w for w in mc.warnings), mc.warnings


def test_restart_codes_are_xpks() -> None:
    src = XPK[inject.MULTI_CONTROLLER].read_text()
    values = yaml.safe_load(src)["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"][0]
    assert sorted(values["onExitCodes"]["values"]) == sorted(inject.RESTART_EXIT_CODES)


def test_a_policy_that_restarts_on_abort_is_refused() -> None:
    src = XPK[inject.MULTI_CONTROLLER].read_text().replace("values: [42,127,", "values: [3,42,127,")
    with pytest.raises(inject.InjectError, match="exits 3"):
        inject.inject(src)


# --- Kueue as xpk sets it up ----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_kueue_admits_the_tpu_pods_onto_the_tpu_pool(mode: str) -> None:
    _, _, doc = injected(mode)
    pathways_cluster = mode == inject.PATHWAYS
    groups = K.xpk_cluster_queue(pathways=pathways_cluster)
    for pod in tpu_pods(doc):
        a = K.admit(pod, groups)
        assert K.schedulable_on_tpu_pool(a), (a.reason, a.node_selector)
        assert not {"cpu", "memory"} & set(K.pod_requests(pod)), "a TPU pod asking for cpu/memory gets cpu-user"
    for name, pod in pod_specs(doc).items():
        a = K.admit(pod, groups)
        assert a.admissible, f"{name}: {a.reason}"


def test_kueue_model_rejects_the_old_sidecar_requests() -> None:
    """The model catches what the issue reported: requests on a TPU pod."""
    _, _, doc = injected(inject.PATHWAYS)
    pod = tpu_pods(doc)[0]
    pod["initContainers"][0]["resources"] = {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"memory": "256Mi"},
    }
    assert not K.schedulable_on_tpu_pool(K.admit(pod, K.xpk_cluster_queue(pathways=True)))
    assert not K.admit(pod, K.xpk_cluster_queue(pathways=False)).admissible
    pod["initContainers"][0]["resources"] = {"limits": {"memory": "256Mi"}}  # a limit defaults the request
    assert not K.schedulable_on_tpu_pool(K.admit(pod, K.xpk_cluster_queue(pathways=True)))


def test_cpu_memory_quota_gives_requests_where_the_queue_covers_them() -> None:
    _, _, doc = injected(inject.MULTI_CONTROLLER, cpu_memory_quota=True)
    groups = K.xpk_cluster_queue(pathways=False, cpu_memory_in_tpu_group=True)
    for name, pod in pod_specs(doc).items():
        assert K.admit(pod, groups).admissible, name
    assert "memory" in coordinator(doc)["resources"]["limits"]


def test_coordinator_memory_covers_the_measured_rss() -> None:
    """The limit covers the RSS at 10,000 workers (docs/benchmarks.json's scale rows), with headroom."""
    measured = coordinator_rss()
    _, _, doc = injected(inject.PATHWAYS)
    assert_limit_covers(K.quantity(coordinator(doc)["resources"]["limits"]["memory"]), measured)


# --- refusals ----------------------------------------------------------------------------


def _run(tmp_path: Path, text: str, *extra: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    f = tmp_path / "in.yaml"
    f.write_text(text)
    rc = cli.main(["inject", *extra, str(f)])
    out, err = capsys.readouterr()
    return rc, out, err


REFUSED = {
    "not a JobSet": ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", "expected kind: JobSet"),
    "two documents": ("kind: JobSet\n---\nkind: JobSet\n", "expected one YAML document"),
    "old api": (
        "apiVersion: jobset.x-k8s.io/v1alpha1\nkind: JobSet\nmetadata: {name: j}\n",
        "expected apiVersion: jobset.x-k8s.io/v1alpha2",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unknown_shapes_are_refused_with_exit_2(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, message = REFUSED[case]
    rc, out, err = _run(tmp_path, text, capsys=capsys)
    assert rc == C.EXIT_USAGE and out == ""
    assert message in err


def test_two_tpu_jobs_without_pathways_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(XPK[inject.MULTI_CONTROLLER].read_text())
    second = json.loads(json.dumps(doc["spec"]["replicatedJobs"][0]))
    second["name"] = "slice-job-b"
    doc["spec"]["replicatedJobs"].append(second)
    rc, _, err = _run(tmp_path, yaml.safe_dump(doc), capsys=capsys)
    assert rc == C.EXIT_USAGE
    assert "expected exactly one replicated job whose pods ask for google.com/tpu" in err and "slice-job-b" in err


def test_headless_pathways_is_refused() -> None:
    doc = yaml.safe_load(XPK[inject.PATHWAYS].read_text())
    head = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    head["containers"] = head.pop("initContainers")  # xpk --headless: proxy and rm are the containers
    with pytest.raises(inject.InjectError, match="exactly one main container"):
        inject.inject(yaml.safe_dump(doc))


def test_a_command_without_maxtext_is_refused() -> None:
    src = XPK[inject.PATHWAYS].read_text().replace("python3 -m MaxText.train", "python3 my_trainer.py")
    with pytest.raises(inject.InjectError, match="MaxText's pre-training"):
        inject.inject(src)


def test_mode_that_does_not_fit_is_refused() -> None:
    with pytest.raises(inject.InjectError, match="--mode pathways expects a replicated job named 'pathways-head'"):
        inject.inject(XPK[inject.MULTI_CONTROLLER].read_text(), inject.InjectOptions(mode=inject.PATHWAYS))
    with pytest.raises(inject.InjectError, match="--mode multi-controller expects no"):
        inject.inject(XPK[inject.PATHWAYS].read_text(), inject.InjectOptions(mode=inject.MULTI_CONTROLLER))


# --- other entry points, and the CLI ---------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    ["python3 -m maxtext.trainers.pre_train.train", "python src/MaxText/train.py", "python3 MaxText/train.py"],
)
def test_other_maxtext_entry_points_are_rewritten(entry: str) -> None:
    src = XPK[inject.PATHWAYS].read_text().replace("python3 -m MaxText.train", entry)
    out = inject.inject(src).text
    script = trainer(yaml.safe_load(out), inject.PATHWAYS)["command"][-1]
    assert entry not in script
    assert re.search(r"python3? -m trainer_hooks\.maxtext src/MaxText/configs/base\.yml", script)


def test_maxtext_policy_flags_reach_the_coordinator() -> None:
    src = (
        XPK[inject.PATHWAYS]
        .read_text()
        .replace(
            "checkpoint_period=100)", "checkpoint_period=100 elastic_min_slice_count=1 elastic_timeout_seconds=600)"
        )
    )
    doc = yaml.safe_load(inject.inject(src).text)
    f = flags(coordinator(doc))
    assert f["--elastic-min-slice-count"] == "1" and f["--elastic-timeout-seconds"] == "600"
    assert f["--num-slices"] == "2" and f["--hosts-per-slice"] == "4"


def test_cli_reads_stdin_and_prints_companions_without_tokens(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(XPK[inject.MULTI_CONTROLLER].read_text()))
    assert cli.main(["inject", "--companions", "--image", "elastic-sidecar:0.1.0", "-"]) == 0
    out = capsys.readouterr().out
    docs = list(yaml.safe_load_all(out))
    kinds = [d["kind"] for d in docs]
    assert kinds[0] == "JobSet" and "PodMonitoring" not in kinds
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "NetworkPolicy"} <= set(kinds)
    assert "Secret" not in kinds and "stringData" not in out, "the file kept beside the job holds no token"
    assert coordinator(docs[0])["image"] == "elastic-sidecar:0.1.0"
    for d in docs[1:]:
        _validate(d, SCHEMA_VERSIONS[-1], d["kind"])


def secret_refs(doc: dict[str, Any]) -> set[str]:
    return {v["secret"]["secretName"] for p in pod_specs(doc).values() for v in p.get("volumes") or [] if "secret" in v}


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(["inject", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("mode", MODES)
def test_secrets_make_every_token_the_pods_read(mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`inject --secrets FILE | kubectl create -f -`: one Secret per volume the injected pods mount, key ``token``."""
    rc, out, _ = _cli(["--secrets", str(XPK[mode])], capsys)
    assert rc == 0
    docs = list(yaml.safe_load_all(out))
    assert {d["kind"] for d in docs} == {"Secret"}
    for d in docs:
        _validate(d, SCHEMA_VERSIONS[-1], d["metadata"]["name"])
    tokens = {d["metadata"]["name"]: d["stringData"]["token"] for d in docs}
    assert len(set(tokens.values())) == 3 and all(len(t) >= 32 for t in tokens.values())
    _, _, doc = injected(mode)
    assert secret_refs(doc) == set(tokens)
    rc, again, _ = _cli(["--secrets", "--jobset-name", doc["metadata"]["name"]], capsys)
    assert rc == 0 and [d["metadata"]["name"] for d in yaml.safe_load_all(again)] == list(tokens)
    fresh = {d["stringData"]["token"] for d in yaml.safe_load_all(again)}
    assert fresh.isdisjoint(tokens.values()), "fresh tokens each time"


def test_secrets_without_a_jobset_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _cli(["--secrets"], capsys)
    assert rc == C.EXIT_USAGE and out == "" and "--jobset-name" in err


WITHOUT_MIN_AND_CHECKPOINTS = "checkpoint_period=100 enable_checkpointing=false)"


def test_warns_naming_min_slice_count_and_checkpointing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """xpk's command as it comes: no elastic_min_slice_count, and checkpoints off."""
    src = XPK[inject.PATHWAYS].read_text().replace("checkpoint_period=100)", WITHOUT_MIN_AND_CHECKPOINTS)
    assert "elastic_min_slice_count" not in src
    rc, out, err = _run(tmp_path, src, capsys=capsys)
    assert rc == 0 and out
    warnings = [ln for ln in err.splitlines() if ln.startswith("elastic-sidecar inject: warning: ")]
    (min_slices,) = [w for w in warnings if "elastic_min_slice_count" in w]
    assert "elastic_min_slice_count=-1" in min_slices and "cannot shrink" in min_slices
    (checkpoints,) = [w for w in warnings if "enable_checkpointing" in w]
    assert "enable_checkpointing=false" in checkpoints and "exit 42" in checkpoints and "step 0" in checkpoints
    assert flags(coordinator(yaml.safe_load(out)))["--elastic-min-slice-count"] == "-1"
    # What changed and what the trainer image needs, before the warnings.
    assert "python3 -m trainer_hooks.maxtext" in err and "python -m trainer_hooks.maxtext --check" in err
    assert "maxtext-runner:latest" in err, "names the trainer's image"

    fixed = src.replace(WITHOUT_MIN_AND_CHECKPOINTS, "checkpoint_period=100 elastic_min_slice_count=1)")
    rc, _, err = _run(tmp_path, fixed, capsys=capsys)
    assert (
        rc == 0
        and "elastic_min_slice_count" not in "".join(ln for ln in err.splitlines() if "warning:" in ln)
        and "enable_checkpointing" not in err
    )


def test_multi_controller_says_min_slice_count_is_ignored() -> None:
    src = XPK[inject.MULTI_CONTROLLER].read_text().replace("checkpoint_period=100)", "elastic_min_slice_count=1)")
    r = inject.inject(src)
    assert any("elastic_min_slice_count=1 is ignored" in w for w in r.warnings), r.warnings
    assert flags(coordinator(yaml.safe_load(r.text)))["--elastic-min-slice-count"] == "-1"


def test_a_policy_value_that_is_no_number_is_refused() -> None:
    src = XPK[inject.PATHWAYS].read_text().replace("checkpoint_period=100)", "elastic_min_slice_count=$MIN)")
    with pytest.raises(inject.InjectError, match=r"elastic_min_slice_count=\$MIN"):
        inject.inject(src)


def _namespaced(text: str, namespace: str | None) -> str:
    meta = "metadata:\n  name: "
    assert text.count(meta) == 1
    return text if namespace is None else text.replace(meta, f"metadata:\n  namespace: {namespace}\n  name: ")


CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding"}


def everything(mode: str, src: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> list[Any]:
    """What a user creates for one job: the JobSet with its companions, and the Secrets."""
    f = tmp_path / f"{mode}.yaml"
    f.write_text(src)
    rc, job, _ = _cli(["--companions", "--podmonitoring", *extra, str(f)], capsys)
    assert rc == 0
    rc, tokens, _ = _cli(["--secrets", *extra, str(f)], capsys)
    assert rc == 0
    return [*yaml.safe_load_all(job), *yaml.safe_load_all(tokens)]


@pytest.mark.parametrize("mode", MODES)
def test_every_namespaced_object_is_in_the_jobsets_namespace(
    mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = everything(mode, _namespaced(XPK[mode].read_text(), "team-a"), tmp_path, capsys)
    assert docs[0]["kind"] == "JobSet"
    validate_jobset(docs[0])
    for d in docs:
        if d["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in d["metadata"]
        else:
            assert d["metadata"]["namespace"] == "team-a", (d["kind"], d["metadata"])
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert {s["namespace"] for s in binding["subjects"]} == {"team-a"}


def test_a_jobset_without_a_namespace_gets_the_one_its_companions_have() -> None:
    r = inject.inject(XPK[inject.MULTI_CONTROLLER].read_text(), inject.InjectOptions(namespace="team-b"))
    assert yaml.safe_load(r.text)["metadata"]["namespace"] == "team-b" == r.namespace
    assert yaml.safe_load(inject.inject(XPK[inject.PATHWAYS].read_text()).text)["metadata"]["namespace"] == "default"


def test_a_namespace_flag_against_the_jobsets_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _namespaced(XPK[inject.PATHWAYS].read_text(), "team-a")
    rc, out, err = _run(tmp_path, src, "--namespace", "team-b", capsys=capsys)
    assert rc == C.EXIT_USAGE and out == ""
    assert "--namespace team-b" in err and "metadata.namespace team-a" in err


def _renamed(text: str, old: str, new: str) -> str:
    return re.sub(rf"^  name: {old}$", f"  name: {new}", text, count=1, flags=re.MULTILINE)


@pytest.mark.parametrize("mode", MODES)
def test_two_jobsets_get_disjoint_companions(mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Side by side in one namespace, each job creates and deletes only its own objects."""
    src = XPK[mode].read_text()
    name = yaml.safe_load(src)["metadata"]["name"]
    jobs = {}
    for job in (name, f"{name}-b"):
        (tmp_path / job).mkdir()
        jobs[job] = everything(mode, _renamed(src, name, job), tmp_path / job, capsys)
    ids = {
        job: {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs[1:]}
        for job, docs in jobs.items()
    }
    a, b = ids.values()
    assert a.isdisjoint(b), a & b
    for job, docs in jobs.items():
        jobset, companions = docs[0], docs[1:]
        assert jobset["metadata"]["name"] == job
        made = {(d["kind"], d["metadata"]["name"]) for d in companions}
        for pod in pod_specs(jobset).values():
            if pod.get("serviceAccountName"):
                assert ("ServiceAccount", pod["serviceAccountName"]) in made
        assert {("Secret", s) for s in secret_refs(jobset)} <= made
        for d in companions:
            if d["kind"] != "PodMonitoring":
                _validate(d, SCHEMA_VERSIONS[-1], f"{job}/{d['kind']}")


def test_long_jobset_names_give_bounded_distinct_names() -> None:
    """Names stay within 63 characters (a DNS label), and two long names that differ only at the
    end still get different companions."""
    label = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    long_a, long_b = "j" * 60 + "-aa", "j" * 60 + "-bb"
    a, b = inject.CompanionNames(long_a, "team-a"), inject.CompanionNames(long_b, "team-a")
    for names in (a, b):
        for n in (names.service_account, *names.secrets, names.network_policy, names.instance):
            assert len(n) <= inject.NAME_LIMIT and label.match(n), n
        assert len(names.node_reader) <= inject.NAME_LIMIT
    assert a.service_account != b.service_account and set(a.secrets).isdisjoint(b.secrets)
    assert a.node_reader != b.node_reader
    assert a.secret("peer").endswith("-peer-token"), "the kind stays readable"
    short = inject.CompanionNames("llama", "team-a")
    assert (
        short.service_account == "llama-elastic-sidecar"
        and short.secret("admin") == "llama-elastic-sidecar-admin-token"
    )
    assert short.node_reader != inject.CompanionNames("llama", "team-b").node_reader


def test_network_policy_keeps_the_http_port_to_the_job() -> None:
    np = inject.network_policy("llama", "default")
    _validate(np, SCHEMA_VERSIONS[-1], "NetworkPolicy")
    http_rules = [r for r in np["spec"]["ingress"] if any(p.get("port") == C.HTTP_PORT for p in r["ports"])]
    assert len(http_rules) == 1 and http_rules[0]["from"], "the HTTP port is open only to listed peers"
    for r in np["spec"]["ingress"]:
        for p in r["ports"]:
            if p["protocol"] == "TCP" and "endPort" in p:
                assert not p["port"] <= C.HTTP_PORT <= p["endPort"], "a port range re-opens the HTTP port"
    open_tcp = [p for r in np["spec"]["ingress"] if "from" not in r for p in r["ports"] if p["protocol"] == "TCP"]
    for port in (C.COORDINATOR_PORT, C.TRAINER_PORT, 29000, 29001):
        assert any(p["port"] <= port <= p.get("endPort", p["port"]) for p in open_tcp), port


def test_existing_native_sidecars_stay_after_ours() -> None:
    """xpk --colocated-python-sidecar-image gives the Pathways workers a native sidecar of their own."""
    src = XPK[inject.PATHWAYS].read_text()
    colocated = (
        "            initContainers:\n"
        "              - name: colocated-python-sidecar\n"
        "                image: colocated-python:latest\n"
        "                restartPolicy: Always\n"
        "            containers:\n"
        "              - name: pathways-worker\n"
    )
    src = src.replace("            containers:\n              - name: pathways-worker\n", colocated, 1)
    assert colocated in src
    doc = yaml.safe_load(inject.inject(src).text)
    validate_jobset(doc)
    worker = pod_specs(doc)["worker"]
    assert [c["name"] for c in worker["initContainers"]] == ["elastic-sidecar", "colocated-python-sidecar"]


@pytest.mark.parametrize("mode", MODES)
def test_multi_controller_coordinator_expects_one_trainer_process_per_host(mode: str) -> None:
    _, _, doc = injected(mode)
    f = flags(coordinator(doc))
    if mode == inject.MULTI_CONTROLLER:
        assert int(f["--trainer-processes"]) == int(f["--num-slices"]) * int(f["--hosts-per-slice"])
    else:
        assert "--trainer-processes" not in f  # Pathways: one trainer process, the head's
