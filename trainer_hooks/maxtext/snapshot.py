"""In-memory snapshots of MaxText's train state through Orbax's Pathways ``Snapshotter``.

MaxText donates its train state into the step (``donate_argnums=0`` in
``maxtext_utils``): after a step fails with lost hardware the state is gone,
and the next attempt would restore the last periodic checkpoint. Orbax
0.12.8 ships the mechanism that keeps a recent state beside the devices
(``orbax.checkpoint.v1.training.pathways.Snapshotter``, source:
``orbax/checkpoint/experimental/v1/_src/training/pathways/snapshotter.py``):

* ``save(step, state)`` puts every array into the ``pinned_host`` memory of
  the hosts that hold its shards (``device_put`` with the same sharding and
  memory kind ``pinned_host``), split along one mesh axis, the replica axis,
  into one copy per replica (pathwaysutils' ``split_by_mesh_axis``). The copy
  runs asynchronously; a background thread waits for it. The queue holds one
  request: a ``save`` while one is in flight is skipped, never waited for.
* ``load(abstract_state)`` drops the replicas whose arrays fail a wait
  (``jax.block_until_ready``: a lost slice's, if the runtime says so), rebuilds the arrays from the others
  (``concatenate_by_mesh_axis``) and puts them onto the abstract state's
  shardings: the new, smaller or larger, mesh. Nothing passes through the
  trainer process's memory, NumPy or a checkpoint directory.

This module chooses the replica axis (:func:`replica_layout`: MaxText's slice
axis, the DCN ``data`` axis of its hybrid mesh, found from pathwaysutils'
device-to-slice grouping, never guessed), keeps the data iterator's position
inside each snapshot (so the two are always of the same step), and keys the
state by its tree paths, so the abstract state MaxText builds for the next
attempt (the same ``nnx.State`` paths, new shardings) maps onto it. Before
Orbax's load it also drops the replicas on slices pathwaysutils found lost
(:meth:`Snapshots.mark_lost`), so no load reads a lost replica whatever a wait
on its buffers answers (docs/maxtext.md, "Which replica counts as alive").

Importing this module imports neither JAX nor Orbax; they load when a
snapshot is configured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AUTO", "ENV_SNAPSHOT_EVERY", "Layout", "Restored", "SnapshotUnavailable", "Snapshots"]

ENV_SNAPSHOT_EVERY = "ELASTIC_SIDECAR_SNAPSHOT_EVERY"
"""Steps between snapshots: a whole number (0: none), or ``auto`` (the default). Read by the hook at start."""
AUTO = -1
"""``auto``: the interval is chosen by measurement (:class:`trainer_hooks.maxtext.interval.SnapshotInterval`)
so that snapshots cost at most ``interval.BUDGET`` of the steady step time."""

DATA_NONE = ""
"""The data field of a snapshot whose iterator has no position to keep (synthetic data)."""


def parse_snapshot_every(raw: str, name: str = ENV_SNAPSHOT_EVERY) -> int:
    """Steps between snapshots from text: a whole number >= 0 (0: none), or ``auto`` (:data:`AUTO`); a bad
    value is a :class:`ValueError` that names ``name`` and the value."""
    if raw.strip().lower() == "auto":
        return AUTO
    try:
        every = int(raw)
    except ValueError:
        every = -1
    if every < 0:
        raise ValueError(f"{name}={raw!r}: expected a whole number of steps >= 0 (0: no snapshots) or 'auto'")
    return every


def snapshot_every_arg(raw: str) -> int:
    """``--snapshot-every`` for argparse (the example trainer's, the benchmark's): as :func:`parse_snapshot_every`."""
    try:
        return parse_snapshot_every(raw, "--snapshot-every")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def snapshot_every_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``ELASTIC_SIDECAR_SNAPSHOT_EVERY``: steps, or ``AUTO`` (unset or ``auto``); a bad value is a clear error."""
    raw = (environ if environ is not None else os.environ).get(ENV_SNAPSHOT_EVERY, "").strip()
    return parse_snapshot_every(raw) if raw else AUTO


