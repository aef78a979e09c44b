"""The command line: bad values exit 2 naming the value, help texts, environment variables."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.cli import build_parser
from agent.config import ConfigError, CoordinatorConfig, WorkerConfig
from simjob.ports import free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_es_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """ES_* variables of the calling shell must not leak into parsers built in-process."""
    for k in list(os.environ):
        if k.startswith("ES_"):
            monkeypatch.delenv(k)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ES_")}
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", *args],
        cwd=REPO,
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--num-slices", "4", "--elastic-min-slice-count", "7"], ["elastic_min_slice_count", "num_slices=4", "got 7"]),
        (
            ["--num-slices", "2", "--heartbeat-timeout", "0.1", "--heartbeat-interval", "0.5"],
            ["--heartbeat-timeout (0.1)", "--heartbeat-interval (0.5)"],
        ),
    ],
    ids=["min-slices-above-num-slices", "timeout-below-interval"],
)
def test_bad_coordinator_values_exit_2_naming_the_value(args: list[str], words: list[str]) -> None:
    r = run_cli("coordinator", "--listen", "127.0.0.1:0", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("elastic-sidecar coordinator: "), r.stderr
    for w in words:
        assert w in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert "coordinator listening" not in r.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["coordinator", "--num-slices", "2", "--listen", "nonsense"], ["--listen", "'nonsense'", "HOST:PORT"]),
        (["coordinator", "--num-slices", "2", "--listen", "127.0.0.1:99999"], ["--listen", "99999", "out of range"]),
        (["coordinator", "--num-slices", "2", "--heartbeat-interval", "-1"], ["--heartbeat-interval", "'-1'"]),
        (["coordinator", "--num-slices", "two"], ["--num-slices", "'two'"]),
        (["coordinator", "--num-slices", "0"], ["--num-slices", "'0'"]),
        (["coordinator", "--num-slices", "2", "--hosts-per-slice", "0"], ["--hosts-per-slice", "'0'"]),
        (["coordinator", "--num-slices", "2", "--elastic-max-retries", "0"], ["--elastic-max-retries", "'0'"]),
        (["coordinator"], ["--num-slices"]),
        (["worker", "--slice", "-1"], ["--slice", "'-1'"]),
        (["worker"], ["--slice"]),
        (["worker", "--slice", "0", "--coordinator", "localhost"], ["--coordinator", "'localhost'"]),
        (
            ["coordinator", "--num-slices", "2", "--heartbeat-datagrams", "yes"],
            ["--heartbeat-datagrams", "'yes'", "on or off"],
        ),
        (["coordinator", "--num-slices", "2", "--gc-freeze", "maybe"], ["--gc-freeze", "'maybe'", "on or off"]),
        ([], ["coordinator,worker,admin,inject,demo"]),
    ],
    ids=[
        "listen-nonsense",
        "listen-port-range",
        "negative-interval",
        "num-slices-word",
        "num-slices-0",
        "hosts-0",
        "max-retries-0",
        "num-slices-missing",
        "negative-slice",
        "slice-missing",
        "coordinator-no-port",
        "datagrams-yes",
        "gc-freeze-maybe",
        "no-role",
    ],
)
def test_argparse_refusals_exit_2_naming_the_value(args: list[str], words: list[str]) -> None:
    r = run_cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "usage: elastic-sidecar" in r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def _entry_point() -> list[str]:
    script = shutil.which("elastic-sidecar", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "agent"]


@pytest.mark.parametrize(
    ("role", "flags"),
    [
        (None, ["coordinator", "worker", "admin", "demo", "Exit codes", "42"]),
        (
            "coordinator",
            [
                "--num-slices",
                "--hosts-per-slice",
                "--elastic-min-slice-count",
                "--elastic-timeout-seconds",
                "--elastic-max-retries",
                "--heartbeat-interval",
                "--heartbeat-timeout",
                "--listen",
                "--state-file",
                "--journal",
                "--job",
                "--rejoin-grace",
                "--admin-listen",
                "--admin-token-file",
                "--peer-token-file",
                "--http-listen",
                "--tls-cert-file",
                "--tls-key-file",
            ],
        ),
        (
            "worker",
            [
                "--coordinator",
                "--slice",
                "--host",
                "--health-target",
                "--health-check",
                "--job",
                "--node",
                "--peer-token-file",
                "--http-listen",
                "--admin-listen",
            ],
        ),
        ("admin", ["--address", "--token-file", "--tls-ca-file", "--json", "drain", "checkpoint", "Exit codes"]),
        ("demo", ["--slices", "--steps", "--fault", "--min-slices", "--workdir", "--admin-address", "--http-address"]),
    ],
    ids=["top", "coordinator", "worker", "admin", "demo"],
)
def test_help_exits_0_and_names_the_main_flags(role: str | None, flags: list[str]) -> None:
    argv = [*_entry_point(), *([role] if role else []), "--help"]
    r = subprocess.run(argv, cwd=REPO, env=clean_env(COLUMNS="200"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: elastic-sidecar")
    for f in flags:
        assert f in r.stdout, f"{f} missing from {' '.join(argv[1:])}:\n{r.stdout}"


# ---------------------------------------------------------------------------
# environment variables
# ---------------------------------------------------------------------------


def parse(*argv: str) -> object:
    # The parser reads ES_* when it is built, so build it after monkeypatching.
    return build_parser().parse_args(list(argv))


def test_env_num_slices_replaces_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ES_NUM_SLICES", "3")
    monkeypatch.setenv("ES_ELASTIC_MIN_SLICE_COUNT", "2")
    monkeypatch.setenv("ES_JOB", "from-env")
    cfg = CoordinatorConfig.from_args(parse("coordinator"))
    assert cfg.policy.num_slices == 3
    assert cfg.policy.elastic_min_slice_count == 2
    assert cfg.job == "from-env"


def test_flag_wins_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ES_NUM_SLICES", "3")
    cfg = CoordinatorConfig.from_args(parse("coordinator", "--num-slices", "5"))
    assert cfg.policy.num_slices == 5


@pytest.mark.parametrize(
    ("flag", "attr"), [("--heartbeat-datagrams", "heartbeat_datagrams"), ("--gc-freeze", "gc_freeze")]
)
def test_coordinator_switches_default_on_and_go_off_by_flag_or_env(
    monkeypatch: pytest.MonkeyPatch, flag: str, attr: str
) -> None:
    assert getattr(CoordinatorConfig.from_args(parse("coordinator", "--num-slices", "2")), attr) is True
    off = parse("coordinator", "--num-slices", "2", flag, "off")
    assert getattr(CoordinatorConfig.from_args(off), attr) is False
    monkeypatch.setenv("ES_" + flag.lstrip("-").replace("-", "_").upper(), "off")
    assert getattr(CoordinatorConfig.from_args(parse("coordinator", "--num-slices", "2")), attr) is False


def test_bad_env_value_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ES_NUM_SLICES", "0")
    with pytest.raises(SystemExit) as e:
        parse("coordinator")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--num-slices" in err and "got '0' (from ES_NUM_SLICES)" in err, err


def test_worker_identity_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ES_SLICE", "2")
    monkeypatch.setenv("ES_HOST", "1")
    monkeypatch.delenv("NODE_NAME", raising=False)
    cfg = WorkerConfig.from_args(parse("worker"))
    assert (cfg.slice, cfg.host, cfg.node) == (2, 1, "host-2-1")


def test_env_num_slices_starts_a_real_coordinator(tmp_path: Path) -> None:
    """``ES_NUM_SLICES=3 elastic-sidecar coordinator`` serves, and exits 0 on SIGTERM."""
    argv = [sys.executable, "-m", "agent", "coordinator", "--listen", "127.0.0.1:0", "--log-format", "json"]
    argv += ["--trainer-listen", f"127.0.0.1:{free_port()}", "--admin-listen", "none", "--http-listen", "none"]
    p = subprocess.Popen(
        argv,
        cwd=REPO,
        env=clean_env(ES_NUM_SLICES="3", ES_JOB="env-job", PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line or "coordinator listening" in line:
                break
        rec = json.loads(line)
        assert rec["message"] == "coordinator listening"
        assert rec["policy"]["num_slices"] == 3
        assert rec["port"] > 0
        assert rec["logging.googleapis.com/labels"]["jobset"] == "env-job"
        # The line is written just before run() installs its SIGTERM handler; on a loaded
        # machine the process can be preempted in between, so give it a moment.
        time.sleep(0.3)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=15) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# ---------------------------------------------------------------------------
# notices: project filters, lead time, node pool source, --health-target none
# ---------------------------------------------------------------------------


def test_pubsub_project_ids_and_numbers_repeatable_or_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = CoordinatorConfig.from_args(
        parse(
            "coordinator",
            "--num-slices=2",
            "--pubsub-project=tpu-proj,other-proj",
            "--pubsub-project",
            "third-proj",
            "--pubsub-project-number=123456789012",
        )
    )
    assert cfg.pubsub_project == ("tpu-proj", "other-proj", "third-proj", "123456789012")
    monkeypatch.setenv("ES_PUBSUB_PROJECT", "env-proj")
    monkeypatch.setenv("ES_PUBSUB_PROJECT_NUMBER", "42,43")
    assert CoordinatorConfig.from_args(parse("coordinator", "--num-slices=2")).pubsub_project == (
        "env-proj",
        "42",
        "43",
    )


def test_a_project_number_given_as_an_id_and_the_reverse_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"--pubsub-project '123456789012' looks like a project number"):
        CoordinatorConfig.from_args(parse("coordinator", "--num-slices=2", "--pubsub-project=123456789012"))
    with pytest.raises(ConfigError, match=r"--pubsub-project-number 'tpu-proj' is not a project number"):
        CoordinatorConfig.from_args(parse("coordinator", "--num-slices=2", "--pubsub-project-number=tpu-proj"))


def test_notice_lead_seconds() -> None:
    assert CoordinatorConfig.from_args(parse("coordinator", "--num-slices=2")).policy.notice_lead_seconds == 120.0
    cfg = CoordinatorConfig.from_args(parse("coordinator", "--num-slices=2", "--notice-lead-seconds=30"))
    assert cfg.policy.notice_lead_seconds == 30.0
    with pytest.raises(SystemExit):
        parse("coordinator", "--num-slices=2", "--notice-lead-seconds=-1")


def test_health_target_none_and_node_pool_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cfg = WorkerConfig.from_args(parse("worker", "--slice=0", "--health-target", "none"))
    assert cfg.health_target is None and cfg.node_pool_source == "none" and cfg.kubernetes_api is None
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    cfg = WorkerConfig.from_args(parse("worker", "--slice=0", "--node-pool-source=kubernetes"))
    assert cfg.node_pool_source == "kubernetes" and cfg.kubernetes_api == "https://10.0.0.1:443"
    with pytest.raises(ConfigError, match="--kubernetes-api must be an http"):
        WorkerConfig.from_args(parse("worker", "--slice=0", "--kubernetes-api=10.0.0.1"))


def test_the_first_heartbeat_timeout_defaults_to_three_heartbeat_timeouts_and_cannot_undercut_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    default = CoordinatorConfig.from_args(parse("coordinator", "--num-slices", "2")).first_heartbeat_seconds
    assert default == pytest.approx(3.6)
    cfg = CoordinatorConfig.from_args(parse("coordinator", "--num-slices", "2", "--heartbeat-timeout", "2"))
    assert cfg.first_heartbeat_seconds == 6.0
    cfg = CoordinatorConfig.from_args(parse("coordinator", "--num-slices", "2", "--first-heartbeat-timeout", "5"))
    assert cfg.first_heartbeat_seconds == 5.0
    with pytest.raises(ConfigError, match=r"--first-heartbeat-timeout \(0.5\) must not be shorter than"):
        CoordinatorConfig.from_args(parse("coordinator", "--num-slices", "2", "--first-heartbeat-timeout", "0.5"))
    monkeypatch.setenv("ES_FIRST_HEARTBEAT_TIMEOUT", "4.5")
    assert CoordinatorConfig.from_args(parse("coordinator", "--num-slices", "2")).first_heartbeat_seconds == 4.5


def test_flags_doc_is_generated_from_the_flag_table() -> None:
    """docs/flags.md is made from agent.config's table: regenerate it with `python -m agent.config`."""
    from agent.config import COORDINATOR_FLAGS, WORKER_FLAGS, flags_markdown

    doc = (REPO / "docs" / "flags.md").read_text()
    assert doc == flags_markdown(), "docs/flags.md is stale: run `python -m agent.config > docs/flags.md`"
    for flag in (*COORDINATOR_FLAGS, *WORKER_FLAGS):
        assert f"| `{flag.name}` | `{flag.env}` |" in doc


