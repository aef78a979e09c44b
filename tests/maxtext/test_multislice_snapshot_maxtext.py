"""A 4-slice MaxText job with grain data loses slices and restores from Orbax's Pathways snapshots (issue 23).

MaxText runs through ``python -m simjob.maxtext`` (:mod:`simjob.maxtext.cpu_elastic`): 8 CPU devices
that carry a ``slice_index`` of 4 slices of 2, so MaxText's own multi-slice code builds the mesh
(``num_slices`` 4, the hybrid DCN mesh, the slices along ``data``); the data come from a grain
pipeline over a small ArrayRecord file the test writes (:mod:`simjob.maxtext.grain_data`), read in
file order, and every completed step's event names the records its batch held. A slice dies while a
step runs; nothing is raised then: the error surfaces on a later read or wait, the lost slice's
snapshot replica is gone, and pathwaysutils' own health computation finds the survivors. The hook
(``trainer_hooks.maxtext``, snapshot every step) restores the newest complete snapshot with the data
iterator's position taken at the same step.
"""

from __future__ import annotations

import os
import random
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from agent.core.model import OperatorCommand, TrainerResumed, TrainerSliceError, TrainerStepped, WorkerJoined
from simjob.maxtext import grain_data
from simjob.maxtext.cpu_elastic import (
    ENV,
    ENV_CONTROL,
    ENV_EVENTS,
    ENV_FAIL_AT,
    ENV_FAIL_GROW_LOAD,
    ENV_LOST_WAIT,
    ENV_SLICES,
)
from simjob.maxtext.job import MULTI_SLICE_DEVICES, MULTI_SLICE_MESH, MULTI_SLICES
from tests.maxtext.harness import (
    PATCHED_MODULE,
    REPO,
    START_TIMEOUT,
    MaxTextRun,
    Sidecar,
    checkpoint_labels,
    maxtext_args,
    require_maxtext_venv,
)

pytestmark = pytest.mark.maxtext

ENV_SNAPSHOT_EVERY = "ELASTIC_SIDECAR_SNAPSHOT_EVERY"
LOSS_TOLERANCE = 1e-5
SLOW_START = 3 * START_TIMEOUT
"""8 CPU devices: MaxText's start and first compile take several times the 4-device job's on a loaded
2-core machine (over 180 s seen beside other work); a generous bound, not a timing."""
RUN_TIMEOUT = 2 * SLOW_START
"""A run with elastic restarts: MaxText compiles once per attempt (the restore then the new mesh)."""


def elastic_flags(min_slices: int) -> tuple[str, ...]:
    return (
        "elastic_enabled=true",
        "enable_single_controller=true",
        f"elastic_min_slice_count={min_slices}",
        "elastic_timeout_seconds=120",
        "elastic_max_retries=4",
        *MULTI_SLICE_MESH,
    )


@pytest.fixture(scope="module")
def grain_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data set, written once by the MaxText venv (which has ``array_record``)."""
    python = require_maxtext_venv()
    out = tmp_path_factory.mktemp("grain") / "train.array_record"
    r = subprocess.run(
        [str(python), "-m", "simjob.maxtext.grain_data", str(out), "2048"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def case_seed(request: pytest.FixtureRequest) -> int:
    """The seed of a test's fault steps: ``ES_TEST_SEED`` when set (to explore), else one fixed by the test's
    name, so that every run of the suite draws the same steps (CI is deterministic). The cases of one test
    share it, so the cases that differ only in the crash run also share its reference run."""
    return int(os.environ.get("ES_TEST_SEED", zlib.crc32(request.node.originalname.encode()) % 10_000))


def kept_steps(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Completed steps by count; a step completed again after a restore replaces the earlier one."""
    out: dict[int, dict[str, Any]] = {}
    for e in sorted((e for e in events if e.get("kind") == "step"), key=lambda e: e["t"]):
        out[int(e["step"])] = e
    return out


def consumed_rows(steps: dict[int, dict[str, Any]]) -> list[str]:
    """The records the kept steps' batches held, in step order."""
    return [r for s in sorted(steps) for r in steps[s].get("rows", [])]


def restores(run: MaxTextRun) -> list[dict[str, Any]]:
    return [f for _, f in run.hook_lines("restored")]


