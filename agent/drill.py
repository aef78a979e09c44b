"""``elastic-sidecar drill``: lose one TPU pod on purpose and say whether the job held its state.

    elastic-sidecar drill --jobset my-job --slice 1                  # the kubeconfig's cluster and namespace
    elastic-sidecar drill --jobset my-job --slice 1 --json drill.json
    elastic-sidecar drill --jobset my-job --slice 2 --host 3 --namespace team-a --timeout 1800
    # on this machine, against the demo's stand-in Kubernetes API:
    elastic-sidecar demo --steps 600 --step-seconds 0.1 --no-faults --admin-address 127.0.0.1:29311 \\
        --kube-api --kubeconfig-out /tmp/kc &
    elastic-sidecar drill --kubeconfig /tmp/kc --jobset elastic-demo --slice 1 --admin-address 127.0.0.1:29311

It deletes one pod of the slice (the JobSet's Job of index SLICE, the pod of completion index
--host) through the Kubernetes API, follows the coordinator's decisions through its admin API,
watches for the replacement pod, and reports each phase's time from the deletion: detected, held,
resumed on the remaining slices, replacement pod running, grown back; then the steps lost, where
the job restored from, and the JobSet's restarts (its ``status.restarts``).

Before it deletes anything it checks the JobSet, the pod and that the job runs on every slice.
It needs the ``kubernetes`` package (``pip install 'elastic-sidecar[drill]'``), RBAC to get, list
and delete pods and get jobsets in the namespace (deploy/drill/rbac-drill.yaml), and the
coordinator's admin API (``kubectl port-forward POD 29311`` to the coordinator's pod).

Exit codes: 0 held (the job held its state: at most --max-lost-steps steps lost, no JobSet restart,
grown back onto the replacement); 1 lost (more steps lost, a JobSet restart, the job failed) or
incomplete (--timeout passed, or the job ended, before it grew back); 2 bad usage or the drill could
not start (the message names the value; nothing was deleted); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agent import constants as C
from agent.auth import read_token_file
from agent.config import ConfigError, address, nonneg_int, positive_float
from agent.servers.status import to_dict

DEFAULT_TIMEOUT = 1200.0
"""Seconds for the whole drill: a TPU slice's replacement can take many minutes to be provisioned."""
POLL_SECONDS = 1.0
CALL_TIMEOUT = 10.0
"""Seconds for one Kubernetes or admin API call (never more than the drill has left)."""
CLOCK_SLACK = 1.0
"""Seconds by which the coordinator's clock may run behind this machine's before a decision made
after the deletion looks as if it came before it."""
STEP_WAIT = 300.0
"""Seconds the drill waits for the job to take a step before it deletes anything: a pod lost while
the trainer still compiles tests the start-up, not the recovery."""
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
PHASES = ("detected", "held", "resumed", "replacement_running", "grown_back")

# The coordinator's reasons (agent.core.decide): the steps are read from them.
_HELD = re.compile(r"^trainer held at step (?P<step>-?\d+)")
_RESUMED = re.compile(r"^trainer resumed at step (?P<step>-?\d+) on slices .* from (?P<source>\w+)")


class DrillError(Exception):
    """The drill cannot start; nothing was deleted. The message names the value and what to do."""


# -- the verdict: a pure function of what was seen -------------------------------------------


@dataclass(frozen=True)
class Start:
    """The job just before the deletion."""

    slice: int
    deleted_at: float
    """Unix time of the deletion call, on this machine's clock."""
    generation: int
    active: tuple[int, ...]
    last_step: int
    jobset_restarts: int


@dataclass
class Report:
    verdict: str
    """held, lost or incomplete."""
    why: str
    phases: dict[str, float | None]
    lost_steps: int | None
    restored_from: str | None
    jobset_restarts: int | None
    resumes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return C.DRILL_EXIT_HELD if self.verdict == "held" else C.DRILL_EXIT_LOST


