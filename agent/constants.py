"""Facts other modules share: ports, exit codes, label names, defaults.

One definition each, so the deploy manifests, the daemon and the tests cannot
drift apart. Ports avoid the ones Pathways and TPU hosts use on hostNetwork
(8080, 8471, 29000-29006, 50051: the ports in xpk's Pathways JobSets).
"""

from __future__ import annotations

# --- ports ---------------------------------------------------------------
COORDINATOR_PORT = 29310
"""Peer gRPC port of the coordinator sidecar (worker sidecars register here)."""
TRAINER_PORT = 29313
"""The trainer link's own listener (trainer hooks -> coordinator): loopback by default, a token when it is not."""
ADMIN_PORT = 29311
"""Admin gRPC port (loopback unless configured otherwise)."""
HTTP_PORT = 29312
"""/healthz, /readyz, /metrics, /status."""
PATHWAYS_RESERVED_PORTS = frozenset({8080, 8471, 29000, 29001, 29002, 29003, 29004, 29005, 29006, 50051})

# --- the wire format's number ranges -------------------------------------------
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
"""A protobuf int32 (protos/): slice and host indexes, slice and retry counts. Kubernetes' int32
fields (JobSet's failurePolicy.maxRestarts) have the same range."""
INT64_MAX = 2**63 - 1
"""A protobuf int64: steps (``TrainerHello.total_steps``), generations."""

# --- exit codes ------------------------------------------------------------
EXIT_OK = 0
EXIT_USAGE = 2
EXIT_ABORTED = 3
"""An operator aborted the job without asking for a restart."""
EXIT_RESTART = 42
"""xpk restarts a workload that exits 42 (and 127-255); other codes fail the JobSet."""

# --- exit codes of `elastic-sidecar admin` -----------------------------------
ADMIN_EXIT_OK = 0
ADMIN_EXIT_REFUSED = 1
"""The job refused the command (FAILED_PRECONDITION), or another server-side error."""
ADMIN_EXIT_USAGE = 2
"""Bad command line, unreadable token file, or INVALID_ARGUMENT from the server."""
ADMIN_EXIT_UNAUTHENTICATED = 3
ADMIN_EXIT_UNAVAILABLE = 4
"""Nothing answered at the address, or the deadline passed (UNAVAILABLE, DEADLINE_EXCEEDED)."""
ADMIN_EXIT_INTERRUPTED = 130
"""``status --watch`` stopped by Ctrl-C (128 + SIGINT, as a shell reports it)."""

# --- JobSet / GKE labels (read through the downward API) -------------------
LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
LABEL_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
LABEL_RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
LABEL_NODE_POOL = "cloud.google.com/gke-nodepool"

COMMAND_ORDER = {"hold": 0, "resume": 1, "abort": 2, "completed": 2}
"""The order of one generation's worker commands (PeerCommand.kind): its hold, then its
resume, then an abort or the end (agent.core.decide)."""
COMMAND_ACK_SECONDS = 1.0
"""How long the coordinator waits for a worker to acknowledge a command datagram before it
sends the command on the worker's stream as well."""

# --- liveness defaults -------------------------------------------------------
HEARTBEAT_INTERVAL_SECONDS = 0.25
HEARTBEAT_TIMEOUT_SECONDS = 1.2
"""A worker silent for this long is lost (a hung host: SIGSTOP)."""
FIRST_HEARTBEAT_TIMEOUT_FACTOR = 3.0
"""A worker that has just registered may stay silent this many heartbeat timeouts after its
registration reply was written (``--first-heartbeat-timeout``, default 3 x 1.2 s), then the usual
timeout applies from its first message. It cannot heartbeat before it has read the reply, and the
coordinator cannot see when that was: in a storm of re-registrations after a coordinator restart
(19,000 workers, bench/scale.py) replies reached workers 1.25 s and more after the coordinator wrote
them, and those healthy hosts were judged lost. Kubernetes' node controller keeps the same
distinction (``--node-startup-grace-period`` beside ``--node-monitor-grace-period``,
kubernetes.io/docs/reference/command-line-tools-reference/kube-controller-manager/)."""
HEARTBEAT_DATAGRAMS = True
"""The coordinator offers UDP heartbeats (--heartbeat-datagrams; agent/sources/heartbeat_datagrams.py)."""
KEEPALIVE_TIME_MS = 500
KEEPALIVE_TIMEOUT_MS = 1000
"""Fast transport keepalive, for the few channels whose hang must be seen in
about a second (health watches of the local Pathways worker, the trainer link).
Keepalive time, keepalive timeout and http2 ping timeout are set together
(FACTS section 6)."""

