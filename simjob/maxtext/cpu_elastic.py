"""Tests and benchmarks only: let MaxText's Pathways-only elastic path run on the CPU.

MaxText's ``elastic_enabled`` path (``elastic_utils.elastic_retry`` around
the train function, pathwaysutils' ``Manager``) refuses to run without
Pathways. Three patches, applied by :func:`apply` inside the MaxText process
before MaxText runs (``python -m simjob.maxtext`` does that when
``ELASTIC_SIDECAR_TEST_CPU_ELASTIC=1``); see FACTS section 9:

1. ``pathwaysutils.is_pathways_backend_used`` returns True: otherwise
   ``elastic_utils.elastic_enabled(config)`` is False and ``elastic_retry``
   raises ValueError. (``pathwaysutils.initialize`` keeps its own check and
   stays a no-op on the CPU.)
2. ``pathwaysutils.elastic.elastic.get_slice_to_devices`` groups devices by
   ``getattr(d, "slice_index", 0)``: CPU devices have no ``slice_index``, so
   ``Manager()`` fails. All CPU devices form slice 0, as MaxText itself treats
   them (``elastic_utils.live_devices`` uses the same default).
3. ``maxtext.utils.elastic_utils.clean_up_checkpoints`` (called on every
   elastic event) always goes through the Cloud Storage client; on a local
   directory it now does the same thing locally: delete the newest numbered
   step directory if it has no ``commit_success`` marker.

With ``ELASTIC_SIDECAR_TEST_CPU_SLICES=N`` (N > 1) the CPU devices form N
slices of consecutive device ids instead (4 devices, N=2: {0,1} and {2,3}),
in pathwaysutils' grouping and in ``elastic_utils.live_devices`` alike, so a
shrink really builds MaxText's mesh on fewer devices, and the mesh the hook
reports can be checked against the sidecar's decision. Slice health stays
pathwaysutils' own check (a tiny computation per slice): every CPU slice is
healthy, like a drained host.
With ``ELASTIC_SIDECAR_TEST_FAIL_AT=STEP:SLICE`` a slice is lost during step
index STEP, with pathwaysutils' own fault injection
(``pathwaysutils.test.mock_fault_injection.DeviceLossSimulator``): the
slice's devices are marked lost, the step raises the simulator's
``DATA_LOSS`` error and leaves its input state deleted, as MaxText's donated
state is after a failed step. The next ``elastic_retry`` attempt stops the
simulator (it cannot run a whole attempt: see :func:`_lose_a_slice_during_a_step`),
and until the replacement pathwaysutils' health check reports that slice down.
A file named ``reconnect`` appearing in ``ELASTIC_SIDECAR_TEST_CONTROL`` (a
directory) brings the slice back (the replacement).
With ``ELASTIC_SIDECAR_TEST_EVENTS=PATH`` every completed step (once its state
is computed) and the injected loss append one JSON line to PATH with the
wall-clock time (``time.time()``, comparable across processes), which is how
the recovery benchmark times a run whatever recovers it.
Nothing in ``trainer_hooks`` imports this module.
"""

from __future__ import annotations

import collections
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ENV = "ELASTIC_SIDECAR_TEST_CPU_ELASTIC"
"""Set to 1 in a MaxText process's environment to apply the patches."""
ENV_SLICES = "ELASTIC_SIDECAR_TEST_CPU_SLICES"
"""How many slices the CPU devices form (default 1)."""

ENV_FAIL_AT = "ELASTIC_SIDECAR_TEST_FAIL_AT"
"""``STEP:SLICE``: lose SLICE during step index STEP (once per process)."""
ENV_CONTROL = "ELASTIC_SIDECAR_TEST_CONTROL"
"""A directory; a file ``reconnect`` in it ends the simulated loss."""
ENV_EVENTS = "ELASTIC_SIDECAR_TEST_EVENTS"
"""A JSON-lines file: ``{"kind": "step", "step": N, "devices": D, "t": ...}`` (N completed steps, the index run + 1, D the devices
its new state spans),
``{"kind": "fault", "step": INDEX, "slice": S, "t": ...}`` and ``{"kind": "start", "pid": ..., "t": ...}``."""

_applied: list[str] = []


def cpu_slices() -> int:
    return max(1, int(os.environ.get(ENV_SLICES, "1") or 1))


