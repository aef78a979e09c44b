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
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import constants as C
from agent.core.model import Policy
from agent.errors import ConfigError as ConfigError  # re-exported: callers catch agent.config.ConfigError
from agent.stragglers.cost import DEFAULT_COST, CostParams
from agent.stragglers.detect import DEFAULT_THRESHOLDS, Thresholds

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


def number(lo: float, hi: float, what: str = "number") -> Callable[[str], float]:
    """An argparse type: a finite ``what`` from ``lo`` to ``hi``, both included (NaN fails every bound)."""

    def conv(value: str) -> float:
        try:
            f = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {what}, got {value!r}") from None
        if not (math.isfinite(f) and lo <= f <= hi):
            raise argparse.ArgumentTypeError(f"expected a finite {what} from {lo:g} to {hi:g}, got {value!r}")
        return f

    conv.__name__ = what
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


@dataclass(frozen=True)
class Flag:
    """One daemon flag: argparse is built from it, and so is docs/flags.md (:func:`flags_markdown`).

    Its environment variable is ``ES_<NAME>``; a value set there becomes the flag's default.
    """

    name: str
    help: str | None = None
    default: object = None
    type: Callable[[str], object] | None = None
    choices: tuple[str, ...] | None = None
    required: bool = False
    """Required unless its environment variable is set."""
    repeated: bool = False
    """Repeatable (``action="append"``); its environment variable is read by :func:`project_list`."""
    default_at_start: Callable[[], object] | None = None
    """A default read from the pod's environment when the parser is built."""
    shown_default: str | None = None
    """How docs/flags.md shows a default that is not a plain value."""

    @property
    def env(self) -> str:
        return "ES_" + self.name.lstrip("-").replace("-", "_").upper()

    def add_to(self, p: argparse.ArgumentParser) -> None:
        if self.repeated:
            p.add_argument(self.name, action="append", default=None, help=self.help)
            return
        env = os.environ.get(self.env)
        default = self.default_at_start() if self.default_at_start else self.default
        kw: dict[str, object] = {"help": self.help}
        if self.choices:
            kw["choices"] = list(self.choices)
        if self.type is not None:
            # argparse converts a string default with the flag's type and reports a bad one as the
            # flag's error (exit 2): say that the value came from the environment.
            kw["type"] = self.type if env is None else _from_env(self.type, env, self.env)
        if self.required:
            kw["required"] = env is None
        p.add_argument(self.name, default=env if env is not None else default, **kw)  # type: ignore[arg-type]


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


def seconds_or_none(value: str) -> float | None:
    """An argparse type: "none", or seconds as :func:`seconds` takes them (0 or more)."""
    if value.strip().lower() == "none":
        return None
    return nonneg_float(value)


seconds_or_none.__name__ = "seconds or none"

_STRAGGLER_HELP = {
    "lateness_min": "a slice stands out when it waits at the cross-slice collective this share of the step "
    "less than the others' median",
    "slowdown_min": "the step must run this much over the job's own baseline to corroborate a lateness",
    "windows": "counted windows remembered per slice (the n of k-of-n)",
    "enter_hits": "a slice becomes a straggler when it stood out in this many of the last --straggler-windows",
    "leave_hits": "a straggler recovers when it stood out in at most this many (hysteresis)",
    "baseline_windows": "normal windows whose median step time is the baseline",
    "baseline_min": "normal windows needed before any slowdown is judged",
    "throttle_score_min": "with two slices, a tpu_throttle_score above this is a late slice's second signal",
    "horizon_cap_seconds": "keeping a straggler is costed over the time left or this, whichever is less",
    "margin": "drain only when keeping costs this many times what draining costs",
    "drain_interval_seconds": "at most one straggler drain in this long unless an operator asks",
}


