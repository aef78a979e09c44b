"""The hook's snapshots on the real Orbax ``Snapshotter``, pathwaysutils and grain, with plain JAX meshes.

Each test runs one scenario of this file in a subprocess of the MaxText venv
(``python -m tests.maxtext.test_snapshot_orbax SCENARIO``) on 8 CPU devices,
which prints what it observed as JSON; the assertions are here. A slice is
four-way: the (data, fsdp) = (4, 2) mesh's row ``i`` is slice ``i`` (as
pathwaysutils would group it by ``slice_index``), and losing a slice deletes
that slice's replica of the snapshot, which is what the Snapshotter's load
then finds unreadable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from simjob.cpu_devices import cpu_device_env

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.maxtext


def run_scenario(name: str) -> Any:
    from tests.maxtext.harness import require_maxtext_venv

    python = require_maxtext_venv()
    env = {**os.environ, **cpu_device_env(8)}
    r = subprocess.run(
        [str(python), "-m", "tests.maxtext.test_snapshot_orbax", name],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_lost_slices_replica_is_skipped_and_the_state_lands_on_the_smaller_mesh_without_host_copies() -> None:
    out = run_scenario("lost_slice")
    assert out["layout"]["usable"] and out["layout"]["axis"] == "data" and out["layout"]["replicas"] == 4
    assert out["saved"] is True and out["newest_step"] == 5
    # Orbax's copies: pinned host memory, each replica on the devices of one slice.
    assert out["replica_memory_kinds"] == ["pinned_host"]
    assert out["replica_slices"] == [[0], [1], [2], [3]]
    # Loaded onto the 3 x 2 mesh of the surviving slices, equal values, the snapshot's step and data position.
    first = out["first_load"]
    assert first["step"] == 5 and first["data"] == out["data_saved"]
    assert first["equal"] is True and first["mesh_shape"] == [3, 2] and first["devices_lost"] == []
    assert first["key_dtype"].startswith("key<")
    # After the load the snapshot is the restored state on the new mesh: a second loss still restores it.
    second = out["second_load"]
    assert second["step"] == 5 and second["equal"] is True and second["mesh_shape"] == [2, 2]
    # No array of the state was read into this process on the way (no __array__, no device_get).
    assert out["host_reads"] == 0 and out["guard_counts_a_read"] >= 1


def test_the_replica_axis_is_where_pathwaysutils_groups_slices_and_fsdp_across_slices_is_refused() -> None:
    out = run_scenario("layouts")
    assert out["rows_are_slices"] == {"usable": True, "axis": "data", "replicas": 4}
    assert out["fsdp_across_slices"]["usable"] is False
    assert "sharded along 'fsdp'" in out["fsdp_across_slices"]["why"]
    assert out["optimizer_sharded_over_data"]["usable"] is False
    assert "sharded along 'data'" in out["optimizer_sharded_over_data"]["why"]
    assert out["one_slice"]["usable"] is False and "one slice" in out["one_slice"]["why"]
    assert out["interleaved"]["usable"] is False and "no mesh axis separates" in out["interleaved"]["why"]


def test_a_grain_position_saved_with_a_snapshot_resumes_exactly_the_uninterrupted_batches() -> None:
    out = run_scenario("grain_position")
    assert out["position"] != ""
    # The first attempt consumed 3 batches, snapshotted, consumed 2 more and died; the next attempt,
    # set back to the snapshot's position, reads what an uninterrupted run reads from batch 3 on.
    assert out["resumed"] == out["uninterrupted"][3:8]
    assert out["resumed"] != out["uninterrupted"][5:10], "the batches after the loss must not be skipped"


# ---------------------------------------------------------------------------
# the scenarios (run in the MaxText venv)
# ---------------------------------------------------------------------------


def _mesh(devices: Any, shape: tuple[int, int], names: tuple[str, str] = ("data", "fsdp")) -> Any:
    import jax
    import numpy as np

    return jax.sharding.Mesh(np.array(devices, dtype=object).reshape(shape), names)


def _state(mesh: Any, *, opt_spec: Any = None) -> Any:
    """A small train state shaped like MaxText's: sharded weights and moments, a step, a PRNG key."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    w = jnp.arange(64 * 8, dtype=jnp.float32).reshape(64, 8) / 7
    return {
        "model": {"w": jax.device_put(w, NamedSharding(mesh, P("fsdp", None)))},
        "optimizer": {
            "mu": jax.device_put(w * 2, NamedSharding(mesh, opt_spec or P(None, "fsdp"))),
            "step": jax.device_put(jnp.uint32(5), NamedSharding(mesh, P())),
        },
        "rng": jax.device_put(jax.random.key(3), NamedSharding(mesh, P())),
    }


