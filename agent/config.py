"""Command-line and environment configuration of the two daemon roles.

Every flag can also come from an environment variable ``ES_<FLAG>`` (dashes as
underscores, e.g. ``ES_NUM_SLICES``), which is how the JobSet manifests pass
the pod's identity from the downward API. A flag on the command line wins.
Bad values are refused at start-up with the flag, the value and what was
expected.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent import constants as C
from agent.core.model import Policy
from agent.errors import ConfigError as ConfigError  # re-exported: callers catch agent.config.ConfigError

if TYPE_CHECKING:
    from agent.auth import BearerToken


def _env(flag: str, default: str | None) -> str | None:
    return os.environ.get("ES_" + flag.lstrip("-").replace("-", "_").upper(), default)


def address(value: str) -> str:
    """HOST:PORT with a port in range; '[::1]:PORT' for IPv6."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    try:
        p = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port in {value!r} is not a number") from None
    if not 0 <= p <= 65535:
        raise argparse.ArgumentTypeError(f"port {p} in {value!r} is out of range 0-65535")
    return value


def listen_address(value: str) -> str | None:
    """HOST:PORT to listen on, or "none" (the server is off)."""
    if value.strip().lower() == "none":
        return None
    return address(value)


def is_loopback(addr: str) -> bool:
    host = addr.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


SECONDS_MAX = threading.TIMEOUT_MAX
"""The longest timeout Python's blocking calls take: a larger one raises OverflowError
(``threading.TIMEOUT_MAX``, documented for Lock.acquire and Condition.wait)."""


