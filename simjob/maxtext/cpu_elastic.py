"""Tests and benchmarks only: let MaxText's multi-slice and Pathways-only elastic paths run on the CPU.

Applied by :func:`apply` inside the MaxText process before MaxText runs
(``python -m simjob.maxtext`` does that when ``ELASTIC_SIDECAR_TEST_CPU_ELASTIC=1``);
see FACTS section 9. Each stand-in replaces something that exists only on TPUs
and Pathways, and tells MaxText nothing the real thing would not.

1. **Slices** (``ELASTIC_SIDECAR_TEST_CPU_SLICES=N``, N > 1): every CPU device
   gets a ``slice_index`` attribute, as every TPU device of a multi-slice job
   has (a property on jaxlib's device class, CPU devices only): the device ids
   in N equal consecutive groups (8 devices, N=4: {0,1} {2,3} {4,5} {6,7}).
   That grouping is the only thing it says. MaxText and its libraries then run
   their own multi-slice code unchanged: ``max_utils.get_num_slices`` counts
   the slices (``elastic_utils.live_slice_indices``: ``getattr(d,
   "slice_index", 0)``), ``maxtext_utils.create_device_mesh`` builds the hybrid
   mesh through ``jax.experimental.mesh_utils.create_hybrid_device_mesh``
   (devices grouped by ``slice_index``, the DCN axes across the groups:
   ``dcn_data_parallelism`` makes the slice axis the data, replica, axis), and
   pathwaysutils groups by ``d.slice_index`` (``elastic.get_slice_to_devices``)
   for the ``Manager``'s active slices and its per-slice health computation.
   MaxText logs the mesh it built (``Num_devices: 8, shape ...``).
2. **Pathways**: ``pathwaysutils.is_pathways_backend_used`` returns True, so
   ``elastic_utils.elastic_enabled(config)`` holds and ``elastic_retry`` runs
   (``pathwaysutils.initialize`` keeps its own check and stays a no-op here).
3. ``maxtext.utils.elastic_utils.clean_up_checkpoints`` (called on every
   elastic event) always goes through the Cloud Storage client; on a local
   directory it does the same thing locally: delete the newest numbered step
   directory if it has no ``commit_success`` marker.
4. **A lost slice** (``ELASTIC_SIDECAR_TEST_FAIL_AT=STEP:SLICE``), as on
   Pathways: the slice dies while step index STEP runs (after the step before
   it completed and STEP was dispatched, its donated input state consumed).
   Nothing is raised then. From that moment (:class:`LostDevices`):

   * every array held only by the lost slice's devices is deleted: its share
     of whatever lived there, e.g. a snapshot replica in its ``pinned_host``
     memory (Orbax's Pathways ``Snapshotter`` keeps one array per replica);
   * reading or waiting on any array that spans one of its devices raises
     ``JaxRuntimeError("DATA_LOSS: ...")`` (pathwaysutils' own
     ``mock_fault_injection`` error text, which names no device or slice):
     ``jax.block_until_ready``, and each ``jax.Array`` class's
     ``block_until_ready``, ``_value`` (``float()``, ``np.asarray``,
     ``jax.device_get``), ``__array__`` and ``__dlpack__``. So the error
     surfaces on MaxText's (or the hook's) next transfer or wait: with
     MaxText's own loop, its metric logger reading the failed step's loss
     one step later; a snapshot in flight fails the same way.
   * pathwaysutils' own health check is told nothing: its per-slice
     computation (``DefaultSliceHealthChecker``, a ``pmap`` on the slice's
     devices and ``jax.block_until_ready``) fails with that error on the lost
     slice and succeeds on the others, so ``wait_for_slices``, the Manager's
     active slices and its monitor thread find the survivors themselves.

   The loss lasts until a file named ``reconnect`` appears in
   ``ELASTIC_SIDECAR_TEST_CONTROL`` (a directory): the replacement slice
   (the provisioner's stand-in). Each file brings back one slice, the one
   lost first, and is removed, so a later loss stays lost until the next
   file. The replacement's devices then compute again; nothing that lived
   there comes back, and every array that spanned them during the loss stays
   unreadable (sticky, as in pathwaysutils' simulator: :class:`LostDevices`).
   The patches are installed at the loss, so a run without one runs unpatched.

   **What a wait on a lost buffer answers** (``ELASTIC_SIDECAR_TEST_LOST_WAIT``): Pathways' answer
   is not documented (docs/maxtext.md), so the stand-in gives either. ``error`` (the default, as
   pathwaysutils' simulator): the arrays held only by the lost slice are deleted, and a wait on
   anything that spans it raises. ``ready`` (the kinder runtime): arrays computed before the loss
   stay, and a wait on them returns as if ready (their buffers were complete); reading their data
   (``_value``, ``__array__``, ``__dlpack__``) or copying from them (pathwaysutils'
   ``concatenate_by_mesh_axis``, the step of Orbax's ``Snapshotter.load`` that gathers the replicas)
   still raises the ``DATA_LOSS`` error, and so does anything computed on the slice during the loss
   (pathwaysutils' health check). So Orbax counts a lost replica as alive there, and a load from it
   fails at the copy.
5. **Events** (``ELASTIC_SIDECAR_TEST_EVENTS=PATH``): one JSON line per
   completed step and per injected loss, with the wall-clock time
   (``time.time()``, comparable across processes), which is how the tests and
   the recovery benchmark read a run whatever recovers it. A step's line is
   written by a recorder thread once the step's metrics are computed, so the
   training loop is never blocked by the recording (MaxText dispatches steps
   asynchronously); a step whose state spans a lost device did not complete and
   gets no line. With a grain pipeline each step's line carries a hash of the
   input batch it consumed (``batch``) and of each of its rows (``rows``), taken
   from the host array MaxText's ``multihost_dataloading`` puts on the devices. Each compile
   (``jax.monitoring``) and each restore (``load_state_if_possible``) gets a line with its seconds, and each
   program loaded from JAX's persistent compilation cache a ``cache_hit`` line with its name.
6. **A grow whose snapshot load fails** (``ELASTIC_SIDECAR_TEST_FAIL_GROW_LOAD=N``): the first N
   calls of Orbax's ``Snapshotter.load`` onto more slices than the snapshot's replicas raise the
   ``DATA_LOSS`` error above, as a copy to a host that went away during the grow would.

Nothing in ``trainer_hooks`` imports this module.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import queue
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "ELASTIC_SIDECAR_TEST_CPU_ELASTIC"
"""Set to 1 in a MaxText process's environment to apply the patches."""
ENV_SLICES = "ELASTIC_SIDECAR_TEST_CPU_SLICES"
"""How many slices the CPU devices form (default 1: no ``slice_index``, as on a single slice)."""
ENV_FAIL_AT = "ELASTIC_SIDECAR_TEST_FAIL_AT"
"""``STEP:SLICE``: lose SLICE during step index STEP (once per process)."""
ENV_CONTROL = "ELASTIC_SIDECAR_TEST_CONTROL"
"""A directory; a file ``reconnect`` in it ends the simulated loss."""
ENV_FAIL_GROW_LOAD = "ELASTIC_SIDECAR_TEST_FAIL_GROW_LOAD"
"""A whole number N: the first N snapshot loads onto more slices than the snapshot was taken on (a grow) fail."""
LOST_WAIT_ANSWERS = ("error", "ready")
ENV_LOST_WAIT = "ELASTIC_SIDECAR_TEST_LOST_WAIT"
"""What a wait on an array computed before a loss answers: ``error`` (default) or ``ready`` (module doc, 4)."""
ENV_EVENTS = "ELASTIC_SIDECAR_TEST_EVENTS"
"""A JSON-lines file: ``{"kind": "step", "step": N, "devices": D, "batch": H, "rows": [...], "t": ..., "cpu": C, "steal": S}``
(N completed steps, the index run + 1; D the devices its new state spans; H the batch hash, grain only;
C the process's CPU seconds over all its threads, ``time.process_time()``; S the machine's steal seconds,
:func:`machine_steal_seconds`: a step's wall time on a shared VM moves with the steal, its CPU time much less),
``{"kind": "fault", "step": INDEX, "slice": S, "t": ...}``, ``{"kind": "mesh", "slices": K, ...}`` (each mesh
MaxText builds; ``mesh_prepared``: one the hook builds ahead, in another thread), ``{"kind": "cache_hit",
"what": ...}``, ``{"kind": "state", ...}`` (sizes, once per attempt), ``{"kind": "reconnected", ...}`` and
``{"kind": "start", "pid": ..., "t": ...}`` and ``{"kind": "attempt", ...}`` (each ``elastic_retry`` attempt's start)."""