# ---------------------------------------------------------------------------
# where the replicas are
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Whether MaxText's mesh keeps a full replica of the state on every slice, and along which axis."""

    usable: bool
    why: str
    axis: str = ""
    axis_index: int = -1
    replicas: int = 0
    slices: tuple[int, ...] = ()

    def fields(self) -> dict[str, object]:
        return {
            "usable": self.usable,
            "why": self.why,
            "axis": self.axis,
            "axis_index": self.axis_index,
            "replicas": self.replicas,
            "slices": list(self.slices),
        }


def replica_layout(
    axis_names: tuple[str, ...],
    devices: Any,
    slice_of: Mapping[int, int],
    sharded_axes: Iterable[tuple[str, frozenset[str]]],
) -> Layout:
    """The replica axis of a mesh for snapshots that survive a lost slice.

    ``devices``: the mesh's device array (``mesh.devices``, any object with
    ``ndim``, ``shape`` and NumPy indexing); ``slice_of``: device id -> slice,
    as pathwaysutils groups devices; ``sharded_axes``: (leaf name, mesh axes
    the leaf is sharded along) for every array of the state.

    An axis qualifies when every index along it lies within one slice and the
    indices together span every slice of the mesh (so a lost slice takes whole
    replicas with it and leaves the others complete), and no array of the state
    is sharded along it (each index then holds a full replica). MaxText's
    hybrid mesh puts the slices on its outer DCN ``data`` axis, which is
    preferred when several qualify.
    """
    import numpy as np

    arr = np.asarray(devices, dtype=object)
    mesh_slices = sorted({slice_of.get(int(d.id), -1) for d in arr.flat})
    if -1 in mesh_slices:
        return Layout(False, "a device of the mesh belongs to no slice in pathwaysutils' grouping")
    if len(mesh_slices) < 2:
        return Layout(
            False,
            f"the mesh spans one slice ({mesh_slices}): a lost slice takes every replica with it",
            slices=tuple(mesh_slices),
        )
    sharded = list(sharded_axes)
    candidates: list[tuple[int, str, int]] = []
    reasons: list[str] = []
    for index, name in enumerate(axis_names):
        size = arr.shape[index]
        per_index = [{slice_of[int(d.id)] for d in np.take(arr, i, axis=index).flat} for i in range(size)]
        if any(len(s) != 1 for s in per_index):
            continue
        if sorted(set().union(*per_index)) != mesh_slices:
            continue
        split = [leaf for leaf, axes in sharded if name in axes]
        if split:
            reasons.append(
                f"the state is sharded along {name!r}, the slice axis ({split[0]} and {len(split) - 1} more): "
                "no slice holds a full replica (e.g. FSDP across slices)"
            )
            continue
        candidates.append((index, name, size))
    if not candidates:
        why = "; ".join(reasons) or (
            f"no mesh axis separates the slices {mesh_slices} (axes {list(axis_names)}, shape {list(arr.shape)})"
        )
        return Layout(False, why, slices=tuple(mesh_slices))
    index, name, size = next((c for c in candidates if c[1] == "data"), candidates[0])
    return Layout(
        True,
        f"axis {name!r} ({size} replicas over slices {mesh_slices})",
        axis=name,
        axis_index=index,
        replicas=size,
        slices=tuple(mesh_slices),
    )


def state_layout(mesh: Any, state: Any, slice_map: Mapping[int, Iterable[Any]]) -> Layout:
    """:func:`replica_layout` for MaxText's mesh and train state (JAX arrays with ``NamedSharding``)."""
    import jax

    slice_of = {int(d.id): int(s) for s, devs in slice_map.items() for d in devs}
    sharded: list[tuple[str, frozenset[str]]] = []
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        if not isinstance(x, jax.Array):
            continue
        sh = x.sharding
        if not isinstance(sh, jax.sharding.NamedSharding) or sh.mesh != mesh:
            return Layout(False, f"{jax.tree_util.keystr(path)} is not a NamedSharding on MaxText's mesh ({sh})")
        axes = frozenset(a for dim in sh.spec for a in jax.tree_util.tree_leaves(dim))
        sharded.append((jax.tree_util.keystr(path), axes))
    return replica_layout(tuple(mesh.axis_names), mesh.devices, slice_of, sharded)