def _straggler_flags() -> tuple[Flag, ...]:
    """One flag per field of the detector's Thresholds and the decision's CostParams, with their defaults."""
    out = []
    for params in (DEFAULT_THRESHOLDS, DEFAULT_COST):
        for f in fields(params):
            v = getattr(params, f.name)
            kind = whole(0) if isinstance(v, int) else number(0.0, SECONDS_MAX)
            what = _STRAGGLER_HELP[f.name]
            out.append(Flag(f"--straggler-{f.name.replace('_', '-')}", f"{what} (default {v:g})", v, kind))
    return tuple(out)


STRAGGLER_FLAGS: tuple[Flag, ...] = (
    Flag(
        "--straggler-detect",
        "on (default): judge each slice's lateness from the workers' libtpu metrics windows and drain a "
        "straggler when that costs less than keeping it (docs/stragglers.md); a job whose workers are blind "
        "never acts. off: windows are ignored",
        "on",
        on_off,
    ),
    *_straggler_flags(),
    Flag(
        "--straggler-replacement-seconds",
        "expected seconds until a drained straggler's slice is replaced (an operator's undrain, a node "
        "change); none (default): no replacement expected, so a drain must pay on one slice fewer for the "
        "rest of the horizon",
        "none",
        seconds_or_none,
        shown_default="none",
    ),
    Flag(
        "--straggler-replace",
        "on: once the job runs without a straggler it drained, cordon that slice's nodes and delete its pods "
        "so that the JobSet recreates them elsewhere; needs the kubernetes package, RBAC to patch nodes and "
        "delete pods (deploy/components/straggler-replace) and the Kubernetes API (--kubeconfig). off "
        "(default): the slice waits drained until an operator undrains it or a new host registers for it",
        "off",
        on_off,
    ),
    Flag(
        "--kubeconfig",
        "with --straggler-replace: the kubeconfig file to reach the Kubernetes API with (its current context's "
        "namespace); default: the pod's service account (in-cluster)",
        shown_default="in-cluster",
    ),
)

COMMON_FLAGS: tuple[Flag, ...] = (
    Flag("--job", "JobSet name; peers of another job are refused (env ES_JOB)", "elastic-job"),
    Flag("--log-format", "json: Cloud Logging lines (default)", "json", choices=("json", "console")),
    Flag("--log-level", None, "info", choices=("debug", "info", "warning", "error")),
)


def _http_listen(default: str | None) -> Flag:
    return Flag(
        "--http-listen",
        f"HTTP: /healthz /readyz /metrics /status and the status page (the manifests use 0.0.0.0:{C.HTTP_PORT}); "
        f"'none' turns it off (default {default or 'none'})",
        default,
        listen_address,
    )