DATA_LOSS_MESSAGE = "DATA_LOSS: Simulated device loss error accessing array on lost device"
"""The error text of pathwaysutils' ``test.mock_fault_injection.DeviceLossSimulator``."""

_applied: list[str] = []


def cpu_slices() -> int:
    raw = os.environ.get(ENV_SLICES, "1") or "1"
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{ENV_SLICES}={raw!r}: expected a whole number of slices >= 1")
    return n


def lost_wait_answer() -> str:
    """``ELASTIC_SIDECAR_TEST_LOST_WAIT``: ``error`` (unset) or ``ready``; any other value is a clear error."""
    raw = (os.environ.get(ENV_LOST_WAIT) or "error").strip()
    if raw not in LOST_WAIT_ANSWERS:
        raise ValueError(f"{ENV_LOST_WAIT}={raw!r}: expected one of {', '.join(LOST_WAIT_ANSWERS)}")
    return raw


def slice_grouping(device_ids: Sequence[int], slices: int) -> dict[int, int]:
    """Device id -> slice: ``slices`` equal groups of consecutive ids (a clear error if they do not divide)."""
    ids = sorted(device_ids)
    if slices < 1 or not ids or len(ids) % slices:
        raise ValueError(
            f"{ENV_SLICES}={slices}: the {len(ids)} CPU devices do not form {slices} equal slices "
            f"(set XLA_FLAGS=--xla_force_host_platform_device_count to a multiple of {slices})"
        )
    per = len(ids) // slices
    return {d: i // per for i, d in enumerate(ids)}


def install_slice_index(slices: int) -> dict[int, int]:
    """Give every CPU device its ``slice_index`` (see the module doc, 1); returns id -> slice."""
    import jax

    devices = jax.devices()
    cpu = [d for d in devices if d.platform == "cpu"]
    grouping = slice_grouping([d.id for d in cpu], slices)
    cls = type(devices[0])
    mine = getattr(getattr(vars(cls).get("slice_index"), "fget", None), "_cpu_elastic", False)
    if "slice_index" in vars(cls) and not mine:
        raise RuntimeError(f"{cls.__qualname__} already has a slice_index of its own: nothing to stand in for")

    def slice_index(self: Any) -> int:
        if self.platform != "cpu" or self.id not in grouping:
            raise AttributeError("slice_index")  # only the CPU devices of this process
        return grouping[self.id]

    slice_index._cpu_elastic = True  # type: ignore[attr-defined]
    cls.slice_index = property(slice_index)
    return grouping


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

    pathwaysutils.is_pathways_backend_used = lambda: True
    original = elastic_utils.clean_up_checkpoints

    def clean_up_checkpoints(checkpoint_dir: str) -> None:
        clean_up_local_checkpoints(checkpoint_dir, gcs=original)

    elastic_utils.clean_up_checkpoints = clean_up_checkpoints
    if cpu_slices() > 1:
        install_slice_index(cpu_slices())
    events = Path(os.environ[ENV_EVENTS]) if os.environ.get(ENV_EVENTS) else None
    if os.environ.get(ENV_FAIL_GROW_LOAD):
        _fail_grow_loads(int(os.environ[ENV_FAIL_GROW_LOAD]), events)
    LOST.wait_answer = lost_wait_answer()
    if os.environ.get(ENV_FAIL_AT):
        _lose_a_slice_during_a_step(os.environ[ENV_FAIL_AT], Path(os.environ.get(ENV_CONTROL) or "."), events)
    if events is not None:
        _record_compiles(events)
        _record_cache_hits(events)
        _record_meshes(events)
        _record_attempts(events)
        _record_steps(events)
    _applied.append("yes")


def machine_steal_seconds() -> float | None:
    """The machine's steal time so far, in CPU-seconds over all its CPUs: the time its virtual CPUs
    were ready to run but the hypervisor ran something else (the 8th field of the ``cpu`` line of
    ``/proc/stat``, in ``USER_HZ`` ticks: proc(5)). None where there is no such field."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if fields[0] == "cpu" and len(fields) > 8 else None
    except (OSError, ValueError, IndexError):
        return None


def record(path: Path | None, kind: str, **fields: Any) -> None:
    """Append one event line (``time.time()``) to ``path``; one write per line, so lines never interleave."""
    if path is None:
        return
    import json

    line = json.dumps({"kind": kind, "t": time.time(), "pid": os.getpid(), **fields}) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)


# ---------------------------------------------------------------------------
# a lost slice
# ---------------------------------------------------------------------------


def _device_ids(x: Any) -> frozenset[int]:
    try:
        return frozenset(d.id for d in x.sharding.device_set)
    except Exception:  # noqa: BLE001 - not an array with a sharding
        return frozenset()


class LostDevices:
    """The devices of lost slices, and what losing them does to arrays (module doc, 4).

    Losses are sticky, as in pathwaysutils' ``DeviceLossSimulator`` (its corrupted arrays stay corrupted
    after ``mark_device_connected``): an array that spanned a lost device at any moment of the loss (live
    when it began, made during it, or live when the slice came back) keeps failing every read and wait for
    good; only arrays made after the replacement slice came back read its devices again."""

    def __init__(self, wait_answer: str = "error") -> None:
        self.ids: frozenset[int] = frozenset()
        self.wait_answer = wait_answer
        """What a wait on an array computed before the loss answers (module doc, 4)."""
        self._corrupted: dict[int, weakref.ref[Any]] = {}
        """id -> a weak reference to each array that spanned a lost device (dropped with the array)."""
        self._ready: dict[int, weakref.ref[Any]] = {}
        """With ``wait_answer="ready"``: the arrays live when their devices were lost (complete buffers)."""
        self._installed = False
        self._lock = threading.Lock()
        self._exempt = threading.local()

    def exempt_this_thread(self) -> None:
        """This thread's reads never fail (the event recorder: it observes, it is not the training)."""
        self._exempt.on = True

    @staticmethod
    def _remember(refs: dict[int, weakref.ref[Any]], x: Any) -> None:
        key = id(x)
        if key not in refs:
            refs[key] = weakref.ref(x, lambda _ref, key=key: refs.pop(key, None))

    @staticmethod
    def _holds(refs: dict[int, weakref.ref[Any]], x: Any) -> bool:
        ref = refs.get(id(x))
        return ref is not None and ref() is x

    def _corrupt(self, x: Any) -> None:
        self._remember(self._corrupted, x)

    def corrupted(self, x: Any) -> bool:
        return self._holds(self._corrupted, x)

    def spans_lost(self, x: Any) -> bool:
        import jax

        if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
            return False
        if self.corrupted(x):
            return True
        if self.ids and _device_ids(x) & self.ids:
            self._corrupt(x)  # made on a lost device: it stays unreadable after the slice comes back
            return True
        return False

    def check(self, x: Any, wait: bool = False) -> None:
        """Raise the ``DATA_LOSS`` error if reading ``x`` (or waiting on it: ``wait``) touches a lost device."""
        import jax

        if getattr(self._exempt, "on", False):
            return
        if not (self.ids or self._corrupted):
            return
        for leaf in jax.tree_util.tree_leaves(x):
            if wait and self.wait_answer == "ready" and self._holds(self._ready, leaf):
                continue  # computed before the loss: the kinder runtime answers "ready"
            if self.spans_lost(leaf):
                raise jax.errors.JaxRuntimeError(DATA_LOSS_MESSAGE)

    def lose(self, device_ids: frozenset[int]) -> int:
        """The devices are gone: delete what lived only there (with the ``ready`` answer: keep it, its waits
        answer "ready"); reads of what spans them fail from now on. Returns how many arrays were deleted."""
        import jax

        with self._lock:
            self._install()
            self.ids = self.ids | device_ids
            deleted = 0
            for x in jax.live_arrays():
                ids = _device_ids(x)
                if ids & self.ids:
                    self._corrupt(x)
                    if self.wait_answer == "ready":
                        self._remember(self._ready, x)
                        continue  # its buffers stay: a wait answers "ready", a read fails
                if ids and ids <= self.ids and not x.is_deleted():
                    x.delete()
                    deleted += 1
            return deleted

    def reconnect(self, device_ids: frozenset[int]) -> None:
        """The replacement devices: every array still alive that spans them was there during the loss and
        stays unreadable; new arrays on them read again."""
        import jax

        with self._lock:
            for x in jax.live_arrays():
                if _device_ids(x) & device_ids:
                    self._corrupt(x)
            self.ids = self.ids - device_ids

    def _install(self) -> None:
        """Wrap JAX's reads and waits (the points where pathwaysutils' ``DeviceLossSimulator`` checks)."""
        if self._installed:
            return
        import jax

        lost = self
        original_wait = jax.block_until_ready

        def block_until_ready(x: Any) -> Any:
            lost.check(x, wait=True)
            return original_wait(x)

        jax.block_until_ready = block_until_ready

        def checked(method: Callable[..., Any], wait: bool = False) -> Callable[..., Any]:
            def wrapper(a: Any, *args: Any, **kwargs: Any) -> Any:
                lost.check(a, wait)
                return method(a, *args, **kwargs)

            return wrapper

        for cls in [jax.Array, *jax.Array.__subclasses__()]:
            for name in ("block_until_ready", "__array__", "__dlpack__"):
                method = vars(cls).get(name)
                if callable(method):
                    setattr(cls, name, checked(method, wait=name == "block_until_ready"))
            for name in ("_value",):  # a property: float(), np.asarray, jax.device_get read it
                value = vars(cls).get(name)
                if isinstance(value, property) and value.fget is not None:
                    setattr(cls, name, property(checked(value.fget)))
        if self.wait_answer == "ready":
            # Gathering the replicas moves their data: a copy from a lost host fails, whatever a wait said.
            from pathwaysutils.experimental import concatenate_by_mesh_axis as concat

            original_concat = concat.concatenate_by_mesh_axis

            def concatenate_by_mesh_axis(array_trees: Any, mesh_axis: str) -> Any:
                lost.check(array_trees)
                return original_concat(array_trees, mesh_axis)

            concat.concatenate_by_mesh_axis = concatenate_by_mesh_axis
        self._installed = True