def judge(
    start: Start,
    events: list[dict[str, Any]],
    replacement_running_at: float | None,
    jobset_restarts_now: int | None,
    *,
    max_lost_steps: int = 1,
) -> Report:
    """The drill's phases and verdict from the decisions seen (the admin API's DecisionEvents as
    dicts, oldest first) and the moment the replacement pod ran. A record with ``last_step`` and
    no trigger is a status reading; only one of the generation the drill started in counts (the
    job's progress before the loss: a reading taken after a resume would count the steps made
    since as lost).

    Detected: the first decision after the deletion that starts a recovery (a new generation, or a
    phase other than running). Held: the trainer's hold acknowledgement. Resumed: the trainer
    resumed without the slice. Grown back: it resumed on the slice again, with every slice it had.
    Lost steps: for each resume, how far it went back from the furthest step the job had reached.
    """
    tally = _tally(start, events)
    at = tally.at
    at["replacement_running"] = replacement_running_at
    phases = {f"{k}_seconds": None if v is None else round(max(0.0, v - start.deleted_at), 3) for k, v in at.items()}
    restarts = None if jobset_restarts_now is None else max(0, jobset_restarts_now - start.jobset_restarts)
    lost_steps = tally.lost if at["detected"] is not None else None
    report = Report("incomplete", "", phases, lost_steps, tally.restored_from, restarts, tally.resumes)
    report.verdict, report.why = _verdict(tally, restarts, max_lost_steps)
    return report


@dataclass
class _Tally:
    """What :func:`judge` reads from the decisions, one after another."""

    high: int
    """The furthest step the job had reached."""
    at: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(PHASES))
    lost: int = 0
    restored_from: str | None = None
    resumes: list[dict[str, Any]] = field(default_factory=list)
    failed: str = ""


def _tally(start: Start, events: list[dict[str, Any]]) -> _Tally:
    tally = _Tally(high=start.last_step)
    for ev in events:
        if "trigger" not in ev:
            if int(ev.get("generation", -1)) == start.generation:
                tally.high = max(tally.high, int(ev["last_step"]))
            continue
        t = float(ev.get("time_unix", 0.0))
        if t < start.deleted_at - CLOCK_SLACK:
            continue
        if tally.at["detected"] is None:
            if not _starts_a_recovery(start, ev):
                continue
            tally.at["detected"] = t
        _count(tally, start, ev, t)
    return tally


def _starts_a_recovery(start: Start, ev: dict[str, Any]) -> bool:
    gen, phase = int(ev.get("generation", 0)), ev.get("phase", "")
    return gen > start.generation or (gen == start.generation and phase not in ("running", "starting", ""))


def _count(tally: _Tally, start: Start, ev: dict[str, Any], t: float) -> None:
    """One decision after the loss was detected: a failure, a hold or a resume."""
    trigger, reason = ev.get("trigger", ""), ev.get("reason", "")
    if ev.get("phase", "") == "failed" and not tally.failed:
        tally.failed = reason
    if trigger == "TrainerHeld" and (m := _HELD.match(reason)):
        tally.high = max(tally.high, int(m["step"]))
        if tally.at["held"] is None:
            tally.at["held"] = t
    elif trigger == "TrainerResumed" and (m := _RESUMED.match(reason)):
        step, source = int(m["step"]), m["source"]
        active = set(ev.get("active_slices", []))
        tally.lost += max(0, tally.high - step)
        tally.high = max(tally.high, step)
        tally.restored_from = tally.restored_from or source
        tally.resumes.append(
            {"seconds": round(t - start.deleted_at, 3), "step": step, "slices": sorted(active), "restored_from": source}
        )
        if start.slice not in active and tally.at["resumed"] is None:
            tally.at["resumed"] = t
        elif start.slice in active and active >= set(start.active) and tally.at["grown_back"] is None:
            tally.at["grown_back"] = t


def _verdict(tally: _Tally, restarts: int | None, max_lost_steps: int) -> tuple[str, str]:
    """The verdict and why, once ``tally.at`` holds every phase (the replacement's too)."""
    at, lost = tally.at, tally.lost
    if restarts:
        return "lost", f"the JobSet restarted {restarts} time(s): every pod was recreated"
    if lost > max_lost_steps:
        return "lost", f"{lost} steps lost (at most {max_lost_steps} holds the state)"
    if tally.failed:
        return "lost", f"the job failed: {tally.failed}"
    if at["detected"] is None:
        return "incomplete", "the coordinator made no decision about the loss"
    if at["grown_back"] is None or at["replacement_running"] is None:
        missing = [k for k in ("replacement_running", "grown_back") if at[k] is None]
        return "incomplete", "not seen: " + ", ".join(missing).replace("_", " ")
    return "held", (
        f"{lost} step(s) lost, restored from {tally.restored_from}, no JobSet restart, grown back onto the replacement"
    )


