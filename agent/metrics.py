"""Prometheus metrics of a sidecar, named by Prometheus conventions.

One prefix (``elastic_sidecar_``), base units (``_seconds``, ``_bytes``),
counters end in ``_total``, and no high-cardinality labels: slices, hosts and
nodes are never labels. Each sidecar process has its own registry, served on
``/metrics`` by :mod:`agent.servers.http`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agent.core.model import (
    Decision,
    Event,
    HoldTrainer,
    NodeNotice,
    Phase,
    ResumeTrainer,
    State,
    StragglerVerdict,
    TrainerFlushed,
    TrainerHeld,
    TrainerResumed,
    TrainerStepped,
    WorkerLost,
)

# A `_created` series per counter and histogram doubles the series count and tells
# a dashboard nothing it needs: turn them off for every registry of the process.
prometheus_client.disable_created_metrics()

PREFIX = "elastic_sidecar"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


class ServerMetrics:
    """What both roles export about their own servers: up, admin calls, refused calls."""

    def __init__(self, role: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.role = role
        self.up = Gauge(f"{PREFIX}_up", "1 while this sidecar runs", ["role"], registry=r)
        self.up.labels(role).set(1)
        self.admin_requests = Counter(
            f"{PREFIX}_admin_requests_total",
            "Admin API calls by method and status code",
            ["method", "code"],
            registry=r,
        )
        self.auth_failures = Counter(
            f"{PREFIX}_auth_failures_total",
            "Calls refused for a missing or wrong bearer token",
            ["service", "reason"],
            registry=r,
        )


class WorkerMetrics(ServerMetrics):
    """A worker sidecar's view of itself (its host is implied by the scrape target, never a label)."""

    def __init__(self) -> None:
        super().__init__("worker")
        r = self.registry
        self.connected = Gauge(f"{PREFIX}_coordinator_connected", "1 while registered with the coordinator", registry=r)
        self.local_healthy = Gauge(
            f"{PREFIX}_local_healthy", "1 while the local Pathways worker passes its health check", registry=r
        )
        self.generation = Gauge(f"{PREFIX}_generation", "Newest generation the coordinator announced", registry=r)
        self.reconnects = Counter(
            f"{PREFIX}_coordinator_reconnects_total",
            "Join attempts to the coordinator that failed or broke",
            registry=r,
        )
        self.notices = Counter(
            f"{PREFIX}_metadata_notices_total", "Metadata-server changes reported, by key", ["key"], registry=r
        )