LOST = LostDevices()
"""This process's lost devices."""


def slice_devices(slice_index: int) -> frozenset[int]:
    """The ids of a slice's devices (by ``slice_index``, 0 for every device without one)."""
    import jax

    return frozenset(d.id for d in jax.devices() if getattr(d, "slice_index", 0) == slice_index)


@dataclass(frozen=True)
class Fault:
    """One slice loss: ``STEP:SLICE`` (during step index STEP) or ``STEP:SLICE:snapshot`` (as the snapshot of
    the boundary before step index STEP starts, inside Orbax's ``Snapshotter.save``: that snapshot fails)."""

    step: int
    slice: int
    during: str = "step"


def parse_faults(spec: str) -> list[Fault]:
    """``ELASTIC_SIDECAR_TEST_FAIL_AT``: faults separated by commas, in step order; a clear error naming a bad one."""
    out: list[Fault] = []
    for part in (p.strip() for p in spec.split(",")):
        bits = part.split(":")
        try:
            if len(bits) not in (2, 3) or (len(bits) == 3 and bits[2] not in ("step", "snapshot")):
                raise ValueError
            fault = Fault(int(bits[0]), int(bits[1]), bits[2] if len(bits) == 3 else "step")
            if fault.step < 0 or fault.slice < 0:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"{ENV_FAIL_AT}={spec!r}: {part!r} is not STEP:SLICE or STEP:SLICE:snapshot (whole numbers >= 0)"
            ) from None
        out.append(fault)
    if [f.step for f in out] != sorted(f.step for f in out):
        raise ValueError(f"{ENV_FAIL_AT}={spec!r}: faults must be in step order")
    return out