def slice_of(device: Any) -> int:
    """A device's slice: its ``slice_index`` where it has one, else by device id (``cpu_slices()`` groups)."""
    index = getattr(device, "slice_index", None)
    if index is not None:
        return int(index)
    n = cpu_slices()
    if n == 1:
        return 0
    import jax

    per_slice = max(1, len(jax.devices()) // n)
    return min(int(device.id) // per_slice, n - 1)


def get_slice_to_devices(devices: Sequence[Any]) -> Mapping[int, Sequence[Any]]:
    """pathwaysutils' grouping, tolerating devices without ``slice_index``."""
    slice_to_devices: dict[int, list[Any]] = collections.defaultdict(list)
    for d in devices:
        slice_to_devices[slice_of(d)].append(d)
    return dict(slice_to_devices)


def clean_up_local_checkpoints(checkpoint_dir: str, *, gcs: Any = None) -> None:
    """``elastic_utils.clean_up_checkpoints`` for a local directory (``gcs``: the original, for gs://)."""
    from maxtext.utils import max_logging

    if str(checkpoint_dir).startswith("gs://") and gcs is not None:
        gcs(checkpoint_dir)
        return
    root = Path(checkpoint_dir)
    steps = (
        sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
        if root.is_dir()
        else []
    )
    if not steps:
        max_logging.log(f"cpu_elastic: no checkpoints under {root}")
        return
    latest = steps[-1]
    if any(latest.glob("commit_success*")):
        max_logging.log(f"cpu_elastic: keeping committed checkpoint {latest}")
        return
    max_logging.log(f"cpu_elastic: deleting uncommitted checkpoint {latest}")
    shutil.rmtree(latest, ignore_errors=True)


def apply() -> None:
    """Patch pathwaysutils and MaxText in this process (idempotent)."""
    if _applied:
        return
    import pathwaysutils
    from maxtext.utils import elastic_utils
    from pathwaysutils.elastic import elastic

    pathwaysutils.is_pathways_backend_used = lambda: True
    elastic.get_slice_to_devices = get_slice_to_devices
    original = elastic_utils.clean_up_checkpoints

    def clean_up_checkpoints(checkpoint_dir: str) -> None:
        clean_up_local_checkpoints(checkpoint_dir, gcs=original)

    elastic_utils.clean_up_checkpoints = clean_up_checkpoints
    if cpu_slices() > 1:
        import jax

        def live_devices(config: Any = None) -> list[Any]:
            # elastic_utils.live_devices with this module's slice grouping
            if elastic_utils.should_use_elastic(config):
                elastic_utils.ensure_elastic_manager_initialized(config)
                active = elastic_utils.elastic_manager.active_slice_indices
                return [d for d in jax.devices() if d is not None and slice_of(d) in active]
            return jax.devices()

        elastic_utils.live_devices = live_devices
    events = Path(os.environ[ENV_EVENTS]) if os.environ.get(ENV_EVENTS) else None
    if os.environ.get(ENV_FAIL_AT):
        _lose_a_slice_during_a_step(os.environ[ENV_FAIL_AT], Path(os.environ.get(ENV_CONTROL) or "."), events)
    if events is not None:
        _record_steps(events)
    _applied.append("yes")


def record(path: Path | None, kind: str, **fields: Any) -> None:
    """Append one event line (``time.time()``) to ``path``; one write per line, so lines never interleave."""
    if path is None:
        return
    import json
    import time

    line = json.dumps({"kind": kind, "t": time.time(), "pid": os.getpid(), **fields}) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)


def _sizes(state: Any) -> dict[str, int]:
    """The train state's bytes and its model parameters: the floating-point leaves under ``model``
    (MaxText 0.2.5 splits its ``TrainStateNNX`` into ``model`` and ``optimizer``) or ``params``."""
    import jax
    import numpy as np

    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    out = {"state_bytes": int(sum(x.nbytes for _, x in flat if hasattr(x, "nbytes")))}

    def top(path: Any) -> str:
        k = path[0] if path else None
        return str(getattr(k, "key", getattr(k, "name", k)))

    model = [x for p, x in flat if top(p) in ("model", "params") and hasattr(x, "dtype")]
    floats = [x for x in model if jax.numpy.issubdtype(x.dtype, jax.numpy.floating)]  # not PRNG keys
    if floats:
        out["params"] = int(sum(int(np.prod(x.shape)) for x in floats))
    return out


def _record_steps(path: Path) -> None:
    """Wrap ``training_loop_iteration``: a ``step`` event once the step's new state is computed."""
    import jax
    from maxtext.trainers.pre_train import train

    original = train.training_loop_iteration
    counted: list[bool] = []
    record(path, "start")

    def iteration(jax_device_state: dict[str, Any], python_vars: dict[str, Any], immutable_data: dict[str, Any]) -> Any:
        step = int(python_vars["step"])
        if not counted:
            counted.append(True)
            record(path, "state", step=step, **_sizes(jax_device_state["state"]))
        metrics = original(jax_device_state, python_vars, immutable_data)
        # JAX dispatches asynchronously: the step is done when its state is (the same for every run).
        jax.block_until_ready(jax_device_state["state"])
        # The devices the new state spans: fewer after a shrink (a step of half the global batch).
        leaf = next((x for x in jax.tree_util.tree_leaves(jax_device_state["state"]) if hasattr(x, "sharding")), None)
        devices = len(leaf.sharding.device_set) if leaf is not None else None
        record(path, "step", step=step + 1, devices=devices)
        return metrics

    train.training_loop_iteration = iteration


def _lose_a_slice_during_a_step(spec: str, control: Path, events: Path | None = None) -> None:
    """Wrap MaxText's ``training_loop_iteration`` so that step index STEP loses SLICE (see the module doc)."""
    import threading
    import time

    import jax
    from maxtext.trainers.pre_train import train
    from pathwaysutils.elastic import elastic
    from pathwaysutils.test.mock_fault_injection import DeviceLossSimulator

    at, lost = (int(x) for x in spec.split(":"))
    original = train.training_loop_iteration
    fired: list[bool] = []

    current: list[DeviceLossSimulator] = []
    reconnected = threading.Event()

    def reconnect_when_told(sim: DeviceLossSimulator, mapping: Mapping[int, Sequence[Any]]) -> None:
        while not (control / "reconnect").exists():
            time.sleep(0.05)
        sim.mark_slice_connected(lost, mapping)
        reconnected.set()
        sim.stop()
        record(events, "reconnected", slice=lost)
        print(f"cpu_elastic: slice {lost} reconnected", flush=True)

    # The simulator raises the failed step's DATA_LOSS and marks what the lost slice held. It cannot
    # run a whole attempt on the survivor: its jax.jit wrapper is a plain function without a jitted
    # function's ``lower`` (MaxText compiles ahead of time), it reads ``devices()`` of donated, deleted
    # inputs, and it tracks arrays by ``id()``, which new arrays reuse. So the next attempt (MaxText's
    # ``elastic_retry`` calls ``wait_for_slices`` first, on the main thread) stops it, and until the
    # replacement comes pathwaysutils' health check reports the lost slice down, as Pathways would,
    # also to the monitor thread that looks for slices to grow onto.
    original_wait, original_active = elastic.wait_for_slices, elastic.get_active_slice_indices

    def wait_for_slices(*args: Any, **kwargs: Any) -> Any:
        if current and threading.current_thread() is threading.main_thread():
            current[0].stop()
        return original_wait(*args, **kwargs)

    def get_active_slice_indices(*args: Any, **kwargs: Any) -> Any:
        found = original_active(*args, **kwargs)
        return found if not current or reconnected.is_set() else frozenset(found) - {lost}

    elastic.wait_for_slices = wait_for_slices
    elastic.get_active_slice_indices = get_active_slice_indices

    def iteration(jax_device_state: dict[str, Any], python_vars: dict[str, Any], immutable_data: dict[str, Any]) -> Any:
        if fired or int(python_vars["step"]) != at:
            return original(jax_device_state, python_vars, immutable_data)
        fired.append(True)
        mapping = elastic.get_slice_to_devices(jax.devices())
        sim = DeviceLossSimulator()
        sim.start()
        current.append(sim)
        sim.mark_slice_lost(lost, mapping)
        record(events, "fault", step=at, slice=lost)
        print(f"cpu_elastic: slice {lost} lost during step {at}", flush=True)
        threading.Thread(target=reconnect_when_told, args=(sim, mapping), daemon=True).start()
        leaves = [x for x in jax.tree_util.tree_leaves(jax_device_state["state"]) if isinstance(x, jax.Array)]
        try:
            for x in leaves:
                sim.check_and_raise_if_corrupted(x)
        finally:
            for x in leaves:  # the failed step consumed its donated input
                x.delete()
        raise AssertionError("the simulator did not raise for a state on a lost slice")

    train.training_loop_iteration = iteration
