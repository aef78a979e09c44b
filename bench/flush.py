"""Flush: an emergency Orbax flush against the fastest raw write + fsync of the same bytes.

The state is a dict of float32 JAX arrays on the device (random, so nothing
compresses away; the sizes and leaf count are in the result's config). Methods,
each timed on its own:

* ``device_to_host``: the device-to-host copy alone, into host buffers
  allocated and written once per size (pre-faulted: the kernel hands out no
  fresh page inside the timed copy, which on the VM these figures come from
  can cost ten times the copy itself);
* ``raw_single``: those host buffers written by one thread, each leaf to a file
  (64 MiB ``os.write`` calls), each file fsynced, then the directory;
* ``raw_threads``: the same, one thread per leaf (``os.write`` and ``os.fsync``
  release the GIL), then the directory;
* ``raw_pieces``: each leaf cut into 32 MiB pieces, a file each, written and
  fsynced by 16 threads, then the directory (what ``orbax_fast``'s data files
  let TensorStore do: without it, Orbax beat the "raw" writer, which was then
  not the fastest way to write);
* ``raw``: the fair raw writer, per run the fastest of ``raw_single``,
  ``raw_threads`` and ``raw_pieces``, plus that run's ``device_to_host`` (Orbax
  starts from the device too);
* ``orbax_zstd``: :class:`trainer_hooks.orbax_flush.OrbaxFlusher` over a real
  ``orbax.checkpoint.CheckpointManager`` with async checkpointing on (the
  trainer's configuration, Orbax's default compressed writer), handed the JAX
  arrays as a trainer hands them (Orbax copies them to the host itself): wait
  for any save in flight, ``save(force=True)``, ``wait_until_finished()``,
  re-read the committed steps;
* ``orbax_uncompressed``: the same with
  :func:`trainer_hooks.orbax_flush.uncompressed_item_handlers`;
* ``orbax_fast``: uncompressed, with
  :func:`trainer_hooks.orbax_flush.fast_flush_manager_options` (the step past
  ``max_to_keep`` deleted on a thread of its own, not inside the save's
  finalisation) and :func:`trainer_hooks.orbax_flush.fast_flush_args` (32 MiB
  OCDBT data files instead of Orbax's 2 GiB). That deletion is waited for,
  untimed, after the flush (:func:`settle`), so it never runs inside another
  method's timing.

Runs are interleaved: run r times the raw writer and each Orbax flush
back to back, in an order rotated by r, so drift and cache effects hit every
method alike, and each Orbax method's fraction of raw (raw seconds / its
seconds) is taken per run, then summarised over runs (at least
``MIN_RUNS`` a size); the verdict (bench/report.py) reads the median. Each
Orbax row also gives the fraction against raw without the device-to-host copy
(``fraction_of_raw_without_copy_*``), so the copy's share is shown apart.

Also the per-call cost of :meth:`trainer_hooks.ElasticSession.step_boundary`
with nothing pending (and of ``report_step``), timed in a loop.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import timeit
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import log, median, rnd, spread

NAME = "flush"
MiB = 2**20
LEAVES = 8
MIN_RUNS = 5
"""Interleaved runs a size asks for (fewer: the figures are a smoke test, the report says not judged)."""


def make_state(nbytes: int, seed: int = 0) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    per = nbytes // LEAVES // 4
    return {f"layer_{i}": rng.random(per, dtype=np.float32) for i in range(LEAVES)}


def _write_file(path: Path, arr: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        mv = memoryview(arr).cast("B")
        off = 0
        while off < len(mv):
            off += os.write(fd, mv[off : off + 64 * MiB])
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


PIECE_BYTES = 32 * MiB
PIECE_THREADS = 16


def raw_write_pieces(
    state: dict[str, Any], directory: Path, piece: int = PIECE_BYTES, threads: int = PIECE_THREADS
) -> float:
    """Seconds to write ``state`` (host arrays) as pieces of ``piece`` bytes, a file each, written and fsynced
    by ``threads`` threads, then fsync the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    jobs = []
    for k, arr in state.items():
        mv = memoryview(arr).cast("B")
        jobs += [(directory / f"{k}.{off}.bin", mv[off : off + piece]) for off in range(0, len(mv), piece)]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for f in [pool.submit(_write_file, path, part) for path, part in jobs]:
            f.result()
    _fsync_dir(directory)
    return time.perf_counter() - t0


def raw_write(state: dict[str, Any], directory: Path, threads: int = 1) -> float:
    """Seconds to write each leaf of ``state`` (host arrays) to a file and fsync it, then the directory;
    ``threads`` > 1: the leaves are written concurrently."""
    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if threads <= 1:
        for k, arr in state.items():
            _write_file(directory / f"{k}.bin", arr)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for f in [pool.submit(_write_file, directory / f"{k}.bin", arr) for k, arr in state.items()]:
                f.result()
    _fsync_dir(directory)
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


