"""The example trainer's NumPy host copies (trainer_hooks/maxtext/host_copy.py) on real JAX CPU devices, and the
hook's snapshot interval setting (trainer_hooks/maxtext/snapshot.py; its Orbax snapshots are tested in tests/maxtext)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from trainer_hooks.maxtext.snapshot import AUTO, ENV_SNAPSHOT_EVERY, snapshot_every_from_env

pytest.importorskip("jax")

# Four CPU devices as two slices ({0, 1} and {2, 3}); the state is sharded within a slice and
# replicated across slices, as MaxText's data axis over DCN does. Runs in its own process: the
# device count is fixed when JAX starts.
SCRIPT = textwrap.dedent(
    """
    import json
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from trainer_hooks.maxtext.host_copy import take

    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("replica", "model"))
    w = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    keys = jax.random.split(jax.random.key(7), 4)
    key_data = np.array(jax.random.key_data(keys))
    state = {
        "w": jax.device_put(w, NamedSharding(mesh, P(None, "model"))),
        "rng": jax.device_put(keys, NamedSharding(mesh, P())),
        "step": 5,
    }
    slice_of = lambda d: d.id // 2
    snap = take(state, 5, slice_of)
    # what donation does to the state after the snapshot
    for x in jax.tree_util.tree_leaves(state):
        if isinstance(x, jax.Array):
            x.delete()
    out = {"nbytes": snap.nbytes, "step": snap.step}
    for lost in ([], [0], [1], [0, 1]):
        got = snap.assemble(lost)
        if got is None:
            out[str(lost)] = None
            continue
        out[str(lost)] = {
            "w": bool(np.array_equal(np.asarray(got["w"]), w)),
            "rng": bool(np.array_equal(np.asarray(jax.random.key_data(got["rng"])), key_data)),
            "step": got["step"],
        }
    # a leaf sharded across the slices has no whole copy on either one alone
    across = {"v": jax.device_put(w, NamedSharding(mesh, P("replica", "model")))}
    out["across_lost_1"] = take(across, 1, slice_of).assemble([1]) is None
    # reuse: the next snapshot writes into the previous one's buffers and holds the new values
    first = take({"w": jax.device_put(w, NamedSharding(mesh, P(None, "model")))}, 1, slice_of)
    second = take({"w": jax.device_put(w + 1, NamedSharding(mesh, P(None, "model")))}, 2, slice_of, reuse=first)
    bufs = lambda snap: [c for copies in snap.leaves[0].shards.values() for c in copies.values()]
    out["reuse_same_buffers"] = all(a is b for a, b in zip(bufs(first), bufs(second), strict=True))
    out["reuse_values"] = bool(np.array_equal(second.assemble([])["w"], w + 1))
    # exclude: a known-lost slice's shards are not read, and only the other slice's copies rebuild it
    part = take({"w": jax.device_put(w, NamedSharding(mesh, P(None, "model")))}, 3, slice_of, exclude=[1])
    out["exclude"] = [part.nbytes, part.assemble([0]) is None, bool(np.array_equal(part.assemble([1])["w"], w))]
    print(json.dumps(out))
    """
)


def run_on_cpu_devices(script: str, devices: int) -> dict[str, object]:
    """``script``'s last line of output, as JSON, from a process with ``devices`` CPU devices."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_snapshot_is_rebuilt_from_the_surviving_slices_copies_only() -> None:
    out = run_on_cpu_devices(SCRIPT, 4)
    whole = {"w": True, "rng": True, "step": 5}
    assert out["[]"] == out["[0]"] == out["[1]"] == whole
    assert out["[0, 1]"] is None, "with every slice lost there is nothing to rebuild from"
    assert out["across_lost_1"] is True
    # one copy per slice: 2 x (8x8 float32 + 4 uint32 key pairs)
    assert out["nbytes"] == 2 * (64 * 4 + 4 * 2 * 4)
    assert out["reuse_same_buffers"] and out["reuse_values"]
    assert out["exclude"] == [64 * 4, True, True]


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
PUT_SCRIPT = textwrap.dedent(
    """
    import json
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from trainer_hooks.maxtext.host_copy import live_shards, put_shards, take

    devs = np.array(jax.devices()).reshape(3, 2)
    slice_of = lambda d: d.id // 2
    mesh = lambda slices: Mesh(devs[list(slices)], ("replica", "model"))
    spec = {"w": P(None, "model"), "b": P("model"), "step": None}
    sh = lambda m: {k: NamedSharding(m, v) for k, v in spec.items() if v is not None} | {"step": None}
    w = np.arange(96.0, dtype=np.float32).reshape(8, 12)
    b = np.arange(4.0, dtype=np.float32)
    state = {"w": jax.device_put(w, sh(mesh([0, 1, 2]))["w"]), "b": jax.device_put(b, sh(mesh([0, 1, 2]))["b"]), "step": 7}
    ptr = lambda arr: {s.device.id: s.data.unsafe_buffer_pointer() for s in arr.addressable_shards}
    same = lambda x, y: bool(np.array_equal(np.asarray(x), y))
    out = {}

    # shrink from the live state (slice 2 lost): the survivors keep their own buffers
    small = put_shards(*live_shards(state, slice_of, exclude=[2]), {**sh(mesh([0, 1])), "step": None}, slice_of)
    out["shrink_values"] = [same(small["w"], w), same(small["b"], b), small["step"]]
    before, after = ptr(state["w"]), ptr(small["w"])
    out["shrink_reused"] = sorted(after) == [0, 1, 2, 3] and all(after[d] == before[d] for d in after)

    # grow back: slice 2 (its shards were never in the 2-slice state) gets copies, the others keep theirs
    big = put_shards(*live_shards(small, slice_of), {**sh(mesh([0, 1, 2])), "step": None}, slice_of)
    grown = ptr(big["w"])
    out["grow_values"] = [same(big["w"], w), same(big["b"], b)]
    out["grow_reused"] = [all(grown[d] == after[d] for d in (0, 1, 2, 3)), all(grown[d] not in after.values() for d in (4, 5))]

    # from a snapshot, with slice 1 lost: copies (never the host buffers themselves), each from its own slice
    snap = take(state, 7, slice_of)
    for x in (state["w"], state["b"]):
        x.delete()  # donated into a step that failed
    host = [c.ctypes.data for copies in snap.leaves[2].shards.values() for c in copies.values()]
    got = snap.put({**sh(mesh([0, 2])), "step": None}, [1], slice_of)
    jax.block_until_ready(got)
    out["snap_not_aliased"] = not set(ptr(got["w"]).values()) & set(host)
    for copies in snap.leaves[2].shards.values():  # the next snapshot writes over the host buffers
        for c in copies.values():
            c.fill(0)
    # read through a computation on the devices (np.asarray of the array itself would cache its value)
    out["snap_values"] = [same(got["w"] + 0, w), same(got["b"] + 0, b), got["step"]]

    # no surviving copy, or a layout whose shards match no copy: None (the caller restores a checkpoint)
    out["all_lost"] = snap.put({**sh(mesh([0])), "step": None}, [0, 1, 2], slice_of) is None
    rows = {"w": NamedSharding(mesh([0]), P("model", None)), "b": NamedSharding(mesh([0]), P("model")), "step": None}
    out["other_layout"] = put_shards(*live_shards(got, slice_of), rows, slice_of) is None
    print(json.dumps(out))
    """
)


def test_a_rebuild_keeps_what_each_slice_holds_and_copies_only_what_the_new_mesh_lacks() -> None:
    out = run_on_cpu_devices(PUT_SCRIPT, 6)
    assert out["shrink_values"] == [True, True, 7]
    assert out["shrink_reused"] is True, "a surviving slice's shards were copied instead of kept"
    assert out["grow_values"] == [True, True]
    assert out["grow_reused"] == [True, True], "the survivors' buffers kept, the new slice's freshly copied"
    assert out["snap_values"] == [True, True, 7], "the state changed when the host copies were written over"
    assert out["snap_not_aliased"] is True, "a device buffer is the snapshot's host buffer itself"
    assert out["all_lost"] is True
    assert out["other_layout"] is True
