"""The example trainer's snapshots on real JAX CPU devices: Orbax's ``Snapshotter`` through the MaxText hook's
adapter (trainer_hooks/maxtext/snapshot.py ``Snapshots``), the CPU stand-in for a lost slice's pinned host
memory and the live state's rebuild from the surviving slices (simjob/trainer.py), and the hook's snapshot
interval setting. The hook's own use of the Snapshotter is tested in tests/maxtext."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from trainer_hooks.maxtext.snapshot import AUTO, ENV_SNAPSHOT_EVERY, snapshot_every_from_env

pytest.importorskip("jax")
pytest.importorskip("pathwaysutils")

# Shared by the scripts: CPU devices in slices of two, a mesh over some slices with the replica axis
# first (MaxText's data axis over DCN), the state sharded within a slice and replicated across slices.
COMMON = """
import json
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from simjob.trainer import lose_replicas, surviving
from trainer_hooks.maxtext.snapshot import DATA_NONE, Snapshots, nbytes_per_replica, state_layout

devs = np.array(jax.devices()).reshape(-1, 2)
slice_of = lambda d: d.id // 2
slice_map = {s: list(row) for s, row in enumerate(devs)}
mesh = lambda slices: Mesh(devs[list(slices)], ("replica", "model"))
same = lambda x, y: bool(np.array_equal(np.asarray(x), y))

def lost(slices):
    return {d.id for s in slices for d in slice_map[s]}

def abstract(tree, m, specs):
    return jax.tree.map(
        lambda x, spec: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(m, spec))
        if hasattr(x, "shape") else x,
        tree, specs,
    )

def load(snaps, m, specs, like):
    try:
        r = snaps.load(abstract(like, m, specs))
    except RuntimeError as e:
        return str(e)
    return r
"""

# Four CPU devices as two slices ({0, 1} and {2, 3}).
SCRIPT = COMMON + textwrap.dedent(
    """
    w = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    keys = jax.random.split(jax.random.key(7), 4)
    key_data = np.array(jax.random.key_data(keys))
    specs = {"w": P(None, "model"), "rng": P(), "step": None}
    def state():
        return {
            "w": jax.device_put(w, NamedSharding(mesh([0, 1]), specs["w"])),
            "rng": jax.device_put(jax.random.split(jax.random.key(7), 4), NamedSharding(mesh([0, 1]), P())),
            "step": 5,
        }
    out = {}
    for gone in ([], [0], [1], [0, 1]):
        st = state()
        snaps = Snapshots()
        snaps.configure(state_layout(mesh([0, 1]), st, slice_map))
        snaps.save(5, st, DATA_NONE)
        snaps.join()
        held = snaps.snapshotter._latest_snapshot[0]
        if gone == []:
            out["layout"] = [snaps.layout.usable, snaps.layout.axis, snaps.layout.replicas]
            out["replicas"] = [sorted({slice_of(d) for x in jax.tree.leaves(r) if isinstance(x, jax.Array)
                                       for d in x.devices()}) for r in held]
            out["memory_kinds"] = sorted({x.sharding.memory_kind for r in held for x in jax.tree.leaves(r)
                                          if isinstance(x, jax.Array)})
            out["nbytes"] = [sum(x.nbytes for r in held for x in jax.tree.leaves(r)
                                 if isinstance(x, jax.Array) and x.dtype == np.float32), nbytes_per_replica(st)]
        for x in jax.tree.leaves(st):  # what donation does to the state after the snapshot
            if isinstance(x, jax.Array):
                x.delete()
        lose_replicas(snaps, lost(gone))
        keep = [s for s in (0, 1) if s not in gone] or [0]
        got = load(snaps, mesh(keep), specs, state())
        if isinstance(got, str):
            out[str(gone)] = got
            continue
        g = got.state
        out[str(gone)] = {
            "step": got.step,
            "w": same(g["w"], w),
            "rng": bool(np.array_equal(np.asarray(jax.random.key_data(g["rng"])), key_data)),
            "leaf": g["step"],
            "devices": sorted(d.id for d in g["w"].devices()),
        }
    # a leaf sharded across the slices: no slice holds a whole replica, so the layout refuses snapshots
    across = {"v": jax.device_put(w, NamedSharding(mesh([0, 1]), P("replica", "model")))}
    out["across"] = state_layout(mesh([0, 1]), across, slice_map).why
    # a newer snapshot replaces the older one and holds the new values
    snaps = Snapshots()
    snaps.configure(state_layout(mesh([0, 1]), state(), slice_map))
    snaps.save(1, {"w": jax.device_put(w, NamedSharding(mesh([0, 1]), specs["w"]))}, DATA_NONE)
    snaps.join()
    snaps.save(2, {"w": jax.device_put(w + 1, NamedSharding(mesh([0, 1]), specs["w"]))}, DATA_NONE)
    r = load(snaps, mesh([0, 1]), {"w": specs["w"]}, {"w": jax.numpy.zeros((8, 8), np.float32)})
    out["newer"] = [r.step, same(r.state["w"], w + 1)]
    print(json.dumps(out))
    """
)


def run_on_cpu_devices(script: str, devices: int) -> dict[str, object]:
    """``script``'s last line of output, as JSON, from a process with ``devices`` CPU devices."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_snapshot_is_rebuilt_from_the_surviving_slices_replicas_only() -> None:
    out = run_on_cpu_devices(SCRIPT, 4)
    assert out["layout"] == [True, "replica", 2]
    # Orbax's copies: pinned host memory, one replica on each slice's own devices.
    assert out["replicas"] == [[0], [1]] and out["memory_kinds"] == ["pinned_host"]
    assert out["nbytes"] == [2 * 64 * 4, 64 * 4], "one replica of the 8x8 float32 leaf per slice"
    whole = {"step": 5, "w": True, "rng": True, "leaf": 5}
    assert {k: out["[]"][k] for k in whole} == whole and out["[]"]["devices"] == [0, 1, 2, 3]
    assert {k: out["[0]"][k] for k in whole} == whole and out["[0]"]["devices"] == [2, 3]
    assert {k: out["[1]"][k] for k in whole} == whole and out["[1]"]["devices"] == [0, 1]
    assert out["[0, 1]"] == "No active replicas found.", "with every slice lost there is nothing to rebuild from"
    assert "sharded along 'replica'" in out["across"]
    assert out["newer"] == [2, True]


