"""libtpu's runtime metrics as a source: a cumulative reading of the host, or ``Blind``.

A :class:`MetricsSource` is a plug-in, registered by kind as :mod:`agent.sources.health`'s
checkers are: ``service`` reads libtpu's ``RuntimeMetricService`` through tpu-info's generated
client, ``sdk`` reads ``libtpu.sdk.tpumonitoring`` in the process that holds the TPU. A source
that cannot see returns :class:`Blind`, never a sample. :class:`Windower` turns successive
cumulative readings into per-window summaries, the compact form a worker reports.
"""

from __future__ import annotations

import abc
import asyncio
import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import grpc

from agent import constants as C

DISTRIBUTIONS = ("collective_e2e_latency", "host_compute_latency", "hlo_exec_timing")
"""Read as distributions, by tpu-info's short names (``tpu_info.metrics.LIBTPU_METRIC_MAP``)."""
GAUGES = ("duty_cycle_pct",)
"""Read as gauges, averaged over the host's chips."""


@dataclass(frozen=True)
class Cumulative:
    """One distribution as libtpu serves it: totals since the runtime started.

    ``bounds`` are the finite bucket boundaries b_0..b_N and ``buckets`` the N+2 counts: below
    b_0, one per [b_(i-1), b_i), and from b_N up (google.api.Distribution's layout, which the
    service's ``Distribution`` message copies).
    """

    count: int
    total: float
    bounds: tuple[float, ...]
    buckets: tuple[int, ...]


@dataclass(frozen=True)
class MetricsSample:
    """What one read saw: cumulative distributions and current gauges, by short name."""

    source: str
    at: float
    distributions: Mapping[str, Cumulative] = field(default_factory=dict)
    gauges: Mapping[str, float] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    """Metrics asked for that this libtpu does not serve (or served in a form not understood)."""


@dataclass(frozen=True)
class Blind:
    """The source could not see this time; a detector must count it neither way."""

    source: str
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"source": self.source, "blind": self.reason}


Reading = MetricsSample | Blind


