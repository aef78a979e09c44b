"""A maintenance notice drains one slice of a 4-slice MaxText job, which goes on on 3 from memory (issue 52).

The job is :mod:`tests.maxtext.test_multislice_snapshot_maxtext`'s (8 CPU devices in 4 slices of 2, grain
data, a snapshot every step, ``elastic_min_slice_count=3``). A notice for slice 3's node holds the job at a
step boundary; the hook makes the newest snapshot that step's and the next ``elastic_retry`` attempt restores
it on slices 0-2 from their hosts' memory: no checkpoint is written for the drain. The reference is plain
MaxText run to the same step on 4 slices with a checkpoint at its end, then resumed from it on 3 slices: the
drained job must consume the same batches and have the same losses after the drain (1e-5).

The notice also names the mesh the job will run on next: the hook compiles the train step and the state's
initialiser for slices 0-2 in the background into MaxText's persistent compilation cache (``jax_cache_dir``,
empty at the start), and the attempt on 3 slices loads both from there instead of compiling them.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.core.model import NodeNotice, TrainerHeld, TrainerResumed, TrainerStepped
from simjob.maxtext.cpu_elastic import ENV, ENV_EVENTS, ENV_SLICES
from simjob.maxtext.job import MULTI_SLICE_MESH, MULTI_SLICES
from tests.maxtext.harness import PATCHED_MODULE, MaxTextRun, Sidecar, checkpoint_labels, maxtext_args
from tests.maxtext.test_multislice_snapshot_maxtext import (
    LOSS_TOLERANCE,
    RUN_TIMEOUT,
    SLOW_START,
    consumed_rows,
    grain_file,  # noqa: F401 (the module-scoped fixture)
    kept_steps,
    restores,
    start_snapshot_run,
)

pytestmark = pytest.mark.maxtext

AFTER = 4
"""Steps compared after the drain."""


def reference_run(tmp_path: Path, data: Path, steps: int, slices: int, *extra: str) -> MaxTextRun:
    """Plain MaxText (no sidecar, no elastic mode, no snapshots) on ``slices`` slices of 2 CPU devices."""
    args = maxtext_args(tmp_path, "reference", steps, *MULTI_SLICE_MESH, *extra, data=data)
    env = {ENV: "1", ENV_SLICES: str(slices), ENV_EVENTS: str(tmp_path / f"reference-{steps}.jsonl")}
    return MaxTextRun(f"reference-{steps}", args, tmp_path, module=PATCHED_MODULE, env=env, devices=2 * slices)


def test_a_notice_drain_goes_on_on_three_slices_from_memory_with_no_checkpoint_and_the_references_losses(
    tmp_path: Path,
    grain_file: Path,  # noqa: F811
) -> None:
    sc = Sidecar(num_slices=MULTI_SLICES)
    run = None
    try:
        # JAX writes a program to the persistent cache only if it took at least a second to compile (its
        # default): the tiny model's train step may compile faster on an idle machine.
        no_threshold = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
        # An empty cache of its own: the test asserts that the 3-slice programs came from the prepare.
        run = start_snapshot_run(
            tmp_path, sc, "drain", 100_000, 3, "", grain_file, extra_env=no_threshold, fresh_cache=True
        )
        sc.wait_for(
            lambda: sc.applied(TrainerStepped, 0.0, lambda e: e.step >= 3), "three steps", run, timeout=SLOW_START
        )
        t0 = time.monotonic()
        sc.request(
            NodeNotice(
                kind="terminate_on_host_maintenance",
                source="pubsub",
                node="node-3",
                deadline=t0 + 120,
                reason="test notice",
            )
        )
        survivors = frozenset({0, 1, 2})
        resumed = sc.wait_for(
            lambda: sc.applied(TrainerResumed, t0, lambda e: e.active == survivors),
            "the resume on the 3 slices that remain",
            run,
            timeout=RUN_TIMEOUT,
        )[-1].event
        held = sc.applied(TrainerHeld, t0)[-1].event
        drained = held.step
        assert checkpoint_labels(tmp_path, "drain") == [], "a checkpoint was written for the drain"
        sc.wait_for(lambda: sc.state.trainer.last_step > drained + AFTER + 2, "steps on 3 slices", run)
    finally:
        if run is not None:
            run.kill()  # no abort: its flush would write a checkpoint after the drain
        sc.stop()

    assert (resumed.step, resumed.restored_from) == (drained, "snapshot"), resumed
    assert held.flush_bytes == 0 and not held.flush_error, held
    assert held.committed_step < drained, "the hold committed a step: something was flushed"
    assert checkpoint_labels(tmp_path, "drain") == [], "a checkpoint was written"
    assert [f["step"] for _, f in run.hook_lines("kept_in_memory")] == [drained], run.tail()
    loaded = restores(run)[-1]
    assert (loaded["source"], int(loaded["step"]), loaded.get("data")) == ("snapshot", drained, "restored"), loaded
    evs = run.events(tmp_path / "events.jsonl")
    assert [e["slices"] for e in evs if e["kind"] == "mesh"] == [4, 3], "MaxText's own mesh: 4 slices, then 3"
    # The 3-slice train step and state initialiser: prepared during the notice, then loaded from the persistent
    # cache by the attempt.
    prepared = [f for _, f in run.hook_lines("prepared")]
    assert [f["slices"] for f in prepared] == [[0, 1, 2]], run.tail()
    assert sorted(prepared[0]["programs"]) == ["initial_state", "train_step"], prepared
    assert [e["slice_indices"] for e in evs if e["kind"] == "mesh_prepared"] == [[0, 1, 2]]
    shrunk_at = next(e["t"] for e in evs if e["kind"] == "mesh" and e["slices"] == 3)
    hits = [e["t"] for e in evs if e["kind"] == "cache_hit" and e["what"] == "jit_train_step"]
    assert hits and min(hits) > shrunk_at, ("the attempt on 3 slices compiled its train step", hits, shrunk_at)
    # MaxText jits its initialiser (``jax.jit(lambda: ...)``: module ``jit__lambda``) after the restore and
    # before it compiles the train step; only the prepare can have put the 3-slice one in the cache.
    inits = [e["t"] for e in evs if e["kind"] == "cache_hit" and e["what"] == "jit__lambda"]
    assert any(shrunk_at < t < min(hits) for t in inits), ("the attempt compiled its initialiser", inits, shrunk_at)
    got_steps = kept_steps(evs)

    # The reference: the same job to the drained step on 4 slices, then resumed from a checkpoint on 3.
    ref4 = reference_run(tmp_path, grain_file, drained, 4, "save_checkpoint_on_completion=true")
    assert ref4.wait(SLOW_START) == 0, ref4.tail()
    assert checkpoint_labels(tmp_path, "reference") == [drained - 1]
    ref3 = reference_run(tmp_path, grain_file, drained + AFTER, 3)
    assert ref3.wait(SLOW_START) == 0, ref3.tail()
    assert min(ref3.losses()) == drained, "the reference did not resume at the drained step"
    want = {**ref4.losses(), **ref3.losses()}
    want_steps = {
        **kept_steps(ref4.events(tmp_path / f"reference-{drained}.jsonl")),
        **kept_steps(ref3.events(tmp_path / f"reference-{drained + AFTER}.jsonl")),
    }
    compared = range(1, drained + AFTER + 1)
    assert all(s in got_steps and s in want_steps for s in compared), (sorted(got_steps), sorted(want_steps))
    assert consumed_rows({s: got_steps[s] for s in compared}) == consumed_rows({s: want_steps[s] for s in compared})
    assert {int(got_steps[s]["devices"]) for s in compared} == {8, 6}
    got = run.losses()
    after = range(drained, drained + AFTER)  # step indices: the first runs after `drained` completed steps
    assert all(s in got and s in want for s in after), (sorted(got), sorted(want))
    worst = max(abs(got[s] - want[s]) for s in after)
    assert worst <= LOSS_TOLERANCE, {s: (got[s], want[s]) for s in after}
    print(
        f"\nnotice drain of slice 3 at step {drained}: went on on 3 slices from a snapshot, no checkpoint; "
        f"worst loss difference over {AFTER} steps {worst:.2e}"
    )
