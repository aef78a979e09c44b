"""The CPU stand-ins of :mod:`simjob.maxtext.cpu_elastic` without MaxText: slices, faults, a lost slice.

They run in the main venv (JAX on the CPU, no ``maxtext`` marker): the slice grouping and the fault
specification in this process, what losing a slice does to arrays in a child process with 8 CPU devices
(the device count is fixed when JAX starts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simjob.cpu_devices import cpu_device_env
from simjob.maxtext.cpu_elastic import (
    ENV_FAIL_AT,
    ENV_LOST_WAIT,
    ENV_SLICES,
    Fault,
    lost_wait_answer,
    parse_faults,
    slice_grouping,
)

REPO = Path(__file__).resolve().parents[2]


def test_slices_are_equal_groups_of_consecutive_device_ids_or_a_clear_error() -> None:
    assert slice_grouping(range(8), 4) == {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2, 6: 3, 7: 3}
    assert slice_grouping([3, 1, 2, 0], 2) == {0: 0, 1: 0, 2: 1, 3: 1}
    with pytest.raises(ValueError, match=f"{ENV_SLICES}=3: the 8 CPU devices do not form 3 equal slices"):
        slice_grouping(range(8), 3)


def test_faults_are_parsed_in_step_order_and_a_bad_one_is_named() -> None:
    assert parse_faults("5:3") == [Fault(5, 3, "step")]
    assert parse_faults("5:3, 8:2:snapshot") == [Fault(5, 3, "step"), Fault(8, 2, "snapshot")]
    for bad, why in (("x", "'x' is not STEP:SLICE"), ("5:1:later", "'5:1:later'"), ("-1:0", "'-1:0'")):
        with pytest.raises(ValueError, match=f"{ENV_FAIL_AT}=.*{why}"):
            parse_faults(bad)
    with pytest.raises(ValueError, match="in step order"):
        parse_faults("8:1,5:2")


def test_the_answer_to_a_wait_on_a_lost_buffer_is_error_or_ready_and_anything_else_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV_LOST_WAIT, raising=False)
    assert lost_wait_answer() == "error"
    monkeypatch.setenv(ENV_LOST_WAIT, "ready")
    assert lost_wait_answer() == "ready"
    monkeypatch.setenv(ENV_LOST_WAIT, "maybe")
    with pytest.raises(ValueError, match=f"{ENV_LOST_WAIT}='maybe': expected one of error, ready"):
        lost_wait_answer()


CHILD = r"""
import json, sys, threading
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from simjob.maxtext import cpu_elastic as ce

out = {}
ce.LOST.wait_answer = sys.argv[1]
ce.install_slice_index(4)
devs = jax.devices()
out["slices"] = [d.slice_index for d in devs]
whole = jax.device_put(np.arange(8.0), NamedSharding(Mesh(np.array(devs), ("data",)), P("data")))
on3 = [d for d in devs if d.slice_index == 3]
on0 = [d for d in devs if d.slice_index == 0]
only3 = jax.device_put(np.ones(2), NamedSharding(Mesh(np.array(on3), ("x",)), P("x")))
only0 = jax.device_put(np.ones(2), NamedSharding(Mesh(np.array(on0), ("x",)), P("x")))
out["deleted"] = ce.LOST.lose(ce.slice_devices(3))
out["only3_deleted"] = only3.is_deleted()
out["only0_sum"] = float(jnp.sum(only0))

def fails(f):
    try:
        f()
    except jax.errors.JaxRuntimeError as e:
        return str(e)
    except RuntimeError as e:  # a deleted array
        return "deleted: " + str(e)
    return None

out["wait_only3"] = fails(lambda: jax.block_until_ready(only3))
out["read_only3"] = fails(lambda: np.asarray(only3))

out["read_whole"] = fails(lambda: np.asarray(whole))
out["float_whole"] = fails(lambda: float(whole[0]))
out["wait_whole"] = fails(lambda: jax.block_until_ready(whole))
# a computation on the lost slice's devices (what pathwaysutils' health check runs): its wait fails
on_lost = jax.jit(lambda x: x + 1)(jax.device_put(np.zeros(2), NamedSharding(Mesh(np.array(on3), ("x",)), P("x"))))
out["health_lost"] = fails(lambda: jax.block_until_ready(on_lost))
on_live = jax.jit(lambda x: x + 1)(jax.device_put(np.zeros(2), NamedSharding(Mesh(np.array(on0), ("x",)), P("x"))))
out["health_live"] = fails(lambda: jax.block_until_ready(on_live))
seen = {}
def observer():
    ce.LOST.exempt_this_thread()
    seen["read"] = fails(lambda: jax.block_until_ready(whole))
