"""Host link: what one in-memory snapshot costs on the accelerator it runs on.

``python -m bench.host_link [--state-gib 4] [--runs 5] [--json PATH]``

The MaxText hook's snapshots go through Orbax's Pathways ``Snapshotter``, whose synchronous part
is one ``jax.device_put`` of each state leaf to the same sharding with memory kind
``pinned_host`` (orbax-checkpoint 0.12.8, ``experimental/v1/_src/training/pathways/
snapshotter.py``: ``_to_snapshot_state``); a thread of its own then waits for the copies. On a
TPU that copy runs over the host link, beside the step's compute. docs/maxtext.md sizes the copy
for Llama-3-8B and 70B on paper with an assumed per-chip link rate; this measures, on whatever
JAX backend it runs on (a TPU where one is present, else the CPU):

* ``copy``: the seconds to put the whole state in ``pinned_host`` memory and wait for it, and the
  rate that gives (bytes / seconds; the previous copy is still held meanwhile, as the Snapshotter
  holds its newest snapshot until the next one completes);
* ``slowdown``: the seconds one copy adds to the steps it runs beside. Each run times a window of
  ``window_steps`` steps twice, back to back in an order that alternates between runs: once
  alone, once with a copy issued just before the first step (the window is sized to outlast
  the copy, and its end also waits for the copy). The copy before it is freed after the window,
  untimed (``free_previous_seconds`` gives what that took): the Snapshotter frees it on its own
  thread. The difference is ``c`` in docs/maxtext.md,
  the slowdown one snapshot costs; ``c`` over one step's seconds is what the hook's ``auto``
  interval weighs.

Two kinds of step bracket what a training step does to the chip's memory while the copy reads
it: ``matmul`` (a chain of square matrix products, bfloat16 on a TPU: compute-bound) and
``memory`` (an element-wise update of a large array: bound by the chip's memory bandwidth, which
the copy's reads share).

With ``--beside compile`` the work beside the steps is not a copy but what the MaxText hook's prepare
does ahead of a drain (trainer_hooks/maxtext/prepare.py): a thread of the same process compiling
another program (a ``--compile-layers``-layer MLP train step, new for each run so nothing comes
from a cache). ``compile`` gives its seconds alone, ``slowdown`` what it costs the steps beside it:
on a TPU host the compiler's CPU work competes only with the step's dispatch.

With ``--via snapshotter`` the copy is Orbax's ``Snapshotter.save`` itself (its queue of one,
its thread), waited for with its ``join``; it needs orbax-checkpoint and pathwaysutils. The
default, ``device_put``, is the same call the Snapshotter makes, and needs only JAX.

Imports only the standard library, NumPy, JAX and :mod:`bench.common` (standard library only at
import; and Orbax with ``--via snapshotter``), so it runs on a machine where the project is not
installed.
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

from bench.common import log

STEP_KINDS = ("matmul", "memory")


def _positive(kind: type) -> Any:
    def parse(v: str) -> Any:
        try:
            x = kind(v)
        except ValueError:
            x = 0
        if x <= 0:
            raise argparse.ArgumentTypeError(f"{v!r}: expected a number above 0")
        return x

    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench.host_link", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--state-gib", type=_positive(float), default=4.0, help="state size in GiB (default 4)")
    ap.add_argument("--leaves", type=_positive(int), default=16, help="state leaves, equal sizes (default 16)")
    ap.add_argument("--runs", type=_positive(int), default=5, help="interleaved pairs per step kind (default 5)")
    ap.add_argument(
        "--step-seconds", type=_positive(float), default=0.2, help="aim for steps of about this long (default 0.2)"
    )
    ap.add_argument(
        "--step-kinds",
        default=",".join(STEP_KINDS),
        help=f"comma-separated, of {', '.join(STEP_KINDS)} (default both)",
    )
    ap.add_argument("--via", choices=("device_put", "snapshotter"), default="device_put")
    ap.add_argument("--beside", choices=("copy", "compile"), default="copy", help="what runs beside the steps")
    ap.add_argument(
        "--compile-layers", type=_positive(int), default=48, help="--beside compile: the program's layers (48)"
    )
    ap.add_argument("--compile-width", type=_positive(int), default=2048, help="--beside compile: their width (2048)")
    ap.add_argument("--git-sha", default=None, help="the commit the run's files are (when .git is not there)")
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    return ap


def _kinds(v: str) -> list[str]:
    kinds = [k.strip() for k in v.split(",") if k.strip()]
    bad = [k for k in kinds if k not in STEP_KINDS]
    if bad or not kinds:
        raise SystemExit(f"--step-kinds {v!r}: expected some of {', '.join(STEP_KINDS)}")
    return kinds


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
        """Free the retired copy. Timed apart: the Snapshotter frees it on its own thread (where freeing
        pinned memory overlaps the steps), and freeing 1 GiB on the caller's thread took about 0.5 s on
        the TPU machine this ran on, which would read as the copy's cost."""
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

    kinds = _kinds(ns.step_kinds)
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
    for kind in kinds:
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
    _kinds(ns.step_kinds)
    out = measure(ns)
    text = json.dumps(out, indent=1)
    if ns.json is not None:
        ns.json.write_text(text + "\n")
    c = out["copy"]
    what = (
        f"a {ns.compile_layers}-layer train step compiled in a thread"
        if ns.beside == "compile"
        else f"{out['state_bytes'] / 2**30:.2f} GiB to pinned_host via {ns.via}"
    )
    print(
        f"{out['machine']['backend']} ({out['machine']['device_kind']}): {what} in {c['seconds_median']:.3f} s "
        f"median ({c['gb_per_s_median']} GB/s of state, {c['runs']} runs; first {c['first_copy_seconds']:.3f} s)"
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
