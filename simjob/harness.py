"""``elastic-sidecar demo``: a simulated multi-slice job with real processes.

Starts the coordinator sidecar, one stand-in Pathways worker plus one worker
sidecar per host (each host is its own process group, so a fault hits both),
and the example trainer on CPU devices grouped into slices. Faults are
injected when the trainer reaches the given step: ``kill`` SIGKILLs the host,
``hang`` SIGSTOPs it, ``sidecar-restart`` replaces its worker sidecar alone;
``coordinator-restart``, ``coordinator-stall`` and ``trainer-kill`` hit the
job's own processes (see :mod:`simjob.options`). The stand-in provisioner
recreates a lost slice after ``--replacement-delay``. At the end it prints a
timeline and a summary table, and writes ``--summary-json``.

:class:`Demo` is the same run as an object, so tests can also inject faults
at a moment of their choosing (a coordinator phase rather than a step).

``--mode multi-controller`` (:class:`McDemo`) starts the trainer once per host
(one JAX process each, joined by ``jax.distributed``; the coordinator with
``--trainer-processes N``); a fault on a host hits that host's trainer process
too. A stand-in for JobSet's failure policy restarts the job when a trainer
process exits with a code JobSet restarts on (:meth:`McDemo._jobset`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from agent.constants import EXIT_USAGE
from simjob.cpu_devices import cpu_device_env
from simjob.demo_common import (
    BENIGN_EXITS,
    PY,
    JsonTail,
    LiveReport,
    SetupError,
    child_env,
    committed_steps,
    drive,
    finish_line,
    fit,
    last_error,
    preflight,
    prepare_workdir,
)
from simjob.demo_common import flags as _flags
from simjob.options import (
    ANNOUNCED,
    DEFAULT_FAULTS,
    DEMO_STRAGGLER_EVIDENCE_SECONDS,
    FAULT_KINDS,
    MC_DEFAULT_FAULTS,
    MC_KINDS,
    RESTART_DELAY,
    SAME_STEP_GAP,
    FaultSpec,
    min_slices,
)
from simjob.ports import free_port
from simjob.slowdowns import MetricsHosts, Slowdowns
from simjob.steps import events_path
from simjob.summary import FaultRecord, read_jsonl, render, summarize
from standins.netproxy import Forwarder, HostLink
from standins.provisioner import Provisioner

__all__ = ["PY", "Demo", "Job", "McDemo", "McJob", "free_port", "run_demo"]
_Tail = JsonTail
"""The old name, which :mod:`simjob.strategies.common` imports."""


def straggler_flags(window_seconds: float) -> dict[str, int]:
    """The coordinator's k-of-n for demo-sized windows: a production window is a minute and a slice
    enters after 3 of 5 (minutes of evidence); a demo's windows are a fraction of a second, so the
    counts grow until entering takes ``DEMO_STRAGGLER_EVIDENCE_SECONDS`` of standing out, with the
    production ratios (enter at 3/5 of n, leave at 1/5). Windows that already hold that: no flags."""
    enter = math.ceil(DEMO_STRAGGLER_EVIDENCE_SECONDS / window_seconds)
    if enter <= 3:
        return {}
    windows = math.ceil(enter * 5 / 3)
    return {"straggler_windows": windows, "straggler_enter_hits": enter, "straggler_leave_hits": max(1, windows // 5)}


def signal_name(signum: int) -> str:
    """``SIGSEGV`` for 11; the number itself for one this platform does not name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass
class Host:
    slice: int
    host: int
    generation: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def pgid(self) -> int:
        return self.procs[0].pid

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    @property
    def sidecar(self) -> subprocess.Popen[bytes]:
        """The newest worker sidecar process (the first process is the stand-in Pathways worker)."""
        return self.procs[-1]


DEMO_JOB = "elastic-demo"
DEMO_PROJECT = "elastic-demo"
DEMO_CLUSTER = "demo-cluster"
DEMO_ZONE = "us-central2-b"