# ---------------------------------------------------------------------------
# the data iterator's position
# ---------------------------------------------------------------------------


def local_iterator(data_iterator: Any) -> Any | None:
    """The stateful iterator inside MaxText's ``data_iterator`` (grain's), or None (synthetic, or a list)."""
    if data_iterator is None or isinstance(data_iterator, list):
        return None
    inner = getattr(data_iterator, "local_iterator", None)
    if inner is not None and hasattr(inner, "get_state") and hasattr(inner, "set_state"):
        return inner
    return None


def data_position(data_iterator: Any) -> str:
    """The iterator's position as text (grain's ``get_state()``: a few integers), or ``DATA_NONE``.

    Same encoding as MaxText's ``grain_utility._state_to_text``: JSON for a
    grain ``DatasetIterator`` (a dict), the bytes decoded otherwise.
    """
    it = local_iterator(data_iterator)
    if it is None:
        return DATA_NONE
    state = it.get_state()
    if isinstance(state, bytes | bytearray):
        return json.dumps({"bytes": bytes(state).decode()})
    return json.dumps({"json": state})


def set_data_position(data_iterator: Any, text: str) -> bool:
    """Set the iterator back to ``text`` (from :func:`data_position`); False when there is nothing to set."""
    if text == DATA_NONE:
        return False
    it = local_iterator(data_iterator)
    if it is None:
        raise ValueError("the snapshot holds a data position but this attempt's data iterator cannot take one")
    saved = json.loads(text)
    it.set_state(saved["bytes"].encode() if "bytes" in saved else saved["json"])
    return True


# ---------------------------------------------------------------------------
# the snapshots
# ---------------------------------------------------------------------------


def keyed(tree: Any) -> dict[str, Any]:
    """``tree``'s leaves by their path (``['model']['decoder']...``): the same keys for the state
    MaxText trains and the abstract state it builds for the next attempt."""
    import jax

    return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


class SnapshotUnavailable(RuntimeError):
    """A wait on the Snapshotter passed its bound: the snapshot counts as unavailable (the next rung decides)."""