def test_every_parser_flag_comes_from_the_table() -> None:
    """The parsers hold exactly the table's flags, so the generated doc lists every one."""
    from agent.config import COORDINATOR_FLAGS, WORKER_FLAGS

    parser = build_parser()
    (subs,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for role, table in (("coordinator", COORDINATOR_FLAGS), ("worker", WORKER_FLAGS)):
        options = [o for a in subs.choices[role]._actions for o in a.option_strings if o not in ("-h", "--help")]
        assert options == [f.name for f in table]


def test_straggler_replace_is_off_by_default_and_needs_a_way_to_the_api(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert CoordinatorConfig.from_args(parse("coordinator", "--num-slices=2")).policy.straggler_replace is False
    with pytest.raises(ConfigError, match="give --kubeconfig PATH"):
        CoordinatorConfig.from_args(parse("coordinator", "--num-slices=2", "--straggler-replace=on"))
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=f"--kubeconfig '{missing}': no such file"):
        CoordinatorConfig.from_args(
            parse("coordinator", "--num-slices=2", "--straggler-replace=on", f"--kubeconfig={missing}")
        )
    kc = tmp_path / "kubeconfig"
    kc.write_text("apiVersion: v1\nkind: Config\n")
    cfg = CoordinatorConfig.from_args(
        parse("coordinator", "--num-slices=2", "--straggler-replace=on", f"--kubeconfig={kc}")
    )
    assert cfg.policy.straggler_replace is True and cfg.kubeconfig == kc
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("ES_STRAGGLER_REPLACE", "on")
    cfg = CoordinatorConfig.from_args(parse("coordinator", "--num-slices=2"))
    assert cfg.policy.straggler_replace is True and cfg.kubeconfig is None  # in-cluster
