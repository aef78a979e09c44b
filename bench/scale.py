"""Scale: one coordinator against thousands of worker sidecars on loopback.

The coordinator runs as its own process (``python -m agent coordinator``,
journal off, ``--heartbeat-interval 1 --heartbeat-timeout 3``, 100 hosts per
slice). Load generators (:mod:`bench.scale_loadgen`, one process per 2,500
workers) open one gRPC channel and one ``Join`` stream per fake worker, as
production workers do, and heartbeat at 1 Hz. A fake trainer attaches with
:class:`trainer_hooks.ElasticSession`, so once every worker has registered the
job is RUNNING. Then:

* steady state: the coordinator's CPU (psutil, cores used, median of windows)
  and RSS, after a settling time;
* hold fan-out: one fake worker disconnects, the coordinator decides a hold
  and broadcasts ``PeerCommand(kind="hold")`` (TellWorkers) to every other
  worker; each generator records when each worker receives it. Latency is
  receive time minus the decision time in the coordinator's log (same
  machine, same clock): p50 / p99 / max over workers, median over cycles. The
  worker then reconnects, the job resumes (the resume fan-out is recorded
  too), and the cycle repeats.

Everything shares the machine's cores with the load generators, which
themselves send N heartbeats a second: the fan-out latencies include their
scheduling delays.
"""

from __future__ import annotations

import json
import math
import queue
import resource
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from bench.common import (
    PY,
    ROOT,
    CpuSampler,
    daemon_port_flags,
    env,
    free_port,
    iso_to_epoch,
    log,
    median,
    percentile,
    rnd,
    stop_process,
    target,
    wait_until,
)

NAME = "scale"
JOB = "bench-scale"
PER_GENERATOR = 2500
WHAT_IF_ENV = {"BENCH_KEEPALIVE_MS": "5000", "BENCH_MEMO_UP_SLICES": "1"}
"""The what-if run (bench/coordinator_variant.py): keepalive every 5 s instead of 0.5 s on both
sides, and up_slices() memoized per state."""
HOSTS_PER_SLICE = 100


def _raise_nofile_for_children() -> int:
    """Children inherit the soft limit: raise it here (no preexec_fn: forking a threaded process is unsafe)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


class LogTail:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.buf = ""
        self.records: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return self.records
        with open(self.path, encoding="utf-8", errors="replace") as f:
            f.seek(self.pos)
            data = f.read()
            self.pos = f.tell()
        self.buf += data
        *lines, self.buf = self.buf.split("\n")
        for line in lines:
            if line.startswith("{"):
                try:
                    self.records.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        return self.records

    def tell_workers(self, kind: str, after_gen: int) -> dict[str, Any] | None:
        for r in self.poll():
            for a in r.get("actions", []) or []:
                if a.get("type") == "TellWorkers" and a.get("kind") == kind and int(a.get("generation", 0)) > after_gen:
                    return {
                        "generation": int(a["generation"]),
                        "time": iso_to_epoch(r["time"]),
                        "message": r.get("message", ""),
                    }
        return None


class Generator:
    def __init__(self, addr: str, first: int, count: int, logf: IO[bytes], extra: list[str] | None = None) -> None:
        self.first = first
        self.count = count
        self.proc = subprocess.Popen(
            [
                PY,
                "-m",
                "bench.scale_loadgen",
                "--coordinator",
                addr,
                "--job",
                JOB,
                "--first",
                str(first),
                "--count",
                str(count),
                "--hosts-per-slice",
                str(HOSTS_PER_SLICE),
                *(extra or []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=logf,
            env=env(),
            cwd=ROOT,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip():
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def read(self, timeout: float | None = 600.0) -> dict[str, Any]:
        try:
            msg = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"load generator {self.first}.. did not answer within {timeout} s") from None
        if msg is None:
            raise RuntimeError(f"load generator {self.first}.. exited (code {self.proc.poll()})")
        return msg

    def ask(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.send(obj)
        return self.read()


class FakeTrainer:
    """An attached trainer that acknowledges holds and resumes at once."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.running = threading.Event()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="fake-trainer")
        self.thread.start()

    def _run(self) -> None:
        from trainer_hooks import ElasticSession

        s = ElasticSession.connect(self.addr, job=JOB)
        d = s.start()
        s.resumed(d, 0, "fresh", 0.0)
        self.running.set()
        while not self._stop.is_set():
            d = s.step_boundary(0)
            if d is not None:
                s.resumed(d, 0, "memory", 0.0)
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()


