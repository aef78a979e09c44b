"""Pub/Sub intake: node events from the job's subscription, recorded before acked.

One streaming-pull subscription per job carries both GKE cluster notifications
and the Cloud Logging sink's GCE / Kubernetes entries (FACTS section 4).
:class:`PubSubIntake` turns each message into a
:class:`~agent.sources.gke_events.NodeEvent` and hands it to the daemon's
asyncio loop. Pub/Sub delivers at least once and in any order, so:

* a message is ACKed only after ``handle(event)`` has completed on the loop
  (the decision is recorded); if the handler raises or times out the message is
  NACKed and comes back;
* copies are dropped twice over: by Pub/Sub message id (a redelivery) and by
  event identity (the same LogEntry or GKE operation published twice), each in
  a bounded LRU. A copy that arrives while its original is still being handled
  waits for it and is ACKed or NACKed with it, so the handler sees an event
  once unless the first attempt failed;
* anything that is not an event for us (malformed, unknown, foreign cluster or
  project, a duplicate) is logged with its reason, counted, and ACKed once: it
  never blocks the stream and never reaches the handler.

Handlers run concurrently on the loop (up to ``max_messages`` at once), in
arrival order but without waiting for one another; the decision core must not
depend on the order of notices anyway. The dedupe memory lives in this process:
after a restart, redelivered messages reach the handler again, which is why the
core treats a repeated notice as a no-op.

The intake never blocks the job: the stream is reopened with backoff (1 s
doubling to 60 s) for as long as the daemon runs, whatever ended it. An error
that retrying will not cure (the subscription does not exist, the service
account may not read it) is logged at ERROR with the likely fix, shown by
:meth:`PubSubIntake.status` (``/status``) and counted; training goes on with
notices degraded, and the intake recovers by itself once the cause is fixed.

Counters (:attr:`PubSubIntake.stats`, also passed to :attr:`PubSubIntake.on_count`):
``received``; exactly one outcome per message: ``accepted`` (handled and
ACKed), ``informational`` (a notice that disrupts nothing), ``duplicate`` (same
event, other message), ``redelivered`` (same message again),
``foreign_cluster``, ``foreign_project``, ``rejected:<reason>``
(:data:`~agent.sources.gke_events.REJECT_REASONS`), ``handler_error``,
``internal_error``; the settlements ``acked`` and ``nacked``; and
``stream_error:<code>`` each time the stream ends on its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from agent import log as agent_log
from agent.core.model import Decision, Event, NodeNotice
from agent.sources.gke_events import Kind, NodeEvent, Rejected, parse

if TYPE_CHECKING:
    from google.cloud.pubsub_v1 import SubscriberClient
    from google.cloud.pubsub_v1.subscriber.futures import StreamingPullFuture
    from google.cloud.pubsub_v1.subscriber.message import Message

    from agent.metrics import Metrics

Handler = Callable[[NodeEvent], Awaitable[object] | concurrent.futures.Future[Any] | None]
"""Records one event. Called on the intake's asyncio loop; may be ``async``, or
return a ``concurrent.futures.Future``, or be a plain function."""

log = agent_log.get("elastic-sidecar.pubsub")

RETRY_FIRST_SECONDS = 1.0
RETRY_MAX_SECONDS = 60.0
QUIET_REJECTIONS = frozenset({"unknown_type", "unknown_method", "unsupported_resource"})
"""Real messages that are simply not for us: INFO, not WARNING."""


def stream_error_hint(code: str, subscription: str) -> str:
    """The likely fix for a stream that ended with ``code`` (a gRPC status name), or ""."""
    return {
        "NOT_FOUND": f"subscription {subscription} does not exist: create it (deploy/pubsub/setup.sh) "
        "or correct --pubsub-subscription",
        "PERMISSION_DENIED": f"the pod's Google service account may not pull {subscription}: grant it "
        "roles/pubsub.subscriber on the subscription and check the Workload Identity binding "
        "(deploy/pubsub/setup.sh)",
        "UNAUTHENTICATED": "no usable Google credentials: check the Workload Identity annotation on the "
        "Kubernetes service account (deploy/common/serviceaccount.yaml)",
        "INVALID_ARGUMENT": f"the subscription name {subscription} is malformed: expected projects/P/subscriptions/S",
    }.get(code, "")


def _code_name(exc: BaseException | None) -> str:
    """The gRPC status name of a google.api_core error (e.g. NOT_FOUND), else the exception's type name."""
    if exc is None:
        return "ENDED"
    grpc_code = getattr(exc, "grpc_status_code", None)
    if grpc_code is not None and getattr(grpc_code, "name", None):
        return str(grpc_code.name)
    return type(exc).__name__


