"""The host-link benchmark: its copy lands in pinned_host memory, and its figures are its pairs'."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bench import host_link

ROOT = Path(__file__).resolve().parents[2]


def test_a_copy_lands_in_pinned_host_memory_with_the_same_values_and_the_previous_one_is_held_then_freed_apart() -> (
    None
):
    import jax
    import numpy as np

    state = host_link.make_state(0.002, 2)
    copier = host_link.Copier("device_put", state)
    copier.issue(state, 1)
    copier.wait()
    first = copier.held
    assert set(first) == set(state)
    for k, v in first.items():
        assert v.sharding.memory_kind == "pinned_host"
        np.testing.assert_array_equal(jax.device_get(v), jax.device_get(state[k]))
    copier.issue(state, 2)
    assert copier.held is first  # held until the next copy completes, as the Snapshotter holds its newest
    copier.wait()
    assert copier.held is not first and copier.pending is None
    assert copier.retired is first  # freed only when asked, outside the timed window
    copier.release()
    assert copier.retired is None


def test_beside_compile_compiles_a_new_program_each_time_on_a_thread_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    seen: list[tuple[str, float]] = []
    compiler = host_link.Compiler(2, 8)
    real = compiler._compile
    monkeypatch.setattr(
        compiler, "_compile", lambda salt: (seen.append((threading.current_thread().name, salt)), real(salt))
    )
    for step in (1, 2):
        compiler.issue({}, step)
        compiler.wait()
    assert len(seen) == 2 and all(name != threading.main_thread().name for name, _ in seen)
    assert seen[0][1] != seen[1][1]  # a new constant each time: no compile cache can serve it


def test_a_run_gives_each_step_kind_its_pairs_and_the_medians_read_from_them(tmp_path: Path) -> None:
    out = tmp_path / "hl.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.host_link",
            "--state-gib",
            "0.01",
            "--leaves",
            "2",
            "--runs",
            "3",
            "--step-seconds",
            "0.002",
            "--git-sha",
            "abc",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"},
    )
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(out.read_text())
    assert d["git_sha"] == "abc" and d["machine"]["backend"] == "cpu"
    assert 0 < d["state_bytes"] <= 0.01 * 2**30
    c = d["copy"]
    assert c["runs"] == 3 == len(c["seconds"])
    assert c["seconds_median"] == pytest.approx(statistics.median(c["seconds"]))
    assert c["gb_per_s_median"] == pytest.approx(d["state_bytes"] / c["seconds_median"] / 1e9, rel=0.01)
    assert [r["step_kind"] for r in d["results"]] == ["matmul", "memory"]
    for r in d["results"]:
        assert r["runs"] == 3 == len(r["pairs"])
        assert [q["copy_first"] for q in r["pairs"]] == [False, True, False]
        slow = [q["with_s"] - q["without_s"] for q in r["pairs"]]
        assert r["slowdown_seconds_median"] == pytest.approx(statistics.median(slow), abs=2e-5)
        assert r["slowdown_over_step_median"] == pytest.approx(
            r["slowdown_seconds_median"] / r["step_seconds"], rel=0.01, abs=1e-3
        )
        assert r["window_steps"] >= 5
    assert "to pinned_host via device_put" in p.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [(["--step-kinds", "cache"], "cache"), (["--state-gib", "0"], "'0'"), (["--beside", "eval"], "'eval'")],
)
def test_bad_arguments_name_the_bad_value(args: list[str], named: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "bench.host_link", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert p.returncode != 0
    assert named in p.stderr
