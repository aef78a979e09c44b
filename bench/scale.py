"""Scale: one coordinator against thousands of worker sidecars on loopback.

The coordinator runs as its own process (``python -m agent coordinator``,
journal off, the shipped heartbeat settings unless ``--heartbeat-interval`` /
``--heartbeat-timeout`` say otherwise, ``hosts_per_slice`` hosts per slice). Load generators
(:mod:`bench.scale_loadgen`, one process per ``workers_per_generator`` workers; both in the
result's config) open one gRPC
channel and one ``Join`` stream per fake worker, as production workers do, and
heartbeat at the interval the coordinator asks for. Where the machine has more
than one usable core, the coordinator is pinned to one core and the load
generators, the fake trainer and this process to the others
(``os.sched_setaffinity``); the result records the pinning. Registration has no set rate by default
(every worker at once, as after a job restart, within what each generator can serve: see below);
``--registration-rate`` paces each generator to at most that many a second
(``registration_rate_per_generator`` in the config). A fake trainer attaches with
:class:`trainer_hooks.ElasticSession`, so once every worker has registered the
job is RUNNING. Then:

* steady state: the coordinator's CPU (psutil, cores used, median of windows)
  and RSS, after a settling time;
* hold fan-out: one fake worker disconnects, the coordinator decides a hold
  and broadcasts ``PeerCommand(kind="hold")`` (TellWorkers) to every other
  worker; each generator records when each worker receives it. Latency is
  receive time minus the decision time in the coordinator's log (same
  machine, same clock): p50 / p99 / max over workers per cycle; the row's ``fanout_p99_seconds``
  is the worst cycle's p99. A datagram counts from the kernel's receive time at the load
  generator's socket (``SO_TIMESTAMP``): one generator process stands in for thousands of hosts
  and reads their datagrams one after another on a shared core, so when it gets to one measures
  its own backlog; the row keeps that figure too (``fanout_p99_processed_seconds``). A stream
  copy counts from when the generator read it (gRPC gives no receive time). A worker hears a command by whichever copy comes first: the
  coordinator sends it, to every worker whose heartbeat datagrams arrive, as a
  ``CommandDatagram`` to their source address, and on the stream to the others and to any
  that has not acknowledged the datagram within ``COMMAND_ACK_SECONDS``. The row keeps the share of first copies
  that came by datagram (``hold_first_by_datagram``) and the stream copies' worst p99
  (``stream_fanout_p99_seconds``, none when every worker acknowledged its datagram in time:
  only the others get a stream copy) and how many workers got one (``hold_stream_copies``). The
  worker then reconnects, the job resumes (the resume fan-out is recorded
  too), and the cycle repeats.

A run is valid only if, in every cycle, the hold was decided after the
disconnect (not before, on its own), every live worker received the hold and
the resume, the resume happened, no worker was lost to a heartbeat timeout
while the job was running, and the kernel dropped no datagram on the coordinator's own socket
(``coordinator_socket_drops``: its ``heartbeat_datagrams_total{result="dropped"}`` metric, read
from its /metrics, which counts SO_RXQ_OVFL on its socket; the coordinator restarts every liveness
deadline when it sees drops, so without this check "no heartbeat timeouts" could not fail while it
drops); otherwise the row says ``valid: false`` and why. Each size runs ``runs`` times (default
3); its row gives the median of the runs' CPU medians, the worst fan-out, the sum of drops, and is
valid only if every run was.

Scenarios (each row's ``scenario``): ``hold_cycles`` (the above); ``health_reports``, the same
cycles with the hold caused by a health report instead of a disconnect (one worker reports its
Pathways worker unhealthy on its stream, as agent.worker does, then healthy again: its slice comes
back after the coordinator's settle time; every worker stays connected, so every one must hear the
hold); and ``coordinator_restart``:
once the job runs, the coordinator (started with a ``--state-dir``, as deployed) is SIGKILLed and
started again on the same ports while every worker keeps heartbeating; the workers re-register
with the worker's backoff. The row gives ``all_back_seconds`` (the kill until the restarted
coordinator counts every worker connected, its ``workers_connected`` gauge),
``restart_to_serving_seconds``, the restarted coordinator's CPU until then, and ``hosts_lost``
(``WorkerLost`` decisions of the restarted coordinator, read after the rejoin grace has passed);
valid only with no host lost, every worker back and no socket drops (the grace counts from the
newest re-registration, so the time until all are back is reported beside it, not bounded by it).
The coordinator's main-thread CPU is reported too: near one core the event
loop is saturated and the CPU figure is a ceiling, not the demand.

Where the stand-in hosts differ from real ones: a generator process stands in for 2,500 hosts on a
share of one core, so work that a real host does on a CPU of its own must not queue behind the
others' here. Each generator's heartbeats are sent by a small process of its own
(:mod:`bench.heartbeat_clock`, at a higher priority than the generator), and a worker retrying
after a coordinator restart first asks its generator's ``CoordinatorGate`` (one TCP connect, at
most 50 ms old, for all its workers) whether the port is open, instead of opening a channel that
would be refused. A generator sets up at most ``--concurrency`` (100) connections at once, at the
first registration and after a restart, and a host starts a registration only while its
generator's event loop keeps time (its timers on time within 0.1 s for 0.5 s): unbounded, the
2,500 handshakes of a generator advanced in turn and none finished for 30 s, and a host that
registered while its generator was behind (winding up 2,500 broken streams, or registering
others) read the reply late, heartbeated late and was rightly judged lost, which a real host
with a CPU of its own would not be. The registration rate, and the time until every worker is
back, are therefore what the generators can serve on their share of the machine
(bench/scale_loadgen.py says why each was needed; each generator logs one line a second of what
its hosts did to the run's generators.log).

Topology measured (each row's ``topology``): ``flat``, every worker holds its own ``Join``
stream to the one coordinator and heartbeats it directly. Per-slice leaders (one aggregated
stream per slice, so the coordinator sees slices rather than hosts) are not built; no row
measures them.

Heartbeat transport (each row's ``heartbeats``): ``datagram`` (shipped) sends each heartbeat as
a UDP datagram once the coordinator has confirmed it receives them (the stream carries them until
then; agent/sources/heartbeat_datagrams.py); ``stream`` (``--heartbeats stream``, the coordinator
with ``--heartbeat-datagrams off``) sends every heartbeat as a message on the worker's stream, the
design before datagrams. A ``datagram`` run is valid only if every connected worker's datagrams
were confirmed once the job ran (``datagram_workers``): otherwise it measured the stream path.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import resource
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
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
    raise_nofile,
    rnd,
    stop_process,
    wait_until,
)
from bench.scale_loadgen import SHORT_SESSION_SECONDS

NAME = "scale"
JOB = "bench-scale"
PER_GENERATOR = 2500
REGISTRATION_RATE = 0.0
"""Registrations each load generator starts per second at most, 0: unpaced (the default; a job's
pods can all start at once). Large unpaced runs once lost workers, but by the generators' own doing:
their heaps' full collections stopped their heartbeat clocks, and a fan-out's datagrams read in one go
held back a just-registered worker's first heartbeat (see scale_loadgen). Pacing is for a machine
whose generators still cannot keep up."""
HOSTS_PER_SLICE = 100
RUNS = 3
"""Runs of each size (``--repeats``); a row stands for all of them."""
SETUP_IN_FLIGHT = 400
"""Stand-in hosts setting up a connection at once, over all load generators (each gets its share)."""
SCENARIOS = ("hold_cycles", "health_reports", "coordinator_restart")
REJOIN_GRACE = 10.0
"""The coordinator's shipped ``--rejoin-grace`` (seconds known hosts get to re-register after its restart)."""
TOPOLOGY = "flat"
"""Every worker streams to the coordinator itself; per-slice leaders are not built (see the module docstring)."""
SATURATED_MAIN_THREAD = 0.9
"""Main-thread CPU (cores) at and above which the coordinator's event loop counts as saturated."""