# -- the Kubernetes side ------------------------------------------------------------------


def _require_client() -> Any:
    try:
        import kubernetes
    except ModuleNotFoundError:
        raise DrillError(
            "the kubernetes package is not installed: pip install 'elastic-sidecar[drill]' (or kubernetes)"
        ) from None
    return kubernetes


class Cluster:
    """The pods and the JobSet, through the official client (kubeconfig, or in-cluster)."""

    def __init__(self, ns: argparse.Namespace) -> None:
        k8s = _require_client()
        import urllib3
        from kubernetes import client, config

        self.ApiException = client.exceptions.ApiException
        self.errors: tuple[type[BaseException], ...] = (
            self.ApiException,
            urllib3.exceptions.HTTPError,
            OSError,
            ValueError,
        )
        """What one call may raise: an answer, or no answer (a blip, a timeout)."""
        cfg = client.Configuration()
        namespace = ns.namespace
        in_cluster = ns.kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ
        try:
            if in_cluster:
                config.load_incluster_config(client_configuration=cfg)
                if namespace is None and IN_CLUSTER_NAMESPACE.exists():
                    namespace = IN_CLUSTER_NAMESPACE.read_text().strip()
            else:
                config.load_kube_config(config_file=ns.kubeconfig, context=ns.context, client_configuration=cfg)
                if namespace is None:
                    contexts, current = config.list_kube_config_contexts(config_file=ns.kubeconfig)
                    chosen = next((c for c in contexts if c["name"] == ns.context), current) if ns.context else current
                    namespace = (chosen or {}).get("context", {}).get("namespace")
        except (config.ConfigException, OSError, ValueError, TypeError) as e:
            where = "in-cluster configuration" if in_cluster else f"--kubeconfig {ns.kubeconfig or '(default)'}"
            raise DrillError(f"{where}: cannot load it: {e}") from None
        self.namespace: str = namespace or "default"
        # No retries inside a call: each call has its own deadline, and the drill's loop asks again.
        cfg.retries = 0
        self.api = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.version = k8s.__version__

    def close(self) -> None:
        self.api.close()

    def jobset_restarts(self, name: str, timeout: float) -> int:
        group, version, plural = C.JOBSET_API
        js: Any = self.custom.get_namespaced_custom_object(
            group, version, self.namespace, plural, name, _request_timeout=timeout
        )
        return int((js.get("status") or {}).get("restarts") or 0)

    def slice_pods(self, jobset: str, slice_: int, replicated_job: str | None, timeout: float) -> list[Any]:
        selector = f"{C.LABEL_JOBSET_NAME}={jobset},{C.LABEL_JOB_INDEX}={slice_}"
        if replicated_job:
            selector += f",{C.LABEL_REPLICATED_JOB_NAME}={replicated_job}"
        return list(
            self.core.list_namespaced_pod(self.namespace, label_selector=selector, _request_timeout=timeout).items
        )

    def delete(self, name: str, timeout: float) -> Any:
        return self.core.delete_namespaced_pod(name, self.namespace, _request_timeout=timeout)


def completion_index(pod: Any) -> str | None:
    meta = pod.metadata
    return (meta.labels or {}).get(C.LABEL_JOB_COMPLETION_INDEX) or (meta.annotations or {}).get(
        C.LABEL_JOB_COMPLETION_INDEX
    )


def _requests_tpu(pod: Any) -> bool:
    for c in pod.spec.containers or []:
        res = c.resources
        if res is not None and "google.com/tpu" in {**(res.limits or {}), **(res.requests or {})}:
            return True
    return False


def running(pod: Any) -> bool:
    return pod.metadata.deletion_timestamp is None and pod.status is not None and pod.status.phase == "Running"