def _lose_a_slice_during_a_step(spec: str, control: Path, events: Path | None = None) -> None:
    """Wrap MaxText's ``training_loop_iteration`` (and, for a ``snapshot`` fault, Orbax's
    ``Snapshotter.save``) so that each fault's slice dies where it says (module doc, 4)."""
    import jax
    from maxtext.trainers.pre_train import train

    faults = parse_faults(spec)
    original = train.training_loop_iteration
    pending = list(faults)
    next_index: list[int] = [-1]
    wait = jax.block_until_ready

    lost: queue.Queue[tuple[Fault, frozenset[int]]] = queue.Queue()

    def reconnect_when_told() -> None:
        # The provisioner's stand-in: each ``reconnect`` file brings back one slice, the one lost first,
        # and is used up, so a slice lost later stays lost until another file appears.
        flag = control / "reconnect"
        while True:
            fault, ids = lost.get()
            while not flag.exists():
                time.sleep(0.05)
            flag.unlink(missing_ok=True)
            LOST.reconnect(ids)
            record(events, "reconnected", slice=fault.slice)
            print(f"cpu_elastic: slice {fault.slice} reconnected", flush=True)

    threading.Thread(target=reconnect_when_told, name="cpu-elastic-provisioner", daemon=True).start()

    def lose(fault: Fault) -> None:
        pending.remove(fault)
        ids = slice_devices(fault.slice)
        if not ids:
            raise ValueError(f"{ENV_FAIL_AT}={spec!r}: no device has slice_index {fault.slice}")
        deleted = LOST.lose(ids)
        record(events, "fault", step=fault.step, slice=fault.slice, during=fault.during, deleted_arrays=deleted)
        print(
            f"cpu_elastic: slice {fault.slice} lost during the {fault.during} of step {fault.step} "
            f"({deleted} arrays on it deleted)",
            flush=True,
        )
        lost.put((fault, ids))

    def iteration(jax_device_state: dict[str, Any], python_vars: dict[str, Any], immutable_data: dict[str, Any]) -> Any:
        step = int(python_vars["step"])
        due = next((f for f in pending if f.step == step and f.during == "step"), None)
        if due is None:
            metrics = original(jax_device_state, python_vars, immutable_data)
        else:
            # The slice dies while this step runs: the step before it has completed (so "STEP steps
            # completed" is well defined), this one is dispatched and has consumed its donated input.
            with contextlib.suppress(jax.errors.JaxRuntimeError):  # an earlier loss not yet surfaced
                wait(jax_device_state["state"])
            metrics = original(jax_device_state, python_vars, immutable_data)
            lose(due)
        next_index[0] = step + 1
        return metrics

    train.training_loop_iteration = iteration
    if any(f.during == "snapshot" for f in faults):
        from orbax.checkpoint.experimental.v1._src.training.pathways import snapshotter

        original_save = snapshotter.Snapshotter.save

        def save(self: Any, step: int, state: Any) -> None:
            # The first save at or after the boundary before step index STEP (a save the hook skips, one still
            # copying, cannot be hit): the slice dies as its snapshot starts, so the copies
            # the save dispatches span a lost device and its wait fails (Orbax logs "Failed to snapshot").
            due = next((f for f in pending if 0 <= f.step <= next_index[0] and f.during == "snapshot"), None)
            if due is not None:
                lose(due)
            return original_save(self, step, state)

        snapshotter.Snapshotter.save = save  # type: ignore[method-assign]


