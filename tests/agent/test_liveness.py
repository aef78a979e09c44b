"""Liveness with real processes: an in-process coordinator, worker sidecar subprocesses.

Every test starts its own :class:`agent.coordinator.Coordinator` on an
ephemeral loopback port and ``python -m agent worker`` subprocesses (and, for
the health test, a stand-in Pathways worker). The coordinator's decisions are
observed by wrapping ``coord.apply``; the detection latencies are printed
(``pytest -s``) and collected in ``LATENCIES``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent import constants as C
from agent.config import WorkerConfig
from agent.coordinator import Coordinator
from agent.core.model import Decision, Event, Policy, WorkerAway, WorkerHealth, WorkerJoined, WorkerLost
from agent.sources.peers import AWAY_PROBE_SECONDS, PROBE_BOUND_SECONDS
from agent.worker import Worker
from simjob.ports import free_port
from standins.pathways_worker import serve_slow_checks
from tests.agent.coordinators import coordinator_config

REPO = Path(__file__).resolve().parents[2]
JOB = "liveness-job"
HEARTBEAT_INTERVAL = 0.25
HEARTBEAT_TIMEOUT = 1.2
START_TIMEOUT = 20.0
"""Python start-up plus grpc import of a subprocess; generous for a loaded 2-core machine."""

LATENCIES: dict[str, float] = {}


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


@dataclass
class Applied:
    at: float
    event: Event
    decision: Decision


@dataclass
class Observed:
    """A coordinator whose every applied event is recorded with its time."""

    coord: Coordinator
    log: list[Applied] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.coord.port}"

    def events(self, kind: type, pred: Callable[[Any], bool] = lambda e: True) -> list[Applied]:
        return [a for a in self.log if isinstance(a.event, kind) and pred(a.event)]

    async def wait_for(
        self, cond: Callable[[], Any], timeout: float, what: str, procs: Sequence[subprocess.Popen[bytes]] = ()
    ) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            v = cond()
            if v:
                return v
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.args}\n{tail(p)}" for p in procs)
                raise AssertionError(
                    f"timed out after {timeout} s waiting for {what}; decisions: {self.reasons()}\n{logs}"
                )
            await asyncio.sleep(0.005)

    def reasons(self) -> list[str]:
        return [a.decision.reason for a in self.log if type(a.event).__name__ != "Tick"][-20:]


async def start_coordinator(
    num_slices: int = 2, hosts_per_slice: int = 1, datagrams: bool = True, **policy: Any
) -> Observed:
    cfg = coordinator_config(
        JOB,
        Policy(num_slices=num_slices, hosts_per_slice=hosts_per_slice, **policy),
        heartbeat_datagrams=datagrams,
        heartbeat_interval=HEARTBEAT_INTERVAL,
        heartbeat_timeout=HEARTBEAT_TIMEOUT,
    )
    coord = Coordinator(cfg)
    obs = Observed(coord)
    inner = coord.apply

    def apply(ev: Event, now: float) -> Decision:
        d = inner(ev, now)
        obs.log.append(Applied(time.monotonic(), ev, d))
        return d

    coord.apply = apply  # type: ignore[method-assign]
    await coord.start()
    assert coord.port > 0
    return obs


@pytest.fixture
async def coordinator() -> AsyncIterator[Observed]:
    obs = await start_coordinator()
    try:
        yield obs
    finally:
        await obs.coord.stop(grace=0.1)


class Procs:
    """Subprocesses this test started; all killed (SIGCONT first) at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        path = self.tmp / f"{len(self.procs)}-{name}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(path, "wb") as out:  # the child keeps its own copy of the descriptor
            p = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
        p.log_path = path  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def worker(
        self, coord_port: int, slice_: int, host: int = 0, *, job: str = JOB, extra: tuple[str, ...] = ()
    ) -> subprocess.Popen[bytes]:
        return self.spawn(
            f"worker-{slice_}-{host}",
            [
                "-m",
                "agent",
                "worker",
                "--job",
                job,
                "--coordinator",
                f"127.0.0.1:{coord_port}",
                "--slice",
                str(slice_),
                "--host",
                str(host),
                "--log-format",
                "json",
                *extra,
            ],
        )

    def pathways(self, port: int) -> subprocess.Popen[bytes]:
        return self.spawn(f"pathways-{port}", ["-m", "standins.pathways_worker", "--port", str(port)])

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - kill cannot be refused
                pass


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.cleanup()


