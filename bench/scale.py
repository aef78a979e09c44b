"""Scale: one coordinator against thousands of stand-in worker sidecars on loopback.

The coordinator is a :class:`bench.common.Rig`'s, on a core of its own where there are two; load
generators (:mod:`bench.scale_loadgen`) stand in for the hosts. ``hold_cycles`` times the fan-out of a
hold and a resume, ``coordinator_restart`` the workers' return after a SIGKILL. docs/benchmarks.md says
what each figure is and when a run is valid.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import resource
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

from bench.common import (
    PY,
    ROOT,
    FakeTrainer,
    Rig,
    cpu_seconds,
    env,
    iso_to_epoch,
    json_lines,
    log,
    median,
    percentile,
    raise_nofile,
    rnd,
    wait_until,
)

JOB = "bench-scale"
PER_GENERATOR = 2500
HOSTS_PER_SLICE = 100
RUNS = 3
SETUP_IN_FLIGHT = 400
"""Stand-in hosts setting up a connection at once, over all load generators (each gets its share)."""
SCENARIOS = ("hold_cycles", "coordinator_restart")
REJOIN_GRACE = 10.0
"""The coordinator's shipped ``--rejoin-grace``."""
USABLE_CPUS = sorted(os.sched_getaffinity(0))
"""This process's CPUs when loaded: every size pins from these, not from what the size before left."""
DROPPED = ("elastic_sidecar_heartbeat_datagrams_total", (("result", "dropped"),))
CONNECTED = ("elastic_sidecar_workers_connected", ())
NOT_REJOINED = re.compile(r"(\d+) host\(s\) did not rejoin within the grace")
"""How agent.core.decide words the hosts a restarted coordinator gave up on when its grace ran out."""


def pinning() -> tuple[set[int] | None, set[int] | None]:
    """(the coordinator's CPUs, everyone else's), or (None, None) with a single usable core."""
    return ({USABLE_CPUS[0]}, set(USABLE_CPUS[1:])) if len(USABLE_CPUS) > 1 else (None, None)


def pin(pid: int, cpus: set[int] | None) -> None:
    if cpus:
        os.sched_setaffinity(pid, cpus)