class MetricsSource(abc.ABC):
    """Reads the host's libtpu metrics on demand. ``read`` never raises and never hangs."""

    REGISTRY: dict[str, type[MetricsSource]] = {}
    kind = ""

    def __init_subclass__(cls, kind: str = "", **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if kind:
            cls.kind = kind
            MetricsSource.REGISTRY[kind] = cls

    @classmethod
    def create(cls, kind: str, **options: Any) -> MetricsSource:
        try:
            impl = cls.REGISTRY[kind]
        except KeyError:
            raise ValueError(f"unknown metrics source kind {kind!r}; known: {sorted(cls.REGISTRY)}") from None
        return impl(**options)

    @abc.abstractmethod
    async def read(self) -> Reading:
        """One reading, or ``Blind`` with the reason it cannot see."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Release what the source holds; idempotent. A stopped source reads blind."""


def _bounds(options: Any) -> tuple[float, ...]:
    # google.api.Distribution.BucketOptions: exponential b_k = scale * growth^k, linear
    # b_k = offset + width * k (k = 0..N), explicit lists them. The deprecated regular layout
    # is not one libtpu is known to use: refused rather than guessed.
    kind = options.WhichOneof("options")
    if kind == "exponential_buckets":
        e = options.exponential_buckets
        return tuple(e.scale * e.growth_factor**k for k in range(e.num_finite_buckets + 1))
    if kind == "linear_buckets":
        lin = options.linear_buckets
        return tuple(lin.offset + lin.width * k for k in range(lin.num_finite_buckets + 1))
    if kind == "explicit_buckets":
        return tuple(options.explicit_buckets.bounds)
    raise ValueError(f"bucket layout {kind!r} is not understood")


def cumulative_from_metrics(metrics: Sequence[Any]) -> Cumulative:
    """Sums a ``TPUMetric``'s distributions (one per device or buffer size) into one.

    tpu-info sums the buckets of a group the same way before it takes percentiles.
    """
    count, total, bounds, buckets = 0, 0.0, None, []
    for m in metrics:
        if m.WhichOneof("measure") != "distribution":
            raise ValueError(f"expected a distribution, got {m.WhichOneof('measure')!r}")
        d = m.distribution
        b = _bounds(d.bucket_options)
        if bounds is None:
            bounds, buckets = b, [0] * (len(b) + 1)
        elif b != bounds:
            raise ValueError("devices report different bucket layouts")
        if len(d.bucket_counts) > len(buckets):
            raise ValueError(f"{len(d.bucket_counts)} bucket counts for {len(buckets)} buckets")
        for i, c in enumerate(d.bucket_counts):  # trailing empty buckets may be left out
            buckets[i] += c
        count += d.count
        total += d.mean * d.count
    if bounds is None:
        raise ValueError("no distribution served")
    return Cumulative(count, total, bounds, tuple(buckets))


def gauge_mean(metrics: Sequence[Any]) -> float:
    values = []
    for m in metrics:
        g = m.gauge
        kind = g.WhichOneof("value") if m.WhichOneof("measure") == "gauge" else None
        if kind not in ("as_double", "as_int"):
            raise ValueError(f"expected a numeric gauge, got {kind!r}")
        values.append(float(getattr(g, kind)))
    if not values:
        raise ValueError("no gauge served")
    return sum(values) / len(values)


def _service_names() -> dict[str, str]:
    """Short name -> the service's metric name, as tpu-info spells them."""
    from tpu_info import metrics as tm

    return {**{n: tm.LIBTPU_METRIC_MAP[n] for n in DISTRIBUTIONS}, "duty_cycle_pct": tm.MetricName.DUTY_CYCLE_PCT.value}


class RuntimeMetricServiceSource(MetricsSource, kind="service"):
    """libtpu's ``RuntimeMetricService`` over gRPC, as tpu-info reads it (local channel credentials).

    Every metric is asked for at once under one deadline, so a read takes at most that long.
    A metric the service answers NOT_FOUND for is left out and listed as missing; any other
    failure (refused, deadline, a server error) makes the whole reading blind.
    """

    def __init__(self, target: str = C.LIBTPU_METRICS_TARGET, *, deadline: float = C.LIBTPU_METRICS_DEADLINE_SECONDS):
        self.target = target
        self.deadline = deadline
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._stopped = False

    async def read(self) -> Reading:
        if self._stopped:
            return Blind(self.kind, "stopped")
        try:
            from tpu_info.proto import tpu_metric_service_pb2 as pb
            from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

            names = _service_names()
        except ImportError as e:
            return Blind(self.kind, f"tpu-info is not installed ({e}): pip install 'elastic-sidecar[tpu]'")
        if self._stub is None:
            self._channel = grpc.aio.secure_channel(self.target, grpc.local_channel_credentials())
            self._stub = pb_grpc.RuntimeMetricServiceStub(self._channel)
        calls = [
            self._stub.GetRuntimeMetric(pb.MetricRequest(metric_name=n), timeout=self.deadline) for n in names.values()
        ]
        answers = await asyncio.gather(*calls, return_exceptions=True)
        dists: dict[str, Cumulative] = {}
        gauges: dict[str, float] = {}
        missing: list[str] = []
        for short, answer in zip(names, answers, strict=True):
            if isinstance(answer, grpc.aio.AioRpcError):
                if answer.code() == grpc.StatusCode.NOT_FOUND:
                    missing.append(short)
                    continue
                return Blind(self.kind, f"{self.target} {answer.code().name}: {answer.details()}")
            if isinstance(answer, BaseException):
                return Blind(self.kind, f"{self.target} {type(answer).__name__}: {answer}")
            try:
                if short in DISTRIBUTIONS:
                    dists[short] = cumulative_from_metrics(answer.metric.metrics)
                else:
                    gauges[short] = gauge_mean(answer.metric.metrics)
            except ValueError:
                missing.append(short)
        if not dists and not gauges:
            return Blind(self.kind, f"{self.target} serves none of {sorted(names)}")
        return MetricsSample(self.kind, time.time(), dists, gauges, tuple(missing))

    async def stop(self) -> None:
        self._stopped = True
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()


class TpuMonitoringSource(MetricsSource, kind="sdk"):
    """libtpu's in-process reading, ``libtpu.sdk.tpumonitoring``, where the service is absent.

    It sees only the TPU of the process it runs in, so it belongs in the trainer's process (the
    trainer hooks would carry its readings). Read as tpu-info reads it: ``get_metric(name).data()``,
    one value per chip, under ``sdk.tpumonitoring`` or the older ``sdk.monitoring``. Gauges only:
    the SDK hands out libtpu's own percentiles since start, not the buckets a window needs.
    """

    def __init__(
        self,
        *,
        gauges: Sequence[str] = ("duty_cycle_pct", "tensorcore_util"),
        import_module: Callable[[str], ModuleType] = importlib.import_module,
    ):
        self.gauges = tuple(gauges)
        self._import = import_module
        self._stopped = False

    def _monitoring(self) -> Any:
        sdk = self._import("libtpu.sdk")
        for name in ("tpumonitoring", "monitoring"):
            if hasattr(sdk, name):
                return getattr(sdk, name)
        raise ImportError("libtpu.sdk has neither tpumonitoring nor monitoring")

    async def read(self) -> Reading:
        if self._stopped:
            return Blind(self.kind, "stopped")
        try:
            monitoring = self._monitoring()
        except ImportError as e:
            return Blind(self.kind, f"libtpu's monitoring SDK is not importable here ({e})")
        gauges: dict[str, float] = {}
        missing: list[str] = []
        for name in self.gauges:
            try:
                values = [float(v) for v in monitoring.get_metric(name).data()]
            except Exception:  # an SDK that cannot read a metric must not stop the others
                values = []
            if values:
                gauges[name] = sum(values) / len(values)
            else:
                missing.append(name)
        if not gauges:
            return Blind(self.kind, f"libtpu's monitoring SDK reads none of {list(self.gauges)}")
        return MetricsSample(self.kind, time.time(), {}, gauges, tuple(missing))

    async def stop(self) -> None:
        self._stopped = True


# --- windows -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricWindow:
    """One distribution over one window: how many values, their mean, p50 and p90 (None if none)."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None


@dataclass(frozen=True)
class WindowSummary:
    """A host's metrics between two readings: what a worker reports for one window."""

    source: str
    start: float
    end: float
    distributions: Mapping[str, MetricWindow]
    gauges: Mapping[str, float]
    reset: tuple[str, ...] = ()
    """Distributions whose totals went backwards (libtpu restarted): no window for them."""

    def to_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "start": self.start,
            "end": self.end,
            "distributions": {
                k: {"count": w.count, "mean": w.mean, "p50": w.p50, "p90": w.p90} for k, w in self.distributions.items()
            },
            "gauges": dict(self.gauges),
            "reset": list(self.reset),
        }


