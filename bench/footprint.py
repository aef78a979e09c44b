"""Footprint: each sidecar role's idle CPU and memory (psutil), and its start-up time.

A :class:`bench.common.Rig` of four hosts with the job running and nothing happening. Start-up: the
coordinator's until its health check serves, a worker's until it logs "registered with coordinator".
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

from agent import constants as C
from bench.common import Rig, iso_to_epoch, log, median, read_jsonl, rnd, wait_until

WORKERS = 4
ROLES = ("coordinator", "worker")


def registered_at(path: Path) -> float | None:
    r = next((r for r in read_jsonl(path) if r.get("message") == "registered with coordinator"), None)
    return iso_to_epoch(r["time"]) if r else None


def one_round(root: Path, idle_s: float, settle_s: float) -> dict[str, Any]:
    import psutil

    rig = Rig(root, "bench-footprint", WORKERS, coordinator_args=["--elastic-min-slice-count", "1"])
    try:
        out: dict[str, Any] = {"coordinator_startup_s": rnd(rig.start_coordinator(), 3)}
        procs = {"coordinator": psutil.Process(rig.coordinator.pid)}  # type: ignore[union-attr]
        starts = []
        for i in range(WORKERS):
            procs[f"worker-{i}"] = psutil.Process(rig.start_host(i, serving_first=True))
            starts.append(procs[f"worker-{i}"].create_time())  # the kernel's start time of the process
            wait_until(partial(registered_at, root / f"host-{i}.0.log"), 30)
        reg = [registered_at(root / f"host-{i}.0.log") for i in range(WORKERS)]
        out["worker_startup_s"] = rnd(median(r - s for r, s in zip(reg, starts, strict=True) if r), 3)
        rig.start_trainer(30)
        time.sleep(settle_s)
        c0, t0 = {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}, time.monotonic()
        time.sleep(idle_s)
        span = time.monotonic() - t0
        cpu = {k: (sum(p.cpu_times()[:2]) - c0[k]) / span * 100 for k, p in procs.items()}
        rss = {k: p.memory_info().rss / 2**20 for k, p in procs.items()}
        uss = {k: p.memory_full_info().uss / 2**20 for k, p in procs.items()}
        for role in ROLES:
            mine = [k for k in procs if k.startswith(role)]
            out[f"{role}_cpu_pct"] = rnd(median(cpu[k] for k in mine), 3)
            out[f"{role}_rss_mib"] = rnd(median(rss[k] for k in mine), 1)
            out[f"{role}_uss_mib"] = rnd(median(uss[k] for k in mine), 1)
        return out
    finally:
        rig.stop()


def run(root: Path, quick: bool = False, repeats: int | None = None) -> dict[str, Any]:
    reps = repeats or (1 if quick else 3)
    idle_s, settle_s = (3.0, 1.0) if quick else (10.0, 2.0)
    rounds = []
    for r in range(reps):
        log(f"footprint: round {r + 1}/{reps}")
        rounds.append(one_round(root / f"round-{r}", idle_s, settle_s))
        log(f"  -> {rounds[-1]}")
    rows = []
    for role in ROLES:
        cpu = [m[f"{role}_cpu_pct"] for m in rounds if m.get(f"{role}_cpu_pct") is not None]
        rows.append(
            {
                "role": role,
                "runs": len(cpu),
                "idle_cpu_pct_median": rnd(median(cpu), 3),
                "idle_cpu_pct_max": max(cpu, default=None),
                "rss_mib_median": rnd(median(m.get(f"{role}_rss_mib") for m in rounds), 1),
                "uss_mib_median": rnd(median(m.get(f"{role}_uss_mib") for m in rounds), 1),
                "startup_seconds_median": rnd(median(m.get(f"{role}_startup_s") for m in rounds), 3),
            }
        )
    config = {"workers": WORKERS, "repeats": reps, "idle_s": idle_s, "settle_s": settle_s}
    config |= {"heartbeat_interval_s": C.HEARTBEAT_INTERVAL_SECONDS, "heartbeat_timeout_s": C.HEARTBEAT_TIMEOUT_SECONDS}
    return {"quick": quick, "results": rows, "config": config, "rounds": rounds}