METHODS = ("raw", "orbax_zstd", "orbax_uncompressed", "orbax_fast")
"""The methods interleaved within a run (``raw`` is timed as its parts: see :func:`raw_parts`)."""
RAW_PARTS = ("device_to_host", "raw_single", "raw_threads", "raw_pieces")


def device_state(nbytes: int, seed: int = 0) -> dict[str, Any]:
    """The state as the trainer holds it: JAX arrays on a device (random float32, so nothing compresses away)."""
    import jax

    return {k: jax.device_put(v) for k, v in make_state(nbytes, seed).items()}


def host_buffers(state: dict[str, Any]) -> dict[str, Any]:
    """Host buffers for ``state``'s leaves, every page written once (pre-faulted)."""
    import numpy as np

    out = {k: np.empty(v.shape, v.dtype) for k, v in state.items()}
    for b in out.values():
        b.fill(1)
    return out


def to_host(state: dict[str, Any], into: dict[str, Any]) -> float:
    """Seconds of the device-to-host copy a flush starts with, into ``into`` (a real copy: on CPU
    ``np.asarray`` of a device array may alias it, the copy into the buffer does not)."""
    import numpy as np

    t0 = time.perf_counter()
    for k, v in state.items():
        np.copyto(into[k], np.asarray(v))
    return time.perf_counter() - t0


def raw_parts(state: dict[str, Any], bufs: dict[str, Any], root: Path, step: int) -> dict[str, float]:
    """One run of the raw writer: the copy to the pre-faulted ``bufs``, then a single-threaded, a
    thread-per-leaf and a piecewise write + fsync of them (in an order rotated by ``step``)."""
    out = {"device_to_host": to_host(state, bufs)}
    writers = {
        "raw_single": lambda d: raw_write(bufs, d, threads=1),
        "raw_threads": lambda d: raw_write(bufs, d, threads=len(bufs)),
        "raw_pieces": lambda d: raw_write_pieces(bufs, d),
    }
    names = list(writers)
    for name in names[step % 3 :] + names[: step % 3]:
        d = root / f"raw-{step}-{name}"
        out[name] = writers[name](d)
        shutil.rmtree(d, ignore_errors=True)
    return out


def fair_raw(parts: dict[str, float]) -> tuple[float, float]:
    """(raw seconds with the device-to-host copy, without it): the faster writer of the run."""
    best = min(parts[k] for k in ("raw_single", "raw_threads", "raw_pieces") if k in parts)
    return parts["device_to_host"] + best, best


def ratio_fields(prefix: str, ratios: list[float]) -> dict[str, Any]:
    """``{prefix}_median/_min/_max`` of per-run ratios (None when there are none)."""
    sp = spread(ratios) if ratios else {"median": None, "min": None, "max": None}
    return {f"{prefix}_{k}": rnd(sp[k], 3) if sp[k] is not None else None for k in ("median", "min", "max")}


SETTLE_TIMEOUT = 120.0
"""Longest wait (s) for a flush's background deletion of the step before it (see :func:`settle`)."""