def join_all(sc: Sidecar) -> None:
    for s in range(MULTI_SLICES):
        sc.submit(WorkerJoined(s, 0, "inc-1", node=f"node-{s}"))


def start_snapshot_run(
    tmp_path: Path,
    sc: Sidecar,
    name: str,
    steps: int,
    min_slices: int,
    fail_at: str,
    grain_file: Path,
    extra_env: dict[str, str] | None = None,
    fresh_cache: bool = False,
) -> MaxTextRun:
    """A 4-slice elastic MaxText job under ``sc`` on the grain data, a snapshot every step, the faults
    ``fail_at`` (``ENV_FAIL_AT``); its events go to ``tmp_path/events.jsonl``, its control directory
    (a ``reconnect`` file there brings a lost slice back) is ``tmp_path/control``. ``fresh_cache``: an
    empty compile cache of its own (:func:`tests.maxtext.harness.maxtext_args`)."""
    control = tmp_path / "control"
    control.mkdir()
    join_all(sc)
    args = maxtext_args(tmp_path, name, steps, *elastic_flags(min_slices), data=grain_file, fresh_cache=fresh_cache)
    env = {
        ENV: "1",
        ENV_SLICES: str(MULTI_SLICES),
        ENV_SNAPSHOT_EVERY: "1",
        ENV_EVENTS: str(tmp_path / "events.jsonl"),
        ENV_FAIL_AT: fail_at,
        ENV_CONTROL: str(control),
        **(extra_env or {}),
    }
    return MaxTextRun(name, args, tmp_path, sidecar=sc, module=PATCHED_MODULE, env=env, devices=MULTI_SLICE_DEVICES)


def manager_flags(kind: str, tmp_path: Path) -> tuple[str, ...]:
    """MaxText's flags for the checkpoint manager ``kind`` it builds (``train_utils.create_checkpoint_manager``):
    ``plain`` (Orbax v1 ``Checkpointer``), ``emergency`` (Orbax's emergency ``CheckpointManager``) or
    ``multi_tier`` (``enable_multi_tier_checkpointing``: Orbax's ``ReplicatorCheckpointManager``). MaxText takes
    the restore of the last two as the bare state. The local period is past the run's end: neither manager's own
    save can run in one CPU process (docs/maxtext.md), and the test is of the restore through the hook."""
    if kind == "plain":
        return ()
    local = tmp_path / "local-checkpoints"
    local.mkdir(exist_ok=True)
    common = (f"local_checkpoint_directory={local}", "local_checkpoint_period=1000")
    if kind == "emergency":
        return ("enable_emergency_checkpoint=true", *common)
    # skip_jax_distributed_system=true (the tiny model's) skips MaxText's multi-tier initialisation
    # (max_utils.maybe_initialize_jax_distributed_system), which needs colocated Python on Pathways.
    return ("enable_multi_tier_checkpointing=true", *common, "multi_tier_checkpointing_backup_interval_minutes=1000")


MANAGER_CREATED = {
    "emergency": "Emergency checkpoint manager created!",
    "multi_tier": "Emergency replicator checkpoint manager created!",
}
"""MaxText's log line once it has built the manager (``maxtext.common.emergency_checkpointing``)."""


_references: dict[tuple[Any, ...], tuple[MaxTextRun, Path]] = {}


def reference_run(
    tmp_path: Path, steps: int, kind_flags: tuple[str, ...], model: str, grain_file: Path
) -> tuple[MaxTextRun, Path]:
    """Plain MaxText (no sidecar, no elastic mode, no snapshots) for ``steps`` steps on 4 slices, and its events
    file. An uninterrupted run is the same for every case that differs only in the crash run (``lost_wait``),
    so those cases share one."""
    key = (steps, kind_flags, model, grain_file)
    if key not in _references:
        events = tmp_path / "reference.jsonl"
        args = maxtext_args(tmp_path, "reference", steps, *MULTI_SLICE_MESH, *kind_flags, data=grain_file, model=model)
        env = {ENV: "1", ENV_SLICES: str(MULTI_SLICES), ENV_EVENTS: str(events)}
        run = MaxTextRun("reference", args, tmp_path, module=PATCHED_MODULE, env=env, devices=MULTI_SLICE_DEVICES)
        _references[key] = (run, events)
    return _references[key]


