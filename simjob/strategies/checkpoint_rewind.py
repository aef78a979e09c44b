"""Baseline (b): checkpoint rewind, the way MaxText recovers with ``elastic_enabled``.

The whole training function runs under pathwaysutils'
``Manager.elastic_retry`` (``pathwaysutils.elastic.manager``, imported
explicitly; default ``poll_interval`` 10 s, ``minimum_slice_count`` set from
``--min-slices``, ``timeout`` from ``--timeout``, retries from
``--max-retries``). The trainer learns of a lost slice only from the
``DATA_LOSS`` that pathwaysutils' ``DeviceLossSimulator`` raises when a step
touches it (:mod:`standins.pathways_runtime`, as in the demo). The manager
then waits for ``minimum_slice_count`` slices and re-runs the function, which
rebuilds the mesh on the slices it is given and restores the newest committed
checkpoint: work since that checkpoint is lost. Growing back works as in
MaxText's ``maybe_elastic_scale_up``: the manager's monitor thread finds the
returned slice (every ``poll_interval``), the loop raises
``ScaleUpSignalError`` at the next step boundary, and the function re-runs
from the last checkpoint again.

On CPU the manager needs slice grouping and a probe that sees the stand-in
workers: :mod:`simjob.strategies.cpu_slices` (test support).

    python -m simjob.strategies.checkpoint_rewind [demo options] [--poll-interval 10]
    python -m simjob.strategies.checkpoint_rewind trainer ...
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

from simjob.strategies.common import PlainTrainer, Strategy, add_strategy_args, parse_trainer_args, run_strategy
from simjob.trainer_numpy import slices_named
from trainer_hooks.maxtext.snapshot import DATA_NONE, state_layout

DEFAULT_POLL_INTERVAL = 10.0
"""pathwaysutils' default (and MaxText's): slices are re-probed every 10 s."""
SNAPSHOT_REPORT_EVERY = 50
"""Steps between ``snapshot_stats`` events (one event per snapshot would swamp the event log)."""


class CheckpointRewind(Strategy):
    name = "checkpoint_rewind"
    trainer_module = "simjob.strategies.checkpoint_rewind"

    def trainer_args(self, ns: argparse.Namespace) -> list[str]:
        return [
            "--min-slices",
            str(ns.min_slices),
            "--timeout",
            str(ns.timeout),
            "--max-retries",
            str(ns.max_retries),
            "--poll-interval",
            str(ns.poll_interval),
        ]


class SnapshotTrainer(PlainTrainer):
    """The plain trainer plus an in-memory snapshot of the state before every step, through Orbax's
    Snapshotter as the sidecar's example trainer and the MaxText hook take theirs.

    The snapshot is taken before the step because the step may consume (donate) its input state, as
    MaxText's does: after a failed step only the snapshot is left. A rewind restores whichever is
    newer, the snapshot or the last committed checkpoint, onto the new mesh, from the replicas of the
    slices that survived.
    """

    def __init__(self, ns: argparse.Namespace, events: Any) -> None:  # noqa: D107
        super().__init__(ns, events)
        self._snap_seconds: list[float] = []
        self._lost: frozenset[int] = frozenset()
        """Slices lost since the snapshot's mesh was built: their replicas are gone even once replaced."""

    def build(self, slices: list[int] | tuple[int, ...], generation: int, reason: str) -> int:
        self._lost |= self.runtime.lost_slices()
        step = super().build(slices, generation, reason)
        self._lost = frozenset()
        self.snapshots.configure(state_layout(self.mesh, self.state, self.slice_devices))
        return step

    def train(self, step: int, boundary: Any = None) -> int:
        try:
            return super().train(step, boundary)
        except self.jax.errors.JaxRuntimeError as e:
            # The slices the step failed on: their replicas are gone even if replaced before the re-run.
            self._lost |= (self.runtime.lost_slices() & set(self.active)) | slices_named(e)
            raise

    def snapshot(self, step: int) -> None:
        self._lost |= self.runtime.lost_slices()
        if not self.snapshots.usable or self.snapshots.latest_step() == step:
            return
        t0 = time.monotonic()
        try:
            self.snapshots.save(step, self.state, DATA_NONE)
        except self.jax.errors.JaxRuntimeError:
            return  # a slice already lost: the step fails next, and the previous snapshot stands in
        self._snap_seconds.append(time.monotonic() - t0)
        if len(self._snap_seconds) >= SNAPSHOT_REPORT_EVERY:
            xs = sorted(self._snap_seconds)
            self.events("snapshot_stats", {"step": step, "count": len(xs), "median_seconds": xs[len(xs) // 2]})
            self._snap_seconds = []

    def _restore(self, mesh: Any) -> tuple[Any, int, str]:
        ck = self.manager.latest_step()
        snap = self.snapshots.newest_step()
        if snap is not None and (ck is None or snap > ck):
            got = self._from_snapshot(mesh, self._lost | self.runtime.lost_slices())
            if got is not None:
                return got[0], got[1], "memory_snapshot"
        self.snapshots.forget()  # older than the checkpoint, or unreadable: its pinned host memory is freed
        return super()._restore(mesh)


def trainer_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-slices", type=int, default=-1)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--max-retries", type=int, default=10)
    ap.add_argument("--poll-interval", type=float, default=DEFAULT_POLL_INTERVAL)
    ap.add_argument(
        "--snapshot-every-step",
        action="store_true",
        help="copy the state to host memory before every step and rewind to that copy (memory_snapshot)",
    )
    own, rest = ap.parse_known_args(argv)
    ns = parse_trainer_args(rest)

    from pathwaysutils.elastic import manager as pw_manager  # explicit: the package namespace is empty

    from simjob.strategies.cpu_slices import CpuSliceManager, standin_slice_health
    from simjob.trainer import EventLog

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    events = EventLog(ns.events or ns.workdir / "trainer-events.jsonl")
    events("start", {"slices": ns.slices, "steps": ns.steps, "pid": os.getpid()})
    t = SnapshotTrainer(ns, events) if own.snapshot_every_step else PlainTrainer(ns, events)
    try:
        events("jax_ready", {"devices": len(t.jax.devices())})
        attempt = {"n": 0}

        with standin_slice_health(t.runtime):
            mgr = CpuSliceManager(t.slice_devices)

            def on_elastic_event() -> None:
                events("elastic_event", {"attempt": attempt["n"]})
                # A fresh simulator before the manager probes the slices again: the
                # simulator keys its bookkeeping by id() of arrays, and a reused id
                # would make a healthy slice's probe look lost (the demo trainer
                # does the same for every new mesh).
                t._new_simulator()
                t.runtime.apply(t.sim, t.slice_devices)

            def boundary(step: int) -> None:
                if isinstance(t, SnapshotTrainer):
                    t.snapshot(step)
                # MaxText's maybe_elastic_scale_up: grow at a step boundary by re-running the function.
                if mgr.available_inactive_slices:
                    events("scale_up_signal", {"step": step, "slices": sorted(mgr.available_inactive_slices)})
                    raise pw_manager.ScaleUpSignalError(f"slices {sorted(mgr.available_inactive_slices)} available")

            @mgr.elastic_retry(
                minimum_slice_count=None if own.min_slices == -1 else own.min_slices,
                poll_interval=own.poll_interval,
                timeout=own.timeout,
                on_elastic_event_callback=on_elastic_event,
                retry_policy=pw_manager.ElasticRetryLimit(own.max_retries),
            )
            def train() -> int:
                attempt["n"] += 1
                slices = sorted(mgr.active_slice_indices)
                step = t.build(slices, attempt["n"], f"elastic_retry attempt {attempt['n']}: last committed checkpoint")
                return t.train(step, boundary)

            try:
                step = train()
            except (pw_manager.ElasticRuntimeError, TimeoutError) as e:
                events("abort", {"reason": f"{type(e).__name__}: {e}"[:200]})
                return 42
        t.finish(step)
        return 0
    finally:
        t.close()


def rewind_main(argv: list[str] | None, prog: str, description: str | None, strategy: CheckpointRewind) -> int:
    """The command line of a rewind strategy: ``trainer ...`` runs its trainer, anything else the job."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["trainer"]:
        return trainer_main(argv[1:])
    ap = argparse.ArgumentParser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_strategy_args(ap)
    ap.add_argument(
        "--poll-interval",
        type=float,
        default=DEFAULT_POLL_INTERVAL,
        help="Manager.elastic_retry poll_interval (default 10, pathwaysutils' default)",
    )
    return run_strategy(ap.parse_args(argv), strategy)


def main(argv: list[str] | None = None) -> int:
    return rewind_main(argv, "python -m simjob.strategies.checkpoint_rewind", __doc__, CheckpointRewind())


if __name__ == "__main__":
    sys.exit(main())
