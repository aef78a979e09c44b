"""The example trainer's NumPy backend (``python -m simjob.trainer --backend numpy``): no JAX, no Orbax.

The same MLP, training loop, hooks, event log and exit codes as the JAX backend, on NumPy arrays in
one process. Every slice of the mesh holds a replica of the state, so the state stays in memory
while one slice of the mesh is up. A checkpoint is a step directory holding ``state.npz``, written
under a temporary name and renamed once complete (as Orbax commits), so a step directory that
exists is committed. Slice loss reaches it as it reaches the JAX backend: the stand-in Pathways
runtime's watchers before a step, and a health check of every host of the step's slices (the step's
collective) after it. Not exercised here: jit and its compile, sharding, Orbax, donation, snapshots.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from simjob.slowdowns import SlowFile
from simjob.steps import end_step, resumed
from standins.pathways_runtime import PathwaysRuntime
from trainer_hooks import Directive, ElasticSession
from trainer_hooks.session import FlushResult

KEEP_CHECKPOINTS = 3
"""Step directories kept, the newest (the JAX backend's Orbax ``max_to_keep``)."""


class SliceDown(RuntimeError):
    """A step touched a lost slice; the message carries the status Pathways would report (DATA_LOSS, ...)."""


def slices_named(err: BaseException) -> set[int]:
    return {int(m) for m in re.findall(r"slice (\d+)", str(err))}


def _flat(state: dict[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _nest(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in flat.items():
        *path, leaf = key.split(".")
        node = out
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


class NpzCheckpoints:
    """Step directories under ``root``: ``<step>/state.npz``, renamed into place once written and synced."""

    def __init__(self, root: Path, keep: int = KEEP_CHECKPOINTS) -> None:
        self.root = root
        self.keep = keep
        root.mkdir(parents=True, exist_ok=True)

    def steps(self) -> list[int]:
        return sorted(int(p.name) for p in self.root.iterdir() if p.name.isdigit())

    def latest(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, step: int, state: dict[str, Any]) -> int:
        """Commit ``state`` as ``step`` (a step already committed is kept as it is); returns the bytes written."""
        final = self.root / str(step)
        if final.exists():
            return 0
        tmp = self.root / f"{step}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        flat = _flat(state)
        with open(tmp / "state.npz", "wb") as f:
            np.savez(f, **flat)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)  # atomic on POSIX: the step appears whole or not at all
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        for old in self.steps()[: -self.keep]:
            shutil.rmtree(self.root / str(old), ignore_errors=True)
        return sum(int(a.nbytes) for a in flat.values())

    def load(self, step: int) -> dict[str, Any]:
        with np.load(self.root / str(step) / "state.npz") as z:
            return _nest({k: z[k] for k in z.files})


def init_state(ns: argparse.Namespace) -> dict[str, Any]:
    """The JAX backend's initial state (the same seed, the same numbers)."""
    rng = np.random.default_rng(ns.seed)
    f, h = ns.features, ns.hidden
    p = {
        "w1": (rng.standard_normal((f, h)) / np.sqrt(f)).astype(np.float32),
        "b1": np.zeros((h,), np.float32),
        "w2": (rng.standard_normal((h, 1)) / np.sqrt(h)).astype(np.float32),
    }
    state: dict[str, Any] = {"params": p, "momentum": {k: np.zeros_like(v) for k, v in p.items()}}
    if ns.ballast_mib:
        state["ballast"] = rng.random((ns.ballast_mib * 256, 1024), dtype=np.float32)
    return state


def batch(ns: argparse.Namespace, step: int, n_active: int) -> tuple[np.ndarray, np.ndarray]:
    """Step ``step``'s batch on ``n_active`` slices (the JAX backend's)."""
    rng = np.random.default_rng(ns.seed * 100_003 + step)
    teacher = np.random.default_rng(ns.seed + 7).standard_normal((ns.features, 1)).astype(np.float32)
    x = rng.standard_normal((ns.per_slice_batch * n_active, ns.features)).astype(np.float32)
    return x, np.tanh(x @ teacher)


def train_step(state: dict[str, Any], x: np.ndarray, y: np.ndarray, lr: float) -> tuple[dict[str, Any], float]:
    """The JAX backend's step (SGD with momentum on mean squared error), its gradient written out; a new
    state, the old one left as it was (a step that fails leaves the state it started from)."""
    p = state["params"]
    z = x @ p["w1"] + p["b1"]
    hdn = np.maximum(z, 0.0)
    diff = hdn @ p["w2"] - y
    g_out = 2.0 * diff / diff.size
    g_z = (g_out @ p["w2"].T) * (z > 0)
    grads = {"w1": x.T @ g_z, "b1": g_z.sum(axis=0), "w2": hdn.T @ g_out}
    mom = {k: 0.9 * state["momentum"][k] + grads[k] for k in p}
    new: dict[str, Any] = {"params": {k: p[k] - lr * mom[k] for k in p}, "momentum": mom}
    if "ballast" in state:
        new["ballast"] = state["ballast"] * 0.999 + 0.001
    return new, float(np.mean(diff**2))


class NumpyTrainer:
    """:class:`simjob.trainer.Trainer`'s loop on NumPy; ``run()`` returns 0 or raises ``AbortTraining``."""

    def __init__(self, ns: argparse.Namespace, events: Any) -> None:
        self.ns, self.events = ns, events
        self.slices = tuple(range(ns.slices))
        self.targets: dict[int, list[str]] = {s: [] for s in self.slices}
        for spec in sorted(ns.pathways):
            key, _, addr = spec.partition("=")
            self.targets[int(key.partition(".")[0])].append(addr)
        self.runtime = PathwaysRuntime({s: t for s, t in self.targets.items() if t}).start()
        self.store = NpzCheckpoints((ns.workdir / "checkpoints").resolve())
        self.state: dict[str, Any] | None = None
        self.active: tuple[int, ...] = ()
        self._seen_lost: frozenset[int] = frozenset()
        self.slow = SlowFile(getattr(ns, "slow_file", None))
        self.lr = 0.05 if ns.hidden <= 256 else 0.1 / ns.hidden  # the JAX backend's step size
        self.session = ElasticSession.connect(
            ns.sidecar,
            job=ns.job,
            total_steps=ns.steps,
            flush=self._flush,
            snapshot=self._keep_in_memory,
            prepare=lambda slices: None,  # nothing to compile ahead
            on_event=events,
            elastic_timeout_seconds=ns.elastic_timeout_seconds,
        )

    def close(self) -> None:
        self.runtime.stop()

    # -- state movement ----------------------------------------------------------------

    def _readable(self, exclude: frozenset[int]) -> bool:
        """Whether a slice of the mesh not in ``exclude`` holds the state (each slice holds a replica)."""
        return self.state is not None and any(s not in exclude for s in self.active)

    def _flush(self, step: int, down_slices: frozenset[int]) -> FlushResult:
        """The session's flusher: commit ``step`` from a surviving replica."""
        if step in self.store.steps():
            return FlushResult(step, 0)
        if not self._readable(down_slices | self.runtime.lost_slices() | self._seen_lost):
            raise RuntimeError(f"cannot flush step {step}: no surviving replica of the state")
        assert self.state is not None
        return FlushResult(step, self.store.save(step, self.state))

    def _keep_in_memory(self, step: int, leaving: frozenset[int]) -> str:
        """The session's snapshot hook: the live state stays on the slices not ``leaving``."""
        if self.state is None:
            return "no state in memory"
        if not any(s not in leaving for s in self.active):
            return "no slice of the mesh remains"
        self.events("kept_in_memory", {"step": step, "leaving": sorted(leaving)})
        return ""

    def _save(self, step: int) -> None:
        """A periodic checkpoint, committed before this returns (the JAX backend's is asynchronous)."""
        if not self._readable(self.runtime.lost_slices()):
            return
        assert self.state is not None
        self.store.save(step, self.state)
        self.events("checkpoint_started", {"step": step})
        self.events("checkpoint_committed", {"step": step})
        self.session.committed(step)

    def _apply(self, d: Directive, step: int) -> int:
        """Run on ``d.active_slices`` from memory when a slice of the old mesh survives, else the newest
        checkpoint (or the start); returns the step to continue from."""
        t0 = time.monotonic()
        directive_at = time.time()
        if not self.runtime.wait_available(d.active_slices, timeout=10.0):  # Pathways hands out live devices only
            missing = sorted(set(d.active_slices) - self.runtime.available_slices())
            err = SliceDown(f"DATA_LOSS: slices {missing} have no Pathways worker")
            return self._apply(self.session.slice_error(step, err, missing), step)
        t_avail = time.monotonic()
        exclude = d.down_slices | self.runtime.lost_slices() | self._seen_lost
        self._seen_lost = frozenset()
        ready_at = time.time()
        if d.source == "memory" and self._readable(exclude):
            restored_from, restore_source = "memory", "live"
        else:
            latest = self.store.latest()
            self.state = init_state(self.ns) if latest is None else self.store.load(latest)
            step = 0 if latest is None else latest
            restored_from = restore_source = "fresh" if latest is None else "checkpoint"
        t_restore = time.monotonic()
        assert self.state is not None
        self.active = d.active_slices
        fields = {
            "checkpoint_wait_seconds": 0.0,
            "snapshot_buffers_bytes": 0,
            "phase_seconds": {
                "devices": round(t_avail - t0, 4),
                "mesh": 0.0,
                "place": 0.0 if restored_from != "memory" else round(t_restore - t_avail, 4),
                "restore": 0.0 if restored_from == "memory" else round(t_restore - t_avail, 4),
            },
            "directive_t": directive_at,
            "program_ready_t": ready_at,
            "compile_seconds": 0.0,
            "program": "none",
            "restored_t": time.time(),
            "restore_source": restore_source,
            "restore_bytes": sum(int(a.nbytes) for a in _flat(self.state).values()),
        }
        resumed(self.session, self.events, d, step, restored_from, t0, fields)
        return step

    # -- the loop: simjob.trainer.Trainer.run's, step for step -------------------------------

    def run(self) -> int:
        ns = self.ns
        self.events("start", {"slices": ns.slices, "steps": ns.steps, "pid": os.getpid(), "backend": "numpy"})
        step = self._apply(self.session.start(-1), 0)
        while step < ns.steps:
            tb = time.monotonic()
            d = self.session.step_boundary(step)
            if d is not None:
                step = self._apply(d, step)
                continue
            lost_now = self.runtime.lost_slices()
            self._seen_lost |= lost_now
            t0 = time.monotonic()
            x, y = batch(ns, step, len(self.active))
            try:
                down = sorted(lost_now & set(self.active))
                if down:  # the step touches a lost slice's devices
                    raise SliceDown(f"DATA_LOSS: slice {down[0]}'s devices are gone")
                assert self.state is not None
                new_state, loss = train_step(self.state, x, y, self.lr)
                self.runtime.collective(self.active, SliceDown)
            except SliceDown as e:
                lost = sorted((self.runtime.lost_slices() & set(self.active)) | slices_named(e))
                self._seen_lost |= frozenset(lost)
                self.events("step_failed", {"step": step + 1, "slices": lost, "error": str(e)[:200]})
                step = self._apply(self.session.slice_error(step, e, lost), step)
                continue
            self.state = new_state
            step += 1
            fields = end_step(self.session, step, t0, ns.step_seconds, self.active, self.slow, loss)
            self.events(
                "step",
                {**fields, "boundary_seconds": round(t0 - tb, 4), "snapshot": False, "snapshot_seconds": 0.0},
            )
            if step % ns.checkpoint_period == 0:
                self._save(step)
        if step not in self.store.steps():
            self._save(step)
        self.events("finished", {"step": step, "committed_steps": self.store.steps()})
        self.session.finished(step)
        self.session.close()
        return 0
