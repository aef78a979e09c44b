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
    (compressed) writer depends on the machine's disk and cores: ``python -m bench flush`` measures
    both against a raw write + fsync.
    """
    import orbax.checkpoint as ocp

    return {n: ocp.PyTreeCheckpointHandler(use_compression=False) for n in names}