async def serving(p: subprocess.Popen[bytes], port: int, timeout: float = START_TIMEOUT) -> bool:
    """Wait until ``p`` accepts connections on ``port``; False if it exited (port taken meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            return False
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return True
        except OSError:
            await asyncio.sleep(0.02)
    raise AssertionError(f"{p.args} did not serve on {port} within {timeout} s:\n{tail(p)}")


async def start_pathways(procs: Procs, port: int | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """A stand-in Pathways worker serving grpc.health.v1 on a free (or the given) port."""
    for _ in range(5):
        pw_port = port or free_port()
        pw = procs.pathways(pw_port)
        if await serving(pw, pw_port):
            return pw, pw_port
    raise AssertionError(f"no stand-in Pathways worker could listen:\n{tail(pw)}")


def log_lines(p: subprocess.Popen[bytes]) -> list[dict[str, Any]]:
    out = []
    for line in Path(p.log_path).read_text(errors="replace").splitlines():  # type: ignore[attr-defined]
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            out.append({"message": line})
    return out


def tail(p: subprocess.Popen[bytes], n: int = 15) -> str:
    return "\n".join(Path(p.log_path).read_text(errors="replace").splitlines()[-n:])  # type: ignore[attr-defined]


async def wait_exit(p: subprocess.Popen[bytes], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while p.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"process {p.args} did not exit within {timeout} s")
        await asyncio.sleep(0.02)
    return p.returncode


async def wait_registered(obs: Observed, keys: set[tuple[int, int]], procs: list[subprocess.Popen[bytes]]) -> None:
    def ok() -> bool:
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{p.args} exited with {p.returncode}:\n{tail(p)}")
        return keys <= set(obs.coord.state.hosts) and keys <= set(obs.coord.workers)

    await obs.wait_for(ok, START_TIMEOUT, f"hosts {sorted(keys)} to register")


def record(name: str, seconds: float) -> None:
    LATENCIES[name] = seconds
    print(f"\n[liveness] {name}: {seconds * 1000:.1f} ms")


# ---------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------


async def test_all_workers_register(procs: Procs) -> None:
    obs = await start_coordinator(num_slices=2, hosts_per_slice=2)
    try:
        keys = {(s, h) for s in range(2) for h in range(2)}
        ps = [procs.worker(obs.coord.port, s, h) for s, h in sorted(keys)]
        await wait_registered(obs, keys, ps)
        state = obs.coord.state
        assert set(state.hosts) == keys
        assert all(r.healthy for r in state.hosts.values())
        assert state.up_slices() == frozenset({0, 1})
        # Every incarnation is distinct and each join was applied exactly once.
        assert len({r.incarnation for r in state.hosts.values()}) == 4
        assert len(obs.events(WorkerJoined)) == 4
        # Heartbeats keep them registered well past the heartbeat timeout.
        await asyncio.sleep(HEARTBEAT_TIMEOUT * 1.5)
        assert set(obs.coord.state.hosts) == keys
        assert not obs.events(WorkerLost)
    finally:
        await obs.coord.stop(grace=0.1)


async def test_sigkill_is_noticed_as_stream_closed(coordinator: Observed, procs: Procs) -> None:
    obs = coordinator
    ps = [procs.worker(obs.coord.port, s) for s in range(2)]
    await wait_registered(obs, {(0, 0), (1, 0)}, ps)
    inc = obs.coord.state.hosts[(1, 0)].incarnation

    t0 = time.monotonic()
    ps[1].kill()
    lost = await obs.wait_for(lambda: obs.events(WorkerLost), 5.0, "the killed worker to be lost")
    latency = lost[0].at - t0
    record("kill_detection", latency)

    ev = lost[0].event
    assert (ev.slice, ev.host, ev.incarnation, ev.cause) == (1, 0, inc, "stream_closed")
    assert (1, 0) not in obs.coord.state.hosts
    assert (0, 0) in obs.coord.state.hosts
    assert obs.coord.state.up_slices() == frozenset({0})
    assert latency < 0.5, f"SIGKILL noticed after {latency:.3f} s"


async def test_sigstop_is_noticed_as_heartbeat_timeout(coordinator: Observed, procs: Procs) -> None:
    obs = coordinator
    ps = [procs.worker(obs.coord.port, s) for s in range(2)]
    await wait_registered(obs, {(0, 0), (1, 0)}, ps)
    inc = obs.coord.state.hosts[(0, 0)].incarnation
    # A running host: heard from since its registration (before that, the longer first timeout applies;
    # see test_a_just_registered_worker_gets_the_first_heartbeat_timeout_then_the_usual_one).
    # The reply written first (``replied_at`` set; before it, ``last_seen`` and ``credited`` differ by
    # their defaults alone, and a reply written after the stop would give the first timeout: 3.7 s seen
    # under load), then a message read after it.
    conn = obs.coord.workers[(0, 0)]
    await obs.wait_for(
        lambda: conn.replied_at > 0 and conn.last_seen != conn.credited, 5.0, "a heartbeat after the reply", ps
    )

    t0 = time.monotonic()
    ps[0].send_signal(signal.SIGSTOP)
    try:
        lost = await obs.wait_for(lambda: obs.events(WorkerLost), 5.0, "the stopped worker to be lost")
        latency = lost[0].at - t0
        record("hang_detection", latency)
        ev = lost[0].event
        assert (ev.slice, ev.host, ev.incarnation, ev.cause) == (0, 0, inc, "heartbeat_timeout")
        assert (0, 0) not in obs.coord.state.hosts
        assert (1, 0) in obs.coord.state.hosts
        assert latency < 2.0, f"SIGSTOP noticed after {latency:.3f} s"
        assert ps[0].poll() is None  # stopped, not dead: only the heartbeat told
    finally:
        ps[0].send_signal(signal.SIGCONT)
        ps[0].kill()


@pytest.mark.parametrize(
    ("job", "slice_", "code_word", "reason_words"),
    [
        ("some-other-job", 0, "job", ["some-other-job", JOB]),
        (JOB, 7, "slice", ["identity.slice=7", "2 slices"]),
    ],
    ids=["wrong-job", "slice-out-of-range"],
)
async def test_refused_worker_exits_2_naming_the_reason(
    coordinator: Observed, procs: Procs, job: str, slice_: int, code_word: str, reason_words: list[str]
) -> None:
    obs = coordinator
    p = procs.worker(obs.coord.port, slice_, job=job)
    rc = await wait_exit(p, START_TIMEOUT)
    assert rc == 2, log_lines(p)
    refused = [rec for rec in log_lines(p) if rec.get("message") == "coordinator refused this worker"]
    assert refused, log_lines(p)
    detail = refused[0]["detail"]
    assert code_word in detail
    for w in reason_words:
        assert w in detail, detail
    assert refused[0]["severity"] == "ERROR"
    assert not obs.coord.state.hosts
    assert not obs.coord.workers
    assert not obs.events(WorkerJoined)


async def test_dead_pathways_worker_makes_host_unhealthy(coordinator: Observed, procs: Procs) -> None:
    obs = coordinator
    pw, pw_port = await start_pathways(procs)
    ps = [
        procs.worker(obs.coord.port, 0, extra=("--health-target", f"127.0.0.1:{pw_port}")),
        procs.worker(obs.coord.port, 1),
    ]
    await wait_registered(obs, {(0, 0), (1, 0)}, [pw, *ps])
    assert obs.coord.state.hosts[(0, 0)].healthy
    assert obs.coord.state.up_slices() == frozenset({0, 1})

    t0 = time.monotonic()
    pw.kill()
    report = await obs.wait_for(
        lambda: obs.events(WorkerHealth, lambda e: not e.healthy),
        10.0,
        "the worker to report its Pathways worker down",
        [pw, *ps],
    )
    record("pathways_death_detection", report[0].at - t0)
    ev = report[0].event
    assert (ev.slice, ev.host) == (0, 0)
    assert str(pw_port) in ev.detail
    rec = obs.coord.state.hosts[(0, 0)]
    assert rec.healthy is False  # still registered: the sidecar lives, its Pathways worker does not
    assert obs.coord.state.up_slices() == frozenset({1})
    assert not obs.coord.state.slice_up(0)
    assert not obs.events(WorkerLost)
    assert ps[0].poll() is None

    # It comes back: the same port serves again and the host turns healthy.
    await start_pathways(procs, pw_port)
    await obs.wait_for(lambda: obs.coord.state.hosts[(0, 0)].healthy, START_TIMEOUT, "the host to turn healthy again")
    assert obs.coord.state.up_slices() == frozenset({0, 1})


async def test_health_lost_while_registering_is_still_reported(coordinator: Observed) -> None:
    """The local Pathways worker dies while the Register is in flight (in-process worker, deterministic)."""
    obs = coordinator
    cfg = WorkerConfig(
        job=JOB,
        coordinator=obs.address,
        slice=0,
        host=0,
        node="n0",
        node_pool="",
        pod="",
        health_target=None,
        health_check="grpc",
        log_format="json",
        log_level="warning",
    )
    w = Worker(cfg)
    identity = w._identity

    def identity_then_die() -> Any:
        ident = identity()
        w._on_health(False, "died during registration")
        return ident

    w._identity = identity_then_die  # type: ignore[method-assign]
    task = asyncio.create_task(w._session())
    try:
        await obs.wait_for(lambda: (0, 0) in obs.coord.state.hosts, START_TIMEOUT, "the in-process worker to register")
        await obs.wait_for(
            lambda: obs.events(WorkerHealth, lambda e: not e.healthy), 5.0, "the unhealthy report after registering"
        )
        assert obs.coord.state.hosts[(0, 0)].healthy is False
        assert not obs.coord.state.slice_up(0)
    finally:
        w._stopping = True
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_sigterm_is_graceful(coordinator: Observed, procs: Procs) -> None:
    obs = coordinator
    ps = [procs.worker(obs.coord.port, s) for s in range(2)]
    await wait_registered(obs, {(0, 0), (1, 0)}, ps)

    t0 = time.monotonic()
    ps[1].terminate()
    rc = await wait_exit(ps[1], 10.0)
    assert rc == 0, log_lines(ps[1])
    lost = await obs.wait_for(lambda: obs.events(WorkerLost), 5.0, "the stopped worker to be lost")
    record("sigterm_detection", lost[0].at - t0)
    assert (lost[0].event.slice, lost[0].event.host) == (1, 0)
    assert lost[0].event.cause in ("shutdown", "stream_closed")
    print(f"[liveness] sigterm cause: {lost[0].event.cause}")
    assert (1, 0) not in obs.coord.state.hosts
    assert any(rec.get("message") == "worker stopping" for rec in log_lines(ps[1]))


# ---------------------------------------------------------------------------
# the coordinator's own failures: a blocked loop, a sidecar that restarts
# ---------------------------------------------------------------------------


async def test_a_blocked_event_loop_declares_nobody_lost(coordinator: Observed, procs: Procs) -> None:
    """A 1.5 s stall of the coordinator's loop (longer than the 1.2 s heartbeat timeout) loses no one."""
    obs = coordinator
    ps = [procs.worker(obs.coord.port, s) for s in range(2)]
    await wait_registered(obs, {(0, 0), (1, 0)}, ps)
    await asyncio.sleep(0.5)
    time.sleep(1.5)  # blocks the event loop, as a long synchronous call would
    await asyncio.sleep(2 * HEARTBEAT_TIMEOUT)
    assert not obs.events(WorkerLost), obs.reasons()
    assert obs.coord.loop_watch.stalls and max(obs.coord.loop_watch.stalls) >= 1.0
    assert obs.coord.metrics.loop_stalls._value.get() >= 1  # noqa: SLF001
    # and a worker that really hangs afterwards is still found
    ps[1].send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    lost = await obs.wait_for(lambda: obs.events(WorkerLost), 5.0, "the hung worker to be lost", ps)
    record("hang_detection_after_stall", lost[0].at - t0)
    assert lost[0].event.cause == "heartbeat_timeout" and lost[0].at - t0 < 2.0


