"""Footprint: idle CPU and memory of each sidecar role, and start-up time.

A coordinator (the shipped heartbeat defaults, recorded in the result's config; journal
and state file off) with four worker sidecars, each watching a stand-in
Pathways worker over ``grpc.health.v1``, and a fake trainer attached with
:class:`trainer_hooks.ElasticSession`, so the job is RUNNING and nothing
happens. After a settling time the bench reads each process's CPU time and
RSS with psutil over an idle window.

Start-up: process start (just before ``Popen``) until ready - for the
coordinator, its ``grpc.health.v1`` Check answers SERVING (polled every
5 ms); for a worker, the time on its "registered with coordinator" log line
(its stand-in Pathways worker already serves, as it would on a running host).
Medians over repeats (each repeat starts everything afresh).
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from agent import constants as C
from bench.common import (
    PY,
    ROOT,
    daemon_port_flags,
    env,
    free_port,
    iso_to_epoch,
    log,
    median,
    read_jsonl,
    rnd,
    stop_process,
    target,
    wait_until,
)
from bench.scale import FakeTrainer, _health_serving

NAME = "footprint"
JOB = "bench-scale"  # FakeTrainer's job name
WORKERS = 4


def _registered_time(path: Path) -> float | None:
    for r in read_jsonl(path):
        if r.get("message") == "registered with coordinator" and "time" in r:
            return iso_to_epoch(r["time"])
    return None


def _thread_times(proc: Any) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of a psutil process, by thread id."""
    return {t.id: t.user_time + t.system_time for t in proc.threads()}


def one_round(root: Path, idle_s: float, settle_s: float) -> dict[str, Any]:
    import psutil

    root.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    files = []
    trainer = None
    out: dict[str, Any] = {}
    try:
        addr = f"127.0.0.1:{free_port()}"
        trainer_addr = f"127.0.0.1:{free_port()}"
        f = open(root / "coordinator.log", "wb")  # noqa: SIM115
        files.append(f)
        cmd = [
            PY,
            "-m",
            "agent",
            "coordinator",
            "--job",
            JOB,
            "--listen",
            addr,
            "--trainer-listen",
            trainer_addr,
            "--num-slices",
            str(WORKERS),
            "--hosts-per-slice",
            "1",
            "--elastic-min-slice-count",
            "1",
            "--log-format",
            "json",
            *daemon_port_flags("coordinator"),
        ]
        t0 = time.time()
        coord = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env(), cwd=ROOT)
        procs.append(coord)
        if not wait_until(lambda: _health_serving(addr), 30, 0.005):
            raise RuntimeError("coordinator did not serve")
        out["coordinator_startup_s"] = rnd(time.time() - t0, 3)
        pw_ports = [free_port() for _ in range(WORKERS)]
        for i, port in enumerate(pw_ports):
            pf = open(root / f"pathways-{i}.log", "wb")  # noqa: SIM115
            files.append(pf)
            procs.append(
                subprocess.Popen(
                    [PY, "-m", "standins.pathways_worker", "--port", str(port)],
                    stdout=pf,
                    stderr=subprocess.STDOUT,
                    env=env(),
                    cwd=ROOT,
                )
            )
        for port in pw_ports:
            if not wait_until(lambda p=port: _health_serving(f"127.0.0.1:{p}"), 30, 0.02):
                raise RuntimeError("stand-in Pathways worker did not serve")
        workers = []
        starts = []
        for i, port in enumerate(pw_ports):
            wf = open(root / f"worker-{i}.log", "wb")  # noqa: SIM115
            files.append(wf)
            wcmd = [
                PY,
                "-m",
                "agent",
                "worker",
                "--job",
                JOB,
                "--coordinator",
                addr,
                "--slice",
                str(i),
                "--host",
                "0",
                "--health-target",
                f"127.0.0.1:{port}",
                "--log-format",
                "json",
                *daemon_port_flags("worker"),
            ]
            starts.append(time.time())
            w = subprocess.Popen(wcmd, stdout=wf, stderr=subprocess.STDOUT, env=env(), cwd=ROOT)
            procs.append(w)
            workers.append(w)
            # One at a time, so each start-up is measured without the others competing.
            wait_until(lambda i=i: _registered_time(root / f"worker-{i}.log"), 30, 0.02)
        reg = [_registered_time(root / f"worker-{i}.log") for i in range(WORKERS)]
        out["worker_startup_s_all"] = [rnd(r - s, 3) if r else None for r, s in zip(reg, starts, strict=True)]
        out["worker_startup_s"] = rnd(median(out["worker_startup_s_all"]), 3)
        trainer = FakeTrainer(trainer_addr)
        if not trainer.running.wait(30):
            raise RuntimeError("job did not start")
        time.sleep(settle_s)
        ps = {
            "coordinator": psutil.Process(coord.pid),
            **{f"worker-{i}": psutil.Process(w.pid) for i, w in enumerate(workers)},
        }
        c0 = {k: sum(p.cpu_times()[:2]) for k, p in ps.items()}
        t0_threads = _thread_times(ps["coordinator"])
        tw = time.monotonic()
        time.sleep(idle_s)
        span = time.monotonic() - tw
        c1 = {k: sum(p.cpu_times()[:2]) for k, p in ps.items()}
        t1_threads = _thread_times(ps["coordinator"])
        cpu = {k: (c1[k] - c0[k]) / span * 100 for k in ps}
        # Where the coordinator's idle CPU goes: its main thread (Python: the asyncio loop, the
        # decisions, grpc.aio's Python side) against every other thread (gRPC core's pollers and
        # timers).
        main = t1_threads.get(coord.pid, 0.0) - t0_threads.get(coord.pid, 0.0)
        others = sum(v - t0_threads.get(k, 0.0) for k, v in t1_threads.items() if k != coord.pid)
        out["coordinator_main_thread_cpu_pct"] = rnd(main / span * 100, 3)
        out["coordinator_other_threads_cpu_pct"] = rnd(others / span * 100, 3)
        out["coordinator_threads"] = len(t1_threads)
        rss = {k: p.memory_info().rss / 2**20 for k, p in ps.items()}
        uss = {}
        for k, p in ps.items():
            try:
                uss[k] = p.memory_full_info().uss / 2**20
            except (psutil.AccessDenied, AttributeError):
                uss[k] = None
        wk = [k for k in ps if k.startswith("worker")]
        out["coordinator_cpu_pct"] = rnd(cpu["coordinator"], 3)
        out["coordinator_rss_mib"] = rnd(rss["coordinator"], 1)
        out["coordinator_uss_mib"] = rnd(uss["coordinator"], 1)
        out["worker_cpu_pct"] = rnd(median(cpu[k] for k in wk), 3)
        out["worker_cpu_pct_all"] = [rnd(cpu[k], 3) for k in wk]
        out["worker_rss_mib"] = rnd(median(rss[k] for k in wk), 1)
        out["worker_uss_mib"] = rnd(median(uss[k] for k in wk), 1)
        out["idle_window_s"] = rnd(span, 2)
    finally:
        if trainer is not None:
            trainer.stop()
        for p in reversed(procs):
            stop_process(p)
        for fh in files:
            fh.close()
    return out


