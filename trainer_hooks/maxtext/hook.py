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
  the hook checks for a pending command (a deque test), then runs the step and
  reports it with its wall time. A slice-loss error (``DATA_LOSS``) from the
  step reaches the sidecar (``slice_error``) before MaxText sees it.

Flushing uses MaxText's own checkpoint manager and helpers:
``checkpointing.save_checkpoint(..., force=True)`` then
``checkpointing.wait_until_finished``, and the step counts only if the
manager lists it after re-reading its directory. MaxText labels a checkpoint
with the 0-based index of the step just run, so the state after ``s``
completed steps is saved as ``s - 1`` and reported as committed step ``s``.

What MaxText cannot do in-process is move its mesh onto other slices, nor
trust a state that a failed step consumed. After a resume on a changed slice
set, or after a slice-loss error, the hook flushes and then

* with ``elastic_enabled``: raises what pathwaysutils' ``elastic_retry``
  understands (``ScaleUpSignalError`` to grow, a ``DATA_LOSS``
  ``JaxRuntimeError`` to shrink, the slice-loss error itself after one), so
  the next attempt starts at once and restores the flushed step;
* without: exits 42, which xpk restarts, and the restart restores it.

A resume on the same slice set continues from memory. An abort flushes and
exits with the abort's exit code.

The hook never waits for ever: blocked on a sidecar (at start, in a hold, or
after a slice-loss error) that has been gone for MaxText's own
``elastic_timeout_seconds``, it flushes if it holds an uncommitted step whose
state it can read, then exits 42 (never 1), so xpk restarts the workload.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from trainer_hooks.session import AbortTraining, Directive, ElasticSession, ElasticSettings, FlushResult, is_slice_down

ENV_ADDRESS = "ELASTIC_SIDECAR_ADDRESS"
"""host:port of the coordinator sidecar's trainer link; unset: run MaxText unchanged."""
ENV_JOB = "ELASTIC_SIDECAR_JOB"
"""The job name the sidecar serves (checked by the sidecar when both are set)."""
EXIT_RESTART = 42
"""xpk restarts a workload that exits 42 (same value as ``agent.constants.EXIT_RESTART``,
which the trainer process must not import)."""
TRAIN_MODULE = "maxtext.trainers.pre_train.train"
LOG_PREFIX = "trainer_hooks.maxtext"


def say(kind: str, fields: dict[str, object] | None = None) -> None:
    """One line on stderr, beside MaxText's own log: ``trainer_hooks.maxtext: KIND {json}``."""
    print(f"{LOG_PREFIX}: {kind} {json.dumps(fields or {}, default=str, sort_keys=True)}", file=sys.stderr, flush=True)