async def test_a_sidecar_restart_on_a_healthy_host_is_not_a_loss(coordinator: Observed, procs: Procs) -> None:
    obs = coordinator
    pw, pw_port = await start_pathways(procs)
    target = ("--health-target", f"127.0.0.1:{pw_port}")
    ps = [procs.worker(obs.coord.port, 0, extra=target), procs.worker(obs.coord.port, 1)]
    await wait_registered(obs, {(0, 0), (1, 0)}, [pw, *ps])
    old = obs.coord.state.hosts[(0, 0)].incarnation
    ps[0].kill()  # the sidecar alone: its Pathways worker keeps serving
    away = await obs.wait_for(lambda: obs.events(WorkerAway), 5.0, "the coordinator to find the host still up", ps)
    assert (away[0].event.slice, away[0].event.incarnation) == (0, old)
    assert obs.coord.state.up_slices() == frozenset({0, 1})
    again = procs.worker(obs.coord.port, 0, extra=target)
    await obs.wait_for(
        lambda: obs.coord.state.hosts.get((0, 0)) is not None and obs.coord.state.hosts[(0, 0)].incarnation != old,
        START_TIMEOUT,
        "the new sidecar to register",
        [again],
    )
    assert not obs.events(WorkerLost), obs.reasons()
    assert obs.coord.state.up_slices() == frozenset({0, 1}) and obs.coord.state.retries_used == 0
    assert obs.coord.state.hosts[(0, 0)].away_since is None


