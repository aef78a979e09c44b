"""Host copies of a JAX train state, keyed by slice: the example trainer's snapshots (``simjob/trainer.py``).

Kept for the simulated job's example JAX trainer, which reads its state back
through NumPy. The MaxText hook does not use this: its snapshots go through
Orbax's Pathways ``Snapshotter`` (:mod:`trainer_hooks.maxtext.snapshot`), which
keeps them in pinned host memory beside each shard and never in the trainer
process. Imports JAX only when a snapshot is taken.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Leaf:
    shape: tuple[int, ...] = ()
    dtype: Any = None
    value: Any = None
    """A leaf that is not a sharded array (kept whole)."""
    shards: dict[tuple[tuple[int, int], ...], dict[int, Any]] = field(default_factory=dict)
    """Shard bounds ((start, stop) per dimension) -> slice -> host copy."""
    key_impl: Any = None
    """For a PRNG key array: its implementation (the copies hold its key data)."""


@dataclass
class Snapshot:
    step: int
    """Completed steps the state holds."""
    treedef: Any
    leaves: list[_Leaf]
    seconds: float
    nbytes: int

    def assemble(self, lost: Iterable[int]) -> Any | None:
        """The state from the copies of slices not in ``lost``; None when a shard has no surviving copy."""
        import numpy as np

        gone = set(lost)
        out = []
        for leaf in self.leaves:
            if not leaf.shards:
                out.append(leaf.value)
                continue
            arr = np.empty(leaf.shape, leaf.dtype)
            for index, copies in leaf.shards.items():
                alive = [c for s, c in copies.items() if s not in gone]
                if not alive:
                    return None
                arr[tuple(slice(a, b) for a, b in index)] = alive[0]
            if leaf.key_impl is not None:
                import jax

                out.append(jax.random.wrap_key_data(arr, impl=leaf.key_impl))  # type: ignore[arg-type]
                continue
            out.append(arr)
        import jax

        return jax.tree_util.tree_unflatten(self.treedef, out)


def take(
    state: Any,
    step: int,
    slice_of: Callable[[Any], int],
    reuse: Snapshot | None = None,
    exclude: Iterable[int] = (),
) -> Snapshot:
    """Copy every shard of ``state`` to host memory, keyed by the slice of its device.

    ``reuse``: the snapshot this one replaces. Its host buffers are written over where a shard's
    shape and dtype match (copying into pages already mapped is several times faster than into a
    fresh allocation: about 0.13 s against 0.7 s a GiB here), so it is no longer valid afterwards,
    even when this call raises part-way: the caller drops it either way. ``exclude``: slices known
    to be lost, whose shards are not read (a read would fail).
    """
    import jax
    import numpy as np

    t0 = time.monotonic()
    flat, treedef = jax.tree_util.tree_flatten(state)
    old = reuse.leaves if reuse is not None and reuse.treedef == treedef else None
    skip = set(exclude)
    leaves: list[_Leaf] = []
    nbytes = 0
    for i, x in enumerate(flat):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            raise ValueError("snapshots need fully addressable arrays (single-controller)")
        if isinstance(x, jax.Array):
            impl = None
            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                impl, x = jax.random.key_impl(x), jax.random.key_data(x)
            leaf = _Leaf(shape=tuple(x.shape), dtype=x.dtype, key_impl=impl)
            prev = old[i].shards if old is not None and (old[i].shape, old[i].dtype) == (leaf.shape, x.dtype) else {}
            for sh in x.addressable_shards:
                key = _bounds(sh.index, x.shape)
                per_slice = leaf.shards.setdefault(key, {})
                s = slice_of(sh.device)
                if s not in per_slice and s not in skip:  # one copy per slice is enough
                    data = np.asarray(sh.data)
                    buf = prev.get(key, {}).get(s)
                    if buf is not None and buf.shape == data.shape and buf.dtype == data.dtype:
                        np.copyto(buf, data)
                        per_slice[s] = buf
                    else:
                        per_slice[s] = np.array(data, copy=True)
                    nbytes += per_slice[s].nbytes
            leaves.append(leaf)
        else:
            leaves.append(_Leaf(value=np.array(x, copy=True) if hasattr(x, "shape") else x))
    return Snapshot(step, treedef, leaves, time.monotonic() - t0, nbytes)


def _bounds(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((s.indices(n)[0], s.indices(n)[1]) for s, n in zip(index, shape, strict=False))
