"""The flush benchmark's fair raw writer, its per-run ratios and the verdict read from them."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from bench import flush
from bench.report import flush_band_distance, sections, targets
from tests.bench.test_report import fixture


def test_the_fair_raw_writer_is_the_fastest_of_the_three_plus_the_copy() -> None:
    parts = {"device_to_host": 0.1, "raw_single": 0.9, "raw_threads": 0.4, "raw_pieces": 0.6}
    assert flush.fair_raw(parts) == pytest.approx((0.5, 0.4))
    parts["raw_single"] = 0.3
    assert flush.fair_raw(parts) == pytest.approx((0.4, 0.3))
    parts["raw_pieces"] = 0.2
    assert flush.fair_raw(parts) == pytest.approx((0.3, 0.2))


def test_a_sizes_ratios_are_per_run_pairs_and_the_copy_is_shown_apart() -> None:
    # Five runs: raw (copy 0.1 + best writer) against Orbax; the third pair is an outlier.
    times = {
        "device_to_host": [0.1] * 5,
        "raw_single": [1.0, 1.0, 1.0, 1.0, 1.0],
        "raw_threads": [0.5, 0.6, 0.5, 0.7, 0.5],
        "raw_pieces": [0.6, 0.6, 0.6, 0.6, 0.6],
        "orbax_zstd": [1.2, 1.4, 6.0, 1.6, 1.2],
        "orbax_uncompressed": [0.6, 0.7, 0.6, 0.8, 0.6],
        "orbax_fast": [0.5, 0.7, 0.6, 0.7, 0.6],
    }
    times["raw_without_copy"] = [
        min(a, b, c) for a, b, c in zip(times["raw_single"], times["raw_threads"], times["raw_pieces"], strict=True)
    ]
    times["raw"] = [c + w for c, w in zip(times["device_to_host"], times["raw_without_copy"], strict=True)]
    rows = {r["method"]: r for r in flush.size_rows(256, 256 * 2**20, times)}
    assert set(rows) == {
        "raw",
        "orbax_zstd",
        "orbax_uncompressed",
        "orbax_fast",
        "device_to_host",
        "raw_single",
        "raw_threads",
        "raw_pieces",
    }
    z = rows["orbax_zstd"]
    per_run = sorted(r / o for r, o in zip(times["raw"], times["orbax_zstd"], strict=True))
    assert z["fraction_of_raw_median"] == pytest.approx(per_run[2], abs=1e-3)  # the median pair, not a mean
    assert z["fraction_of_raw_min"] == pytest.approx(per_run[0], abs=1e-3)
    assert z["fraction_of_raw_without_copy_median"] < z["fraction_of_raw_median"]
    assert rows["orbax_uncompressed"]["fraction_of_raw_median"] == pytest.approx(1.0, abs=1e-3)
    assert rows["raw"]["fraction_of_raw_median"] is None and rows["raw"]["includes_device_to_host"] is True
    assert rows["raw_threads"]["includes_device_to_host"] is False
    assert rows["raw_pieces"]["includes_device_to_host"] is False
    assert rows["orbax_fast"]["includes_device_to_host"] is True
    assert rows["orbax_fast"]["fraction_of_raw_median"] == pytest.approx(1.0, abs=1e-3)
    assert all(r["runs"] == 5 for r in rows.values())


def test_the_raw_writer_writes_and_fsyncs_every_leaf_single_and_threaded(tmp_path: Path) -> None:
    import numpy as np

    state = {f"layer_{i}": np.full(1000, i, np.float32) for i in range(4)}
    for threads in (1, 4):
        d = tmp_path / f"t{threads}"
        assert flush.raw_write(state, d, threads=threads) > 0
        for k, v in state.items():
            assert np.array_equal(np.fromfile(d / f"{k}.bin", np.float32), v)
    # In pieces of 1,000 bytes: 4 files a leaf of 4,000 bytes, which read back in order are the leaf.
    d = tmp_path / "pieces"
    assert flush.raw_write_pieces(state, d, piece=1000, threads=3) > 0
    for k, v in state.items():
        parts = sorted(d.glob(f"{k}.*.bin"), key=lambda p: int(p.name.split(".")[1]))
        assert len(parts) == 4
        assert np.array_equal(np.concatenate([np.fromfile(p, np.float32) for p in parts]), v)


def test_the_verdict_reads_the_median_and_needs_it_inside_the_band() -> None:
    assert flush_band_distance(0.9) == 0.0
    assert flush_band_distance(0.5) < flush_band_distance(1.5) < 0.0  # below the band counts worst
    doc = fixture()

    def verdict(median: float) -> str:
        d = copy.deepcopy(doc)
        row = next(r for r in d["benchmarks"]["flush"]["results"] if r["method"] == "orbax_uncompressed")
        row.update(fraction_of_raw_median=median, fraction_of_raw_min=0.1, fraction_of_raw_max=3.0)
        return next(v for v in targets(sections(d)) if v.target == "flush throughput (orbax_uncompressed)").verdict

    assert verdict(0.95) == "met"  # whatever the spread: the median pair decides
    assert verdict(0.69) == "not met"
    assert verdict(1.3) == "not met"  # faster than "raw": the raw writer was not a fair one


def test_settle_waits_for_the_background_deletion_of_the_step_before(tmp_path: Path) -> None:
    import threading
    import time

    (tmp_path / "7").mkdir()
    (tmp_path / "6").mkdir()
    threading.Timer(0.2, (tmp_path / "6").rmdir).start()  # Orbax's deleter thread, a little later
    t0 = time.monotonic()
    flush.settle(tmp_path, 7)
    assert time.monotonic() - t0 >= 0.15 and not (tmp_path / "6").exists()
    (tmp_path / "5").mkdir()  # never deleted: the wait ends, naming the directory
    with pytest.raises(TimeoutError, match="older steps still there"):
        flush.settle(tmp_path, 7, timeout=0.1)
