"""Test-run options shared by every test package: tiers, hypothesis profiles, ``--runslow``.

Tiers: each test gets exactly one of the markers ``unit`` (no process started), ``integration``
(daemons on loopback, in-process or as processes, a fake trainer) or ``e2e`` (the JAX trainer's
simulated job, the real MaxText, Chromium, wheel builds, benchmark smoke runs); ``make test-unit``,
``test-integration`` and ``test-e2e`` run one each. They are assigned here, not in the test files;
a test left in ``unit`` that starts a process fails, so a new one cannot slip in.

Hypothesis profiles: ``ci`` (the default, what ``make test`` runs) is derandomised with a fixed
budget and no example database, so every run draws the same cases; ``explore`` draws ten times as
many at random and keeps failures in ``.hypothesis/``: ``--hypothesis-profile=explore`` or
``HYPOTHESIS_PROFILE=explore``.

``--runslow`` also runs tests marked ``slow`` (long benchmarks and soak runs); the default run
leaves them out.

A test gives every daemon it starts free ports (``simjob.ports.free_port``) or ``none``, never the
daemons' defaults: the run holds those (bound, not listening) so that one that binds them fails at
once in every run, not by chance when two tests or pytest-xdist workers meet on one.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Generator

import pytest
from hypothesis import HealthCheck, settings

from agent import constants as C

_DEFAULT = settings.get_profile("default")  # Hypothesis' own; its "ci" is replaced below
settings.register_profile(
    "ci",
    _DEFAULT,
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore", _DEFAULT, max_examples=3000, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
# Loaded before the test modules import, so their @settings inherit from it; the pytest plugin's
# --hypothesis-profile, read later, wins over this.
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

TIERS = ("unit", "integration", "e2e")

# Node id prefixes (a file, or the start of a test's name) outside ``unit``: found by grepping for
# subprocess, Popen and the demo runners, and checked at run time by the audit hook below. A test
# marked ``e2e`` or ``maxtext`` in its file is e2e; one using a fixture of PROCESS_FIXTURES
# (session-scoped: only its first user would be caught starting it) is integration.
E2E = (
    "tests/bench/test_bench_smoke.py",
    "tests/deploy/test_wheel.py",
    "tests/deploy/test_trainer_dist.py::test_wheel",
    "tests/servers/test_status_page.py",
)
INTEGRATION = (
    "tests/agent/",  # the daemons over loopback gRPC, in-process or as processes
    "tests/bench/test_heartbeat_clock.py",
    "tests/bench/test_host_link.py",
    "tests/bench/test_recovery_maxtext_units.py::test_a_period_whose_pre_training_fails",
    "tests/bench/test_recovery_maxtext_units.py::test_the_config_records_the_pre_trained_start",
    "tests/bench/test_recovery_maxtext_units.py::test_without_the_maxtext_venv",
    "tests/deploy/test_manifests.py",  # kubectl kustomize (its render() is cached: any test may be first) and bash
    "tests/e2e/test_demo_faults.py::test_bad_fault_on_the_command_line",
    "tests/e2e/test_fault_matrix.py",  # on the NumPy trainer; its [jax] runs are marked e2e
    "tests/e2e/test_trainer_numpy.py::test_the_numpy_backend_imports_no_jax",
    "tests/maxtext/test_cpu_elastic_unit.py::test_a_lost_slice_deletes",
    "tests/maxtext/test_cpu_elastic_unit.py::test_the_kinder_runtime",
    "tests/maxtext/test_hook_unit.py::test_importing_the_maxtext_hooks",
    "tests/servers/test_admin_cli.py",
    "tests/servers/test_admin_stragglers.py",
    "tests/servers/test_auth.py::test_the_admin_api_over_tls_with_the_cli",
    "tests/servers/test_auth.py::test_the_daemon_refuses_a_placeholder_token",
    "tests/servers/test_layering.py::test_importing_the_servers",
    "tests/servers/test_listen.py::test_a_second_coordinator_on_a_held_port",
    "tests/servers/test_logs.py",
    "tests/sources/test_health.py",
    "tests/sources/test_intake_degraded.py",
    "tests/sources/test_pubsub_intake.py",
    "tests/standins/test_loss_simulator.py",
    "tests/trainer_hooks/test_guard.py::test_a_hung_sidecar_during_a_hold",
    "tests/trainer_hooks/test_guard.py::test_the_example_trainer_exits_42",
    "tests/trainer_hooks/test_multi_controller.py::test_a_single_controller_session_arms_no_watchdog",
    "tests/trainer_hooks/test_multi_controller.py::test_abort_ends_a_process",
    "tests/trainer_hooks/test_session.py::test_import_does_not_pull_in_the_daemon",
    "tests/trainer_hooks/test_snapshot.py::test_a_rebuild_reads_only_the_surviving_slices",
    "tests/trainer_hooks/test_snapshot.py::test_a_snapshot_is_rebuilt_from_the_surviving_slices",
    "tests/trainer_hooks/test_snapshot_lost_replica.py",
)
PROCESS_FIXTURES = frozenset({"pubsub_emulator"})

# Audit events (PEP 578) for starting a process; asyncio's subprocesses go through subprocess.Popen.
_PROCESS_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system"}
)
_running: list[str] = []  # the node id of the test being run, while one is
_started: dict[str, list[str]] = {}


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event in _PROCESS_EVENTS and _running:
        what = repr(args[1])[:200] if event == "subprocess.Popen" else event
        _started.setdefault(_running[0], []).append(what)


def tier_of(item: pytest.Item) -> str:
    nodeid = item.nodeid
    if item.get_closest_marker("e2e") or item.get_closest_marker("maxtext") or nodeid.startswith(E2E):
        return "e2e"
    if nodeid.startswith(INTEGRATION) or PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "integration"
    return "unit"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


DEFAULT_PORTS = (C.COORDINATOR_PORT, C.ADMIN_PORT, C.HTTP_PORT, C.TRAINER_PORT)
_held: list[socket.socket] = []


def _hold_default_ports() -> None:
    # Without SO_REUSEADDR a bound socket refuses any other bind of its port on Linux, also one with
    # SO_REUSEADDR or SO_REUSEPORT set (grpc's and asyncio's listeners), and to 0.0.0.0; not
    # listening, it refuses connections as a free port does. A port held already (by the
    # pytest-xdist controller of this run, or a sidecar running here) stays as it is.
    for port in DEFAULT_PORTS:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        _held.append(s)


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(_audit)
    _hold_default_ports()


def pytest_unconfigure(config: pytest.Config) -> None:
    while _held:
        _held.pop().close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(tier_of(item))
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    _running.append(item.nodeid)
    try:
        return (yield)
    finally:
        _running.remove(item.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, object]:
    report = yield
    started = _started.get(item.nodeid)
    if call.when == "teardown" and started and item.get_closest_marker("unit"):
        assert isinstance(report, pytest.TestReport)
        report.outcome = "failed"
        report.longrepr = (
            f"a unit test started a process ({'; '.join(started[:3])}): "
            "list it under INTEGRATION or E2E in tests/conftest.py"
        )
    return report
