"""Shared parts of the benchmarks: the rig they run on loopback, processes, statistics, the JSON's provenance."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port free just now and not handed out before by this process (the kernel can give a
    closed socket's port to the next ``bind(0)``: two servers of one rig would then collide)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def raise_nofile() -> None:
    """Raise this process's RLIMIT_NOFILE soft limit to its hard limit (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type: a ``kind`` above 0, else an error naming the value."""

    def parse(v: str) -> Any:
        try:
            x = kind(v)
        except ValueError:
            x = 0
        if x <= 0:
            raise argparse.ArgumentTypeError(f"{v!r}: expected a number above 0")
        return x

    return parse


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


def median(xs: Iterable[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return statistics.median(v) if v else None


def percentile(xs: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100)."""
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))]


def rnd(x: float | None, n: int = 4) -> float | None:
    return None if x is None else round(float(x), n)


def json_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON objects among a log's or journal's lines; other lines are skipped."""
    out = []
    for line in lines:
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return json_lines(path.read_text(encoding="utf-8", errors="replace").splitlines()) if path.exists() else []


def iso_to_epoch(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def wait_until(
    pred: Callable[[], Any], timeout: float, interval: float = 0.02, proc: subprocess.Popen[Any] | None = None
) -> Any:
    """Poll ``pred`` until it returns something truthy; returns it (None on timeout). With ``proc``, stop
    once that process has exited, after one last look (a process writes its last lines as it ends)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            return pred() or None
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def serving(addr: str) -> bool:
    """Whether a gRPC server's ``grpc.health.v1`` Check answers SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with grpc.insecure_channel(addr) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            return r.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def daemon_port_flags() -> list[str]:
    """Free loopback ports for a daemon's HTTP and admin servers (their fixed defaults would collide)."""
    return ["--http-listen", f"127.0.0.1:{free_port()}", "--admin-listen", f"127.0.0.1:{free_port()}"]


class FakeTrainer:
    """An attached trainer that acknowledges holds and resumes at once, so the job is RUNNING."""

    def __init__(self, addr: str, job: str) -> None:
        self.addr, self.job = addr, job
        self.running = threading.Event()
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="fake-trainer").start()

    def _run(self) -> None:
        from trainer_hooks import ElasticSession
        from trainer_hooks.session import AbortTraining

        s = ElasticSession.connect(self.addr, job=self.job)
        s.resumed(s.start(), 0, "fresh", 0.0)
        self.running.set()
        try:
            while not self._stop.is_set():
                d = s.step_boundary(0)
                if d is not None:
                    s.resumed(d, 0, "memory", 0.0)
                time.sleep(0.005)
        except AbortTraining:
            if not self._stop.is_set():  # held when the rig stopped: the end of its job, not an error
                raise

    def stop(self) -> None:
        self._stop.set()


class Rig:
    """A coordinator (JSON logs in ``workdir``), hosts (a stand-in Pathways worker and a worker sidecar in
    a process group each) and a :class:`FakeTrainer`: what detection, footprint and scale run against."""

    def __init__(
        self,
        workdir: Path,
        job: str,
        slices: int,
        hosts_per_slice: int = 1,
        coordinator_args: Sequence[str] = (),
    ) -> None:
        self.workdir, self.job, self.slices = workdir, job, slices
        workdir.mkdir(parents=True, exist_ok=True)
        self.addr = f"127.0.0.1:{free_port()}"
        self.trainer_addr = f"127.0.0.1:{free_port()}"
        side = daemon_port_flags()
        self.http = side[1]
        self.cmd = [PY, "-m", "agent", "coordinator", "--job", job, "--listen", self.addr]
        self.cmd += ["--trainer-listen", self.trainer_addr, "--num-slices", str(slices)]
        self.cmd += ["--hosts-per-slice", str(hosts_per_slice), "--log-format", "json", *side, *coordinator_args]
        self.coordinator_env = env()
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.hosts: dict[tuple[int, int], list[subprocess.Popen[bytes]]] = {}
        self.incarnation: dict[tuple[int, int], int] = {}
        self.trainer: FakeTrainer | None = None
        self.files: list[IO[bytes]] = []

    def logfile(self, name: str) -> IO[bytes]:
        f = open(self.workdir / name, "ab")  # noqa: SIM115 - closed in stop()
        self.files.append(f)
        return f

    def start_coordinator(
        self, log_name: str = "coordinator.log", timeout: float = 60.0, cpus: set[int] | None = None
    ) -> float:
        """Start the coordinator (on ``cpus`` only, if given); returns the seconds until it served."""
        t0 = time.time()
        out = self.logfile(log_name)
        self.coordinator = subprocess.Popen(
            self.cmd, stdout=out, stderr=subprocess.STDOUT, env=self.coordinator_env, cwd=ROOT
        )
        if cpus:
            os.sched_setaffinity(self.coordinator.pid, cpus)
        if not wait_until(lambda: serving(self.addr), timeout, 0.005):
            raise RuntimeError(f"the coordinator did not serve within {timeout:g} s (see {self.workdir / log_name})")
        return time.time() - t0

    def node(self, s: int, h: int) -> str:
        return f"gke-bench-slice{s}-host{h}-r{self.incarnation.get((s, h), 0)}"

    def start_host(
        self,
        s: int,
        h: int = 0,
        worker_args: Sequence[str] = (),
        extra: Sequence[list[str]] = (),
        serving_first: bool = False,
    ) -> int:
        """A stand-in Pathways worker, the host's worker sidecar and any ``extra`` commands (stand-ins of the
        host's own, such as its metadata server) in one process group; returns the worker sidecar's pid.
        ``serving_first``: the worker starts once the stand-in serves, as on a running host."""
        key = (s, h)
        self.incarnation[key] = self.incarnation.get(key, -1) + 1
        out = self.logfile(f"host-{s}.{h}.log")
        port = free_port()
        pw = subprocess.Popen(
            [PY, "-m", "standins.pathways_worker", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
            env=env(),
            cwd=ROOT,
        )
        if serving_first and not wait_until(lambda: serving(f"127.0.0.1:{port}"), 30):
            raise RuntimeError(f"the stand-in Pathways worker of host {s}.{h} did not serve within 30 s")
        wcmd = [PY, "-m", "agent", "worker", "--job", self.job, "--coordinator", self.addr, "--slice", str(s)]
        wcmd += ["--host", str(h), "--node", self.node(s, h), "--health-target", f"127.0.0.1:{port}"]
        wcmd += ["--log-format", "json", *daemon_port_flags(), *worker_args]
        procs = [pw] + [
            subprocess.Popen(c, stdout=out, stderr=subprocess.STDOUT, process_group=pw.pid, env=env(), cwd=ROOT)
            for c in [*extra, wcmd]
        ]
        self.hosts[key] = procs
        return procs[-1].pid

    def kill_host(self, s: int, h: int = 0) -> None:
        procs = self.hosts.pop((s, h), [])
        if procs:
            for sig in (signal.SIGKILL, signal.SIGCONT):  # SIGCONT: a stopped (hung) group dies too
                try:
                    os.killpg(procs[0].pid, sig)
                except ProcessLookupError:
                    pass
        for p in procs:
            p.wait()

    def start_trainer(self, timeout: float = 300.0) -> FakeTrainer:
        self.trainer = FakeTrainer(self.trainer_addr, self.job)
        if not self.trainer.running.wait(timeout):
            raise RuntimeError(f"the job did not start within {timeout:g} s (no resume to the trainer)")
        return self.trainer

    def stop(self) -> None:
        if self.trainer is not None:
            self.trainer.stop()
        for key in list(self.hosts):
            self.kill_host(*key)
        if self.coordinator is not None and self.coordinator.poll() is None:
            self.coordinator.terminate()
            try:
                self.coordinator.wait(30.0)
            except subprocess.TimeoutExpired:
                self.coordinator.kill()
                self.coordinator.wait()
        for f in self.files:
            f.close()


SCHEMA_VERSION = 2


def git_state(root: Path = ROOT) -> dict[str, Any]:
    """``git_sha`` (HEAD now) and ``dirty`` (``git status --porcelain`` not empty); None when unknown."""

    def git(*args: str) -> str | None:
        try:
            p = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return p.stdout if p.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=normal")
    return {"git_sha": sha.strip() if sha else None, "dirty": None if status is None else bool(status.strip())}


def machine() -> dict[str, Any]:
    """What the figures were measured on: cores, memory, CPU model, Python and library versions."""
    from importlib.metadata import PackageNotFoundError, version

    import psutil

    libs: dict[str, str | None] = {}
    for dist in ("grpcio", "jax", "orbax-checkpoint", "pathwaysutils", "psutil", "matplotlib"):
        try:
            libs[dist] = version(dist)
        except PackageNotFoundError:
            libs[dist] = None
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        info = []
    cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.lower().startswith("model name")), None)
    return {
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu_model": cpu or platform.processor() or None,
        "python": platform.python_version(),
        "jax": libs["jax"],
        "kernel": platform.release(),
        "arch": platform.machine(),
        "libraries": libs,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def spread(xs: Sequence[float | None]) -> dict[str, Any]:
    """Median, p90 (nearest rank), min and max of the figures that exist, and how many there were."""
    v = sorted(x for x in xs if x is not None)
    if not v:
        return {"n": 0, "median": None, "p90": None, "min": None, "max": None}
    return {"n": len(v), "median": statistics.median(v), "p90": percentile(v, 90), "min": v[0], "max": v[-1]}


def trainer_of(record: dict[str, Any]) -> str:
    """A recovery row's or run's trainer; runs recorded before they named it: MaxText's are tagged ``mx-``."""
    if record.get("trainer"):
        return str(record["trainer"])
    return "maxtext" if str(record.get("tag", "")).startswith("mx-") else "example"


def maxtext_label(model: str | None) -> str:
    """The recovery rows' trainer for a MaxText model size (``maxtext`` for the tiny one), so that one
    size's rows neither replace another's in docs/benchmarks.json nor mix with them."""
    return "maxtext" if model in (None, "", "tiny") else f"maxtext-{model}"


def portable_path(value: str) -> str:
    """``value`` as a published result records it: an absolute path relative to the repository's root,
    or outside it as ``<outside>/`` and its last component (a scratch directory means nothing elsewhere)."""
    if not value.startswith("/"):
        return value
    p = Path(value)
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return f"<outside>/{p.name}"


def portable_argv(argv: list[str]) -> list[str]:
    """``argv`` with every absolute path (also in ``--flag=/path``) made :func:`portable_path`."""
    out = []
    for a in argv:
        flag, eq, val = a.partition("=")
        out.append(f"{flag}={portable_path(val)}" if eq and flag.startswith("-") else portable_path(a))
    return out