def choose_pod(pods: list[Any], ns: argparse.Namespace, namespace: str) -> Any:
    """The running pod of completion index --host among the slice's pods; DrillError when none or
    ambiguous (a Pathways JobSet's head and worker Jobs share job-index 0: the TPU pods win)."""
    where = f"slice {ns.slice} of jobset {ns.jobset} in namespace {namespace}"
    live = [p for p in pods if running(p)]
    if not live:
        raise DrillError(f"--slice {ns.slice}: no running pod in {where} (labels {C.LABEL_JOB_INDEX}={ns.slice})")
    if ns.replicated_job is None:
        groups = {(p.metadata.labels or {}).get(C.LABEL_REPLICATED_JOB_NAME, "") for p in live}
        if len(groups) > 1:
            live = [p for p in live if _requests_tpu(p)]
            groups = {(p.metadata.labels or {}).get(C.LABEL_REPLICATED_JOB_NAME, "") for p in live}
            if len(groups) != 1:
                raise DrillError(
                    f"{where}: pods of several replicated jobs ({', '.join(sorted(groups))}): name one "
                    "with --replicated-job"
                )
    chosen = [p for p in live if completion_index(p) == str(ns.host)]
    if not chosen:
        found = sorted({completion_index(p) or "?" for p in live})
        raise DrillError(
            f"--host {ns.host}: no running pod of completion index {ns.host} in {where} (found {', '.join(found)})"
        )
    return chosen[0]


# -- the admin side ------------------------------------------------------------------------


def admin_channel(ns: argparse.Namespace) -> tuple[grpc.Channel, Any]:
    """A channel to the coordinator's admin API and the call metadata (its token, if any)."""
    token = read_token_file(ns.token_file, "--token-file") if ns.token_file else None
    md = token.metadata() if token is not None else None
    if ns.tls_ca_file:
        try:
            ca = Path(ns.tls_ca_file).read_bytes()
        except OSError as e:
            raise ConfigError(f"--tls-ca-file {ns.tls_ca_file}: cannot read it: {e.strerror or e}") from None
        options = [("grpc.ssl_target_name_override", ns.tls_server_name)] if ns.tls_server_name else []
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
        return grpc.secure_channel(ns.admin_address, creds, options=options), md
    return grpc.insecure_channel(ns.admin_address), md


class Decisions(threading.Thread):
    """Follows WatchEvents into a queue; after a broken stream (a coordinator restart) it watches
    again with a backlog and drops what it already passed on."""

    def __init__(self, stub: Any, md: Any) -> None:
        super().__init__(daemon=True, name="drill-decisions")
        self.stub, self.md = stub, md
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._seen: set[tuple[Any, ...]] = set()
        self._halt = threading.Event()
        self._call: Any = None
        self.breaks = 0

    def open(self, timeout: float) -> None:
        """Subscribe (live decisions only); grpc.RpcError when the admin API does not answer."""
        from protos.elastic_sidecar.v1 import admin_pb2

        self._call = self.stub.WatchEvents(admin_pb2.WatchEventsRequest(backlog=0), metadata=self.md)
        done = threading.Event()

        def headers() -> None:
            self._call.initial_metadata()  # returns once the server answers or the call ends
            done.set()

        threading.Thread(target=headers, daemon=True).start()
        if not done.wait(timeout):
            self._call.cancel()
            raise DrillError(f"the admin API's WatchEvents did not answer within {timeout:g} s")
        if self._call.done() and self._call.code() != grpc.StatusCode.OK:
            raise _Rpc(self._call)

    def run(self) -> None:
        from protos.elastic_sidecar.v1 import admin_pb2

        while not self._halt.is_set():
            try:
                for ev in self._call:
                    d = to_dict(ev)
                    key = (d["time_unix"], d["generation"], d["trigger"], d["reason"])
                    if key not in self._seen:
                        self._seen.add(key)
                        self.events.put(d)
            except grpc.RpcError:
                pass
            if self._halt.wait(0.5):
                return
            self.breaks += 1
            self._call = self.stub.WatchEvents(admin_pb2.WatchEventsRequest(backlog=200), metadata=self.md)

    def stop(self) -> None:
        self._halt.set()
        if self._call is not None:
            self._call.cancel()


class _Rpc(grpc.RpcError):
    def __init__(self, call: Any) -> None:
        self._c = call

    def code(self) -> grpc.StatusCode:
        return self._c.code()

    def details(self) -> str:
        return self._c.details() or ""


# -- the command ---------------------------------------------------------------------------