def run(quick: bool = False, repeats: int | None = None, workdir: Path | None = None) -> dict[str, Any]:
    reps = repeats or (1 if quick else 3)
    idle_s = 3.0 if quick else 10.0
    settle_s = 1.0 if quick else 2.0
    root = Path(workdir or tempfile.mkdtemp(prefix="bench-footprint-"))
    t0 = time.monotonic()
    rounds = []
    for r in range(reps):
        log(f"footprint: round {r + 1}/{reps}")
        m = one_round(root / f"round-{r}", idle_s, settle_s)
        log(
            f"  -> coordinator {m['coordinator_cpu_pct']}% {m['coordinator_rss_mib']} MiB, start {m['coordinator_startup_s']} s;"
            f" worker {m['worker_cpu_pct']}% {m['worker_rss_mib']} MiB, start {m['worker_startup_s']} s"
        )
        rounds.append(m)
    keys = [
        "coordinator_cpu_pct",
        "coordinator_rss_mib",
        "coordinator_uss_mib",
        "coordinator_startup_s",
        "coordinator_main_thread_cpu_pct",
        "coordinator_other_threads_cpu_pct",
        "worker_cpu_pct",
        "worker_rss_mib",
        "worker_uss_mib",
        "worker_startup_s",
    ]
    summary = {k: rnd(median(m.get(k) for m in rounds), 3) for k in keys}
    targets = []
    for role in ("coordinator", "worker"):
        cpu, rss = summary[f"{role}_cpu_pct"], summary[f"{role}_rss_mib"]
        targets.append(
            target(
                f"{role} idle CPU",
                "< 1% of a core",
                cpu,
                "%",
                cpu is not None and cpu < 1.0,
                f"median of {reps} idle windows of {idle_s:g} s",
            )
        )
        targets.append(target(f"{role} RSS", "< 100 MiB", rss, "MiB", rss is not None and rss < 100, "resident set"))
    rows = []
    for role in ("coordinator", "worker"):
        cpu = [m.get(f"{role}_cpu_pct") for m in rounds]
        rows.append(
            {
                "role": role,
                "runs": len([c for c in cpu if c is not None]),
                "idle_cpu_pct_median": summary[f"{role}_cpu_pct"],
                "idle_cpu_pct_max": rnd(max((c for c in cpu if c is not None), default=None), 3)
                if any(c is not None for c in cpu)
                else None,
                "rss_mib_median": summary[f"{role}_rss_mib"],
                "uss_mib_median": summary[f"{role}_uss_mib"],
                "startup_seconds_median": summary[f"{role}_startup_s"],
            }
        )
    return {
        "name": NAME,
        "quick": quick,
        "results": rows,
        "config": {
            "workers": WORKERS,
            "repeats": reps,
            "idle_s": idle_s,
            "settle_s": settle_s,
            "heartbeat_interval_s": C.HEARTBEAT_INTERVAL_SECONDS,
            "heartbeat_timeout_s": C.HEARTBEAT_TIMEOUT_SECONDS,
            "heartbeats": "datagram" if C.HEARTBEAT_DATAGRAMS else "stream",
        },
        "summary": summary,
        "rounds": rounds,
        "targets": targets,
        "duration_s": round(time.monotonic() - t0, 1),
    }