def _health_serving(addr: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with grpc.insecure_channel(addr) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            return r.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def _latencies(dumps: list[dict[str, list[list[Any]]]], kind: str, gen: int, t_dec: float) -> list[float]:
    out = []
    for d in dumps:
        for recs in d.values():
            t = next((r[2] for r in recs if r[0] == kind and int(r[1]) == gen), None)
            if t is not None:
                out.append(t - t_dec)
    return out


def _stats(lat: list[float]) -> dict[str, Any]:
    return {
        "n": len(lat),
        "p50_s": rnd(percentile(lat, 50)),
        "p99_s": rnd(percentile(lat, 99)),
        "max_s": rnd(max(lat)) if lat else None,
        "min_s": rnd(min(lat)) if lat else None,
    }


class Collapsed(RuntimeError):
    """The coordinator lost registered workers to heartbeat timeouts before the job could start."""


def wait_registered(
    gens: list[Generator],
    log_path: Path,
    sampler: CpuSampler,
    t0: float,
    cpu0: float,
    out: dict[str, Any],
    timeout: float = 420.0,
) -> list[dict[str, Any]]:
    """Each generator's "registered" answer; stops early when the coordinator starts timing workers out."""
    regs: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    pos = 0
    joined = 0
    while len(regs) < len(gens):
        for i, g in enumerate(gens):
            if i not in regs:
                try:
                    regs[i] = g.read(timeout=0.2)
                except TimeoutError:
                    pass
        with open(log_path, encoding="utf-8", errors="replace") as f:
            f.seek(pos)
            chunk = f.read()
            pos = f.tell()
        joined += chunk.count('"trigger": "WorkerJoined"')
        if '"trigger": "WorkerLost"' in chunk and "heartbeat_timeout" in chunk:
            out["collapse"] = {
                "after_s": rnd(time.time() - t0, 1),
                "workers_registered": joined,
                "coordinator_cpu_s": rnd(sampler.cpu_seconds() - cpu0, 1),
            }
            raise Collapsed(
                f"registered workers started timing out (heartbeat 3 s) {out['collapse']['after_s']} s into "
                f"registration, with {joined} of {sum(g.count for g in gens)} registered and "
                f"{out['collapse']['coordinator_cpu_s']} s of coordinator CPU used: the coordinator (and the load "
                "generators on the same 2 cores) could not keep up"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"registration not done after {timeout:g} s ({joined} registered)")
    return [regs[i] for i in range(len(gens))]


def run_size(
    n: int, root: Path, quick: bool, cycles: int, profile: bool = False, what_if: bool = False
) -> dict[str, Any]:
    import psutil

    wd = root / (f"n{n}-what-if" if what_if else f"n{n}")
    wd.mkdir(parents=True, exist_ok=True)
    addr = f"127.0.0.1:{free_port()}"
    num_slices = max(1, n // HOSTS_PER_SLICE)
    assert num_slices * HOSTS_PER_SLICE == n or n < HOSTS_PER_SLICE
    hosts = HOSTS_PER_SLICE if n >= HOSTS_PER_SLICE else n
    logf = open(wd / "coordinator.log", "wb")  # noqa: SIM115
    genlog = open(wd / "generators.log", "wb")  # noqa: SIM115
    _raise_nofile_for_children()
    prof = ["-m", "cProfile", "-o", str(wd / "coordinator.prof")] if profile else []
    module = "bench.coordinator_variant" if what_if else "agent"
    cenv = env(**WHAT_IF_ENV) if what_if else env()
    trainer_addr = f"127.0.0.1:{free_port()}"
    cmd = [PY, *prof, "-m", module, "coordinator", "--job", JOB, "--listen", addr, "--trainer-listen", trainer_addr]
    cmd += ["--num-slices", str(num_slices), "--hosts-per-slice", str(hosts)]
    cmd += ["--heartbeat-interval", "1", "--heartbeat-timeout", "3", "--elastic-timeout-seconds", "1800"]
    cmd += ["--elastic-max-retries", "100000"]
    cmd += ["--log-format", "json", *daemon_port_flags("coordinator")]
    coord = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=cenv, cwd=ROOT)
    gens: list[Generator] = []
    trainer = None
    out: dict[str, Any] = {"workers": n, "slices": num_slices, "hosts_per_slice": hosts}
    try:
        if not wait_until(lambda: _health_serving(addr), 30, 0.05):
            raise RuntimeError("coordinator did not serve")
        sampler = CpuSampler(coord.pid)
        trainer = FakeTrainer(trainer_addr)
        t0 = time.time()
        cpu0 = sampler.cpu_seconds()
        ng = max(1, math.ceil(n / PER_GENERATOR))
        per = math.ceil(n / ng)
        for g in range(ng):
            first = g * per
            extra = ["--keepalive-ms", WHAT_IF_ENV["BENCH_KEEPALIVE_MS"]] if what_if else []
            gens.append(Generator(addr, first, min(per, n - first), genlog, extra))
        regs = wait_registered(gens, wd / "coordinator.log", sampler, t0, cpu0, out)
        t_reg = max(r["t1"] for r in regs)
        failed = sum(r["failed"] for r in regs)
        out["registration_s"] = rnd(t_reg - t0, 2)
        out["registration_failed"] = failed
        if not trainer.running.wait(300):
            raise RuntimeError("the job did not start (no resume to the trainer)")
        out["running_after_s"] = rnd(time.time() - t0, 2)
        out["registration_cpu_s"] = rnd(sampler.cpu_seconds() - cpu0, 2)
        log(f"scale {n}: registered in {out['registration_s']} s ({failed} failed); running")
        time.sleep(2.0 if quick else 5.0)
        threads0 = {t.id: t.user_time + t.system_time for t in psutil.Process(coord.pid).threads()}
        tw0 = time.monotonic()
        windows = sampler.windows(3.0 if quick else 10.0, 3 if quick else 5)
        threads1 = {t.id: t.user_time + t.system_time for t in psutil.Process(coord.pid).threads()}
        span = time.monotonic() - tw0
        main_cpu = (threads1.get(coord.pid, 0.0) - threads0.get(coord.pid, 0.0)) / span
        other_cpu = sum(v - threads0.get(k, 0.0) for k, v in threads1.items() if k != coord.pid) / span
        out["cpu_cores_main_thread"] = rnd(main_cpu, 4)
        out["cpu_cores_other_threads"] = rnd(other_cpu, 4)
        out["threads"] = len(threads1)
        out["cpu_cores"] = rnd(median(windows), 4)
        out["cpu_cores_windows"] = [rnd(w, 4) for w in windows]
        out["rss_mib"] = rnd(sampler.rss() / 2**20, 1)
        gen_procs = [psutil.Process(g.proc.pid) for g in gens]
        out["generator_rss_mib"] = rnd(sum(p.memory_info().rss for p in gen_procs) / 2**20, 1)
        g_cpu0 = sum(sum(p.cpu_times()[:2]) for p in gen_procs)
        time.sleep(2.0)
        out["generators_cpu_cores"] = rnd((sum(sum(p.cpu_times()[:2]) for p in gen_procs) - g_cpu0) / 2.0, 3)
        out["open_fds"] = psutil.Process(coord.pid).num_fds()
        log(f"scale {n}: coordinator {out['cpu_cores']} cores, {out['rss_mib']} MiB")

        tail = LogTail(wd / "coordinator.log")
        last_gen = 1
        cyc = []
        for _cycle in range(cycles):
            g0 = gens[0]
            t_disc = g0.ask({"cmd": "disconnect", "index": 0})["t"]
            hold = wait_until(lambda lg=last_gen: tail.tell_workers("hold", lg), 30, 0.01)
            if hold is None:
                raise RuntimeError("no hold decision after a worker disconnected")
            gen = hold["generation"]
            waits = [g.ask({"cmd": "wait", "kind": "hold", "generation": gen, "timeout": 60}) for g in gens]
            g0.ask({"cmd": "reconnect", "index": 0})
            resume = wait_until(lambda gg=gen: tail.tell_workers("resume", gg - 1), 60, 0.01)
            rwaits = []
            if resume is not None:
                rwaits = [
                    g.ask({"cmd": "wait", "kind": "resume", "generation": resume["generation"], "timeout": 60})
                    for g in gens
                ]
            cyc.append(
                {
                    "generation": gen,
                    "t_disconnect": t_disc,
                    "t_hold": hold["time"],
                    "t_resume": resume["time"] if resume else None,
                    "hold_received": sum(w["have"] for w in waits),
                    "hold_expected": sum(w["expected"] for w in waits),
                    "resume_received": sum(w["have"] for w in rwaits),
                }
            )
            last_gen = gen
            time.sleep(1.0)
        dumps = []
        for i, g in enumerate(gens):
            p = wd / f"received-{i}.json"
            g.ask({"cmd": "dump", "path": str(p)})
            dumps.append(json.loads(p.read_text()))
        holds, resumes = [], []
        for c in cyc:
            lat = _latencies(dumps, "hold", c["generation"], c["t_hold"])
            c["hold_fanout"] = _stats(lat)
            c["disconnect_to_decision_s"] = rnd(c["t_hold"] - c["t_disconnect"])
            holds.append(c["hold_fanout"])
            if c["t_resume"] is not None:
                c["resume_fanout"] = _stats(_latencies(dumps, "resume", c["generation"], c["t_resume"]))
                resumes.append(c["resume_fanout"])
        out["cycles"] = cyc
        out["hold_fanout"] = {
            "p50_s": rnd(median(h["p50_s"] for h in holds)),
            "p99_s": rnd(median(h["p99_s"] for h in holds)),
            "max_s": rnd(median(h["max_s"] for h in holds)),
            "received": [c["hold_received"] for c in cyc],
            "expected": [c["hold_expected"] for c in cyc],
        }
        out["resume_fanout"] = {
            "p50_s": rnd(median(h["p50_s"] for h in resumes)),
            "p99_s": rnd(median(h["p99_s"] for h in resumes)),
        }
        out["disconnect_to_decision_s"] = rnd(median(c["disconnect_to_decision_s"] for c in cyc))
        log(f"scale {n}: hold fan-out p50 {out['hold_fanout']['p50_s']} s p99 {out['hold_fanout']['p99_s']} s")
    except Collapsed as e:
        out["error"] = f"did not reach steady state: {e}"
        log(f"scale {n}: {out['error']}")
    finally:
        for g in gens:
            try:
                g.send({"cmd": "quit"})
            except (BrokenPipeError, OSError):
                pass
        for g in gens:
            try:
                g.proc.wait(20)
            except subprocess.TimeoutExpired:
                g.proc.kill()
        if trainer is not None:
            trainer.stop()
        stop_process(coord, grace=30.0)
        logf.close()
        genlog.close()
    return out


def run(
    quick: bool = False,
    sizes: list[int] | None = None,
    cycles: int | None = None,
    workdir: Path | None = None,
    profile: bool = False,
    what_if: list[int] | None = None,
) -> dict[str, Any]:
    sizes = sizes or ([200] if quick else [1000, 4000, 10000])
    if what_if is None:
        what_if = [] if quick else [4000]
    cycles = cycles or (1 if quick else 3)
    root = Path(workdir or tempfile.mkdtemp(prefix="bench-scale-"))
    t0 = time.monotonic()
    results = []
    for n in sizes:
        try:
            results.append(run_size(n, root, quick, cycles, profile))
        except Exception as e:  # noqa: BLE001 - report the failure as a result
            log(f"scale {n}: FAILED: {e}")
            results.append({"workers": n, "error": f"{type(e).__name__}: {e}"})
    what_ifs = []
    for n in what_if:
        log(f"scale {n}: what-if run (keepalive 5 s, up_slices memoized; bench/coordinator_variant.py)")
        try:
            what_ifs.append(run_size(n, root, quick, cycles, profile, what_if=True))
        except Exception as e:  # noqa: BLE001
            log(f"scale {n} what-if: FAILED: {e}")
            what_ifs.append({"workers": n, "error": f"{type(e).__name__}: {e}"})
    big = max((r for r in results if "error" not in r), key=lambda r: r["workers"], default=None)
    failed_10k = next((r for r in results if r["workers"] >= 10000 and "error" in r), None)
    targets = []
    if big is not None:
        reached = big["workers"] >= 10000
        note = f"at {big['workers']} workers"
        if failed_10k is not None:
            why = failed_10k["error"].removeprefix("did not reach steady state: ")
            note += f"; 10,000 did not reach steady state ({why[:100]}...)"
        elif not reached:
            note += " (10,000 not measured in this run)"
        cpu_ok = (
            big["cpu_cores"] < 0.5
            if reached
            else (False if failed_10k is not None or big["cpu_cores"] >= 0.5 else None)
        )
        p99 = big["hold_fanout"]["p99_s"]
        p99_ok = (p99 < 1.0 if p99 is not None else None) if reached else (False if failed_10k is not None else None)
        targets.append(
            target("coordinator CPU, 10,000 workers at 1 Hz", "< 0.5 core", big["cpu_cores"], "cores", cpu_ok, note)
        )
        targets.append(target("hold fan-out p99, 10,000 workers", "< 1 s", p99, "s", p99_ok, note))
    else:
        targets.append(target("coordinator CPU, 10,000 workers at 1 Hz", "< 0.5 core", None, "cores", None, "failed"))
        targets.append(target("hold fan-out p99, 10,000 workers", "< 1 s", None, "s", None, "failed"))
    return {
        "name": NAME,
        "quick": quick,
        "config": {
            "sizes": sizes,
            "cycles": cycles,
            "hosts_per_slice": HOSTS_PER_SLICE,
            "workers_per_generator": PER_GENERATOR,
            "heartbeat_interval_s": 1,
            "heartbeat_timeout_s": 3,
        },
        "sizes": results,
        "what_if": what_ifs,
        "what_if_env": WHAT_IF_ENV,
        "targets": targets,
        "duration_s": round(time.monotonic() - t0, 1),
    }