async def test_a_dead_host_is_lost_at_once_even_with_a_health_address(coordinator: Observed, procs: Procs) -> None:
    obs = coordinator
    pw, pw_port = await start_pathways(procs)
    ps = [procs.worker(obs.coord.port, 0, extra=("--health-target", f"127.0.0.1:{pw_port}"))]
    await wait_registered(obs, {(0, 0)}, [pw, *ps])
    t0 = time.monotonic()
    pw.kill()
    ps[0].kill()  # the whole host: sidecar and Pathways worker
    lost = await obs.wait_for(lambda: obs.events(WorkerLost), 5.0, "the dead host to be lost", ps)
    record("host_kill_detection_with_probe", lost[0].at - t0)
    assert lost[0].at - t0 < 0.5
    assert not obs.events(WorkerAway)


async def test_a_host_found_dead_while_its_sidecar_is_away_is_lost(coordinator: Observed, procs: Procs) -> None:
    obs = coordinator
    pw, pw_port = await start_pathways(procs)
    ps = [procs.worker(obs.coord.port, 0, extra=("--health-target", f"127.0.0.1:{pw_port}"))]
    await wait_registered(obs, {(0, 0)}, [pw, *ps])
    ps[0].kill()
    await obs.wait_for(lambda: obs.events(WorkerAway), 5.0, "the sidecar to be away", ps)
    t0 = time.monotonic()
    pw.kill()
    lost = await obs.wait_for(lambda: obs.events(WorkerLost), 5.0, "the host to be lost", ps)
    assert lost[0].event.cause == "sidecar_gone_host_down" and lost[0].at - t0 < 1.5