class Job:
    def __init__(self, ns: argparse.Namespace, workdir: Path) -> None:
        self.ns = ns
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.coord_port = free_port()
        self.coord_addr = f"127.0.0.1:{self.coord_port}"
        keys = [(s, h) for s in range(ns.slices) for h in range(ns.hosts_per_slice)]
        self.pw_ports = {k: free_port() for k in keys}
        self.hosts: dict[tuple[int, int], Host] = {}
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.trainer: subprocess.Popen[bytes] | None = None
        self.extra_procs: list[subprocess.Popen[bytes]] = []
        # The trainer link has its own listener (the coordinator's --trainer-listen).
        self.trainer_addr = f"127.0.0.1:{free_port()}"
        # --via-proxy: the worker sidecars' and the trainer's links pass a loopback forwarder.
        self.peer_proxy: Forwarder | None = None
        self.trainer_proxy: Forwarder | None = None
        if getattr(ns, "via_proxy", False):
            self.peer_proxy = Forwarder(self.coord_addr)
            self.trainer_proxy = Forwarder(self.trainer_addr)
        # partition faults: each host they name reaches the coordinator through a link of its own
        # (its stream and its heartbeat datagrams, on a loopback address of its own) that can be cut.
        cut = sorted({(f.slice, f.host) for f in getattr(ns, "fault", None) or [] if f.kind == "partition"})
        self.host_links: dict[tuple[int, int], HostLink] = {
            k: HostLink(self.coord_port, f"127.0.0.{10 + i}") for i, k in enumerate(cut) if k in self.pw_ports
        }
        # The coordinator's --state-dir: state.json, journal.jsonl and the lock a second one waits on.
        self.state_dir = Path(ns.state_dir).resolve() if getattr(ns, "state_dir", None) else workdir
        self.state_path = self.state_dir / "state.json"
        self.journal_path = self.state_dir / "journal.jsonl"
        self._files: list[IO[bytes]] = []
        self.env = child_env()
        self.emulator: Any = None
        self.topic = ""
        self.subscription = ""
        self.publisher: Any = None
        self.metadata_ports: dict[tuple[int, int], int] = {}
        self.metadata_procs: list[subprocess.Popen[bytes]] = []
        self.admin_addr = ns.admin_address or f"127.0.0.1:{free_port()}"
        self.http_addr = ns.http_address or f"127.0.0.1:{free_port()}"
        # Worker registrations are authenticated as in a real deploy: one peer token per job.
        self.peer_token_file = workdir / "peer-token"
        self.peer_token_file.write_text(secrets.token_hex(32) + "\n")
        self.peer_token_file.chmod(0o600)
        # slow faults: each slice's pace, which the trainer reads at every step.
        self.slowdowns = Slowdowns(workdir / "slowdowns.json", ns.slices)
        # A stand-in libtpu metrics service per host, for the worker sidecars' straggler source
        # (the single-controller job: one trainer reports each step once).
        self.tpu_metrics: MetricsHosts | None = None
        if getattr(ns, "mode", "single-controller") != "multi-controller":
            self.tpu_metrics = MetricsHosts(keys)

    def _log(self, name: str) -> IO[bytes]:
        f = open(self.logs / name, "ab")  # noqa: SIM115
        self._files.append(f)
        return f

    # -- the world around the job -------------------------------------------------

    def start_pubsub(self) -> None:
        """The official emulator with the job's topic and subscription (notice faults)."""
        from simjob.pubsub_emulator import PubSubEmulator

        self.emulator = PubSubEmulator(project=DEMO_PROJECT).start()
        self.topic, self.subscription = self.emulator.create_topic_and_subscription(
            DEMO_PROJECT, f"{DEMO_JOB}-events", f"{DEMO_JOB}-events"
        )
        self.publisher = self.emulator.publisher_client()

    def start_metadata_servers(self) -> None:
        """One stand-in metadata server per host (metadata faults)."""
        for key in self.pw_ports:
            port = free_port()
            self.metadata_ports[key] = port
            p = subprocess.Popen(
                [PY, "-m", "standins.metadata_server", "--port", str(port)],
                stdout=self._log(f"metadata-{key[0]}.{key[1]}.log"),
                stderr=subprocess.STDOUT,
                env=self.env,
            )
            self.metadata_procs.append(p)
        for port in self.metadata_ports.values():
            _wait_port(port, 20.0)

    def node(self, s: int, h: int) -> str:
        host = self.hosts.get((s, h))
        return f"gke-demo-slice{s}-host{h}-r{host.generation if host else 0}"

    def announce(self, kind: str, s: int, h: int) -> None:
        """Tell the world a host is about to go, the way the cloud would."""
        if kind == "notice":
            from simjob.notice_samples import gce_system_event

            data, attrs = gce_system_event(
                "terminateOnHostMaintenance", self.node(s, h), project=DEMO_PROJECT, zone=DEMO_ZONE
            )
            self.publisher.publish(self.topic, data, **attrs).result(timeout=30)
        elif kind == "stale-notice":
            from datetime import UTC, datetime, timedelta

            from simjob.notice_samples import gce_system_event

            start = datetime.now(UTC) - timedelta(days=2)
            data, attrs = gce_system_event(
                "upcomingMaintenance",
                self.node(s, h),
                project=DEMO_PROJECT,
                zone=DEMO_ZONE,
                timestamp=start - timedelta(hours=1),
                window_start=start,
                window_end=start + timedelta(hours=1),
                maintenance_status="ONGOING",
            )
            self.publisher.publish(self.topic, data, **attrs).result(timeout=30)
        else:
            import urllib.request

            port = self.metadata_ports[(s, h)]
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/stand-in/instance/maintenance-event",
                data=b"TERMINATE_ON_HOST_MAINTENANCE",
                method="PUT",
            )
            urllib.request.urlopen(req, timeout=5).read()

    def reset_metadata(self, s: int, h: int) -> None:
        """A replacement VM comes with a metadata server that announces nothing."""
        port = self.metadata_ports.get((s, h))
        if port is None:
            return
        import urllib.request

        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/stand-in/instance/maintenance-event", data=b"NONE", method="PUT"
        )
        urllib.request.urlopen(req, timeout=5).read()

    # -- the job's processes ------------------------------------------------------

    def start_coordinator(self) -> None:
        self.coordinator = self.spawn_coordinator()

    def spawn_coordinator(
        self,
        *,
        name: str = "coordinator",
        listen: str | None = None,
        trainer_listen: str | None = None,
        admin_listen: str | None = None,
        http_listen: str | None = None,
        state_dir: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """A coordinator process with the job's settings; the keywords give a second one its own places."""
        ns = self.ns
        cmd = [PY, "-m", "agent", "coordinator"] + _flags(
            job=DEMO_JOB,
            listen=listen or self.coord_addr,
            num_slices=ns.slices,
            hosts_per_slice=ns.hosts_per_slice,
            elastic_min_slice_count=min_slices(ns),
            elastic_timeout_seconds=ns.timeout,
            elastic_max_retries=ns.max_retries,
            log_format=ns.log_format,
            admin_listen=admin_listen or self.admin_addr,
            admin_token_file=ns.admin_token_file,
            http_listen=http_listen or self.http_addr,
            peer_token_file=self.peer_token_file,
        )
        cmd += _flags(state_dir=state_dir or self.state_dir, trainer_listen=trainer_listen or self.trainer_addr)
        if self.tpu_metrics is not None:
            cmd += _flags(**straggler_flags(ns.straggler_window_seconds))
        cmd += list(getattr(ns, "coordinator_arg", None) or [])
        env = self.env
        if self.emulator is not None:
            cmd += _flags(pubsub_subscription=self.subscription, cluster_name=DEMO_CLUSTER)
            env = {**env, "PUBSUB_EMULATOR_HOST": self.emulator.host}
        log = self._log(f"{name}.log")
        # Its own process group, as each host's: Ctrl-C reaches the demo alone, which stops every process.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0)
        if name != "coordinator":
            self.extra_procs.append(proc)
        return proc

    def start_host(self, s: int, h: int) -> None:
        old = self.hosts.get((s, h))
        gen = old.generation + 1 if old else 0
        port = self.pw_ports[(s, h)]
        pw = subprocess.Popen(
            [PY, "-m", "standins.pathways_worker", "--port", str(port)],
            stdout=self._log(f"host-{s}.{h}.log"),
            stderr=subprocess.STDOUT,
            process_group=0,
            env=self.env,
        )
        self.hosts[(s, h)] = Host(s, h, gen, [pw])
        self.start_sidecar(s, h)

    def start_sidecar(self, s: int, h: int) -> None:
        """A worker sidecar for host ``s.h``, in its host's process group (a host fault hits both)."""
        host = self.hosts[(s, h)]
        port = self.pw_ports[(s, h)]
        cmd = [PY, "-m", "agent", "worker"] + _flags(
            job=DEMO_JOB,
            coordinator=self.host_links[(s, h)].address
            if (s, h) in self.host_links
            else self.peer_proxy.address
            if self.peer_proxy
            else self.coord_addr,
            slice=s,
            host=h,
            node=f"gke-demo-slice{s}-host{h}-r{host.generation}",
            node_pool=f"demo-pool-{s}",
            pod=f"{DEMO_JOB}-worker-{s}-{h}",
            health_target=f"127.0.0.1:{port}",
            log_format=self.ns.log_format,
            peer_token_file=self.peer_token_file,
            # Every host of the simulated job shares this machine's loopback: no per-worker HTTP.
            http_listen="none",
        )
        if self.tpu_metrics is not None:
            cmd += _flags(
                tpu_metrics="service",
                tpu_metrics_target=self.tpu_metrics.target(s, h),
                straggler_window_seconds=self.ns.straggler_window_seconds,
            )
        if (s, h) in self.metadata_ports:
            cmd += _flags(metadata_url=f"http://127.0.0.1:{self.metadata_ports[(s, h)]}/computeMetadata/v1")
        log = self._log(f"host-{s}.{h}.log")
        wk = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, process_group=host.pgid, env=self.env)
        host.procs.append(wk)

    def kill_sidecar(self, s: int, h: int) -> int | None:
        """SIGKILL host ``s.h``'s worker sidecar alone; its Pathways worker keeps running."""
        wk = self.hosts[(s, h)].sidecar
        if wk.poll() is None:
            wk.kill()
        return wk.wait()

    def recreate_slice(self, s: int) -> None:
        """GKE recreates every VM of a TPU slice: replace all its hosts."""
        for h in range(self.ns.hosts_per_slice):
            old = self.hosts.get((s, h))
            if old is not None:
                old.signal(signal.SIGKILL)
                old.signal(signal.SIGCONT)
                for p in old.procs:
                    p.wait()
            self.reset_metadata(s, h)
            self.start_host(s, h)
        if self.tpu_metrics is not None:
            self.tpu_metrics.reset(s)

    def start_trainer(self) -> None:
        ns = self.ns
        n_dev = ns.slices * ns.devices_per_slice
        env = {**self.env, **cpu_device_env(n_dev)}
        sidecar = self.trainer_proxy.address if self.trainer_proxy else self.trainer_addr
        cmd = [PY, "-m", "simjob.trainer"] + _flags(
            sidecar=sidecar,
            backend=getattr(ns, "trainer_backend", "jax"),
            job=DEMO_JOB,
            workdir=self.workdir,
            slices=ns.slices,
            devices_per_slice=ns.devices_per_slice,
            steps=ns.steps,
            checkpoint_period=ns.checkpoint_period,
            step_seconds=ns.step_seconds,
            events=self.workdir / "trainer-events.jsonl",
            slow_file=self.slowdowns.path,
        )
        # The hooks' self-guard: with the sidecar gone this long, flush and exit 42.
        cmd += _flags(elastic_timeout_seconds=ns.timeout)
        cmd += list(getattr(ns, "trainer_arg", None) or [])
        for (s, h), port in sorted(self.pw_ports.items()):
            cmd += ["--pathways", f"{s}.{h}=127.0.0.1:{port}"]
        # The hooks read the sidecar's address from the environment too (trainer_hooks.maxtext does).
        env["ELASTIC_SIDECAR_ADDRESS"] = sidecar
        env["ELASTIC_SIDECAR_JOB"] = DEMO_JOB
        self.trainer = subprocess.Popen(
            cmd, stdout=self._log("trainer.log"), stderr=subprocess.STDOUT, env=env, process_group=0
        )

    def kill_trainer(self) -> int | None:
        """SIGKILL the trainer; a JSON line it was writing is closed so the next one parses."""
        assert self.trainer is not None
        if self.trainer.poll() is None:
            self.trainer.kill()
        code = self.trainer.wait()
        events = self.workdir / "trainer-events.jsonl"
        if events.exists() and events.stat().st_size:
            with open(events, "rb+") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
        return code

    def kill_coordinator(self) -> int | None:
        """SIGKILL the coordinator (a stopped one too); returns its exit status."""
        assert self.coordinator is not None
        if self.coordinator.poll() is None:
            self.coordinator.kill()
            self.coordinator.send_signal(signal.SIGCONT)
        return self.coordinator.wait()

    def stop_all(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        if self.trainer is not None:
            procs.append(("trainer", self.trainer))
        for key, host in self.hosts.items():
            host.signal(signal.SIGCONT)
            procs += [(f"host {key[0]}.{key[1]}", p) for p in host.procs]
        if self.coordinator is not None:
            if self.coordinator.poll() is None:
                self.coordinator.send_signal(signal.SIGCONT)
            procs.append(("coordinator", self.coordinator))
        procs += [("metadata", p) for p in self.metadata_procs]
        procs += [("extra", p) for p in self.extra_procs]
        for _, p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for name, p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if name in ("trainer", "coordinator"):
                codes[name] = p.returncode
        for fwd in (self.peer_proxy, self.trainer_proxy):
            if fwd is not None:
                fwd.close()
        for link in self.host_links.values():
            link.close()
        if self.tpu_metrics is not None:
            self.tpu_metrics.stop()
        if self.publisher is not None:
            self.publisher.transport.close()
        if self.emulator is not None:
            self.emulator.stop()
        for f in self._files:
            f.close()
        return codes


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


class _StatusPoller(threading.Thread):
    """Reads the coordinator's ``/status`` JSON in the background (a stopped coordinator blocks a read)."""

    def __init__(self, url: str, period: float = 0.25) -> None:
        super().__init__(daemon=True, name="status-poller")
        self.url = url
        self.period = period
        self.last: dict[str, Any] | None = None
        self.last_time = 0.0
        self._halt = threading.Event()

    def read(self, timeout: float = 1.0) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(self.url, timeout=timeout) as r:
                data: dict[str, Any] = json.loads(r.read())
        except (OSError, ValueError):
            return None
        self.last, self.last_time = data, time.time()
        return data

    def run(self) -> None:
        while not self._halt.wait(self.period):
            self.read()

    def stop(self) -> None:
        self._halt.set()


@dataclass
class _Later:
    when: float
    what: str
    action: Callable[[], None]


class Demo:
    """One run of the simulated job.

    ``start()``, then ``tick()`` until it returns False (or ``run()``), then
    ``finish()`` for the summary. Faults given up front go in when the trainer
    reaches their step; ``inject()`` puts one in now.
    """

    def __init__(self, ns: argparse.Namespace, workdir: Path, faults: list[FaultSpec], say: Callable[[str], None]):
        self.ns = ns
        self.workdir = workdir
        self.say = say
        self.job = self.make_job(ns, workdir)
        self.t_start = time.time()
        self.provisioner = Provisioner(ns.replacement_delay, self._recreate, enabled=not ns.no_replacement)
        self.records: list[FaultRecord] = []
        self.pending = sorted(faults, key=lambda f: f.at_step)  # stable: the order given within a step
        self.tail = JsonTail(workdir / "trainer-events.jsonl")
        self.last_step = 0
        self.deaths: list[tuple[float, FaultSpec]] = []  # announced faults: when their host dies
        self.later: list[_Later] = []
        self.next_fault_at = 0.0
        self.exits: dict[str, list[int | None]] = {"trainer": [], "coordinator": []}
        self.status = _StatusPoller(f"http://{self.job.http_addr}/status")
        self.coordinator_down = False
        self.trainer_down = False
        self.deadline = float("inf")
        self.gave_up = False
        self.failure: tuple[str, int] | None = None  # a child that exited with an error: (what, its code)
        self._handled: set[int] = set()  # pids of crashed worker sidecars already started again
        self._sidecar_restarted: set[tuple[int, int]] = set()
        self.live: LiveReport | None = None
        self.kube: Any = None  # --kube-api: simjob.kube_demo.DemoKubeAPI

    def report_live(self) -> None:
        """Print decisions, trainer events and a progress line as they happen (``say``)."""
        self.live = LiveReport(
            self.say, self.t_start, self.job.journal_path, self.workdir / "checkpoints", self.ns.steps
        )

    def trainer_events(self) -> list[dict[str, Any]]:
        """The trainer's new events, shown live when asked."""
        evs = self.tail.read()
        if self.live is not None:
            for ev in evs:
                self.live.trainer_event(ev)
        return evs

    def check_children(self) -> bool:
        """False (and ``failure`` set) once a child exited with an error by itself.

        The coordinator, a worker sidecar or a stand-in Pathways worker that exits with a code
        other than 0, 3 or 42 (a process a fault killed ends by a signal, and is not counted). A
        worker sidecar that crashes (not exit 2) is started again once, as the kubelet would.
        """
        if self.live is not None:
            self.live.poll()
        job = self.job
        found: tuple[str, int, Path] | None = None
        c = job.coordinator
        if c is not None and not self.coordinator_down:
            code = c.poll()
            if code is not None and code not in BENIGN_EXITS:
                found = ("the coordinator", code, job.logs / "coordinator.log")
        for (s, h), host in list(job.hosts.items()):
            for i, p in enumerate(host.procs):
                code = p.poll()
                if found is not None or code is None or code <= 0 or code in BENIGN_EXITS or p.pid in self._handled:
                    continue
                log = job.logs / f"host-{s}.{h}.log"
                if i > 0 and p is host.sidecar and code != EXIT_USAGE and (s, h) not in self._sidecar_restarted:
                    # The kubelet restarts a native sidecar container that exits (restartPolicy: Always;
                    # Kubernetes, "Sidecar Containers"): once here, said out loud. A second crash of the
                    # same host's sidecar, or a configuration error (exit 2, a crash loop), ends the demo.
                    self._handled.add(p.pid)
                    self._sidecar_restarted.add((s, h))
                    why = last_error(log)
                    self.say(
                        fit(
                            f"  +{self.elapsed():7.3f}s  ",
                            f"[harness] worker sidecar {s}.{h} exited with code {code}"
                            + (f" ({why})" if why else "")
                            + "; started again, as the kubelet restarts a sidecar container",
                        )
                    )
                    print(
                        fit("elastic-sidecar demo: ", f"worker sidecar {s}.{h} crashed (exit {code}): {why}"),
                        file=sys.stderr,
                        flush=True,
                    )
                    job.start_sidecar(s, h)
                    continue
                what = "the stand-in Pathways worker" if i == 0 else "the worker sidecar"
                found = (f"{what} of host {s}.{h}", code, log)
        if found is None:
            return True
        what, code, log = found
        why = last_error(log)
        text = f"{what} exited with code {code}" + (f": {why}" if why else f" (its log: {log})")
        self.failure = (text, code)
        print(fit("elastic-sidecar demo: ", text + "; stopping the demo"), file=sys.stderr, flush=True)
        return False

    def trainer_failure(self) -> str | None:
        """Why the trainer exited with an error (its last error line), if it did."""
        t = self.job.trainer
        if t is None or t.returncode in (None, 0):
            return None
        log = self.job.logs / "trainer.log"
        why = last_error(log) if t.returncode not in BENIGN_EXITS else None
        if t.returncode < 0:  # killed by a signal: its log holds every thread's stack (PYTHONFAULTHANDLER)
            return f"the trainer was killed by {signal_name(-t.returncode)} (exit {t.returncode}; its log: {log})"
        return f"the trainer exited with code {t.returncode}" + (f": {why}" if why else "")

    def make_job(self, ns: argparse.Namespace, workdir: Path) -> Job:
        return Job(ns, workdir)

    def elapsed(self) -> float:
        return time.time() - self.t_start

    def _recreate(self, s: int) -> None:
        self.job.recreate_slice(s)

    def start(self, *, hold_trainer: bool = False) -> None:
        """Start the job's processes; ``hold_trainer``: all but the trainer, which ``start_trainer`` starts.

        A test that must see the coordinator before any trainer attaches holds it: a fast trainer
        can attach before the first status poll.
        """
        from simjob import kube_demo

        if kube_demo.wanted(self.ns):
            self.kube = kube_demo.DemoKubeAPI(self, DEMO_JOB)
        # The faults to put in, and those named on the command line that a caller puts in itself (inject).
        kinds = {f.kind for f in [*self.pending, *(getattr(self.ns, "fault", None) or [])]}
        if kinds & {"notice", "stale-notice"}:
            from simjob.pubsub_emulator import EmulatorFailed, EmulatorMissing

            self.say("  starting the Pub/Sub emulator for notice faults")
            try:
                self.job.start_pubsub()
            except (EmulatorMissing, EmulatorFailed) as e:
                raise SetupError(f"notice faults need the Pub/Sub emulator (and Java 17): {e}") from None
        if "metadata" in kinds:
            self.job.start_metadata_servers()
        if self.job.tpu_metrics is not None:
            self.job.tpu_metrics.start()
        self.job.start_coordinator()
        for s in range(self.ns.slices):
            for h in range(self.ns.hosts_per_slice):
                self.job.start_host(s, h)
        if hold_trainer:
            self.trainer_down = True
        else:
            self.job.start_trainer()
        self.status.start()
        if self.kube is not None:
            url = self.kube.start()
            self.say(f"  Kubernetes API (stand-in) {url}   (kubeconfig {self.kube.kubeconfig}; elastic-sidecar drill)")
        self.deadline = time.monotonic() + self.ns.run_timeout

    # -- faults --------------------------------------------------------------------

    def inject(self, f: FaultSpec) -> None:
        """Put fault ``f`` in now (its ``at_step`` is only recorded)."""
        now = time.time()
        job = self.job
        if f.kind in ANNOUNCED:
            assert f.slice is not None and f.host is not None
            job.announce(f.kind, f.slice, f.host)
            self.deaths.append((time.monotonic() + self.ns.notice_deadline, f))
            what = f"announced: host {f.slice}.{f.host} goes in {self.ns.notice_deadline:g} s"
        elif f.kind == "stale-notice":
            assert f.slice is not None and f.host is not None
            job.announce(f.kind, f.slice, f.host)
            what = f"a maintenance notice two days old for host {f.slice}.{f.host}'s node; the host stays up"
        elif f.kind in ("kill", "hang"):
            assert f.slice is not None and f.host is not None
            job.hosts[(f.slice, f.host)].signal(signal.SIGKILL if f.kind == "kill" else signal.SIGSTOP)
            self.provisioner.slice_lost(f.slice, time.monotonic())
            what = f"host {f.slice}.{f.host}"
        elif f.kind == "sidecar-restart":
            assert f.slice is not None and f.host is not None
            s, h = f.slice, f.host
            host = job.hosts[(s, h)]
            code = job.kill_sidecar(s, h)

            def again() -> None:
                if job.hosts.get((s, h)) is host:  # not if the whole host was replaced meanwhile
                    job.start_sidecar(s, h)

            self._after(RESTART_DELAY, f"worker sidecar {s}.{h} started again", again)
            what = f"worker sidecar {s}.{h} killed (exit {code}), host stays up; restart in {RESTART_DELAY:g} s"
        elif f.kind == "sidecar-stall":
            assert f.slice is not None and f.host is not None and f.seconds is not None
            sidecar = job.hosts[(f.slice, f.host)].sidecar
            sidecar.send_signal(signal.SIGSTOP)  # the sidecar alone: its Pathways worker keeps serving

            def wake(sidecar: subprocess.Popen[bytes] = sidecar) -> None:
                if sidecar.poll() is None:
                    sidecar.send_signal(signal.SIGCONT)

            self._after(f.seconds, f"worker sidecar {f.slice}.{f.host} continued (SIGCONT)", wake)
            what = f"worker sidecar {f.slice}.{f.host} stopped (SIGSTOP) for {f.seconds:g} s, its host stays up"
        elif f.kind == "partition":
            assert f.slice is not None and f.host is not None and f.seconds is not None
            link = job.host_links.get((f.slice, f.host))
            if link is None:
                raise ValueError(f"{f}: host {f.slice}.{f.host} has no partitionable link (name it in --fault)")
            link.partition(f.seconds)
            self._after(f.seconds, f"host {f.slice}.{f.host}'s links healed", lambda: None)
            what = f"host {f.slice}.{f.host}'s links to the coordinator cut for {f.seconds:g} s (stream and datagrams)"
        elif f.kind == "coordinator-restart":
            what = self.kill_coordinator(restart_after=RESTART_DELAY)
        elif f.kind == "coordinator-stall":
            assert f.seconds is not None
            assert job.coordinator is not None
            job.coordinator.send_signal(signal.SIGSTOP)
            coord = job.coordinator
            self._after(f.seconds, "coordinator continued (SIGCONT)", lambda: coord.send_signal(signal.SIGCONT))
            what = f"coordinator stopped (SIGSTOP) for {f.seconds:g} s"
        elif f.kind == "slow":
            assert f.factor is not None
            handle = job.slowdowns.start(f.slice, f.factor)
            where = "every slice" if f.slice is None else f"slice {f.slice}"
            if f.seconds is not None:
                self._after(f.seconds, f"{where} back to its pace", lambda: job.slowdowns.end(handle))
            span = f" for {f.seconds:g} s" if f.seconds is not None else ""
            what = f"{where}'s work takes {f.factor:g} times as long{span}"
        elif f.kind == "trainer-kill":
            code = job.kill_trainer()
            self.exits["trainer"].append(code)
            self.trainer_down = True
            self._after(RESTART_DELAY, "trainer started again", self.start_trainer)
            what = f"trainer killed (exit {code}); restart in {RESTART_DELAY:g} s"
        else:
            raise ValueError(f"unknown fault kind {f.kind!r}")
        self.records.append(FaultRecord(f.kind, f.slice, f.host, f.at_step, now, self.last_step, f.seconds, f.factor))
        self.say(f"  +{now - self.t_start:7.3f}s  [harness] {f.kind}: {what} at step {self.last_step}")

    def kill_coordinator(
        self,
        *,
        restart_after: float | None,
        before_restart: Callable[[], None] | None = None,
        even_if_exited: bool = False,
        record: bool = False,
    ) -> str:
        """SIGKILL the coordinator; start it again ``restart_after`` seconds later (None: never).

        ``before_restart`` runs just before the new process starts (a test deletes the state file
        there). A coordinator that had exited by itself is started again only ``even_if_exited``.
        ``record``: list it among the run's faults (``inject`` records its own).
        """
        assert self.job.coordinator is not None
        if record:
            kind = "coordinator-restart" if restart_after is not None else "coordinator-kill"
            self.records.append(FaultRecord(kind, None, None, self.last_step, time.time(), self.last_step))
        was_running = self.job.coordinator.poll() is None
        code = self.job.kill_coordinator()
        self.exits["coordinator"].append(code)
        self.coordinator_down = True
        if not was_running and not even_if_exited:
            return f"coordinator had already exited ({code}); not restarted"
        if restart_after is None:
            return f"coordinator killed (exit {code}), not restarted"

        def again() -> None:
            if before_restart is not None:
                before_restart()
            self.job.start_coordinator()
            self.coordinator_down = False

        self._after(restart_after, "coordinator started again on the same state", again)
        return f"coordinator killed (exit {code}); restart in {restart_after:g} s"

    def start_trainer(self) -> None:
        """Start the trainer (again, after a fault killed it, or first, after ``start(hold_trainer=True)``)."""
        self.job.start_trainer()
        self.trainer_down = False

    def _after(self, delay: float, what: str, action: Callable[[], None]) -> None:
        self.later.append(_Later(time.monotonic() + delay, what, action))

    # -- the loop --------------------------------------------------------------------

    def tick(self) -> bool:
        """One turn of the loop; False once the trainer is gone for good (or the run timed out)."""
        for ev in self.trainer_events():
            if ev.get("kind") == "step":
                self.last_step = max(self.last_step, int(ev["step"]))
                if self.job.tpu_metrics is not None and "slices" in ev:
                    slowed = {int(k): float(v) for k, v in (ev.get("slowdowns") or {}).items()}
                    self.job.tpu_metrics.step(float(ev["seconds"]), ev["slices"], slowed)
        if not self.check_children():
            return False
        mono = time.monotonic()
        while self.pending and self.last_step >= self.pending[0].at_step and mono >= self.next_fault_at:
            f = self.pending.pop(0)
            self.inject(f)
            mono = time.monotonic()
            if self.pending and self.pending[0].at_step == f.at_step:
                self.next_fault_at = mono + SAME_STEP_GAP
        for when, f in [d for d in self.deaths if d[0] <= mono]:
            self.deaths.remove((when, f))
            assert f.slice is not None and f.host is not None
            self.job.hosts[(f.slice, f.host)].signal(signal.SIGKILL)
            self.provisioner.slice_lost(f.slice, mono)
            self.say(f"  +{self.elapsed():7.3f}s  [harness] host {f.slice}.{f.host} died at its deadline")
        for item in [x for x in self.later if x.when <= mono]:
            self.later.remove(item)
            item.action()
            self.say(f"  +{self.elapsed():7.3f}s  [harness] {item.what}")
        for s in self.provisioner.poll(mono):
            self.say(f"  +{self.elapsed():7.3f}s  [provisioner] slice {s} recreated")
        if self.kube is not None:
            self.kube.tick()
        if mono > self.deadline:
            self.say(f"elastic-sidecar demo: giving up after --run-timeout {self.ns.run_timeout:g} s")
            self.gave_up = True
            return False
        if self.trainer_down:
            return True
        assert self.job.trainer is not None
        return self.job.trainer.poll() is None

    def run(self, until: Callable[[], bool] | None = None, timeout: float | None = None) -> bool:
        """Tick until the run ends or ``until()`` holds; True if ``until`` held (or the run ended normally)."""
        end = time.monotonic() + timeout if timeout is not None else float("inf")
        while time.monotonic() < end:
            if until is not None and until():
                return True
            if not self.tick():
                return until is None and not self.gave_up and self.failure is None
            time.sleep(0.02)
        return False

    def finish(self, *, interrupted: bool = False) -> dict[str, Any]:
        """Stop every process; the summary of the run."""
        try:
            # Let the coordinator see the trainer's last messages and exit on its own.
            if self.job.coordinator is not None and not self.coordinator_down and not interrupted:
                try:
                    self.job.coordinator.wait(3)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            self.status.stop()
            if self.kube is not None:
                self.kube.stop()
            codes = self.job.stop_all()
        wall = time.time() - self.t_start
        if "trainer" in codes:
            self.exits["trainer"].append(codes["trainer"])
        if "coordinator" in codes and not self.coordinator_down:
            self.exits["coordinator"].append(codes["coordinator"])
        summary = summarize(
            self.workdir,
            self.records,
            self.t_start,
            wall,
            codes,
            journal_path=self.job.journal_path,
            state_path=self.job.state_path,
            status=self.status.last,
        )
        summary["process_exits"] = self.exits
        return summary


RESTART_EXIT_CODES = frozenset({42, *range(127, 256)})
"""Exit codes xpk's JobSet failure policy restarts on (FACTS section 5)."""
MAX_RESTARTS = 5
"""The stand-in gives up after this many restarts (a real JobSet's maxRestarts)."""
JOBSET_RESTART_DELAY = 1.0
"""Seconds from deleting the job's pods until their replacements start."""
JOBSET_REACTION_SECONDS = 1.0
"""Seconds from the first exit JobSet restarts on until it deletes the job's other pods."""
POD_TERMINATION_GRACE = 120.0
"""A deleted slice pod's ``terminationGracePeriodSeconds`` (deploy/overlays/multi-controller):
seconds from SIGTERM until SIGKILL."""


def _container_code(code: int | None) -> int | None:
    """Popen's -N (ended by signal N) as a container reports it: 128 + N."""
    return 128 - code if code is not None and code < 0 else code


class McJob(Job):
    """The job's processes, with one trainer process per host."""

    def __init__(self, ns: argparse.Namespace, workdir: Path) -> None:
        super().__init__(ns, workdir)
        self.attempt = 0
        self.keys = [(s, h) for s in range(ns.slices) for h in range(ns.hosts_per_slice)]
        self.trainers: dict[tuple[int, int], subprocess.Popen[bytes]] = {}

    @property
    def processes(self) -> int:
        return len(self.keys)

    def spawn_coordinator(self, **kw: Any) -> subprocess.Popen[bytes]:
        saved = getattr(self.ns, "coordinator_arg", None)
        self.ns.coordinator_arg = [
            *(saved or []),
            f"--trainer-processes={self.processes}",
            f"--restart-attempt={self.attempt}",
        ]
        try:
            return super().spawn_coordinator(**kw)
        finally:
            self.ns.coordinator_arg = saved

    def start_trainer(self) -> None:
        """Every host's trainer process, joined by a jax.distributed coordinator on a fresh port."""
        ns = self.ns
        jax_coordinator = f"127.0.0.1:{free_port()}"
        per_host = max(1, ns.devices_per_slice // ns.hosts_per_slice)
        self.trainers = {}
        for index, (s, h) in enumerate(self.keys):
            env = {
                **self.env,
                **cpu_device_env(per_host),
                "ELASTIC_SIDECAR_ADDRESS": self.trainer_addr,
                "ELASTIC_SIDECAR_JOB": "elastic-demo",
            }
            cmd = [PY, "-m", "simjob.trainer", "--mode", "multi-controller"] + _flags(
                sidecar=self.trainer_addr,
                job="elastic-demo",
                workdir=self.workdir,
                process_id=index,
                num_processes=self.processes,
                jax_coordinator=jax_coordinator,
                host_name=self.node(s, h),
                steps=ns.steps,
                checkpoint_period=ns.checkpoint_period,
                step_seconds=ns.step_seconds,
                events=self.workdir / "trainer-events.jsonl",
                elastic_timeout_seconds=ns.timeout,
            )
            if getattr(ns, "no_sidecar", False):
                cmd.append("--no-sidecar")
            self.trainers[(s, h)] = subprocess.Popen(
                cmd, stdout=self._log(f"trainer-{s}.{h}.log"), stderr=subprocess.STDOUT, env=env, process_group=0
            )
        self.trainer = self.trainers[self.keys[0]]

    def signal_trainer(self, s: int, h: int, sig: int) -> None:
        p = self.trainers.get((s, h))
        if p is not None and p.poll() is None:
            p.send_signal(sig)

    def delete_pods(self, hit: set[tuple[int, int]]) -> None:
        """JobSet deletes the pods: SIGTERM to the trainer processes on hosts not hit (their grace
        runs from now), SIGKILL to those on hosts the fault hit (a stopped one too)."""
        for key, p in self.trainers.items():
            if p.poll() is None:
                if key in hit:
                    p.kill()
                    p.send_signal(signal.SIGCONT)
                else:
                    p.terminate()

    def end_trainers(self) -> None:
        """The grace is over: SIGKILL to every trainer process still there."""
        for p in self.trainers.values():
            if p.poll() is None:
                p.kill()
                p.send_signal(signal.SIGCONT)
        for p in self.trainers.values():
            p.wait()

    def stop_all(self) -> dict[str, int | None]:
        for p in self.trainers.values():
            if p is not self.trainer and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in self.trainers.values():
            if p is not self.trainer:
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        return super().stop_all()


class McDemo(Demo):
    """One run of the multi-controller job, JobSet restarts included.

    A fault on a host hits that host's trainer process too: ``kill`` SIGKILLs it
    with the host, ``hang`` SIGSTOPs it with the host; ``notice`` and
    ``metadata`` announce the host's end and kill it (and its trainer process, if
    still there) at ``--notice-deadline``.

    **Stand-in for JobSet's restart.** When a trainer process exits with a code
    JobSet restarts on (42, or 127-255), it deletes every pod of the job. A pod
    deletion is graceful (Kubernetes, "Pod Lifecycle: Termination of Pods"): the
    container gets SIGTERM, and SIGKILL only after ``terminationGracePeriodSeconds``
    (the overlay's 120 s for a slice pod). So the trainer processes on hosts that
    were not hit get SIGTERM and the grace (JAX takes SIGTERM once
    ``jax.distributed`` is up, so a process blocked in a collective stays until its
    hooks end it); a process on a host the fault hit goes at once (the host is
    gone or replaced); the coordinator is ended. Once every trainer process is
    gone, it recreates them, the coordinator with the next ``--restart-attempt``;
    like pods waiting for their nodes, the new processes start only once no host
    is about to go (an announced death still pending) and every host is up again
    (the provisioner replaced lost slices). A process that vanished with its host
    (SIGKILL) gives JobSet no exit code: a node that dies is not a failed container.

    Per fault the summary adds ``all_exited_seconds`` (the fault until every
    trainer process of that attempt is gone) and ``restart_to_first_step_seconds``
    (the restarted processes' start until process 0 completes a step), with
    ``resumed_from_step`` and the attempt's exit codes.
    """

    job: McJob

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.attempts: list[dict[str, Any]] = [{"attempt": 0, "started": time.time(), "fault": None}]
        self.restart_due: float | None = None
        self.done = False

    def make_job(self, ns: argparse.Namespace, workdir: Path) -> Job:
        return McJob(ns, workdir)

    # -- faults ----------------------------------------------------------------------

    def inject(self, f: FaultSpec) -> None:
        super().inject(f)
        assert f.slice is not None and f.host is not None
        if f.kind == "kill":
            self.job.signal_trainer(f.slice, f.host, signal.SIGKILL)
        elif f.kind == "hang":
            self.job.signal_trainer(f.slice, f.host, signal.SIGSTOP)
        cur = self.attempts[-1]
        cur.setdefault("hit", set()).add((f.slice, f.host))
        if cur["fault"] is None:
            cur["fault"] = len(self.records) - 1

    # -- the loop ----------------------------------------------------------------------

    def tick(self) -> bool:
        for ev in self.trainer_events():
            if ev.get("kind") == "step":
                self.last_step = max(self.last_step, int(ev["step"]))
                cur = self.attempts[-1]
                if cur.get("first_step") is None and ev["t"] >= cur["started"]:
                    cur["first_step"] = ev["t"]
                    cur["first_step_number"] = int(ev["step"])
            elif ev.get("kind") == "resumed":
                cur = self.attempts[-1]
                if cur.get("resumed_from_step") is None and ev["t"] >= cur["started"]:
                    cur["resumed_from_step"] = int(ev["from_step"])
                    cur["restored_from"] = ev.get("restored_from")
        if not self.check_children():
            return False
        mono = time.monotonic()
        job = self.job
        while self.pending and self.last_step >= self.pending[0].at_step and self.restart_due is None:
            self.inject(self.pending.pop(0))
        for when, f in [d for d in self.deaths if d[0] <= mono]:
            self.deaths.remove((when, f))
            assert f.slice is not None and f.host is not None
            job.hosts[(f.slice, f.host)].signal(signal.SIGKILL)
            job.signal_trainer(f.slice, f.host, signal.SIGKILL)
            self.provisioner.slice_lost(f.slice, mono)
            self.say(f"  +{self.elapsed():7.3f}s  [harness] host {f.slice}.{f.host} died at its deadline")
        for s in self.provisioner.poll(mono):
            self.say(f"  +{self.elapsed():7.3f}s  [provisioner] slice {s} recreated")
        if mono > self.deadline:
            self.say(f"elastic-sidecar demo: giving up after --run-timeout {self.ns.run_timeout:g} s")
            self.gave_up = True
            return False
        return self._jobset(mono)

    def _jobset(self, mono: float) -> bool:
        """The stand-in for JobSet's failure policy; False once the job is over."""
        job = self.job
        cur = self.attempts[-1]
        hit = cur.setdefault("hit", set())
        # A process ended by a signal exits 128 + the signal in a container; one that vanished
        # with its host (hit by the fault) gives JobSet no exit code at all.
        codes = {k: _container_code(p.poll()) if k not in hit else p.poll() for k, p in job.trainers.items()}
        if self.restart_due is None:
            if all(c == 0 for c in codes.values()):
                cur["exit_codes"] = {f"{s}.{h}": c for (s, h), c in codes.items()}
                self.done = True
                return False
            if cur.get("all_exited") is None and cur["fault"] is not None:
                if all(c is not None for k, c in codes.items() if k not in hit):
                    cur["all_exited"] = time.time()  # every process on a host that was not hit is gone
            if not any(c is not None and c in RESTART_EXIT_CODES for k, c in codes.items() if k not in hit):
                if any(c not in (None, 0) for k, c in codes.items() if k not in hit):
                    # Any other exit code fails the JobSet (xpk): no restart.
                    cur["exit_codes"] = {f"{s}.{h}": c for (s, h), c in codes.items()}
                    self.say(f"  +{self.elapsed():7.3f}s  [jobset] failed: exit codes {cur['exit_codes']}")
                    return False
                window = getattr(self.ns, "baseline_window", 60.0)
                if self.ns.no_sidecar and cur["fault"] is not None and cur.get("all_exited") is None:
                    since = time.time() - self.records[cur["fault"]].time
                    if since > window:
                        alive = [f"{s}.{h}" for (s, h), c in codes.items() if c is None and (s, h) not in hit]
                        cur["still_running"] = alive
                        cur["still_running_after"] = round(since, 3)
                        self.say(
                            f"  [baseline] {len(alive)} trainer process(es) still there {since:.0f} s after the fault"
                        )
                        return False
                return True
            cur.setdefault("first_restart_exit", mono)
            if mono < cur["first_restart_exit"] + JOBSET_REACTION_SECONDS:
                return True
            # JobSet restarts the job: it deletes every pod still there (a hung host's too) and
            # recreates them once they are gone, at the latest when their grace is over.
            if cur.get("cleaned_up") is None:
                job.delete_pods(hit)
                cur["cleaned_up"] = time.time()
                cur["grace_ends"] = mono + POD_TERMINATION_GRACE
            if any(p.poll() is None for p in job.trainers.values()) and mono < cur["grace_ends"]:
                return True
            job.end_trainers()
            cur["exit_codes"] = {
                f"{s}.{h}": (p.returncode if (s, h) in hit else _container_code(p.returncode))
                for (s, h), p in job.trainers.items()
            }
            self.exits["trainer"].append(max((c for c in cur["exit_codes"].values() if c is not None), default=None))
            self.say(
                f"  +{self.elapsed():7.3f}s  [jobset] a trainer process exited with a restart code; every pod "
                f"deleted (exit codes {cur['exit_codes']}); restarting the job"
            )
            if job.coordinator is not None:
                try:
                    job.coordinator.wait(3)
                except subprocess.TimeoutExpired:
                    job.kill_coordinator()
                self.exits["coordinator"].append(job.coordinator.returncode)
                self.coordinator_down = True  # ended with the attempt: not a failure of its own
            if len(self.attempts) > MAX_RESTARTS:
                self.say(f"  [jobset] {MAX_RESTARTS} restarts used up; giving up")
                return False
            self.restart_due = mono + JOBSET_RESTART_DELAY
            return True
        # Pods wait for their nodes: no announced death pending, every host up again.
        hosts_up = len(job.hosts) == job.processes and all(h.alive() for h in job.hosts.values())
        if mono < self.restart_due or self.deaths or self.provisioner._due or not hosts_up:
            return True
        self.restart_due = None
        cur["committed_at_restart"] = committed_steps(job.workdir / "checkpoints")
        job.attempt += 1
        job.start_coordinator()
        self.coordinator_down = False
        job.start_trainer()
        self.attempts.append({"attempt": job.attempt, "started": time.time(), "fault": None})
        self.say(
            f"  +{self.elapsed():7.3f}s  [jobset] restart attempt {job.attempt}: coordinator and trainer processes"
        )
        return True

    def diagnose(self) -> dict[str, Any]:
        """Where a run that gave up was stuck: read before every process is stopped.

        Each trainer process of the current attempt (alive or its exit code, its last event),
        each host's processes, and the coordinator's last decisions from its journal.
        """
        job = self.job
        base = job.workdir / "trainer-events.jsonl"
        procs: dict[str, Any] = {}
        for index, (key, p) in enumerate(job.trainers.items()):
            last = (read_jsonl(events_path(base, index)) or [{}])[-1]
            procs[f"{key[0]}.{key[1]}"] = {
                "exit_code": p.poll(),
                "last_event": {k: last.get(k) for k in ("kind", "step", "from_step", "reason") if k in last}
                if last
                else None,
            }
        journal = [f"{j.get('trigger')}: {j.get('reason')}" for j in read_jsonl(job.journal_path)[-6:]]
        return {
            "attempt": job.attempt,
            "restart_due": self.restart_due is not None,
            "trainer_processes": procs,
            "hosts": {f"{s}.{h}": [p.poll() for p in host.procs] for (s, h), host in job.hosts.items()},
            "coordinator_exit_code": None if job.coordinator is None else job.coordinator.poll(),
            "journal_tail": journal,
        }

    def finish(self, *, interrupted: bool = False) -> dict[str, Any]:
        stuck = self.diagnose() if self.gave_up else None
        summary = super().finish(interrupted=interrupted)
        if stuck is not None:
            summary["gave_up"] = stuck
        for i, f in enumerate(summary["faults"]):
            rec = self.records[i]
            att = next((a for a in self.attempts if a["fault"] == i), None)
            nxt = self.attempts[self.attempts.index(att) + 1] if att and att is not self.attempts[-1] else None
            f["all_exited_seconds"] = round(att["all_exited"] - rec.time, 3) if att and att.get("all_exited") else None
            f["jobset_cleanup_seconds"] = (
                round(att["cleaned_up"] - rec.time, 3) if att and att.get("cleaned_up") else None
            )
            f["exit_codes"] = att.get("exit_codes") if att else None
            f["restart_to_first_step_seconds"] = (
                round(nxt["first_step"] - nxt["started"], 3) if nxt and nxt.get("first_step") else None
            )
            f["resumed_from_step"] = nxt.get("resumed_from_step") if nxt else None
            f["committed_at_restart"] = att.get("committed_at_restart") if att else None
            if att and "still_running" in att:
                f["still_running_after_seconds"] = att["still_running_after"]
                f["processes_still_running"] = att["still_running"]
        summary["mode"] = "multi-controller"
        summary["trainer_processes"] = self.job.processes
        summary["attempts"] = [
            {
                k: (round(v - self.t_start, 3) if k in ("started", "all_exited", "first_step", "cleaned_up") else v)
                for k, v in a.items()
                if k not in ("hit", "first_restart_exit", "grace_ends")
            }
            for a in self.attempts
        ]
        summary["completed"] = self.done
        summary["sidecar"] = not self.ns.no_sidecar
        return summary


def run_demo(ns: argparse.Namespace) -> int:
    """``elastic-sidecar demo``, either ``--mode``."""
    multi = ns.mode == "multi-controller"
    try:
        faults = preflight(ns, MC_DEFAULT_FAULTS, MC_KINDS) if multi else preflight(ns, DEFAULT_FAULTS, FAULT_KINDS)
        if multi and ns.slices * ns.hosts_per_slice < 2:
            raise ValueError("--mode multi-controller needs at least 2 hosts (--slices x --hosts-per-slice)")
        workdir = prepare_workdir(ns, "elastic-demo-mc-" if multi else "elastic-demo-")
    except ValueError as e:  # ConfigError and SetupError are ValueErrors
        print(f"elastic-sidecar demo: {e}", file=sys.stderr)
        return 2
    say = (lambda *_: None) if ns.quiet else (lambda msg: print(msg, flush=True))
    demo = (McDemo if multi else Demo)(ns, workdir, faults, say)
    job = demo.job
    shown = f"faults: {' '.join(map(str, faults)) or 'none'}; workdir {workdir}"
    if multi:
        n = ns.slices * ns.hosts_per_slice
        say(
            fit(
                "elastic-sidecar demo (multi-controller): ",
                f"{ns.slices} slices x {ns.hosts_per_slice} host(s) = {n} JAX processes, {ns.steps} steps, {shown}",
            )
        )
        say(f"  status page http://{job.http_addr}/   admin API {job.admin_addr}")
    else:
        say(
            fit(
                "elastic-sidecar demo: ",
                f"{ns.slices} slices x {ns.hosts_per_slice} host(s), {ns.steps} steps, min slices {min_slices(ns)}, "
                + shown,
            )
        )
        token_flag = f" --token-file {ns.admin_token_file}" if ns.admin_token_file else ""
        say(f"  admin API   {job.admin_addr}   (elastic-sidecar admin --address {job.admin_addr}{token_flag} status)")
        say(f"  status page http://{job.http_addr}/   (/metrics, /status, /readyz)")
    try:
        summary, stopped = drive(demo)
    except SetupError as e:
        print(f"elastic-sidecar demo: {e}", file=sys.stderr)
        return 2
    # The timeline was printed as it happened (the live report); --quiet prints the summary alone.
    print(render(summary, demo.t_start, workdir, timeline=False, journal_path=job.journal_path))
    if multi:
        _print_restarts(summary)
    if ns.summary_json:
        ns.summary_json.parent.mkdir(parents=True, exist_ok=True)
        ns.summary_json.write_text(json.dumps(summary, indent=2))
    if ns.plot and not multi:
        from simjob.plot import draw

        draw(summary, workdir, demo.t_start, ns.plot)
        print(f"plot: {ns.plot}")
    code = finish_line(demo, stopped)
    if code is not None:
        return code
    if multi:
        return 0 if summary["completed"] else 1
    codes = summary["exit_codes"]
    trainer = codes.get("trainer")
    return 0 if trainer == 0 else (128 - trainer if isinstance(trainer, int) and trainer < 0 else int(trainer or 1))


def _print_restarts(summary: dict[str, Any]) -> None:
    """The multi-controller run's lines per fault: the other hosts' processes gone, the restart."""
    for f in summary["faults"]:
        print(
            fit(
                "  ",
                f"{f['fault']}: every trainer process on the other hosts gone {f['all_exited_seconds']} s after the "
                f"fault (every pod deleted by the JobSet stand-in at {f['jobset_cleanup_seconds']} s); restart to "
                f"first step {f['restart_to_first_step_seconds']} s, resumed from step {f['resumed_from_step']}",
            )
        )
    if "gave_up" in summary:
        print(fit("  ", f"gave up; where it was (None: still running): {json.dumps(summary['gave_up'])}"))