def settle(ckdir: Path, step: int, timeout: float = SETTLE_TIMEOUT) -> None:
    """Wait, untimed, until ``ckdir`` holds no step but ``step``: ``orbax_fast`` deletes the step before on
    Orbax's deleter thread, and that deletion must not run inside the next method's timing (a real flush
    overlaps it with the resumed training instead). The other methods delete inside the flush."""
    deadline = time.monotonic() + timeout
    while any(p.name != str(step) for p in ckdir.iterdir() if p.is_dir()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{ckdir}: older steps still there {timeout:g} s after step {step} was flushed")
        time.sleep(0.01)


def one_flush(method: str, state: dict[str, Any], root: Path, step: int, managers: dict[str, Any]) -> float:
    """Seconds for one Orbax flush of ``state`` (on device), device-to-host copy included; then, untimed,
    the wait for its background deletion (:func:`settle`)."""
    flusher = managers[method]
    t0 = time.perf_counter()
    res = flusher(step, frozenset())
    dt = time.perf_counter() - t0
    settle(Path(flusher.manager.directory), step)
    assert res.committed_step == step, res
    return dt


def make_flusher(method: str, ckdir: Path, holder: dict[str, Any]) -> Any:
    """An OrbaxFlusher whose ``make_args`` hands Orbax ``holder["state"]``, the JAX arrays on the device, as
    the trainers do (``simjob.mc_trainer``, MaxText's checkpoint manager): Orbax makes the
    device-to-host copy itself, inside the timed flush. (Copying to NumPy first, as this bench once did,
    adds a second copy and Orbax's slower NumPy path: a trainer never flushes that way.)"""
    import orbax.checkpoint as ocp

    from trainer_hooks.orbax_flush import (
        OrbaxFlusher,
        fast_flush_args,
        fast_flush_manager_options,
        tree_nbytes,
        uncompressed_item_handlers,
    )

    opts = ocp.CheckpointManagerOptions(enable_async_checkpointing=True, max_to_keep=1)
    if method == "orbax_fast":
        fast = fast_flush_manager_options(enable_async_checkpointing=True, max_to_keep=1)
        mngr = ocp.CheckpointManager(ckdir, options=fast, item_handlers=uncompressed_item_handlers("state"))

        def make_args(step: int, down: frozenset[int]) -> tuple[Any, int]:
            state = holder["state"]
            return ocp.args.Composite(state=fast_flush_args(state)), tree_nbytes(state)
    elif method == "orbax_zstd":
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


def size_rows(mib: int, nbytes: int, times: dict[str, list[float]]) -> list[dict[str, Any]]:
    """One size's rows from its runs' seconds (``times[method][run]``): each method's spread, and each
    Orbax method's per-run fraction of the fair raw writer, with and without the device-to-host copy."""
    rows = []
    reps = len(times["raw"])
    for m in (*METHODS, *RAW_PARTS):
        sp = spread(times[m])
        row: dict[str, Any] = {
            "size_mib": mib,
            "bytes": nbytes,
            "method": m,
            "runs": sp["n"],
            "seconds_median": rnd(sp["median"], 4),
            "seconds_p90": rnd(sp["p90"], 4),
            "seconds_min": rnd(sp["min"], 4),
            "seconds_max": rnd(sp["max"], 4),
            "mib_per_s_median": rnd(nbytes / sp["median"] / MiB, 1) if sp["median"] else None,
            "includes_device_to_host": m in ("raw", "device_to_host", *METHODS[1:]),
        }
        if m in METHODS[1:]:
            # Per-run ratios: the raw writer and this method ran back to back in the same run.
            row |= ratio_fields("fraction_of_raw", [times["raw"][i] / times[m][i] for i in range(reps)])
            row |= ratio_fields(
                "fraction_of_raw_without_copy", [times["raw_without_copy"][i] / times[m][i] for i in range(reps)]
            )
        else:
            row["fraction_of_raw_median"] = None
        rows.append(row)
    return rows


def run(
    quick: bool = False, repeats: int | None = None, sizes_mib: list[int] | None = None, workdir: Path | None = None
) -> dict[str, Any]:
    """Raw write+fsync and each Orbax flush, interleaved: run r goes raw, zstd, uncompressed, fast rotated by r."""
    sizes = sizes_mib or ([32] if quick else [256, 1024])
    reps = repeats or (3 if quick else MIN_RUNS)
    root = Path(workdir or tempfile.mkdtemp(prefix="bench-flush-"))
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    try:
        holder: dict[str, Any] = {"state": device_state(LEAVES * 4096)}
        managers = {m: make_flusher(m, root / m, holder) for m in METHODS if m != "raw"}
        step = 1
        bufs = host_buffers(holder["state"])
        raw_parts(holder["state"], bufs, root, step)  # warm-up (imports, thread pools): a trainer pays
        for m in METHODS[1:]:  # that at start, not at a flush
            one_flush(m, holder["state"], root, step, managers)
        for mib in sizes:
            holder["state"] = device_state(mib * MiB)
            bufs = host_buffers(holder["state"])
            nbytes = sum(int(a.nbytes) for a in holder["state"].values())
            times: dict[str, list[float]] = {m: [] for m in (*METHODS, *RAW_PARTS, "raw_without_copy")}
            for r in range(reps):
                order = METHODS[r % len(METHODS) :] + METHODS[: r % len(METHODS)]
                for m in order:
                    step += 1
                    if m == "raw":
                        parts = raw_parts(holder["state"], bufs, root, step)
                        for k, v in parts.items():
                            times[k].append(v)
                        dt, without = fair_raw(parts)
                        times["raw_without_copy"].append(without)
                        samples += [
                            {"size_mib": mib, "run": r, "method": k, "seconds": rnd(v, 4)} for k, v in parts.items()
                        ]
                    else:
                        dt = one_flush(m, holder["state"], root, step, managers)
                    times[m].append(dt)
                    samples.append({"size_mib": mib, "run": r, "method": m, "seconds": rnd(dt, 4)})
                log(f"flush: {mib} MiB run {r + 1}/{reps}: " + ", ".join(f"{m} {times[m][-1]:.3f} s" for m in order))
            rows += size_rows(mib, nbytes, times)
            del holder["state"], bufs
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
            "min_runs": MIN_RUNS,
            "leaves": LEAVES,
            "dtype": "float32 (random)",
            "methods": list(METHODS),
            "raw": "per run the fastest of raw_single, raw_threads (one thread per leaf) and raw_pieces "
            f"({PIECE_BYTES // MiB} MiB files, {PIECE_THREADS} threads) writing pre-faulted host buffers, plus "
            "that run's device_to_host copy",
            "order": "interleaved, rotated each run",
        },
        "results": rows,
        "samples": samples,
        "duration_s": round(time.monotonic() - t0, 1),
    }
