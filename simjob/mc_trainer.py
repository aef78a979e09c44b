"""The example trainer's multi-controller mode (``python -m simjob.trainer --mode multi-controller``):
one JAX process per host, for ``elastic-sidecar demo --mode multi-controller``.

Every process runs the trainer with its own ``--process-id``; they join with
``jax.distributed.initialize`` on loopback and train one data-parallel MLP
over all processes' CPU devices with gloo CPU collectives, so a step needs
every process (a dead peer leaves the others blocked inside the step, as on
TPU hosts). Each process has its own link to the coordinator
(``process_index`` / ``process_count``); holds happen at the step the
coordinator names, flushes are collective Orbax saves into one checkpoint
directory, and an Abort ends the process with its exit code (42), from the
hooks' watchdog when the main thread is stuck in a collective.

Process 0 writes its events to ``--events`` (the harness reads its steps); the
others to ``--events`` with ``-p<index>`` before the suffix.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from typing import Any

from simjob.commits import PeriodicCommits
from simjob.slowdowns import SlowFile
from simjob.steps import EventLog, end_step, resumed
from simjob.trainer_numpy import init_state
from trainer_hooks import Directive, ElasticSession
from trainer_hooks.orbax_flush import OrbaxFlusher

LEADER_EXIT_DELAY = 0.5
"""Seconds process 0 waits before it exits after an abort (see :func:`leave`)."""


class McTrainer:
    def __init__(self, ns: argparse.Namespace, events: EventLog) -> None:
        import jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=ns.jax_coordinator,
            num_processes=ns.num_processes,
            process_id=ns.process_id,
            initialization_timeout=120,
        )
        import numpy as np
        import orbax.checkpoint as ocp
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        self.ns, self.events, self.jax, self.np, self.ocp = ns, events, jax, np, ocp
        self.mesh = Mesh(np.array(jax.devices()), ("data",))
        self.replicated = NamedSharding(self.mesh, P())
        self.batch_sh = NamedSharding(self.mesh, P("data", None))
        self.local_rows = ns.per_device_batch * len(jax.local_devices())
        self.manager = ocp.CheckpointManager(
            (ns.workdir / "checkpoints").resolve(),
            options=ocp.CheckpointManagerOptions(
                save_interval_steps=ns.checkpoint_period, max_to_keep=3, enable_async_checkpointing=True
            ),
        )
        self.state: Any = None
        self.slow = SlowFile(None)  # the demo's slow faults are single-controller only
        self.active: list[int] = []
        self.step_fn = self._build_step_fn()
        self.session: Any = (
            None
            if ns.no_sidecar
            else ElasticSession.connect(
                ns.sidecar,
                job=ns.job,
                total_steps=ns.steps,
                flush=OrbaxFlusher(self.manager, self._save_args),
                on_event=events,
                elastic_timeout_seconds=ns.elastic_timeout_seconds,
                process_index=jax.process_index(),
                process_count=jax.process_count(),
                host=ns.host_name or socket.gethostname(),
                abort_grace_seconds=ns.abort_grace_seconds,
            )
        )
        self.commits = PeriodicCommits(self.manager, self.session, events)

    def _init(self) -> dict[str, Any]:
        return init_state(self.ns)["params"]  # the single-controller trainer's parameters, without its momentum

    def _build_step_fn(self) -> Any:
        jax = self.jax
        jnp = jax.numpy

        def loss_fn(p: Any, x: Any, y: Any) -> Any:
            return jnp.mean((jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] - y) ** 2)

        def step(p: Any, x: Any, y: Any) -> Any:
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            return jax.tree_util.tree_map(lambda a, b: a - 0.05 * b, p, g), loss

        return jax.jit(
            step,
            in_shardings=(self.replicated, self.batch_sh, self.batch_sh),
            out_shardings=(self.replicated, self.replicated),
        )

    def _batch(self, step: int) -> tuple[Any, Any]:
        np, ns = self.np, self.ns
        rng = np.random.default_rng((ns.seed * 100_003 + step) * 1_000 + self.jax.process_index())
        teacher = np.random.default_rng(ns.seed + 7).standard_normal((ns.features, 1)).astype(np.float32)
        x = rng.standard_normal((self.local_rows, ns.features)).astype(np.float32)
        mk = self.jax.make_array_from_process_local_data
        return mk(self.batch_sh, x), mk(self.batch_sh, np.tanh(x @ teacher))

    def _save_args(self, step: int, down: frozenset[int]) -> tuple[Any, int]:
        nbytes = sum(int(x.nbytes) for x in self.jax.tree_util.tree_leaves(self.state))
        return self.ocp.args.Composite(state=self.ocp.args.StandardSave(self.state)), nbytes

    def _restore(self) -> tuple[Any, int, str]:
        step = self.manager.latest_step()
        if step is None:
            return self.jax.device_put(self._init(), self.replicated), 0, "fresh"
        abstract = self.jax.tree_util.tree_map(
            lambda x: self.jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.replicated), self._init()
        )
        out = self.manager.restore(step, args=self.ocp.args.Composite(state=self.ocp.args.StandardRestore(abstract)))
        return out["state"], int(step), "checkpoint"

    def _apply(self, d: Directive, step: int) -> int:
        t0 = time.monotonic()
        if d.source == "memory" and self.state is not None:
            restored_from = "memory"
        else:
            self.manager.wait_until_finished()
            self.state, step, restored_from = self._restore()
        self.active = list(d.active_slices)
        resumed(self.session, self.events, d, step, restored_from, t0, {"process": self.jax.process_index()})
        return step

    def _collective_failed(self, step: int, err: Exception) -> None:
        """A collective failed (a peer is gone): never exit 1 (JobSet would not restart); tell the
        sidecar and wait for its verdict, an Abort (42) for a multi-controller job."""
        self.events("step_failed", {"step": step + 1, "slices": [], "error": str(err)[:200]})
        self.session.slice_error(step, err, [])
        raise RuntimeError("the sidecar resumed a multi-controller job after a failed collective")

    def run(self) -> int:
        ns = self.ns
        self.events("start", {"steps": ns.steps, "pid": os.getpid(), "process": self.jax.process_index()})
        if self.session is None:
            self.state, step, restored_from = self._restore()
            self.events("resumed", {"generation": 0, "from_step": step, "slices": [], "restored_from": restored_from})
        else:
            step = self._apply(self.session.start(-1), 0)
        while step < ns.steps:
            d = None if self.session is None else self.session.step_boundary(step)
            if d is not None:
                step = self._apply(d, step)
                continue
            t0 = time.monotonic()
            try:
                x, y = self._batch(step)
                self.state, loss = self.step_fn(self.state, x, y)
                loss_v = float(self.jax.block_until_ready(loss))
            except Exception as e:  # noqa: BLE001 - a collective whose peer died (gloo: "Connection closed")
                if self.session is None:
                    raise
                self._collective_failed(step, e)
            step += 1
            fields = end_step(self.session, step, t0, ns.step_seconds, self.active, self.slow, loss_v)
            self.commits.poll()
            self.events("step", fields)
            if step % ns.checkpoint_period == 0:
                try:
                    self.manager.save(step, args=self.ocp.args.Composite(state=self.ocp.args.StandardSave(self.state)))
                except Exception as e:  # noqa: BLE001 - the save's own collectives
                    if self.session is None:
                        raise
                    self._collective_failed(step, e)
                self.events("checkpoint_started", {"step": step})
                self.commits.started(step)
        self.manager.wait_until_finished()
        if step not in self.manager.all_steps():
            self.manager.save(
                step, args=self.ocp.args.Composite(state=self.ocp.args.StandardSave(self.state)), force=True
            )
            self.manager.wait_until_finished()
        self.commits.started(step)
        self.commits.poll()
        self.events("finished", {"step": step, "committed_steps": sorted(self.manager.all_steps())})
        if self.session is not None:
            self.session.finished(step)
            self.session.close()
        return 0


def leave(code: int, process_id: int) -> None:
    """Ends this process with ``code`` at once.

    jax.distributed's exit-time shutdown waits for every peer at a barrier: a peer that is gone
    would keep this process from exiting, so it leaves without it. Process 0 hosts the
    coordination service: it goes last, or JAX ends the others with SIGABRT instead of 42."""
    if code != 0 and process_id == 0:
        time.sleep(LEADER_EXIT_DELAY)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
