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


CAPACITY_WORKERS = 10_000
"""The job size the shipped coordinator limit is for (agent/inject.py, deploy/base)."""


@dataclass(frozen=True)
class MeasuredRss:
    workers: int
    """The job size the figure is for (``CAPACITY_WORKERS``)."""
    rss_mib: float
    valid: bool
    git_sha: str | None
    points: tuple[tuple[int, float], ...] = ()
    """(workers registered, RSS MiB) measured; when none reached ``workers``, rss_mib is the
    straight line through them, at ``workers``."""

    def __str__(self) -> str:
        measured = ", ".join(f"{r:g} MiB at {n}" for n, r in self.points)
        how = "measured" if any(n >= self.workers for n, _ in self.points) else "extrapolated"
        validity = "valid run" if self.valid else "run marked invalid"
        return (
            f"{self.rss_mib:.1f} MiB at {self.workers} workers ({how} from {measured}; {validity}, "
            f"commit {self.git_sha or 'unknown'})"
        )


def _points(rows: list[dict[str, Any]]) -> list[tuple[int, float, bool]]:
    """(workers registered, RSS MiB, valid) per row that measured one: at steady state, or when it collapsed."""
    out = []
    for r in rows:
        rss, n = r.get("coordinator_rss_mib"), r.get("workers")
        if not isinstance(rss, (int, float)):
            rss, n = r.get("coordinator_rss_mib_at_collapse"), r.get("workers_registered")
        if isinstance(rss, (int, float)) and isinstance(n, int) and n > 0:
            out.append((n, float(rss), bool(r.get("valid"))))
    return out


def coordinator_rss(path: Path = BENCHMARKS_JSON, workers: int = CAPACITY_WORKERS) -> MeasuredRss:
    """The coordinator's RSS with ``workers`` registered, from the scale benchmark's rows.

    Every row that measured an RSS counts, valid or not: "invalid" is about CPU and fan-out (a
    missed worker, a heartbeat timeout, a saturated event loop), not memory. A run that collapsed
    during registration records the RSS and the number registered when it did. Where a run
    reached ``workers``, the largest RSS there is the figure; otherwise the least-squares line
    through the points (RSS grows with the registered workers: one stream, one host record
    each) at ``workers``, which needs at least two sizes; on a 2-core machine the load generators
    fall over long before 10,000 workers.
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
    pts = _points(list(scale.get("results", [])))
    sha = scale.get("git_sha")
    points = tuple(sorted((n, r) for n, r, _ in pts))
    # The size itself where it was run (a larger size's RSS is not this one's), else the smallest larger one.
    at = [(r, v) for n, r, v in pts if n == workers]
    larger = sorted((n, r, v) for n, r, v in pts if n > workers)
    full = at or [(r, v) for n, r, v in larger if n == larger[0][0]]
    if full:
        rss, valid = max(full)
        return MeasuredRss(workers, rss, valid, sha, points)
    sizes = sorted({n for n, _, _ in pts})
    if len(sizes) < 2:
        raise AssertionError(
            f"{where}: the coordinator's RSS is measured at {sizes or 'no'} size(s), none with {workers} "
            f"workers registered; two sizes are needed to extrapolate: run `{PRODUCED_BY}` again"
        )
    mx = sum(n for n, _, _ in pts) / len(pts)
    my = sum(r for _, r, _ in pts) / len(pts)
    slope = sum((n - mx) * (r - my) for n, r, _ in pts) / sum((n - mx) ** 2 for n, _, _ in pts)
    rss = my + slope * (workers - mx)
    return MeasuredRss(workers, max(rss, max(r for _, r, _ in pts)), all(v for _, _, v in pts), sha, points)


def assert_limit_covers(limit_bytes: float, measured: MeasuredRss, where: str = "coordinator") -> None:
    """A memory limit below ``RSS_MARGIN`` x the measured RSS fails, naming both."""
    need = RSS_MARGIN * measured.rss_mib * 2**20
    assert limit_bytes >= need, (
        f"{where}: memory limit {limit_bytes:.0f} bytes ({limit_bytes / 2**20:.0f} MiB) is below "
        f"{RSS_MARGIN} x the measured {measured} = {need / 2**20:.0f} MiB"
    )