def _abstract(state: Any, mesh: Any) -> Any:
    import jax
    from jax.sharding import NamedSharding

    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, x.sharding.spec)), state
    )


class _HostReads:
    """Counts every read of a JAX array into this process (``__array__``, ``_value``, ``device_get``)."""

    def __init__(self) -> None:
        self.count = 0
        self._patches: list[Any] = []

    def __enter__(self) -> _HostReads:
        from unittest import mock

        import jax
        from jax._src import array as jax_array

        impl = jax_array.ArrayImpl
        orig_array, orig_value, orig_get = impl.__array__, impl._value, jax.device_get

        def array(x: Any, *a: Any, **k: Any) -> Any:
            self.count += 1
            return orig_array(x, *a, **k)

        def value(x: Any) -> Any:
            self.count += 1
            return orig_value.fget(x)  # type: ignore[attr-defined]

        def device_get(x: Any) -> Any:
            self.count += 1
            return orig_get(x)

        self._patches = [
            mock.patch.object(impl, "__array__", array),
            mock.patch.object(impl, "_value", property(value)),
            mock.patch.object(jax, "device_get", device_get),
        ]
        for p in self._patches:
            p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for p in reversed(self._patches):
            p.stop()


def _equal(a: Any, b: Any) -> bool:
    import jax
    import numpy as np

    def plain(x: Any) -> Any:
        return np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)

    return all(np.array_equal(plain(x), plain(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def _lose(snapshotter: Any, replica: int) -> None:
    """A lost slice: its replica of the newest snapshot can no longer be read."""
    import jax

    for x in jax.tree.leaves(snapshotter._latest_snapshot[0][replica]):
        if isinstance(x, jax.Array):
            x.delete()


def scenario_lost_slice() -> dict[str, Any]:
    import jax
    import numpy as np

    from trainer_hooks.maxtext.snapshot import Snapshots, state_layout

    devices = jax.devices()
    mesh = _mesh(devices, (4, 2))
    slice_map = {i: list(mesh.devices[i]) for i in range(4)}
    state = _state(mesh)
    reference = jax.tree.map(lambda x: x.copy(), state)
    layout = state_layout(mesh, state, slice_map)
    snaps = Snapshots()
    snaps.configure(layout)
    data = json.dumps({"json": {"next_index": 40}})
    with _HostReads() as reads:
        saved = snaps.save(5, state, data)
        newest = snaps.newest_step()
    replicas = snaps.snapshotter._latest_snapshot[0]
    slice_of = {d.id: s for s, ds in slice_map.items() for d in ds}
    arrays: list[list[Any]] = [[x for x in jax.tree.leaves(r) if isinstance(x, jax.Array)] for r in replicas]
    kinds = sorted({str(x.sharding.memory_kind) for r in arrays for x in r})
    replica_slices = [sorted({slice_of[d.id] for x in r for d in x.sharding.device_set}) for r in arrays]

    _lose(snaps.snapshotter, 1)
    survivors = [d for s in (0, 2, 3) for d in slice_map[s]]
    mesh3 = _mesh(survivors, (3, 2))
    with reads:
        first = snaps.load(_abstract(state, mesh3))
    lost_ids = {d.id for d in slice_map[1]}
    out_first = {
        "step": first.step,
        "data": first.data,
        "equal": _equal(first.state, reference),
        "mesh_shape": list(first.state["model"]["w"].sharding.mesh.devices.shape),
        "devices_lost": sorted(
            d.id for x in jax.tree.leaves(first.state) for d in x.sharding.device_set if d.id in lost_ids
        ),
        "key_dtype": str(first.state["rng"].dtype),
    }
    # The load left the snapshot on the 3 x 2 mesh: lose slice 0's replica (index 0) and load onto 2 x 2.
    _lose(snaps.snapshotter, 0)
    mesh2 = _mesh([d for s in (2, 3) for d in slice_map[s]], (2, 2))
    with reads:
        second = snaps.load(_abstract(state, mesh2))
    out_second = {
        "step": second.step,
        "equal": _equal(second.state, reference),
        "mesh_shape": list(second.state["model"]["w"].sharding.mesh.devices.shape),
    }
    with _HostReads() as probe:  # the counter itself sees a read
        np.asarray(reference["model"]["w"])
    return {
        "guard_counts_a_read": probe.count,
        "layout": layout.fields(),
        "saved": saved,
        "newest_step": newest,
        "data_saved": data,
        "replica_memory_kinds": kinds,
        "replica_slices": replica_slices,
        "first_load": out_first,
        "second_load": out_second,
        "host_reads": reads.count,
    }


def scenario_layouts() -> dict[str, Any]:
    import jax
    from jax.sharding import PartitionSpec as P

    from trainer_hooks.maxtext.snapshot import state_layout

    mesh = _mesh(jax.devices(), (4, 2))
    rows = {i: list(mesh.devices[i]) for i in range(4)}
    columns = {j: list(mesh.devices[:, j]) for j in range(2)}
    interleaved = {s: [d for d in jax.devices() if d.id % 4 == s] for s in range(4)}

    def brief(layout: Any, *keys: str) -> dict[str, Any]:
        f = layout.fields()
        return {k: f[k] for k in keys}

    state = _state(mesh)
    return {
        "rows_are_slices": brief(state_layout(mesh, state, rows), "usable", "axis", "replicas"),
        "fsdp_across_slices": brief(state_layout(mesh, state, columns), "usable", "why"),
        "optimizer_sharded_over_data": brief(
            state_layout(mesh, _state(mesh, opt_spec=P("data", "fsdp")), rows), "usable", "why"
        ),
        "one_slice": brief(state_layout(mesh, state, {0: list(jax.devices())}), "usable", "why"),
        "interleaved": brief(state_layout(mesh, state, interleaved), "usable", "why"),
    }


def scenario_grain_position() -> dict[str, Any]:
    import grain
    import jax
    import numpy as np
    from maxtext.input_pipeline.multihost_dataloading import MultiHostDataLoadIterator

    from trainer_hooks.maxtext.snapshot import data_position, set_data_position

    mesh = _mesh(jax.devices(), (4, 2))
    dataset = (
        grain.MapDataset.range(200)
        .shuffle(seed=7)
        .map(lambda i: {"inputs": np.full((4,), i, np.int32)})
        .to_iter_dataset()
        .batch(8)
    )

    def first_tokens(it: Any, n: int) -> list[list[int]]:
        return [np.asarray(next(it)["inputs"])[:, 0].tolist() for _ in range(n)]

    uninterrupted = first_tokens(MultiHostDataLoadIterator(dataset, mesh), 10)
    attempt = MultiHostDataLoadIterator(dataset, mesh)
    first_tokens(attempt, 3)
    position = data_position(attempt)  # the snapshot at the boundary before step index 3
    first_tokens(attempt, 2)  # steps 3 and 4 ran, then the slice was lost
    next_attempt = MultiHostDataLoadIterator(dataset, mesh)
    set_data_position(next_attempt, position)
    return {"position": position, "uninterrupted": uninterrupted, "resumed": first_tokens(next_attempt, 5)}


if __name__ == "__main__":
    result = globals()[f"scenario_{sys.argv[1]}"]()
    print(json.dumps(result))
