"""``elastic-sidecar demo``: a simulated multi-slice job with real processes.

Starts the coordinator sidecar, one stand-in Pathways worker plus one worker
sidecar per host (each host is its own process group, so a fault hits both),
and the example trainer on CPU devices grouped into slices. Faults are
injected when the trainer reaches the given step: ``kill`` SIGKILLs the host,
``hang`` SIGSTOPs it. The stand-in provisioner recreates the lost slice after
``--replacement-delay``. At the end it prints a timeline and a summary table,
and writes ``--summary-json``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from agent.auth import read_token_file
from agent.config import is_loopback
from simjob.options import ANNOUNCED, DEFAULT_FAULTS, FaultSpec, check_faults, parse_fault
from simjob.summary import FaultRecord, render, summarize
from standins.provisioner import Provisioner

PY = sys.executable


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def _flags(**kw: object) -> list[str]:
    """--key value pairs from keyword arguments (underscores become dashes)."""
    out: list[str] = []
    for k, v in kw.items():
        if v is not None:
            out += ["--" + k.replace("_", "-"), str(v)]
    return out


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
        self._files: list[IO[bytes]] = []
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
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
        ns = self.ns
        cmd = [PY, "-m", "agent", "coordinator"] + _flags(
            job=DEMO_JOB,
            listen=self.coord_addr,
            num_slices=ns.slices,
            hosts_per_slice=ns.hosts_per_slice,
            elastic_min_slice_count=ns.min_slices,
            elastic_timeout_seconds=ns.timeout,
            elastic_max_retries=ns.max_retries,
            journal=self.workdir / "journal.jsonl",
            state_file=self.workdir / "coordinator-state.json",
            log_format=ns.log_format,
            admin_listen=self.admin_addr,
            admin_token_file=ns.admin_token_file,
            http_listen=self.http_addr,
            peer_token_file=self.peer_token_file,
        )
        env = self.env
        if self.emulator is not None:
            cmd += _flags(pubsub_subscription=self.subscription, cluster_name=DEMO_CLUSTER)
            env = {**env, "PUBSUB_EMULATOR_HOST": self.emulator.host}
        log = self._log("coordinator.log")
        self.coordinator = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)

    def start_host(self, s: int, h: int) -> None:
        old = self.hosts.get((s, h))
        gen = old.generation + 1 if old else 0
        log = self._log(f"host-{s}.{h}.log")
        port = self.pw_ports[(s, h)]
        pw = subprocess.Popen(
            [PY, "-m", "standins.pathways_worker", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,
            env=self.env,
        )
        cmd = [PY, "-m", "agent", "worker"] + _flags(
            job=DEMO_JOB,
            coordinator=self.coord_addr,
            slice=s,
            host=h,
            node=f"gke-demo-slice{s}-host{h}-r{gen}",
            node_pool=f"demo-pool-{s}",
            pod=f"{DEMO_JOB}-worker-{s}-{h}",
            health_target=f"127.0.0.1:{port}",
            log_format=self.ns.log_format,
            peer_token_file=self.peer_token_file,
            # Every host of the simulated job shares this machine's loopback: no per-worker HTTP.
            http_listen="none",
        )
        if (s, h) in self.metadata_ports:
            cmd += _flags(metadata_url=f"http://127.0.0.1:{self.metadata_ports[(s, h)]}/computeMetadata/v1")
        wk = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, process_group=pw.pid, env=self.env)
        self.hosts[(s, h)] = Host(s, h, gen, [pw, wk])

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

    def start_trainer(self) -> None:
        ns = self.ns
        n_dev = ns.slices * ns.devices_per_slice
        env = {**self.env, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={n_dev}"}
        cmd = [PY, "-m", "simjob.trainer"] + _flags(
            sidecar=self.coord_addr,
            job=DEMO_JOB,
            workdir=self.workdir,
            slices=ns.slices,
            devices_per_slice=ns.devices_per_slice,
            steps=ns.steps,
            checkpoint_period=ns.checkpoint_period,
            step_seconds=ns.step_seconds,
            events=self.workdir / "trainer-events.jsonl",
        )
        for (s, h), port in sorted(self.pw_ports.items()):
            cmd += ["--pathways", f"{s}.{h}=127.0.0.1:{port}"]
        self.trainer = subprocess.Popen(cmd, stdout=self._log("trainer.log"), stderr=subprocess.STDOUT, env=env)

    def stop_all(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        if self.trainer is not None:
            procs.append(("trainer", self.trainer))
        for key, host in self.hosts.items():
            host.signal(signal.SIGCONT)
            procs += [(f"host {key[0]}.{key[1]}", p) for p in host.procs]
        if self.coordinator is not None:
            procs.append(("coordinator", self.coordinator))
        procs += [("metadata", p) for p in self.metadata_procs]
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
        if self.publisher is not None:
            self.publisher.transport.close()
        if self.emulator is not None:
            self.emulator.stop()
        for f in self._files:
            f.close()
        return codes


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


class _Tail:
    """Reads the JSON lines a file gains."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.buf = ""

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, encoding="utf-8") as f:
            f.seek(self.pos)
            data = f.read()
            self.pos = f.tell()
        self.buf += data
        *lines, self.buf = self.buf.split("\n")
        return [json.loads(x) for x in lines if x.strip()]