def _fail_grow_loads(count: int, events: Path | None = None) -> None:
    """Wrap Orbax's ``Snapshotter.load`` so that the first ``count`` loads onto a mesh of more slices than
    the snapshot's replicas (a grow: the copy from the smaller mesh's ``pinned_host`` memory onto the
    larger one) fail as a transfer to a host that went away would, with pathwaysutils' simulator's
    ``DATA_LOSS`` error, before anything is put on the new mesh (module doc, 6)."""
    import jax
    from orbax.checkpoint.experimental.v1._src.training.pathways import snapshotter

    original_load = snapshotter.Snapshotter.load
    left = [count]

    def load(self: Any, abstract_state: Any, **kwargs: Any) -> Any:
        latest = getattr(self, "_latest_snapshot", None)
        replicas = len(latest[0]) if latest else 0
        slices = {
            int(getattr(d, "slice_index", 0))
            for x in jax.tree_util.tree_leaves(abstract_state)
            if getattr(x, "sharding", None) is not None
            for d in x.sharding.device_set
        }
        if left[0] > 0 and replicas and len(slices) > replicas:
            left[0] -= 1
            record(events, "load_failed", replicas=replicas, slices=len(slices))
            raise jax.errors.JaxRuntimeError(DATA_LOSS_MESSAGE + " (test: a grow's snapshot load)")
        return original_load(self, abstract_state, **kwargs)

    snapshotter.Snapshotter.load = load  # type: ignore[method-assign]