@pytest.mark.parametrize(
    ("manager", "lost_wait"),
    [
        pytest.param("plain", "error", id="plain"),
        pytest.param("emergency", "error", id="emergency"),
        pytest.param("multi_tier", "error", id="multi_tier"),
        pytest.param("plain", "ready", id="plain-lost_wait_ready"),
    ],
)
@pytest.mark.parametrize("model", ["tiny", pytest.param("larger", marks=pytest.mark.slow)])
def test_a_lost_slice_restores_the_newest_snapshot_with_the_data_and_losses_of_an_uninterrupted_run(
    tmp_path: Path, grain_file: Path, model: str, manager: str, lost_wait: str, request: pytest.FixtureRequest
) -> None:
    """4 slices; slice 3 dies during a random step F; the job waits for its replacement
    (``elastic_min_slice_count=-1``). It loses at most the step since the newest complete snapshot, and every
    step from the restored one on consumes the same batch and has the same loss (1e-5) as an uninterrupted run.
    ``larger`` (``--runslow``): the same with about ten times the parameters (:data:`simjob.maxtext.job.MODELS`).
    ``manager``: the checkpoint manager MaxText builds (:func:`manager_flags`); the snapshot comes back through
    ``load_state_if_possible`` in the shape MaxText expects of it. ``lost_wait``: what the stand-in answers to a
    wait on the lost slice's snapshot replica (``ELASTIC_SIDECAR_TEST_LOST_WAIT``: ``error`` as pathwaysutils'
    simulator, or ``ready`` as a kinder runtime might); either way the hook never loads that replica."""
    require_maxtext_venv()
    kind_flags = manager_flags(manager, tmp_path)
    seed = case_seed(request)
    fail_at = random.Random(seed).randint(3, 7)
    steps = fail_at + 5
    slices_env = {ENV: "1", ENV_SLICES: str(MULTI_SLICES)}

    ref, ref_events = reference_run(tmp_path, steps, kind_flags, model, grain_file)
    assert ref.wait(SLOW_START) == 0, ref.tail()
    want = ref.losses()
    want_steps = kept_steps(ref.events(ref_events))
    assert sorted(want_steps) == list(range(1, steps + 1)), sorted(want_steps)
    file_rows = grain_data.rows(grain_file)
    assert consumed_rows(want_steps) == file_rows[: 8 * steps], "the reference reads the file in order"
    assert [(n, shape[1]) for n, shape in ref.meshes()] == [(8, 4)], ref.meshes()  # MaxText's own: data = 4 slices

    sc = Sidecar(num_slices=MULTI_SLICES)
    run = None
    control = tmp_path / "control"
    control.mkdir()
    events = tmp_path / "crash.jsonl"
    try:
        join_all(sc)
        args = maxtext_args(tmp_path, "crash", steps, *elastic_flags(-1), *kind_flags, data=grain_file, model=model)
        env = {
            **slices_env,
            ENV_SNAPSHOT_EVERY: "1",
            ENV_EVENTS: str(events),
            ENV_FAIL_AT: f"{fail_at}:3",
            ENV_CONTROL: str(control),
            ENV_LOST_WAIT: lost_wait,
        }
        run = MaxTextRun(
            "crash", args, tmp_path, sidecar=sc, module=PATCHED_MODULE, env=env, devices=MULTI_SLICE_DEVICES
        )
        sc.wait_for(lambda: sc.applied(TrainerStepped), "the first step", run, timeout=SLOW_START)
        report = sc.wait_for(lambda: sc.applied(TrainerSliceError), "the slice error", run, timeout=RUN_TIMEOUT)[0]
        # Nobody named the slice: pathwaysutils' own health computation found it down.
        assert report.event.slices == frozenset({3}), report.event
        (control / "reconnect").touch()  # the replacement slice
        t_back = time.monotonic()
        sc.request(WorkerJoined(3, 0, "inc-2", node="node-3"))
        sc.wait_for(
            lambda: sc.applied(TrainerResumed, t_back, lambda e: e.active == frozenset(range(MULTI_SLICES))),
            "the resume on every slice",
            run,
            timeout=RUN_TIMEOUT,
        )
        assert run.wait(RUN_TIMEOUT) == 0, run.tail()
    finally:
        if run is not None:
            run.kill()
        sc.stop()

    if manager in MANAGER_CREATED:
        for r in (ref, run):
            assert MANAGER_CREATED[manager] in r.text(), f"MaxText built another checkpoint manager in {r.name}"
    evs = run.events(events)
    faults = [e for e in evs if e["kind"] == "fault"]
    assert [(f["step"], f["slice"]) for f in faults] == [(fail_at, 3)], faults
    meshes = [e["slices"] for e in evs if e["kind"] == "mesh"]
    assert meshes[0] == MULTI_SLICES and meshes[-1] == MULTI_SLICES, meshes
    snap = [r for r in restores(run) if r.get("source") == "snapshot"]
    assert snap, f"no restore from a snapshot: {restores(run)}\n{run.tail()}"
    restored = int(snap[-1]["step"])
    assert fail_at - 1 <= restored <= fail_at, f"restored {restored} completed steps, the loss hit at {fail_at}"
    assert snap[-1].get("data") == "restored", snap[-1]
    assert snap[-1].get("dropped_lost_replicas") == [3], snap[-1]  # found lost by pathwaysutils, never loaded
    got_steps = kept_steps(evs)
    assert sorted(got_steps) == list(range(1, steps + 1)), sorted(got_steps)
    for s in range(1, steps + 1):
        assert got_steps[s].get("batch") == want_steps[s].get("batch"), f"step {s} consumed another batch"
    assert consumed_rows(got_steps) == file_rows[: 8 * steps], "records skipped or read twice"
    got = run.losses()
    after = [s for s in sorted(want) if s >= restored]
    assert after and all(s in got for s in after), (sorted(got), after)
    worst = max(abs(got[s] - want[s]) for s in after)
    assert worst <= LOSS_TOLERANCE, {s: (got[s], want[s]) for s in after}
    print(
        f"\n4-slice MaxText ({model} model, {manager}, lost wait {lost_wait}), grain data (seed {seed}): slice 3 lost in step index {fail_at}, restored the snapshot "
        f"of {restored} completed steps (lost {fail_at - restored}); meshes {meshes}; batches equal; worst loss "
        f"difference {worst:.2e}"
    )