def difference(prev: Cumulative, cur: Cumulative) -> Cumulative | None:
    """What was added between two readings, or None if the totals cannot be differenced."""
    if cur.bounds != prev.bounds or cur.count < prev.count:
        return None
    buckets = tuple(c - p for c, p in zip(cur.buckets, prev.buckets, strict=True))
    if any(b < 0 for b in buckets):
        return None
    return Cumulative(cur.count - prev.count, cur.total - prev.total, cur.bounds, buckets)


def quantile(d: Cumulative, q: float) -> float | None:
    """The q-quantile, interpolated linearly inside its bucket as Prometheus' histogram_quantile
    does; in the open-ended buckets it is the nearest finite boundary."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile {q} is not in (0, 1)")
    if d.count <= 0:
        return None
    rank = q * d.count
    seen = 0
    for i, n in enumerate(d.buckets):
        if n and seen + n >= rank:
            if i == 0:
                return d.bounds[0]
            if i == len(d.buckets) - 1:
                return d.bounds[-1]
            lo, hi = d.bounds[i - 1], d.bounds[i]
            return lo + (hi - lo) * (rank - seen) / n
        seen += n
    return d.bounds[-1]  # bucket counts short of count: the top is all that can be said


def window(prev: MetricsSample, cur: MetricsSample) -> WindowSummary:
    dists: dict[str, MetricWindow] = {}
    reset: list[str] = []
    for name, c in cur.distributions.items():
        p = prev.distributions.get(name)
        if p is None:
            continue  # first seen in this reading: its window starts now
        d = difference(p, c)
        if d is None:
            reset.append(name)
            continue
        mean = d.total / d.count if d.count else None
        dists[name] = MetricWindow(d.count, mean, quantile(d, 0.5), quantile(d, 0.9))
    return WindowSummary(cur.source, prev.at, cur.at, dists, dict(cur.gauges), tuple(reset))


class Windower:
    """Feeds successive readings in; each sample after the first closes a window.

    A blind reading passes through and drops the baseline, so no window spans a gap in sight.
    """

    def __init__(self) -> None:
        self._last: MetricsSample | None = None

    def push(self, reading: Reading) -> WindowSummary | Blind | None:
        if isinstance(reading, Blind):
            self._last = None
            return reading
        last, self._last = self._last, reading
        return None if last is None else window(last, reading)