class Generator:
    """A load generator process, driven by one JSON object a line each way (bench.scale_loadgen)."""

    def __init__(self, addr: str, first: int, count: int, logf: IO[bytes], cpus: set[int] | None, **opts: int) -> None:
        self.first, self.count = first, count
        cmd = [PY, "-m", "bench.scale_loadgen", "--coordinator", addr, "--job", JOB, "--first", str(first)]
        cmd += ["--count", str(count), "--hosts-per-slice", str(HOSTS_PER_SLICE)]
        cmd += [x for k, v in opts.items() for x in (f"--{k.replace('_', '-')}", str(v))]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf, env=env(), cwd=ROOT, text=True
        )
        pin(self.proc.pid, cpus)
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip():
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def read(self, timeout: float = 600.0) -> dict[str, Any]:
        try:
            msg = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"load generator {self.first}.. did not answer within {timeout:g} s") from None
        if msg is None:
            raise RuntimeError(f"load generator {self.first}.. exited (code {self.proc.poll()})")
        return msg

    def ask(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.send(obj)
        return self.read()

    def quit(self) -> None:
        try:
            self.send({"cmd": "quit"})
            self.proc.wait(20)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


class LogTail:
    """The coordinator's JSON log, read on from where the last poll stopped (it grows by 10,000s of lines)."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos, self.buf = path, 0, ""
        self.records: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        with open(self.path, encoding="utf-8", errors="replace") as f:
            f.seek(self.pos)
            self.buf += f.read()
            self.pos = f.tell()
        *lines, self.buf = self.buf.split("\n")
        self.records += json_lines(lines)
        return self.records

    def told(self, kind: str, after_gen: int) -> dict[str, Any] | None:
        """The first ``TellWorkers`` of ``kind`` past generation ``after_gen``: its generation and time."""
        for r in self.poll():
            for a in r.get("actions") or []:
                if a.get("type") == "TellWorkers" and a.get("kind") == kind and int(a["generation"]) > after_gen:
                    return {"generation": int(a["generation"]), "time": iso_to_epoch(r["time"])}
        return None

    def count(self, pred: Any) -> int:
        return sum(1 for r in self.poll() if pred(r))


def timed_out(r: dict[str, Any]) -> bool:
    return r.get("trigger") == "WorkerLost" and "heartbeat_timeout" in r.get("message", "")


def hosts_lost(r: dict[str, Any]) -> int:
    """Hosts a coordinator's log record says it lost: a ``WorkerLost``, or those that did not rejoin in time."""
    m = NOT_REJOINED.search(r.get("message", "") + " " + r.get("reason", ""))
    return (r.get("trigger") == "WorkerLost") + (int(m.group(1)) if m else 0)


def latencies(dumps: list[dict[str, list[list[Any]]]], kind: str, gen: int, t_dec: float) -> list[float]:
    """Per worker, the decision until its first copy of the command (a datagram: its kernel receive time)."""
    out = []
    for d in dumps:
        for recs in d.values():
            times = [r[4] if r[4] is not None else r[2] for r in recs if r[0] == kind and int(r[1]) == gen]
            if times:
                out.append(min(times) - t_dec)
    return out


def coordinator_metrics(http: str, timeout: float = 5.0) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The coordinator's Prometheus samples from its /metrics (``{(name, sorted labels): value}``); {} when
    it does not answer."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://{http}/metrics", timeout=timeout) as resp:  # noqa: S310 - loopback
            text = resp.read().decode("utf-8", errors="replace")
    except OSError:
        return {}
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def socket_drops(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> int | None:
    """Drops on the coordinator's socket; None when its metrics were not read (the counter appears at the
    first drop, so read but absent is 0)."""
    return int(metrics.get(DROPPED, 0.0)) if metrics else None


def validate(n: int, cyc: list[dict[str, Any]], cycles: int, out: dict[str, Any]) -> list[str]:
    """Why a run's figures cannot stand (empty when they can)."""
    why = [c["error"] for c in cyc if "error" in c]
    cyc = [c for c in cyc if "error" not in c]
    drops = out.get("coordinator_socket_drops")
    if drops is None:
        why.append("the coordinator's socket drops could not be read from its metrics")
    elif drops:
        why.append(f"the kernel dropped {drops} heartbeat datagrams on the coordinator's socket")
    if out.get("datagram_workers", n) < out.get("connected_workers", n):
        why.append(
            f"only {out['datagram_workers']} of {out['connected_workers']} connected workers heartbeat by datagram"
        )
    if len(cyc) < cycles:
        why.append(f"{len(cyc)} of {cycles} hold cycles completed")
    for i, c in enumerate(cyc, 1):
        if c["t_hold"] < c["t_disconnect"]:
            why.append(f"cycle {i}: a hold was decided before the worker was disconnected")
        if c["hold_received"] < c["hold_expected"] or c["hold_expected"] != n - 1:
            why.append(f"cycle {i}: the hold reached {c['hold_received']} of {c['hold_expected']} workers (of {n - 1})")
        if c["t_resume"] is None:
            why.append(f"cycle {i}: no resume was decided")
        elif c["resume_received"] < c["resume_expected"] or c["resume_expected"] != n:
            why.append(
                f"cycle {i}: the resume reached {c['resume_received']} of {c['resume_expected']} workers (of {n})"
            )
    if out.get("heartbeat_timeouts"):
        why.append(f"{out['heartbeat_timeouts']} workers were lost to heartbeat timeouts while the job was running")
    if out.get("scenario") == "coordinator_restart":
        if out.get("all_back_seconds") is None:
            why.append("not every worker was back after the restart")
        if out.get("hosts_lost"):
            why.append(f"{out['hosts_lost']} hosts were lost across the restart")
    return why


class Collapsed(RuntimeError):
    """The coordinator lost registered workers to heartbeat timeouts before the job could start."""


def wait_registered(gens: list[Generator], tail: LogTail, pid: int, t0: float, out: dict[str, Any]) -> float:
    """Until every generator says its workers registered; returns when the last did. Stops when the
    coordinator starts timing workers out, keeping its RSS then (the deploy manifests are sized from it)."""
    regs: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + 420
    while len(regs) < len(gens):
        for i, g in enumerate(gens):
            if i not in regs:
                try:
                    regs[i] = g.read(timeout=0.2)
                except TimeoutError:
                    pass
        if tail.count(timed_out):
            import psutil

            joined = tail.count(lambda r: r.get("trigger") == "WorkerJoined")
            out["collapse"] = {"workers_registered": joined, "after_s": rnd(time.time() - t0, 1)}
            out["collapse"]["coordinator_rss_mib"] = rnd(psutil.Process(pid).memory_info().rss / 2**20, 1)
            raise Collapsed(
                f"registered workers started timing out {out['collapse']['after_s']} s into registration, with "
                f"{joined} of {sum(g.count for g in gens)} registered"
            )
        if time.monotonic() > deadline:
            raise TimeoutError("registration not done after 420 s")
    return max(r["t1"] for r in regs.values())


def hold_cycle(gens: list[Generator], tail: LogTail, last_gen: int) -> dict[str, Any]:
    """One stand-in leaves and comes back: the hold and resume decisions, and who heard them."""
    t_disc = gens[0].ask({"cmd": "disconnect", "index": gens[0].first})["t"]
    hold = wait_until(lambda: tail.told("hold", last_gen), 30, 0.01)
    if hold is None:
        return {"error": "no hold decision after a worker disconnected"}
    gen = hold["generation"]
    waits = [g.ask({"cmd": "wait", "kind": "hold", "generation": gen, "timeout": 60}) for g in gens]
    gens[0].ask({"cmd": "reconnect", "index": gens[0].first})
    resume = wait_until(lambda: tail.told("resume", gen - 1), 60, 0.01)
    rgen = resume["generation"] if resume else gen
    rwaits = (
        [g.ask({"cmd": "wait", "kind": "resume", "generation": rgen, "timeout": 60}) for g in gens] if resume else []
    )
    return {
        "generation": gen,
        "resume_generation": rgen,
        "t_disconnect": t_disc,
        "t_hold": hold["time"],
        "t_resume": resume["time"] if resume else None,
        "hold_received": sum(w["have"] for w in waits),
        "hold_expected": sum(w["expected"] for w in waits),
        "resume_received": sum(w["have"] for w in rwaits),
        "resume_expected": sum(w["expected"] for w in rwaits),
    }


def restart(rig: Rig, n: int, cpus: set[int] | None, grace: float, hbt: float) -> dict[str, Any]:
    """SIGKILL the coordinator under load, start it again on the same ports, and time the workers' return."""
    assert rig.coordinator is not None
    t_kill = time.time()
    rig.coordinator.kill()
    rig.coordinator.wait()
    out: dict[str, Any] = {"rejoin_grace": grace, "all_back_seconds": None}
    out["restart_to_serving_seconds"] = rnd(rig.start_coordinator("coordinator-restarted.log", 30, cpus), 3)
    cpu0 = cpu_seconds(rig.coordinator.pid)
    # The storm lasts longer with more workers: allow at least 100 registrations a second.
    deadline = time.monotonic() + 3 * grace + 30 + n / 100
    connected = 0.0
    while time.monotonic() < deadline and out["all_back_seconds"] is None:
        connected = coordinator_metrics(rig.http, timeout=2.0).get(CONNECTED, connected)
        if connected >= n:
            out["all_back_seconds"] = rnd(time.time() - t_kill, 3)
        time.sleep(0.1)
    out["workers_back"] = int(connected)
    out["restart_cpu_seconds"] = rnd(cpu_seconds(rig.coordinator.pid) - cpu0, 2)
    # With every known host back the grace cannot run out on a missing one (agent/core/decide.py counts
    # it from the newest re-registration): what can still lose a host is a heartbeat timeout, seen within
    # a few timeouts. With some missing, the grace decides: wait until it has run out.
    time.sleep(3 * hbt + 1 if out["all_back_seconds"] is not None else grace + 2)
    out["hosts_lost"] = LogTail(rig.workdir / "coordinator-restarted.log").count(hosts_lost)
    return out


def run_size(
    n: int, root: Path, quick: bool, cycles: int, hb: float, hbt: float, scenario: str, grace: float, streams: int
) -> dict[str, Any]:
    import psutil

    wd = Path(tempfile.mkdtemp(prefix=f"n{n}-{scenario}-", dir=root))
    hosts = min(n, HOSTS_PER_SLICE)
    args = ["--heartbeat-interval", f"{hb:g}", "--heartbeat-timeout", f"{hbt:g}", "--elastic-timeout-seconds", "1800"]
    args += ["--elastic-max-retries", "100000"]
    if scenario == "coordinator_restart":
        args += ["--state-dir", str(wd / "state"), "--rejoin-grace", f"{grace:g}"]
    rig = Rig(wd, JOB, max(1, n // HOSTS_PER_SLICE), hosts, coordinator_args=args)
    coord_cpus, other_cpus = pinning()
    pin(os.getpid(), other_cpus)  # this process hosts the fake trainer
    raise_nofile()  # the generators inherit it
    gens: list[Generator] = []
    out: dict[str, Any] = {"workers": n, "scenario": scenario, "heartbeat_interval": hb, "heartbeat_timeout": hbt}
    out |= {"streams_per_connection": streams, "pinned": coord_cpus is not None}
    try:
        rig.start_coordinator(cpus=coord_cpus)
        pid = rig.coordinator.pid  # type: ignore[union-attr]
        tail = LogTail(wd / "coordinator.log")
        t0 = time.time()
        ng = math.ceil(n / PER_GENERATOR)
        per = math.ceil(n / ng)
        genlog = rig.logfile("generators.log")
        opts = {"concurrency": max(10, SETUP_IN_FLIGHT // ng), "streams_per_connection": streams}
        gens = [Generator(rig.addr, f, min(per, n - f), genlog, other_cpus, **opts) for f in range(0, n, per)]
        trainer = rig.trainer = FakeTrainer(rig.trainer_addr, JOB)
        out["registration_s"] = rnd(wait_registered(gens, tail, pid, t0, out) - t0, 2)
        if not trainer.running.wait(300):
            raise RuntimeError("the job did not start (no resume to the trainer)")
        timeouts0 = tail.count(timed_out)
        log(f"scale {n}: registered in {out['registration_s']} s; running")
        time.sleep(2.0 if quick else 5.0)
        dg = [g.ask({"cmd": "datagrams"}) for g in gens]
        out["datagram_workers"] = sum(d["confirmed"] for d in dg)
        out["connected_workers"] = sum(d["connected"] for d in dg)
        windows = []
        for _ in range(3 if quick else 5):
            c0, w0 = cpu_seconds(pid), time.monotonic()
            time.sleep(1.0 if quick else 2.0)
            windows.append((cpu_seconds(pid) - c0) / (time.monotonic() - w0))
        out["cpu_cores"] = rnd(median(windows))
        out["cpu_cores_windows"] = [rnd(w) for w in windows]
        out["rss_mib"] = rnd(psutil.Process(pid).memory_info().rss / 2**20, 1)
        out["open_fds"] = psutil.Process(pid).num_fds()
        log(f"scale {n}: coordinator {out['cpu_cores']} cores, {out['rss_mib']} MiB")
        drops_before = 0
        if scenario == "coordinator_restart":
            cycles = 0  # the restart is this scenario's event
            drops_before = socket_drops(coordinator_metrics(rig.http)) or 0
            out |= restart(rig, n, coord_cpus, grace, hbt)
            log(f"scale {n}: all back {out['all_back_seconds']} s after the kill, {out['hosts_lost']} hosts lost")
        last = tail.told("resume", 0)
        cyc, last_gen = [], last["generation"] if last else 1
        for _ in range(cycles):
            cyc.append(hold_cycle(gens, tail, last_gen))
            if "error" in cyc[-1]:
                break
            last_gen = cyc[-1]["resume_generation"]
            time.sleep(1.0)
        out["heartbeat_timeouts"] = tail.count(timed_out) - timeouts0
        if scenario == "coordinator_restart":
            out["heartbeat_timeouts"] += LogTail(wd / "coordinator-restarted.log").count(timed_out)
        drops = socket_drops(coordinator_metrics(rig.http))
        out["coordinator_socket_drops"] = None if drops is None else drops_before + drops
        out["loadgen_heartbeats_late_max_s"] = max(g.ask({"cmd": "datagrams"})["clock_late_max_s"] for g in gens)
        dumps = []
        for i, g in enumerate(gens):
            g.ask({"cmd": "dump", "path": str(wd / f"received-{i}.json")})
            dumps.append(json.loads((wd / f"received-{i}.json").read_text()))
        good = [c for c in cyc if "error" not in c]
        for c in good:
            hold = latencies(dumps, "hold", c["generation"], c["t_hold"])
            c["hold_p50_s"], c["hold_p99_s"] = rnd(percentile(hold, 50)), rnd(percentile(hold, 99))
            if c["t_resume"] is not None:
                c["resume_p99_s"] = rnd(
                    percentile(latencies(dumps, "resume", c["resume_generation"], c["t_resume"]), 99)
                )
        out["cycles"] = cyc
        out["fanout_p50_seconds"] = rnd(median(c["hold_p50_s"] for c in good))
        out["fanout_p99_seconds"] = max((c["hold_p99_s"] for c in good if c["hold_p99_s"] is not None), default=None)
        out["resume_fanout_p99_seconds"] = rnd(median(c.get("resume_p99_s") for c in good))
        shares = [c["hold_received"] / c["hold_expected"] for c in good if c["hold_expected"]]
        shares += [c["resume_received"] / c["resume_expected"] for c in good if c["resume_expected"]]
        out["delivered_fraction"] = rnd(min(shares)) if shares else (None if scenario == "coordinator_restart" else 0.0)
        why = validate(n, cyc, cycles, out)
        if out["heartbeat_timeouts"] and out["loadgen_heartbeats_late_max_s"] >= hbt / 2:
            why.append(
                f"a load generator's heartbeats ran {out['loadgen_heartbeats_late_max_s']} s late (its stall, not the coordinator's)"
            )
        out["valid"] = not why
        if why:
            out["invalid_reason"] = "; ".join(why)
        log(f"scale {n}: hold fan-out p99 {out['fanout_p99_seconds']} s; {out.get('invalid_reason') or 'valid'}")
    except Collapsed as e:
        out |= {
            "error": f"did not reach steady state: {e}",
            "valid": False,
            "invalid_reason": f"did not reach steady state: {e}",
        }
        log(f"scale {n}: {out['error']}")
    finally:
        for g in gens:
            g.quit()
        rig.stop()
        pin(os.getpid(), set(USABLE_CPUS))
    return out


ROW_KEYS = (
    "workers", "scenario", "heartbeat_interval", "heartbeat_timeout", "streams_per_connection", "pinned",
    "datagram_workers", "coordinator_socket_drops", "all_back_seconds", "restart_to_serving_seconds",
    "restart_cpu_seconds", "hosts_lost", "rejoin_grace", "fanout_p99_seconds", "fanout_p50_seconds",
    "resume_fanout_p99_seconds", "delivered_fraction", "loadgen_heartbeats_late_max_s",
)  # fmt: skip


def row(r: dict[str, Any]) -> dict[str, Any]:
    """The result row of one run: the fields every consumer reads, validity first-class."""
    collapse, windows = r.get("collapse") or {}, [w for w in r.get("cpu_cores_windows") or [] if w is not None]
    out = {k: r[k] for k in ROW_KEYS if k in r}
    return out | {
        "runs": 1,
        "coordinator_cores": r.get("cpu_cores"),
        "coordinator_cores_min": min(windows, default=None),
        "coordinator_cores_max": max(windows, default=None),
        "coordinator_rss_mib": r.get("rss_mib"),
        "coordinator_open_files": r.get("open_fds"),
        "workers_registered": collapse.get("workers_registered", r["workers"] if r.get("rss_mib") else None),
        "coordinator_rss_mib_at_collapse": collapse.get("coordinator_rss_mib"),
        "registration_seconds": r.get("registration_s"),
        "cycles": len([c for c in r.get("cycles", []) if "error" not in c]),
        "valid": bool(r.get("valid")),
        **({"invalid_reason": r["invalid_reason"]} if r.get("invalid_reason") else {}),
    }


def size_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for the runs of a size and scenario: the median CPU, the worst of the rest; valid only if
    every run was."""
    rows = [row(r) for r in runs]
    out = dict(rows[0])
    out.pop("invalid_reason", None)

    def vals(k: str) -> list[Any]:
        return [x[k] for x in rows if x.get(k) is not None]

    worst = {k: max(vals(k), default=None) for k in rows[0] if k.endswith(("seconds", "_max", "rss_mib"))}
    out |= worst | {
        "runs": len(rows),
        "coordinator_cores": median(vals("coordinator_cores")),
        "coordinator_cores_runs": [x.get("coordinator_cores") for x in rows],
        "coordinator_cores_min": min(vals("coordinator_cores_min"), default=None),
        "fanout_p50_seconds": median(vals("fanout_p50_seconds")),
        "delivered_fraction": min(vals("delivered_fraction"), default=None),
        "cycles": sum(vals("cycles")),
        "valid": all(x["valid"] for x in rows),
    }
    for k in ("coordinator_socket_drops", "hosts_lost"):
        if k in rows[0]:
            out[k] = sum(vals(k)) if len(vals(k)) == len(rows) else None
    for k in ("all_back_seconds", "restart_to_serving_seconds"):  # a run whose workers never came back has none
        if k in rows[0] and len(vals(k)) < len(rows):
            out[k] = None
    why = [f"run {i}: {x['invalid_reason']}" for i, x in enumerate(rows, 1) if x.get("invalid_reason")]
    return out | ({"invalid_reason": "; ".join(why)} if why else {})


def too_few_open_files(n: int, streams_per_connection: int = 1) -> str | None:
    """Why this machine cannot run ``n`` workers against one coordinator (None when it can): the coordinator
    holds a socket a connection (``agent.fdlimit``) and no process here may open that many files."""
    from agent import fdlimit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    connections = math.ceil(n / streams_per_connection)
    need = fdlimit.need(connections)
    if hard == resource.RLIM_INFINITY or hard >= need:
        return None
    try:  # a privileged process (CAP_SYS_RESOURCE) may raise its hard limit; the children inherit it
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), need))
        return None
    except (ValueError, OSError):
        pass
    return (
        f"the coordinator needs {need:,} open files for {n:,} workers ("
        + ("one socket each" if connections == n else f"{connections:,} shared connections")
        + f", agent/fdlimit.py); the hard RLIMIT_NOFILE here is {hard:,}, and raising a hard limit needs a "
        "privilege this process lacks (--streams-per-connection lets stand-in hosts share connections)"
    )


def run(
    root: Path,
    quick: bool = False,
    sizes: list[int] | None = None,
    cycles: int | None = None,
    heartbeat_interval: float | None = None,
    heartbeat_timeout: float | None = None,
    repeats: int | None = None,
    scenarios: list[str] | None = None,
    rejoin_grace: float | None = None,
    streams_per_connection: int = 1,
) -> dict[str, Any]:
    from agent import constants as C

    runs = repeats or (1 if quick else RUNS)
    scenarios = scenarios or ["hold_cycles"]
    bad = sorted(set(scenarios) - set(SCENARIOS))
    if bad:
        raise ValueError(f"scenario {bad}: expected among {list(SCENARIOS)}")
    grace = rejoin_grace or REJOIN_GRACE
    hb = heartbeat_interval or C.HEARTBEAT_INTERVAL_SECONDS
    hbt = heartbeat_timeout or C.HEARTBEAT_TIMEOUT_SECONDS
    sizes = sizes or ([200] if quick else [10000, 25000])
    cycles = cycles or (1 if quick else 3)
    results, rows = [], []
    for scenario in scenarios:
        for n in sizes:
            base = {"workers": n, "scenario": scenario, "heartbeat_interval": hb, "heartbeat_timeout": hbt}
            base["streams_per_connection"] = streams_per_connection
            short = too_few_open_files(n, streams_per_connection)
            if short:
                log(f"scale {n} ({scenario}): NOT RUN: {short}")
                rows.append(base | {"status": "not_run", "runs": 0, "valid": False, "invalid_reason": short})
                continue
            mine = []
            for i in range(runs):
                log(f"scale {n} ({scenario}): run {i + 1}/{runs}")
                try:
                    r = run_size(n, root, quick, cycles, hb, hbt, scenario, grace, streams_per_connection)
                except Exception as e:  # noqa: BLE001 - a failed run is a result
                    log(f"scale {n}: FAILED: {e}")
                    r = base | {"error": f"{type(e).__name__}: {e}", "valid": False}
                    r["invalid_reason"] = r["error"]
                mine.append(r | {"run": i})
            results += mine
            rows.append(size_row(mine))
    try:
        rmem = int(Path("/proc/sys/net/core/rmem_max").read_text())
    except (OSError, ValueError):
        rmem = None
    config = {"sizes": sizes, "cycles": cycles, "hosts_per_slice": HOSTS_PER_SLICE, "runs": runs}
    config |= {"workers_per_generator": PER_GENERATOR, "scenarios": scenarios, "rejoin_grace": grace}
    config |= {"heartbeat_interval": hb, "heartbeat_timeout": hbt, "streams_per_connection": streams_per_connection}
    # The most receive buffer the coordinator's heartbeat socket gets (deploy/gke/node-system-config.yaml).
    config["net_core_rmem_max"] = rmem
    return {"quick": quick, "config": config, "results": rows, "sizes": results}