class Metrics(ServerMetrics):
    """The coordinator's metrics: what the decision core did and what recoveries cost."""

    def __init__(self, role: str = "coordinator") -> None:
        super().__init__(role)
        self._decision_metrics(self.registry)
        self._link_metrics(self.registry)
        self._pubsub_metrics(self.registry)
        self._durability_metrics(self.registry)
        self._straggler_metrics(self.registry)
        self._hold_started: float | None = None
        self._hold_cause = ""
        self._operator_held = False  # an operator's hold was in force during the cycle being timed
        self._step_seconds = 0.0
        self._first_step_at: float | None = None
        self.recovery_phases = RecoveryPhases(self.registry)

    def _decision_metrics(self, r: CollectorRegistry) -> None:
        """What the decision core did and what recoveries cost."""
        self.events = Counter(
            f"{PREFIX}_events_total", "Events the decision core handled", ["source", "kind"], registry=r
        )
        self.ignored = Counter(f"{PREFIX}_events_ignored_total", "Events set aside, by reason", ["reason"], registry=r)
        self.recoveries = Counter(f"{PREFIX}_recoveries_total", "Hold/resume cycles completed", ["cause"], registry=r)
        self.recovery_seconds = Histogram(
            f"{PREFIX}_recovery_seconds",
            "Hold decision until the trainer resumed (a hold cycle with an operator's hold in it is not timed)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.detection_seconds = Histogram(
            f"{PREFIX}_detection_seconds",
            "Fault or notice until the coordinator's decision",
            ["source"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.lost_steps = Counter(f"{PREFIX}_lost_steps_total", "Completed steps redone after a resume", registry=r)
        self.active_slices = Gauge(f"{PREFIX}_active_slices", "Slices training runs on", registry=r)
        self.up_slices = Gauge(f"{PREFIX}_up_slices", "Slices whose hosts are all up", registry=r)
        self.generation = Gauge(f"{PREFIX}_generation", "Current configuration generation", registry=r)
        self.phase = Gauge(f"{PREFIX}_phase", "1 for the current phase", ["phase"], registry=r)
        self.flush_seconds = Histogram(
            f"{PREFIX}_flush_seconds", "Emergency Orbax flush time", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.flush_bytes = Counter(f"{PREFIX}_flush_bytes_total", "Bytes written by emergency flushes", registry=r)
        self.step = Gauge(f"{PREFIX}_trainer_step", "Last step the trainer completed", registry=r)
        self.committed_step = Gauge(f"{PREFIX}_committed_step", "Newest step Orbax committed", registry=r)
        self.goodput = Gauge(
            f"{PREFIX}_goodput_ratio", "Reported step time over wall time since the first step", registry=r
        )

    def _link_metrics(self, r: CollectorRegistry) -> None:
        """The links to the workers and the trainer."""
        self.workers = Gauge(f"{PREFIX}_workers_connected", "Worker sidecars with an open stream", registry=r)
        self.duplicate_hosts = Counter(
            f"{PREFIX}_duplicate_host_registrations_total",
            "Registrations of a host that another live sidecar process already claimed: took_over (the newer "
            "one speaks for the host), refused (an older one while the newer is live), returned (an older one "
            "back once the newer went: the two are flapping)",
            ["outcome"],
            registry=r,
        )
        self.duplicate_trainer_links = Counter(
            f"{PREFIX}_duplicate_trainer_links_total",
            "Trainer links refused because a live link of the same trainer process was already attached",
            registry=r,
        )
        self.heartbeat_datagrams = Counter(
            f"{PREFIX}_heartbeat_datagrams_total",
            "Worker heartbeat datagrams: accepted, refused (unknown registration, wrong token, not parsable), or "
            "dropped (by the kernel: the socket buffer was full)",
            ["result"],
            registry=r,
        )
        self._datagrams_accepted = self.heartbeat_datagrams.labels("accepted")
        self._datagrams_refused = self.heartbeat_datagrams.labels("refused")
        self.command_datagrams = Counter(
            f"{PREFIX}_command_datagrams_total",
            "Worker commands sent as UDP datagrams: sent, failed (sent on the stream instead), or unacknowledged "
            "(also sent on the stream after the acknowledgement wait)",
            ["result"],
            registry=r,
        )

    def _pubsub_metrics(self, r: CollectorRegistry) -> None:
        """The Pub/Sub intake of notices."""
        self.messages_received = Counter(
            f"{PREFIX}_pubsub_messages_received_total", "Pub/Sub messages received (redeliveries included)", registry=r
        )
        self.message_outcomes = Counter(
            f"{PREFIX}_pubsub_message_outcomes_total",
            "What became of each Pub/Sub message: exactly one outcome per message received",
            ["outcome"],
            registry=r,
        )
        self.message_settlements = Counter(
            f"{PREFIX}_pubsub_settlements_total", "Pub/Sub messages ACKed or NACKed", ["result"], registry=r
        )
        self.pubsub_stream_errors = Counter(
            f"{PREFIX}_pubsub_stream_errors_total",
            "Times the Pub/Sub stream ended on its own, by gRPC status (it is reopened with backoff)",
            ["code"],
            registry=r,
        )
        self.pubsub_delivery_seconds = Histogram(
            f"{PREFIX}_pubsub_delivery_seconds",
            "Pub/Sub notice delivery: the message's publish_time (Pub/Sub's clock) until this subscriber received it",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.pubsub_streaming = Gauge(
            f"{PREFIX}_pubsub_streaming", "1 while the Pub/Sub intake's stream is open", registry=r
        )

    def _durability_metrics(self, r: CollectorRegistry) -> None:
        """The process itself: its limits, state file, journal, event loop and epoch."""
        self.open_files_limit = Gauge(
            f"{PREFIX}_open_files_limit",
            "The process's open-file limit (RLIMIT_NOFILE soft, raised to the hard limit at start): one a worker",
            registry=r,
        )
        self.gc_frozen_objects = Gauge(
            f"{PREFIX}_gc_frozen_objects",
            "Objects the coordinator froze out of Python's garbage collections (gc.freeze, --gc-freeze)",
            registry=r,
        )
        self.state_durable = Gauge(
            f"{PREFIX}_state_durable", "1 while every decision is on disk before its actions run", registry=r
        )
        self.state_write_failures = Counter(
            f"{PREFIX}_state_write_failures_total", "State file writes that failed (retried)", registry=r
        )
        self.journal_write_failures = Counter(
            f"{PREFIX}_journal_write_failures_total", "Journal appends that failed (the decision stands)", registry=r
        )
        self.loop_stalls = Counter(
            f"{PREFIX}_event_loop_stalls_total", "Times the event loop was blocked past the stall threshold", registry=r
        )
        self.loop_stall_seconds = Counter(
            f"{PREFIX}_event_loop_stall_seconds_total", "Seconds the event loop was blocked in stalls", registry=r
        )
        self.epoch = Gauge(f"{PREFIX}_coordinator_epoch", "This coordinator's epoch (grows at every start)", registry=r)
        self.fenced = Gauge(
            f"{PREFIX}_coordinator_fenced", "1 when a newer coordinator has superseded this one", registry=r
        )

    def _straggler_metrics(self, r: CollectorRegistry) -> None:
        """The straggler detector (agent.stragglers): its windows, its slices' standing, its verdicts."""
        self.straggler_windows = Counter(
            f"{PREFIX}_straggler_windows_total",
            "Job windows the straggler detector closed, by outcome (counted, or skipped: a hold, resize, "
            "checkpoint or compile in it, or no step time)",
            ["outcome"],
            registry=r,
        )
        self.straggler_slices = Gauge(
            f"{PREFIX}_straggler_slices",
            "Slices by their standing in the newest window: straggler, suspect, healthy or blind",
            ["status"],
            registry=r,
        )
        self.straggler_lateness = Gauge(
            f"{PREFIX}_straggler_max_lateness_ratio",
            "Largest share of the step a slice arrived late at the collective, in the newest counted window",
            registry=r,
        )
        self.straggler_slowdown = Gauge(
            f"{PREFIX}_straggler_step_slowdown_ratio",
            "The step time over the job's baseline, less one, in the newest counted window",
            registry=r,
        )
        self.straggler_verdicts = Counter(
            f"{PREFIX}_straggler_verdicts_total",
            "Straggler verdicts that changed something, by scope and action",
            ["scope", "action"],
            registry=r,
        )
        self.straggler_replacements = Counter(
            f"{PREFIX}_straggler_replacements_total",
            "Straggler slices replaced under --straggler-replace (nodes cordoned, pods deleted), by outcome: "
            "replaced, no_pods, or failed (the Kubernetes API refused, was absent or too slow; the slice stays drained)",
            ["outcome"],
            registry=r,
        )

    def observe_straggler_window(self, detection: Any) -> None:
        """One window's findings (:func:`agent.stragglers.detect`)."""
        slices = [f for f in detection.findings if f.scope == "slice"]
        skipped = detection.reason.startswith("window skipped")
        self.straggler_windows.labels("skipped" if skipped else "counted").inc()
        for status in ("straggler", "suspect", "healthy", "blind"):
            self.straggler_slices.labels(status).set(sum(1 for f in slices if f.status == status))
        if skipped:
            return
        late = [f.lateness for f in slices if f.lateness is not None]
        self.straggler_lateness.set(max(late) if late else 0.0)
        job = next((f for f in detection.findings if f.scope == "job"), None)
        if job is not None and job.slowdown is not None:
            self.straggler_slowdown.set(job.slowdown)

    def observe(self, ev: Event, d: Decision, before: State, now: float, phases: Mapping[str, float]) -> None:
        """Account for one decision (called by the coordinator's loop); ``phases`` are the recovery
        phases it ended (the coordinator's :class:`agent.phase_clock.PhaseClock`)."""
        kind = type(ev).__name__
        source = "trainer" if kind.startswith("Trainer") else "worker" if kind.startswith("Worker") else "operator"
        if isinstance(ev, NodeNotice):
            source, kind = ev.source, ev.kind
        elif isinstance(ev, StragglerVerdict):
            source = "straggler"
            self.straggler_verdicts.labels(ev.scope, ev.action).inc()
        elif kind == "Tick":
            source = "timer"
        if kind not in ("Tick", "TrainerStepped"):
            self.events.labels(source, kind).inc()
        if d.outcome:
            self.ignored.labels(d.outcome).inc()
        s = d.state
        for a in d.actions:
            if isinstance(a, HoldTrainer) and self._hold_started is None:
                self._hold_started = now
                self._hold_cause = "failure" if s.retries_used > before.retries_used else "planned"
                self._operator_held = False
                if isinstance(ev, WorkerLost):
                    self.detection_seconds.labels(ev.cause).observe(ev.silent_seconds)
            if isinstance(a, ResumeTrainer) and before.phase == Phase.STARTING:
                self._hold_started = None
        if self._hold_started is not None and (s.operator_hold or before.operator_hold):
            self._operator_held = True
        match ev:
            case TrainerResumed() if self._hold_started is not None and ev.generation == s.generation:
                self.recoveries.labels(self._hold_cause).inc()
                # An operator's hold lasts as long as the operator wants: its time is no recovery's.
                if not self._operator_held:
                    self.recovery_seconds.observe(now - self._hold_started)
                self._hold_started = None
                self.lost_steps.inc(max(0, before.trainer.last_step - ev.step))
            case TrainerHeld() | TrainerFlushed() if ev.flush_bytes:
                self.flush_seconds.observe(ev.flush_seconds)
                self.flush_bytes.inc(ev.flush_bytes)
            case TrainerStepped():
                # A report stands for every step since the previous one, with their mean seconds
                # (trainer_hooks.session.ElasticSession.report_step sends at most one per 50 ms).
                covered = ev.seconds * max(1, ev.step - before.trainer.last_step)
                self._step_seconds += covered
                if self._first_step_at is None:
                    self._first_step_at = time.monotonic() - covered
                wall = time.monotonic() - self._first_step_at
                if wall > 0:
                    self.goodput.set(min(1.0, self._step_seconds / wall))
        self.recovery_phases.observe(phases)
        self.active_slices.set(len(s.active))
        self.up_slices.set(len(s.up_slices()))
        self.generation.set(s.generation)
        self.step.set(s.trainer.last_step)
        self.committed_step.set(s.trainer.committed_step)
        if before.phase != s.phase or not self.phase._metrics:  # noqa: SLF001
            for p in Phase:
                self.phase.labels(str(p)).set(1 if p == s.phase else 0)

    def count_command_datagrams(self, result: str, n: int) -> None:
        """Command datagrams of one fan-out (agent.coordinator): sent, failed, or unacknowledged."""
        if n:
            self.command_datagrams.labels(result).inc(n)

    def count_heartbeat_datagrams(self, accepted: int, refused: int) -> None:
        """What one read of the heartbeat datagram socket found (agent.sources.heartbeat_datagrams)."""
        if accepted:
            self._datagrams_accepted.inc(accepted)
        if refused:
            self._datagrams_refused.inc(refused)

    def count_pubsub(self, key: str) -> None:
        """One of :class:`agent.sources.pubsub.PubSubIntake`'s counter keys, into its own metric."""
        if key == "received":
            self.messages_received.inc()
        elif key in ("acked", "nacked"):
            self.message_settlements.labels(key[:-2]).inc()
        elif key.startswith("stream_error:"):
            self.pubsub_stream_errors.labels(key.partition(":")[2]).inc()
        else:
            self.message_outcomes.labels(key.replace(":", "_")).inc()

    def observe_notice_delivery(self, source: str, seconds: float) -> None:
        self.detection_seconds.labels(source).observe(max(0.0, seconds))
        self.recovery_phases.seconds.labels("detect").observe(max(0.0, seconds))


class RecoveryPhases:
    """``recovery_phase_seconds{phase}``: a recovery's phases as the coordinator sees them
    (:class:`agent.phase_clock.PhaseClock` says which), and a notice's delivery as its ``detect``."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.seconds = Histogram(
            f"{PREFIX}_recovery_phase_seconds",
            "Seconds of each phase of a recovery, as the coordinator sees it",
            ["phase"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def observe(self, phases: Mapping[str, float]) -> None:
        """The phases one decision ended (from :meth:`Metrics.observe`)."""
        for phase, seconds in phases.items():
            self.seconds.labels(phase).observe(seconds)