# ---------------------------------------------------------------------------
# events
# ---------------------------------------------------------------------------


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


def batch_fields(inputs: Any) -> dict[str, Any]:
    """A batch's hash and its rows' hashes (16 and 12 hex digits of SHA-256 of the bytes)."""
    import numpy as np

    a = np.ascontiguousarray(inputs)
    rows = [hashlib.sha256(r.tobytes()).hexdigest()[:12] for r in a.reshape(a.shape[0], -1)] if a.ndim else []
    return {"batch": hashlib.sha256(a.tobytes()).hexdigest()[:16], "rows": rows}


_last_batch: list[dict[str, Any]] = []
"""The newest input batch put on the devices (main thread)."""


def _hash_batches() -> None:
    """Wrap ``multihost_dataloading._form_global_array`` (each leaf of a host batch, before the device put)."""
    from maxtext.input_pipeline import multihost_dataloading as mh

    original = mh._form_global_array

    def form_global_array(path: Any, array: Any, global_mesh: Any) -> Any:
        keys = [str(getattr(k, "key", k)) for k in path]
        if keys and keys[-1] == "inputs":
            _last_batch[:] = [batch_fields(array)]
        return original(path, array, global_mesh)

    mh._form_global_array = form_global_array


def _record_meshes(path: Path) -> None:
    """Wrap ``maxtext_utils.create_device_mesh``: a ``mesh`` event with the slices of the devices of the mesh
    MaxText built (by ``slice_index``), its device count and shape (``mesh_slices_before``/``_after``); a
    ``mesh_prepared`` event for one built outside MaxText's training thread (the hook's prepare)."""
    from maxtext.utils import maxtext_utils

    original = maxtext_utils.create_device_mesh

    def create_device_mesh(*args: Any, **kwargs: Any) -> Any:
        mesh = original(*args, **kwargs)
        devices = list(getattr(mesh, "flat", []))
        slices = sorted({int(getattr(d, "slice_index", 0)) for d in devices})
        # MaxText trains in the main thread; a mesh built in another is the hook's prepare of the next one.
        attempt = threading.current_thread() is threading.main_thread()
        kind = "mesh" if attempt else "mesh_prepared"
        record(path, kind, slices=len(slices), slice_indices=slices, devices=len(devices), shape=list(mesh.shape))
        if attempt:
            _time_restores(path)  # each attempt builds its mesh before it restores; by then the hook has wrapped it
        return mesh

    maxtext_utils.create_device_mesh = create_device_mesh