COORDINATOR_FLAGS: tuple[Flag, ...] = (
    *COMMON_FLAGS,
    Flag(
        "--listen",
        f"peer gRPC address: worker sidecars register here (default 127.0.0.1:{C.COORDINATOR_PORT}; "
        f"the manifests use 0.0.0.0:{C.COORDINATOR_PORT} with --peer-token-file)",
        f"127.0.0.1:{C.COORDINATOR_PORT}",
        address,
    ),
    Flag(
        "--trainer-listen",
        f"gRPC address of the trainer link (default 127.0.0.1:{C.TRAINER_PORT}: the trainer runs in the same "
        "pod). A non-loopback address needs --trainer-token-file",
        f"127.0.0.1:{C.TRAINER_PORT}",
        address,
    ),
    Flag(
        "--trainer-token-file",
        "file holding the token the trainer hooks must present (they read ELASTIC_SIDECAR_TOKEN_FILE); "
        "none: the trainer link is not authenticated, so it must stay on loopback",
    ),
    Flag("--num-slices", "slices in the job", type=whole(1), required=True),
    Flag("--hosts-per-slice", "TPU hosts (worker sidecars) per slice", 1, whole(1)),
    Flag(
        "--elastic-min-slice-count",
        "MaxText's flag: -1 waits for all slices, k continues on >= k (default -1)",
        -1,
        whole(-1),
    ),
    Flag(
        "--elastic-timeout-seconds",
        "MaxText's flag: longest wait for enough slices (default 300)",
        300.0,
        positive_float,
    ),
    Flag(
        "--elastic-max-retries",
        "MaxText's flag, read by its name: recoveries from failures allowed (N + 1 attempts; default 10)",
        10,
        whole(1),
    ),
    Flag(
        "--heartbeat-interval",
        f"seconds between worker heartbeats (default {C.HEARTBEAT_INTERVAL_SECONDS})",
        C.HEARTBEAT_INTERVAL_SECONDS,
        positive_float,
    ),
    Flag(
        "--heartbeat-timeout",
        f"a worker silent this long is lost (default {C.HEARTBEAT_TIMEOUT_SECONDS})",
        C.HEARTBEAT_TIMEOUT_SECONDS,
        positive_float,
    ),
    Flag(
        "--first-heartbeat-timeout",
        "a worker that has just registered may stay silent this long after the coordinator wrote its "
        "registration reply before it is lost; from its first message on, --heartbeat-timeout applies "
        f"(default {C.FIRST_HEARTBEAT_TIMEOUT_FACTOR:g} x --heartbeat-timeout: a reply can take over a second "
        "to reach a worker while thousands re-register after a coordinator restart)",
        type=positive_float,
        shown_default=f"{C.FIRST_HEARTBEAT_TIMEOUT_FACTOR:g} x --heartbeat-timeout",
    ),
    Flag(
        "--heartbeat-datagrams",
        "on (default): workers send heartbeats as UDP datagrams to the --listen port, which costs the "
        "coordinator far less CPU than stream messages; a worker whose datagrams do not arrive keeps "
        "heartbeating on its stream. off: heartbeats only on the streams",
        "on" if C.HEARTBEAT_DATAGRAMS else "off",
        on_off,
    ),
    Flag(
        "--gc-freeze",
        "on (default): every 256 registrations, the coordinator freezes Python's garbage collector's "
        "objects (gc.freeze) so that its registered workers are not walked by every full collection (without "
        "it, stalls of up to 1.5 s while 19,000 workers register after a restart); once a quarter of the "
        "frozen workers have left and streams stopped ending for 5 s, it unfreezes, collects once and "
        "freezes again. off: the collector as Python has it",
        "on",
        on_off,
    ),
    Flag(
        "--rejoin-grace",
        "after a coordinator restart, seconds known hosts get to re-register (default 10), counted again "
        "from each host that re-registers while they keep coming back: a host is judged lost only this long "
        "after the restart and after the newest re-registration",
        10.0,
        positive_float,
    ),
    Flag(
        "--state-dir",
        "where the coordinator keeps what must survive its restart: state.json (written before any action "
        "of a decision runs), journal.jsonl and a lock that keeps a second coordinator out (default: none)",
        type=Path,
    ),
    Flag("--state-file", "the state file alone, outside --state-dir", type=Path),
    Flag("--journal", "append every decision as a JSON line here", type=Path),
    Flag(
        "--journal-max-bytes",
        "rotate the journal to journal.jsonl.1 past this size, keeping one old file (default 16 MiB)",
        16 * 1024 * 1024,
        whole(0, C.INT64_MAX),
    ),
    Flag(
        "--durability-bound",
        "seconds a decision waits for its state write to succeed before it is carried out from memory "
        "anyway, flagged not durable (default 2)",
        2.0,
        positive_float,
    ),
    Flag(
        "--restart-attempt",
        "the JobSet restart attempt (label jobset.sigs.k8s.io/restart-attempt, env ES_RESTART_ATTEMPT): a "
        "state file from an earlier attempt does not make this one failed (default 0)",
        0,
        nonneg_int,
    ),
    Flag(
        "--flush-timeout-seconds",
        "how long a flush may take; a hold that flushes is acknowledged within elastic_timeout_seconds plus "
        "this (default 600)",
        600.0,
        positive_float,
    ),
    Flag(
        "--settle-seconds",
        "a lost slice's replacement counts once it has stayed registered and healthy this long (default 1)",
        1.0,
        nonneg_float,
    ),
    Flag(
        "--pubsub-subscription",
        "projects/P/subscriptions/S to pull GKE and Cloud Logging notices from (none: no Pub/Sub intake)",
    ),
    Flag("--cluster-name", "only GKE notices for this cluster count (default: any)"),
    Flag(
        "--pubsub-project",
        "only notices for these projects count: a project id (GCE log entries carry it), repeatable or "
        "comma-separated (env ES_PUBSUB_PROJECT); with neither this nor --pubsub-project-number, any project",
        repeated=True,
    ),
    Flag(
        "--pubsub-project-number",
        "the project number too (GKE cluster notifications carry it), repeatable or comma-separated "
        "(env ES_PUBSUB_PROJECT_NUMBER)",
        repeated=True,
    ),
    Flag(
        "--notice-lead-seconds",
        "drain a slice this long before an announced maintenance window starts: a step and a flush (default 120)",
        120.0,
        nonneg_float,
    ),
    Flag(
        "--trainer-processes",
        "JAX processes of the trainer (env ES_TRAINER_PROCESSES). 1: one trainer process (Pathways, one host). "
        "N > 1: multi-controller JAX, one process per host joined by jax.distributed; each attaches with its "
        "process index, holds happen at one agreed step in every process, and a lost host ends the attempt "
        "with exit 42 (after a collective flush when the loss was announced) instead of shrinking (default 1)",
        1,
        nonneg_int,
    ),
    Flag(
        "--admin-listen",
        f"admin gRPC API (`elastic-sidecar admin`); 'none' turns it off (default 127.0.0.1:{C.ADMIN_PORT}). "
        "A non-loopback address needs --admin-token-file",
        f"127.0.0.1:{C.ADMIN_PORT}",
        listen_address,
    ),
    Flag(
        "--admin-token-file",
        "file holding the admin API's bearer token (a mounted Secret); none: admin calls are not authenticated",
    ),
    Flag(
        "--peer-token-file",
        "file holding the token worker sidecars must present on Join; none: registrations are not authenticated (a --listen beyond loopback then warns at start)",
    ),
    Flag("--tls-cert-file", "PEM certificate chain: serve the admin API over TLS (with --tls-key-file)"),
    Flag("--tls-key-file", "PEM private key of --tls-cert-file"),
    _http_listen(f"127.0.0.1:{C.HTTP_PORT}"),
    *STRAGGLER_FLAGS,
)

