"""The stand-in's loss simulator never raises DATA_LOSS for an array on healthy devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("pathwaysutils")

# Runs in its own process: four CPU devices, slice 1 = devices {2, 3}. An array spanning every
# device is tracked, slice 1 is lost, the array is freed; new single-device arrays on device 0
# (a healthy slice) are then read until one lands on the freed array's id.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from pathwaysutils.test.mock_fault_injection import DeviceLossSimulator
    from standins.loss_simulator import IdSafeDeviceLossSimulator

    def run(cls):
        devs = jax.devices()
        sim = cls()
        sim.start()
        try:
            mesh = Mesh(np.array(devs), ("x",))
            big = jax.device_put(np.ones(8, np.float32), NamedSharding(mesh, P("x")))
            sim.track_array(big)
            old = id(big)
            sim.mark_slice_lost(1, {0: devs[:2], 1: devs[2:]})
            del big
            reused = errors = 0
            for _ in range(2000):
                y = jax.device_put(np.ones(2, np.float32), devs[0])
                if id(y) == old:
                    reused += 1
                try:
                    np.asarray(y)
                except jax.errors.JaxRuntimeError:
                    errors += 1
                del y
            return {"reused": reused, "errors": errors}
        finally:
            sim.stop()

    print(json.dumps({"pathwaysutils": run(DeviceLossSimulator), "stand-in": run(IdSafeDeviceLossSimulator)}))
    """
)


def test_a_freed_arrays_id_does_not_carry_its_loss_to_a_new_array() -> None:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["pathwaysutils"]["reused"] == 0:
        pytest.fail(f"no id was reused in 2000 allocations, so the check proved nothing: {out}")
    assert out["pathwaysutils"]["errors"] > 0, f"pathwaysutils' simulator no longer reuses ids: {out}"
    assert out["stand-in"]["errors"] == 0, out