async def test_one_slow_host_check_is_no_loss_and_a_host_that_never_answers_is_lost(
    coordinator: Observed, procs: Procs
) -> None:
    """A check that gets no answer in time is repeated: a busy moment costs nothing, a hung host is lost."""
    obs = coordinator
    port = free_port()
    server, hs = await serve_slow_checks(port)
    try:
        ps = [procs.worker(obs.coord.port, 0, extra=("--health-target", f"127.0.0.1:{port}"))]
        await wait_registered(obs, {(0, 0)}, ps)
        hs.slow = 1  # the check made when the sidecar's stream closes answers too late
        ps[0].kill()
        await obs.wait_for(lambda: obs.events(WorkerAway), 5.0, "the sidecar to be away", ps)
        assert hs.slow == 0
        hs.slow = 1  # and one of the checks while it is away
        n = hs.checks
        await obs.wait_for(lambda: hs.slow == 0 and hs.checks >= n + 3, 5.0, "a slow check, then more")
        assert not obs.events(WorkerLost), obs.reasons()
        assert (0, 0) in obs.coord.state.hosts and obs.coord.state.retries_used == 0

        hs.slow = 10**6  # hung: no check is answered in time any more
        t0 = time.monotonic()
        lost = await obs.wait_for(lambda: obs.events(WorkerLost), 5.0, "the hung host to be lost", ps)
        assert lost[0].event.cause == "sidecar_gone_host_down"
        record("hung_host_detection_while_away", lost[0].at - t0)
        # Within the next away check plus every retry; 1 s more for a loaded machine.
        assert lost[0].at - t0 < AWAY_PROBE_SECONDS + PROBE_BOUND_SECONDS + 1.0
    finally:
        await server.stop(0)


