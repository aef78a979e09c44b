"""Flush: an emergency Orbax flush against a raw write + fsync of the same bytes.

The state is a dict of float32 JAX arrays on the device (random, so nothing
compresses away; the sizes and leaf count are in the result's config). Every
method starts from the device and its time includes the device-to-host copy
(a real copy). Methods:

* ``raw``: copy to host, write each leaf to a file, fsync each file and the
  directory;
* ``orbax_zstd``: :class:`trainer_hooks.orbax_flush.OrbaxFlusher` over a real
  ``orbax.checkpoint.CheckpointManager`` with async checkpointing on (the
  trainer's configuration, Orbax's default compressed writer), handed the JAX
  arrays as a trainer hands them (Orbax copies them to the host itself): wait
  for any save in flight, ``save(force=True)``, ``wait_until_finished()``,
  re-read the committed steps;
* ``orbax_uncompressed``: the same with
  :func:`trainer_hooks.orbax_flush.uncompressed_item_handlers`.

Runs are interleaved: run r does all three, in an order rotated by r, so drift
and cache effects hit every method alike; each method's fraction of raw
throughput is taken per run (raw time / its time) and summarised over runs.

Also the per-call cost of :meth:`trainer_hooks.ElasticSession.step_boundary`
with nothing pending (and of ``report_step``), timed in a loop.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

from bench.common import log, median, rnd, spread

NAME = "flush"
MiB = 2**20
LEAVES = 8


def make_state(nbytes: int, seed: int = 0) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    per = nbytes // LEAVES // 4
    return {f"layer_{i}": rng.random(per, dtype=np.float32) for i in range(LEAVES)}


def raw_write(state: dict[str, Any], directory: Path) -> float:
    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for k, arr in state.items():
        fd = os.open(directory / f"{k}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            mv = memoryview(arr).cast("B")
            off = 0
            while off < len(mv):
                off += os.write(fd, mv[off : off + 64 * MiB])
            os.fsync(fd)
        finally:
            os.close(fd)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return time.perf_counter() - t0


def step_boundary_cost(calls: int) -> dict[str, Any]:
    """Microseconds per step_boundary() with nothing pending, and per report_step()."""
    from protos.elastic_sidecar.v1 import trainer_pb2
    from trainer_hooks import ElasticSession
    from trainer_hooks.link import SidecarLink

    link = SidecarLink("127.0.0.1:1", lambda: trainer_pb2.TrainerHello())  # never started: nothing arrives
    session = ElasticSession(link)
    sb = session.step_boundary
    batches = [timeit.timeit(lambda: sb(7), number=calls) / calls * 1e6 for _ in range(5)]
    rs = session.report_step
    report = [
        timeit.timeit(lambda: rs(7, 0.05), number=max(1000, calls // 20)) / max(1000, calls // 20) * 1e6
        for _ in range(3)
    ]
    return {
        "step_boundary_us": rnd(median(batches), 4),
        "step_boundary_us_batches": [rnd(b, 4) for b in batches],
        "report_step_us": rnd(median(report), 3),
        "calls_per_batch": calls,
    }


METHODS = ("raw", "orbax_zstd", "orbax_uncompressed")


def device_state(nbytes: int, seed: int = 0) -> dict[str, Any]:
    """The state as the trainer holds it: JAX arrays on a device (random float32, so nothing compresses away)."""
    import jax

    return {k: jax.device_put(v) for k, v in make_state(nbytes, seed).items()}


def to_host(state: dict[str, Any]) -> dict[str, Any]:
    """The device-to-host copy a flush starts with (a real copy: on CPU ``np.asarray`` could alias)."""
    import numpy as np

    return {k: np.array(v, copy=True) for k, v in state.items()}


def one_flush(method: str, state: dict[str, Any], root: Path, step: int, managers: dict[str, Any]) -> float:
    """Seconds for one flush of ``state`` (on device) by ``method``, device-to-host copy included."""
    if method == "raw":
        d = root / f"raw-{step}"
        t0 = time.perf_counter()
        raw_write(to_host(state), d)
        dt = time.perf_counter() - t0
        shutil.rmtree(d, ignore_errors=True)
        return dt
    flusher = managers[method]
    t0 = time.perf_counter()
    res = flusher(step, frozenset())
    dt = time.perf_counter() - t0
    assert res.committed_step == step, res
    return dt


def make_flusher(method: str, ckdir: Path, holder: dict[str, Any]) -> Any:
    """An OrbaxFlusher whose ``make_args`` hands Orbax ``holder["state"]``, the JAX arrays on the device, as
    the trainers do (``simjob.mc_trainer``, MaxText's checkpoint manager): Orbax makes the
    device-to-host copy itself, inside the timed flush. (Copying to NumPy first, as this bench did
    up to 4fa2252, adds a second copy and Orbax's slower NumPy path: a trainer never flushes that way.)"""
    import orbax.checkpoint as ocp

    from trainer_hooks.orbax_flush import OrbaxFlusher, tree_nbytes, uncompressed_item_handlers

    opts = ocp.CheckpointManagerOptions(enable_async_checkpointing=True, max_to_keep=1)
    if method == "orbax_zstd":
        mngr = ocp.CheckpointManager(ckdir, options=opts)

        def make_args(step: int, down: frozenset[int]) -> tuple[Any, int]:
            state = holder["state"]
            return ocp.args.Composite(state=ocp.args.StandardSave(state)), tree_nbytes(state)
    else:
        mngr = ocp.CheckpointManager(ckdir, options=opts, item_handlers=uncompressed_item_handlers("state"))

        def make_args(step: int, down: frozenset[int]) -> tuple[Any, int]:
            state = holder["state"]
            return ocp.args.Composite(state=ocp.args.PyTreeSave(state)), tree_nbytes(state)

    return OrbaxFlusher(mngr, make_args)


def run(
    quick: bool = False, repeats: int | None = None, sizes_mib: list[int] | None = None, workdir: Path | None = None
) -> dict[str, Any]:
    """Raw write+fsync and both Orbax flushes, interleaved: run r goes raw, zstd, uncompressed rotated by r."""
    sizes = sizes_mib or ([32] if quick else [256, 1024])
    reps = repeats or (3 if quick else 5)
    root = Path(workdir or tempfile.mkdtemp(prefix="bench-flush-"))
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    try:
        holder: dict[str, Any] = {"state": device_state(LEAVES * 4096)}
        managers = {m: make_flusher(m, root / m, holder) for m in METHODS if m != "raw"}
        step = 1
        for m in METHODS:  # warm-up (imports, thread pools): a trainer pays that at start, not at a flush
            one_flush(m, holder["state"], root, step, managers)
        for mib in sizes:
            holder["state"] = device_state(mib * MiB)
            nbytes = sum(int(a.nbytes) for a in holder["state"].values())
            times: dict[str, list[float]] = {m: [] for m in METHODS}
            for r in range(reps):
                order = METHODS[r % 3 :] + METHODS[: r % 3]
                for m in order:
                    step += 1
                    dt = one_flush(m, holder["state"], root, step, managers)
                    times[m].append(dt)
                    samples.append({"size_mib": mib, "run": r, "method": m, "seconds": rnd(dt, 4)})
                log(f"flush: {mib} MiB run {r + 1}/{reps}: " + ", ".join(f"{m} {times[m][-1]:.3f} s" for m in order))
            for m in METHODS:
                sp = spread(times[m])
                # Per-run ratios: raw and this method ran back to back in the same run.
                ratio = spread([times["raw"][i] / times[m][i] for i in range(reps)]) if m != "raw" else None
                rows.append(
                    {
                        "size_mib": mib,
                        "bytes": nbytes,
                        "method": m,
                        "runs": sp["n"],
                        "seconds_median": rnd(sp["median"], 4),
                        "seconds_p90": rnd(sp["p90"], 4),
                        "seconds_min": rnd(sp["min"], 4),
                        "seconds_max": rnd(sp["max"], 4),
                        "mib_per_s_median": rnd(nbytes / sp["median"] / MiB, 1),
                        "fraction_of_raw_median": rnd(ratio["median"], 3) if ratio else None,
                        "fraction_of_raw_min": rnd(ratio["min"], 3) if ratio else None,
                        "fraction_of_raw_max": rnd(ratio["max"], 3) if ratio else None,
                        "includes_device_to_host": True,
                    }
                )
            del holder["state"]
            holder["state"] = device_state(LEAVES * 4096)
        for f in managers.values():
            f.manager.wait_until_finished()
            f.manager.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    sb = step_boundary_cost(100_000 if quick else 1_000_000)
    rows.append(
        {
            "method": "step_boundary_idle",
            "runs": len(sb["step_boundary_us_batches"]),
            "microseconds_median": sb["step_boundary_us"],
            "microseconds_max": max(sb["step_boundary_us_batches"]),
            "calls_per_run": sb["calls_per_batch"],
            "report_step_microseconds_median": sb["report_step_us"],
        }
    )
    return {
        "name": NAME,
        "quick": quick,
        "config": {
            "sizes_mib": sizes,
            "repeats": reps,
            "leaves": LEAVES,
            "dtype": "float32 (random)",
            "methods": list(METHODS),
            "order": "interleaved, rotated each run",
        },
        "results": rows,
        "samples": samples,
        "duration_s": round(time.monotonic() - t0, 1),
    }
