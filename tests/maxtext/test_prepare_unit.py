"""The next mesh's compile (:mod:`trainer_hooks.maxtext.prepare`) without MaxText: its config overrides, one
background compile per slice set, a failure that is only logged, and the attempt's bounded wait."""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from trainer_hooks.maxtext.prepare import NextMeshCompiler, compile_in_turn, next_mesh_argv, refusal


def test_the_next_meshs_argv_replaces_the_keys_it_sets_and_keeps_the_jobs_others() -> None:
    argv = ["train.py", "base.yml", "steps=9", "num_slices=4", "elastic_enabled=true", "dcn_data_parallelism=-1"]
    got = next_mesh_argv(argv, devices=6, slices=3)
    assert got[:4] == ["train.py", "base.yml", "steps=9", "dcn_data_parallelism=-1"]
    keys = [a.split("=", 1)[0] for a in got]
    assert len(keys) == len(set(keys)), got
    assert {"num_slices=3", "internal_compile_num_devices=6", "elastic_enabled=false"} <= set(got)
    with pytest.raises(ValueError, match="0 devices"):
        next_mesh_argv(argv, devices=0, slices=3)


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"jax_cache_dir": ""}, "jax_cache_dir"),
        ({"jax_cache_dir": "/c", "dump_hlo": True}, "dump_hlo"),
        ({"jax_cache_dir": "/c", "compiled_trainstep_file": "f"}, "compiled_trainstep_file"),
        ({"jax_cache_dir": "/c", "enable_diloco": True}, "diloco"),
        ({"jax_cache_dir": "/c"}, None),
    ],
)
def test_a_prepare_is_refused_where_the_next_attempt_could_not_load_its_program(
    fields: dict[str, Any], why: str | None
) -> None:
    got = refusal(types.SimpleNamespace(**fields))
    assert (got is None) if why is None else (why in (got or "")), got


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, object]]] = []

    def __call__(self, kind: str, fields: dict[str, object]) -> None:
        self.events.append((kind, fields))


def test_one_compile_per_slice_set_in_the_background_with_the_latest_argv() -> None:
    release = threading.Event()
    calls: list[tuple[list[str], tuple[int, ...]]] = []
    daemon: list[bool] = []

    def compile(argv: Sequence[str], slices: Sequence[int], ready: Callable[[str], None]) -> dict[str, Any]:
        calls.append((list(argv), tuple(slices)))
        daemon.append(threading.current_thread().daemon)
        assert release.wait(10)
        return {"devices": 2 * len(slices), "seconds": 0.0}

    argv = ["train.py", "steps=5"]
    events = Recorder()
    c = NextMeshCompiler(lambda: argv, events, compile=compile)
    first = c((2, 0, 1))
    assert first is not None and not first.done(), "the prepare must not block its caller"
    assert c((0, 1, 2)) is None, "the same slice set twice: one compile"
    release.set()
    assert first.result(10) == {"devices": 6, "seconds": 0.0}
    assert calls == [(["train.py", "steps=5"], (0, 1, 2))]
    assert daemon == [True], "a compile in flight must not keep the process from exiting"
    assert events.events == [("prepared", {"slices": [0, 1, 2], "devices": 6, "seconds": 0.0})]


def test_a_failed_compile_is_logged_and_never_raised() -> None:
    def compile(argv: Sequence[str], slices: Sequence[int], ready: Callable[[str], None]) -> dict[str, Any]:
        raise RuntimeError("no such mesh")

    events = Recorder()
    future = NextMeshCompiler(lambda: [], events, compile=compile)((0, 1))
    assert future is not None and future.result(10) is None
    assert events.events == [("prepare_failed", {"slices": [0, 1], "error": "RuntimeError: no such mesh"})]


def test_the_programs_compile_in_turn_each_failure_named_and_only_all_failing_raises() -> None:
    ran: list[str] = []
    told: list[str] = []

    def ok(name: str) -> Any:
        return lambda: ran.append(name)

    def fails() -> None:
        ran.append("bad")
        raise RuntimeError("out of memory")

    compiles = [("initial_state", fails), ("train_step", ok("train_step"))]
    done, failed = compile_in_turn(compiles, told.append)
    assert ran == ["bad", "train_step"], "a failed program does not stop the next"
    assert list(done) == ["train_step"] and failed == {"initial_state": "RuntimeError: out of memory"}
    assert told == ["initial_state", "train_step"], "each one is ready (done with) in turn, failed or not"
    ran.clear()
    with pytest.raises(RuntimeError, match="out of memory"):
        compile_in_turn([("initial_state", fails), ("train_step", fails)])
    assert ran == ["bad", "bad"]


