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

    def put(self, shardings: Any, lost: Iterable[int], slice_of: Callable[[Any], int]) -> Any | None:
        """The state on ``shardings`` from the copies of slices not in ``lost`` (:func:`put_shards`), or None.

        The result may still be reading these host buffers when this returns; it is ready (and the
        buffers free to be written over) once ``jax.block_until_ready`` of it has returned."""
        gone = set(lost)
        leaves = [
            _Leaf(
                shape=leaf.shape,
                dtype=leaf.dtype,
                value=leaf.value,
                key_impl=leaf.key_impl,
                shards={b: {s: c for s, c in copies.items() if s not in gone} for b, copies in leaf.shards.items()},
            )
            for leaf in self.leaves
        ]
        return put_shards(self.treedef, leaves, shardings, slice_of)


def live_shards(state: Any, slice_of: Callable[[Any], int], exclude: Iterable[int] = ()) -> tuple[Any, list[_Leaf]]:
    """The shards of a live ``state`` (JAX arrays) by bounds and slice, for :func:`put_shards`: each one the
    single-device array of a device on a slice not in ``exclude`` (no copy is made; a lost slice's shards
    are not touched)."""
    import jax

    skip = set(exclude)
    flat, treedef = jax.tree_util.tree_flatten(state)
    leaves: list[_Leaf] = []
    for x in flat:
        if not isinstance(x, jax.Array):
            leaves.append(_Leaf(value=x))
            continue
        leaf = _Leaf(shape=tuple(x.shape), dtype=x.dtype)
        for sh in x.addressable_shards:
            s = slice_of(sh.device)
            if s not in skip:
                leaf.shards.setdefault(_bounds(sh.index, x.shape), {}).setdefault(s, sh.data)
        leaves.append(leaf)
    return treedef, leaves


def put_shards(treedef: Any, leaves: list[_Leaf], shardings: Any, slice_of: Callable[[Any], int]) -> Any | None:
    """A state laid out by ``shardings`` (a tree of JAX shardings over ``treedef``), built shard by shard.

    Each device of the new layout takes its shard from its own slice's copy when its slice holds
    one, as each surviving host restores what it holds itself; a live single-device array already
    on that device is used as it is (no copy). Only a device whose slice holds none (a replacement
    slice, or a slice whose copy was lost) gets a copy, from another slice's. So a rebuild moves
    the bytes the new layout lacks, not the whole state once per slice through one process.

    None when some device's shard matches no surviving copy (no replica left, or a layout whose
    shard bounds differ from the copies'): the caller then has no state in memory for it.
    """
    import jax
    import numpy as np

    flat_sh = treedef.flatten_up_to(shardings)
    out = []
    for leaf, sharding in zip(leaves, flat_sh, strict=True):
        if leaf.dtype is None:  # not an array: kept whole
            out.append(jax.device_put(leaf.value, sharding) if hasattr(leaf.value, "shape") else leaf.value)
            continue
        if not leaf.shards:
            return None  # no surviving shard at all
        if leaf.key_impl is not None:
            return None  # key data would need re-wrapping per shard: not worth it for a few bytes
        parts = []
        for dev, index in sharding.devices_indices_map(leaf.shape).items():
            copies = leaf.shards.get(_bounds(index, leaf.shape))
            if not copies:
                return None
            src = copies.get(slice_of(dev))
            if src is None:
                src = next(iter(copies.values()))
            if isinstance(src, jax.Array):
                parts.append(src if src.devices() == {dev} else jax.device_put(src, dev))
            else:
                # A copy of the host buffer: on the CPU backend the device buffer can be the NumPy
                # buffer itself (seen with jax 0.12 even with may_alias=False), and the next snapshot
                # writes over the host buffers.
                parts.append(jax.device_put(np.array(src, copy=True), dev))
        out.append(jax.make_array_from_single_device_arrays(leaf.shape, sharding, parts))
    return jax.tree_util.tree_unflatten(treedef, out)


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