def _record_attempts(path: Path) -> None:
    """An ``attempt`` event where each ``elastic_retry`` attempt begins: pathwaysutils 0.1.13's
    ``Manager.elastic_retry`` starts every attempt with ``elastic.wait_for_slices``, then MaxText re-initialises,
    builds its mesh and compiles (its monitor thread checks slices without it). Where a strategy without the
    sidecar is held again (bench/recovery_maxtext.py, ``recovery_phases``)."""
    from pathwaysutils.elastic import elastic

    original = elastic.wait_for_slices

    def wait_for_slices(*args: Any, **kwargs: Any) -> Any:
        record(path, "attempt")
        return original(*args, **kwargs)

    elastic.wait_for_slices = wait_for_slices


COMPILE_EVENTS = "/jax/core/compile/"
"""``jax.monitoring``'s duration events of a program's trace, lowering and backend compile (the last includes a
load from the persistent cache: ``pxla`` times ``compile_or_get_cached`` as a whole)."""


def _record_compiles(path: Path) -> None:
    """A ``compile`` event per ``jax.monitoring`` compile duration (its seconds): a recovery's rebuild."""
    import jax

    def listener(event: str, duration: float, **_: Any) -> None:
        if event.startswith(COMPILE_EVENTS):
            record(path, "compile", what=event.rsplit("/", 1)[-1], seconds=round(duration, 6))

    jax.monitoring.register_event_duration_secs_listener(listener)