def test_the_attempt_waits_for_its_own_meshs_compile_only_and_at_most_its_timeout() -> None:
    release = threading.Event()

    def compile(argv: Sequence[str], slices: Sequence[int], ready: Callable[[str], None]) -> dict[str, Any]:
        assert release.wait(10)
        return {}

    events = Recorder()
    c = NextMeshCompiler(lambda: [], events, compile=compile)
    future = c((0, 1, 2))
    assert future is not None
    assert c.wait_for([0, 1, 3], 5.0) is False, "another mesh's compile: nothing to wait for"
    assert c.wait_for([2, 1, 0], 0.05) is True  # still compiling: the wait gives up at its timeout
    assert [k for k, _ in events.events] == ["prepare_waited"]
    release.set()
    future.result(10)
    assert c.wait_for([0, 1, 2], 5.0) is False, "a finished compile: nothing to wait for"
    assert [k for k, _ in events.events] == ["prepare_waited", "prepared"]


def test_the_attempt_waits_for_one_program_only_until_the_prepare_is_done_with_it() -> None:
    first_done = threading.Event()
    release = threading.Event()

    def compile(argv: Sequence[str], slices: Sequence[int], ready: Callable[[str], None]) -> dict[str, Any]:
        ready("initial_state")
        first_done.set()
        assert release.wait(10)
        ready("train_step")
        return {}

    events = Recorder()
    c = NextMeshCompiler(lambda: [], events, compile=compile)
    future = c((0, 1, 2))
    assert future is not None and first_done.wait(10)
    assert c.wait_for([0, 1, 2], 5.0, "initial_state") is False, "already compiled: nothing to wait for"
    assert c.wait_for([0, 1, 2], 0.05, "train_step") is True  # still compiling: given up at the timeout
    assert events.events[-1] == (
        "prepare_waited",
        {"slices": [0, 1, 2], "seconds": events.events[-1][1]["seconds"], "program": "train_step"},
    )
    waiter = threading.Thread(target=c.wait_for, args=([2, 1, 0], 10.0, "train_step"))
    waiter.start()
    release.set()
    waiter.join(10)
    assert not waiter.is_alive(), "the wait ends when the prepare is done with the program"
    future.result(10)
    assert c.wait_for([0, 1, 2], 5.0, "train_step") is False


def test_with_synthetic_input_the_prepare_loads_a_batch_first_under_the_attempts_default_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainer_hooks.maxtext import prepare

    devices = [types.SimpleNamespace(id=i, slice_index=s) for i, s in ((4, 2), (5, 2), (6, 3), (7, 3))]
    loaded: list[Any] = []
    monkeypatch.setattr(prepare, "warm_synthetic_input", lambda config, mesh, device: loaded.append(device))
    synthetic = types.SimpleNamespace(dataset_type="synthetic")
    programs = prepare.next_mesh_programs(synthetic, "mesh", devices)
    assert [name for name, _ in programs] == ["input_pipeline", "initial_state", "train_step"]
    programs[0][1]()
    assert loaded == [devices[0]], "pathwaysutils' default device: the first device of the first slice"
    # Other pipelines read files and start workers: nothing of theirs is loaded ahead.
    grain = types.SimpleNamespace(dataset_type="grain")
    assert [name for name, _ in prepare.next_mesh_programs(grain, "mesh", devices)] == ["initial_state", "train_step"]


def test_a_program_run_in_another_thread_is_not_compiled_again_under_the_same_default_device() -> None:
    """What loading a batch ahead relies on: JAX's in-memory caches are the process's, keyed on the default
    device, so the attempt's call of a function the prepare's thread called compiles nothing."""
    import jax

    compiles: list[str] = []
    counting = [True]

    def listener(event: str, duration: float, **_: Any) -> None:
        if counting and event.endswith("backend_compile_duration"):
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        device = jax.devices()[0]

        def draw() -> Any:
            with jax.default_device(device):
                return jax.random.randint(jax.random.PRNGKey(0), (7, 53), 0, 1001)

        worker = threading.Thread(target=lambda: draw().block_until_ready())
        worker.start()
        worker.join(60)
        assert compiles, "the thread compiled the draw"
        compiles.clear()
        draw().block_until_ready()
        assert compiles == []
    finally:
        counting.clear()
