"""Stand-in for libtpu's ``RuntimeMetricService`` on a loopback port, for the demo and tests.

It answers with the real service's messages (tpu-info's generated protos, local credentials),
so the sidecar's source and tpu-info's own client parse it unchanged. It plays one host of a
synchronous multi-slice job: each step the host computes for ``compute_seconds * slowdown``,
then waits at the cross-slice collective until the slowest slice arrives. A slow host's step
time rises and its collective wait falls; a healthy host beside a slow one waits longer. That
is all a slowdown changes (the duty cycle stays put), so the stand-in is never a clearer
witness than a real host. Not started, or stopped, it is absent, as a host without libtpu.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import math
from dataclasses import dataclass, field

import grpc
from tpu_info import metrics as tm
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

COLLECTIVE = tm.LIBTPU_METRIC_MAP["collective_e2e_latency"]
HLO_EXEC = tm.LIBTPU_METRIC_MAP["hlo_exec_timing"]
DUTY_CYCLE = tm.MetricName.DUTY_CYCLE_PCT.value
SERVED = (COLLECTIVE, HLO_EXEC, DUTY_CYCLE)
"""The rest of libtpu's metrics are answered NOT_FOUND, as a libtpu that lacks them would."""

# The stand-in's own bucket layout (microseconds, 1 us to about an hour); clients read the
# layout from each answer's BucketOptions, never assume it.
SCALE_US, GROWTH, FINITE_BUCKETS = 1.0, 1.2, 120


@dataclass
class HostModel:
    """One host's step: its compute, then the collective, which ends when the slowest arrives."""

    compute_seconds: float = 0.1
    transfer_seconds: float = 0.01
    """The collective itself, with nobody to wait for."""
    slowdown: float = 1.0
    """This host's work takes this many times as long (the demo's ``slow:SLICE:FACTOR``)."""
    slowest_peer: float = 1.0
    """The slowest other slice's slowdown: how long this host waits for it."""
    chips: int = 4
    duty_cycle_pct: float = 80.0

    def step(self) -> tuple[float, float]:
        """(step seconds, collective seconds) for one step as things stand."""
        own = self.compute_seconds * self.slowdown
        slowest = self.compute_seconds * max(self.slowdown, self.slowest_peer)
        collective = self.transfer_seconds + (slowest - own)
        return own + collective, collective


@dataclass
class _Histogram:
    """A cumulative distribution kept as google.api.Distribution keeps one."""

    bounds: list[float] = field(default_factory=lambda: [SCALE_US * GROWTH**k for k in range(FINITE_BUCKETS + 1)])
    count: int = 0
    mean: float = 0.0
    ssd: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    buckets: list[int] = field(default_factory=lambda: [0] * (FINITE_BUCKETS + 2))

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean  # Welford's update, for sum_of_squared_deviation
        self.mean += delta / self.count
        self.ssd += delta * (value - self.mean)
        self.low, self.high = min(self.low, value), max(self.high, value)
        self.buckets[bisect.bisect_right(self.bounds, value)] += 1

    def proto(self) -> pb.Distribution:
        exp = pb.Distribution.BucketOptions.Exponential(
            num_finite_buckets=FINITE_BUCKETS, growth_factor=GROWTH, scale=SCALE_US
        )
        return pb.Distribution(
            count=self.count,
            mean=self.mean,
            min=self.low if self.count else 0.0,
            max=self.high if self.count else 0.0,
            sum_of_squared_deviation=self.ssd,
            bucket_options=pb.Distribution.BucketOptions(exponential_buckets=exp),
            bucket_counts=self.buckets,
        )


def _kv(key: str, value: str) -> pb.Attribute:
    inner = pb.Attribute(key=key, value=pb.AttrValue(string_attr=value))
    return pb.Attribute(key="attributes", value=pb.AttrValue(kvlist_attr=pb.KeyValueList(attributes=[inner])))


class TpuMetricsStandIn(pb_grpc.RuntimeMetricServiceServicer):
    """The service for one host; ``advance`` runs steps of :attr:`model` into its totals."""

    def __init__(self, model: HostModel | None = None) -> None:
        self.model = model or HostModel()
        self.collective = _Histogram()
        self.hlo = [_Histogram() for _ in range(self.model.chips)]
        self._server: grpc.aio.Server | None = None
        self.port = 0

    def advance(self, steps: int = 1) -> None:
        step_s, collective_s = self.model.step()
        for _ in range(steps):
            self.collective.add(collective_s * 1e6)
            for h in self.hlo:  # every chip runs the step's program
                h.add(step_s * 1e6)

    def reset(self) -> None:
        """A new host in this one's place (a recreated slice): its libtpu counts from zero."""
        self.collective = _Histogram()
        self.hlo = [_Histogram() for _ in range(self.model.chips)]

    def _metric(self, name: str) -> pb.TPUMetric | None:
        if name == COLLECTIVE:
            metrics = [pb.Metric(attribute=_kv("buffer-size", "8MB+"), distribution=self.collective.proto())]
        elif name == HLO_EXEC:
            metrics = [
                pb.Metric(attribute=_kv("device_ordinal", str(i)), distribution=h.proto())
                for i, h in enumerate(self.hlo)
            ]
        elif name == DUTY_CYCLE:
            metrics = [
                pb.Metric(
                    attribute=pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=i)),
                    gauge=pb.Gauge(as_double=self.model.duty_cycle_pct),
                )
                for i in range(self.model.chips)
            ]
        else:
            return None
        return pb.TPUMetric(name=name, metrics=metrics)

    async def GetRuntimeMetric(self, request: pb.MetricRequest, context: grpc.aio.ServicerContext) -> pb.MetricResponse:  # noqa: N802 - the service's method name
        metric = self._metric(request.metric_name)
        if metric is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"metric {request.metric_name!r} is not supported")
        return pb.MetricResponse(metric=metric)

    async def ListSupportedMetrics(  # noqa: N802 - the service's method name
        self, request: pb.ListSupportedMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSupportedMetricsResponse:
        return pb.ListSupportedMetricsResponse(
            supported_metric=[pb.SupportedMetric(metric_name=n) for n in SERVED if request.filter in n]
        )

    async def start(self, port: int = 0) -> int:
        """Serves on 127.0.0.1 (port 0: a free one) with local credentials, as libtpu does."""
        self._server = grpc.aio.server()
        pb_grpc.add_RuntimeMetricServiceServicer_to_server(self, self._server)
        self.port = self._server.add_secure_port(f"127.0.0.1:{port}", grpc.local_server_credentials())
        await self._server.start()
        return self.port

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)


async def _serve(args: argparse.Namespace) -> None:
    model = HostModel(compute_seconds=args.compute_seconds, slowdown=args.slowdown, slowest_peer=args.slowest_peer)
    stand_in = TpuMetricsStandIn(model)
    port = await stand_in.start(args.port)
    print(f"tpu metrics stand-in on 127.0.0.1:{port}", flush=True)
    try:
        while True:  # one step per step time, as the host would run them
            await asyncio.sleep(model.step()[0])
            stand_in.advance()
    finally:
        await stand_in.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=8431)
    ap.add_argument("--compute-seconds", type=float, default=0.1)
    ap.add_argument("--slowdown", type=float, default=1.0, help="this host's work takes FACTOR times as long")
    ap.add_argument("--slowest-peer", type=float, default=1.0, help="the slowest other slice's slowdown")
    args = ap.parse_args(argv)
    for flag in ("compute_seconds", "slowdown", "slowest_peer"):
        if getattr(args, flag) <= 0:
            ap.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: expected a positive number")
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
