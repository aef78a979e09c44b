"""Host link: what a snapshot's copy, or a compile, costs the training steps beside it.

``python -m bench.host_link [--state-gib 4] [--runs 5] [--beside copy|compile] [--json PATH]``, on the
JAX backend present (a TPU where there is one). ``copy``: the seconds to put the whole state in
``pinned_host`` memory as Orbax's Pathways ``Snapshotter`` does (``_to_snapshot_state``: one
``jax.device_put`` a leaf; ``--via snapshotter`` calls ``Snapshotter.save`` itself). ``slowdown``: a
window of steps timed alone and beside one copy, in alternating order; the difference is ``c`` in
docs/maxtext.md. ``--beside compile`` puts beside the steps what the MaxText hook's prepare does
(trainer_hooks/maxtext/prepare.py): a thread compiling a new program. Steps are ``matmul``
(compute-bound) or ``memory`` (bound by the memory bandwidth the copy shares).

Imports only the standard library, NumPy, JAX and :mod:`bench.common` (and Orbax with ``--via
snapshotter``), so it runs on a machine where the project is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import log, positive

STEP_KINDS = ("matmul", "memory")


def _kinds(v: str) -> list[str]:
    kinds = [k.strip() for k in v.split(",") if k.strip()]
    if not kinds or any(k not in STEP_KINDS for k in kinds):
        raise argparse.ArgumentTypeError(f"{v!r}: expected some of {', '.join(STEP_KINDS)}")
    return kinds


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench.host_link", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--state-gib", type=positive(float), default=4.0, help="state size in GiB (default 4)")
    ap.add_argument("--leaves", type=positive(int), default=16, help="state leaves, equal sizes (default 16)")
    ap.add_argument("--runs", type=positive(int), default=5, help="interleaved pairs per step kind (default 5)")
    ap.add_argument(
        "--step-seconds", type=positive(float), default=0.2, help="aim for steps of about this long (default 0.2)"
    )
    ap.add_argument("--step-kinds", type=_kinds, default=",".join(STEP_KINDS), help="comma list (default both)")
    ap.add_argument("--via", choices=("device_put", "snapshotter"), default="device_put")
    ap.add_argument("--beside", choices=("copy", "compile"), default="copy", help="what runs beside the steps")
    ap.add_argument(
        "--compile-layers", type=positive(int), default=48, help="--beside compile: the program's layers (48)"
    )
    ap.add_argument("--compile-width", type=positive(int), default=2048, help="--beside compile: their width (2048)")
    ap.add_argument("--git-sha", default=None, help="the commit the run's files are (when .git is not there)")
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    return ap


class Copier:
    """Issues a snapshot copy of ``state`` and waits for it, holding the newest finished one."""

    def __init__(self, via: str, state: dict[str, Any]):
        import jax

        self.held: Any = None
        self.pending: Any = None
        self.retired: Any = None
        self.snapshotter: Any = None
        self.targets = {k: v.sharding.with_memory_kind("pinned_host") for k, v in state.items()}
        if via == "snapshotter":
            from orbax.checkpoint.experimental.v1.training import pathways

            self.snapshotter = pathways.Snapshotter(replica_axis_index=0)
        self._jax = jax

    def issue(self, state: dict[str, Any], step: int) -> None:
        if self.snapshotter is not None:
            self.snapshotter.save(step, state)
        else:
            self.pending = {k: self._jax.device_put(v, self.targets[k]) for k, v in state.items()}

    def wait(self) -> None:
        """Until the copy is in pinned_host memory. The previous copy is retired, not yet freed."""
        if self.snapshotter is not None:
            self.snapshotter.join()
            return
        self._jax.block_until_ready(self.pending)
        self.retired, self.held, self.pending = self.held, self.pending, None

    def release(self) -> None:
        """Free the retired copy, timed apart: the Snapshotter frees it on its own thread, where freeing
        pinned memory overlaps the steps; on the caller's thread it would read as the copy's cost."""
        self.retired = None


class Compiler:
    """Compiles a new program in a thread of its own, as the hook's prepare does; ``wait`` joins it."""

    def __init__(self, layers: int, width: int):
        import threading

        import jax
        import jax.numpy as jnp

        self._threading, self._jax, self._jnp = threading, jax, jnp
        self.layers, self.width = layers, width
        self.thread: Any = None
        self.runs = 0

    def _compile(self, salt: float) -> None:
        jax, jnp = self._jax, self._jnp
        dtype = jnp.bfloat16 if jax.default_backend() == "tpu" else jnp.float32

        def loss(ws: list[Any], x: Any) -> Any:
            for i, w in enumerate(ws):  # unrolled: a program with many ops, as a transformer's is
                x = jnp.tanh(x @ w) * (1.0 + salt * (i + 1))
            return jnp.mean(x.astype(jnp.float32) ** 2)

        def train_step(ws: list[Any], x: Any) -> Any:
            grads = jax.grad(loss)(ws, x)
            return [w - 1e-3 * g for w, g in zip(ws, grads, strict=True)]

        w = jax.ShapeDtypeStruct((self.width, self.width), dtype)
        x = jax.ShapeDtypeStruct((256, self.width), dtype)
        jax.jit(train_step).lower([w] * self.layers, x).compile()

    def issue(self, state: dict[str, Any], step: int) -> None:
        self.runs += 1  # a new constant in the program: nothing comes from a compile cache
        self.thread = self._threading.Thread(target=self._compile, args=(self.runs * 1e-7,), daemon=True)
        self.thread.start()

    def wait(self) -> None:
        self.thread.join()

    def release(self) -> None:
        pass


