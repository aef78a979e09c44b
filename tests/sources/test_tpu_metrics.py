"""libtpu metrics sources: the plug-in contract, the service through tpu-info's client against the
stand-in, blindness, and the window arithmetic on known cumulative distributions."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from types import ModuleType, SimpleNamespace
from typing import Any

import grpc
import pytest
from tpu_info import metrics as tm
from tpu_info.proto import tpu_metric_service_pb2 as pb

from agent.sources.tpu_metrics import (
    Blind,
    Cumulative,
    MetricsSample,
    MetricsSource,
    MetricWindow,
    RuntimeMetricServiceSource,
    TpuMonitoringSource,
    Windower,
    WindowSummary,
    cumulative_from_metrics,
    difference,
    quantile,
    window,
)
from simjob.ports import free_port
from standins.tpu_metrics import HostModel, TpuMetricsStandIn

# A bounded wait around reads that must end on their own; it guards against a hang, it times nothing.
HANG_GUARD = 30.0


def fake_sdk(values: dict[str, list[Any]]) -> Callable[[str], ModuleType]:
    """An importer handing out a ``libtpu.sdk`` shaped as tpu-info uses it; a metric not in
    ``values`` fails as the SDK does for one it lacks."""

    def get_metric(name: str) -> SimpleNamespace:
        if name not in values:
            raise RuntimeError(f"metric {name} not supported")
        return SimpleNamespace(data=lambda: values[name])

    def importer(name: str) -> ModuleType:
        assert name == "libtpu.sdk"
        sdk = ModuleType("libtpu.sdk")
        sdk.tpumonitoring = SimpleNamespace(get_metric=get_metric)  # type: ignore[attr-defined]
        return sdk

    return importer


def no_libtpu(name: str) -> ModuleType:
    raise ModuleNotFoundError(f"No module named {name!r}")


@pytest.fixture
async def stand_in() -> AsyncIterator[TpuMetricsStandIn]:
    s = TpuMetricsStandIn()
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


# --- the contract every plug-in passes -----------------------------------------------------------

Make = Callable[[TpuMetricsStandIn], Awaitable[MetricsSource]]


async def service_seeing(s: TpuMetricsStandIn) -> MetricsSource:
    s.advance(3)
    return RuntimeMetricServiceSource(f"127.0.0.1:{s.port}")


async def service_blind(s: TpuMetricsStandIn) -> MetricsSource:
    return RuntimeMetricServiceSource(f"127.0.0.1:{free_port()}")


async def sdk_seeing(s: TpuMetricsStandIn) -> MetricsSource:
    return TpuMonitoringSource(import_module=fake_sdk({"duty_cycle_pct": ["80.0", 70], "tensorcore_util": [50.0]}))


async def sdk_blind(s: TpuMetricsStandIn) -> MetricsSource:
    return TpuMonitoringSource(import_module=no_libtpu)


CONTRACT: dict[str, tuple[Make, Make]] = {
    "service": (service_seeing, service_blind),
    "sdk": (sdk_seeing, sdk_blind),
}


def test_every_registered_source_is_under_the_contract() -> None:
    assert set(MetricsSource.REGISTRY) == set(CONTRACT)


@pytest.mark.parametrize("kind", sorted(CONTRACT))
async def test_a_source_that_sees_emits_only_samples(kind: str, stand_in: TpuMetricsStandIn) -> None:
    source = await CONTRACT[kind][0](stand_in)
    try:
        for _ in range(2):
            reading = await asyncio.wait_for(source.read(), HANG_GUARD)
            assert isinstance(reading, MetricsSample), reading
            assert reading.source == kind
            assert reading.distributions or reading.gauges
            assert all(isinstance(d, Cumulative) for d in reading.distributions.values())
            assert all(isinstance(v, float) for v in reading.gauges.values())
    finally:
        await source.stop()


@pytest.mark.parametrize("kind", sorted(CONTRACT))
async def test_a_source_that_cannot_see_reports_blind(kind: str, stand_in: TpuMetricsStandIn) -> None:
    source = await CONTRACT[kind][1](stand_in)
    try:
        reading = await asyncio.wait_for(source.read(), HANG_GUARD)
        assert isinstance(reading, Blind), reading
        assert reading.source == kind and reading.reason
    finally:
        await source.stop()


@pytest.mark.parametrize("kind", sorted(CONTRACT))
async def test_stop_is_idempotent_and_a_stopped_source_is_blind(kind: str, stand_in: TpuMetricsStandIn) -> None:
    source = await CONTRACT[kind][0](stand_in)
    assert isinstance(await source.read(), MetricsSample)
    await source.stop()
    await source.stop()
    assert await source.read() == Blind(kind, "stopped")


def test_an_unknown_kind_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"'nvml'.*\['sdk', 'service'\]"):
        MetricsSource.create("nvml")


# --- the service through tpu-info's client, against the stand-in ---------------------------------


async def read_window(source: MetricsSource, host: TpuMetricsStandIn, steps: int, windows: Windower) -> Any:
    host.advance(steps)
    return windows.push(await source.read())


async def test_a_window_holds_only_its_own_steps(stand_in: TpuMetricsStandIn) -> None:
    source = RuntimeMetricServiceSource(f"127.0.0.1:{stand_in.port}")
    windows = Windower()
    try:
        assert await read_window(source, stand_in, 5, windows) is None  # the first reading is a baseline
        before = await read_window(source, stand_in, 10, windows)
        stand_in.model.slowdown = 1.5
        during = await read_window(source, stand_in, 10, windows)
    finally:
        await source.stop()
    for w in (before, during):
        assert w.distributions["collective_e2e_latency"].count == 10
        assert w.distributions["hlo_exec_timing"].count == 10 * stand_in.model.chips
        assert w.gauges == {"duty_cycle_pct": stand_in.model.duty_cycle_pct}
    # The slow host's steps take longer (all of it its own compute) and it waits less at the
    # collective; the window's mean is the new step alone, not mixed with the earlier ones.
    m = stand_in.model
    assert during.distributions["hlo_exec_timing"].mean == pytest.approx(
        1e6 * (1.5 * m.compute_seconds + m.transfer_seconds)
    )
    assert before.distributions["hlo_exec_timing"].mean == pytest.approx(1e6 * (m.compute_seconds + m.transfer_seconds))
    assert during.distributions["collective_e2e_latency"].mean == pytest.approx(
        before.distributions["collective_e2e_latency"].mean
    )


async def test_the_slow_host_waits_least_and_its_peers_wait_for_it() -> None:
    slow = TpuMetricsStandIn(HostModel(slowdown=1.5))
    healthy = TpuMetricsStandIn(HostModel(slowest_peer=1.5))
    seen = {}
    for name, host in (("slow", slow), ("healthy", healthy)):
        await host.start()
        source = RuntimeMetricServiceSource(f"127.0.0.1:{host.port}")
        windows = Windower()
        try:
            await read_window(source, host, 1, windows)
            seen[name] = await read_window(source, host, 20, windows)
        finally:
            await source.stop()
            await host.stop()
    wait = {k: w.distributions["collective_e2e_latency"].mean for k, w in seen.items()}
    step = {k: w.distributions["hlo_exec_timing"].mean for k, w in seen.items()}
    assert wait["slow"] < wait["healthy"]
    assert step["slow"] == pytest.approx(step["healthy"])  # a synchronous step: one pace for all


async def test_tpu_infos_own_client_parses_the_stand_in_as_the_source_does(stand_in: TpuMetricsStandIn) -> None:
    stand_in.advance(10)
    addr = f"127.0.0.1:{stand_in.port}"
    (latency,) = await asyncio.to_thread(tm.get_transfer_latency, "collective_e2e_latency", addr)
    timings = await asyncio.to_thread(tm.get_hlo_exec_timing, None, addr)
    source = RuntimeMetricServiceSource(addr)
    try:
        reading = await source.read()
    finally:
        await source.stop()
    assert isinstance(reading, MetricsSample)
    assert latency.transfer_size == "8MB+"
    assert [t.device_id for t in timings] == list(range(stand_in.model.chips))
    assert timings[0].mean == pytest.approx(1e6 * (stand_in.model.compute_seconds + stand_in.model.transfer_seconds))
    # Both read the same buckets into the same median.
    assert quantile(reading.distributions["collective_e2e_latency"], 0.5) == pytest.approx(latency.p50)
    assert quantile(reading.distributions["hlo_exec_timing"], 0.5) == pytest.approx(timings[0].p50)


async def test_metrics_this_libtpu_lacks_are_listed_as_missing(stand_in: TpuMetricsStandIn) -> None:
    source = RuntimeMetricServiceSource(f"127.0.0.1:{stand_in.port}")
    try:
        reading = await source.read()
    finally:
        await source.stop()
    assert isinstance(reading, MetricsSample)
    assert reading.missing == ("host_compute_latency",)


async def test_a_service_that_serves_none_of_the_metrics_is_blind() -> None:
    class Bare(TpuMetricsStandIn):
        def _metric(self, name: str) -> pb.TPUMetric | None:
            return None

    host = Bare()
    await host.start()
    source = RuntimeMetricServiceSource(f"127.0.0.1:{host.port}")
    try:
        reading = await asyncio.wait_for(source.read(), HANG_GUARD)
    finally:
        await source.stop()
        await host.stop()
    assert isinstance(reading, Blind) and "serves none" in reading.reason


async def test_the_service_going_away_turns_the_source_blind(stand_in: TpuMetricsStandIn) -> None:
    source = RuntimeMetricServiceSource(f"127.0.0.1:{stand_in.port}")
    try:
        assert isinstance(await source.read(), MetricsSample)
        await stand_in.stop()
        reading = await asyncio.wait_for(source.read(), HANG_GUARD)
    finally:
        await source.stop()
    assert isinstance(reading, Blind) and "UNAVAILABLE" in reading.reason


async def test_a_refused_connection_is_blind_within_the_deadline() -> None:
    port = free_port()
    source = RuntimeMetricServiceSource(f"127.0.0.1:{port}", deadline=1.0)
    try:
        reading = await asyncio.wait_for(source.read(), HANG_GUARD)
    finally:
        await source.stop()
    assert isinstance(reading, Blind)
    assert f"127.0.0.1:{port}" in reading.reason and "UNAVAILABLE" in reading.reason


async def test_a_service_that_never_answers_is_blind_at_the_deadline() -> None:
    class Hung(TpuMetricsStandIn):
        async def GetRuntimeMetric(
            self, request: pb.MetricRequest, context: grpc.aio.ServicerContext
        ) -> pb.MetricResponse:  # noqa: N802
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    host = Hung()
    await host.start()
    source = RuntimeMetricServiceSource(f"127.0.0.1:{host.port}", deadline=0.2)
    try:
        reading = await asyncio.wait_for(source.read(), HANG_GUARD)
    finally:
        await source.stop()
        await host.stop()
    assert isinstance(reading, Blind) and "DEADLINE_EXCEEDED" in reading.reason


# --- the in-process SDK adapter ------------------------------------------------------------------


async def test_the_sdk_source_is_blind_without_libtpu() -> None:
    if importlib.util.find_spec("libtpu") is not None:
        pytest.skip("libtpu is installed here; the injected importer below covers its absence")
    reading = await TpuMonitoringSource().read()
    assert isinstance(reading, Blind) and "libtpu" in reading.reason


async def test_the_sdk_source_averages_chips_and_lists_what_it_cannot_read() -> None:
    source = TpuMonitoringSource(
        gauges=("duty_cycle_pct", "tensorcore_util", "tpu_throttle_score"),
        import_module=fake_sdk({"duty_cycle_pct": ["80.0", "60.0"], "tensorcore_util": []}),
    )
    reading = await source.read()
    assert isinstance(reading, MetricsSample)
    assert reading.gauges == {"duty_cycle_pct": 70.0}
    assert reading.missing == ("tensorcore_util", "tpu_throttle_score")


async def test_the_sdk_source_that_reads_nothing_is_blind() -> None:
    reading = await TpuMonitoringSource(import_module=fake_sdk({"duty_cycle_pct": ["n/a"]})).read()
    assert isinstance(reading, Blind) and "none of" in reading.reason


# --- the window arithmetic -----------------------------------------------------------------------

BOUNDS = (0.0, 10.0, 20.0, 30.0)  # buckets: <0, [0,10), [10,20), [20,30), >=30


def cum(buckets: tuple[int, ...], total: float, bounds: tuple[float, ...] = BOUNDS) -> Cumulative:
    return Cumulative(sum(buckets), total, bounds, buckets)


def sample(at: float, **dists: Cumulative) -> MetricsSample:
    return MetricsSample("service", at, dists, {"duty_cycle_pct": 50.0})


def test_quantiles_interpolate_inside_their_bucket() -> None:
    d = cum((0, 10, 10, 0, 0), 200.0)
    assert quantile(d, 0.5) == pytest.approx(10.0)  # the 10th value: the top of [0, 10)
    assert quantile(d, 0.9) == pytest.approx(18.0)  # the 18th: 8 of 10 into [10, 20)


def test_open_ended_buckets_give_their_finite_boundary() -> None:
    assert quantile(cum((5, 0, 0, 0, 0), -5.0), 0.5) == 0.0
    assert quantile(cum((0, 0, 0, 0, 5), 200.0), 0.9) == 30.0


def test_an_empty_distribution_has_no_quantile() -> None:
    assert quantile(cum((0, 0, 0, 0, 0), 0.0), 0.5) is None
    with pytest.raises(ValueError, match="quantile 1.0"):
        quantile(cum((0, 1, 0, 0, 0), 5.0), 1.0)


def test_a_window_is_the_difference_of_its_two_totals() -> None:
    prev = sample(100.0, lat=cum((0, 10, 0, 0, 0), 50.0))
    cur = sample(110.0, lat=cum((0, 10, 10, 0, 0), 200.0))
    w = window(prev, cur)
    assert (w.start, w.end) == (100.0, 110.0)
    # Only the 10 new values, all in [10, 20): mean 150/10, median half-way through the bucket.
    assert w.distributions == {"lat": MetricWindow(count=10, mean=15.0, p50=15.0, p90=19.0)}
    assert w.gauges == {"duty_cycle_pct": 50.0} and w.reset == ()


def test_a_window_without_new_values_has_a_count_and_nothing_else() -> None:
    d = cum((0, 3, 0, 0, 0), 15.0)
    assert window(sample(0.0, lat=d), sample(1.0, lat=d)).distributions["lat"] == MetricWindow(0, None, None, None)


@pytest.mark.parametrize(
    "cur",
    [
        cum((0, 2, 0, 0, 0), 10.0),  # fewer values than before: libtpu restarted
        cum((0, 5, 5, 0, 0), 100.0),  # as many in all, fewer in one bucket
        cum((0, 10, 10, 0, 0), 100.0, bounds=(0.0, 5.0, 20.0, 30.0)),  # another layout
    ],
)
def test_totals_that_went_backwards_make_no_window(cur: Cumulative) -> None:
    prev = cum((0, 10, 0, 0, 0), 50.0)
    assert difference(prev, cur) is None
    w = window(sample(0.0, lat=prev), sample(1.0, lat=cur))
    assert w.distributions == {} and w.reset == ("lat",)


def test_a_metric_first_seen_in_the_later_reading_waits_for_the_next_window() -> None:
    w = window(sample(0.0), sample(1.0, lat=cum((0, 1, 0, 0, 0), 5.0)))
    assert w.distributions == {} and w.reset == ()


def test_the_windower_starts_again_after_a_blind_reading() -> None:
    windows = Windower()
    a, b, c = (sample(t, lat=cum((0, int(t), 0, 0, 0), 5.0 * t)) for t in (1.0, 2.0, 3.0))
    assert windows.push(a) is None
    assert isinstance(windows.push(b), WindowSummary)
    assert windows.push(Blind("service", "refused")) == Blind("service", "refused")
    assert windows.push(c) is None  # no window spans the blind gap
    w = windows.push(sample(5.0, lat=cum((0, 5, 0, 0, 0), 25.0)))
    assert w is not None and not isinstance(w, Blind)
    assert (w.start, w.end) == (3.0, 5.0) and w.distributions["lat"].count == 2


def test_the_summary_is_plain_json() -> None:
    w = window(sample(0.0, lat=cum((0, 1, 0, 0, 0), 5.0)), sample(1.0, lat=cum((0, 1, 1, 0, 0), 20.0)))
    assert json.loads(json.dumps(w.to_dict())) == {
        "source": "service",
        "start": 0.0,
        "end": 1.0,
        "distributions": {"lat": {"count": 1, "mean": 15.0, "p50": 15.0, "p90": 19.0}},
        "gauges": {"duty_cycle_pct": 50.0},
        "reset": [],
    }
    assert Blind("sdk", "no libtpu").to_dict() == {"source": "sdk", "blind": "no libtpu"}


# --- reading the service's messages ----------------------------------------------------------------


def dist_metric(options: pb.Distribution.BucketOptions, counts: list[int], mean: float) -> pb.Metric:
    return pb.Metric(
        distribution=pb.Distribution(count=sum(counts), mean=mean, bucket_options=options, bucket_counts=counts)
    )


def test_bucket_layouts_are_read_as_google_api_distribution_defines_them() -> None:
    BO = pb.Distribution.BucketOptions
    exp = BO(exponential_buckets=BO.Exponential(num_finite_buckets=3, growth_factor=2.0, scale=1.0))
    lin = BO(linear_buckets=BO.Linear(num_finite_buckets=2, width=5.0, offset=10.0))
    explicit = BO(explicit_buckets=BO.Explicit(bounds=[1.0, 3.0]))
    assert cumulative_from_metrics([dist_metric(exp, [0, 1], 1.5)]).bounds == (1.0, 2.0, 4.0, 8.0)
    assert cumulative_from_metrics([dist_metric(lin, [1], 5.0)]).bounds == (10.0, 15.0, 20.0)
    assert cumulative_from_metrics([dist_metric(explicit, [], 0.0)]).bounds == (1.0, 3.0)


def test_a_metrics_devices_are_summed_and_short_bucket_lists_padded() -> None:
    BO = pb.Distribution.BucketOptions
    exp = BO(exponential_buckets=BO.Exponential(num_finite_buckets=2, growth_factor=2.0, scale=1.0))
    c = cumulative_from_metrics([dist_metric(exp, [0, 2], 1.5), dist_metric(exp, [0, 0, 1, 1], 3.0)])
    assert c == Cumulative(count=4, total=9.0, bounds=(1.0, 2.0, 4.0), buckets=(0, 2, 1, 1))


def test_devices_with_different_layouts_or_a_gauge_are_not_understood() -> None:
    BO = pb.Distribution.BucketOptions
    a = BO(exponential_buckets=BO.Exponential(num_finite_buckets=2, growth_factor=2.0, scale=1.0))
    b = BO(exponential_buckets=BO.Exponential(num_finite_buckets=2, growth_factor=3.0, scale=1.0))
    with pytest.raises(ValueError, match="different bucket layouts"):
        cumulative_from_metrics([dist_metric(a, [1], 0.5), dist_metric(b, [1], 0.5)])
    with pytest.raises(ValueError, match="expected a distribution"):
        cumulative_from_metrics([pb.Metric(gauge=pb.Gauge(as_double=1.0))])