def add_drill_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobset", required=True, help="the JobSet's name (its pods carry jobset.sigs.k8s.io/jobset-name)")
    p.add_argument("--slice", type=nonneg_int, required=True, help="the slice to lose a pod of (the Job's job-index)")
    p.add_argument(
        "--host", type=nonneg_int, default=0, help="which pod of the slice: its completion index (default 0)"
    )
    p.add_argument(
        "--replicated-job",
        default=None,
        help="the replicated job of the TPU pods (xpk: worker with Pathways, slice without; default: the one "
        "whose pods request google.com/tpu)",
    )
    p.add_argument(
        "--namespace", default=None, help="default: the kubeconfig context's, or the pod's in-cluster, or default"
    )
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: KUBECONFIG or ~/.kube/config; in a pod: in-cluster)",
    )
    p.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
    p.add_argument(
        "--admin-address",
        type=address,
        default=os.environ.get("ES_ADMIN_ADDRESS", f"127.0.0.1:{C.ADMIN_PORT}"),
        metavar="HOST:PORT",
        help=f"the coordinator's admin API (default 127.0.0.1:{C.ADMIN_PORT}; env ES_ADMIN_ADDRESS)",
    )
    p.add_argument(
        "--token-file", default=os.environ.get("ES_ADMIN_TOKEN_FILE"), help="admin token (env ES_ADMIN_TOKEN_FILE)"
    )
    p.add_argument(
        "--tls-ca-file",
        default=os.environ.get("ES_TLS_CA_FILE"),
        help="verify the admin API's TLS with these CA certificates",
    )
    p.add_argument("--tls-server-name", default=None, help="name to verify the admin API's certificate against")
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds for the whole drill, from start to verdict (default {DEFAULT_TIMEOUT:g})",
    )
    p.add_argument(
        "--max-lost-steps", type=nonneg_int, default=1, help="steps a recovery may lose and still hold (default 1)"
    )
    p.add_argument("--json", default=None, metavar="PATH", help="write the report as JSON here ('-': stdout)")


@dataclass
class _Drill:
    """What one drill holds open: the admin API, the Kubernetes client and the decision stream."""

    ns: argparse.Namespace
    channel: grpc.Channel
    md: Any
    deadline: float
    say: Callable[[str], None]
    stub: Any = None
    cluster: Cluster | None = None
    follower: Decisions | None = None

    def left(self) -> float:
        """The timeout of one call: at most CALL_TIMEOUT, never past the drill's deadline (nor zero)."""
        return max(0.1, min(CALL_TIMEOUT, self.deadline - time.monotonic()))

    def close(self) -> None:
        _close(self.follower, self.cluster, self.channel)


@dataclass(frozen=True)
class _Deleted:
    """The pod the drill deleted, and the job as it stood then."""

    start: Start
    pod: str
    uid: str
    index: str | None


@dataclass
class _Seen:
    """What the drill has seen since the deletion."""

    events: list[dict[str, Any]] = field(default_factory=list)
    replacement: tuple[str, float] | None = None
    """The replacement pod's name and when it was first seen running."""
    restarts_now: int | None = None
    interrupted: bool = False

    def report(self, start: Start, max_lost_steps: int) -> Report:
        running_at = self.replacement[1] if self.replacement else None
        return judge(start, self.events, running_at, self.restarts_now, max_lost_steps=max_lost_steps)


def run(ns: argparse.Namespace) -> int:
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if ns.json == "-" else (lambda m: print(m, flush=True))
    try:
        channel, md = admin_channel(ns)
    except ConfigError as e:
        return _usage(str(e))
    d = _Drill(ns, channel, md, time.monotonic() + ns.timeout, say)
    try:
        deleted = _delete_a_pod(d)
    except DrillError as e:
        d.close()
        return _usage(str(e))
    except grpc.RpcError as e:
        d.close()
        return _usage(f"admin API at {ns.admin_address}: {e.code().name}: {e.details()}")  # type: ignore[attr-defined]
    seen = _Seen(restarts_now=deleted.start.jobset_restarts)
    try:
        _watch(d, deleted, seen)
    except KeyboardInterrupt:
        seen.interrupted = True
    finally:
        d.close()
    report = seen.report(deleted.start, ns.max_lost_steps)
    if report.verdict == "incomplete" and not seen.interrupted and time.monotonic() >= d.deadline:
        report.why = f"--timeout {ns.timeout:g} s passed; {report.why}"
    doc = _document(d, deleted, seen, report)
    say(render(doc))
    if ns.json:
        text = json.dumps(doc, indent=2)
        if ns.json == "-":
            print(text, flush=True)
        else:
            Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
            Path(ns.json).write_text(text + "\n")
    return 130 if seen.interrupted else report.exit_code