async def test_a_sidecar_away_past_the_rejoin_grace_counts_as_a_lost_host_with_a_tcp_check(procs: Procs) -> None:
    """A TCP connect from outside cannot see a hung host behind an open port: the away time is bounded."""
    obs = await start_coordinator(num_slices=1, rejoin_grace_seconds=1.5)
    try:
        pw, pw_port = await start_pathways(procs)
        extra = ("--health-target", f"127.0.0.1:{pw_port}", "--health-check", "tcp")
        ps = [procs.worker(obs.coord.port, 0, extra=extra)]
        await wait_registered(obs, {(0, 0)}, [pw, *ps])
        ps[0].kill()
        away = await obs.wait_for(lambda: obs.events(WorkerAway), 5.0, "the sidecar to be away", ps)
        lost = await obs.wait_for(lambda: obs.events(WorkerLost), 5.0, "the away host to count as lost", ps)
        assert lost[0].event.cause == "sidecar_gone"
        assert 1.4 <= lost[0].at - away[0].at <= 3.0
    finally:
        await obs.coord.stop(grace=0.1)


async def test_a_sidecar_away_past_the_rejoin_grace_stays_up_while_its_host_answers_grpc_health(
    procs: Procs,
) -> None:
    """Lost means lost: the Pathways worker's process answers its health check, so the host is up."""
    obs = await start_coordinator(num_slices=1, rejoin_grace_seconds=1.5)
    try:
        pw, pw_port = await start_pathways(procs)
        ps = [procs.worker(obs.coord.port, 0, extra=("--health-target", f"127.0.0.1:{pw_port}"))]
        await wait_registered(obs, {(0, 0)}, [pw, *ps])
        ps[0].kill()
        await obs.wait_for(lambda: obs.events(WorkerAway), 5.0, "the sidecar to be away", ps)
        await asyncio.sleep(3.5)  # well past the grace
        assert not obs.events(WorkerLost), obs.reasons()
        assert obs.coord.state.up_slices() == frozenset({0}) and obs.coord.state.retries_used == 0
        pw.kill()  # now the host itself goes: lost at once
        lost = await obs.wait_for(lambda: obs.events(WorkerLost), 5.0, "the host to be lost", ps)
        assert lost[0].event.cause == "sidecar_gone_host_down"
    finally:
        await obs.coord.stop(grace=0.1)


# ---------------------------------------------------------------------------
# heartbeat datagrams (agent/sources/heartbeat_datagrams.py)
# ---------------------------------------------------------------------------


def datagram_counts(obs: Observed) -> tuple[float, float]:
    m = obs.coord.metrics.heartbeat_datagrams
    return m.labels("accepted")._value.get(), m.labels("refused")._value.get()  # noqa: SLF001


async def test_heartbeats_move_to_datagrams_once_the_coordinator_receives_them(
    coordinator: Observed, procs: Procs
) -> None:
    obs = coordinator
    assert obs.coord.datagram_port > 0
    ps = [procs.worker(obs.coord.port, s) for s in range(2)]
    await wait_registered(obs, {(0, 0), (1, 0)}, ps)
    conns = [obs.coord.workers[(s, 0)] for s in range(2)]
    await obs.wait_for(lambda: all(c.datagrams for c in conns), 5.0, "both workers' datagrams", ps)
    # Each worker says it stopped heartbeating on its stream.
    for p in ps:
        await obs.wait_for(
            lambda p=p: any("heartbeats leave the stream" in r.get("message", "") for r in log_lines(p)),
            5.0,
            "the worker to log the switch",
            ps,
        )
    accepted0, _ = datagram_counts(obs)
    await asyncio.sleep(HEARTBEAT_TIMEOUT * 2)
    accepted1, refused = datagram_counts(obs)
    # About 4 a second from each of the two workers; they alone keep the workers registered.
    assert accepted1 - accepted0 >= 2 * (HEARTBEAT_TIMEOUT * 2 / HEARTBEAT_INTERVAL) / 2
    assert refused == 0
    assert not obs.events(WorkerLost), obs.reasons()


async def test_a_worker_whose_datagrams_never_arrive_keeps_heartbeating_on_its_stream(procs: Procs) -> None:
    """UDP blocked between the hosts: the coordinator offers a port but nothing reaches it."""
    obs = await start_coordinator()
    try:
        obs.coord.datagrams.close()  # the offered port now drops everything, as a firewall would
        ps = [procs.worker(obs.coord.port, s) for s in range(2)]
        await wait_registered(obs, {(0, 0), (1, 0)}, ps)
        await asyncio.sleep(HEARTBEAT_TIMEOUT * 3)
        assert not obs.events(WorkerLost), obs.reasons()
        assert not any(c.datagrams for c in obs.coord.workers.values())
        # and a hang is still found, through the stream's heartbeats
        ps[1].send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        lost = await obs.wait_for(lambda: obs.events(WorkerLost), 5.0, "the hung worker to be lost", ps)
        assert lost[0].event.cause == "heartbeat_timeout" and lost[0].at - t0 < 2.0
    finally:
        await obs.coord.stop(grace=0.1)


