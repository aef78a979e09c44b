"""In-memory snapshots of MaxText's train state, kept per slice, for a crash without rewind.

MaxText donates its train state into the step (``donate_argnums=0`` in
``maxtext_utils``): after a step fails with lost hardware there is nothing
left on the devices to save, and the next attempt would restore the last
periodic checkpoint. A snapshot taken at a step boundary, before the step
consumes the state, keeps a host copy of every shard beside the slice that
holds it. After a slice loss the state is assembled from the copies of
slices that were not lost (MaxText replicates the state across slices, as
over DCN, so every surviving slice holds a complete replica), saved through
MaxText's own checkpoint manager and restored by the next attempt: the job
loses only the step in flight.

On TPU the copies belong in the host memory of the hosts that hold the
shards (``pinned_host``); here they are NumPy copies keyed by slice, and the
rule is the same: a lost slice's copies are never read.

Imports JAX only when a snapshot is taken.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

ENV_SNAPSHOT_EVERY = "ELASTIC_SIDECAR_SNAPSHOT_EVERY"
"""Steps between snapshots: a whole number (0: none), or ``auto`` (the default). Read by the hook at start."""
AUTO = -1
"""``auto``: the hook snapshots the first ``AUTO_CALIBRATION`` steps, then keeps
snapshots at ``AUTO_BUDGET`` of the step time or less: every
ceil(snapshot seconds / (AUTO_BUDGET x step seconds)) steps, as measured in
this process. (On the CPU test model a snapshot cost about as much as its 13 ms
step, so ``auto`` chooses about every 20 steps there; a model whose steps take
seconds snapshots every step.)"""
AUTO_BUDGET = 0.05
AUTO_CALIBRATION = 3


def snapshot_every_from_env(environ: dict[str, str] | None = None) -> int:
    """``ELASTIC_SIDECAR_SNAPSHOT_EVERY``: steps, or ``AUTO`` (unset or ``auto``); a bad value is a clear error."""
    import os

    raw = (environ if environ is not None else os.environ).get(ENV_SNAPSHOT_EVERY, "").strip()
    if not raw or raw.lower() == "auto":
        return AUTO
    try:
        every = int(raw)
    except ValueError:
        every = -1
    if every < 0:
        raise ValueError(
            f"{ENV_SNAPSHOT_EVERY}={raw!r}: expected a whole number of steps >= 0 (0: no snapshots) or 'auto'"
        )
    return every


def auto_every(snapshot_seconds: float, step_seconds: float) -> int:
    """Steps between snapshots that keep their cost at ``AUTO_BUDGET`` of the step time."""
    import math

    if step_seconds <= 0:
        return 1
    return max(1, min(1000, math.ceil(snapshot_seconds / (AUTO_BUDGET * step_seconds))))


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

                out.append(jax.random.wrap_key_data(arr, impl=leaf.key_impl))
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