def _delete_a_pod(d: _Drill) -> _Deleted:
    """Check that the job trains on the slice, wait for a step, follow the decisions, delete the pod."""
    from protos.elastic_sidecar.v1 import admin_pb2_grpc

    ns = d.ns
    d.stub = stub = admin_pb2_grpc.AdminStub(d.channel)
    d.cluster = cluster = Cluster(ns)
    try:
        restarts0 = cluster.jobset_restarts(ns.jobset, d.left())
    except cluster.errors as e:
        raise DrillError(
            _api_problem(e, f"jobset {ns.jobset} in namespace {cluster.namespace}", "get jobsets")
        ) from None
    st = _status(stub, d.md, d.left())
    if not 0 <= ns.slice < len(st.slices):
        raise DrillError(f"--slice {ns.slice}: job {st.job} has slices 0..{len(st.slices) - 1}")
    if st.phase != "running" or ns.slice not in st.active_slices:
        raise DrillError(
            f"job {st.job} is {st.phase} on slices {list(st.active_slices)}: the drill starts from a job that "
            f"trains on slice {ns.slice} (see elastic-sidecar admin status)"
        )
    try:
        pods = cluster.slice_pods(ns.jobset, ns.slice, ns.replicated_job, d.left())
    except cluster.errors as e:
        raise DrillError(_api_problem(e, f"pods of jobset {ns.jobset}", "list pods")) from None
    pod = choose_pod(pods, ns, cluster.namespace)
    st = _wait_for_a_step(stub, d.md, st, d.deadline, d.say)
    d.follower = Decisions(stub, d.md)
    d.follower.open(d.left())
    d.follower.start()
    st = _status(stub, d.md, d.left())
    active0 = tuple(st.active_slices)
    name, uid, index = pod.metadata.name, pod.metadata.uid, completion_index(pod)
    d.say(
        f"drill: deleting pod {name} (slice {ns.slice}, host {index}) of jobset {ns.jobset} in {cluster.namespace}; "
        f"job at step {st.last_step}, generation {st.generation}, slices {list(active0)}"
    )
    deleted_at = time.time()
    try:
        cluster.delete(name, d.left())
    except cluster.errors as e:
        raise DrillError(_api_problem(e, f"pod {name}", "delete pods")) from None
    start = Start(ns.slice, deleted_at, st.generation, active0, st.last_step, restarts0)
    return _Deleted(start, name, uid, index)


def _watch(d: _Drill, deleted: _Deleted, seen: _Seen) -> None:
    """Poll until a verdict, the job's end or the deadline, printing each phase once it is reached."""
    shown: set[str] = set()
    while time.monotonic() < d.deadline:
        terminal = _poll(d, deleted, seen)
        report = seen.report(deleted.start, d.ns.max_lost_steps)
        for k, v in report.phases.items():
            if v is not None and k not in shown:
                shown.add(k)
                d.say(f"  +{v:8.3f}s  {k.removesuffix('_seconds').replace('_', ' ')}")
        if (
            report.verdict == "lost"
            or terminal
            or (report.phases["grown_back_seconds"] is not None and seen.replacement is not None)
        ):
            break
        time.sleep(POLL_SECONDS)


def _poll(d: _Drill, deleted: _Deleted, seen: _Seen) -> bool:
    """One round: new decisions, a status reading, the replacement pod, the JobSet's restarts.
    Whether the job has ended (failed or completed)."""
    ns, cluster, follower = d.ns, d.cluster, d.follower
    assert cluster is not None and follower is not None  # set by _delete_a_pod
    while True:
        try:
            seen.events.append(follower.events.get_nowait())
        except queue.Empty:
            break
    try:
        s = _status(d.stub, d.md, d.left())
        seen.events.append({"last_step": int(s.last_step), "generation": int(s.generation)})
        terminal = s.phase in ("failed", "completed")
    except grpc.RpcError:
        terminal = False  # a coordinator restarting: the stream watches again
    if seen.replacement is None:
        try:
            for p in cluster.slice_pods(ns.jobset, ns.slice, ns.replicated_job, d.left()):
                if p.metadata.uid != deleted.uid and completion_index(p) == deleted.index and running(p):
                    seen.replacement = (p.metadata.name, time.time())
        except cluster.errors:
            pass  # a blip of the API server; the next round asks again
    try:
        seen.restarts_now = cluster.jobset_restarts(ns.jobset, d.left())
    except cluster.errors:
        pass
    return terminal