def bounded(fn: Callable[[], Any], seconds: float | None, what: str) -> Any:
    """``fn()``, or :class:`SnapshotUnavailable` once ``seconds`` pass (None: unbounded).

    Orbax's ``Snapshotter.join`` and ``load`` take no timeout, and a copy to or from a dead host may
    never resolve: ``fn`` runs on a daemon thread that is abandoned past the bound (it holds no lock of
    the hook's; Orbax's own thread keeps its queue)."""
    if seconds is None:
        return fn()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller below
            box["error"] = e

    t = threading.Thread(target=run, name=f"elastic-sidecar: {what}", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise SnapshotUnavailable(f"{what} did not finish within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


@dataclass
class Restored:
    state: Any
    """The state, as a tree of the abstract state's structure, on its shardings."""
    step: int
    data: str


@dataclass
class Snapshots:
    """The process's one Orbax ``Snapshotter`` (it outlives MaxText's train attempts), and what the hook needs of it.

    ``make``: builds the Snapshotter for a replica axis index (tests pass
    their own; the default is Orbax's).
    """

    make: Callable[[int], Any] | None = None
    snapshotter: Any = None
    layout: Layout | None = None
    keys: frozenset[str] = frozenset()
    """The state paths the newest saves hold."""
    saved: int = 0
    skipped: int = 0
    """Saves skipped because the previous one was still copying."""
    failed: int = 0
    pending: int | None = None
    """The step of the newest save handed to the Snapshotter and not yet seen complete."""
    wait_seconds: float | None = None
    """The bound on every wait on the recovery path (join, load); past it the snapshot is unavailable."""
    slices_of: Callable[[Iterable[Any]], set[int]] | None = None
    """Devices -> the slices they belong to (pathwaysutils' grouping); None: lost replicas are left to Orbax."""
    lost: dict[int, int] = field(default_factory=dict)
    """Slice -> the newest step handed to a save when the slice was found lost: the replicas on that slice of a
    snapshot of that step or older are never loaded (the hosts that held them are gone)."""
    handed: int = -1
    """The newest step handed to the Snapshotter."""
    dropped: list[int] = field(default_factory=list)
    """The slices whose replicas the last :meth:`load` dropped as lost."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def configure(self, layout: Layout) -> None:
        """Use ``layout`` from now on (each attempt's mesh). A Snapshotter is made on first use and kept:
        the newest snapshot must survive into the next attempt."""
        self.layout = layout
        if not layout.usable:
            return
        if self.snapshotter is None:
            self.snapshotter = (self.make or _orbax_snapshotter)(layout.axis_index)
        elif self.snapshotter.replica_axis_index != layout.axis_index:
            # MaxText keeps its axis order across attempts; if it ever differs, the
            # newest snapshot (split along the old index) is still loadable by the
            # old index, so only new saves use the new one.
            self.snapshotter.replica_axis_index = layout.axis_index

    @property
    def usable(self) -> bool:
        return self.layout is not None and self.layout.usable and self.snapshotter is not None

    def busy(self) -> bool:
        """A save would be skipped: the Snapshotter's queue of one is full (its thread still waits for
        an earlier copy and one more is queued behind it)."""
        q = getattr(self.snapshotter, "_queue", None)
        return bool(q is not None and q.full())

    def copying(self) -> bool:
        """A handed-over save is not finished yet (queued, or its copy still awaited by the thread)."""
        q = getattr(self.snapshotter, "_queue", None)
        return bool(q is not None and getattr(q, "unfinished_tasks", 0) > 0)

    def save(self, step: int, state: Any, data: str) -> bool:
        """Hand the state after ``step`` completed steps and the data position to the Snapshotter.

        Returns False when skipped (a save still copying: never waited for).
        Raises what the Snapshotter's synchronous part raises (the ``device_put``
        to ``pinned_host`` and the split: a slice-loss error surfaces here).
        """
        if self.busy():
            self.skipped += 1
            return False
        tree = {"state": keyed(state), "data": data}
        self.snapshotter.save(step, tree)
        self.handed = max(self.handed, step)
        self.keys = frozenset(tree["state"])
        self.saved += 1
        self.pending = step
        return True

    def check_pending(self) -> int | None:
        """When the newest save has finished copying and is not the newest snapshot, it failed
        (Orbax logs the error and keeps the previous snapshot): returns its step, once."""
        step = self.pending
        if step is None or self.copying():
            return None
        self.pending = None
        latest = self.latest_step()
        if latest is not None and latest >= step:
            return None
        self.failed += 1
        return step

    def latest_step(self) -> int | None:
        """The step of the newest complete snapshot, without waiting."""
        if self.snapshotter is None:
            return None
        latest = self.snapshotter.latest
        return None if latest is None else int(latest.step)

    def newest_step(self) -> int | None:
        """The step of the newest complete snapshot, after any save still copying has finished."""
        if self.snapshotter is None:
            return None
        self.join()
        self.check_pending()
        return self.latest_step()

    def ensure(self, step: int, state: Any, data: str) -> str:
        """Make the newest complete snapshot ``step``'s (a drain from memory: one save to host memory, waited
        for). "" once it is; else why not (the caller flushes instead)."""
        if not self.usable:
            why = self.layout.why if self.layout is not None and not self.layout.usable else ""
            return "no in-memory snapshots" + (f" ({why})" if why else "")
        if self.newest_step() != step:
            self.save(step, state, data)  # the queue is empty after the join: never skipped
            if self.newest_step() != step:
                return f"the snapshot of step {step} did not complete"
        return ""

    def join(self) -> None:
        """Wait for the save still copying, at most ``wait_seconds`` (:class:`SnapshotUnavailable` past it)."""
        if self.snapshotter is not None:
            bounded(self.snapshotter.join, self.wait_seconds, "waiting for the snapshot copy")

    def mark_lost(self, slices: Iterable[int]) -> None:
        """``slices`` were found lost: the replicas they held of every snapshot so far (one still copying
        included) are not loaded, whatever a wait on their buffers answers (:meth:`drop_lost_replicas`)."""
        for s in slices:
            self.lost[s] = max(self.lost.get(s, -1), self.handed)

    def drop_lost_replicas(self) -> list[int]:
        """Remove from the newest snapshot its replicas on slices marked lost; returns their slices.

        Orbax's ``load`` keeps every replica whose arrays pass ``jax.block_until_ready``. Whether Pathways
        fails that wait for a buffer whose host has died is not documented: if it answers "ready", Orbax
        would copy from a dead host. The Snapshotter has no public call to choose replicas, so this edits
        its newest snapshot (its private ``_latest_snapshot``, under its ``_lock``); without those fields,
        or without :attr:`slices_of`, nothing is removed and Orbax's own test decides. Raises
        :class:`SnapshotUnavailable` when every replica is on a lost slice."""
        snap, slices_of = self.snapshotter, self.slices_of
        lock = getattr(snap, "_lock", None)
        if not self.lost or slices_of is None or lock is None or not hasattr(snap, "_latest_snapshot"):
            return []
        import jax

        with lock:
            latest = snap._latest_snapshot
            if latest is None:
                return []
            trees, step = latest
            if not isinstance(trees, list):
                return []  # not one tree per replica (Orbax before 0.12.8 splits at load): Orbax decides
            gone = {s for s, upto in self.lost.items() if step <= upto}
            keep, dropped = [], set()
            for tree in trees:
                devices = [
                    d
                    for x in jax.tree_util.tree_leaves(tree)
                    if isinstance(x, jax.Array)
                    for d in x.sharding.device_set
                ]
                on = slices_of(devices) & gone
                if on:
                    dropped |= on
                else:
                    keep.append(tree)
            if not dropped:
                return []
            if not keep:
                raise SnapshotUnavailable(f"every replica of the snapshot of step {step} was on a lost slice")
            snap._latest_snapshot = (keep, step)
        return sorted(dropped)

    def load(self, abstract: Any) -> Restored:
        """The newest snapshot, from the replicas still readable, on ``abstract``'s shardings.

        Replicas on slices marked lost are dropped first (:meth:`drop_lost_replicas`). Raises when no
        replica survives, or when ``abstract``'s paths are not the snapshot's (a different model: the
        checkpoint decides then).
        """
        import jax

        step = self.newest_step()
        if step is None:
            raise RuntimeError("no complete snapshot")
        flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
        target = {jax.tree_util.keystr(p): x for p, x in flat}
        if set(target) != set(self.keys):
            missing, extra = sorted(set(self.keys) - set(target)), sorted(set(target) - set(self.keys))
            raise ValueError(
                f"the abstract state's paths differ from the snapshot's: {len(missing)} only in the snapshot "
                f"({missing[:2]}), {len(extra)} only in the abstract state ({extra[:2]})"
            )
        snapshotter = self.snapshotter
        self.dropped = self.drop_lost_replicas()
        out = bounded(
            lambda: snapshotter.load({"state": target, "data": DATA_NONE}), self.wait_seconds, "loading the snapshot"
        )
        # Orbax's load keeps the loaded state as the new snapshot, split over the new mesh's live replicas.
        self.lost.clear()
        state = jax.tree_util.tree_unflatten(treedef, [out["state"][jax.tree_util.keystr(p)] for p, _ in flat])
        return Restored(state, step, str(out["data"]))

    def forget(self) -> None:
        """Drop the newest snapshot (older than what the attempt restored): its pinned host memory is
        freed. The Snapshotter has no public call for it; without its private fields, nothing is dropped."""
        snap = self.snapshotter
        lock = getattr(snap, "_lock", None)
        if snap is None or lock is None or not hasattr(snap, "_latest_snapshot"):
            return
        self.join()  # SnapshotUnavailable past the bound: nothing dropped, the caller goes on
        with lock:
            snap._latest_snapshot = None
        self.pending = None


def _orbax_snapshotter(axis_index: int) -> Any:
    from orbax.checkpoint import v1 as ocp_v1

    return ocp_v1.training.pathways.Snapshotter(replica_axis_index=axis_index)


def nbytes_per_replica(state: Any) -> int:
    """Bytes one replica of ``state`` holds (shapes only: nothing is read)."""
    import jax

    return sum(
        math.prod(x.shape) * x.dtype.itemsize
        for x in jax.tree_util.tree_leaves(state)
        if hasattr(x, "shape") and hasattr(x, "dtype") and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    )