def run_demo(ns: argparse.Namespace) -> int:
    faults: list[FaultSpec] = [] if ns.no_faults else (ns.fault or [parse_fault(f) for f in DEFAULT_FAULTS])
    try:
        check_faults(faults, ns.slices, ns.hosts_per_slice, ns.steps)
        if ns.min_slices != -1 and not 1 <= ns.min_slices <= ns.slices:
            raise ValueError(f"--min-slices must be -1 or between 1 and --slices={ns.slices}, got {ns.min_slices}")
        if ns.admin_token_file is not None:
            read_token_file(ns.admin_token_file, "--admin-token-file")
        if ns.admin_address and not ns.admin_token_file and not is_loopback(ns.admin_address):
            raise ValueError(f"--admin-address {ns.admin_address} is not a loopback address: give --admin-token-file")
    except ValueError as e:  # ConfigError is a ValueError
        print(f"elastic-sidecar demo: {e}", file=sys.stderr)
        return 2
    workdir = ns.workdir or Path(tempfile.mkdtemp(prefix="elastic-demo-"))
    workdir = workdir.resolve()
    if (workdir / "checkpoints").exists() and any((workdir / "checkpoints").iterdir()):
        print(f"elastic-sidecar demo: {workdir} already holds checkpoints; pass an empty --workdir", file=sys.stderr)
        return 2
    workdir.mkdir(parents=True, exist_ok=True)
    say = (lambda *_: None) if ns.quiet else (lambda msg: print(msg, flush=True))
    job = Job(ns, workdir)
    say(
        f"elastic-sidecar demo: {ns.slices} slices x {ns.hosts_per_slice} host(s), {ns.steps} steps, "
        f"min slices {ns.min_slices}, faults: {' '.join(map(str, faults)) or 'none'}; workdir {workdir}"
    )
    token_flag = f" --token-file {ns.admin_token_file}" if ns.admin_token_file else ""
    say(f"  admin API   {job.admin_addr}   (elastic-sidecar admin --address {job.admin_addr}{token_flag} status)")
    say(f"  status page http://{job.http_addr}/   (/metrics, /status, /readyz)")
    # SIGTERM (a `timeout`, a CI runner) stops the job like Ctrl-C: no orphaned hosts.
    signal.signal(signal.SIGTERM, _interrupt)
    t_start = time.time()
    provisioner = Provisioner(ns.replacement_delay, job.recreate_slice, enabled=not ns.no_replacement)
    records: list[FaultRecord] = []
    pending = sorted(faults, key=lambda f: f.at_step)
    tail = _Tail(workdir / "trainer-events.jsonl")
    last_step = 0
    codes: dict[str, int | None] = {}
    kinds = {f.kind for f in faults}
    deaths: list[tuple[float, FaultSpec]] = []  # announced faults: when their host dies
    try:
        if "notice" in kinds:
            say("  starting the Pub/Sub emulator for notice faults")
            job.start_pubsub()
        if "metadata" in kinds:
            job.start_metadata_servers()
        job.start_coordinator()
        for s in range(ns.slices):
            for h in range(ns.hosts_per_slice):
                job.start_host(s, h)
        job.start_trainer()
        assert job.trainer is not None
        deadline = time.monotonic() + ns.run_timeout
        while job.trainer.poll() is None:
            for ev in tail.read():
                if ev.get("kind") == "step":
                    last_step = max(last_step, int(ev["step"]))
            while pending and last_step >= pending[0].at_step:
                f = pending.pop(0)
                now = time.time()
                if f.kind in ANNOUNCED:
                    job.announce(f.kind, f.slice, f.host)
                    deaths.append((time.monotonic() + ns.notice_deadline, f))
                    what = f"announced: host {f.slice}.{f.host} goes in {ns.notice_deadline:g} s"
                else:
                    job.hosts[(f.slice, f.host)].signal(signal.SIGKILL if f.kind == "kill" else signal.SIGSTOP)
                    provisioner.slice_lost(f.slice, time.monotonic())
                    what = f"host {f.slice}.{f.host}"
                records.append(FaultRecord(f.kind, f.slice, f.host, f.at_step, now, last_step))
                say(f"  +{now - t_start:7.3f}s  [harness] {f.kind} {what} at step {last_step}")
            for when, f in [d for d in deaths if d[0] <= time.monotonic()]:
                deaths.remove((when, f))
                job.hosts[(f.slice, f.host)].signal(signal.SIGKILL)
                provisioner.slice_lost(f.slice, time.monotonic())
                say(f"  +{time.time() - t_start:7.3f}s  [harness] host {f.slice}.{f.host} died at its deadline")
            for s in provisioner.poll(time.monotonic()):
                say(f"  +{time.time() - t_start:7.3f}s  [provisioner] slice {s} recreated")
            if time.monotonic() > deadline:
                say(f"elastic-sidecar demo: giving up after --run-timeout {ns.run_timeout:g} s")
                break
            time.sleep(0.02)
    except KeyboardInterrupt:
        say("interrupted")
    finally:
        # Let the coordinator see the trainer's last messages and exit on its own.
        if job.coordinator is not None:
            try:
                job.coordinator.wait(3)
            except subprocess.TimeoutExpired:
                pass
        codes = job.stop_all()
    wall = time.time() - t_start
    summary = summarize(workdir, records, t_start, wall, codes)
    print(render(summary, t_start, workdir, timeline=not ns.quiet))
    if ns.summary_json:
        ns.summary_json.parent.mkdir(parents=True, exist_ok=True)
        ns.summary_json.write_text(json.dumps(summary, indent=2))
    return 0 if codes.get("trainer") == 0 else int(codes.get("trainer") or 1)