class _LRUSet:
    """A set that forgets its oldest member beyond ``maxsize``. Not thread-safe."""

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"dedupe size must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._d: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        if key in self._d:
            self._d.move_to_end(key)
            return True
        return False

    def add(self, key: str) -> None:
        self._d[key] = None
        self._d.move_to_end(key)
        while len(self._d) > self.maxsize:
            self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)


@dataclass
class _InFlight:
    """An event being handled, and the copies of it that arrived meanwhile."""

    message_id: str
    copies: list[Message] = field(default_factory=list)


class PubSubIntake:
    """Streaming pull of one subscription into ``handle(NodeEvent)`` on an asyncio loop.

    ``subscription`` is the full path ``projects/P/subscriptions/S``. With
    ``PUBSUB_EMULATOR_HOST`` set the client talks to the emulator. ``cluster`` and
    ``project`` (a project id and/or number) filter out events that name another
    cluster or project; an event that names none (GCE entries carry no cluster)
    passes, and the decision core ignores nodes it does not know.
    """

    def __init__(
        self,
        subscription: str,
        handle: Handler,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        cluster: str | None = None,
        project: str | Iterable[str] | None = None,
        max_messages: int = 1000,
        max_bytes: int = 64 * 1024 * 1024,
        dedupe_size: int = 100_000,
        handler_timeout: float | None = 60.0,
        on_count: Callable[[str], None] | None = None,
        on_state: Callable[[bool], None] | None = None,
        subscriber: SubscriberClient | None = None,
        retry_first: float = RETRY_FIRST_SECONDS,
        retry_max: float = RETRY_MAX_SECONDS,
    ) -> None:
        if not subscription.startswith("projects/") or "/subscriptions/" not in subscription:
            raise ValueError(f"subscription must be 'projects/P/subscriptions/S', got {subscription!r}")
        if max_messages < 1 or max_bytes < 1:
            raise ValueError(f"max_messages and max_bytes must be >= 1, got {max_messages}, {max_bytes}")
        self.subscription = subscription
        self._handle = handle
        self._loop = loop
        self.cluster = cluster or None
        self.projects = frozenset([project] if isinstance(project, str) else (project or ())) - {""}
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.handler_timeout = handler_timeout
        self.on_count = on_count
        """Called with each counter key as it is incremented (for the metrics module); must be cheap."""
        self.on_state = on_state
        """Called with True when the stream (re)opens and False when it ends on its own."""
        self.stats: Counter[str] = Counter()
        self.error: BaseException | None = None
        """Why the stream last stopped on its own (cleared when a reopened stream delivers)."""
        self.error_code = ""
        self.hint = ""
        self.restarts = 0
        self.retry_first = retry_first
        self.retry_max = retry_max
        self._delay = retry_first
        self._retry: asyncio.TimerHandle | None = None
        self._retry_at: float | None = None
        self._subscriber = subscriber
        self._owns_subscriber = subscriber is None
        self._future: StreamingPullFuture | None = None
        self._stopping = False
        self._lock = threading.RLock()
        self._seen_messages = _LRUSet(dedupe_size)
        self._seen_events = _LRUSet(dedupe_size)
        self._in_flight: dict[str, _InFlight] = {}

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        """Open the streaming pull. Call from the loop's thread unless ``loop`` was given."""
        if self._future is not None:
            raise RuntimeError(f"intake for {self.subscription} already started")
        from google.cloud import pubsub_v1

        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if self._subscriber is None:
            self._subscriber = pubsub_v1.SubscriberClient()
        self._stopping = False
        numbers = {p for p in self.projects if p.isdigit()}
        if self.projects and (not numbers or numbers == self.projects):
            have, missing, flag = (
                ("number", "id", "--pubsub-project") if numbers else ("id", "number", "--pubsub-project-number")
            )
            log.warning(
                f"only a project {have} is given: notices that carry the project {missing} will be filtered out; "
                f"add {flag} (GKE cluster notifications carry the number, GCE log entries the id)",
                projects=sorted(self.projects),
            )
        self._open()
        log.info(
            "pubsub intake started",
            subscription=self.subscription,
            cluster=self.cluster,
            projects=sorted(self.projects),
        )

    def _open(self) -> None:
        from google.cloud import pubsub_v1

        assert self._subscriber is not None
        flow = pubsub_v1.types.FlowControl(max_messages=self.max_messages, max_bytes=self.max_bytes)
        self._retry = None
        self._retry_at = None
        try:
            self._future = self._subscriber.subscribe(self.subscription, self._callback, flow_control=flow)
        except Exception as e:  # an error opening the stream is retried like one that ends it
            self._future = None
            self._stream_failed(e)
            return
        self._future.add_done_callback(self._stream_done)
        self._state(True)

    def _state(self, up: bool) -> None:
        hook = self.on_state
        if hook is not None:
            try:
                hook(up)
            except Exception:
                log.exception("pubsub on_state hook failed")

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the streaming pull, wait up to ``timeout`` s for it to end, close the client.

        It blocks while the pull threads wind down, so from the loop call it as
        ``await asyncio.to_thread(intake.stop)``. Handlers still running finish,
        but their ACKs may not reach Pub/Sub: those messages come back later.
        """
        self._stopping = True
        retry, self._retry = self._retry, None
        if retry is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(retry.cancel)
        fut, self._future = self._future, None
        if fut is not None:
            fut.cancel()
            try:
                fut.result(timeout=timeout)
            except Exception as e:  # a stream that already failed: its error was logged
                log.debug("pubsub stream ended with error during stop", error=repr(e))
        if self._subscriber is not None and self._owns_subscriber:
            self._subscriber.close()
            self._subscriber = None
        log.info("pubsub intake stopped", subscription=self.subscription, **self._stats_fields())

    @property
    def running(self) -> bool:
        """True while the stream is open. A stopped or failed intake sees nothing: never report healthy on it."""
        fut = self._future
        return fut is not None and not fut.done()

    def status(self) -> dict[str, Any]:
        """What ``/status`` shows of the intake: is it streaming, and if not, why and what to do."""
        with self._lock:
            stats = dict(self.stats)
        retry_in = None
        if self._retry_at is not None and self._loop is not None:
            retry_in = round(max(0.0, self._retry_at - self._loop.time()), 1)
        return {
            "subscription": self.subscription,
            "streaming": self.running,
            "degraded": self.error is not None,
            "error_code": self.error_code,
            "error": "" if self.error is None else str(self.error)[:300],
            "hint": self.hint,
            "restarts": self.restarts,
            "retry_in_seconds": retry_in,
            "counts": {k.replace(":", "_"): v for k, v in stats.items()},
        }

    def _stream_done(self, fut: StreamingPullFuture) -> None:
        if self._stopping:
            return
        try:
            exc = fut.exception(timeout=0)
        except BaseException as e:  # cancelled or not done
            exc = e
        self._stream_failed(exc)

    def _stream_failed(self, exc: BaseException | None) -> None:
        """The stream ended on its own: say why, count it, reopen after a backoff (for ever)."""
        code = _code_name(exc)
        hint = stream_error_hint(code, self.subscription)
        self.error, self.error_code, self.hint = exc, code, hint
        self._count(f"stream_error:{code}")
        self._state(False)
        delay = self._delay
        self._delay = min(self._delay * 2, self.retry_max)
        fields = {"subscription": self.subscription, "code": code, "error": repr(exc)[:300], "retry_in": delay}
        if hint:
            log.error(f"pubsub intake degraded: {hint}; training continues without notices", **fields)
        else:
            log.warning("pubsub stream ended; reopening", **fields)
        loop = self._loop
        if loop is None or loop.is_closed() or self._stopping:
            return

        def schedule() -> None:
            if self._stopping:
                return
            self._retry_at = loop.time() + delay
            self._retry = loop.call_later(delay, self._reopen)

        try:
            loop.call_soon_threadsafe(schedule)
        except RuntimeError:  # the loop closed meanwhile: we are shutting down
            pass

    def _reopen(self) -> None:
        if self._stopping or self._subscriber is None:
            return
        self.restarts += 1
        log.info("pubsub stream reopening", subscription=self.subscription, attempt=self.restarts)
        self._open()

    # -- per message (callback threads, then the loop) -----------------------

    def _callback(self, message: Message) -> None:
        try:
            self._receive(message)
        except Exception:  # never let one message take the stream down
            log.exception("pubsub message handling failed", message_id=message.message_id)
            self._count("internal_error")
            self._nack(message)

    def _receive(self, message: Message) -> None:
        received = time.time()
        mid = message.message_id
        with self._lock:
            self._count("received")
            if mid in self._seen_messages:
                self._count("redelivered")
                log.debug("pubsub message redelivered", message_id=mid)
                self._ack(message)
                return
        if self.error is not None:  # a reopened stream delivers again: no longer degraded
            self.error, self.error_code, self.hint = None, "", ""
            self._delay = self.retry_first
            log.info("pubsub intake recovered", subscription=self.subscription)
        ev = parse(bytes(message.data), dict(message.attributes), mid, message.publish_time)
        if isinstance(ev, Rejected):
            level = log.info if ev.reason in QUIET_REJECTIONS else log.warning
            level("pubsub message rejected", reason=ev.reason, detail=ev.detail, message_id=mid)
            self._settle_ignored(message, f"rejected:{ev.reason}")
            return
        outcome, why = self._foreign(ev)
        if why:
            log.info("pubsub notice filtered out", filter=outcome, detail=why, message_id=mid, identity=ev.identity)
            self._settle_ignored(message, outcome)
            return
        if ev.kind is Kind.INFORMATIONAL:
            log.info("pubsub informational notice", what=ev.what, summary=ev.summary, message_id=mid)
            self._settle_ignored(message, "informational")
            return
        # publish_time: "The time at which the message was published, populated by the server when it
        # receives the Publish call" (google.pubsub.v1.PubsubMessage). Its lag to here is Pub/Sub's
        # delivery, which a notice's lead time pays before this daemon can act.
        published = message.publish_time
        delivery = None
        if isinstance(published, datetime):
            aware = published if published.tzinfo is not None else published.replace(tzinfo=UTC)
            delivery = round(received - aware.timestamp(), 4)
        ev = replace(ev, received_at=received, delivery_seconds=delivery)
        log.info(
            "pubsub notice received",
            message_id=mid,
            what=ev.what,
            node=ev.node,
            received_at=received,
            delivery_seconds=delivery,
        )
        with self._lock:
            if ev.identity in self._seen_events:
                log.info("pubsub duplicate event", message_id=mid, identity=ev.identity)
                self._settle_ignored(message, "duplicate")
                return
            waiting = self._in_flight.get(ev.identity)
            if waiting is not None:
                waiting.copies.append(message)
                return
            self._in_flight[ev.identity] = _InFlight(mid)
        loop = self._loop
        assert loop is not None
        try:
            cf = asyncio.run_coroutine_threadsafe(self._invoke(ev), loop)
        except RuntimeError as e:  # the loop is closed: we are shutting down
            failed: concurrent.futures.Future[None] = concurrent.futures.Future()
            failed.set_exception(e)
            self._settle_event(ev, message, failed)
            return
        cf.add_done_callback(lambda f: self._settle_event(ev, message, f))

    async def _invoke(self, ev: NodeEvent) -> None:
        result = self._handle(ev)
        if isinstance(result, concurrent.futures.Future):
            result = asyncio.wrap_future(result)
        if inspect.isawaitable(result):
            if self.handler_timeout is None:
                await result
            else:
                await asyncio.wait_for(result, self.handler_timeout)

    def _settle_event(self, ev: NodeEvent, message: Message, fut: concurrent.futures.Future[Any]) -> None:
        """ACK (handled) or NACK (handler failed) the message and any copies that waited for it."""
        try:
            exc = fut.exception()
        except concurrent.futures.CancelledError as e:
            exc = e
        with self._lock:
            waiting = self._in_flight.pop(ev.identity, _InFlight(message.message_id))
            if exc is None:
                self._seen_events.add(ev.identity)
                self._seen_messages.add(message.message_id)
                for c in waiting.copies:
                    self._seen_messages.add(c.message_id)
        if exc is None:
            self._count("accepted")
            log.info(
                "node event",
                kind=str(ev.kind),
                what=ev.what,
                node=ev.node,
                node_pool=ev.node_pool,
                cluster=ev.cluster,
                start=ev.start.isoformat() if ev.start else None,
                end=ev.end.isoformat() if ev.end else None,
                identity=ev.identity,
                message_id=ev.message_id,
                summary=ev.summary,
            )
            self._ack(message)
            for c in waiting.copies:
                self._count("duplicate")
                self._ack(c)
        else:
            self._count("handler_error")
            log.error(
                "node event handler failed; message will be redelivered",
                error=repr(exc),
                identity=ev.identity,
                message_id=ev.message_id,
            )
            self._nack(message)
            for c in waiting.copies:
                self._nack(c)

    def _settle_ignored(self, message: Message, key: str) -> None:
        with self._lock:
            self._seen_messages.add(message.message_id)
        self._count(key)
        self._ack(message)

    def _foreign(self, ev: NodeEvent) -> tuple[str, str]:
        """(outcome, why) when a filter rejects the event, naming the filter; ("", "") when it passes."""
        if self.cluster and ev.cluster and ev.cluster != self.cluster:
            return "foreign_cluster", f"cluster filter (--cluster-name {self.cluster}): the notice names {ev.cluster!r}"
        if self.projects and ev.project and ev.project not in self.projects:
            kind = "number" if ev.project.isdigit() else "id"
            flag = "--pubsub-project-number" if kind == "number" else "--pubsub-project"
            return "foreign_project", (
                f"project filter ({', '.join(sorted(self.projects))}): the notice names project {kind} "
                f"{ev.project!r}; if that is this job's project, add it with {flag}"
            )
        return "", ""

    # -- counters ------------------------------------------------------------

    def _ack(self, message: Message) -> None:
        message.ack()
        self._count("acked")

    def _nack(self, message: Message) -> None:
        message.nack()
        self._count("nacked")

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1
        hook = self.on_count
        if hook is not None:
            try:
                hook(key)
            except Exception:
                log.exception("pubsub on_count hook failed", key=key)

    def _stats_fields(self) -> dict[str, int]:
        with self._lock:
            return {k.replace(":", "_"): v for k, v in self.stats.items()}


def node_notice(ev: NodeEvent, wall: float, mono: float) -> NodeNotice:
    """The core's event for a parsed notice. Its wall-clock times become decision-clock (monotonic)
    times, given the two clocks read together (``wall``, ``mono``)."""

    def clock(t: datetime | None) -> float | None:
        return None if t is None else mono + (t.timestamp() - wall)

    return NodeNotice(
        kind=ev.what,
        source="pubsub",
        node=ev.node,
        node_pool=ev.node_pool,
        deadline=clock(ev.start if ev.start is not None else ev.end),
        event_time=None if ev.event_time is None else ev.event_time.timestamp(),
        cleared=ev.cleared,
        reason=ev.summary,
        starts_at=clock(ev.start) if str(ev.kind) == "scheduled" else None,
        ends_at=clock(ev.end),
    )


async def decide_notice(ev: NodeEvent, request: Callable[[Event], Awaitable[Decision]], metrics: Metrics) -> None:
    """The coordinator's handler: decide on a parsed notice (``request``: submit and wait for the decision);
    the intake acks once this returns."""
    wall, mono = time.time(), time.monotonic()
    notice = node_notice(ev, wall, mono)
    if ev.delivery_seconds is not None:
        metrics.pubsub_delivery_seconds.observe(max(0.0, ev.delivery_seconds))
    d = await request(notice)
    if not d.outcome:
        # From the message's arrival at this subscriber (the callback thread), not from this handler.
        arrived = mono - max(0.0, wall - ev.received_at) if ev.received_at is not None else mono
        metrics.observe_notice_delivery("pubsub", time.monotonic() - arrived)
