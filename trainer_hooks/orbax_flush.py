"""An Orbax flusher for :class:`trainer_hooks.ElasticSession`.

Emergency flush, the only sequence after which a step counts (FACTS section 3):
wait for any in-flight async save, ``save(step, args, force=True)``, then
``wait_until_finished()``; the step is committed only if it is listed when
the manager re-reads the directory afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer_hooks.session import FlushResult


def tree_nbytes(tree: Any) -> int:
    import jax

    return sum(int(getattr(x, "nbytes", 0)) for x in jax.tree_util.tree_leaves(tree))


class OrbaxFlusher:
    """``make_args(step, down_slices) -> (ocp.args.*, nbytes)`` builds what to save.

    ``down_slices`` lets the trainer assemble the state from surviving replicas
    only, so a flush never reads from lost devices.
    """

    def __init__(self, manager: Any, make_args: Callable[[int, frozenset[int]], tuple[Any, int]]) -> None:
        self.manager = manager
        self.make_args = make_args

    def committed_steps(self) -> list[int]:
        reload = getattr(self.manager, "reload", None)
        if reload is not None:
            reload()
            return sorted(self.manager.all_steps())
        return sorted(self.manager.all_steps(read=True))

    def __call__(self, step: int, down_slices: frozenset[int]) -> FlushResult:
        self.manager.wait_until_finished()
        if step in self.committed_steps():
            return FlushResult(step, 0)
        args, nbytes = self.make_args(step, down_slices)
        self.manager.save(step, args=args, force=True)
        self.manager.wait_until_finished()
        steps = self.committed_steps()
        if step not in steps:
            raise RuntimeError(f"Orbax did not commit step {step}; committed steps are {steps}")
        return FlushResult(step, nbytes)


def uncompressed_item_handlers(*names: str) -> dict[str, Any]:
    """Item handlers that write without zstd compression, for a flush that must be fast, not small.

    ``ocp.CheckpointManager(dir, options, item_handlers=uncompressed_item_handlers("state"))``, then
    save with ``ocp.args.Composite(state=ocp.args.PyTreeSave(tree))``. Whether it beats the default
    (compressed) writer depends on the machine's disk and cores: zstd is the bottleneck on few cores.
    """
    import orbax.checkpoint as ocp

    return {n: ocp.PyTreeCheckpointHandler(use_compression=False) for n in names}


FAST_FLUSH_DATA_FILE_BYTES = 32 * 2**20
"""The OCDBT data file size a fast flush asks for (``ocdbt_target_data_file_size``; Orbax 0.12.8's default is
2 GiB on a local file system and 400 MiB on GCS, MaxText's ``checkpoint_storage_target_data_file_size_bytes``
2 GiB; https://google.github.io/tensorstore/kvstore/ocdbt/index.html, ``target_data_file_size``). With 2 GiB
files a host's shards go to disk in a file or two, with 32 MiB files in many, written side by side,
which brings uncompressed Orbax close to a raw write + fsync. The cost is file count: a flush writes a file per 32 MiB of a host's shards instead of one or two."""


def fast_flush_manager_options(**options: Any) -> Any:
    """``ocp.CheckpointManagerOptions`` for a manager whose flushes must be fast: ``options`` as given, plus
    ``enable_background_delete=True``, so that dropping a step past ``max_to_keep`` happens on a thread
    of its own. Otherwise Orbax 0.12.8 deletes it inside the save's finalisation, after the new step is
    finalised but before ``wait_until_finished`` returns (``CheckpointManager._finalize``), and a flush
    waits for it; ``close()`` waits for the background deletions."""
    import orbax.checkpoint as ocp

    return ocp.CheckpointManagerOptions(**{"enable_background_delete": True, **options})


def fast_flush_args(tree: Any, data_file_bytes: int = FAST_FLUSH_DATA_FILE_BYTES) -> Any:
    """``ocp.args.PyTreeSave`` of ``tree`` with OCDBT data files of ``data_file_bytes``, for a manager whose
    item uses :func:`uncompressed_item_handlers` (the handler decides compression, the save the file size)."""
    import orbax.checkpoint as ocp

    if data_file_bytes <= 0:
        raise ValueError(f"data_file_bytes must be positive, got {data_file_bytes}")
    return ocp.args.PyTreeSave(tree, ocdbt_target_data_file_size=data_file_bytes)