def _usable_cpus() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


USABLE_CPUS = _usable_cpus()
"""This process's CPUs when the module was loaded: every size pins from these. (Read afresh, a size
would see only the CPUs the size before pinned this process to, and run everything on one core.)"""


def pinning() -> tuple[set[int] | None, set[int] | None]:
    """(coordinator's CPUs, everyone else's), or (None, None) where there is only one usable core."""
    cpus = sorted(USABLE_CPUS or ())
    if len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])


def _pin(pid: int, cpus: set[int] | None) -> None:
    if cpus:
        try:
            os.sched_setaffinity(pid, cpus)
        except OSError as e:
            log(f"scale: could not pin {pid} to {sorted(cpus)}: {e}")


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
    def __init__(
        self,
        addr: str,
        first: int,
        count: int,
        logf: IO[bytes],
        cpus: set[int] | None = None,
        datagrams: bool = True,
        rate: float = REGISTRATION_RATE,
        concurrency: int = 100,
        streams_per_connection: int = 1,
    ) -> None:
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
                "--rate",
                str(rate),
                "--concurrency",
                str(concurrency),
                *([] if datagrams else ["--no-datagrams"]),
                "--streams-per-connection",
                str(streams_per_connection),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=logf,
            env=env(),
            cwd=ROOT,
            text=True,
        )
        _pin(self.proc.pid, cpus)
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
        from trainer_hooks.session import AbortTraining

        s = ElasticSession.connect(self.addr, job=JOB)
        d = s.start()
        s.resumed(d, 0, "fresh", 0.0)
        self.running.set()
        try:
            while not self._stop.is_set():
                d = s.step_boundary(0)
                if d is not None:
                    s.resumed(d, 0, "memory", 0.0)
                time.sleep(0.005)
        except AbortTraining:
            # Held when the size ended: its coordinator is gone and the session gives up waiting.
            # That is the end of this size's job, not an error; before stop() it is one.
            if not self._stop.is_set():
                raise

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


def _arrival(r: list[Any], processed: bool) -> float:
    """When a record's command reached the worker: the kernel's receive time of a datagram where the
    generator recorded one (``processed``: when the generator got to it instead)."""
    if not processed and len(r) > 4 and r[4] is not None:
        return float(r[4])
    return float(r[2])


def _latencies(
    dumps: list[dict[str, list[list[Any]]]],
    kind: str,
    gen: int,
    t_dec: float,
    via: str | None = None,
    processed: bool = False,
) -> list[float]:
    """Per worker, the decision to its first copy of the command (``via``: only copies that came that way)."""
    out = []
    for d in dumps:
        for recs in d.values():
            times = [
                _arrival(r, processed)
                for r in recs
                if r[0] == kind and int(r[1]) == gen and (via is None or (r[3] if len(r) > 3 else "stream") == via)
            ]
            if times:
                out.append(min(times) - t_dec)
    return out


def _first_via(dumps: list[dict[str, list[list[Any]]]], kind: str, gen: int) -> Counter[str]:
    """How many workers' first copy of the command came each way (``stream``, ``datagram``)."""
    out: Counter[str] = Counter()
    for d in dumps:
        for recs in d.values():
            r = next((r for r in recs if r[0] == kind and int(r[1]) == gen), None)
            if r is not None:
                out[r[3] if len(r) > 3 else "stream"] += 1
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


STALL_LOOKBACK_SECONDS = 5.0
"""How far back a generator's stall counts as the cause of a timeout just seen: the lost host was silent
for the heartbeat timeout (1.2 s), and a generator writes its progress line a second after it."""
LOST_BY_TIMEOUT = re.compile(r"host (\d+)\.(\d+) lost \(heartbeat_timeout\)")


def generator_lags(genlog: Path, since: float = 0.0) -> dict[int, float]:
    """Each load generator's worst event-loop lag (s) in the progress lines it wrote to the run's
    generators.log at ``since`` (epoch seconds) or later, by its first host's index (bench.scale_loadgen
    ``_progress``: each line's ``lag_max`` is the worst since its previous line)."""
    lags: dict[int, float] = {}
    try:
        text = genlog.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return lags
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "first" in rec and "lag_max" in rec and float(rec.get("t", 0.0)) >= since:
            first, lag = int(rec["first"]), float(rec["lag_max"])
            lags[first] = max(lags.get(first, 0.0), lag)
    return lags


def collapse_cause(chunk: str, gens: list[Generator], genlog: Path, hosts_per_slice: int, timeout: float) -> str:
    """Why registered workers timed out, where the run's own records can tell: when the first host lost
    belongs to a load generator whose event loop had stalled past the heartbeat timeout in the last
    :data:`STALL_LOOKBACK_SECONDS`, the silence was
    that stand-in's (its registration replies sat unread, so its hosts started heartbeating late), which
    a host with a CPU of its own does not show. Else the coordinator is named with the generators."""
    m = LOST_BY_TIMEOUT.search(chunk)
    lags = generator_lags(genlog, since=time.time() - STALL_LOOKBACK_SECONDS)
    if m is not None:
        index = int(m.group(1)) * hosts_per_slice + int(m.group(2))
        g = next((g for g in gens if g.first <= index < g.first + g.count), None)
        lag = lags.get(g.first, 0.0) if g is not None else 0.0
        if g is not None and lag >= timeout:
            return (
                f"the first host lost ({m.group(1)}.{m.group(2)}) was load generator {g.first}..'s, whose event "
                f"loop had stalled {lag:.2f} s (past the {timeout:g} s heartbeat timeout) while it registered "
                "its hosts: a stand-in's stall, not the coordinator's"
            )
    worst = max(lags.values(), default=0.0)
    return "the coordinator (and the load generators on the same 2 cores) could not keep up" + (
        f" (the generators' worst event-loop lag: {worst:.2f} s)" if lags else ""
    )