WORKER_FLAGS: tuple[Flag, ...] = (
    *COMMON_FLAGS,
    Flag("--coordinator", "coordinator HOST:PORT", f"127.0.0.1:{C.COORDINATOR_PORT}", address),
    Flag("--slice", "this host's slice (JobSet job-index; env ES_SLICE)", type=nonneg_int, required=True),
    Flag("--host", "host index within the slice (JOB_COMPLETION_INDEX)", 0, nonneg_int),
    Flag(
        "--node",
        "Kubernetes node name (env ES_NODE or NODE_NAME)",
        default_at_start=lambda: os.environ.get("NODE_NAME", ""),
        shown_default="$NODE_NAME",
    ),
    Flag("--node-pool", "the node's GKE node pool (empty: see --node-pool-source)", ""),
    Flag(
        "--node-pool-source",
        "where to learn the node pool when --node-pool is empty: kubernetes reads the node's "
        "cloud.google.com/gke-nodepool label through the Kubernetes API (RBAC: get nodes); default none",
        "none",
        choices=("none", "kubernetes"),
    ),
    Flag(
        "--node-watch-seconds",
        "with --node-pool-source kubernetes: poll the node's GKE maintenance label and taints "
        "(cloud.google.com/scheduled-maintenance-time, impending-node-termination, maintenance-window-started) "
        "this often; 0 turns it off (default 30)",
        30.0,
        nonneg_float,
    ),
    Flag(
        "--kubernetes-api",
        "Kubernetes API base URL (default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)",
        default_at_start=_in_cluster_api,
        shown_default="https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT",
    ),
    Flag(
        "--kubernetes-token-file",
        "bearer token for the Kubernetes API (default: the pod's service account token)",
        SERVICE_ACCOUNT_DIR + "/token",
    ),
    Flag(
        "--kubernetes-ca-file",
        "CA bundle of the Kubernetes API (default: the pod's service account CA)",
        SERVICE_ACCOUNT_DIR + "/ca.crt",
    ),
    Flag(
        "--pod",
        "pod name, for operators",
        default_at_start=lambda: os.environ.get("POD_NAME", ""),
        shown_default="$POD_NAME",
    ),
    Flag(
        "--health-target",
        "local Pathways worker to watch with grpc.health.v1 (HOST:PORT); none = always healthy",
        type=listen_address,
    ),
    Flag(
        "--health-check",
        "grpc: grpc.health.v1 Watch; tcp: a TCP connect (no health service served)",
        "grpc",
        choices=("grpc", "tcp"),
    ),
    Flag(
        "--metadata-url",
        "GCE metadata server base, e.g. http://metadata.google.internal/computeMetadata/v1 (none: not watched)",
    ),
    Flag(
        "--maintenance-notice-seconds",
        "notice a maintenance event gives before the host goes (default 60)",
        60.0,
        positive_float,
    ),
    Flag(
        "--preemption-notice-seconds",
        "notice a preemption gives before the host goes (default 30)",
        30.0,
        positive_float,
    ),
    Flag(
        "--peer-token-file",
        "file holding the token to present to the coordinator on Join (the coordinator's --peer-token-file)",
    ),
    # Off unless asked for: several worker sidecars often share one machine's loopback
    # (the demo, tests); the manifests turn it on for kubelet probes and Prometheus.
    _http_listen(None),
    Flag(
        "--admin-listen",
        "read-only admin gRPC API of this worker (GetStatus, WatchEvents; no token); default none: off",
        type=listen_address,
    ),
    Flag(
        "--tpu-metrics",
        "where this host's libtpu runtime metrics are read for straggler detection: service (default) is "
        "libtpu's RuntimeMetricService at --tpu-metrics-target, sdk is libtpu.sdk.tpumonitoring in this "
        "process, off sends nothing. A source that cannot read reports blind, never healthy",
        "service",
        choices=("service", "sdk", "off"),
    ),
    Flag(
        "--tpu-metrics-target",
        f"libtpu's RuntimeMetricService HOST:PORT (default {C.LIBTPU_METRICS_TARGET})",
        C.LIBTPU_METRICS_TARGET,
        address,
    ),
    Flag(
        "--straggler-window-seconds",
        "report one metrics window to the coordinator this often (default 60: tens of steps of a large "
        "model per window, docs/stragglers.md)",
        C.STRAGGLER_WINDOW_SECONDS,
        positive_float,
    ),
)


