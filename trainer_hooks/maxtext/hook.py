"""The sidecar session inside MaxText's pre-training loop, unforked.

MaxText (0.2.5) has no plugin API in pre-training, but
``maxtext.trainers.pre_train.train`` looks up ``initialize`` and
``training_loop_iteration`` through its module every time, so replacing those
two module attributes is enough:

* ``initialize``: once MaxText has parsed its config, connect to the sidecar
  (once per process) with MaxText's own elastic flags, and wait for the first
  resume before MaxText builds its mesh.
* ``training_loop_iteration``: ``python_vars["step"]`` is the index of the
  step about to run, that is the number of completed steps. At that boundary
  the hook checks for a pending command (a deque test), hands the state and
  the data iterator's position to Orbax's Pathways ``Snapshotter`` when a
  snapshot is due (:mod:`.snapshot`, :mod:`.interval`), then runs the step and
  reports it with its wall time. A slice-loss error (``DATA_LOSS``) from the
  step reaches the sidecar (``slice_error``) before MaxText sees it.
* with ``elastic_enabled``, ``checkpointing.load_state_if_possible``, which
  each attempt's ``maxtext_utils.setup_training_state`` calls with the
  abstract state of its new mesh: the restore ladder (:meth:`MaxTextHook._restore`),
  the newest complete snapshot unless a committed checkpoint is newer.

Flushing uses MaxText's own checkpoint manager and helpers:
``checkpointing.save_checkpoint(..., force=True)`` then
``checkpointing.wait_until_finished``, and the step counts only if the
manager lists it after re-reading its directory. MaxText labels a checkpoint
with the 0-based index of the step just run, so the state after ``s``
completed steps is saved as ``s - 1`` and reported as committed step ``s``.

What MaxText cannot do in-process is move its mesh onto other slices, nor
trust a state that a failed step consumed. After a resume on a changed slice
set, or after a slice-loss error, the hook keeps the state (a grow under
``elastic_retry``: a snapshot of the boundary where the layout allows; else a
flush) and then

* with ``elastic_enabled``: raises what pathwaysutils' ``elastic_retry``
  understands (``ScaleUpSignalError`` to grow, a ``DATA_LOSS``
  ``JaxRuntimeError`` to shrink, the slice-loss error itself after one), so
  the next attempt starts at once and restores the kept step, or after a
  slice loss (whose state the step consumed) the newest snapshot, from the
  surviving replicas;
* without: exits 42, which xpk restarts, and the restart restores it.

A drain's hold that asks for a snapshot makes the newest snapshot the held step's, and the
shrink then restores it from the slices that remain, writing nothing to storage (``_keep_in_memory``).
With ``elastic_enabled``, a prepare (the slices the job will run on next, sent with a drain's
hold) compiles that mesh's train step and state initialiser in the background into MaxText's persistent
compilation cache, and the next attempt loads them from there (:mod:`.prepare`). A resume on the same slice set continues from
memory. An abort flushes and exits with the abort's exit code.

The hook never waits for ever: blocked on a sidecar (at start, in a hold, or
after a slice-loss error) that has been gone for MaxText's own
``elastic_timeout_seconds``, it flushes if it holds an uncommitted step whose
state it can read, then exits 42 (never 1), so xpk restarts the workload.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from trainer_hooks.maxtext.elastic_seam import ElasticSeam, is_scale_up_signal, slices_named_in
from trainer_hooks.maxtext.interval import SnapshotInterval
from trainer_hooks.maxtext.prepare import NextMeshCompiler
from trainer_hooks.maxtext.prepare import refusal as prepare_refusal
from trainer_hooks.maxtext.snapshot import (
    ENV_SNAPSHOT_EVERY,
    Layout,
    Snapshots,
    SnapshotUnavailable,
    data_position,
    local_iterator,
    nbytes_per_replica,
    set_data_position,
    snapshot_every_from_env,
    state_layout,
)
from trainer_hooks.session import AbortTraining, Directive, ElasticSession, ElasticSettings, FlushResult, is_slice_down

ENV_ADDRESS = "ELASTIC_SIDECAR_ADDRESS"
"""host:port of the coordinator sidecar's trainer link; unset: run MaxText unchanged."""
ENV_JOB = "ELASTIC_SIDECAR_JOB"
"""The job name the sidecar serves (checked by the sidecar when both are set)."""
EXIT_RESTART = 42
"""xpk restarts a workload that exits 42 (same value as ``agent.constants.EXIT_RESTART``,
which the trainer process must not import)."""
EXIT_USAGE = 2
"""Bad configuration (a bad ``ELASTIC_SIDECAR_SNAPSHOT_EVERY``), or MaxText/pathwaysutils not as the hook was built for."""
TRAIN_MODULE = "maxtext.trainers.pre_train.train"
LOG_PREFIX = "trainer_hooks.maxtext"
RECOVERY_WAIT_FRACTION = 0.25
"""Every wait on a snapshot on the recovery path (the copy in flight, the load onto the new mesh) is bounded
by this fraction of MaxText's ``elastic_timeout_seconds``: past it the snapshot counts as unavailable and the
checkpoint decides, with the rest of the attempt's time left for that."""
GROW_RETRY_STEPS = 10
"""Steps on the smaller mesh before a grow whose snapshot load failed is tried again."""
PERIODIC_POLL_SECONDS = 1.0
"""How often the hook re-reads the checkpoint directory while a periodic save of MaxText's is pending."""


def say(kind: str, fields: dict[str, object] | None = None) -> None:
    """One line on stderr, beside MaxText's own log: ``trainer_hooks.maxtext: KIND {json}``. One write with its
    newline: ``print`` writes the text and the end apart, so two threads' lines (a prepare's and the attempt's)
    could run into one."""
    sys.stderr.write(f"{LOG_PREFIX}: {kind} {json.dumps(fields or {}, default=str, sort_keys=True)}\n")
    sys.stderr.flush()


def settings_from_config(config: Any) -> ElasticSettings:
    """MaxText's own elastic flags, which the sidecar adopts."""
    return ElasticSettings(
        elastic_min_slice_count=int(config.elastic_min_slice_count),
        elastic_timeout_seconds=float(config.elastic_timeout_seconds),
        elastic_max_retries=int(config.elastic_max_retries),
    )


COLLECTIVE_FAILURE_MARKERS = ("Gloo", "UNAVAILABLE", "Connection closed", "Connection reset")
"""What a step's collective raises in a multi-controller job when a peer process is gone (gloo on the
CPU: ``ValueError: UNKNOWN: Gloo all-reduce failed: ... Connection closed by peer``)."""


def is_collective_failure(err: BaseException) -> bool:
    """A multi-controller step failed because a peer process is gone: exit 1 would fail the JobSet,
    so the sidecar decides (it aborts with 42)."""
    text = str(err)
    return any(m in text for m in COLLECTIVE_FAILURE_MARKERS)