def wait_registered(
    gens: list[Generator],
    log_path: Path,
    sampler: CpuSampler,
    t0: float,
    cpu0: float,
    out: dict[str, Any],
    timeout: float = 420.0,
    genlog: Path | None = None,
    hosts_per_slice: int = HOSTS_PER_SLICE,
    heartbeat_timeout: float = 1.2,
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
                # The memory of a coordinator holding this many workers: the deploy manifests' sizing
                # uses it (tests/deploy/measured.py) although the run's other figures are invalid.
                "coordinator_rss_mib": rnd(sampler.rss() / 2**20, 1),
            }
            cause = collapse_cause(
                chunk, gens, genlog or log_path.with_name("generators.log"), hosts_per_slice, heartbeat_timeout
            )
            out["collapse"]["cause"] = cause
            raise Collapsed(
                f"registered workers started timing out {out['collapse']['after_s']} s into "
                f"registration, with {joined} of {sum(g.count for g in gens)} registered and "
                f"{out['collapse']['coordinator_cpu_s']} s of coordinator CPU used: {cause}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"registration not done after {timeout:g} s ({joined} registered)")
    return [regs[i] for i in range(len(gens))]


def _spontaneous_holds(tail: LogTail, after_gen: int, before: float) -> list[dict[str, Any]]:
    """Hold fan-outs decided before ``before`` (no worker had been disconnected yet)."""
    out = []
    for r in tail.poll():
        for a in r.get("actions", []) or []:
            if a.get("type") == "TellWorkers" and a.get("kind") == "hold" and int(a.get("generation", 0)) > after_gen:
                t = iso_to_epoch(r["time"])
                if t < before:
                    out.append({"generation": int(a["generation"]), "time": t, "message": r.get("message", "")[:160]})
    return out


def _timeouts_since(log_path: Path, pos: int) -> tuple[int, int]:
    """(WorkerLost records caused by a heartbeat timeout after byte ``pos``, the new position)."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        f.seek(pos)
        chunk = f.read()
        end = f.tell()
    n = sum(1 for line in chunk.splitlines() if '"WorkerLost"' in line and "heartbeat_timeout" in line)
    return n, end


def _loadgen_late(path: Path) -> list[float]:
    """How late (s) the load generators' heartbeat clocks said they ran, each time past 0.3 s."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    from bench.heartbeat_clock import LATE_NOTE

    before, _, after = LATE_NOTE.partition("{late:.3f}")
    return [float(m) for m in re.findall(re.escape(before) + r"([0-9.]+)" + re.escape(after), text)]


def udp_counters() -> dict[str, int]:
    """The kernel's UDP counters (/proc/net/snmp; {} where there is none): ``RcvbufErrors`` counts
    datagrams dropped because a socket's receive buffer was full."""
    try:
        lines = [ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines() if ln.startswith("Udp:")]
    except OSError:
        return {}
    if len(lines) < 2:
        return {}
    return {k: int(v) for k, v in zip(lines[0][1:], lines[1][1:], strict=False)}


def coordinator_metrics(http: str | None, timeout: float = 5.0) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The coordinator's own Prometheus samples (``{(sample name, sorted labels): value}``) from its
    /metrics; {} when it does not answer."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    if not http:
        return {}
    try:
        with urllib.request.urlopen(f"http://{http}/metrics", timeout=timeout) as resp:  # noqa: S310 - loopback
            text = resp.read().decode("utf-8", errors="replace")
    except OSError:
        return {}
    return {
        (smp.name, tuple(sorted(smp.labels.items()))): float(smp.value)
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
    }


DROPPED = ("elastic_sidecar_heartbeat_datagrams_total", (("result", "dropped"),))
"""The coordinator's count of heartbeat datagrams the kernel dropped on its socket (SO_RXQ_OVFL)."""
CONNECTED = ("elastic_sidecar_workers_connected", ())


def socket_drops(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> int | None:
    """Drops on the coordinator's own socket from its metrics; None when the metrics were not read
    (0 when read and the counter has not been touched: it appears at the first drop)."""
    if not metrics:
        return None
    return int(metrics.get(DROPPED, 0.0))


NOT_REJOINED = re.compile(r"(\d+) host\(s\) did not rejoin within the grace")
"""How agent.core.decide words the hosts a restarted coordinator gave up on when its grace ran out."""


def _worker_lost_since(log_path: Path, pos: int = 0) -> int:
    """Hosts a coordinator's log says it lost: its WorkerLost decisions and the hosts that did not
    rejoin it within the grace after its restart."""
    n = 0
    with open(log_path, encoding="utf-8", errors="replace") as f:
        f.seek(pos)
        for line in f:
            if '"trigger": "WorkerLost"' in line:
                n += 1
            m = NOT_REJOINED.search(line)
            if m:
                n += int(m.group(1))
    return n


HOST_RECORD = re.compile(r"^host (\d+)\.(\d+) ")


def lost_host_timelines(coord_log: Path, genlog: Path, hosts_per_slice: int) -> list[dict[str, Any]]:
    """For each host the coordinator judged lost to a heartbeat timeout soon after it registered, what
    each side saw (all epoch seconds on this one machine's clock, as offsets from the coordinator's
    record of the registration): when the stand-in read its reply, when it started its heartbeats (the
    datagram clock, and the stream's copies until the coordinator confirmed a datagram), and when the
    coordinator judged it lost. A reply read late is a delay before the worker could heartbeat (the
    coordinator's send or the stand-in's read); heartbeats sent well before the judgement that did not
    count are the coordinator's. Read from bench.scale_loadgen's ``short_session`` lines; only losses
    within SHORT_SESSION_SECONDS of the registration (the stand-in prints no timeline for later ones)."""
    joined: dict[tuple[int, int], float] = {}
    lost: list[tuple[tuple[int, int], float, float]] = []
    try:
        coord_lines = coord_log.read_text(encoding="utf-8", errors="replace").splitlines()
        gen_lines = genlog.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for line in coord_lines:
        if '"WorkerJoined"' not in line and '"WorkerLost"' not in line:
            continue
        try:
            rec = json.loads(line)
            m = HOST_RECORD.match(rec["message"])
            t = iso_to_epoch(rec["time"])
        except (ValueError, KeyError, TypeError):
            continue
        if m is None:
            continue
        key = (int(m.group(1)), int(m.group(2)))
        if rec.get("trigger") == "WorkerJoined":
            joined[key] = t
        elif "lost (heartbeat_timeout)" in rec["message"] and t - joined.get(key, -1e18) <= SHORT_SESSION_SECONDS:
            lost.append((key, joined[key], t))
    sessions: dict[int, list[dict[str, Any]]] = {}
    for line in gen_lines:
        if '"short_session"' not in line:
            continue
        try:
            rec = json.loads(line)
            sessions.setdefault(int(rec["short_session"]), []).append(rec)
        except (ValueError, KeyError, TypeError):
            continue
    out = []
    for key, t_reg, t_lost in lost:
        row: dict[str, Any] = {"host": f"{key[0]}.{key[1]}", "lost_s": rnd(t_lost - t_reg, 3)}
        # The stand-in's session that the coordinator ended: the one whose reply came nearest its record.
        cands = [r for r in sessions.get(key[0] * hosts_per_slice + key[1], []) if "reply" in r]
        if cands:
            s = min(cands, key=lambda r: abs(float(r["reply"]) - t_reg))
            beats = [float(t) for t in s.get("stream_heartbeats", [])]
            row["reply_s"] = rnd(float(s["reply"]) - t_reg, 3)
            if "datagrams_from" in s:
                row["datagrams_from_s"] = rnd(float(s["datagrams_from"]) - t_reg, 3)
            row["stream_heartbeats_s"] = [rnd(t - t_reg, 3) for t in beats]
            if "confirmed" in s:
                row["datagrams_confirmed_s"] = rnd(float(s["confirmed"]) - t_reg, 3)
        out.append(row)
    return out


def describe_timelines(timelines: list[dict[str, Any]]) -> str:
    """The first timelines in a sentence each, for a run's invalid reason."""
    parts = []
    for t in timelines[:4]:
        if "reply_s" not in t:
            parts.append(f"host {t['host']} lost {t['lost_s']:g} s after it registered (no stand-in timeline)")
            continue
        sent = [x for x in [t.get("datagrams_from_s"), *t["stream_heartbeats_s"]] if x is not None]
        first = min(sent) if sent else None
        parts.append(
            f"host {t['host']}: reply read {t['reply_s']:+g} s from the coordinator's record of it, first "
            f"heartbeat sent at {first if first is None else f'{first:+g}'} s, judged lost at +{t['lost_s']:g} s "
            f"({len(t['stream_heartbeats_s'])} stream heartbeats sent"
            + (", datagrams confirmed" if "datagrams_confirmed_s" in t else ", no datagram confirmed")
            + ")"
        )
    more = f"; {len(timelines) - 4} more in lost_host_timelines" if len(timelines) > 4 else ""
    return "; ".join(parts) + more


def validate_restart(out: dict[str, Any]) -> list[str]:
    """Why a coordinator_restart run cannot stand (empty when it can).

    Every worker must be back and none lost. How long they took is reported (``all_back_seconds``), not
    judged against ``--rejoin-grace``: the grace counts from the newest re-registration
    (agent/core/decide.py ``_rejoin_deadline_after``), so a storm longer than the grace loses nobody
    while it progresses, and a host it did lose shows in ``hosts_lost``."""
    why = []
    if out.get("all_back_seconds") is None:
        why.append("not every worker was back after the restart")
    if out.get("hosts_lost"):
        why.append(
            f"{out['hosts_lost']} hosts were lost across the restart"
            + (f" ({describe_timelines(out['lost_host_timelines'])})" if out.get("lost_host_timelines") else "")
        )
    return why


def validate(
    n: int,
    cyc: list[dict[str, Any]],
    cycles: int,
    timeouts: int,
    datagrams: tuple[int, int] | None = None,
    drops: int | None = 0,
    held_connected: bool = False,
) -> list[str]:
    """Why a run's figures cannot stand (empty when they can).

    ``datagrams``: (workers whose heartbeat datagrams the coordinator confirmed, workers connected)
    in a ``datagram`` run; None in a ``stream`` run. ``drops``: datagrams the kernel dropped on the
    coordinator's socket (None: its metrics could not be read).
    """
    why = []
    if drops is None:
        why.append("the coordinator's socket drops could not be read from its metrics")
    elif drops:
        why.append(f"the kernel dropped {drops} heartbeat datagrams on the coordinator's socket")
    if datagrams is not None and datagrams[0] < datagrams[1]:
        why.append(
            f"only {datagrams[0]} of {datagrams[1]} connected workers heartbeat by datagram: "
            "the run measured the stream path for the rest"
        )
    if len(cyc) < cycles:
        why.append(f"{len(cyc)} of {cycles} hold cycles completed")
    for i, c in enumerate(cyc, 1):
        if c.get("spontaneous_holds"):
            why.append(f"cycle {i}: a hold was decided before the worker was disconnected")
        live = n if held_connected else n - 1
        if c["hold_expected"] != live:
            why.append(f"cycle {i}: {c['hold_expected']} workers were connected at the hold, not {live}")
        if c["hold_received"] < c["hold_expected"]:
            why.append(f"cycle {i}: hold reached {c['hold_received']} of {c['hold_expected']} live workers")
        if c["t_resume"] is None:
            why.append(f"cycle {i}: no resume was decided")
        elif c["resume_received"] < c["resume_expected"] or c["resume_expected"] != n:
            why.append(
                f"cycle {i}: resume reached {c['resume_received']} of {c['resume_expected']} live workers (of {n})"
            )
    if timeouts:
        why.append(f"{timeouts} workers were lost to heartbeat timeouts while the job was running")
    return why


def run_size(
    n: int,
    root: Path,
    quick: bool,
    cycles: int,
    hb: float,
    hbt: float,
    profile: bool = False,
    heartbeats: str = "datagram",
    scenario: str = "hold_cycles",
    registration_rate: float = REGISTRATION_RATE,
    rejoin_grace: float = REJOIN_GRACE,
    streams_per_connection: int = 1,
) -> dict[str, Any]:
    import psutil

    wd = root / f"n{n}-{scenario}"
    k = 0
    while wd.exists():  # one directory per run of a size
        k += 1
        wd = root / f"n{n}-{scenario}-{k}"
    wd.mkdir(parents=True)
    addr = f"127.0.0.1:{free_port()}"
    num_slices = max(1, n // HOSTS_PER_SLICE)
    assert num_slices * HOSTS_PER_SLICE == n or n < HOSTS_PER_SLICE
    hosts = HOSTS_PER_SLICE if n >= HOSTS_PER_SLICE else n
    logf = open(wd / "coordinator.log", "wb")  # noqa: SIM115
    genlog = open(wd / "generators.log", "wb")  # noqa: SIM115
    raise_nofile()  # children inherit the soft limit (no preexec_fn: forking a threaded process is unsafe)
    prof = ["-m", "cProfile", "-o", str(wd / "coordinator.prof")] if profile else []
    trainer_addr = f"127.0.0.1:{free_port()}"
    cmd = [PY, *prof, "-m", "agent", "coordinator", "--job", JOB, "--listen", addr, "--trainer-listen", trainer_addr]
    cmd += ["--num-slices", str(num_slices), "--hosts-per-slice", str(hosts)]
    cmd += ["--heartbeat-interval", f"{hb:g}", "--heartbeat-timeout", f"{hbt:g}", "--elastic-timeout-seconds", "1800"]
    cmd += ["--elastic-max-retries", "100000"]
    datagrams = heartbeats == "datagram"
    cmd += ["--heartbeat-datagrams", "on" if datagrams else "off"]
    side = daemon_port_flags("coordinator")
    http = side[side.index("--http-listen") + 1] if "--http-listen" in side else None
    cmd += ["--log-format", "json", *side]
    if scenario == "coordinator_restart":
        # As deployed: what must survive the restart (known hosts, generation) is in the state dir.
        cmd += ["--state-dir", str(wd / "state"), "--rejoin-grace", f"{rejoin_grace:g}"]
    coord_cpus, other_cpus = pinning()
    _pin(os.getpid(), other_cpus)  # this process hosts the fake trainer
    coord = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env(), cwd=ROOT)
    _pin(coord.pid, coord_cpus)
    gens: list[Generator] = []
    trainer = None
    logs: list[IO[bytes]] = [logf, genlog]
    out: dict[str, Any] = {
        "workers": n,
        "scenario": scenario,
        "registration_rate_per_generator": registration_rate,
        "slices": num_slices,
        "hosts_per_slice": hosts,
        "heartbeat_interval": hb,
        "heartbeat_timeout": hbt,
        "heartbeats": heartbeats,
        "streams_per_connection": streams_per_connection,
        "pinned": coord_cpus is not None,
        "coordinator_cpus": sorted(coord_cpus) if coord_cpus else None,
        "load_cpus": sorted(other_cpus) if other_cpus else None,
    }
    udp0 = udp_counters()
    try:
        if not wait_until(lambda: _health_serving(addr), 30, 0.05):
            raise RuntimeError("coordinator did not serve")
        sampler = CpuSampler(coord.pid)
        trainer = FakeTrainer(trainer_addr)
        t0 = time.time()
        cpu0 = sampler.cpu_seconds()
        ng = max(1, math.ceil(n / PER_GENERATOR))
        per = math.ceil(n / ng)
        # Connections set up at once, across all generators (they share one core): 100 a generator at
        # 10,000 workers; at 25,000, 100 each in ten generators timed out their first hosts.
        conc = max(10, SETUP_IN_FLIGHT // ng)
        for g in range(ng):
            first = g * per
            gens.append(
                Generator(
                    addr,
                    first,
                    min(per, n - first),
                    genlog,
                    other_cpus,
                    datagrams,
                    registration_rate,
                    conc,
                    streams_per_connection,
                )
            )
        regs = wait_registered(
            gens,
            wd / "coordinator.log",
            sampler,
            t0,
            cpu0,
            out,
            genlog=wd / "generators.log",
            hosts_per_slice=hosts,
            heartbeat_timeout=hbt,
        )
        t_reg = max(r["t1"] for r in regs)
        out["registration_s"] = rnd(t_reg - t0, 2)
        out["registration_failed"] = sum(r["failed"] for r in regs)
        if not trainer.running.wait(300):
            raise RuntimeError("the job did not start (no resume to the trainer)")
        _, log_pos = _timeouts_since(wd / "coordinator.log", 0)
        out["running_after_s"] = rnd(time.time() - t0, 2)
        out["registration_cpu_s"] = rnd(sampler.cpu_seconds() - cpu0, 2)
        log(f"scale {n}: registered in {out['registration_s']} s ({out['registration_failed']} failed); running")
        time.sleep(2.0 if quick else 5.0)
        dg_counts = [g.ask({"cmd": "datagrams"}) for g in gens]
        out["datagram_workers"] = sum(d["confirmed"] for d in dg_counts)
        out["connected_workers"] = sum(d["connected"] for d in dg_counts)
        threads0 = {t.id: t.user_time + t.system_time for t in psutil.Process(coord.pid).threads()}
        tw0 = time.monotonic()
        windows = sampler.windows(3.0 if quick else 10.0, 3 if quick else 5)
        threads1 = {t.id: t.user_time + t.system_time for t in psutil.Process(coord.pid).threads()}
        span = time.monotonic() - tw0
        main_cpu = (threads1.get(coord.pid, 0.0) - threads0.get(coord.pid, 0.0)) / span
        other_cpu = sum(v - threads0.get(k, 0.0) for k, v in threads1.items() if k != coord.pid) / span
        out["cpu_cores_main_thread"] = rnd(main_cpu, 4)
        out["cpu_cores_other_threads"] = rnd(other_cpu, 4)
        out["saturated"] = main_cpu >= SATURATED_MAIN_THREAD
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

        drops_before = 0
        if scenario == "coordinator_restart":
            cycles = 0  # the restart is this scenario's event
            drops_before = socket_drops(coordinator_metrics(http)) or 0
            coord, restart = restart_coordinator(coord, cmd, addr, http, wd, n, coord_cpus, rejoin_grace, logs)
            out.update(restart)
            log(
                f"scale {n}: coordinator restarted; every worker back {out.get('all_back_seconds')} s after the kill, "
                f"{out.get('hosts_lost')} hosts lost"
            )
        tail = LogTail(wd / "coordinator.log")
        first_resume = tail.tell_workers("resume", 0)
        last_gen = first_resume["generation"] if first_resume else 1
        cyc = []
        for _cycle in range(cycles):
            g0 = gens[0]
            if scenario == "health_reports":
                # The host's sidecar reports its Pathways worker unhealthy on its stream, as agent.worker does.
                t_disc = g0.ask({"cmd": "report", "index": 0, "healthy": False})["t"]
            else:
                t_disc = g0.ask({"cmd": "disconnect", "index": 0})["t"]
            spont = _spontaneous_holds(tail, last_gen, t_disc)
            hold = wait_until(lambda lg=last_gen: tail.tell_workers("hold", lg), 30, 0.01)
            if hold is None:
                cyc.append({"error": "no hold decision after a worker disconnected"})
                break
            gen = hold["generation"]
            waits = [g.ask({"cmd": "wait", "kind": "hold", "generation": gen, "timeout": 60}) for g in gens]
            if scenario == "health_reports":
                g0.ask({"cmd": "report", "index": 0, "healthy": True})  # healthy again: its slice comes back
            else:
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
                    "spontaneous_holds": spont,
                    "hold_received": sum(w["have"] for w in waits),
                    "hold_expected": sum(w["expected"] for w in waits),
                    "resume_received": sum(w["have"] for w in rwaits),
                    "resume_expected": sum(w["expected"] for w in rwaits),
                }
            )
            last_gen = resume["generation"] if resume else gen
            time.sleep(1.0)
        timeouts, _ = _timeouts_since(wd / "coordinator.log", log_pos)
        if scenario == "coordinator_restart":
            timeouts += _timeouts_since(wd / "coordinator-restarted.log", 0)[0]
        drops_now = socket_drops(coordinator_metrics(http))
        out["coordinator_socket_drops"] = None if drops_now is None else drops_before + drops_now
        out["loadgen_heartbeats_late_max_s"] = max(g.ask({"cmd": "datagrams"})["clock_late_max_s"] for g in gens)
        udp1 = udp_counters()
        if "RcvbufErrors" in udp0 and "RcvbufErrors" in udp1:
            # Machine-wide, but on this loopback-only machine the run's datagrams are the UDP traffic.
            out["udp_receive_buffer_drops"] = udp1["RcvbufErrors"] - udp0["RcvbufErrors"]
            out["udp_datagrams_received"] = udp1["InDatagrams"] - udp0["InDatagrams"]
        good = [c for c in cyc if "error" not in c]
        dumps = []
        for i, g in enumerate(gens):
            p = wd / f"received-{i}.json"
            g.ask({"cmd": "dump", "path": str(p)})
            dumps.append(json.loads(p.read_text()))
        holds, resumes = [], []
        for c in good:
            c["hold_fanout"] = _stats(_latencies(dumps, "hold", c["generation"], c["t_hold"]))
            c["hold_fanout_processed"] = _stats(_latencies(dumps, "hold", c["generation"], c["t_hold"], processed=True))
            # Workers that did not acknowledge the datagram in time (and any without datagrams) get
            # the stream's copy: how many did and how long it took are kept beside the first copies'.
            c["hold_stream_fanout"] = _stats(_latencies(dumps, "hold", c["generation"], c["t_hold"], "stream"))
            c["hold_first_via"] = dict(_first_via(dumps, "hold", c["generation"]))
            c["disconnect_to_decision_s"] = rnd(c["t_hold"] - c["t_disconnect"])
            holds.append(c["hold_fanout"])
            if c["t_resume"] is not None:
                c["resume_fanout"] = _stats(_latencies(dumps, "resume", c["generation"], c["t_resume"]))
                resumes.append(c["resume_fanout"])
        out["cycles"] = cyc
        out["hold_fanout"] = {
            "p50_s": rnd(median(h["p50_s"] for h in holds)),
            "p99_s": rnd(median(h["p99_s"] for h in holds)),
            "p99_s_worst_cycle": rnd(max((h["p99_s"] for h in holds if h["p99_s"] is not None), default=None)),
            "max_s": rnd(median(h["max_s"] for h in holds)),
            "received": [c["hold_received"] for c in good],
            "expected": [c["hold_expected"] for c in good],
        }
        out["hold_stream_fanout_p99_s"] = rnd(
            max((c["hold_stream_fanout"]["p99_s"] for c in good if c["hold_stream_fanout"]["n"]), default=None)
        )
        out["hold_stream_copies"] = [c["hold_stream_fanout"]["n"] for c in good]
        out["hold_fanout_processed_p99_s"] = rnd(
            max((c["hold_fanout_processed"]["p99_s"] for c in good if c["hold_fanout_processed"]["n"]), default=None)
        )
        first_via: Counter[str] = Counter()
        for c in good:
            first_via.update(c["hold_first_via"])
        out["hold_first_by_datagram"] = (
            rnd(first_via["datagram"] / sum(first_via.values()), 4) if sum(first_via.values()) else None
        )
        out["resume_fanout"] = {
            "p50_s": rnd(median(h["p50_s"] for h in resumes)),
            "p99_s": rnd(median(h["p99_s"] for h in resumes)),
        }
        out["disconnect_to_decision_s"] = rnd(median(c["disconnect_to_decision_s"] for c in good))
        out["heartbeat_timeouts_while_running"] = timeouts
        delivered = [c["hold_received"] / c["hold_expected"] for c in good if c["hold_expected"]]
        delivered += [c["resume_received"] / c["resume_expected"] for c in good if c.get("resume_expected")]
        out["delivered_fraction"] = rnd(min(delivered), 4) if delivered else 0.0
        dg = (out["datagram_workers"], out["connected_workers"]) if datagrams else None
        why = [c["error"] for c in cyc if "error" in c] + validate(
            n, good, cycles, timeouts, dg, out["coordinator_socket_drops"], held_connected=scenario == "health_reports"
        )
        if scenario == "coordinator_restart":
            why += validate_restart(out)
        if timeouts and out["loadgen_heartbeats_late_max_s"] >= hbt / 2:
            why.append(
                f"a load generator's heartbeat datagrams ran {out['loadgen_heartbeats_late_max_s']} s late "
                "(the generator, not the coordinator, may have silenced those workers)"
            )
        out["valid"] = not why
        if why:
            out["invalid_reason"] = "; ".join(why)
        log(
            f"scale {n}: hold fan-out p50 {out['hold_fanout']['p50_s']} s p99 {out['hold_fanout']['p99_s']} s;"
            f" {'valid' if not why else 'INVALID: ' + out['invalid_reason']}"
        )
    except Collapsed as e:
        late = _loadgen_late(wd / "generators.log")
        if late:
            e = Collapsed(
                f"{e}; a load generator's heartbeat datagrams ran up to {max(late)} s late ({len(late)} times)"
            )
        out["error"] = f"did not reach steady state: {e}"
        out["valid"] = False
        out["invalid_reason"] = out["error"]
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
        for f in logs:
            f.close()
        _pin(os.getpid(), USABLE_CPUS)
    return out


def restart_coordinator(
    coord: subprocess.Popen[bytes],
    cmd: list[str],
    addr: str,
    http: str | None,
    wd: Path,
    n: int,
    cpus: set[int] | None,
    grace: float,
    logs: list[IO[bytes]],
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """SIGKILL the coordinator under load, start it again on the same ports, and time the workers' return."""
    t_kill = time.time()
    coord.kill()
    coord.wait()
    logf = open(wd / "coordinator-restarted.log", "wb")  # noqa: SIM115 - closed with the run's other logs
    logs.append(logf)
    new = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env(), cwd=ROOT)
    _pin(new.pid, cpus)
    sampler = CpuSampler(new.pid)
    out: dict[str, Any] = {"rejoin_grace": grace, "all_back_seconds": None}
    if not wait_until(lambda: _health_serving(addr), 30, 0.02):
        out["restart_error"] = "the restarted coordinator did not serve within 30 s"
        return new, out
    out["restart_to_serving_seconds"] = rnd(time.time() - t_kill, 3)
    # The storm's length grows with the workers (about 300 registrations a second here): wait for at
    # least 100 a second before calling a worker missing.
    deadline = time.monotonic() + 3 * grace + 30 + n / 100
    connected = 0.0
    while time.monotonic() < deadline:
        connected = coordinator_metrics(http, timeout=2.0).get(CONNECTED, connected)
        if connected >= n:
            out["all_back_seconds"] = rnd(time.time() - t_kill, 3)
            break
        time.sleep(0.1)
    out["workers_back"] = int(connected)
    out["restart_cpu_seconds"] = rnd(sampler.cpu_seconds(), 2)
    # A host that had not re-registered when the grace ran out counts as lost: read after it. The grace
    # runs from the restart and again from the newest re-registration, so it ends at the latest a grace
    # after the last worker came back (or after now, if some never did).
    last = t_kill + (out["all_back_seconds"] if out["all_back_seconds"] is not None else time.time() - t_kill)
    time.sleep(max(0.0, max(last, t_kill + out.get("restart_to_serving_seconds", 0.0)) + grace + 2.0 - time.time()))
    out["hosts_lost"] = _worker_lost_since(wd / "coordinator-restarted.log")
    if out["hosts_lost"]:
        out["lost_host_timelines"] = lost_host_timelines(
            wd / "coordinator-restarted.log", wd / "generators.log", min(n, HOSTS_PER_SLICE)
        )
    return new, out


def row(r: dict[str, Any]) -> dict[str, Any]:
    """The result row of one size: the fields every consumer reads, validity first-class."""
    hf = r.get("hold_fanout") or {}
    windows = [w for w in r.get("cpu_cores_windows") or [] if w is not None]
    return {
        "workers": r["workers"],
        "scenario": r.get("scenario", "hold_cycles"),
        "runs": 1,
        "coordinator_socket_drops": r.get("coordinator_socket_drops"),
        **{
            k: r.get(k)
            for k in (
                "all_back_seconds",
                "restart_to_serving_seconds",
                "restart_cpu_seconds",
                "hosts_lost",
                "rejoin_grace",
            )
            if k in r
        },
        "topology": TOPOLOGY,
        "heartbeats": r.get("heartbeats", "stream"),
        "streams_per_connection": r.get("streams_per_connection", 1),
        "coordinator_open_files": r.get("open_fds"),
        "datagram_workers": r.get("datagram_workers"),
        "udp_receive_buffer_drops": r.get("udp_receive_buffer_drops"),
        "heartbeat_interval": r.get("heartbeat_interval"),
        "heartbeat_timeout": r.get("heartbeat_timeout"),
        "coordinator_cores": r.get("cpu_cores"),
        "coordinator_cores_min": min(windows) if windows else None,
        "coordinator_cores_max": max(windows) if windows else None,
        "cpu_windows": len(windows),
        "coordinator_cores_main_thread": r.get("cpu_cores_main_thread"),
        "saturated": r.get("saturated"),
        "coordinator_rss_mib": r.get("rss_mib"),
        "workers_registered": (r.get("collapse") or {}).get(
            "workers_registered", r["workers"] if r.get("rss_mib") else None
        ),
        "coordinator_rss_mib_at_collapse": (r.get("collapse") or {}).get("coordinator_rss_mib"),
        "registration_seconds": r.get("registration_s"),
        "fanout_p99_seconds": hf.get("p99_s_worst_cycle"),
        "fanout_p50_seconds": hf.get("p50_s"),
        "resume_fanout_p99_seconds": (r.get("resume_fanout") or {}).get("p99_s"),
        "hold_first_by_datagram": r.get("hold_first_by_datagram"),
        "fanout_p99_processed_seconds": r.get("hold_fanout_processed_p99_s"),
        "stream_fanout_p99_seconds": r.get("hold_stream_fanout_p99_s"),
        "hold_stream_copies": r.get("hold_stream_copies"),
        "loadgen_heartbeats_late_max_s": r.get("loadgen_heartbeats_late_max_s"),
        "delivered_fraction": r.get("delivered_fraction", 0.0),
        "cycles": len([c for c in r.get("cycles", []) if "error" not in c]),
        "pinned": r.get("pinned"),
        "valid": bool(r.get("valid")),
        **({"invalid_reason": r["invalid_reason"]} if r.get("invalid_reason") else {}),
    }


def size_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for the runs of a size and scenario: valid only if every run was."""
    rows = [row(r) for r in runs]
    first = rows[0]

    def vals(k: str) -> list[Any]:
        return [x[k] for x in rows if x.get(k) is not None]

    def worst(k: str, f: Any = max) -> Any:
        v = vals(k)
        return f(v) if v else None

    out = dict(first)
    drops = vals("coordinator_socket_drops")
    out.update(
        runs=len(rows),
        coordinator_cores=median(vals("coordinator_cores")),
        coordinator_cores_runs=[x.get("coordinator_cores") for x in rows],
        coordinator_cores_min=worst("coordinator_cores_min", min),
        coordinator_cores_max=worst("coordinator_cores_max"),
        cpu_windows=sum(vals("cpu_windows")),
        coordinator_cores_main_thread=worst("coordinator_cores_main_thread"),
        saturated=any(vals("saturated")),
        coordinator_rss_mib=worst("coordinator_rss_mib"),
        registration_seconds=worst("registration_seconds"),
        fanout_p99_seconds=worst("fanout_p99_seconds"),
        fanout_p50_seconds=median(vals("fanout_p50_seconds")),
        resume_fanout_p99_seconds=worst("resume_fanout_p99_seconds"),
        hold_first_by_datagram=worst("hold_first_by_datagram", min),
        fanout_p99_processed_seconds=worst("fanout_p99_processed_seconds"),
        stream_fanout_p99_seconds=worst("stream_fanout_p99_seconds"),
        hold_stream_copies=[c for x in rows for c in x.get("hold_stream_copies") or []],
        loadgen_heartbeats_late_max_s=worst("loadgen_heartbeats_late_max_s"),
        delivered_fraction=worst("delivered_fraction", min) or 0.0,
        cycles=sum(vals("cycles")),
        udp_receive_buffer_drops=sum(vals("udp_receive_buffer_drops")) if vals("udp_receive_buffer_drops") else None,
        coordinator_socket_drops=sum(drops) if len(drops) == len(rows) else None,
        valid=all(x["valid"] for x in rows),
    )
    for k in ("all_back_seconds", "restart_to_serving_seconds", "restart_cpu_seconds"):
        if k in first:
            out[k] = worst(k) if len(vals(k)) == len(rows) else None
    if "hosts_lost" in first:
        out["hosts_lost"] = sum(vals("hosts_lost"))
    out.pop("invalid_reason", None)
    why = [f"run {i}: {x['invalid_reason']}" for i, x in enumerate(rows, 1) if x.get("invalid_reason")]
    if why:
        out["invalid_reason"] = "; ".join(why)
    return out


def too_few_open_files(n: int, streams_per_connection: int = 1) -> str | None:
    """Why this machine cannot run ``n`` workers against one coordinator (None when it can): the coordinator
    holds a socket per worker connection (``agent.fdlimit``), and no process here may open that many files.
    With ``streams_per_connection`` above 1 the workers share connections (``bench.scale_loadgen``)."""
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


def rmem_max() -> int | None:
    """The machine's ``net.core.rmem_max``: the most receive buffer the coordinator's heartbeat socket gets."""
    try:
        return int(Path("/proc/sys/net/core/rmem_max").read_text())
    except (OSError, ValueError):
        return None


def run(
    quick: bool = False,
    sizes: list[int] | None = None,
    cycles: int | None = None,
    workdir: Path | None = None,
    profile: bool = False,
    heartbeat_interval: float | None = None,
    heartbeat_timeout: float | None = None,
    heartbeats: str = "datagram",
    runs: int | None = None,
    scenarios: list[str] | None = None,
    registration_rate: float | None = None,
    rejoin_grace: float | None = None,
    streams_per_connection: int = 1,
) -> dict[str, Any]:
    from agent import constants as C
    from agent.sources import heartbeat_datagrams

    runs = runs or (1 if quick else RUNS)
    scenarios = scenarios or ["hold_cycles"]
    bad = sorted(set(scenarios) - set(SCENARIOS))
    if bad:
        raise ValueError(f"scenario {bad}: expected among {list(SCENARIOS)}")
    rate = REGISTRATION_RATE if registration_rate is None else registration_rate
    grace = rejoin_grace or REJOIN_GRACE

    hb = heartbeat_interval or C.HEARTBEAT_INTERVAL_SECONDS
    hbt = heartbeat_timeout or C.HEARTBEAT_TIMEOUT_SECONDS
    sizes = sizes or ([200] if quick else [1000, 10000, 25000])
    cycles = cycles or (1 if quick else 3)
    root = Path(workdir or tempfile.mkdtemp(prefix="bench-scale-"))
    t0 = time.monotonic()
    results = []
    rows = []
    for scenario in scenarios:
        for n in sizes:
            short = too_few_open_files(n, streams_per_connection)
            if short:
                log(f"scale {n} ({scenario}): NOT RUN: {short}")
                rows.append(
                    {
                        "workers": n,
                        "scenario": scenario,
                        "heartbeat_interval": hb,
                        "heartbeat_timeout": hbt,
                        "heartbeats": heartbeats,
                        "streams_per_connection": streams_per_connection,
                        "status": "not_run",
                        "runs": 0,
                        "valid": False,
                        "invalid_reason": short,
                    }
                )
                continue
            mine = []
            for i in range(runs):
                log(f"scale {n} ({scenario}): run {i + 1}/{runs}")
                try:
                    r = run_size(
                        n,
                        root,
                        quick,
                        cycles,
                        hb,
                        hbt,
                        profile,
                        heartbeats,
                        scenario,
                        rate,
                        grace,
                        streams_per_connection,
                    )
                except Exception as e:  # noqa: BLE001 - report the failure as a result
                    log(f"scale {n}: FAILED: {e}")
                    r = {
                        "workers": n,
                        "scenario": scenario,
                        "heartbeat_interval": hb,
                        "heartbeat_timeout": hbt,
                        "heartbeats": heartbeats,
                        "error": f"{type(e).__name__}: {e}",
                        "valid": False,
                        "invalid_reason": f"{type(e).__name__}: {e}",
                    }
                r["run"] = i
                mine.append(r)
            results += mine
            rows.append(size_row(mine))
    if workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "name": NAME,
        "quick": quick,
        "config": {
            "sizes": sizes,
            "cycles": cycles,
            "hosts_per_slice": HOSTS_PER_SLICE,
            "workers_per_generator": PER_GENERATOR,
            "registration_rate_per_generator": rate,
            "runs": runs,
            "scenarios": scenarios,
            "rejoin_grace": grace,
            "heartbeat_interval": hb,
            "heartbeat_timeout": hbt,
            "heartbeats": heartbeats,
            "streams_per_connection": streams_per_connection,
            "net_core_rmem_max": rmem_max(),
            "coordinator_recv_buffer_asked": heartbeat_datagrams.RECV_BUFFER_BYTES,
            "shipped_heartbeats": "datagram" if C.HEARTBEAT_DATAGRAMS else "stream",
            "shipped_heartbeat_interval": C.HEARTBEAT_INTERVAL_SECONDS,
            "shipped_heartbeat_timeout": C.HEARTBEAT_TIMEOUT_SECONDS,
        },
        "results": rows,
        "sizes": results,
        "duration_s": round(time.monotonic() - t0, 1),
    }