def add_flags(p: argparse.ArgumentParser, flags: tuple[Flag, ...]) -> None:
    for flag in flags:
        flag.add_to(p)


def add_coordinator_args(p: argparse.ArgumentParser) -> None:
    add_flags(p, COORDINATOR_FLAGS)


def add_worker_args(p: argparse.ArgumentParser) -> None:
    add_flags(p, WORKER_FLAGS)


def _shown_default(flag: Flag) -> str:
    if flag.shown_default is not None:
        return flag.shown_default
    if flag.default is None or flag.default == "":
        return "none"
    if isinstance(flag.default, float) and flag.default.is_integer():
        return str(int(flag.default))
    return str(flag.default)


def flags_markdown() -> str:
    """docs/flags.md: every flag of both roles with its environment variable and default."""
    out = [
        "# Flags of the two daemon roles",
        "",
        "Generated from the flag table in `agent/config.py` (`python -m agent.config > docs/flags.md`);",
        "a test checks that this file matches it. A flag on the command line wins over its `ES_` variable.",
    ]
    for role, flags in (("coordinator", COORDINATOR_FLAGS), ("worker", WORKER_FLAGS)):
        out += ["", f"## `elastic-sidecar {role}`", "", "| flag | env | default | what |", "| --- | --- | --- | --- |"]
        for f in flags:
            what = f.help or ""
            if f.choices:
                what = f"{what} (one of: {', '.join(f.choices)})".lstrip()
            cell = what.replace("|", "\\|")
            default = "required" if f.required else f"`{_shown_default(f)}`"
            out.append(f"| `{f.name}` | `{f.env}` | {default} | {cell} |")
    return "\n".join(out) + "\n"


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
    straggler_detect: bool = True
    straggler_thresholds: Thresholds = DEFAULT_THRESHOLDS
    straggler_cost: CostParams = DEFAULT_COST
    straggler_replacement_seconds: float | None = None
    kubeconfig: Path | None = None
    """With ``policy.straggler_replace``: the kubeconfig to reach the Kubernetes API with (None: in-cluster)."""

    @property
    def first_heartbeat_seconds(self) -> float:
        """How long a just-registered worker may stay silent after its registration reply was written."""
        if self.first_heartbeat_timeout is not None:
            return max(self.first_heartbeat_timeout, self.heartbeat_timeout)
        return C.FIRST_HEARTBEAT_TIMEOUT_FACTOR * self.heartbeat_timeout

    def warnings(self) -> list[str]:
        """What this configuration allows that it runs with but an operator should hear of at start."""
        found = []
        if self.peer_token is None and not is_loopback(self.listen):
            # The peer server checks a bearer token only when one is configured: without it, whatever
            # reaches the port may register as a worker and report its slice down.
            found.append(
                f"--listen {self.listen} is not a loopback address and no --peer-token-file is given: any process "
                "that reaches this port can register as a worker and report slices down (the manifests give "
                "--peer-token-file)"
            )
        return found

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> CoordinatorConfig:
        policy = _policy(ns)
        sub = getattr(ns, "pubsub_subscription", None)
        if sub and not (sub.startswith("projects/") and "/subscriptions/" in sub):
            raise ConfigError(f"--pubsub-subscription must look like projects/P/subscriptions/S, got {sub!r}")
        hb, hbt, first_hbt = _heartbeats(ns)
        admin_listen, admin_token = _admin_listener(ns)
        trainer_listen, trainer_token = _trainer_listener(ns)
        state_dir, state_file, journal = _state_paths(ns)
        tls_cert, tls_key = _tls(ns)
        return cls(
            job=ns.job,
            listen=ns.listen,
            policy=policy,
            heartbeat_interval=hb,
            heartbeat_timeout=hbt,
            first_heartbeat_timeout=first_hbt,
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
            **_stragglers(ns),
        )


