"""The demo's slow faults: the factors the harness hands the trainer, and each host's stand-in
libtpu metrics service, read over gRPC with the real service's messages."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

from simjob.slowdowns import MetricsHosts, Slowdowns, SlowFile
from standins.tpu_metrics import COLLECTIVE, HLO_EXEC


def test_the_factors_are_the_largest_slowdown_on_each_slice_until_it_ends(tmp_path: Path) -> None:
    path = tmp_path / "slowdowns.json"
    sd = Slowdowns(path, 4)
    trainer = SlowFile(path)
    assert json.loads(path.read_text()) == {} and trainer.step_factor([0, 1, 2, 3]) == (1.0, {})
    two = sd.start(2, 1.5)
    every = sd.start(None, 1.2)
    assert sd.factors() == {0: 1.2, 1: 1.2, 2: 1.5, 3: 1.2}
    assert trainer.step_factor([0, 1, 2, 3]) == (1.5, {0: 1.2, 1: 1.2, 2: 1.5, 3: 1.2})
    # A drained slow slice slows no one: the step takes the slowest ACTIVE slice's pace.
    assert trainer.step_factor([0, 1, 3]) == (1.2, {0: 1.2, 1: 1.2, 3: 1.2})
    sd.end(every)
    assert trainer.step_factor([0, 1, 3]) == (1.0, {})
    assert trainer.step_factor([2, 3]) == (1.5, {2: 1.5})
    sd.end(two)
    assert trainer.step_factor([2, 3]) == (1.0, {})


def test_a_trainer_without_the_file_runs_at_its_pace(tmp_path: Path) -> None:
    assert SlowFile(None).step_factor([0, 1]) == (1.0, {})
    assert SlowFile(tmp_path / "never-written.json").step_factor([0, 1]) == (1.0, {})


@pytest.fixture
def hosts() -> Iterator[MetricsHosts]:
    m = MetricsHosts([(s, 0) for s in range(3)])
    m.start()
    try:
        yield m
    finally:
        m.stop()


def _read(target: str, name: str) -> list[pb.Distribution]:
    # libtpu serves with local credentials; the stand-in too.
    with grpc.secure_channel(target, grpc.local_channel_credentials()) as ch:
        resp = pb_grpc.RuntimeMetricServiceStub(ch).GetRuntimeMetric(pb.MetricRequest(metric_name=name), timeout=10)
    return [m.distribution for m in resp.metric.metrics]


def _settled(hosts: MetricsHosts, count: int) -> None:
    """Wait until host 0.0 counted ``count`` steps (the steps are applied in the services' thread)."""
    for _ in range(500):
        if _read(hosts.target(0, 0), COLLECTIVE)[0].count == count:
            return
    raise AssertionError(f"host 0.0 never counted {count} steps")


def test_a_slow_slice_waits_least_at_the_collective_and_a_drained_one_stands_still(hosts: MetricsHosts) -> None:
    for _ in range(5):
        hosts.step(0.1, [0, 1, 2], {})
    for _ in range(10):
        hosts.step(0.15, [0, 1, 2], {2: 1.5})
    _settled(hosts, 15)
    coll = {s: _read(hosts.target(s, 0), COLLECTIVE)[0] for s in range(3)}
    hlo = {s: _read(hosts.target(s, 0), HLO_EXEC)[0] for s in range(3)}
    assert {d.count for d in coll.values()} == {15}
    # Every host ran the same steps (same step time); the slow one arrived last and waited least.
    assert len({round(d.mean, 3) for d in hlo.values()}) == 1
    assert coll[2].mean < coll[0].mean and coll[0].mean == pytest.approx(coll[1].mean)
    assert coll[2].max < coll[0].max
    # Slice 2 drained: its host runs no step, the others no longer wait for it.
    for _ in range(5):
        hosts.step(0.1, [0, 1], {})
    _settled(hosts, 20)
    assert _read(hosts.target(2, 0), COLLECTIVE)[0].count == 15
    assert _read(hosts.target(1, 0), COLLECTIVE)[0].count == 20
    # Recreated, its new host counts from zero.
    hosts.reset(2)
    hosts.step(0.1, [0, 1, 2], {})
    _settled(hosts, 21)
    assert _read(hosts.target(2, 0), COLLECTIVE)[0].count == 1


def test_every_slice_slowed_alike_shows_no_lateness(hosts: MetricsHosts) -> None:
    for _ in range(8):
        hosts.step(0.13, [0, 1, 2], {0: 1.3, 1: 1.3, 2: 1.3})
    _settled(hosts, 8)
    means = {round(_read(hosts.target(s, 0), COLLECTIVE)[0].mean, 6) for s in range(3)}
    assert len(means) == 1