def make_state(gib: float, leaves: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.local_devices()
    # The replica axis first, as the Snapshotter's replica_axis_index=0 reads it; one replica here.
    mesh = Mesh(np.array(devices).reshape(1, len(devices)), ("replica", "fsdp"))
    per_leaf = int(gib * (1 << 30)) // leaves // 4
    cols = 1024
    rows = max(len(devices), per_leaf // cols // len(devices) * len(devices))
    sharding = NamedSharding(mesh, PartitionSpec("fsdp", None))
    state = {}
    for i in range(leaves):
        make = jax.jit(lambda k: jax.random.normal(k, (rows, cols), jnp.float32), out_shardings=sharding)
        state[f"leaf{i:02d}"] = make(jax.random.key(i))
    jax.block_until_ready(state)
    return state


def make_step(kind: str, target_s: float) -> tuple[Any, Any, dict[str, Any]]:
    """A jitted step of ``kind`` and its operand, sized to take about ``target_s`` seconds."""
    import jax
    import jax.numpy as jnp

    on_tpu = jax.default_backend() == "tpu"
    if kind == "matmul":
        n = 8192 if on_tpu else 512
        dtype = jnp.bfloat16 if on_tpu else jnp.float32
        x = jax.random.normal(jax.random.key(100), (n, n), dtype) / n**0.5
        w = jax.random.normal(jax.random.key(101), (n, n), dtype) / n**0.5

        def update(y: Any) -> Any:
            return jnp.tanh(y @ w)

        info: dict[str, Any] = {"n": n, "dtype": str(jnp.dtype(dtype))}
    else:
        n = (1 << 28) if on_tpu else (1 << 24)  # float32 elements: 1 GiB on a TPU, 64 MiB on a CPU
        x = jnp.ones((n,), jnp.float32)

        def update(y: Any) -> Any:
            return y * 0.999 + 0.001

        info = {"elements": n, "dtype": "float32"}

    def body(reps: int) -> Any:
        return jax.jit(lambda a: jax.lax.fori_loop(0, reps, lambda _, y: update(y), a))

    one = body(1)
    jax.block_until_ready(one(x))
    t0 = time.perf_counter()
    for _ in range(3):
        jax.block_until_ready(one(x))
    per = (time.perf_counter() - t0) / 3
    reps = max(1, round(target_s / per))
    step = body(reps)
    jax.block_until_ready(step(x))
    info["reps"] = reps
    return step, x, info


def timed_window(
    step: Any, x: Any, steps: int, copier: Copier | Compiler | None, state: dict[str, Any], label: int
) -> float:
    import jax

    t0 = time.perf_counter()
    if copier is not None:
        copier.issue(state, label)
    y = x
    for _ in range(steps):
        y = jax.block_until_ready(step(y))
    if copier is not None:
        copier.wait()
    return time.perf_counter() - t0


def measure(ns: argparse.Namespace) -> dict[str, Any]:
    import jax

    log(f"backend {jax.default_backend()}, {len(jax.local_devices())} devices; making {ns.state_gib} GiB of state")
    state = make_state(ns.state_gib, ns.leaves)
    state_bytes = sum(v.nbytes for v in state.values())
    copier: Copier | Compiler
    if ns.beside == "compile":
        copier = Compiler(ns.compile_layers, ns.compile_width)
        log(f"compiling a {ns.compile_layers}-layer train step of width {ns.compile_width} in a thread")
    else:
        copier = Copier(ns.via, state)
        log(f"state ready ({state_bytes} bytes); copying it to pinned_host via {ns.via}")

    copies: list[float] = []
    releases: list[float] = []
    for r in range(ns.runs + 1):  # the first copy allocates the pinned buffers: kept apart
        t0 = time.perf_counter()
        copier.issue(state, r)
        copier.wait()
        copies.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        copier.release()
        releases.append(time.perf_counter() - t0)
        log(f"{ns.beside} {r}: {copies[-1]:.4f} s, then {releases[-1]:.4f} s to free the one before")
    first_copy, copies = copies[0], copies[1:]
    copy_s = statistics.median(copies)

    rows = []
    for kind in ns.step_kinds:
        log(f"{kind} step: sizing it")
        step, x, info = make_step(kind, ns.step_seconds)
        alone = []
        for _ in range(5):
            t0 = time.perf_counter()
            jax.block_until_ready(step(x))
            alone.append(time.perf_counter() - t0)
        step_s = statistics.median(alone)
        window = max(5, int(3 * copy_s / step_s) + 1)  # at least three copies long
        pairs = []
        for r in range(ns.runs):
            order = (False, True) if r % 2 == 0 else (True, False)
            t = {}
            for with_copy in order:
                t[with_copy] = timed_window(step, x, window, copier if with_copy else None, state, 1000 + r)
                copier.release()
            pairs.append({"without_s": round(t[False], 5), "with_s": round(t[True], 5), "copy_first": order[0]})
            log(f"{kind} pair {r}: {window} steps {t[False]:.4f} s alone, {t[True]:.4f} s beside a {ns.beside}")
        slow = [p["with_s"] - p["without_s"] for p in pairs]
        c = statistics.median(slow)
        rows.append(
            {
                "step_kind": kind,
                "step": info,
                "step_seconds": round(step_s, 5),
                "window_steps": window,
                "slowdown_seconds_median": round(c, 5),
                "slowdown_seconds_min": round(min(slow), 5),
                "slowdown_seconds_max": round(max(slow), 5),
                "slowdown_over_step_median": round(c / step_s, 4),
                "slowdown_over_copy_median": round(c / copy_s, 4),
                "runs": len(pairs),
                "pairs": pairs,
            }
        )
        del step, x

    dev = jax.local_devices()[0]
    return {
        "name": "host_link",
        "git_sha": ns.git_sha,
        "machine": {
            "backend": jax.default_backend(),
            "device_kind": getattr(dev, "device_kind", None),
            "devices": len(jax.local_devices()),
            "jax": jax.__version__,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "config": {
            "state_gib": ns.state_gib,
            "leaves": ns.leaves,
            "runs": ns.runs,
            "step_seconds_target": ns.step_seconds,
            "via": ns.via,
            "beside": ns.beside,
            "compile_layers": ns.compile_layers,
            "compile_width": ns.compile_width,
            "argv": sys.argv[1:],
        },
        "state_bytes": state_bytes,
        "copy": {
            "first_copy_seconds": round(first_copy, 5),
            "seconds_median": round(copy_s, 5),
            "seconds_min": round(min(copies), 5),
            "seconds_max": round(max(copies), 5),
            "gb_per_s_median": round(state_bytes / copy_s / 1e9, 3),
            "runs": len(copies),
            "seconds": [round(s, 5) for s in copies],
            "free_previous_seconds": [round(s, 5) for s in releases[1:]],
        },
        "results": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    out = measure(ns)
    text = json.dumps(out, indent=1)
    if ns.json is not None:
        ns.json.write_text(text + "\n")
    c = out["copy"]
    if ns.beside == "compile":  # a compile moves no state: no rate
        what, rate = f"a {ns.compile_layers}-layer train step compiled in a thread", ""
    else:
        what = f"{out['state_bytes'] / 2**30:.2f} GiB to pinned_host via {ns.via}"
        rate = f"{c['gb_per_s_median']} GB/s, "
    print(
        f"{out['machine']['backend']} ({out['machine']['device_kind']}): {what} in {c['seconds_median']:.3f} s "
        f"median ({rate}{c['runs']} runs; first {c['first_copy_seconds']:.3f} s)"
    )
    for r in out["results"]:
        print(
            f"  {r['step_kind']} step {r['step_seconds']:.4f} s: one {ns.beside} beside {r['window_steps']} steps adds "
            f"{r['slowdown_seconds_median']:.4f} s median [{r['slowdown_seconds_min']:.4f}, "
            f"{r['slowdown_seconds_max']:.4f}] = {r['slowdown_over_step_median']:.3f} of a step, "
            f"{r['slowdown_over_copy_median']:.3f} of the {ns.beside} ({r['runs']} pairs)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