def test_a_second_loss_during_a_snapshot_still_restores_from_a_snapshot_on_fewer_slices(
    tmp_path: Path, grain_file: Path, request: pytest.FixtureRequest
) -> None:
    """4 slices, ``elastic_min_slice_count=2``, no replacement: slice 3 dies during step F, the job goes on
    on MaxText's 3-slice mesh; slice 2 dies as the snapshot before step G starts (that snapshot fails); the
    job restores the newest complete snapshot again and finishes on 2 slices. No record is skipped or read
    twice across the three meshes (each step's batch is per_device_batch_size x the live devices)."""
    require_maxtext_venv()
    seed = case_seed(request)
    first = random.Random(seed).randint(3, 5)
    second = first + 3
    steps = second + 4
    events = tmp_path / "events.jsonl"
    sc = Sidecar(num_slices=MULTI_SLICES)
    run = None
    try:
        run = start_snapshot_run(tmp_path, sc, "twice", steps, 2, f"{first}:3,{second}:2:snapshot", grain_file)
        assert run.wait(2 * RUN_TIMEOUT) == 0, run.tail()
    finally:
        if run is not None:
            run.kill()
        sc.stop()

    evs = run.events(events)
    faults = [(e["step"], e["slice"], e["during"]) for e in evs if e["kind"] == "fault"]
    assert [(s, d) for _, s, d in faults] == [(3, "step"), (2, "snapshot")], faults
    meshes = [e["slices"] for e in evs if e["kind"] == "mesh"]
    assert meshes[0] == 4 and 3 in meshes and meshes[-1] == 2, meshes  # MaxText's own mesh: 4, then 3, then 2
    assert [n for n, _ in run.meshes()][0] == 8 and [n for n, _ in run.meshes()][-1] == 4, run.meshes()
    snap = [r for r in restores(run) if r.get("source") == "snapshot"]
    assert len(snap) >= 2, f"both losses restore from a snapshot: {restores(run)}\n{run.tail()}"
    assert int(snap[0]["step"]) >= first - 1, snap[0]
    assert int(snap[-1]["step"]) < faults[1][0] + 1, "the snapshot the second loss hit did not complete"
    assert int(snap[-1]["step"]) >= faults[1][0] - 2, snap[-1]
    assert all(r.get("data") == "restored" for r in snap), snap
    got_steps = kept_steps(evs)
    assert sorted(got_steps) == list(range(1, steps + 1)), sorted(got_steps)
    rows = consumed_rows(got_steps)
    assert rows == grain_data.rows(grain_file)[: len(rows)], "records skipped or read twice"
    sizes = {int(e["devices"]) for e in got_steps.values()}
    assert sizes == {8, 6, 4}, sizes
    print(
        f"\ntwo losses (seed {seed}): slice 3 in step {first}, slice 2 at the snapshot before step {second}; "
        f"meshes {meshes}; restored from snapshots {[r['step'] for r in snap]}; {len(rows)} records in order"
    )