async def test_datagrams_off_keeps_heartbeats_on_the_streams(procs: Procs) -> None:
    obs = await start_coordinator(datagrams=False)
    try:
        assert obs.coord.datagram_port == 0
        ps = [procs.worker(obs.coord.port, s) for s in range(2)]
        await wait_registered(obs, {(0, 0), (1, 0)}, ps)
        await asyncio.sleep(HEARTBEAT_TIMEOUT * 2)
        assert not obs.events(WorkerLost), obs.reasons()
        assert datagram_counts(obs) == (0, 0)
    finally:
        await obs.coord.stop(grace=0.1)


async def test_a_datagram_with_another_token_does_not_keep_a_hung_worker_alive(
    coordinator: Observed, procs: Procs
) -> None:
    from protos.elastic_sidecar.v1 import peer_pb2

    obs = coordinator
    ps = [procs.worker(obs.coord.port, s) for s in range(2)]
    await wait_registered(obs, {(0, 0), (1, 0)}, ps)
    conn = obs.coord.workers[(0, 0)]
    await obs.wait_for(lambda: conn.datagrams, 5.0, "the worker's datagrams", ps)
    ps[0].send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    forged = [
        peer_pb2.HeartbeatDatagram(slice=0, host=0, token=b"x" * 16, seq=1).SerializeToString(),
        peer_pb2.HeartbeatDatagram(slice=0, host=0, token=b"", seq=1).SerializeToString(),
        peer_pb2.HeartbeatDatagram(slice=7, host=3, token=conn.token, seq=1).SerializeToString(),
        b"\xff\xfe not a protobuf",
    ]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        while not obs.events(WorkerLost) and time.monotonic() - t0 < 5.0:
            for data in forged:
                s.sendto(data, ("127.0.0.1", obs.coord.datagram_port))
            await asyncio.sleep(0.05)
    lost = obs.events(WorkerLost)
    assert lost, obs.reasons()
    assert (lost[0].event.slice, lost[0].event.cause) == (0, "heartbeat_timeout")
    assert lost[0].at - t0 < 2.0
    assert datagram_counts(obs)[1] >= len(forged)
    # Its datagrams were matched by their bytes; once lost, they no longer count.
    assert conn.datagram_key == b"" and conn not in obs.coord.datagrams.known.values()
    assert obs.coord.workers[(1, 0)].datagram_key in obs.coord.datagrams.known


def commands_logged(p: subprocess.Popen[bytes]) -> list[tuple[str, int, str]]:
    """(kind, generation, via) of each command the worker acted on (the generation is a log label)."""
    return [
        (r["kind"], int(r["logging.googleapis.com/labels"]["generation"]), r["via"])
        for r in log_lines(p)
        if r.get("message") == "coordinator command"
    ]