def _record_cache_hits(path: Path) -> None:
    """A ``cache_hit`` event (``what``: the program's name, e.g. ``jit_train_step``) for each program JAX loads
    from its persistent compilation cache: jax 0.12's ``compiler.log_persistent_cache_hit`` logs it, with the
    module name as its first argument, at DEBUG on ``jax._src.compiler``. A filter on that logger records it and
    lets through only what the logger's own level would have (so nothing more is printed)."""
    import logging

    logger = logging.getLogger("jax._src.compiler")
    shown = logger.getEffectiveLevel()

    def keep(rec: logging.LogRecord) -> bool:
        if str(rec.msg).startswith("Persistent compilation cache hit") and rec.args:
            args = rec.args if isinstance(rec.args, tuple) else (rec.args,)
            record(path, "cache_hit", what=str(args[0]))
        return rec.levelno >= shown

    logger.addFilter(keep)
    logger.setLevel(min(shown, logging.DEBUG))


_restore_timer: list[Callable[..., Any]] = []
_restoring: list[float] = []


def _time_restores(path: Path) -> None:
    """Wrap the outermost ``checkpointing.load_state_if_possible`` (the hook's, once it has wrapped it, so a
    snapshot's load counts too): a ``restore`` event with its seconds, for the outermost call only."""
    from maxtext.common import checkpointing

    inner = checkpointing.load_state_if_possible
    if _restore_timer and inner is _restore_timer[-1]:
        return

    def load_state_if_possible(*args: Any, **kwargs: Any) -> Any:
        _restoring.append(time.monotonic())
        try:
            return inner(*args, **kwargs)
        finally:
            t0 = _restoring.pop()
            if not _restoring:
                record(path, "restore", seconds=round(time.monotonic() - t0, 6))

    load_state_if_possible.__dict__.update(inner.__dict__)  # the hook's own mark: it does not wrap this again
    _restore_timer.append(load_state_if_possible)
    checkpointing.load_state_if_possible = load_state_if_possible


def _record_steps(path: Path) -> None:
    """Wrap ``training_loop_iteration``: a ``step`` event once the step's metrics are computed (module doc, 5)."""
    import jax
    from maxtext.trainers.pre_train import train

    _hash_batches()
    original = train.training_loop_iteration
    wait = jax.block_until_ready  # before any loss wraps it: the recorder's wait never raises for one
    pending: queue.Queue[tuple[Any, dict[str, Any]] | None] = queue.Queue()
    record(path, "start")

    def recorder() -> None:
        LOST.exempt_this_thread()
        while (item := pending.get()) is not None:
            metrics, fields = item
            try:
                wait(metrics)
            except Exception as e:  # noqa: BLE001 - a step that failed did not complete
                record(path, "step_failed", step=fields["step"], error=f"{type(e).__name__}: {e}"[:200])
            else:
                record(path, "step", cpu=round(time.process_time(), 6), steal=machine_steal_seconds(), **fields)
            finally:
                pending.task_done()

    thread = threading.Thread(target=recorder, name="cpu-elastic-events", daemon=True)
    thread.start()

    def drain() -> None:
        pending.put(None)
        thread.join(30)

    atexit.register(drain)
    attempt_start: list[int] = []

    def iteration(jax_device_state: dict[str, Any], python_vars: dict[str, Any], immutable_data: dict[str, Any]) -> Any:
        step = int(python_vars["step"])
        start = int(immutable_data.get("start_step", -1))
        if attempt_start[-1:] != [start] or step == start:
            attempt_start[:] = [start]
            record(path, "state", step=step, **_sizes(jax_device_state["state"]))
        _last_batch.clear()
        metrics = original(jax_device_state, python_vars, immutable_data)
        leaf = next((x for x in jax.tree_util.tree_leaves(jax_device_state["state"]) if hasattr(x, "sharding")), None)
        ids = _device_ids(leaf) if leaf is not None else frozenset()
        if ids & LOST.ids:  # computed on a lost device: never completes
            return metrics
        fields: dict[str, Any] = {"step": step + 1, "devices": len(ids) or None}
        if _last_batch:
            fields.update(_last_batch[0])
        pending.put((metrics, fields))
        return metrics

    train.training_loop_iteration = iteration
