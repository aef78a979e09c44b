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


def test_a_snapshot_is_rebuilt_from_the_surviving_slices_copies_only() -> None:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
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