t = threading.Thread(target=observer); t.start(); t.join()
out["exempt_read"] = seen["read"]
during = jax.device_put(np.zeros(8), NamedSharding(Mesh(np.array(devs), ("data",)), P("data")))  # made while lost
ce.LOST.reconnect(ce.slice_devices(3))
fresh = jax.jit(lambda x: x + 1)(jax.device_put(np.zeros(2), NamedSharding(Mesh(np.array(on3), ("x",)), P("x"))))
out["after_reconnect"] = float(jnp.sum(fresh))
# sticky: what spanned the lost slice during the loss stays unreadable once it is back
out["sticky_whole"] = fails(lambda: np.asarray(whole))
out["sticky_health"] = fails(lambda: jax.block_until_ready(on_lost))
out["sticky_during"] = fails(lambda: jax.block_until_ready(during))
out["only0_after"] = float(jnp.sum(only0))
print("RESULT " + json.dumps(out))
"""


def lose_slice_3(wait_answer: str) -> dict[str, object]:
    env = {**os.environ, **cpu_device_env(8)}
    r = subprocess.run(
        [sys.executable, "-c", CHILD, wait_answer], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, r.stderr[-3000:]
    return json.loads(line[len("RESULT ") :])


def test_a_lost_slice_deletes_what_lived_only_there_and_reads_of_what_spans_it_fail_with_data_loss_for_good() -> None:
    out = lose_slice_3("error")
    assert out["slices"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert out["deleted"] >= 1 and out["only3_deleted"] is True, out
    assert out["only0_sum"] == 2.0, "a survivor's array is untouched"
    for key in ("read_whole", "float_whole", "wait_whole", "health_lost"):
        assert out[key] and out[key].startswith("DATA_LOSS"), (key, out)
        assert "3" not in out[key], "the error names no slice or device"
    assert out["health_live"] is None, out
    assert out["exempt_read"] is None, "the event recorder's thread only observes"
    assert out["after_reconnect"] == 2.0, "the replacement slice computes again"
    for key in ("sticky_whole", "sticky_health", "sticky_during"):
        assert out[key] and out[key].startswith("DATA_LOSS"), ("the loss is sticky", key, out)
    assert out["only0_after"] == 2.0, "a survivor's array never spanned the lost slice"
    assert out["wait_only3"].startswith("DATA_LOSS"), out  # what Orbax's replica test meets: a dead replica


def test_the_kinder_runtime_answers_ready_to_a_wait_on_a_buffer_computed_before_the_loss_but_no_read_succeeds() -> None:
    """``ELASTIC_SIDECAR_TEST_LOST_WAIT=ready``: nothing is deleted and a wait on what was computed before the loss
    returns; every read of it, and anything computed on the lost slice (pathwaysutils' health check), fails."""
    out = lose_slice_3("ready")
    assert out["deleted"] == 0 and out["only3_deleted"] is False, out
    assert out["wait_only3"] is None and out["wait_whole"] is None, out
    for key in ("read_only3", "read_whole", "float_whole", "health_lost", "sticky_whole", "sticky_health"):
        assert out[key] and out[key].startswith("DATA_LOSS"), (key, out)
    assert out["sticky_during"] and out["sticky_during"].startswith("DATA_LOSS"), "made during the loss: never ready"
    assert out["health_live"] is None and out["after_reconnect"] == 2.0 and out["only0_after"] == 2.0, out


def test_every_maxtext_run_gets_an_empty_compile_cache_of_its_own(tmp_path: Path) -> None:
    from simjob.maxtext.job import maxtext_args

    def cache_of(args: list[str]) -> Path:
        (flag,) = [a for a in args if a.startswith("jax_cache_dir=")]
        return Path(flag.split("=", 1)[1])

    first, second = cache_of(maxtext_args(tmp_path, "a", 5)), cache_of(maxtext_args(tmp_path, "a", 5))
    assert first != second and first.is_dir() and not any(first.iterdir()), (first, second)
    (first / "program").write_text("compiled")
    with pytest.raises(ValueError, match="not empty"):
        maxtext_args(tmp_path, "a", 5, jax_cache=first)


def test_each_elastic_retry_attempt_start_is_an_event(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathwaysutils.elastic import elastic

    from simjob.maxtext import cpu_elastic

    asked: list[int] = []
    monkeypatch.setattr(elastic, "wait_for_slices", lambda slice_count, **kw: asked.append(slice_count) or {0})
    events = tmp_path / "events.jsonl"
    cpu_elastic._record_attempts(events)
    assert elastic.wait_for_slices(slice_count=3, poll_interval=10) == {0} and asked == [3]
    (line,) = [json.loads(x) for x in events.read_text().splitlines()]
    assert line["kind"] == "attempt" and line["pid"] == os.getpid()


def test_a_reused_compile_cache_is_an_explicit_choice(tmp_path: Path) -> None:
    from simjob.maxtext.job import maxtext_args

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "program").write_text("compiled")
    args = maxtext_args(tmp_path, "a", 5, jax_cache=cache, reuse_cache=True)
    assert f"jax_cache_dir={cache}" in args
    with pytest.raises(ValueError, match="reuse_cache"):
        maxtext_args(tmp_path, "a", 5, reuse_cache=True)


def test_the_tests_runs_share_one_warm_cache_unless_a_test_asks_for_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.maxtext import harness

    monkeypatch.setattr(harness, "_shared_cache", [])  # not the session's own: this test writes into it

    def cache_of(args: list[str]) -> str:
        (flag,) = [a for a in args if a.startswith("jax_cache_dir=")]
        return flag.split("=", 1)[1]

    shared = harness.maxtext_args(tmp_path, "a", 5)
    assert cache_of(shared) == cache_of(harness.maxtext_args(tmp_path, "b", 7)) == str(harness.shared_jax_cache())
    (harness.shared_jax_cache() / "program").write_text("compiled")  # warm: still accepted
    assert cache_of(harness.maxtext_args(tmp_path, "a", 5)) == str(harness.shared_jax_cache())
    fresh = harness.maxtext_args(tmp_path, "a", 5, fresh_cache=True)
    assert cache_of(fresh) != str(harness.shared_jax_cache()) and not any(Path(cache_of(fresh)).iterdir())

    # Runs on the shared cache cache every program; a caller's own setting wins; a fresh cache is left alone.
    assert harness.cache_env(shared, None) == {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    assert harness.cache_env(shared, {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "5", "X": "1"}) == {
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "5",
        "X": "1",
    }
    assert harness.cache_env(fresh, {"X": "1"}) == {"X": "1"}
