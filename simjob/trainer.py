"""The example trainer of the simulated job: real JAX, real Orbax, real hooks.

A small MLP trained on CPU devices grouped into slices the way MaxText lays a
multi-slice job out: parameters sharded within a slice (mesh axis ``model``)
and replicated across slices (axis ``replica``, MaxText's DCN data axis). The
global batch is ``per_slice_batch`` rows per active slice. Periodic Orbax
checkpoints are saved asynchronously; the elastic session drives holds,
flushes and resumes. Slice loss reaches this process only as Pathways would
deliver it: pathwaysutils' fault injection raises ``DATA_LOSS`` when a step
touches a lost device (:mod:`standins.pathways_runtime`).

Writes one JSON line per event to ``--events`` (steps, holds, resumes), which
the demo harness reads for its timeline and summary. ``--backend numpy`` runs
the same loop without JAX or Orbax (:mod:`simjob.trainer_numpy`); ``--mode
multi-controller`` runs one JAX process per host instead (:mod:`simjob.mc_trainer`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from simjob.commits import PeriodicCommits
from simjob.slowdowns import SlowFile
from simjob.steps import EventLog, end_step, events_path, resumed
from simjob.trainer_numpy import NumpyTrainer, slices_named
from trainer_hooks import AbortTraining, Directive, ElasticSession, is_slice_down
from trainer_hooks.maxtext.interval import SnapshotInterval
from trainer_hooks.maxtext.snapshot import DATA_NONE, Snapshots, nbytes_per_replica, snapshot_every_arg, state_layout
from trainer_hooks.orbax_flush import OrbaxFlusher

SINGLE, MULTI = "single-controller", "multi-controller"
"""``--mode``: one process drives every slice, or one process per host."""
SNAPSHOT_REPORT_EVERY = 50
"""Snapshots handed over between ``snapshot_stats`` events (one event per snapshot would swamp the event log)."""


def surviving(state: Any, slice_of: Any, exclude: frozenset[int]) -> Any | None:
    """``state`` on the slices not in ``exclude``: a lost slice's shards are never read.

    ``state``: arrays on one mesh whose ``replica`` axis holds one replica per slice; ``slice_of``:
    device -> slice. pathwaysutils splits the arrays into one replica per slice and joins the
    survivors', without a copy (the calls Orbax's ``Snapshotter.load`` makes). None when no slice
    of it survives.
    """
    import jax
    from pathwaysutils.experimental import concatenate_by_mesh_axis, split_by_mesh_axis

    mesh = jax.tree_util.tree_leaves(state)[0].sharding.mesh
    slices = [slice_of(row.flat[0]) for row in mesh.devices]
    replicas = split_by_mesh_axis.split_by_mesh_axis(state, "replica")
    keep = [r for s, r in zip(slices, replicas, strict=True) if s not in exclude]
    return concatenate_by_mesh_axis.concatenate_by_mesh_axis(keep, "replica") if keep else None


def lose_replicas(snapshots: Snapshots, devices: set[int]) -> None:
    """Stand-in for Pathways: a lost host's pinned host memory goes with it.

    On the CPU the replicas of the newest snapshot held on ``devices`` (ids) would stay readable,
    even once a replacement is up. So they are freed, and Orbax's load finds them unreadable as on
    Pathways (its probe, ``jax.block_until_ready``, raises for a deleted array) and rebuilds the
    state from the other replicas.
    """
    import jax

    snap = snapshots.snapshotter
    if snap is None:
        return
    snapshots.join()
    with snap._lock:
        latest = snap._latest_snapshot
    for replica in latest[0] if latest is not None else []:
        arrays = [x for x in jax.tree_util.tree_leaves(replica) if isinstance(x, jax.Array)]
        if any(d.id in devices for x in arrays for d in x.devices()):
            for x in arrays:
                x.delete()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sidecar", required=True, help="coordinator sidecar HOST:PORT")
    ap.add_argument(
        "--backend",
        choices=["jax", "numpy"],
        default="jax",
        help="jax (default): JAX on CPU devices, Orbax checkpoints; numpy: the same loop, hooks and events on "
        "NumPy arrays, checkpoints as .npz files, no JAX imported (simjob.trainer_numpy)",
    )
    ap.add_argument(
        "--mode",
        choices=[SINGLE, MULTI],
        default=SINGLE,
        help="single-controller (default): this process drives every slice; multi-controller: this process is "
        "one host's of a job with one JAX process per host, joined by jax.distributed (simjob.mc_trainer)",
    )
    ap.add_argument("--job", default="elastic-demo")
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--slices", type=int, default=4)
    ap.add_argument("--devices-per-slice", type=int, default=2)
    ap.add_argument(
        "--pathways",
        action="append",
        default=[],
        metavar="SLICE.HOST=HOST:PORT",
        help="stand-in Pathways worker of each host",
    )
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--checkpoint-period", type=int, default=50)
    ap.add_argument("--step-seconds", type=float, default=0.05, help="pad each step to at least this long")
    ap.add_argument("--hidden", type=int, default=None, help="default 256; 128 with --mode multi-controller")
    ap.add_argument("--features", type=int, default=None, help="default 64; 32 with --mode multi-controller")
    ap.add_argument("--per-slice-batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--ballast-mib",
        type=int,
        default=0,
        help="add this many MiB per replica of optimizer-like state, rewritten elementwise every step: a large "
        "train state (what checkpoints, snapshots and flushes must copy) without a model's compute",
    )
    ap.add_argument(
        "--donate",
        action="store_true",
        help="donate the train state into the step (jit donate_argnums=0), as MaxText does: a failed step "
        "leaves no pre-step state in memory",
    )
    ap.add_argument(
        "--snapshot-every",
        type=snapshot_every_arg,
        default=1,
        metavar="STEPS|auto",
        help="with --donate and a sidecar: hand the state to Orbax's Snapshotter (a copy in pinned host "
        "memory beside each slice's shards, as the MaxText hook does) before every STEPS-th step, so a failed "
        "step resumes from the surviving slices' replicas (the newest snapshot at least as new as the last "
        "committed checkpoint) instead of the last checkpoint; 0: no snapshots; 'auto': the MaxText hook's "
        "default, an interval measured to keep the snapshots within 1.5%% of the step time, none at all when "
        "that interval reaches --checkpoint-period (trainer_hooks.maxtext.interval). Default 1 (at most the "
        "step in flight is lost): the demo's state is small",
    )
    ap.add_argument(
        "--slow-file",
        type=Path,
        default=None,
        help="the demo's slow faults: a JSON object of slice -> factor, read at every step; a step on slices "
        "of which one is slowed takes its slowest active slice's factor times as long (simjob.slowdowns)",
    )
    ap.add_argument("--events", type=Path, default=None)
    ap.add_argument(
        "--elastic-timeout-seconds",
        type=float,
        default=300.0,
        help="give up (exit 42) when blocked on a sidecar that has been gone this long (MaxText's default: 300)",
    )
    mc = ap.add_argument_group("--mode multi-controller")
    mc.add_argument("--process-id", type=int, default=None, help="this process's index among the job's")
    mc.add_argument("--num-processes", type=int, default=None)
    mc.add_argument("--jax-coordinator", default=None, help="jax.distributed coordinator 127.0.0.1:PORT")
    mc.add_argument("--host-name", default="", help="the host this process stands for (reported to the sidecar)")
    mc.add_argument("--per-device-batch", type=int, default=8)
    mc.add_argument("--abort-grace-seconds", type=float, default=1.0)
    mc.add_argument(
        "--no-sidecar", action="store_true", help="train without the hooks (the baseline: what a job does without us)"
    )
    ns = ap.parse_args(argv)
    multi = ns.mode == MULTI
    if ns.hidden is None:
        ns.hidden = 128 if multi else 256
    if ns.features is None:
        ns.features = 32 if multi else 64
    if ns.backend == "numpy" and ns.donate:
        ap.error("--donate needs --backend jax: the NumPy backend has no jit to donate into")
    if multi:
        missing = [f for f in ("process_id", "num_processes", "jax_coordinator", "events") if getattr(ns, f) is None]
        if missing:
            ap.error(f"--mode multi-controller needs --{missing[0].replace('_', '-')}")
        if ns.backend == "numpy" or ns.donate:
            ap.error("--mode multi-controller runs on JAX without donation: drop --backend numpy and --donate")
    elif ns.no_sidecar:
        ap.error("--no-sidecar needs --mode multi-controller (the single-controller baselines are simjob.strategies)")
    return ns


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    multi = ns.mode == MULTI
    events = EventLog(
        events_path(ns.events, ns.process_id) if multi else ns.events or ns.workdir / "trainer-events.jsonl"
    )
    trainer: Any = None
    try:
        if multi:
            from simjob.mc_trainer import McTrainer

            trainer = McTrainer(ns, events)
        else:
            trainer = NumpyTrainer(ns, events) if ns.backend == "numpy" else Trainer(ns, events)
        code = trainer.run()
    except AbortTraining as e:
        events("abort", {"exit_code": e.exit_code, "reason": e.reason, "committed_step": e.committed_step})
        print(f"trainer{f' process {ns.process_id}' if multi else ''}: {e}", file=sys.stderr, flush=True)
        code = e.exit_code
    finally:
        if trainer is not None and not multi:
            trainer.close()
    if multi:
        from simjob.mc_trainer import leave

        leave(code, ns.process_id)
    return code


class Trainer:
    def __init__(self, ns: argparse.Namespace, events: EventLog, *, connect: bool = True) -> None:
        """``connect=False``: no sidecar (the baseline strategies in simjob/strategies drive it)."""
        import jax
        import numpy as np
        import orbax.checkpoint as ocp

        from standins.loss_simulator import IdSafeDeviceLossSimulator
        from standins.pathways_runtime import PathwaysRuntime

        self.ns, self.events, self.jax, self.np, self.ocp = ns, events, jax, np, ocp
        self._Simulator = IdSafeDeviceLossSimulator
        # pathwaysutils' simulator wraps jax.jit and reads every input's devices after the call, which
        # fails for a donated (deleted) input; a donating step is compiled with the unwrapped jit, and
        # slice loss still reaches it through the stand-in runtime's collective and array accessors.
        self._plain_jit = jax.jit
        devices = jax.devices()
        need = ns.slices * ns.devices_per_slice
        if len(devices) < need:
            raise SystemExit(
                f"trainer: {ns.slices} slices x {ns.devices_per_slice} devices need {need} devices, JAX sees "
                f"{len(devices)}; set XLA_FLAGS=--xla_force_host_platform_device_count={need}"
            )
        dps = ns.devices_per_slice
        self.slice_devices = {s: list(devices[s * dps : (s + 1) * dps]) for s in range(ns.slices)}
        self.device_slice = {d.id: s for s, ds in self.slice_devices.items() for d in ds}
        targets: dict[int, list[str]] = {s: [] for s in range(ns.slices)}
        for spec in sorted(ns.pathways):
            key, _, addr = spec.partition("=")
            s, _, _h = key.partition(".")
            targets[int(s)].append(addr)
        self.runtime = PathwaysRuntime({s: t for s, t in targets.items() if t}).start()
        self.sim = None
        self._new_simulator()
        ckdir = (ns.workdir / "checkpoints").resolve()
        self.manager = ocp.CheckpointManager(
            ckdir,
            options=ocp.CheckpointManagerOptions(
                save_interval_steps=ns.checkpoint_period, max_to_keep=3, enable_async_checkpointing=True
            ),
        )
        self.state: dict[str, Any] | None = None
        self.snapshots = Snapshots()
        """With --donate: Orbax's Snapshotter and its newest snapshot, the state before a step that consumes it
        (see ``_snapshot``); it outlives the meshes, as the MaxText hook's outlives MaxText's attempts."""
        self._snap_seconds: list[float] = []
        self._seen_lost: frozenset[int] = frozenset()
        self.mesh = None
        self.active: tuple[int, ...] = ()
        self._compiled: dict[tuple[int, ...], tuple[Any, Any, Any]] = {}
        """Slices -> (mesh, step function, batch sharding): each mesh's step is traced and compiled once,
        so growing back onto a mesh seen before (the 4-slice one of the start) costs no recompile."""
        self._preparing: dict[tuple[int, ...], Future[tuple[Any, Any, Any]]] = {}
        """Slices -> that mesh's step being compiled ahead, on the session's advice (``_prepare``)."""
        self._prepare_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare-mesh")
        self.interval = SnapshotInterval(ns.snapshot_every, ceiling=ns.checkpoint_period)
        """When to snapshot: every ``--snapshot-every`` steps, or by measurement (``auto``)."""
        self._slot: tuple[float, bool, bool] | None = None
        """The step slot in progress (auto): when it started (before any snapshot), whether a snapshot was
        taken at its start, and whether it counts (not when a checkpoint was started in it)."""
        self.slow = SlowFile(getattr(ns, "slow_file", None))
        self.session = self._connect() if connect else None
        # Periodic saves count as committed steps (admin status, the state file) once Orbax committed them.
        self.commits = PeriodicCommits(self.manager, self.session, events)

    def _connect(self) -> ElasticSession:
        ns = self.ns
        return ElasticSession.connect(
            ns.sidecar,
            job=ns.job,
            total_steps=ns.steps,
            flush=OrbaxFlusher(self.manager, self._save_args),
            snapshot=self._keep_in_memory,
            prepare=self._prepare,
            on_event=self.events,
            elastic_timeout_seconds=ns.elastic_timeout_seconds,
        )

    def close(self) -> None:
        """Stops this process's threads before it exits: the loss simulator, the stand-in runtime's
        watchers and channels, and Orbax's manager (which waits for a save in progress to commit)."""
        if self.sim is not None:
            self.sim.stop()
            self.sim = None
        self._prepare_pool.shutdown(wait=False, cancel_futures=True)
        self.runtime.stop()
        self.manager.close()

    # -- model -----------------------------------------------------------------

    def _new_simulator(self) -> None:
        """A fresh simulator per mesh (lost devices start over with the new mesh)."""
        if self.sim is not None:
            self.sim.stop()
        self.sim = self._Simulator()
        self.sim.start()
        self.runtime.reset_applied()

    def _init_params(self, abstract: bool = False) -> dict[str, Any]:
        """The initial state; ``abstract``: the same tree with shapes only where data would be costly."""
        np, ns = self.np, self.ns
        rng = np.random.default_rng(ns.seed)
        f, h = ns.features, ns.hidden
        p = {
            "w1": (rng.standard_normal((f, h)) / np.sqrt(f)).astype(np.float32),
            "b1": np.zeros((h,), np.float32),
            "w2": (rng.standard_normal((h, 1)) / np.sqrt(h)).astype(np.float32),
        }
        state = {"params": p, "momentum": {k: np.zeros_like(v) for k, v in p.items()}}
        if ns.ballast_mib:
            shape = (ns.ballast_mib * 256, 1024)  # float32: 1 MiB per 256 rows
            state["ballast"] = (
                self.jax.ShapeDtypeStruct(shape, np.float32) if abstract else rng.random(shape, dtype=np.float32)
            )
        return state

    def _specs(self) -> dict[str, Any]:
        from jax.sharding import PartitionSpec as P

        p = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None)}
        specs: dict[str, Any] = {"params": p, "momentum": dict(p)}
        if self.ns.ballast_mib:
            specs["ballast"] = P(None, "model")
        return specs

    def _shardings(self, mesh: Any) -> Any:
        from jax.sharding import NamedSharding

        return self.jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), self._specs())

    def _batch(self, step: int, n_active: int) -> tuple[Any, Any]:
        np, ns = self.np, self.ns
        rng = np.random.default_rng(ns.seed * 100_003 + step)
        teacher = np.random.default_rng(ns.seed + 7).standard_normal((ns.features, 1)).astype(np.float32)
        x = rng.standard_normal((ns.per_slice_batch * n_active, ns.features)).astype(np.float32)
        y = np.tanh(x @ teacher)
        return x, y

    def _build_step_fn(self, mesh: Any) -> Any:
        jax = self.jax
        jnp = jax.numpy
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        state_sh = self._shardings(mesh)
        batch_sh = NamedSharding(mesh, P("replica", None))

        # 0.05 up to the default width (256); wider (a large state for the benchmarks) needs a step
        # size that shrinks with the width, or training diverges to NaN (and a NaN state would
        # compress unrealistically well in a checkpoint).
        lr = 0.05 if self.ns.hidden <= 256 else 0.1 / self.ns.hidden

        def loss_fn(params: Any, x: Any, y: Any) -> Any:
            hdn = jax.nn.relu(x @ params["w1"] + params["b1"])
            return jnp.mean((hdn @ params["w2"] - y) ** 2)

        def step(state: Any, x: Any, y: Any) -> Any:
            loss, g = jax.value_and_grad(loss_fn)(state["params"], x, y)
            mom = jax.tree_util.tree_map(lambda m, gi: 0.9 * m + gi, state["momentum"], g)
            params = jax.tree_util.tree_map(lambda p, m: p - lr * m, state["params"], mom)
            new = {"params": params, "momentum": mom}
            if "ballast" in state:
                # Optimizer-like state: rewritten every step (so every copy of it is current), no gradient.
                new["ballast"] = state["ballast"] * 0.999 + 0.001
            return new, loss

        # Compiled with the unpatched jit and kept for the mesh's lifetime (see ``_compiled``); without
        # donation the current simulator's own propagate_corruption marks the outputs of corrupted inputs,
        # as its patched jax.jit would (a jit wrapped by one simulator would keep reporting to that one).
        fn = self._plain_jit(
            step,
            in_shardings=(state_sh, batch_sh, batch_sh),
            out_shardings=(state_sh, NamedSharding(mesh, P())),
            donate_argnums=(0,) if self.ns.donate else (),
        )
        # Compiled ahead of time (JAX's AOT API: jit(f).lower(shapes).compile()), so that the rebuild
        # includes the compile, as MaxText's re-initialisation does, instead of the first step hiding it.
        # No persistent compilation cache is configured: every process compiles afresh, as a new job does.
        n = self.ns.per_slice_batch * mesh.devices.shape[0]
        x_abs = jax.ShapeDtypeStruct((n, self.ns.features), jnp.float32, sharding=batch_sh)
        y_abs = jax.ShapeDtypeStruct((n, 1), jnp.float32, sharding=batch_sh)
        fn = fn.lower(self._abstract(mesh), x_abs, y_abs).compile()
        if self.ns.donate:
            return fn, batch_sh

        def tracked(*args: Any) -> Any:
            return self.sim.propagate_corruption(args, fn(*args))  # type: ignore[union-attr]

        return tracked, batch_sh

    def _build(self, slices: tuple[int, ...]) -> tuple[Any, Any, Any]:
        from jax.sharding import Mesh

        mesh = Mesh(self.np.array([self.slice_devices[s] for s in slices]), ("replica", "model"))
        return (mesh, *self._build_step_fn(mesh))

    def _prepare(self, slices: tuple[int, ...]) -> Future[Any] | None:
        """The session's prepare hook: compile the step of the mesh the job will run on next, on a thread
        beside the steps (a TPU host's CPU is mostly idle during a step), so the resume onto it need not."""
        if slices in self._compiled or not set(slices) <= set(self.slice_devices):
            return None
        if slices not in self._preparing:
            self._preparing[slices] = self._prepare_pool.submit(self._build, slices)
        return self._preparing[slices]

    def _mesh_and_step(self, slices: tuple[int, ...]) -> tuple[tuple[Any, Any, Any], str]:
        """The mesh over ``slices`` and its compiled step, built on first use only; and how it came:
        "kept" (built before), "prepared" (compiled ahead on the session's advice) or "compiled" (now)."""
        if slices in self._compiled:
            return self._compiled[slices], "kept"
        how = "compiled"
        ahead = self._preparing.pop(slices, None)
        try:
            built = ahead.result() if ahead is not None else None
            how = "prepared" if built is not None else how
        except Exception as e:  # a compile ahead that failed is done again here, where its error would show
            self.events("prepare_failed", {"slices": list(slices), "error": f"{type(e).__name__}: {e}"[:300]})
            built = None
        self._compiled[slices] = built if built is not None else self._build(slices)
        return self._compiled[slices], how

    # -- state movement ----------------------------------------------------------

    def _gather(self, exclude: frozenset[int]) -> Any | None:
        """The state assembled from replicas on slices not in ``exclude`` (None if incomplete)."""
        np = self.np

        if self.state is None or any(x.is_deleted() for x in self.jax.tree_util.tree_leaves(self.state)):
            return None  # donated into a step that failed: no replica of the pre-step state is left

        def gather(arr: Any) -> Any:
            out = np.empty(arr.shape, arr.dtype)
            need = {str(sh.index) for sh in arr.addressable_shards}
            got: set[str] = set()
            for sh in arr.addressable_shards:
                if self.device_slice[sh.device.id] in exclude or str(sh.index) in got:
                    continue
                try:
                    out[sh.index] = np.asarray(sh.data)
                except self.jax.errors.JaxRuntimeError as e:
                    # A replica on a device Pathways has lost: another slice may hold the shard.
                    if not is_slice_down(e):
                        raise
                    continue
                got.add(str(sh.index))
            if got != need:
                raise LookupError("no surviving replica holds every shard")
            return out

        try:
            return self.jax.tree_util.tree_map(gather, self.state)
        except LookupError:
            return None

    def _snapshot(self, step: int) -> bool:
        """Before a step that donates the state: hand it to Orbax's Snapshotter when one is due, as the MaxText
        hook does (:mod:`trainer_hooks.maxtext.snapshot`). Returns whether a save was handed over.

        The copy runs on after this returns, beside the step. A save still copying makes this one skip,
        never wait. A copy that fails (a slice lost meanwhile) keeps the previous snapshot.
        """
        snaps = self.snapshots
        if not (self.ns.donate and self.ns.snapshot_every != 0 and self.session is not None and snaps.usable):
            return False
        failed = snaps.check_pending()
        if failed is not None:
            self.events("snapshot_failed", {"step": failed, "error": "the copy to pinned host memory failed"})
        if not self.interval.due(step) or snaps.latest_step() == step:
            return False
        t0 = time.monotonic()
        try:
            saved = snaps.save(step, self.state, DATA_NONE)
        except self.jax.errors.JaxRuntimeError as e:
            if not is_slice_down(e):
                raise
            # A slice lost before the copy started: if the step consumes the state and fails, the
            # previous snapshot (or the last checkpoint) stands in.
            snaps.failed += 1
            self.events("snapshot_failed", {"step": step, "error": str(e)[:200]})
            return False
        if not saved:
            every = self.interval.skipped()
            if every is not None:
                self._interval_event(every)
            return False
        self._snap_seconds.append(time.monotonic() - t0)
        if len(self._snap_seconds) >= SNAPSHOT_REPORT_EVERY:
            xs = sorted(self._snap_seconds)
            self.events(
                "snapshot_stats",
                {"step": step, "count": len(xs), "median_seconds": xs[len(xs) // 2], "bytes": self._snapshot_bytes()},
            )
            self._snap_seconds = []
        return True

    def _keep_in_memory(self, step: int, leaving: frozenset[int]) -> str:
        """A drain from memory (the session's snapshot hook): keep ``step`` on the slices not ``leaving``,
        nothing to storage. The live state is whole at a boundary and each slice holds a replica of it
        (axis ``replica``); with --donate the newest snapshot is made this step's too, as the MaxText hook's."""
        state = self.state
        if state is None or any(x.is_deleted() for x in self.jax.tree_util.tree_leaves(state)):
            return "the state was donated into a step that failed"
        if not any(s not in leaving for s in self.active):
            return "no slice of the mesh remains"
        if self.ns.donate and self.ns.snapshot_every != 0 and self.snapshots.usable:
            why = self.snapshots.ensure(step, state, DATA_NONE)
            if why:
                return why
        self.events("kept_in_memory", {"step": step, "leaving": sorted(leaving)})
        return ""

    def _snapshot_bytes(self) -> int:
        """Host memory the newest snapshot holds: one replica of the state per slice it was taken on."""
        layout = self.snapshots.layout
        if self.state is None or layout is None or self.snapshots.latest_step() is None:
            return 0
        return nbytes_per_replica(self.state) * max(1, layout.replicas)

    def _lose_replicas(self, slices: frozenset[int]) -> None:
        if slices:
            lose_replicas(self.snapshots, {d.id for s in slices for d in self.slice_devices[s]})

    def _drop_snapshots(self, committed: int) -> None:
        """Auto turned snapshots off: once a committed checkpoint is at least as new as the last snapshot,
        nothing restores from it (the ladder never takes an older step than the newest committed), so its
        pinned host memory (a copy of the state per slice) is freed rather than held for the process's life."""
        held = self.snapshots.latest_step()
        if held is None or held > committed:
            return
        self.snapshots.forget()
        self.events("snapshot_buffers_freed", {"committed_step": committed})

    def _slot_ended(self, now: float) -> None:
        """Feed ``auto`` the slot that ends at ``now`` (the next boundary); log a changed interval."""
        if self._slot is None:
            return
        started, saved, counted = self._slot
        self._slot = None
        every = self.interval.slot(now - started, saved=saved, counted=counted)
        if every is not None:
            self._interval_event(every)

    def _interval_event(self, every: int) -> None:
        iv = self.interval
        self.events(
            "snapshot_every",
            {
                "every": every,
                "off": iv.off,
                "overhead_fraction": iv.last_fraction,
                "step_seconds_baseline": iv.baseline,
                "budget": iv.snapshot_budget,
                "ceiling": iv.ceiling,
            },
        )

    def _survivors_mesh(self, exclude: frozenset[int]) -> Any | None:
        """The current mesh less the slices in ``exclude`` (None when none is left)."""
        from jax.sharding import Mesh

        keep = [s for s in self.active if s not in exclude]
        return Mesh(self.np.array([self.slice_devices[s] for s in keep]), ("replica", "model")) if keep else None

    def _abstract(self, mesh: Any) -> Any:
        """The state's shapes on ``mesh``'s shardings: what Orbax restores or loads onto."""
        return self.jax.tree_util.tree_map(
            lambda x, sh: self.jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
            self._init_params(abstract=True),
            self._shardings(mesh),
        )

    def _from_live(self, exclude: frozenset[int]) -> Any | None:
        """The live state on the current mesh from the slices not in ``exclude`` (:func:`surviving`)."""
        state = self.state
        if state is None or any(x.is_deleted() for x in self.jax.tree_util.tree_leaves(state)):
            return None  # donated into a step that failed
        survivors = surviving(state, lambda d: self.device_slice[d.id], exclude)
        return None if survivors is None else self.jax.device_put(survivors, self._shardings(self.mesh))

    def _from_snapshot(self, mesh: Any, exclude: frozenset[int]) -> tuple[Any, int] | None:
        """The newest snapshot on ``mesh`` and its step, from the replicas of the slices not in ``exclude``
        (Orbax's load ladder: the replicas still readable, else an error, here None)."""
        if self.snapshots.snapshotter is None:
            return None
        self._lose_replicas(exclude)
        try:
            restored = self.snapshots.load(self._abstract(mesh))
        except (RuntimeError, ValueError) as e:  # JaxRuntimeError is a RuntimeError
            if isinstance(e, self.jax.errors.JaxRuntimeError) and not is_slice_down(e):
                raise
            return None
        return restored.state, restored.step

    def _placed(self, place: Any) -> Any | None:
        """``place()``, ready (before the step that donates it); None when a copy it reads was on a slice
        lost meanwhile: the ladder's next rung then."""
        try:
            out = place()
            if out is not None:
                self.jax.block_until_ready(out)
        except self.jax.errors.JaxRuntimeError as e:
            if not is_slice_down(e):
                raise
            return None
        return out

    def _save_args(self, step: int, down: frozenset[int]) -> tuple[Any, int]:
        exclude = down | self.runtime.lost_slices() | self._seen_lost
        host: Any = self._gather(exclude)
        if host is None and self.snapshots.newest_step() == step:
            # The state was donated into a step that failed: the snapshot taken before it stands in.
            mesh = self._survivors_mesh(exclude)
            got = self._from_snapshot(mesh, exclude) if mesh is not None else None
            host = got[0] if got is not None else None
        if host is None:
            raise RuntimeError(f"cannot flush step {step}: no surviving replica of the state")
        nbytes = sum(int(x.nbytes) for x in self.jax.tree_util.tree_leaves(host))
        return self.ocp.args.Composite(state=self.ocp.args.StandardSave(host)), nbytes

    def _restore(self, mesh: Any) -> tuple[Any, int, str]:
        step = self.manager.latest_step()
        if step is None:
            return self.jax.device_put(self._init_params(), self._shardings(mesh)), 0, "fresh"
        abstract = self._abstract(mesh)
        out = self.manager.restore(step, args=self.ocp.args.Composite(state=self.ocp.args.StandardRestore(abstract)))
        return out["state"], int(step), "checkpoint"

    def _apply(self, d: Directive, step: int) -> int:
        """Rebuild the mesh over ``d.active_slices``; returns the step to continue from."""
        t0 = time.monotonic()
        directive_at = time.time()
        # Pathways only hands out devices whose workers are up.
        available = self.runtime.wait_available(d.active_slices, timeout=10.0)
        t_avail = time.monotonic()
        if not available:
            self.runtime.apply(self.sim, self.slice_devices)
            missing = sorted(set(d.active_slices) - self.runtime.available_slices())
            err = self.jax.errors.JaxRuntimeError(f"DATA_LOSS: slices {missing} have no Pathways worker")
            return self._apply(self.session.slice_error(step, err, missing), step)
        exclude: frozenset[int] = frozenset()
        if d.source == "memory":
            # A slice lost since this mesh was built holds no replica, even if its
            # replacement is already up again.
            exclude = d.down_slices | self.runtime.lost_slices() | self._seen_lost
        snap_step = self.snapshots.newest_step() if d.source == "memory" else None
        self._seen_lost = frozenset()
        self._slot = None
        self.interval.new_attempt()
        self._new_simulator()
        self.runtime.apply(self.sim, self.slice_devices)
        t_mesh = time.monotonic()
        (self.mesh, self.step_fn, self.batch_sh), program = self._mesh_and_step(tuple(d.active_slices))
        t_place = time.monotonic()
        program_ready_at = time.time()
        # The restore ladder, as the MaxText hook's: the live state's surviving replicas; else (donated into
        # the step that failed) the newest snapshot when it is at least as new as the newest committed
        # checkpoint, never an older step than that (its batches come again from its step, so the data
        # consumed is an uninterrupted run's); else the checkpoint.
        state = self._placed(lambda: self._from_live(exclude)) if d.source == "memory" else None
        waited: float | None = None
        if state is None and snap_step != step:
            # A periodic save in flight may commit a step newer than the snapshot: wait for it to know.
            tw = time.monotonic()
            self.manager.wait_until_finished()
            waited = time.monotonic() - tw
            if snap_step is not None and snap_step < (self.manager.latest_step() or 0):
                snap_step = None
        loaded = None
        if state is None and snap_step is not None:
            loaded = self._placed(lambda: self._from_snapshot(self.mesh, exclude))
        if loaded is not None:
            state, step = loaded
        if state is None and waited is None:
            tw = time.monotonic()
            self.manager.wait_until_finished()
            waited = time.monotonic() - tw
        if loaded is None or self.interval.off:
            # Not what this mesh restored (a lost slice's replica must not outlive the rebuild: the next
            # boundary takes a new one), or ``auto`` takes no more: its pinned host memory is freed.
            self.snapshots.forget()
        t_restore = time.monotonic()
        if state is not None:
            self.state, restored_from = state, "memory"
            restore_source = "snapshot" if loaded is not None else "live"
        else:
            self.state = None  # the old mesh's state, replaced by the checkpoint: not held while that is read
            self.state, step, restored_from = self._restore(self.mesh)
            restore_source = restored_from
        restored_at = time.time()
        self.active = d.active_slices
        if self.ns.donate and self.ns.snapshot_every != 0:
            self.snapshots.configure(state_layout(self.mesh, self.state, self.slice_devices))
        fields = {
            # Of which waiting for a periodic save in flight, to know the newest committed step
            # (none when the live state or the failed step's own snapshot stood in).
            "checkpoint_wait_seconds": round(waited or 0.0, 4),
            # Host memory this process still holds for snapshots (none once ``auto`` took no more).
            "snapshot_buffers_bytes": self._snapshot_bytes(),
            # Where the rest went: Pathways' devices up, the mesh and its step (compiled on a mesh's
            # first use), placing the state from memory (and the wait above), the checkpoint restore.
            "phase_seconds": {
                "devices": round(t_avail - t0, 4),
                "mesh": round(t_place - t_mesh, 4),
                "place": round(t_restore - t_place, 4),
                "restore": round(time.monotonic() - t_restore, 4),
            },
            # The recovery's phases as wall-clock marks (simjob.phases): the new mesh's program compiled
            # (none when this mesh's is kept from before), then the state on the devices, from where.
            "directive_t": directive_at,
            "program_ready_t": program_ready_at,
            # Seconds the resume spent on the program: a compile now, the rest of one started ahead
            # ("prepared"), or nothing ("kept" from an earlier mesh).
            "compile_seconds": round(t_place - t_mesh, 4),
            "program": program,
            "restored_t": restored_at,
            "restore_source": restore_source,
            "restore_bytes": nbytes_per_replica(self.state),
        }
        resumed(self.session, self.events, d, step, restored_from, t0, fields)
        return step

    # -- the loop ------------------------------------------------------------------

    def run(self) -> int:
        ns = self.ns
        self.events("start", {"slices": ns.slices, "steps": ns.steps, "pid": os.getpid()})
        step = self._apply(self.session.start(-1), 0)
        while step < ns.steps:
            tb = time.monotonic()
            d = self.session.step_boundary(step)
            if d is not None:
                step = self._apply(d, step)
                continue
            self._seen_lost |= self.runtime.apply(self.sim, self.slice_devices)
            ts = time.monotonic()
            self._slot_ended(tb)
            saved = self._snapshot(step)
            self._slot = (ts, saved, True)
            t0 = time.monotonic()
            x, y = self._batch(step, len(self.active))
            try:
                xs = self.jax.device_put(x, self.batch_sh)
                ys = self.jax.device_put(y, self.batch_sh)
                new_state, loss = self.step_fn(self.state, xs, ys)
                self.runtime.collective(self.active)
                loss_v = float(self.jax.block_until_ready(loss))
            except self.jax.errors.JaxRuntimeError as e:
                if not is_slice_down(e):
                    raise
                lost = sorted((self.runtime.lost_slices() & set(self.active)) | slices_named(e))
                # Their replicas are gone even if a replacement is up by the time the hold ends.
                self._seen_lost |= frozenset(lost)
                self.events("step_failed", {"step": step + 1, "slices": lost, "error": str(e)[:200]})
                new_state = loss = None  # the failed step's outputs: garbage, not to be held through the rebuild
                step = self._apply(self.session.slice_error(step, e, lost), step)
                continue
            self.state = new_state
            step += 1
            fields = end_step(self.session, step, t0, ns.step_seconds, self.active, self.slow, loss_v)
            committed = self.commits.poll()
            if committed is not None and self.interval.off:
                self._drop_snapshots(committed)
            self.events(
                "step",
                {
                    **fields,
                    # What the boundary before the step took: the hooks' check and the fault stand-in,
                    # then handing the state to the Snapshotter (its copy runs on beside the step).
                    "boundary_seconds": round(ts - tb, 4),
                    "snapshot": saved,
                    "snapshot_seconds": round(t0 - ts, 4),
                },
            )
            if step % ns.checkpoint_period == 0:
                host = self._gather(self.runtime.lost_slices())
                if host is not None:
                    self.manager.save(step, args=self.ocp.args.Composite(state=self.ocp.args.StandardSave(host)))
                    self.events("checkpoint_started", {"step": step})
                    self.commits.started(step)
                    if self._slot is not None:  # a slot with a checkpoint's copy is not counted
                        self._slot = (*self._slot[:2], False)
        self.manager.wait_until_finished()
        self.manager.reload()
        if step not in self.manager.all_steps():
            host = self._gather(self.runtime.lost_slices())
            if host is not None:
                self.manager.save(
                    step, args=self.ocp.args.Composite(state=self.ocp.args.StandardSave(host)), force=True
                )
                self.manager.wait_until_finished()
        self.commits.started(step)
        self.commits.poll()
        self.events("finished", {"step": step, "committed_steps": sorted(self.manager.all_steps())})
        self.session.finished(step)
        self.session.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