async def test_worker_commands_go_by_datagram_too_and_are_acted_on_once(coordinator: Observed, procs: Procs) -> None:
    """A hold reaches the workers by datagram alone (they acknowledge it); without datagrams, by stream."""
    from agent.core.model import TellWorkers

    obs = coordinator
    ps = [procs.worker(obs.coord.port, s) for s in range(2)]
    await wait_registered(obs, {(0, 0), (1, 0)}, ps)
    conns = {s: obs.coord.workers[(s, 0)] for s in range(2)}
    await obs.wait_for(lambda: all(c.reply is not None for c in conns.values()), 5.0, "both workers' datagrams", ps)
    # Worker 0's stream is stuck: its copies wait until released.
    held_back: list[Any] = []
    conns[0].outbox.put_nowait = held_back.append  # type: ignore[method-assign]
    gen = obs.coord.state.generation + 1
    obs.coord._execute(TellWorkers(gen, "hold", "test: slice 1 lost"))  # noqa: SLF001
    sent = obs.coord.metrics.command_datagrams.labels("sent")._value.get()  # noqa: SLF001
    assert sent == 2
    for p in ps:
        await obs.wait_for(lambda p=p: commands_logged(p), 5.0, "the hold to reach the worker", ps)
    first = commands_logged(ps[0])
    assert first == [("hold", gen, "datagram")]
    # Both acknowledged the datagram, so neither gets the stream's copy.
    await obs.wait_for(lambda: all(c.acked == (gen, 0) for c in conns.values()), 5.0, "both acknowledgements", ps)
    await asyncio.sleep(C.COMMAND_ACK_SECONDS + 0.3)
    assert held_back == []
    assert obs.coord.metrics.command_datagrams.labels("unacknowledged")._value.get() == 0  # noqa: SLF001
    # With the datagram socket gone the resume goes by stream.
    del conns[0].outbox.put_nowait
    for msg in held_back:
        conns[0].outbox.put_nowait(msg)
    obs.coord.datagrams.close()  # from here on only the streams carry commands
    obs.coord._execute(TellWorkers(gen, "resume", "test: slice 1 back"))  # noqa: SLF001
    await obs.wait_for(lambda: len(commands_logged(ps[0])) >= 2, 5.0, "the resume to reach worker 0", ps)
    await asyncio.sleep(0.5)
    got = commands_logged(ps[0])
    assert got == [("hold", gen, "datagram"), ("resume", gen, "stream")], got


# ---------------------------------------------------------------------------
# a just-registered worker's first heartbeat (C.FIRST_HEARTBEAT_TIMEOUT_FACTOR)
# ---------------------------------------------------------------------------


async def _register_raw(port: int, slice_: int) -> tuple[Any, Any]:
    """A Join stream with a Register and nothing after it: a worker whose reply has not reached it yet."""
    import grpc

    from protos.elastic_sidecar.v1 import peer_pb2, peer_pb2_grpc

    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = peer_pb2_grpc.PeerStub(ch).Join()
    ident = peer_pb2.HostIdentity(slice=slice_, host=0, incarnation=f"raw-{slice_}", node=f"node-{slice_}")
    await call.write(peer_pb2.WorkerMessage(register=peer_pb2.Register(identity=ident, job=JOB, local_healthy=True)))
    first = await call.read()
    assert first.HasField("registered"), first
    return ch, call


async def test_a_just_registered_worker_gets_the_first_heartbeat_timeout_then_the_usual_one(
    coordinator: Observed,
) -> None:
    from protos.elastic_sidecar.v1 import peer_pb2

    obs = coordinator
    first_timeout = obs.coord.cfg.first_heartbeat_seconds
    assert first_timeout == C.FIRST_HEARTBEAT_TIMEOUT_FACTOR * HEARTBEAT_TIMEOUT
    # Slice 0 never speaks after its registration; slice 1 heartbeats once on its stream, then falls silent.
    t0 = time.monotonic()
    ch0, _ = await _register_raw(obs.coord.port, 0)
    ch1, call1 = await _register_raw(obs.coord.port, 1)
    try:
        await asyncio.sleep(0.1)
        await call1.write(peer_pb2.WorkerMessage(heartbeat=peer_pb2.Heartbeat(seq=1, local_healthy=True)))
        t_beat = time.monotonic()
        await obs.wait_for(lambda: len(obs.events(WorkerLost)) >= 2, first_timeout + 5.0, "both silent workers lost")
        by_slice = {a.event.slice: a for a in obs.events(WorkerLost)}
        assert {s: a.event.cause for s, a in by_slice.items()} == {0: "heartbeat_timeout", 1: "heartbeat_timeout"}
        # The heartbeat ended slice 1's first grace: it is lost on the usual timeout after it.
        assert HEARTBEAT_TIMEOUT <= by_slice[1].at - t_beat < first_timeout - 0.5, by_slice[1].at - t_beat
        # Slice 0 was not lost on the usual timeout but on the first one.
        assert by_slice[0].at - t0 >= first_timeout - 0.05, by_slice[0].at - t0
        # Each loss says how long the host had been silent: slice 0 since its reply, slice 1 since its heartbeat.
        assert by_slice[0].event.silent_seconds >= first_timeout - 0.05, by_slice[0].event
        assert HEARTBEAT_TIMEOUT <= by_slice[1].event.silent_seconds < first_timeout - 0.5, by_slice[1].event
    finally:
        await ch0.close()
        await ch1.close()
