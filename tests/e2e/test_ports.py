"""simjob.ports: under pytest-xdist each worker hands out ports from its own part of the range."""

from __future__ import annotations

import pytest

from simjob import ports


def test_without_xdist_a_process_has_the_whole_range() -> None:
    assert ports.share(20000, 32000, {}) == (20000, 32000)
    one = {"PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "1"}
    assert ports.share(20000, 32000, one) == (20000, 32000)


def test_the_workers_parts_are_disjoint_and_inside_the_range() -> None:
    parts = [
        ports.share(20000, 32000, {"PYTEST_XDIST_WORKER": f"gw{i}", "PYTEST_XDIST_WORKER_COUNT": "3"}) for i in range(3)
    ]
    assert parts == [(20000, 24000), (24000, 28000), (28000, 32000)]


def test_a_replacement_worker_takes_the_part_of_its_number_modulo_the_count() -> None:
    env = {"PYTEST_XDIST_WORKER": "gw4", "PYTEST_XDIST_WORKER_COUNT": "3"}
    assert ports.share(20000, 32000, env) == (24000, 28000)


@pytest.mark.parametrize("worker", ["master", "gw", "gwx", ""])
def test_a_name_that_is_not_an_xdist_worker_keeps_the_whole_range(worker: str) -> None:
    env = {"PYTEST_XDIST_WORKER": worker, "PYTEST_XDIST_WORKER_COUNT": "3"}
    assert ports.share(20000, 32000, env) == (20000, 32000)


@pytest.mark.parametrize("worker", ["gw0", "gw1", "gw2"])
def test_free_port_hands_out_only_the_workers_own_ports(monkeypatch: pytest.MonkeyPatch, worker: str) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    monkeypatch.setattr(ports, "_ephemeral_range", lambda: (32768, 60999))
    low, high = ports.share(20768, 32768)
    got = [ports.free_port() for _ in range(20)]
    assert all(low <= p < high for p in got), (worker, (low, high), got)
    assert len(set(got)) == len(got)