def seconds(*, zero_ok: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, above 0 (at least 0 with ``zero_ok``), at most
    :data:`SECONDS_MAX`. ``float()`` takes "nan" and "inf", and every comparison with NaN is false, so a
    bare ``f <= 0`` check lets NaN through: each bound is written so that NaN fails it."""
    lo = "0 or more" if zero_ok else "above 0"

    def conv(value: str) -> float:
        try:
            f = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
        if not math.isfinite(f):
            raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {value!r}")
        if not (f >= 0 if zero_ok else f > 0) or not f <= SECONDS_MAX:
            raise argparse.ArgumentTypeError(f"expected seconds {lo} and at most {SECONDS_MAX:.0f}, got {value!r}")
        return f

    conv.__name__ = "seconds"
    return conv


def whole(lo: int, hi: int = C.INT32_MAX) -> Callable[[str], int]:
    """An argparse type: a whole number in ``lo..hi`` (by default the wire format's int32 range)."""

    def conv(value: str) -> int:
        try:
            i = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
        if not lo <= i <= hi:
            raise argparse.ArgumentTypeError(f"expected a whole number from {lo} to {hi}, got {value!r}")
        return i

    conv.__name__ = "whole number"
    return conv


positive_float = seconds()
nonneg_float = seconds(zero_ok=True)
nonneg_int = whole(0)


def project_list(values: list[str] | None, flag: str, *, digits: bool) -> tuple[str, ...]:
    """Project ids (or numbers) from a repeatable, comma-separated flag or its ES_ variable."""
    raw = values if values else [_env(flag, "") or ""]
    out: list[str] = []
    for v in raw:
        for item in v.split(","):
            item = item.strip()
            if not item:
                continue
            if digits and not item.isdigit():
                raise ConfigError(f"{flag} {item!r} is not a project number (digits only, e.g. 123456789012)")
            if not digits and item.isdigit():
                raise ConfigError(f"{flag} {item!r} looks like a project number: give it as --pubsub-project-number")
            out.append(item)
    return tuple(dict.fromkeys(out))


def on_off(value: str) -> bool:
    """Whether "on" or "off" (a flag's value, or its ES_ environment variable)."""
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {value!r}")
    return value == "on"


def _add(p: argparse.ArgumentParser, flag: str, *, default: object = None, **kw: object) -> None:
    env = _env(flag, None)
    d = env if env is not None else default
    conv = kw.get("type")
    if env is not None and callable(conv):
        # argparse converts a string default with the flag's type and reports a bad one as the
        # flag's error (exit 2): say that the value came from the environment.
        kw["type"] = _from_env(conv, env, "ES_" + flag.lstrip("-").replace("-", "_").upper())
    p.add_argument(flag, default=d, **kw)  # type: ignore[arg-type]


def _from_env(conv: Callable[[str], object], env: str, var: str) -> Callable[[str], object]:
    def wrapped(value: str) -> object:
        try:
            return conv(value)
        except (argparse.ArgumentTypeError, ValueError) as e:
            if value != env:
                raise
            msg = str(e) or f"invalid value {value!r}"
            raise argparse.ArgumentTypeError(f"{msg} (from {var})") from None

    wrapped.__name__ = getattr(conv, "__name__", "value")
    return wrapped


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _in_cluster_api() -> str | None:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host:
        return None
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port or 443}"


def add_common(p: argparse.ArgumentParser) -> None:
    _add(p, "--job", default="elastic-job", help="JobSet name; peers of another job are refused (env ES_JOB)")
    _add(p, "--log-format", default="json", choices=["json", "console"], help="json: Cloud Logging lines (default)")
    _add(p, "--log-level", default="info", choices=["debug", "info", "warning", "error"])


def add_coordinator_args(p: argparse.ArgumentParser) -> None:
    add_common(p)
    _add(
        p,
        "--listen",
        default=f"127.0.0.1:{C.COORDINATOR_PORT}",
        type=address,
        help=f"peer gRPC address: worker sidecars register here (default 127.0.0.1:{C.COORDINATOR_PORT}; "
        f"the manifests use 0.0.0.0:{C.COORDINATOR_PORT} with --peer-token-file)",
    )
    _add(
        p,
        "--trainer-listen",
        default=f"127.0.0.1:{C.TRAINER_PORT}",
        type=address,
        help=f"gRPC address of the trainer link (default 127.0.0.1:{C.TRAINER_PORT}: the trainer runs in the same "
        "pod). A non-loopback address needs --trainer-token-file",
    )
    _add(
        p,
        "--trainer-token-file",
        default=None,
        help="file holding the token the trainer hooks must present (they read ELASTIC_SIDECAR_TOKEN_FILE); "
        "none: the trainer link is not authenticated, so it must stay on loopback",
    )
    _add(p, "--num-slices", type=whole(1), required=_env("--num-slices", None) is None, help="slices in the job")
    _add(p, "--hosts-per-slice", default=1, type=whole(1), help="TPU hosts (worker sidecars) per slice")
    _add(
        p,
        "--elastic-min-slice-count",
        default=-1,
        type=whole(-1),
        help="MaxText's flag: -1 waits for all slices, k continues on >= k (default -1)",
    )
    _add(
        p,
        "--elastic-timeout-seconds",
        default=300.0,
        type=positive_float,
        help="MaxText's flag: longest wait for enough slices (default 300)",
    )
    _add(
        p,
        "--elastic-max-retries",
        default=10,
        type=whole(1),
        help="MaxText's flag, read by its name: recoveries from failures allowed (N + 1 attempts; default 10)",
    )
    _add(
        p,
        "--heartbeat-interval",
        default=C.HEARTBEAT_INTERVAL_SECONDS,
        type=positive_float,
        help=f"seconds between worker heartbeats (default {C.HEARTBEAT_INTERVAL_SECONDS})",
    )
    _add(
        p,
        "--heartbeat-timeout",
        default=C.HEARTBEAT_TIMEOUT_SECONDS,
        type=positive_float,
        help=f"a worker silent this long is lost (default {C.HEARTBEAT_TIMEOUT_SECONDS})",
    )
    _add(
        p,
        "--first-heartbeat-timeout",
        default=None,
        type=positive_float,
        help="a worker that has just registered may stay silent this long after the coordinator wrote its "
        "registration reply before it is lost; from its first message on, --heartbeat-timeout applies "
        f"(default {C.FIRST_HEARTBEAT_TIMEOUT_FACTOR:g} x --heartbeat-timeout: a reply can take over a second "
        "to reach a worker while thousands re-register after a coordinator restart)",
    )
    _add(
        p,
        "--heartbeat-datagrams",
        default="on" if C.HEARTBEAT_DATAGRAMS else "off",
        type=on_off,
        help="on (default): workers send heartbeats as UDP datagrams to the --listen port, which costs the "
        "coordinator far less CPU than stream messages; a worker whose datagrams do not arrive keeps "
        "heartbeating on its stream. off: heartbeats only on the streams",
    )
    _add(
        p,
        "--gc-freeze",
        default="on",
        type=on_off,
        help="on (default): every 256 registrations, the coordinator freezes Python's garbage collector's "
        "objects (gc.freeze) so that its registered workers are not walked by every full collection (without "
        "it, stalls of up to 1.5 s while 19,000 workers register after a restart); once a quarter of the "
        "frozen workers have left and streams stopped ending for 5 s, it unfreezes, collects once and "
        "freezes again. off: the collector as Python has it",
    )
    _add(
        p,
        "--rejoin-grace",
        default=10.0,
        type=positive_float,
        help="after a coordinator restart, seconds known hosts get to re-register (default 10), counted again "
        "from each host that re-registers while they keep coming back: a host is judged lost only this long "
        "after the restart and after the newest re-registration",
    )
    _add(
        p,
        "--state-dir",
        type=Path,
        default=None,
        help="where the coordinator keeps what must survive its restart: state.json (written before any action "
        "of a decision runs), journal.jsonl and a lock that keeps a second coordinator out (default: none)",
    )
    _add(p, "--state-file", type=Path, default=None, help="the state file alone, outside --state-dir")
    _add(p, "--journal", type=Path, default=None, help="append every decision as a JSON line here")
    _add(
        p,
        "--journal-max-bytes",
        default=16 * 1024 * 1024,
        type=whole(0, C.INT64_MAX),
        help="rotate the journal to journal.jsonl.1 past this size, keeping one old file (default 16 MiB)",
    )
    _add(
        p,
        "--durability-bound",
        default=2.0,
        type=positive_float,
        help="seconds a decision waits for its state write to succeed before it is carried out from memory "
        "anyway, flagged not durable (default 2)",
    )
    _add(
        p,
        "--restart-attempt",
        default=0,
        type=nonneg_int,
        help="the JobSet restart attempt (label jobset.sigs.k8s.io/restart-attempt, env ES_RESTART_ATTEMPT): a "
        "state file from an earlier attempt does not make this one failed (default 0)",
    )
    _add(
        p,
        "--flush-timeout-seconds",
        default=600.0,
        type=positive_float,
        help="how long a flush may take; a hold that flushes is acknowledged within elastic_timeout_seconds plus "
        "this (default 600)",
    )
    _add(
        p,
        "--settle-seconds",
        default=1.0,
        type=nonneg_float,
        help="a lost slice's replacement counts once it has stayed registered and healthy this long (default 1)",
    )
    _add(
        p,
        "--pubsub-subscription",
        default=None,
        help="projects/P/subscriptions/S to pull GKE and Cloud Logging notices from (none: no Pub/Sub intake)",
    )
    _add(p, "--cluster-name", default=None, help="only GKE notices for this cluster count (default: any)")
    p.add_argument(
        "--pubsub-project",
        action="append",
        default=None,
        help="only notices for these projects count: a project id (GCE log entries carry it), repeatable or "
        "comma-separated (env ES_PUBSUB_PROJECT); with neither this nor --pubsub-project-number, any project",
    )
    p.add_argument(
        "--pubsub-project-number",
        action="append",
        default=None,
        help="the project number too (GKE cluster notifications carry it), repeatable or comma-separated "
        "(env ES_PUBSUB_PROJECT_NUMBER)",
    )
    _add(
        p,
        "--notice-lead-seconds",
        default=120.0,
        type=nonneg_float,
        help="drain a slice this long before an announced maintenance window starts: a step and a flush (default 120)",
    )
    _add(
        p,
        "--trainer-processes",
        default=1,
        type=nonneg_int,
        help="JAX processes of the trainer (env ES_TRAINER_PROCESSES). 1: one trainer process (Pathways, one host). "
        "N > 1: multi-controller JAX, one process per host joined by jax.distributed; each attaches with its "
        "process index, holds happen at one agreed step in every process, and a lost host ends the attempt "
        "with exit 42 (after a collective flush when the loss was announced) instead of shrinking (default 1)",
    )
    _add(
        p,
        "--admin-listen",
        default=f"127.0.0.1:{C.ADMIN_PORT}",
        type=listen_address,
        help=f"admin gRPC API (`elastic-sidecar admin`); 'none' turns it off (default 127.0.0.1:{C.ADMIN_PORT}). "
        "A non-loopback address needs --admin-token-file",
    )
    _add(
        p,
        "--admin-token-file",
        default=None,
        help="file holding the admin API's bearer token (a mounted Secret); none: admin calls are not authenticated",
    )
    _add(
        p,
        "--peer-token-file",
        default=None,
        help="file holding the token worker sidecars must present on Join; none: registrations are not authenticated",
    )
    _add(
        p,
        "--tls-cert-file",
        default=None,
        help="PEM certificate chain: serve the admin API over TLS (with --tls-key-file)",
    )
    _add(p, "--tls-key-file", default=None, help="PEM private key of --tls-cert-file")
    _add_http(p)


def _add_http(p: argparse.ArgumentParser, default: str | None = f"127.0.0.1:{C.HTTP_PORT}") -> None:
    _add(
        p,
        "--http-listen",
        default=default,
        type=listen_address,
        help=f"HTTP: /healthz /readyz /metrics /status and the status page (the manifests use 0.0.0.0:{C.HTTP_PORT}); "
        f"'none' turns it off (default {default or 'none'})",
    )


def add_worker_args(p: argparse.ArgumentParser) -> None:
    add_common(p)
    _add(p, "--coordinator", default=f"127.0.0.1:{C.COORDINATOR_PORT}", type=address, help="coordinator HOST:PORT")
    _add(
        p,
        "--slice",
        type=nonneg_int,
        required=_env("--slice", None) is None,
        help="this host's slice (JobSet job-index; env ES_SLICE)",
    )
    _add(p, "--host", type=nonneg_int, default=0, help="host index within the slice (JOB_COMPLETION_INDEX)")
    _add(p, "--node", default=os.environ.get("NODE_NAME", ""), help="Kubernetes node name (env ES_NODE or NODE_NAME)")
    _add(p, "--node-pool", default="", help="the node's GKE node pool (empty: see --node-pool-source)")
    _add(
        p,
        "--node-pool-source",
        default="none",
        choices=["none", "kubernetes"],
        help="where to learn the node pool when --node-pool is empty: kubernetes reads the node's "
        "cloud.google.com/gke-nodepool label through the Kubernetes API (RBAC: get nodes); default none",
    )
    _add(
        p,
        "--node-watch-seconds",
        default=30.0,
        type=nonneg_float,
        help="with --node-pool-source kubernetes: poll the node's GKE maintenance label and taints "
        "(cloud.google.com/scheduled-maintenance-time, impending-node-termination, maintenance-window-started) "
        "this often; 0 turns it off (default 30)",
    )
    _add(
        p,
        "--kubernetes-api",
        default=_in_cluster_api(),
        help="Kubernetes API base URL (default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)",
    )
    _add(
        p,
        "--kubernetes-token-file",
        default=SERVICE_ACCOUNT_DIR + "/token",
        help="bearer token for the Kubernetes API (default: the pod's service account token)",
    )
    _add(
        p,
        "--kubernetes-ca-file",
        default=SERVICE_ACCOUNT_DIR + "/ca.crt",
        help="CA bundle of the Kubernetes API (default: the pod's service account CA)",
    )
    _add(p, "--pod", default=os.environ.get("POD_NAME", ""), help="pod name, for operators")
    _add(
        p,
        "--health-target",
        default=None,
        type=listen_address,
        help="local Pathways worker to watch with grpc.health.v1 (HOST:PORT); none = always healthy",
    )
    _add(
        p,
        "--health-check",
        default="grpc",
        choices=["grpc", "tcp"],
        help="grpc: grpc.health.v1 Watch; tcp: a TCP connect (no health service served)",
    )
    _add(
        p,
        "--metadata-url",
        default=None,
        help="GCE metadata server base, e.g. http://metadata.google.internal/computeMetadata/v1 (none: not watched)",
    )
    _add(
        p,
        "--maintenance-notice-seconds",
        default=60.0,
        type=positive_float,
        help="notice a maintenance event gives before the host goes (default 60)",
    )
    _add(
        p,
        "--preemption-notice-seconds",
        default=30.0,
        type=positive_float,
        help="notice a preemption gives before the host goes (default 30)",
    )
    _add(
        p,
        "--peer-token-file",
        default=None,
        help="file holding the token to present to the coordinator on Join (the coordinator's --peer-token-file)",
    )
    # Off unless asked for: several worker sidecars often share one machine's loopback
    # (the demo, tests); the manifests turn it on for kubelet probes and Prometheus.
    _add_http(p, default=None)
    _add(
        p,
        "--admin-listen",
        default=None,
        type=listen_address,
        help="read-only admin gRPC API of this worker (GetStatus, WatchEvents; no token); default none: off",
    )


@dataclass(frozen=True)
class CoordinatorConfig:
    job: str
    listen: str
    policy: Policy
    heartbeat_interval: float
    heartbeat_timeout: float
    state_file: Path | None
    journal: Path | None
    log_format: str
    log_level: str
    trainer_listen: str = "127.0.0.1:0"
    """The trainer link; the command line defaults to 127.0.0.1:29313, a config built in code to a free port."""
    heartbeat_datagrams: bool = C.HEARTBEAT_DATAGRAMS
    """Offer workers UDP heartbeats on the --listen port (agent.sources.heartbeat_datagrams)."""
    first_heartbeat_timeout: float | None = None
    """How long a just-registered worker may stay silent after its reply (None: FIRST_HEARTBEAT_TIMEOUT_FACTOR
    heartbeat timeouts); see :attr:`first_heartbeat_seconds`."""
    gc_freeze: bool = True
    """Freeze the garbage collector's objects as workers register (agent.gc_freeze)."""
    trainer_token: BearerToken | None = None
    state_dir: Path | None = None
    journal_max_bytes: int = 16 * 1024 * 1024
    durability_bound: float = 2.0
    restart_attempt: int = 0
    pubsub_subscription: str | None = None
    cluster_name: str | None = None
    pubsub_project: tuple[str, ...] = ()
    """Project ids and numbers a notice may name (empty: any)."""
    admin_listen: str | None = None
    """Admin gRPC address; None: no admin API (the command line defaults to 127.0.0.1:29311)."""
    http_listen: str | None = None
    """HTTP address; None: no HTTP server (the command line defaults to 127.0.0.1:29312)."""
    admin_token: BearerToken | None = None
    peer_token: BearerToken | None = None
    tls_cert: bytes | None = field(default=None, repr=False)
    tls_key: bytes | None = field(default=None, repr=False)

    @property
    def first_heartbeat_seconds(self) -> float:
        """How long a just-registered worker may stay silent after its registration reply was written."""
        if self.first_heartbeat_timeout is not None:
            return max(self.first_heartbeat_timeout, self.heartbeat_timeout)
        return C.FIRST_HEARTBEAT_TIMEOUT_FACTOR * self.heartbeat_timeout

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> CoordinatorConfig:
        try:
            policy = Policy(
                num_slices=int(ns.num_slices),
                hosts_per_slice=int(ns.hosts_per_slice),
                elastic_min_slice_count=int(ns.elastic_min_slice_count),
                elastic_timeout_seconds=float(ns.elastic_timeout_seconds),
                elastic_max_retries=int(ns.elastic_max_retries),
                rejoin_grace_seconds=float(ns.rejoin_grace),
                flush_timeout_seconds=float(getattr(ns, "flush_timeout_seconds", 600.0)),
                settle_seconds=float(getattr(ns, "settle_seconds", 1.0)),
                notice_lead_seconds=float(getattr(ns, "notice_lead_seconds", 120.0)),
                trainer_processes=int(getattr(ns, "trainer_processes", 1) or 1),
            )
        except ValueError as e:
            raise ConfigError(str(e)) from e
        sub = getattr(ns, "pubsub_subscription", None)
        if sub and not (sub.startswith("projects/") and "/subscriptions/" in sub):
            raise ConfigError(f"--pubsub-subscription must look like projects/P/subscriptions/S, got {sub!r}")
        hb, hbt = float(ns.heartbeat_interval), float(ns.heartbeat_timeout)
        if hbt <= hb:
            raise ConfigError(f"--heartbeat-timeout ({hbt:g}) must be larger than --heartbeat-interval ({hb:g})")
        first_hbt = getattr(ns, "first_heartbeat_timeout", None)
        if first_hbt is not None and float(first_hbt) < hbt:
            raise ConfigError(
                f"--first-heartbeat-timeout ({float(first_hbt):g}) must not be shorter than --heartbeat-timeout "
                f"({hbt:g})"
            )
        admin_listen = getattr(ns, "admin_listen", None)
        admin_token = _token(ns, "admin_token_file")
        if admin_listen is not None and admin_token is None and not is_loopback(admin_listen):
            raise ConfigError(
                f"--admin-listen {admin_listen} is not a loopback address: give --admin-token-file too "
                "(and --tls-cert-file/--tls-key-file), or keep it on 127.0.0.1"
            )
        trainer_listen = getattr(ns, "trainer_listen", None) or f"127.0.0.1:{C.TRAINER_PORT}"
        trainer_token = _token(ns, "trainer_token_file")
        if trainer_token is None and not is_loopback(trainer_listen):
            raise ConfigError(
                f"--trainer-listen {trainer_listen} is not a loopback address: give --trainer-token-file too, or "
                "keep the trainer link on 127.0.0.1 (the trainer runs in the coordinator's pod)"
            )
        if trainer_listen == ns.listen:
            raise ConfigError(f"--trainer-listen and --listen are both {trainer_listen}: give them different ports")
        state_dir = Path(ns.state_dir) if getattr(ns, "state_dir", None) else None
        state_file = Path(ns.state_file) if ns.state_file else None
        journal = Path(ns.journal) if ns.journal else None
        if state_dir is not None:
            state_file = state_file or state_dir / "state.json"
            journal = journal or state_dir / "journal.jsonl"
        tls_cert, tls_key = _tls(ns)
        return cls(
            job=ns.job,
            listen=ns.listen,
            policy=policy,
            heartbeat_interval=hb,
            heartbeat_timeout=hbt,
            first_heartbeat_timeout=None if first_hbt is None else float(first_hbt),
            heartbeat_datagrams=bool(getattr(ns, "heartbeat_datagrams", True)),
            gc_freeze=bool(getattr(ns, "gc_freeze", True)),
            state_file=state_file,
            journal=journal,
            trainer_listen=trainer_listen,
            trainer_token=trainer_token,
            state_dir=state_dir,
            journal_max_bytes=int(getattr(ns, "journal_max_bytes", 16 * 1024 * 1024)),
            durability_bound=float(getattr(ns, "durability_bound", 2.0)),
            restart_attempt=int(getattr(ns, "restart_attempt", 0)),
            log_format=ns.log_format,
            log_level=ns.log_level,
            pubsub_subscription=sub or None,
            cluster_name=getattr(ns, "cluster_name", None),
            pubsub_project=project_list(getattr(ns, "pubsub_project", None), "--pubsub-project", digits=False)
            + project_list(getattr(ns, "pubsub_project_number", None), "--pubsub-project-number", digits=True),
            admin_listen=admin_listen,
            http_listen=getattr(ns, "http_listen", None),
            admin_token=admin_token,
            peer_token=_token(ns, "peer_token_file"),
            tls_cert=tls_cert,
            tls_key=tls_key,
        )


def _token(ns: argparse.Namespace, attr: str) -> BearerToken | None:
    path = getattr(ns, attr, None)
    if not path:
        return None
    from agent.auth import read_token_file

    return read_token_file(path, "--" + attr.replace("_", "-"))


def _tls(ns: argparse.Namespace) -> tuple[bytes | None, bytes | None]:
    cert, key = getattr(ns, "tls_cert_file", None), getattr(ns, "tls_key_file", None)
    if not cert and not key:
        return None, None
    if not cert or not key:
        given, missing = ("--tls-cert-file", "--tls-key-file") if cert else ("--tls-key-file", "--tls-cert-file")
        raise ConfigError(f"{given} needs {missing} too")
    out = []
    for flag, path, marker in (("--tls-cert-file", cert, b"CERTIFICATE"), ("--tls-key-file", key, b"PRIVATE KEY")):
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise ConfigError(f"{flag} {path}: cannot read it: {e.strerror or e}") from None
        if b"-----BEGIN" not in data or marker not in data:
            raise ConfigError(f"{flag} {path}: expected a PEM file with a {marker.decode()} block")
        out.append(data)
    return out[0], out[1]


@dataclass(frozen=True)
class WorkerConfig:
    job: str
    coordinator: str
    slice: int
    host: int
    node: str
    node_pool: str
    pod: str
    health_target: str | None
    health_check: str
    log_format: str
    log_level: str
    metadata_url: str | None = None
    maintenance_notice_seconds: float = 60.0
    preemption_notice_seconds: float = 30.0
    peer_token: BearerToken | None = None
    http_listen: str | None = None
    """HTTP address; None: no HTTP server (the command line defaults to 127.0.0.1:29312)."""
    admin_listen: str | None = None
    """Read-only admin gRPC address; None: off (the default)."""
    node_pool_source: str = "none"
    """Where to learn ``node_pool`` when it is empty: "none" or "kubernetes"."""
    kubernetes_api: str | None = None
    kubernetes_token_file: str | None = None
    kubernetes_ca_file: str | None = None
    node_watch_seconds: float = 30.0
    """How often to poll the node's maintenance label and taints (0: off)."""

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> WorkerConfig:
        source = getattr(ns, "node_pool_source", "none") or "none"
        api = getattr(ns, "kubernetes_api", None)
        if api and not api.startswith(("https://", "http://")):
            raise ConfigError(f"--kubernetes-api must be an http(s):// URL, got {api!r}")
        return cls(
            job=ns.job,
            coordinator=ns.coordinator,
            slice=int(ns.slice),
            host=int(ns.host),
            node=ns.node or f"host-{ns.slice}-{ns.host}",
            node_pool=ns.node_pool,
            pod=ns.pod,
            health_target=ns.health_target,
            health_check=ns.health_check,
            log_format=ns.log_format,
            log_level=ns.log_level,
            metadata_url=getattr(ns, "metadata_url", None),
            maintenance_notice_seconds=float(getattr(ns, "maintenance_notice_seconds", 60.0)),
            preemption_notice_seconds=float(getattr(ns, "preemption_notice_seconds", 30.0)),
            peer_token=_token(ns, "peer_token_file"),
            http_listen=getattr(ns, "http_listen", None),
            admin_listen=getattr(ns, "admin_listen", None),
            node_pool_source=source,
            kubernetes_api=api,
            kubernetes_token_file=getattr(ns, "kubernetes_token_file", None),
            kubernetes_ca_file=getattr(ns, "kubernetes_ca_file", None),
            node_watch_seconds=float(getattr(ns, "node_watch_seconds", 30.0)),
        )