def _document(d: _Drill, deleted: _Deleted, seen: _Seen, report: Report) -> dict[str, Any]:
    """The report as printed by :func:`render` and written by --json."""
    deleted_at = deleted.start.deleted_at
    return {
        "verdict": report.verdict,
        "why": report.why,
        "exit_code": report.exit_code,
        **{k: v for k, v in asdict(report).items() if k not in ("verdict", "why")},
        "jobset": d.ns.jobset,
        "namespace": d.ns.namespace or (d.cluster.namespace if d.cluster else None),
        "slice": d.ns.slice,
        "pod": deleted.pod,
        "pod_uid": deleted.uid,
        "replacement_pod": seen.replacement[0] if seen.replacement else None,
        "deleted_at_unix": deleted_at,
        "step_at_deletion": deleted.start.last_step,
        "decisions": [
            {"seconds": round(e["time_unix"] - deleted_at, 3), "trigger": e["trigger"], "reason": e["reason"]}
            for e in seen.events
            if "trigger" in e
        ],
    }


def render(doc: dict[str, Any]) -> str:
    def sec(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f} s"

    lines = [f"drill: {doc['verdict'].upper()}: {doc['why']}"]
    for k in PHASES:
        lines.append(f"  {k.replace('_', ' '):<22}{sec(doc['phases'][f'{k}_seconds'])}")
    lost = "-" if doc["lost_steps"] is None else str(doc["lost_steps"])
    restarts = "unknown" if doc["jobset_restarts"] is None else str(doc["jobset_restarts"])
    lines.append(f"  lost steps            {lost}")
    lines.append(f"  restored from         {doc['restored_from'] or '-'}")
    lines.append(f"  JobSet restarts       {restarts}")
    if doc["replacement_pod"]:
        lines.append(f"  replacement pod       {doc['replacement_pod']}")
    return "\n".join(lines)


def _wait_for_a_step(stub: Any, md: Any, st: Any, deadline: float, say: Any) -> Any:
    """The status once the job has taken a step since ``st``, still training on every slice it had."""
    first, active = st.last_step, list(st.active_slices)
    began = time.monotonic()
    until = min(deadline, began + STEP_WAIT)
    say(f"drill: waiting for job {st.job} to take a step (now at step {first})")
    while True:
        time.sleep(0.5)
        st = _status(stub, md, max(0.1, min(CALL_TIMEOUT, until - time.monotonic())))
        if st.phase != "running" or list(st.active_slices) != active:
            raise DrillError(f"job {st.job} went {st.phase} on slices {list(st.active_slices)} before the drill began")
        if st.last_step > first:
            return st
        if time.monotonic() >= until:
            raise DrillError(
                f"job {st.job} took no step in {time.monotonic() - began:.0f} s (still at step {first}): "
                "the drill starts from a job that trains"
            )


def _status(stub: Any, md: Any, timeout: float) -> Any:
    from protos.elastic_sidecar.v1 import admin_pb2

    return stub.GetStatus(admin_pb2.GetStatusRequest(), metadata=md, timeout=timeout)


def _api_problem(e: BaseException, what: str, verb: str) -> str:
    status = getattr(e, "status", None)
    if status is None:
        return f"{what}: no answer from the Kubernetes API ({type(e).__name__}: {str(e)[:200]})"
    if status == 404:
        return f"{what}: not found"
    reason = getattr(e, "reason", "")
    if status in (401, 403):
        return f"{what}: {reason} ({status}): the drill needs RBAC to {verb} (deploy/drill/rbac-drill.yaml)"
    return f"{what}: the Kubernetes API answered {status} {reason}"


def _close(follower: Decisions | None, cluster: Cluster | None, channel: grpc.Channel) -> None:
    if follower is not None:
        follower.stop()
    if cluster is not None:
        cluster.close()
    channel.close()


def _usage(message: str) -> int:
    print(f"elastic-sidecar drill: {message}", file=sys.stderr)
    return C.DRILL_EXIT_USAGE
