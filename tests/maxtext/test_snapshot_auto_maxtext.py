"""The hook's snapshot layout and ``auto`` interval on the real MaxText's own multi-slice mesh.

MaxText runs through ``python -m simjob.maxtext`` (:mod:`simjob.maxtext.cpu_elastic`): 8 CPU
devices carry a ``slice_index`` of 4 slices of 2, so MaxText builds its hybrid mesh itself.
With the slices on the DCN ``data`` axis, every slice holds a full replica and the hook
snapshots by measurement (``auto``, the default). With FSDP across the slices no slice holds
a full replica: the hook says so once and relies on checkpoints. These assert what the hook
decides and logs, not how long anything takes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.core.model import WorkerJoined
from simjob.maxtext.cpu_elastic import ENV, ENV_SLICES
from simjob.maxtext.job import MULTI_SLICE_DEVICES, MULTI_SLICE_MESH, MULTI_SLICES
from tests.maxtext.harness import PATCHED_MODULE, START_TIMEOUT, MaxTextRun, Sidecar, maxtext_args

pytestmark = pytest.mark.maxtext

RUN_TIMEOUT = 6 * START_TIMEOUT
"""8 CPU devices on a shared 2-core machine: start, compile and a hundred steps; a generous bound."""

ELASTIC = (
    "elastic_enabled=true",
    "enable_single_controller=true",
    "elastic_min_slice_count=-1",
    "elastic_timeout_seconds=120",
    "elastic_max_retries=2",
)


def run_four_slices(tmp_path: Path, name: str, steps: int, *mesh: str) -> MaxTextRun:
    sc = Sidecar(num_slices=MULTI_SLICES)
    run = None
    try:
        for s in range(MULTI_SLICES):
            sc.submit(WorkerJoined(s, 0, "inc-1", node=f"node-{s}"))
        args = maxtext_args(tmp_path, name, steps, *ELASTIC, *mesh)
        env = {ENV: "1", ENV_SLICES: str(MULTI_SLICES)}  # ELASTIC_SIDECAR_SNAPSHOT_EVERY unset: auto
        run = MaxTextRun(name, args, tmp_path, sidecar=sc, module=PATCHED_MODULE, env=env, devices=MULTI_SLICE_DEVICES)
        assert run.wait(RUN_TIMEOUT) == 0, run.tail()
        return run
    finally:
        if run is not None:
            run.kill()
        sc.stop()


def lines(run: MaxTextRun, kind: str) -> list[dict[str, Any]]:
    return [f for _, f in run.hook_lines(kind)]


def test_auto_snapshots_a_replica_per_slice_at_an_interval_it_measured(tmp_path: Path) -> None:
    run = run_four_slices(tmp_path, "auto", 120, *MULTI_SLICE_MESH)
    (layout,) = lines(run, "snapshot_layout")
    assert layout["usable"] and layout["axis"] == "data", layout
    assert layout["replicas"] == MULTI_SLICES and layout["slices"] == list(range(MULTI_SLICES)), layout
    assert layout["bytes_per_replica"] > 0
    chosen = lines(run, "snapshot_every")
    assert chosen, f"auto never chose an interval\n{run.tail()}"
    assert all(c["every"] >= 1 and c["why"] == "measured" and c["step_seconds_baseline"] > 0 for c in chosen)
    assert all(c["overhead_fraction"] is not None for c in chosen)
    (done,) = lines(run, "finished")
    assert done["step"] == 120 and done["snapshot_every"] == "auto" and done["snapshots"] >= 1, done
    assert done["snapshots_failed"] == 0, done
    assert lines(run, "snapshot_failed") == []
    assert not [w for w in lines(run, "warning") if "snapshots off" in w.get("message", "")]


def test_fsdp_across_slices_leaves_no_replica_per_slice_and_the_hook_says_so_once(tmp_path: Path) -> None:
    run = run_four_slices(
        tmp_path, "fsdp", 20, "dcn_data_parallelism=1", "dcn_fsdp_parallelism=-1", "ici_fsdp_parallelism=-1"
    )
    (layout,) = lines(run, "snapshot_layout")
    assert layout["usable"] is False, layout
    warnings = [w["message"] for w in lines(run, "warning") if "snapshots off" in w.get("message", "")]
    assert len(warnings) == 1 and "checkpoint" in warnings[0], warnings
    (done,) = lines(run, "finished")
    assert done["step"] == 20 and done["snapshots"] == 0, done