def test_a_grow_onto_the_replacement_loads_the_boundary_from_a_snapshot_not_a_checkpoint(
    tmp_path: Path, grain_file: Path, request: pytest.FixtureRequest
) -> None:
    """4 slices, ``elastic_min_slice_count=1``: slice 3 dies during step F, the job goes on on MaxText's
    3-slice mesh; its replacement comes and the sidecar grows the job back. The grow's boundary (step G)
    is kept as a snapshot on the three slices' replicas, not written to a checkpoint, and the next
    attempt loads it onto the 4-slice mesh with the data position: no step lost at the grow, no record
    skipped or read twice across the three meshes."""
    require_maxtext_venv()
    seed = case_seed(request)
    fail_at = random.Random(seed).randint(3, 7)
    events = tmp_path / "events.jsonl"
    sc = Sidecar(num_slices=MULTI_SLICES)
    run = None
    try:
        run = start_snapshot_run(tmp_path, sc, "grow", 100_000, 1, f"{fail_at}:3", grain_file)
        survivors = frozenset({0, 1, 2})
        sc.wait_for(
            lambda: sc.applied(TrainerResumed, 0.0, lambda e: e.active == survivors),
            "the resume on the 3 survivors",
            run,
            timeout=RUN_TIMEOUT,
        )
        (tmp_path / "control" / "reconnect").touch()  # the replacement slice
        t_back = time.monotonic()
        sc.request(WorkerJoined(3, 0, "inc-2", node="node-3"))
        grown = sc.wait_for(
            lambda: sc.applied(TrainerResumed, t_back, lambda e: e.active == frozenset(range(MULTI_SLICES))),
            "the resume on every slice",
            run,
            timeout=RUN_TIMEOUT,
        )[-1].event
        sc.wait_for(lambda: sc.state.trainer.last_step > grown.step + 2, "steps after the grow", run)
        sc.request(OperatorCommand("abort", "end of test", restart=True))
        assert run.wait(RUN_TIMEOUT) == 42, run.tail()
    finally:
        if run is not None:
            run.kill()
        sc.stop()

    grows = [
        f
        for _, f in run.hook_lines("restart")
        if f["why"].endswith(f"-> [0, 1, 2, 3] at step {grown.step} (generation {grown.generation})")
    ]
    assert len(grows) == 1, run.hook_lines("restart")
    assert grows[0]["kept"] == f"snapshot of step {grown.step}", grows[0]
    assert grown.step - 1 not in checkpoint_labels(tmp_path, "grow"), "the grow wrote a checkpoint"
    assert grown.restored_from == "snapshot", grown
    loaded = restores(run)[-1]
    assert (loaded["source"], int(loaded["step"]), loaded.get("data")) == ("snapshot", grown.step, "restored"), loaded
    evs = run.events(events)
    meshes = [e["slices"] for e in evs if e["kind"] == "mesh"]
    assert meshes[0] == 4 and 3 in meshes and meshes[-1] == 4, meshes
    got_steps = kept_steps(evs)
    last = max(got_steps)
    assert sorted(got_steps) == list(range(1, last + 1)), sorted(got_steps)
    rows = consumed_rows(got_steps)
    file_rows = grain_data.rows(grain_file)
    assert len(rows) <= len(file_rows), f"{len(rows)} records read: the file wrapped, the check below cannot hold"
    assert rows == file_rows[: len(rows)], "records skipped or read twice"
    assert {int(e["devices"]) for e in got_steps.values()} == {8, 6}
    print(
        f"\ngrow (seed {seed}): slice 3 lost in step {fail_at}; grown back at step {grown.step} from a snapshot; "
        f"meshes {meshes}; {len(rows)} records in order over {last} steps"
    )