GRPC_KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)

PEER_KEEPALIVE_TIME_MS = 5000
PEER_KEEPALIVE_TIMEOUT_MS = 2000
"""Worker <-> coordinator streams: the coordinator sees a hung worker through the
missed heartbeat deadline and a killed one through the closed stream, so the
transport keepalive only has to find dead connections eventually. At 0.5 s,
pings in both directions cost the coordinator most of its CPU at 10,000
workers (docs/benchmarks.md)."""

PEER_KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", PEER_KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", PEER_KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.ping_timeout_ms", PEER_KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
MAX_MESSAGE_BYTES = 256 * 1024
"""The largest message any of the daemon's gRPC servers accepts (peer, trainer link, admin). Their
messages are registrations, reports, steps, error texts and commands: a few KiB at most. A larger
one is refused with RESOURCE_EXHAUSTED by gRPC itself (``grpc.max_receive_message_length``), before
it is parsed, logged or journaled."""
GRPC_SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    # grpcio sets SO_REUSEPORT on server ports by default, so a second process could bind a port
    # this one holds and take half its connections (FACTS section 6): a held port must fail to bind.
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
"""Options every gRPC server of the daemon is built with."""

GRPC_SERVER_KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    *GRPC_SERVER_OPTIONS,
    *PEER_KEEPALIVE_OPTIONS,
    # Clients with the fast keepalive (the trainer link) may ping this often.
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.min_time_between_pings_ms", KEEPALIVE_TIME_MS // 2),
)
PEER_SERVER_KEEPALIVE_TIME_MS = 30000
"""The coordinator's own pings on worker connections. It judges workers by their heartbeats
(a hung one in HEARTBEAT_TIMEOUT_SECONDS, a killed one by its closed connection) and ends the
stream of a silent one itself, so its pings only clear away connections whose host vanished.
Every 5 s they were 2,000 pings a second at 10,000 workers, on top of the workers' own
(which stay at PEER_KEEPALIVE_TIME_MS: that is how a worker finds a vanished coordinator)."""
PEER_SERVER_KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = tuple(
    (k, PEER_SERVER_KEEPALIVE_TIME_MS if k == "grpc.keepalive_time_ms" else v) for k, v in GRPC_SERVER_KEEPALIVE_OPTIONS
)

# --- `elastic-sidecar drill` ---------------------------------------------------
DRILL_EXIT_HELD = 0
"""The job held its state through the pod's loss: at most one lost step, no JobSet restart."""
DRILL_EXIT_LOST = 1
"""It did not (steps lost, a JobSet restart, the job failed), or the drill timed out: see the verdict."""
DRILL_EXIT_USAGE = 2
"""Bad usage, or the drill could not start; nothing was deleted."""
LABEL_REPLICATED_JOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
LABEL_JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
"""An Indexed Job's pod index (label and annotation; Kubernetes >= 1.28 for the label)."""
JOBSET_API = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
"""The JobSet CRD's group, version and plural (kubernetes-sigs/jobset); ``status.restarts`` counts
the JobSet's whole-job restarts."""

# --- libtpu's runtime metrics (agent/sources/tpu_metrics.py) -------------------------------
LIBTPU_METRICS_TARGET = "localhost:8431"
"""libtpu's ``RuntimeMetricService``, served to the processes in the pod (tpu-info's default
address; a multi-slice job may move it with ``TPU_RUNTIME_METRICS_PORTS``)."""
LIBTPU_METRICS_DEADLINE_SECONDS = 2.0
"""How long one read of a metric may take before the source reports blind for that read."""
STRAGGLER_WINDOW_SECONDS = 60.0
"""A worker's metrics window (--straggler-window-seconds): tens of steps of a large model (a 70B step
takes seconds), so a window's median is not one step's noise, and the detector's 3 of 5 windows
call a straggler within minutes of a slowdown that would otherwise last hours (docs/stragglers.md)."""