def state_step(state: Any) -> int | None:
    """The completed steps MaxText's train state holds (``optimizer.step``, one scalar read), or None."""
    import jax

    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        key = jax.tree_util.keystr(path)
        if key.endswith("['optimizer']['step'].value") or key.endswith("['optimizer']['step']"):
            return int(x)
    return None


def process_identity() -> dict[str, Any]:
    """This process in a multi-controller job (jax.distributed initialised, several processes):
    its index, the count and the host, for the trainer link's hello; empty otherwise."""
    jax = sys.modules.get("jax")
    if jax is None:
        return {}
    try:
        count, index = int(jax.process_count()), int(jax.process_index())
    except Exception:  # noqa: BLE001 - no backend yet: a single process as far as the link goes
        return {}
    if count <= 1:
        return {}
    return {"process_index": index, "process_count": count, "host": socket.gethostname()}


class MaxTextHook:
    """Wraps one MaxText train module; one per process.

    ``connect`` builds the session (tests may pass their own).
    """

    def __init__(
        self,
        address: str,
        job: str = "",
        *,
        connect: Callable[..., ElasticSession] = ElasticSession.connect,
        snapshot_every: int | None = None,
        make_snapshotter: Callable[[int], Any] | None = None,
    ) -> None:
        """``snapshot_every``: as ``ELASTIC_SIDECAR_SNAPSHOT_EVERY`` (None: read it); ``make_snapshotter``:
        builds the Snapshotter for a replica axis index (None: Orbax's)."""
        self.address = address
        self.job = job
        self._connect = connect
        self.session: ElasticSession | None = None
        self.train: Any = None
        self.slices: tuple[int, ...] = ()
        """Slices the running mesh spans, as the sidecar last named them."""
        self.completed = -1
        """Steps completed in this process's newest train attempt (-1: none yet)."""
        self._rebuilding: tuple[Directive, float, str] | None = None
        """A directive MaxText is (re)building for, since when, and from where;
        acknowledged at the first step boundary of the new attempt."""
        self._config: Any = None
        self._device_state: dict[str, Any] | None = None
        self._python_vars: dict[str, Any] | None = None
        self.seam: ElasticSeam | None = None
        """The hold on pathwaysutils' manager, with ``elastic_enabled`` (see :mod:`.elastic_seam`)."""
        self._periodic_label: int | None = None
        """A periodic save MaxText started (its label) whose commit is not reported yet."""
        self._periodic_polled = 0.0
        self.interval = SnapshotInterval(snapshot_every_from_env() if snapshot_every is None else snapshot_every)
        """When to snapshot (``ELASTIC_SIDECAR_SNAPSHOT_EVERY``: a number, or ``auto`` by measurement)."""
        self.snapshots = Snapshots(make=make_snapshotter)
        """The process's Orbax Snapshotter and its newest snapshot (see :mod:`.snapshot`); it outlives attempts."""
        self._layout_warned = False
        self._attempt_start = 0
        """The step the current train attempt started from (nothing to snapshot there: it is what was restored)."""
        self._slot: tuple[float, bool, bool] | None = None
        """The step slot in progress: when it started (before any save call), whether a save was handed over
        at its start, and whether it counts for the interval's measurement."""
        self._restored: tuple[str, int] | None = None
        """Where this attempt's state came from (``snapshot``, ``checkpoint``, ``fresh``) and its step."""
        self._directive: Directive | None = None
        """The sidecar's newest resume, which the running mesh serves."""
        self._growing_from: frozenset[int] | None = None
        """The slices a grow kept as a snapshot left from (a failed load goes back to them)."""
        self._grow_retry_at: int | None = None
        """The step at which a grow whose load failed is tried again."""
        self._kept_in_memory: int | None = None
        """The step a drain's hold kept as a snapshot (:meth:`_keep_in_memory`): its shrink needs no flush."""
        self._argv: list[str] = []
        """MaxText's arguments as ``train.initialize`` last got them (a prepare builds its config from them)."""
        self._next_mesh: NextMeshCompiler | None = None
        """Compiles the next mesh's programs on a prepare, with ``elastic_enabled`` (:mod:`.prepare`)."""
        self._train_step_seam = False
        """Whether the attempt waits for the prepared train step where it jits it (:meth:`_wrap_train_step_jit`)."""
        self._own_seconds = 0.0
        self._own_steps = 0
        """The hook's own seconds at ordinary step boundaries (its bookkeeping, the pending-command test and
        the step report; not a save call, a hold or a rebuild), and over how many steps: ``finished`` reports
        the mean, a per-step cost that the snapshot interval's measurement cannot see (it is in every slot)."""

    # -- wiring ------------------------------------------------------------------

    def install(self, train: Any) -> MaxTextHook:
        """Wrap ``train.initialize`` and ``train.training_loop_iteration``."""
        if getattr(train, "_elastic_sidecar_hook", None) is not None:
            raise RuntimeError(f"{train.__name__} already has an elastic-sidecar hook installed")
        initialize, iteration = train.initialize, train.training_loop_iteration

        @functools.wraps(initialize)
        def wrapped_initialize(argv: Sequence[str]) -> tuple[Any, Any]:
            return self._initialize(initialize, argv)

        @functools.wraps(iteration)
        def wrapped_iteration(
            jax_device_state: dict[str, Any], python_vars: dict[str, Any], immutable_data: dict[str, Any]
        ) -> Any:
            return self._iteration(iteration, jax_device_state, python_vars, immutable_data)

        train.initialize = wrapped_initialize
        train.training_loop_iteration = wrapped_iteration
        train._elastic_sidecar_hook = self
        self.train = train
        return self

    def finished(self) -> None:
        """MaxText's train function returned: training is done."""
        if self.session is None:
            return
        if self._periodic_label is not None:
            from maxtext.common import checkpointing

            manager = (self._python_vars or {}).get("checkpoint_manager")
            try:
                if manager is not None:
                    checkpointing.wait_until_finished(manager)
                self._report_if_committed(self._periodic_label)
            except Exception as e:  # MaxText may have closed its manager; the commit is on disk anyway
                say("warning", {"message": f"cannot read MaxText's last periodic save: {type(e).__name__}: {e}"})
            self._periodic_label = None
        self.session.finished(max(self.completed, 0))
        self.session.close()
        say("finished", {"step": self.completed, **self.snapshot_counts()})

    def snapshot_counts(self) -> dict[str, object]:
        snaps, iv = self.snapshots, self.interval
        return {
            "snapshots": snaps.saved,
            "snapshots_skipped": snaps.skipped,
            "snapshots_failed": snaps.failed,
            "snapshot_every": "auto" if iv.auto else iv.every,
            "snapshot_every_now": iv.current,
            "snapshot_overhead_fraction": iv.last_fraction,
            "step_seconds_baseline": iv.baseline,
            "hook_seconds_per_step": self._own_seconds / self._own_steps if self._own_steps else None,
        }

    # -- MaxText's seams ---------------------------------------------------------------

    def _initialize(
        self, initialize: Callable[[Sequence[str]], tuple[Any, Any]], argv: Sequence[str]
    ) -> tuple[Any, Any]:
        config, recorder = initialize(argv)
        self._config = config
        self._argv = list(argv)
        if self.session is None:  # elastic_retry calls initialize again for every attempt
            self._start(config)
        elif self._next_mesh is not None:
            self._await_prepared(config)
        return config, recorder

    def _prepare_mesh(self, slices: tuple[int, ...]) -> Any:
        """The session's ``prepare`` hook: compile the programs for ``slices`` in the background (:mod:`.prepare`)."""
        assert self._next_mesh is not None
        return self._next_mesh(slices)

    def _await_prepared(self, config: Any) -> None:
        """A new attempt about to build its mesh waits for the prepare of that mesh still compiling its state
        initialiser, the first program the attempt compiles (at most MaxText's ``elastic_timeout_seconds``): its
        own jit would compile the same program alongside it. The train step's is waited for just before the
        attempt jits it (:meth:`_wrap_train_step_jit`), so that the attempt's setup and restore overlap it;
        without that seam, for the whole prepare here."""
        assert self._next_mesh is not None
        try:
            from maxtext.utils import elastic_utils

            slices = sorted(elastic_utils.live_slice_indices(config))
        except Exception as e:  # noqa: BLE001 - no wait then: the attempt compiles
            say("warning", {"message": f"cannot read the attempt's slices: {type(e).__name__}: {e}"[:300]})
            return
        program = "initial_state" if self._train_step_seam else None
        self._next_mesh.wait_for(slices, float(getattr(config, "elastic_timeout_seconds", 0) or 0), program)

    def _wrap_train_step_jit(self) -> bool:
        """Wrap ``train_utils.jit_train_and_eval_step`` (``train_loop`` builds its train step's jit with it, then
        lowers and compiles it): it first waits for the prepare of its mesh's slices still compiling the train
        step (at most ``elastic_timeout_seconds``). False where MaxText has no such function."""
        try:
            from maxtext.utils import train_utils
        except ImportError:
            return False
        jit = getattr(train_utils, "jit_train_and_eval_step", None)
        if jit is None:
            return False
        if getattr(jit, "_elastic_sidecar_hook", None) is self:
            return True

        @functools.wraps(jit)
        def jit_train_and_eval_step(config: Any, model: Any, mesh: Any, *args: Any, **kwargs: Any) -> Any:
            if self._next_mesh is not None:
                try:
                    slices = sorted({int(getattr(d, "slice_index", 0)) for d in mesh.devices.flat})
                except Exception:  # noqa: BLE001 - not a mesh of devices: nothing to wait for
                    slices = []
                timeout = float(getattr(config, "elastic_timeout_seconds", 0) or 0)
                if slices:
                    self._next_mesh.wait_for(slices, timeout, "train_step")
            return jit(config, model, mesh, *args, **kwargs)

        jit_train_and_eval_step._elastic_sidecar_hook = self  # type: ignore[attr-defined]
        train_utils.jit_train_and_eval_step = jit_train_and_eval_step
        return True

    def _start(self, config: Any) -> None:
        if self._elastic() and self.interval.every != 0:
            refused = snapshot_data_refusal(config)
            if refused is not None:
                say("refused", {"reason": refused})
                print(f"{LOG_PREFIX}: error: {refused}", file=sys.stderr, flush=True)
                raise SystemExit(EXIT_USAGE)
        settings = settings_from_config(config)
        if self._elastic():
            why = prepare_refusal(config)
            if why is None:
                self._next_mesh = NextMeshCompiler(lambda: self._argv, say)
                self._train_step_seam = self._wrap_train_step_jit()
            else:
                say("prepare_off", {"why": why})
        self.snapshots.wait_seconds = RECOVERY_WAIT_FRACTION * settings.elastic_timeout_seconds
        self.session = self._connect(
            self.address,
            job=self.job,
            total_steps=int(config.steps),
            settings=settings,
            flush=self.flush,
            snapshot=self._keep_in_memory,
            prepare=self._prepare_mesh if self._next_mesh is not None else None,
            on_event=say,
            **process_identity(),
        )
        say(
            "connecting",
            {"address": self.address, "job": self.job, "settings": vars(settings), "elastic": self._elastic()},
        )
        if not getattr(config, "enable_checkpointing", True):
            say("warning", {"message": "enable_checkpointing=false: holds and aborts cannot flush"})
        if self._elastic():
            self.seam = ElasticSeam(self._ask_sidecar, on_grow=self._maxtext_grew)
            self.seam.install(config)
            self.snapshots.slices_of = self.seam.mesh_slices
            self._wrap_restore()
        try:
            d = self.session.start(step_in_memory=-1)
        except AbortTraining as e:
            self._exit(e)
        say("start", {"generation": d.generation, "slices": list(d.active_slices), "reason": d.reason})
        if self.seam is not None:
            self.seam.allow(d.active_slices)
        self._rebuilding = (d, time.monotonic(), "")

    def _iteration(
        self,
        iteration: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], Any],
        jax_device_state: dict[str, Any],
        python_vars: dict[str, Any],
        immutable_data: dict[str, Any],
    ) -> Any:
        session = self.session
        assert session is not None, "MaxText's initialize did not run through the hook"
        entered = time.monotonic()
        step = int(python_vars["step"])
        self._device_state, self._python_vars = jax_device_state, python_vars
        self._config = immutable_data["config"]
        ordinary = self._rebuilding is None
        if self._rebuilding is not None:
            self._resumed(step)
            self._new_attempt(step, jax_device_state)
        elif self._slot is not None:
            started, saved, counted = self._slot
            iv = self.interval
            if iv.baseline and self._own_steps:
                iv.fixed = self._own_seconds / self._own_steps / iv.baseline  # snapshots get the rest of the budget
            self._interval_changed(self.interval.slot(entered - started, saved=saved, counted=counted), "measured")
        self._slot = None
        try:
            d = session.step_boundary(step)
        except AbortTraining as e:
            self._exit(e)
        if d is not None:
            self._apply(d, step)
        elif self._grow_retry_at is not None and step >= self._grow_retry_at and self._directive is not None:
            self._grow_retry_at = None
            if set(self._directive.active_slices) > set(self.slices):
                say("grow_retry", {"step": step, "slices": sorted(self._directive.active_slices)})
                self._apply(self._directive, step)
        started = time.monotonic()
        # The hook's own time at this boundary (not a rebuild's or a hold's, which are not per-step costs).
        own = started - entered if ordinary and d is None else None
        saved = self._maybe_snapshot(step, jax_device_state, python_vars)
        t0 = time.monotonic()
        try:
            metrics = iteration(jax_device_state, python_vars, immutable_data)
        except Exception as e:
            if is_scale_up_signal(e):
                self._maxtext_scale_up(step, e)  # never returns: elastic_retry grows
            if is_slice_down(e) or (session.process_count > 1 and is_collective_failure(e)):
                self._slice_error(step, e)  # never returns: elastic_retry takes over, or exit 42
            raise
        after = time.monotonic()
        self.completed = step + 1
        session.report_step(step + 1, after - t0)
        periodic = self._on_save_schedule(step)
        if self._periodic_label is not None or periodic:
            self._periodic_commit(step)
        self._slot = (started, saved, not periodic)
        if own is not None:
            self._own_seconds += own + (time.monotonic() - after)
            self._own_steps += 1
        return metrics

    # -- snapshots -------------------------------------------------------------------

    def _interval_changed(self, every: int | None, why: str) -> None:
        if every is None:
            return
        iv = self.interval
        say(
            "snapshot_every",
            {
                "every": every,
                "why": why,
                "overhead_fraction": iv.last_fraction,
                "step_seconds_baseline": iv.baseline,
                "budget": iv.snapshot_budget,
                "hook_fraction": iv.fixed,
            },
        )

    def _new_attempt(self, step: int, jax_device_state: dict[str, Any]) -> None:
        """The first boundary of a train attempt: where this mesh keeps its replicas, and measure anew."""
        self._attempt_start = step
        self.interval.new_attempt()
        # MaxText's periodic checkpoints bound a crash's loss too: auto stops snapshotting when the interval
        # it needs reaches their period (trainer_hooks.maxtext.interval).
        self.interval.ceiling = self._checkpoint_period()
        layout = self._snapshot_layout(jax_device_state)
        if layout.usable:
            self._refuse_unkept_data((self._python_vars or {}).get("data_iterator"))
        self.snapshots.configure(layout)
        state = jax_device_state.get("state")
        fields = layout.fields() | {"bytes_per_replica": nbytes_per_replica(state) if state is not None else 0}
        say("snapshot_layout", fields)
        if not layout.usable and not self._layout_warned and self.interval.every != 0:
            self._layout_warned = True
            say(
                "warning",
                {"message": f"in-memory snapshots off: {layout.why}; a lost slice restores the newest checkpoint"},
            )

    def _refuse_unkept_data(self, data_iterator: Any) -> None:
        """Exit 2 before a snapshot is taken when this attempt's data iterator has a position that a
        snapshot cannot keep (a data set other than MaxText's synthetic one, not read through grain's
        ``get_state``, e.g. tfds): a restore would replay it. The flags known at start are refused
        there (:func:`snapshot_data_refusal`); this catches the iterators MaxText builds otherwise."""
        config = self._config
        dataset = dataset_type(config)
        if dataset == "synthetic" or data_iterator is None or local_iterator(data_iterator) is not None:
            return
        reason = (
            f"dataset_type={dataset}: in-memory snapshots cannot keep the position of MaxText's data iterator "
            f"({type(data_iterator).__name__}, no grain get_state); use dataset_type=grain, or set "
            f"{ENV_SNAPSHOT_EVERY}=0 (a lost slice then restores MaxText's newest checkpoint)"
        )
        say("refused", {"reason": reason})
        self._exit(AbortTraining(EXIT_USAGE, reason, self.session.committed_step if self.session else -1))

    def _snapshot_layout(self, jax_device_state: dict[str, Any]) -> Layout:
        if self.interval.every == 0:
            return Layout(False, f"{ENV_SNAPSHOT_EVERY}=0")
        if self.seam is None:
            return Layout(
                False,
                "without elastic_enabled a lost slice ends the process, and the snapshots in its hosts' memory "
                "with it: checkpoints only",
            )
        if self.session is not None and self.session.process_count > 1:
            return Layout(False, "multi-controller JAX: each process restarts on a lost host; checkpoints only")
        mesh, state = jax_device_state.get("mesh"), jax_device_state.get("state")
        if mesh is None or state is None:
            return Layout(False, "MaxText's jax_device_state has no mesh or state")
        try:
            return state_layout(mesh, state, self.seam.slice_map())
        except Exception as e:  # a layout we cannot read: checkpoints still work
            return Layout(False, f"cannot read the mesh's slices: {type(e).__name__}: {e}")

    def _maybe_snapshot(self, step: int, jax_device_state: dict[str, Any], python_vars: dict[str, Any]) -> bool:
        """Hand the state after ``step`` completed steps to the Snapshotter when one is due (before the step
        consumes it). Returns whether a save was handed over (a save still copying makes this one skip).

        A failure never turns snapshots off: it is reported, the previous snapshot stays, and the next due
        step tries again. A slice-loss error here (the state's devices are gone) takes the slice-error path,
        as the step itself would a moment later.
        """
        snaps = self.snapshots
        if not snaps.usable:
            return False
        failed = snaps.check_pending()
        if failed is not None:
            say(
                "snapshot_failed",
                {"step": failed, "error": "the copy to pinned host memory failed (Orbax logged why)", "kept": True},
            )
        if step <= self._attempt_start or not self.interval.due(step):
            return False
        state = jax_device_state.get("state")
        if state is None:
            return False
        try:
            saved = snaps.save(step, state, data_position(python_vars.get("data_iterator")))
            if not saved:
                self._interval_changed(self.interval.skipped(), "a due save was skipped: the previous copy still ran")
            return saved
        except Exception as e:
            snaps.failed += 1
            say("snapshot_failed", {"step": step, "error": f"{type(e).__name__}: {e}"[:300], "kept": True})
            if is_slice_down(e):
                self._slice_error(step, e)
            return False

    def _wrap_restore(self) -> None:
        """Wrap ``checkpointing.load_state_if_possible``, where each attempt's
        ``maxtext_utils.setup_training_state`` gets its state (see :meth:`_restore`)."""
        from maxtext.common import checkpointing

        load = checkpointing.load_state_if_possible
        if getattr(load, "_elastic_sidecar_hook", None) is self:
            return
        signature = inspect.signature(load)

        @functools.wraps(load)
        def load_state_if_possible(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return self._restore(load, args, kwargs, bound.arguments)

        load_state_if_possible._elastic_sidecar_hook = self  # type: ignore[attr-defined]
        checkpointing.load_state_if_possible = load_state_if_possible

    def _restore(self, load: Callable[..., Any], args: Any, kwargs: Any, named: dict[str, Any]) -> Any:
        """The restore ladder: the newest complete snapshot when it is at least as new as the newest
        committed checkpoint, else MaxText's own restore of that checkpoint (never an older step).

        The snapshot is loaded onto the shardings of the abstract state MaxText passes (the new
        mesh's), and the data iterator is set back to the position saved with it. Returns what
        ``load_state_if_possible`` returns for this manager kind (:func:`restore_result`).
        """
        manager = named.get("checkpoint_manager")
        abstract = named.get("abstract_unboxed_pre_state")
        data_iterator = named.get("data_iterator")
        committed = max(self._newest_committed(manager), 0) if manager is not None else 0
        snaps = self.snapshots
        t0 = time.monotonic()
        snap_step: int | None = None
        try:
            snap_step = snaps.newest_step()
            waited = ""
        except SnapshotUnavailable as e:  # a copy that never resolves (a dead host): the checkpoint decides
            waited = f"the snapshot is unavailable: {e}"
        if snaps.snapshotter is None:
            why = "no snapshot in this process" + (f" ({snaps.layout.why})" if snaps.layout is not None else "")
        elif waited:
            why = waited
            self._grow_failed(max(self.completed, 0), why)
        else:
            if snap_step is None:
                why = "no complete snapshot"
            elif snap_step < committed:
                why = f"the newest snapshot (step {snap_step}) is older than the newest committed checkpoint"
                try:
                    snaps.forget()
                except SnapshotUnavailable as e:
                    say("warning", {"message": f"the older snapshot stays in memory: {e}"})
            else:
                try:
                    r = snaps.load(abstract)
                    held = state_step(r.state)
                    if held is not None and held != r.step:
                        raise RuntimeError(f"the loaded state holds step {held}, the snapshot says {r.step}")
                    data = "restored" if set_data_position(data_iterator, r.data) else "none"
                except Exception as e:  # the checkpoint is the next rung, except on a grow
                    why = f"loading the snapshot of step {snap_step} failed: {type(e).__name__}: {e}"[:500]
                    self._grow_failed(snap_step, why)
                else:
                    self._restored = ("snapshot", r.step)
                    self._growing_from = None
                    say(
                        "restored",
                        {
                            "source": "snapshot",
                            "step": r.step,
                            "snapshot_step": r.step,
                            "committed_step": committed,
                            "data": data,
                            "dropped_lost_replicas": snaps.dropped,
                            "seconds": round(time.monotonic() - t0, 3),
                            "why": f"the newest snapshot (step {r.step}) is at least as new as the newest "
                            f"committed checkpoint (step {committed})",
                        },
                    )
                    return restore_result(manager, r.state)
        result = load(*args, **kwargs)
        restored = isinstance(result, tuple) and any(x is not None for x in result)
        source, step = ("checkpoint", committed) if restored else ("fresh", 0)
        self._restored = (source, step)
        say(
            "restored",
            {
                "source": source,
                "step": step,
                "snapshot_step": snap_step,
                "committed_step": committed,
                "data": "checkpoint" if restored else "start",
                "seconds": round(time.monotonic() - t0, 3),
                "why": why,
            },
        )
        return result

    def _grow_failed(self, step: int, why: str) -> None:
        """A grow kept its boundary as a snapshot and loading it onto the larger mesh failed: the job was
        healthy on the smaller mesh, so it goes back there (a decided ``DATA_LOSS`` for ``elastic_retry``,
        whose next attempt loads the same snapshot onto the mesh it was taken from) instead of rewinding to
        a checkpoint; the grow is tried again ``GROW_RETRY_STEPS`` steps later (:meth:`_iteration`)."""
        prev, self._growing_from = self._growing_from, None
        if prev is None or self.seam is None:
            return
        self._grow_retry_at = step + GROW_RETRY_STEPS
        self.seam.allow(prev)
        say("grow_failed", {"step": step, "back_to": sorted(prev), "retry_at": self._grow_retry_at, "why": why})
        self._release_attempt()
        raise self.seam.decided(self._slice_down_error(f"grow failed, back to slices {sorted(prev)}: {why}"))

    def _maxtext_scale_up(self, step: int, err: BaseException) -> NoReturn:
        """MaxText's own ``maybe_elastic_scale_up`` raised ``ScaleUpSignalError`` at the top of the step,
        before it consumed the state: keep that state (a snapshot now, waited for, or a flush without
        snapshots), then let ``elastic_retry`` grow. A grow, never a failure: nothing goes to the sidecar
        as a slice error and no retry is spent (:meth:`ElasticSeam.retry_policy`)."""
        assert self.session is not None
        t0 = time.monotonic()
        kept = self._keep_for_restart(step)
        say("restart", {"how": "elastic_retry", "why": f"MaxText's scale-up signal at step {step}", "kept": kept})
        self._maxtext_grew(err, since=t0)
        raise err

    def _keep_for_restart(self, step: int) -> str:
        """Keep the intact state after ``step`` steps for the next attempt: a snapshot (waited for: the
        attempt is ending anyway) where the layout allows, else a flush to a checkpoint."""
        assert self.session is not None
        snaps = self.snapshots
        state = (self._device_state or {}).get("state")
        if snaps.usable and state is not None:
            try:
                snaps.join()
                snaps.save(step, state, data_position((self._python_vars or {}).get("data_iterator")))
                if snaps.newest_step() == step:
                    return f"snapshot of step {step}"
            except Exception as e:
                say("snapshot_failed", {"step": step, "error": f"{type(e).__name__}: {e}"[:300], "kept": True})
        committed = self.session.flush(step)
        return f"checkpoint of step {committed}"

    def _keep_in_memory(self, step: int, leaving: frozenset[int]) -> str:
        """The session's snapshot hook, for a drain whose state stays on the slices that remain: make the newest
        snapshot the held step's (with the data position), so the next attempt on those slices restores it from
        their hosts' memory and nothing is written to storage. "" once kept; else why not (then a flush)."""
        self._kept_in_memory = None
        if self.seam is None:
            return "without elastic_enabled the process restarts (exit 42), and its memory with it"
        if not any(s not in leaving for s in self.slices):
            return "no slice of the mesh remains"
        state = (self._device_state or {}).get("state")
        if state is None:
            return "no train state at this boundary"
        data = data_position((self._python_vars or {}).get("data_iterator"))
        why = self.snapshots.ensure(step, state, data)
        if not why:
            self._kept_in_memory = step
            say("kept_in_memory", {"step": step, "leaving": sorted(leaving)})
        return why

    def _maxtext_grew(self, err: BaseException, since: float | None = None) -> None:
        """The seam's word that ``elastic_retry`` retries a ``ScaleUpSignalError`` (MaxText's or the hook's):
        the next attempt acknowledges the mesh it builds for the newest resume."""
        if self._rebuilding is None and self._directive is not None:
            self._rebuilding = (self._directive, time.monotonic() if since is None else since, "")
        self._release_attempt()

    def _release_attempt(self) -> None:
        """Drop this attempt's device state before the next attempt builds its own (pathwaysutils: a
        reference kept across attempts keeps its device memory allocated), and its Python side: MaxText's
        ``python_vars`` hold the old data loader (its last batch), metric buffers and the checkpoint manager;
        the next attempt's first boundary hands over its own."""
        self._device_state = None
        self._python_vars = None
        self._slot = None

    # -- directives ------------------------------------------------------------------

    def _resumed(self, step: int) -> None:
        """The first step boundary of a new train attempt: the mesh for the directive runs."""
        assert self.session is not None and self._rebuilding is not None
        d, since, restored_from = self._rebuilding
        self._rebuilding = None
        self._directive = d
        if self._restored is not None:
            restored_from = self._restored[0]
            self._restored = None
        restored_from = restored_from or ("checkpoint" if step > 0 else "fresh")
        built = self._mesh_slices()
        self.slices = tuple(sorted(d.active_slices if built is None else built))
        self.completed = step
        dt = time.monotonic() - since
        self.session.resumed(d, step, restored_from, dt, active_slices=self.slices)
        fields: dict[str, object] = {
            "generation": d.generation,
            "step": step,
            "slices": list(self.slices),
            "decided": sorted(d.active_slices),
            "restored_from": restored_from,
            "rebuild_seconds": round(dt, 3),
        }
        if self.seam is not None:
            fields["retry_budget"] = {
                "decided_attempts": self.seam.decided_attempts,
                "reported_failures": self.seam.reported_failures,
            }
        say("resumed", fields)
        if set(self.slices) != set(d.active_slices):
            say("mesh_mismatch", {"decided": sorted(d.active_slices), "mesh": list(self.slices)})

    def _mesh_slices(self) -> tuple[int, ...] | None:
        """The slices of the mesh MaxText built (None: not known, e.g. without elastic_enabled)."""
        mesh = (self._device_state or {}).get("mesh")
        if self.seam is None or mesh is None:
            return None
        try:
            return tuple(sorted(self.seam.mesh_slices(mesh.devices.flat)))
        except Exception as e:  # a mesh we cannot map: report the decision, and say so
            say("warning", {"message": f"cannot map the mesh's devices to slices: {e}"})
            return None

    def _apply(self, d: Directive, step: int) -> None:
        """After a hold: go on from memory, or rebuild through a restart."""
        assert self.session is not None
        new = tuple(sorted(d.active_slices))
        if set(new) == set(self.slices):
            self._directive = d
            self.session.resumed(d, step, "memory", 0.0)
            say("resumed", {"generation": d.generation, "step": step, "slices": list(new), "restored_from": "memory"})
            return
        t0 = time.monotonic()
        why = f"slices {list(self.slices)} -> {list(new)} at step {step} (generation {d.generation})"
        grow = set(new) > set(self.slices)
        self._restart(d, step, t0, why, self._scale_up_error(why) if grow else self._slice_down_error(why), grow)

    def _slice_error(self, step: int, err: BaseException) -> NoReturn:
        """A step failed with lost hardware: tell the sidecar which slices, wait for its word, restart."""
        assert self.session is not None
        t0 = time.monotonic()
        lost = self.lost_slices(err)
        self.snapshots.mark_lost(lost)
        try:
            d = self.session.slice_error(step, err, lost)
        except AbortTraining as e:
            self._exit(e)
        # The failed step consumed (donated) the state: the flush says so, and the next attempt
        # restores the newest complete snapshot from the surviving replicas, or the newest
        # committed checkpoint (see _restore).
        self._restart(d, step, t0, f"slice loss at step {step} (lost slices {sorted(lost)})", err)

    def lost_slices(self, err: BaseException) -> set[int]:
        """The slices a slice-loss error names, plus those of the running mesh the health check finds down."""
        named = slices_named_in(str(err))
        probed: set[int] = set()
        if self.seam is not None and self.slices:
            try:
                probed = self.seam.unhealthy(self.slices)
            except Exception as e:  # the probe is a hint; the error itself already went to the sidecar
                say("warning", {"message": f"slice health probe failed: {type(e).__name__}: {e}"})
        return named | probed

    def _ask_sidecar(self, err: BaseException) -> None:
        """pathwaysutils' retry policy met a slice-loss error raised outside a step: the sidecar decides."""
        assert self.session is not None
        t0 = time.monotonic()
        step = max(self.completed, 0)
        lost = self.lost_slices(err)
        self.snapshots.mark_lost(lost)
        say("slice_error_outside_step", {"step": step, "slices": sorted(lost), "error": str(err)[:200]})
        try:
            d = self.session.slice_error(step, err, lost)
        except AbortTraining as e:
            self._exit(e)
        if self.seam is not None:
            self.seam.allow(d.active_slices)
        self._rebuilding = (d, t0, "")
        self._release_attempt()

    def _restart(
        self, d: Directive, step: int, since: float, why: str, err: BaseException, grow: bool = False
    ) -> NoReturn:
        """Keep the state after ``step`` steps, then hand over to elastic_retry (raise ``err``, as decided)
        or exit 42.

        A grow under elastic_retry keeps it as a snapshot where the layout allows
        (:meth:`_keep_for_restart`, as for MaxText's own scale-up signal): every slice of the running
        mesh is alive, so every replica is readable, and the next attempt loads the state onto the
        grown mesh from the hosts' memory instead of writing a checkpoint to storage and reading it
        back (on a real model, the checkpoint's round trip through storage is the longer one). A drain
        whose hold kept the step as a snapshot (:meth:`_keep_in_memory`) restores it the same way. Anything
        else flushes: after a slice loss or a shrink a replica may be unreadable (the flush says what
        it could not save), and exit 42 ends the process, its snapshots with it."""
        assert self.session is not None
        drained, self._kept_in_memory = self._kept_in_memory == step, None
        if self.seam is not None and grow:
            kept: dict[str, object] = {"kept": self._keep_for_restart(step)}
            if str(kept["kept"]).startswith("snapshot"):
                self._growing_from = frozenset(self.slices)
        elif self.seam is not None and drained:
            # A drain's hold kept this step as a snapshot while every slice was up: the slices that
            # remain hold it, so the shrink restores it from memory and writes nothing to storage.
            kept = {"kept": f"snapshot of step {step}"}
        else:
            kept = {"committed_step": self.session.flush(step)}
        if self.seam is not None:
            self.seam.allow(d.active_slices)
            self._rebuilding = (d, since, "")
            say("restart", {"how": "elastic_retry", "why": why, **kept})
            self._release_attempt()
            raise self.seam.decided(err)
        say("restart", {"how": f"exit {EXIT_RESTART}", "why": why, **kept})
        self.session.close()
        raise SystemExit(EXIT_RESTART)

    def terminal(self, reason: str) -> NoReturn:
        """An elastic failure ended MaxText's train function: say why and exit 42 (never 1)."""
        committed = self.session.committed_step if self.session is not None else -1
        self._exit(AbortTraining(EXIT_RESTART, reason, committed))

    def _exit(self, e: AbortTraining) -> NoReturn:
        say("abort", {"exit_code": e.exit_code, "reason": e.reason, "committed_step": e.committed_step})
        if self.session is not None:
            self.session.close()
        raise SystemExit(e.exit_code)

    # -- flushing --------------------------------------------------------------------

    def flush(self, step: int, down_slices: frozenset[int] = frozenset()) -> FlushResult:
        """The session's flusher: make the state after ``step`` completed steps durable.

        It refuses, with an error that the acknowledgement carries as
        ``flush_error`` (the step is then not counted as committed), when the
        state after ``step`` is gone (a failed step consumed it: MaxText donates
        its train state into the step) or has shards on a slice in
        ``down_slices`` that is really down (with ``elastic_enabled``,
        pathwaysutils' health check tells; a drained slice in good health is
        read as usual): MaxText saves its global arrays, and reading them from
        the surviving replicas alone is not something MaxText's checkpointer
        can do, so the hold reports the newest committed step instead.
        """
        from maxtext.common import checkpointing

        from trainer_hooks.orbax_flush import tree_nbytes

        python_vars = self._python_vars or {}
        manager = python_vars.get("checkpoint_manager")
        if manager is None:
            raise RuntimeError("MaxText runs without a checkpoint manager (enable_checkpointing=false): cannot flush")
        checkpointing.wait_until_finished(manager)  # an in-flight periodic save first
        label = step - 1
        if step <= 0 or label in self._committed_labels(manager):
            return FlushResult(self._newest_committed(manager) if step <= 0 else step, 0)
        assert self._device_state is not None
        state = self._device_state["state"]
        try:
            self._check_readable(state, step, down_slices)
        except RuntimeError as unreadable:
            snap = self.snapshots.latest_step() if self.snapshots.usable else None
            plan = (
                f"the next attempt restores the in-memory snapshot of step {snap} from the surviving replicas"
                if snap is not None
                else "no in-memory snapshot: the restart restores the newest committed checkpoint"
            )
            raise RuntimeError(f"{unreadable}; {plan}") from unreadable
        t0 = time.monotonic()
        checkpointing.save_checkpoint(manager, label, state, self._config, python_vars.get("data_iterator"), force=True)
        checkpointing.wait_until_finished(manager)
        labels = self._committed_labels(manager)
        if label not in labels:
            raise RuntimeError(f"MaxText's checkpoint manager did not commit step {label}; it lists {labels}")
        nbytes = tree_nbytes(state)
        say("flushed", {"step": step, "label": label, "seconds": round(time.monotonic() - t0, 3), "bytes": nbytes})
        return FlushResult(step, nbytes)

    def _check_readable(self, state: Any, step: int, down_slices: frozenset[int]) -> None:
        import jax

        leaves = [x for x in jax.tree_util.tree_leaves(state) if hasattr(x, "is_deleted")]
        if any(x.is_deleted() for x in leaves):
            raise RuntimeError(
                f"the state after step {step} was consumed by the step that failed "
                "(MaxText donates its train state into the step): nothing to flush"
            )
        if not down_slices or self.seam is None:
            # Without elastic_enabled there is no health check to tell a drained slice in good
            # health from a lost one; a save that cannot read a lost slice fails in Orbax and
            # the acknowledgement carries that error.
            return
        devices = {d for x in leaves for d in x.sharding.device_set}
        lost = sorted(self.seam.mesh_slices(devices) & down_slices)
        if lost:
            # down_slices also names slices leaving in good health (a drain): only those the
            # health check finds down are unreadable.
            try:
                lost = sorted(self.seam.unhealthy(lost))
            except Exception as e:
                say("warning", {"message": f"slice health probe failed, treating {lost} as lost: {e}"})
        if lost:
            self.snapshots.mark_lost(lost)  # their snapshot replicas are gone with them
            raise RuntimeError(
                f"the state after step {step} has shards on lost slice(s) {lost}; MaxText's checkpointer "
                "reads its global arrays whole and cannot save from the surviving replicas alone: not flushed"
            )

    # -- MaxText's own periodic checkpoints ----------------------------------------------

    def _checkpoint_period(self) -> int:
        """MaxText's ``checkpoint_period`` when it saves periodically (``enable_checkpointing``), else 0."""
        c = self._config
        period = int(getattr(c, "checkpoint_period", 0) or 0)
        return period if getattr(c, "enable_checkpointing", False) and period > 0 else 0

    def _on_save_schedule(self, step: int) -> bool:
        """Whether MaxText's ``maybe_save_checkpoint`` starts a periodic save after step index ``step``."""
        period = self._checkpoint_period()
        if not period or step % period:
            return False
        return step > 0 or bool(getattr(self._config, "save_checkpoint_on_start", False))

    def _periodic_commit(self, step: int) -> None:
        """Report MaxText's own periodic checkpoint once it commits (a FlushedAck, no flush of ours).

        A save MaxText starts after step index ``step`` (on its schedule) is
        pending until the manager lists it after re-reading its directory: the
        listing is read at most every ``PERIODIC_POLL_SECONDS`` while one is
        pending (Orbax's ``is_saving_in_progress`` stays true until someone
        waits, so it cannot tell), when the next periodic save starts (Orbax
        runs one save at a time, so the previous one has finished) and when
        training finishes.
        """
        if self._on_save_schedule(step):
            if self._periodic_label is not None:
                self._report_if_committed(self._periodic_label)
            self._periodic_label, self._periodic_polled = step, time.monotonic()
            return
        label = self._periodic_label
        now = time.monotonic()
        if label is None or now - self._periodic_polled < PERIODIC_POLL_SECONDS:
            return
        self._periodic_polled = now
        if self._report_if_committed(label):
            self._periodic_label = None

    def _report_if_committed(self, label: int) -> bool:
        assert self.session is not None
        manager = (self._python_vars or {}).get("checkpoint_manager")
        if manager is None:
            return True
        if label + 1 <= self.session.committed_step:
            return True
        if label not in self._committed_labels(manager):
            return False
        self.session.committed(label + 1)
        say("committed", {"step": label + 1, "label": label, "by": "maxtext_periodic_checkpoint"})
        return True

    @staticmethod
    def _committed_labels(manager: Any) -> list[int]:
        """Labels the manager lists after re-reading its directory."""
        from maxtext.common import checkpointing

        reload = getattr(manager, "reload", None)
        if reload is not None:
            reload()
        return sorted(int(s) for s in checkpointing.all_steps(manager))

    def _newest_committed(self, manager: Any) -> int:
        labels = self._committed_labels(manager)
        return labels[-1] + 1 if labels else -1

    # -- MaxText and pathwaysutils, imported only when running ----------------------------

    def _elastic(self) -> bool:
        """MaxText's own test: ``elastic_enabled`` on the Pathways backend."""
        if self._config is None:
            return False
        from maxtext.utils import elastic_utils

        return bool(elastic_utils.elastic_enabled(self._config))

    @staticmethod
    def _scale_up_error(why: str) -> BaseException:
        from pathwaysutils.elastic import manager

        return manager.ScaleUpSignalError(f"elastic-sidecar: grow, {why}")

    @staticmethod
    def _slice_down_error(why: str) -> BaseException:
        import jax

        return jax.errors.JaxRuntimeError(f"DATA_LOSS: elastic-sidecar: shrink, {why}")


def dataset_type(config: Any) -> str:
    """MaxText's ``dataset_type`` as its plain value: 0.2.5's config holds a ``DatasetType`` str enum,
    whose ``str()`` is ``DatasetType.SYNTHETIC`` (``configs/types.py``), not ``synthetic``."""
    value = getattr(config, "dataset_type", "synthetic")
    return str(getattr(value, "value", value)).lower()


def snapshot_data_refusal(config: Any) -> str | None:
    """Why in-memory snapshots would replay data on this MaxText configuration (None: they would not).

    A snapshot keeps the data position only of what :func:`.snapshot.data_position` can read: grain's
    iterator inside MaxText's ``MultiHostDataLoadIterator`` (``get_state``/``set_state``), and nothing
    for synthetic data (every batch alike). MaxText 0.2.5 builds other iterators on these flags
    (``input_pipeline/grain_data_processing.py`` ``make_grain_train_iterator``, ``tfds_data_processing.py``,
    ``common/data_loader.py``):

    * ``colocated_python_data_input=true``: a ``RemoteIteratorWrapper`` whose position lives in the
      colocated process and is saved only to files by step (``save_state(step)``), not read back here;
    * ``0 < expansion_factor_real_data < 1``: a list of iterators that MaxText's ``DataLoader`` takes
      in turn, its turn index held in the loader;
    * ``enable_rampup_batch_size=true``: ``RampUpDataLoader`` slices batches from a buffer of a
      fetched batch, which no iterator position holds.

    A restore from a snapshot would then start the data again (or mid-buffer): refused, with what
    to change, rather than replayed silently. MaxText's own checkpoints keep these positions, so
    ``ELASTIC_SIDECAR_SNAPSHOT_EVERY=0`` (restores from checkpoints only) is always a way out.
    """
    if dataset_type(config) == "synthetic":
        return None
    off = f"or set {ENV_SNAPSHOT_EVERY}=0 (a lost slice then restores MaxText's newest checkpoint, which keeps it)"
    why = "in-memory snapshots cannot keep the data position of"
    if getattr(config, "colocated_python_data_input", False):
        return (
            f"colocated_python_data_input=true: {why} MaxText's RemoteIteratorWrapper (it lives in the colocated "
            f"Python process); set colocated_python_data_input=false, {off}"
        )
    factor = float(getattr(config, "expansion_factor_real_data", -1) or -1)
    if 0 < factor < 1:
        return (
            f"expansion_factor_real_data={factor:g}: {why} the list of data iterators MaxText builds for a factor "
            f"below 1 (and its DataLoader's turn among them); set expansion_factor_real_data to -1 or a whole "
            f"number >= 1, {off}"
        )
    if getattr(config, "enable_rampup_batch_size", False):
        return (
            f"enable_rampup_batch_size=true: {why} MaxText's RampUpDataLoader (part of a fetched batch waits in "
            f"its buffer); set enable_rampup_batch_size=false, {off}"
        )
    return None


def bare_state_managers() -> tuple[type, ...]:
    """The checkpoint manager kinds whose restore MaxText hands back as the bare state.

    MaxText 0.2.5 decides by one ``isinstance`` test in both places that touch the
    shape: ``checkpointing.load_state_if_possible`` (case 1: ``EmergencyCheckpointManager``
    or ``EmergencyReplicatorCheckpointManager`` returns ``(restored, None)``, the v1
    ``Checkpointer`` ``({"items": ...}, None)``) and ``maxtext_utils.setup_training_state``
    (``overlay = restored if is_emergency else restored["items"]``, the same two Orbax
    classes: emergency ``CheckpointManager`` for ``enable_emergency_checkpoint``, the
    replicator's for ``enable_multi_tier_checkpointing``). The hook reads the names from
    MaxText's own module, so the test is the one MaxText makes.
    """
    from maxtext.common import checkpointing

    names = ("EmergencyCheckpointManager", "EmergencyReplicatorCheckpointManager")
    return tuple(t for t in (getattr(checkpointing, n, None) for n in names) if isinstance(t, type))


def restore_result(manager: Any, state: Any) -> tuple[Any, None]:
    """What MaxText's ``load_state_if_possible`` returns for a full state restored for ``manager``:
    the bare state for the emergency and multi-tier (replicator) managers, ``{"items": state}`` for
    the plain Orbax v1 ``Checkpointer`` (see :func:`bare_state_managers`)."""
    bare = bare_state_managers()
    if bare and isinstance(manager, bare):
        return state, None
    return {"items": state}, None


def terminal_elastic_failure(err: BaseException) -> str | None:
    """Why an error that escaped MaxText ends an elastic job (None: a bug, which keeps its exit 1).

    pathwaysutils' ``ElasticRuntimeError`` (attempts used up: cannot happen with
    the hook's retry policy, kept for safety), the ``TimeoutError`` of
    ``wait_for_slices`` (not enough slices within ``elastic_timeout_seconds``)
    and a slice-loss error nobody retried are failures of the hardware, not of
    the program: a restart (42) is the answer, never a permanent failure (1).
    """
    name = type(err).__name__
    if name == "ElasticRuntimeError" or is_slice_down(err):
        cause = err.__cause__ or err.__context__
        return f"{name}: {err}" + (f" (after {type(cause).__name__}: {str(cause)[:300]})" if cause else "")
    if isinstance(err, TimeoutError) and "slices" in str(err):
        return f"{name}: {err}"
    return None


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """``python -m trainer_hooks.maxtext <MaxText arguments>``: MaxText's pre-training, served.

    The arguments are exactly what ``python -m maxtext.trainers.pre_train.train``
    takes (an optional config ``.yml`` first, then ``key=value`` overrides).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    address = os.environ.get(ENV_ADDRESS, "").strip()
    if not address:
        print(
            f"{LOG_PREFIX}: warning: {ENV_ADDRESS} is not set; running MaxText without the elastic sidecar",
            file=sys.stderr,
            flush=True,
        )
    hook = None
    if address:
        try:
            every = snapshot_every_from_env()
        except ValueError as e:
            print(f"{LOG_PREFIX}: error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_USAGE) from None
        from trainer_hooks.maxtext.compat import check_at_start

        check_at_start(say, LOG_PREFIX)  # exits 2 naming what is outside the verified window
    train = importlib.import_module(TRAIN_MODULE)
    if address:
        hook = MaxTextHook(address, os.environ.get(ENV_JOB, ""), snapshot_every=every).install(train)

    def run(absl_argv: list[str]) -> None:
        try:
            train.main(absl_argv)
        except Exception as e:
            terminal = terminal_elastic_failure(e)
            if hook is None or terminal is None:
                raise
            hook.terminal(terminal)
        if hook is not None:
            hook.finished()

    from absl import app

    # argv[0] names MaxText's train module, so MaxText picks its default config for it.
    app.run(run, argv=[str(train.__file__), *args])
    raise AssertionError("absl.app.run returned")  # it always exits
