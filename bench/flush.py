"""Flush: an emergency Orbax flush against a raw write + fsync of the same bytes.

The state is a dict of float32 numpy arrays (random, so nothing compresses
away; 8 leaves) of 256 MiB and 1 GiB (``--quick``: 32 MiB), held in host
memory as the example trainer's flush hands it over. The flush is
:class:`trainer_hooks.orbax_flush.OrbaxFlusher` over a real
``orbax.checkpoint.CheckpointManager`` with async checkpointing on (the
trainer's configuration): wait for any save in flight, ``save(force=True)``,
``wait_until_finished()``, re-read the committed steps. The raw baseline
writes the same arrays to files in the same directory tree and fsyncs each
file and the directory. Each repeat uses a fresh step / fresh files; figures
are medians. A second Orbax configuration without zstd compression
(``PyTreeCheckpointHandler(use_compression=False)``) shows what compression
costs on this machine.

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

from bench.common import log, median, rnd, target

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


def orbax_flush(state: dict[str, Any], ckdir: Path, steps: list[int], compression: bool) -> list[float]:
    import orbax.checkpoint as ocp

    from trainer_hooks.orbax_flush import OrbaxFlusher, tree_nbytes

    nbytes = tree_nbytes(state)
    if compression:
        mngr = ocp.CheckpointManager(
            ckdir, options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True, max_to_keep=2)
        )

        def make_args(step: int, down: frozenset[int]) -> tuple[Any, int]:
            return ocp.args.Composite(state=ocp.args.StandardSave(state)), nbytes
    else:
        mngr = ocp.CheckpointManager(
            ckdir,
            options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True, max_to_keep=2),
            item_handlers={"state": ocp.PyTreeCheckpointHandler(use_compression=False)},
        )

        def make_args(step: int, down: frozenset[int]) -> tuple[Any, int]:
            return ocp.args.Composite(state=ocp.args.PyTreeSave(state)), nbytes

    flusher = OrbaxFlusher(mngr, make_args)
    times = []
    try:
        for step in steps:
            t0 = time.perf_counter()
            res = flusher(step, frozenset())
            times.append(time.perf_counter() - t0)
            assert res.committed_step == step, res
    finally:
        mngr.wait_until_finished()
        mngr.close()
    return times


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


def run(
    quick: bool = False, repeats: int | None = None, sizes_mib: list[int] | None = None, workdir: Path | None = None
) -> dict[str, Any]:
    sizes = sizes_mib or ([32] if quick else [256, 1024])
    reps = repeats or (1 if quick else 3)
    root = Path(workdir or tempfile.mkdtemp(prefix="bench-flush-"))
    t0 = time.monotonic()
    rows = []
    try:
        # Warm up once per configuration (imports, thread pools): a trainer pays that at start, not at a flush.
        tiny = make_state(LEAVES * 4096)
        orbax_flush(tiny, root / "warmup", [1], compression=True)
        orbax_flush(tiny, root / "warmup-nc", [1], compression=False)
        for mib in sizes:
            state = make_state(mib * MiB)
            nbytes = sum(int(a.nbytes) for a in state.values())
            raw, orb, orb_nc = [], [], []
            for r in range(reps):
                log(f"flush: {mib} MiB, run {r + 1}/{reps}")
                d = root / f"raw-{mib}-{r}"
                raw.append(raw_write(state, d))
                shutil.rmtree(d, ignore_errors=True)
            # One manager per configuration, a new step per repeat (as a trainer flushes).
            orb = orbax_flush(state, root / f"orbax-{mib}", list(range(1, reps + 1)), compression=True)
            shutil.rmtree(root / f"orbax-{mib}", ignore_errors=True)
            orb_nc = orbax_flush(state, root / f"orbax-nc-{mib}", list(range(1, reps + 1)), compression=False)
            shutil.rmtree(root / f"orbax-nc-{mib}", ignore_errors=True)
            raw_s, orb_s, nc_s = median(raw), median(orb), median(orb_nc)
            assert raw_s and orb_s and nc_s
            row = {
                "size_mib": mib,
                "bytes": nbytes,
                "raw_write_fsync_s": rnd(raw_s),
                "raw_mib_per_s": rnd(nbytes / raw_s / MiB, 1),
                "orbax_flush_s": rnd(orb_s),
                "orbax_mib_per_s": rnd(nbytes / orb_s / MiB, 1),
                "ratio": rnd(raw_s / orb_s, 3),
                "orbax_nocompression_flush_s": rnd(nc_s),
                "orbax_nocompression_mib_per_s": rnd(nbytes / nc_s / MiB, 1),
                "ratio_nocompression": rnd(raw_s / nc_s, 3),
                "raw_all_s": [rnd(x) for x in raw],
                "orbax_all_s": [rnd(x) for x in orb],
                "orbax_nocompression_all_s": [rnd(x) for x in orb_nc],
            }
            log(
                f"  -> raw {row['raw_mib_per_s']} MiB/s, orbax {row['orbax_mib_per_s']} MiB/s "
                f"(ratio {row['ratio']}), no compression {row['orbax_nocompression_mib_per_s']} MiB/s"
            )
            rows.append(row)
            del state
    finally:
        shutil.rmtree(root, ignore_errors=True)
    sb = step_boundary_cost(100_000 if quick else 1_000_000)
    worst = min(rows, key=lambda r: r["ratio"])
    targets = [
        target(
            "Orbax flush throughput vs raw write+fsync",
            ">= 70%",
            rnd(worst["ratio"] * 100, 1),
            "%",
            worst["ratio"] >= 0.7,
            f"worst size ({worst['size_mib']} MiB); default Orbax settings (zstd)",
        ),
        target(
            "step_boundary() with nothing pending",
            "< 50 us",
            sb["step_boundary_us"],
            "us",
            sb["step_boundary_us"] < 50,
            "median of 5 batches",
        ),
    ]
    return {
        "name": NAME,
        "quick": quick,
        "config": {"sizes_mib": sizes, "repeats": reps, "leaves": LEAVES, "dtype": "float32 (random)"},
        "sizes": rows,
        "step_boundary": sb,
        "targets": targets,
        "duration_s": round(time.monotonic() - t0, 1),
    }