@pytest.mark.parametrize(
    ("value", "want"), [(None, AUTO), ("", AUTO), ("auto", AUTO), ("AUTO", AUTO), ("0", 0), ("1", 1), ("25", 25)]
)
def test_the_interval_comes_from_the_environment(value: str | None, want: int) -> None:
    assert snapshot_every_from_env({} if value is None else {ENV_SNAPSHOT_EVERY: value}) == want


@pytest.mark.parametrize("value", ["-1", "every", "1.5"])
def test_a_bad_interval_is_a_clear_error_naming_it(value: str) -> None:
    with pytest.raises(ValueError, match=f"{ENV_SNAPSHOT_EVERY}='{value}'"):
        snapshot_every_from_env({ENV_SNAPSHOT_EVERY: value})


# Six CPU devices as three slices ({0, 1}, {2, 3}, {4, 5}); a rebuild onto a mesh of fewer or more slices.
PUT_SCRIPT = COMMON + textwrap.dedent(
    """
    spec = {"w": P(None, "model"), "b": P("model")}
    sh = lambda m: {k: NamedSharding(m, v) for k, v in spec.items()}
    w = np.arange(96.0, dtype=np.float32).reshape(8, 12)
    b = np.arange(4.0, dtype=np.float32)
    state = {"w": jax.device_put(w, sh(mesh([0, 1, 2]))["w"]), "b": jax.device_put(b, sh(mesh([0, 1, 2]))["b"])}
    ptr = lambda arr: {s.device.id: s.data.unsafe_buffer_pointer() for s in arr.addressable_shards}
    out = {}

    # a slice's shards, once it is lost, are never read: here they are freed first, and the rebuild still works
    before = ptr(state["w"])
    small = surviving(state, slice_of, frozenset({2}))
    out["shrink_devices"] = sorted(d.id for d in small["w"].devices())
    out["shrink_reused"] = all(ptr(small["w"])[d] == before[d] for d in (0, 1, 2, 3))
    small = jax.device_put(small, sh(mesh([0, 1])))
    out["shrink_values"] = [same(small["w"], w), same(small["b"], b)]

    # grow back: slice 2 gets copies from the survivors
    big = jax.device_put(surviving(small, slice_of, frozenset()), sh(mesh([0, 1, 2])))
    out["grow_values"] = [same(big["w"], w), same(big["b"], b), sorted(d.id for d in big["w"].devices())]
    out["none_left"] = surviving(big, slice_of, frozenset({0, 1, 2})) is None

    # from a snapshot, with slice 1 lost, onto slices 0 and 2
    snaps = Snapshots()
    snaps.configure(state_layout(mesh([0, 1, 2]), big, slice_map))
    snaps.save(7, big, DATA_NONE)
    snaps.join()
    for x in jax.tree.leaves(big):
        x.delete()  # donated into a step that failed
    lose_replicas(snaps, lost([1]))
    got = load(snaps, mesh([0, 2]), spec, {"w": w, "b": b})
    jax.block_until_ready(got.state)
    out["snap_step"] = got.step
    # the restored state does not share the snapshot's pinned host memory: freeing it changes nothing
    snaps.forget()
    out["snap_values"] = [same(got.state["w"] + 0, w), same(got.state["b"] + 0, b), snaps.latest_step()]
    # a layout other than the snapshot's (rows instead of columns): Orbax reshards onto it
    snaps.save(8, got.state, DATA_NONE)
    snaps.join()
    rows = load(snaps, mesh([0]), {"w": P("model", None), "b": P("model")}, {"w": w, "b": b})
    out["other_layout"] = [rows.step, same(rows.state["w"], w), str(rows.state["w"].sharding.spec)]
    # every slice's replica lost: nothing to load (the trainer restores its checkpoint)
    lose_replicas(snaps, lost([0, 2]))
    out["all_lost"] = load(snaps, mesh([1]), spec, {"w": w, "b": b})
    print(json.dumps(out))
    """
)


def test_a_rebuild_reads_only_the_surviving_slices_and_lands_on_the_new_mesh() -> None:
    out = run_on_cpu_devices(PUT_SCRIPT, 6)
    assert out["shrink_devices"] == [0, 1, 2, 3]
    assert out["shrink_reused"] is True, "dropping a lost slice's replica copied the survivors' shards"
    assert out["shrink_values"] == [True, True]
    assert out["grow_values"] == [True, True, [0, 1, 2, 3, 4, 5]]
    assert out["none_left"] is True
    assert out["snap_step"] == 7
    assert out["snap_values"] == [True, True, None], "the state changed when the snapshot was freed"
    assert out["other_layout"] == [8, True, "P('model', None)"]
    assert out["all_lost"] == "No active replicas found."