def test_a_grow_whose_snapshot_load_fails_keeps_training_on_the_smaller_mesh_and_grows_later(
    tmp_path: Path, grain_file: Path, request: pytest.FixtureRequest
) -> None:
    """As the grow test, but the first load of the grow's snapshot onto the 4-slice mesh fails
    (``ELASTIC_SIDECAR_TEST_FAIL_GROW_LOAD=1``). The job was healthy on 3 slices, so it goes back there
    from the same snapshot (no rewind to a checkpoint, no step lost) and tries the grow again
    ``GROW_RETRY_STEPS`` steps later, which then loads onto 4 slices."""
    require_maxtext_venv()
    seed = case_seed(request)
    fail_at = random.Random(seed).randint(3, 5)
    events = tmp_path / "events.jsonl"
    sc = Sidecar(num_slices=MULTI_SLICES)
    run = None
    every = frozenset(range(MULTI_SLICES))
    try:
        run = start_snapshot_run(
            tmp_path, sc, "regrow", 100_000, 1, f"{fail_at}:3", grain_file, {ENV_FAIL_GROW_LOAD: "1"}
        )
        sc.wait_for(
            lambda: sc.applied(TrainerResumed, 0.0, lambda e: e.active == frozenset({0, 1, 2})),
            "the resume on the 3 survivors",
            run,
            timeout=RUN_TIMEOUT,
        )
        (tmp_path / "control" / "reconnect").touch()  # the replacement slice
        t_back = time.monotonic()
        sc.request(WorkerJoined(3, 0, "inc-2", node="node-3"))
        grown = sc.wait_for(
            lambda: sc.applied(TrainerResumed, t_back, lambda e: e.active == every),
            "the resume on every slice",
            run,
            timeout=2 * RUN_TIMEOUT,
        )[-1].event
        sc.wait_for(lambda: sc.state.trainer.last_step > grown.step + 2, "steps after the grow", run)
        sc.request(OperatorCommand("abort", "end of test", restart=True))
        assert run.wait(RUN_TIMEOUT) == 42, run.tail()
    finally:
        if run is not None:
            run.kill()
        sc.stop()

    evs = run.events(events)
    assert [e["kind"] for e in evs if e["kind"] == "load_failed"] == ["load_failed"], "the fault was not injected"
    (failed,) = [f for _, f in run.hook_lines("grow_failed")]
    assert failed["back_to"] == [0, 1, 2], failed
    retried = [f for _, f in run.hook_lines("grow_retry")]
    assert retried and int(retried[0]["step"]) >= int(failed["retry_at"]), (failed, retried)
    loaded = restores(run)
    assert all(r["source"] in ("snapshot", "fresh") for r in loaded), f"a checkpoint was restored: {loaded}"
    assert loaded[0]["source"] == "fresh", loaded
    back = loaded[-2]  # the smaller mesh, from the grow's snapshot
    assert (back["source"], int(back["step"])) == ("snapshot", int(failed["step"])), loaded
    assert (loaded[-1]["source"], int(loaded[-1]["step"])) == ("snapshot", grown.step), loaded
    assert grown.restored_from == "snapshot" and grown.step >= int(failed["retry_at"]), grown
    meshes = [e["slices"] for e in evs if e["kind"] == "mesh"]
    assert meshes[0] == 4 and meshes[-1] == 4 and meshes.count(3) >= 2, meshes  # 4, 3, (4 failed), 3, 4
    got_steps = kept_steps(evs)
    last = max(got_steps)
    assert sorted(got_steps) == list(range(1, last + 1)), sorted(got_steps)
    rows = consumed_rows(got_steps)
    assert rows == grain_data.rows(grain_file)[: len(rows)], "records skipped or read twice"
    print(
        f"\ngrow whose load failed (seed {seed}): slice 3 lost in step {fail_at}; the grow at step {failed['step']} "
        f"went back to 3 slices; grown at step {grown.step}; meshes {meshes}; restores "
        f"{[(r['source'], r['step']) for r in loaded]}"
    )