def _stragglers(ns: argparse.Namespace) -> dict[str, Any]:
    """The straggler detector's settings, each checked as Thresholds and CostParams check them."""

    def take(params: Any) -> dict[str, Any]:
        return {f.name: getattr(ns, "straggler_" + f.name, getattr(params, f.name)) for f in fields(params)}

    try:
        thresholds = Thresholds(**take(DEFAULT_THRESHOLDS))
        cost = CostParams(**take(DEFAULT_COST))
    except ValueError as e:
        raise ConfigError(f"--straggler-*: {e}") from e
    return {
        "straggler_detect": bool(getattr(ns, "straggler_detect", True)),
        "straggler_thresholds": thresholds,
        "straggler_cost": cost,
        "straggler_replacement_seconds": getattr(ns, "straggler_replacement_seconds", None),
        "kubeconfig": _replace_api(ns),
    }


def _replace_api(ns: argparse.Namespace) -> Path | None:
    """--kubeconfig, checked when --straggler-replace is on: the client is there, the API can be found."""
    kubeconfig = getattr(ns, "kubeconfig", None)
    path = Path(kubeconfig) if kubeconfig else None
    if not getattr(ns, "straggler_replace", False):
        return path
    import importlib.util

    if importlib.util.find_spec("kubernetes") is None:
        raise ConfigError(
            "--straggler-replace on needs the kubernetes package: pip install 'elastic-sidecar[drill]' (or kubernetes)"
        )
    if path is None:
        if not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise ConfigError(
                "--straggler-replace on: not in a cluster (KUBERNETES_SERVICE_HOST is unset): give --kubeconfig PATH"
            )
    elif not path.is_file():
        raise ConfigError(f"--kubeconfig {kubeconfig!r}: no such file")
    return path


