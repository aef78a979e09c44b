"""The Orbax flusher against a real CheckpointManager with async checkpointing on."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy")
jax = pytest.importorskip("jax")
ocp = pytest.importorskip("orbax.checkpoint")

from protos.elastic_sidecar.v1 import trainer_pb2  # noqa: E402
from trainer_hooks import AbortTraining, ElasticSession, FlushResult  # noqa: E402
from trainer_hooks.orbax_flush import OrbaxFlusher, tree_nbytes  # noqa: E402


def make_tree(step: int, n: int = 1024) -> dict[str, Any]:
    return {
        "w": np.full((n, 8), float(step), np.float32),
        "b": jax.numpy.arange(16, dtype=jax.numpy.float32) + step,
        "count": np.asarray(step, np.int64),
    }


def save_args(tree: dict[str, Any]) -> Any:
    return ocp.args.Composite(state=ocp.args.StandardSave(tree))


def committed(manager: Any) -> list[int]:
    return sorted(manager.all_steps(read=True))


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[Any]:
    m = ocp.CheckpointManager(
        tmp_path / "checkpoints",
        options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True, max_to_keep=10),
    )
    try:
        yield m
    finally:
        m.wait_until_finished()
        m.close()


class Recorder:
    """``make_args`` that records its calls (and what was committed at the time)."""

    def __init__(self, manager: Any, fail_on: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.manager = manager
        self.fail_on = fail_on
        self.calls: list[tuple[int, frozenset[int], list[int]]] = []

    def __call__(self, step: int, down: frozenset[int]) -> tuple[Any, int]:
        self.calls.append((step, down, committed(self.manager)))
        if step in self.fail_on:
            raise RuntimeError(f"cannot flush step {step}: no surviving replica of the state")
        tree = make_tree(step)
        return save_args(tree), tree_nbytes(tree)


def test_flush_commits_the_step(manager: Any, tmp_path: Path) -> None:
    rec = Recorder(manager)
    res = OrbaxFlusher(manager, rec)(7, frozenset({2}))
    expected_bytes = tree_nbytes(make_tree(7))
    assert res == FlushResult(7, expected_bytes)
    assert expected_bytes == 1024 * 8 * 4 + 16 * 4 + 8
    assert [c[:2] for c in rec.calls] == [(7, frozenset({2}))]
    assert committed(manager) == [7]
    assert not manager.is_saving_in_progress()

    # Committed means readable by a fresh manager, not just listed.
    fresh = ocp.CheckpointManager(tmp_path / "checkpoints")
    try:
        assert fresh.all_steps() == [7]
        restored = fresh.restore(7, args=ocp.args.Composite(state=ocp.args.StandardRestore(make_tree(0))))["state"]
    finally:
        fresh.close()
    np.testing.assert_array_equal(np.asarray(restored["w"]), make_tree(7)["w"])
    np.testing.assert_array_equal(np.asarray(restored["b"]), np.asarray(make_tree(7)["b"]))
    assert int(restored["count"]) == 7


def test_a_second_flush_of_the_same_step_is_a_noop(manager: Any) -> None:
    rec = Recorder(manager)
    flusher = OrbaxFlusher(manager, rec)
    assert flusher(4, frozenset()).committed_step == 4
    again = flusher(4, frozenset({1}))
    assert again == FlushResult(4, 0)
    assert len(rec.calls) == 1  # nothing was built or saved again
    assert committed(manager) == [4]
    # A step a periodic save already committed is not saved again either.
    manager.save(6, args=save_args(make_tree(6)))
    manager.wait_until_finished()
    assert flusher(6, frozenset()) == FlushResult(6, 0)
    assert len(rec.calls) == 1


def test_a_flush_waits_for_an_inflight_async_save(manager: Any) -> None:
    big = make_tree(3, n=512 * 1024)  # 16 MiB: still being written when save() returns
    manager.save(3, args=save_args(big))
    inflight = manager.is_saving_in_progress()
    order: list[str] = []
    real_wait = manager.wait_until_finished

    class Spy:
        def __getattr__(self, name: str) -> Any:
            return getattr(manager, name)

        def wait_until_finished(self) -> None:
            order.append("wait")
            real_wait()

        def save(self, step: int, **kw: Any) -> bool:
            order.append(f"save {step} force={kw.get('force')}")
            return manager.save(step, **kw)

    rec = Recorder(manager)
    res = OrbaxFlusher(Spy(), rec)(5, frozenset())
    assert res.committed_step == 5
    assert order == ["wait", "save 5 force=True", "wait"]
    # When the flush built its state, the periodic save of step 3 had committed.
    assert rec.calls == [(5, frozenset(), [3])]
    assert committed(manager) == [3, 5]
    print(f"\n[orbax] step 3 save still in flight when the flush started: {inflight}")
    assert inflight, "the 16 MiB async save finished before save() returned; the test proves nothing"


def test_make_args_raising_propagates_and_commits_nothing(manager: Any) -> None:
    rec = Recorder(manager, fail_on={9})
    flusher = OrbaxFlusher(manager, rec)
    flusher(4, frozenset())
    with pytest.raises(RuntimeError, match="no surviving replica"):
        flusher(9, frozenset({0, 1}))
    assert committed(manager) == [4]


class FakeLink:
    """What ElasticSession needs of a SidecarLink, fed by a script of commands."""

    address = "fake"

    def __init__(self, *cmds: trainer_pb2.SidecarCommand) -> None:
        self.inbox: collections.deque[trainer_pb2.SidecarCommand] = collections.deque(cmds)
        self.sent: list[trainer_pb2.TrainerMessage] = []

    def send(self, msg: trainer_pb2.TrainerMessage) -> None:
        self.sent.append(msg)

    def next_command(self, timeout: float | None = None, **_: object) -> trainer_pb2.SidecarCommand | None:
        return self.inbox.popleft() if self.inbox else None

    def flush_outbox(self, timeout: float = 2.0) -> None:
        pass

    def close(self) -> None:
        pass


def hold(gen: int, flush: bool = True) -> trainer_pb2.SidecarCommand:
    return trainer_pb2.SidecarCommand(
        hold=trainer_pb2.Hold(generation=gen, flush=flush, down_slices=[1], reason="test")
    )


def resume(gen: int) -> trainer_pb2.SidecarCommand:
    return trainer_pb2.SidecarCommand(
        resume=trainer_pb2.Resume(generation=gen, active_slices=[0], source=trainer_pb2.Resume.MEMORY, reason="test")
    )


def test_a_failed_flush_is_acknowledged_with_the_previous_committed_step(manager: Any) -> None:
    rec = Recorder(manager, fail_on={8})
    link = FakeLink(hold(1), resume(1))
    events: list[tuple[str, dict[str, object]]] = []
    session = ElasticSession(link, flush=OrbaxFlusher(manager, rec), on_event=lambda k, f: events.append((k, f)))  # type: ignore[arg-type]

    d = session.step_boundary(4)  # a hold with flush: step 4 is committed
    assert d is not None and (d.generation, d.active_slices, d.source) == (1, (0,), "memory")
    acks = [m.held for m in link.sent if m.HasField("held")]
    assert [(a.generation, a.step, a.committed_step) for a in acks] == [(1, 4, 4)]
    assert acks[0].flush_bytes == tree_nbytes(make_tree(4))
    assert acks[0].flush_error == ""

    link.inbox.extend([hold(2), resume(2)])
    d = session.step_boundary(8)  # the flush of step 8 fails: the hold is still acknowledged
    assert d is not None and d.generation == 2
    acks = [m.held for m in link.sent if m.HasField("held")]
    assert [(a.generation, a.step, a.committed_step, a.flush_bytes) for a in acks[1:]] == [(2, 8, 4, 0)]
    assert "no surviving replica" in acks[1].flush_error  # acknowledged as failed, not as committed
    failed = [f for k, f in events if k == "flush_failed"]
    assert len(failed) == 1 and failed[0]["step"] == 8 and "no surviving replica" in str(failed[0]["error"])
    assert session.committed_step == 4
    assert committed(manager) == [4]

    # An abort flushes once more (and fails again): it still carries the committed step.
    link.inbox.append(trainer_pb2.SidecarCommand(abort=trainer_pb2.Abort(generation=2, exit_code=42, reason="gone")))
    with pytest.raises(AbortTraining) as ei:
        session.step_boundary(8)
    assert (ei.value.exit_code, ei.value.committed_step) == (42, 4)


def test_do_flush_skips_a_step_already_flushed(manager: Any) -> None:
    rec = Recorder(manager)
    session = ElasticSession(FakeLink(), flush=OrbaxFlusher(manager, rec))  # type: ignore[arg-type]
    assert session._do_flush(3) == (tree_nbytes(make_tree(3)), "")
    assert session._do_flush(3) == (0, "")
    assert session._do_flush(-1) == (0, "")  # nothing in memory yet: nothing to flush
    assert session._do_flush(0) == (0, "")  # nothing trained yet
    assert [c[0] for c in rec.calls] == [3]
    assert session.committed_step == 3


def test_an_uncompressed_flush_commits_and_restores_the_same_values(tmp_path: Path) -> None:
    from trainer_hooks.orbax_flush import uncompressed_item_handlers

    rng = np.random.default_rng(0)
    tree = {"w": rng.random((256, 64), dtype=np.float32), "b": rng.random(64, dtype=np.float32)}
    m = ocp.CheckpointManager(
        tmp_path / "nc",
        options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True),
        item_handlers=uncompressed_item_handlers("state"),
    )
    try:
        res = OrbaxFlusher(m, lambda step, down: (ocp.args.Composite(state=ocp.args.PyTreeSave(tree)), 1))(
            3, frozenset()
        )
        assert res.committed_step == 3
        back = m.restore(3, args=ocp.args.Composite(state=ocp.args.PyTreeRestore()))["state"]
    finally:
        m.wait_until_finished()
        m.close()
    np.testing.assert_array_equal(np.asarray(back["w"]), tree["w"])
    np.testing.assert_array_equal(np.asarray(back["b"]), tree["b"])
    # Uncompressed: the array data on disk is at least as large as the arrays.
    on_disk = sum(f.stat().st_size for f in (tmp_path / "nc" / "3").rglob("*") if f.is_file())
    assert on_disk >= tree["w"].nbytes + tree["b"].nbytes


def data_files(root: Path) -> list[Path]:
    """OCDBT's data files under ``root`` (TensorStore names them ``d/<hex>``)."""
    return [p for p in root.rglob("*") if p.is_file() and p.parent.name == "d"]


