"""What the deploy manifests are sized from: the coordinator's RSS measured by ``python -m bench scale``.

Read from the benchmarks' JSON (docs/benchmarks.json, written by ``make bench-scale``), never
from the rendered page, so a re-layout of docs/benchmarks.md cannot change what the tests check.
One helper for tests/deploy/test_manifests.py and tests/deploy/test_inject.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import sections

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS_JSON = REPO / "docs" / "benchmarks.json"
PRODUCED_BY = "make bench-scale"
RSS_MARGIN = 1.5
"""A memory limit must be at least this many times the measured RSS (growth, allocator slack)."""


@dataclass(frozen=True)
class MeasuredRss:
    workers: int
    rss_mib: float
    valid: bool
    git_sha: str | None

    def __str__(self) -> str:
        validity = "valid run" if self.valid else "run marked invalid"
        return f"{self.rss_mib} MiB at {self.workers} workers ({validity}, commit {self.git_sha or 'unknown'})"


def coordinator_rss(path: Path = BENCHMARKS_JSON) -> MeasuredRss:
    """The coordinator's RSS at the largest worker count that recorded one.

    The largest size with an RSS, valid or not: bench/scale.py measures RSS only once every worker
    has registered and the job is running, so any recorded RSS is the memory of a full-size
    coordinator. A row is marked invalid for what happens after that (a fan-out that missed a
    worker, a heartbeat timeout, a saturated event loop); those spoil the CPU and latency figures,
    not the memory one, and a memory limit must cover the largest load that was measured, not only
    the largest that also met its latency checks.
    """
    where = f"{path.name} (written by `{PRODUCED_BY}`)"
    try:
        data: Any = json.loads(path.read_text())
    except FileNotFoundError:
        raise AssertionError(f"{path} does not exist: run `{PRODUCED_BY}` to measure the coordinator") from None
    except json.JSONDecodeError as e:
        raise AssertionError(f"{path} is not JSON ({e}): run `{PRODUCED_BY}` to write it again") from None
    scale = sections(data if isinstance(data, dict) else {}).get("scale")
    if scale is None:
        raise AssertionError(
            f"{where} has no scale benchmark in the current format (schema 2, under 'benchmarks'): run "
            f"`{PRODUCED_BY}` to measure the coordinator's RSS the deploy manifests are sized from"
        )
    rows = [r for r in scale.get("results", []) if isinstance(r.get("coordinator_rss_mib"), (int, float))]
    if not rows:
        sizes = [r.get("workers") for r in scale.get("results", [])]
        raise AssertionError(
            f"{where}: no scale row recorded the coordinator's RSS (sizes {sizes} never reached steady state): "
            f"run `{PRODUCED_BY}` again"
        )
    top = max(rows, key=lambda r: (int(r["workers"]), float(r["coordinator_rss_mib"])))
    return MeasuredRss(
        int(top["workers"]), float(top["coordinator_rss_mib"]), bool(top.get("valid")), scale.get("git_sha")
    )


def assert_limit_covers(limit_bytes: float, measured: MeasuredRss, where: str = "coordinator") -> None:
    """A memory limit below ``RSS_MARGIN`` x the measured RSS fails, naming both."""
    need = RSS_MARGIN * measured.rss_mib * 2**20
    assert limit_bytes >= need, (
        f"{where}: memory limit {limit_bytes:.0f} bytes ({limit_bytes / 2**20:.0f} MiB) is below "
        f"{RSS_MARGIN} x the measured {measured} = {need / 2**20:.0f} MiB"
    )