def _policy(ns: argparse.Namespace) -> Policy:
    try:
        return Policy(
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
            straggler_drain_interval_seconds=float(getattr(ns, "straggler_drain_interval_seconds", 3600.0)),
            straggler_replace=bool(getattr(ns, "straggler_replace", False)),
        )
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _heartbeats(ns: argparse.Namespace) -> tuple[float, float, float | None]:
    """The heartbeat interval, timeout and first-heartbeat timeout, each checked against the others."""
    hb, hbt = float(ns.heartbeat_interval), float(ns.heartbeat_timeout)
    if hbt <= hb:
        raise ConfigError(f"--heartbeat-timeout ({hbt:g}) must be larger than --heartbeat-interval ({hb:g})")
    first_hbt = getattr(ns, "first_heartbeat_timeout", None)
    if first_hbt is not None and float(first_hbt) < hbt:
        raise ConfigError(
            f"--first-heartbeat-timeout ({float(first_hbt):g}) must not be shorter than --heartbeat-timeout ({hbt:g})"
        )
    return hb, hbt, None if first_hbt is None else float(first_hbt)


def _admin_listener(ns: argparse.Namespace) -> tuple[str | None, BearerToken | None]:
    admin_listen = getattr(ns, "admin_listen", None)
    admin_token = _token(ns, "admin_token_file")
    if admin_listen is not None and admin_token is None and not is_loopback(admin_listen):
        raise ConfigError(
            f"--admin-listen {admin_listen} is not a loopback address: give --admin-token-file too "
            "(and --tls-cert-file/--tls-key-file), or keep it on 127.0.0.1"
        )
    return admin_listen, admin_token


def _trainer_listener(ns: argparse.Namespace) -> tuple[str, BearerToken | None]:
    trainer_listen = getattr(ns, "trainer_listen", None) or f"127.0.0.1:{C.TRAINER_PORT}"
    trainer_token = _token(ns, "trainer_token_file")
    if trainer_token is None and not is_loopback(trainer_listen):
        raise ConfigError(
            f"--trainer-listen {trainer_listen} is not a loopback address: give --trainer-token-file too, or "
            "keep the trainer link on 127.0.0.1 (the trainer runs in the coordinator's pod)"
        )
    if trainer_listen == ns.listen:
        raise ConfigError(f"--trainer-listen and --listen are both {trainer_listen}: give them different ports")
    return trainer_listen, trainer_token


def _state_paths(ns: argparse.Namespace) -> tuple[Path | None, Path | None, Path | None]:
    """--state-dir, and the state file and journal: given alone, or inside --state-dir."""
    state_dir = Path(ns.state_dir) if getattr(ns, "state_dir", None) else None
    state_file = Path(ns.state_file) if ns.state_file else None
    journal = Path(ns.journal) if ns.journal else None
    if state_dir is not None:
        state_file = state_file or state_dir / "state.json"
        journal = journal or state_dir / "journal.jsonl"
    return state_dir, state_file, journal


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
    tpu_metrics: str = "service"
    """Where the host's libtpu metrics are read: "service", "sdk" or "off" (agent.sources.tpu_metrics)."""
    tpu_metrics_target: str = C.LIBTPU_METRICS_TARGET
    straggler_window_seconds: float = C.STRAGGLER_WINDOW_SECONDS

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
            tpu_metrics=getattr(ns, "tpu_metrics", "service"),
            tpu_metrics_target=getattr(ns, "tpu_metrics_target", C.LIBTPU_METRICS_TARGET),
            straggler_window_seconds=float(getattr(ns, "straggler_window_seconds", C.STRAGGLER_WINDOW_SECONDS)),
        )


if __name__ == "__main__":
    print(flags_markdown(), end="")