def test_a_fast_flush_commits_in_small_data_files_and_restores_equal(tmp_path: Path) -> None:
    from trainer_hooks.orbax_flush import fast_flush_args, fast_flush_manager_options, uncompressed_item_handlers

    opts = fast_flush_manager_options(enable_async_checkpointing=True, max_to_keep=1)
    assert opts.enable_background_delete and opts.max_to_keep == 1
    tree = {f"layer_{i}": np.random.default_rng(i).random(64 * 1024, dtype=np.float32) for i in range(4)}  # 1 MiB
    sizes = {}
    for name, size in (("big", 2**31), ("small", 64 * 1024)):
        d = tmp_path / name
        m = ocp.CheckpointManager(d, options=opts, item_handlers=uncompressed_item_handlers("state"))
        try:

            def make_args(step: int, down: frozenset[int], size: int = size) -> tuple[Any, int]:
                return ocp.args.Composite(state=fast_flush_args(tree, data_file_bytes=size)), tree_nbytes(tree)

            fl = OrbaxFlusher(m, make_args)
            assert fl(3, frozenset()) == FlushResult(3, tree_nbytes(tree))
            assert fl(4, frozenset()) == FlushResult(4, tree_nbytes(tree))
        finally:
            m.wait_until_finished()
            m.close()
        fresh = ocp.CheckpointManager(d, item_handlers=uncompressed_item_handlers("state"))
        try:
            assert fresh.all_steps() == [4]  # max_to_keep=1: step 3 went, on the background thread
            out = fresh.restore(4, args=ocp.args.Composite(state=ocp.args.PyTreeRestore()))["state"]
            assert set(out) == set(tree) and all(np.array_equal(out[k], tree[k]) for k in tree)
        finally:
            fresh.close()
        sizes[name] = len(data_files(d / "4"))
    # The file size asked for reached TensorStore: 1 MiB in 64 KiB files is many files, in 2 GiB ones a few.
    assert sizes["small"] >= 8 > sizes["big"], sizes
    with pytest.raises(ValueError, match="-1"):
        fast_flush_args(tree, data_file_bytes=-1)