def settings_from_config(config: Any) -> ElasticSettings:
    """MaxText's own elastic flags, which the sidecar adopts."""
    return ElasticSettings(
        elastic_min_slice_count=int(config.elastic_min_slice_count),
        elastic_timeout_seconds=float(config.elastic_timeout_seconds),
        elastic_max_retries=int(config.elastic_max_retries),
    )


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
    ) -> None:
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
        self.session.finished(max(self.completed, 0))
        self.session.close()
        say("finished", {"step": self.completed})

    # -- MaxText's seams ---------------------------------------------------------------

    def _initialize(
        self, initialize: Callable[[Sequence[str]], tuple[Any, Any]], argv: Sequence[str]
    ) -> tuple[Any, Any]:
        config, recorder = initialize(argv)
        self._config = config
        if self.session is None:  # elastic_retry calls initialize again for every attempt
            self._start(config)
        return config, recorder

    def _start(self, config: Any) -> None:
        settings = settings_from_config(config)
        self.session = self._connect(
            self.address,
            job=self.job,
            total_steps=int(config.steps),
            settings=settings,
            flush=self.flush,
            on_event=say,
        )
        say(
            "connecting",
            {"address": self.address, "job": self.job, "settings": vars(settings), "elastic": self._elastic()},
        )
        if not getattr(config, "enable_checkpointing", True):
            say("warning", {"message": "enable_checkpointing=false: holds and aborts cannot flush"})
        try:
            d = self.session.start(step_in_memory=-1)
        except AbortTraining as e:
            self._exit(e)
        say("start", {"generation": d.generation, "slices": list(d.active_slices), "reason": d.reason})
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
        step = int(python_vars["step"])
        self._device_state, self._python_vars = jax_device_state, python_vars
        self._config = immutable_data["config"]
        if self._rebuilding is not None:
            self._resumed(step)
        try:
            d = session.step_boundary(step)
        except AbortTraining as e:
            self._exit(e)
        if d is not None:
            self._apply(d, step)
        t0 = time.monotonic()
        try:
            metrics = iteration(jax_device_state, python_vars, immutable_data)
        except Exception as e:
            if is_slice_down(e):
                self._slice_error(step, e)  # returns only when elastic_retry is to take over
            raise
        self.completed = step + 1
        session.report_step(step + 1, time.monotonic() - t0)
        return metrics

    # -- directives ------------------------------------------------------------------

    def _resumed(self, step: int) -> None:
        """The first step boundary of a new train attempt: the mesh for the directive runs."""
        assert self.session is not None and self._rebuilding is not None
        d, since, restored_from = self._rebuilding
        self._rebuilding = None
        restored_from = restored_from or ("checkpoint" if step > 0 else "fresh")
        self.slices = tuple(sorted(d.active_slices))
        self.completed = step
        dt = time.monotonic() - since
        self.session.resumed(d, step, restored_from, dt)
        say(
            "resumed",
            {
                "generation": d.generation,
                "step": step,
                "slices": list(self.slices),
                "restored_from": restored_from,
                "rebuild_seconds": round(dt, 3),
            },
        )

    def _apply(self, d: Directive, step: int) -> None:
        """After a hold: go on from memory, or rebuild through a restart."""
        assert self.session is not None
        new = tuple(sorted(d.active_slices))
        if set(new) == set(self.slices):
            self.session.resumed(d, step, "memory", 0.0)
            say("resumed", {"generation": d.generation, "step": step, "slices": list(new), "restored_from": "memory"})
            return
        t0 = time.monotonic()
        why = f"slices {list(self.slices)} -> {list(new)} at step {step} (generation {d.generation})"
        grow = set(new) > set(self.slices)
        self._restart(d, step, t0, why, self._scale_up_error(why) if grow else self._slice_down_error(why))

    def _slice_error(self, step: int, err: BaseException) -> None:
        """A step failed with lost hardware: tell the sidecar, wait for its word, restart."""
        assert self.session is not None
        t0 = time.monotonic()
        try:
            d = self.session.slice_error(step, err, ())
        except AbortTraining as e:
            self._exit(e)
        # The failed step may have consumed (donated) the state: restart from the checkpoint.
        self._restart(d, step, t0, f"slice loss at step {step}", None)

    def _restart(self, d: Directive, step: int, since: float, why: str, err: BaseException | None) -> None:
        """Flush, then hand over to elastic_retry (raise ``err``; None: the caller re-raises) or exit 42."""
        assert self.session is not None
        committed = self.session.flush(step)
        if self._elastic():
            self._rebuilding = (d, since, "checkpoint")
            say("restart", {"how": "elastic_retry", "why": why, "committed_step": committed})
            if err is not None:
                raise err
            return
        say("restart", {"how": f"exit {EXIT_RESTART}", "why": why, "committed_step": committed})
        self.session.close()
        raise SystemExit(EXIT_RESTART)

    def _exit(self, e: AbortTraining) -> NoReturn:
        say("abort", {"exit_code": e.exit_code, "reason": e.reason, "committed_step": e.committed_step})
        if self.session is not None:
            self.session.close()
        raise SystemExit(e.exit_code)

    # -- flushing --------------------------------------------------------------------

    def flush(self, step: int, down_slices: frozenset[int] = frozenset()) -> FlushResult:
        """The session's flusher: make the state after ``step`` completed steps durable.

        ``down_slices`` cannot be honoured: MaxText saves its global arrays, so a
        flush that must read a lost slice fails (and the hold reports the last
        committed step instead).
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
        t0 = time.monotonic()
        checkpointing.save_checkpoint(manager, label, state, self._config, python_vars.get("data_iterator"), force=True)
        checkpointing.wait_until_finished(manager)
        labels = self._committed_labels(manager)
        if label not in labels:
            raise RuntimeError(f"MaxText's checkpoint manager did not commit step {label}; it lists {labels}")
        nbytes = tree_nbytes(state)
        say("flushed", {"step": step, "label": label, "seconds": round(time.monotonic() - t0, 3), "bytes": nbytes})
        return FlushResult(step, nbytes)

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
    train = importlib.import_module(TRAIN_MODULE)
    hook = MaxTextHook(address, os.environ.get(ENV_JOB, "")).install(train) if address else None

    def run(absl_argv: list[str]) -> None:
        train.main(absl_argv)
        if hook is not None:
            hook.finished()

    from absl import app

    # argv[0] names MaxText's train module, so MaxText picks its default config for it.
    app.run(run, argv=[str(train.__file__), *args])
    raise AssertionError("absl.app.run returned")  # it always exits
