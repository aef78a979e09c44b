"""What the coordinator's state costs at a job's size: ``python -m bench.state_cost [--hosts 10000,25000]``.

For each size, in this process (no gRPC, no disk: the decision core and the state file's renderer
alone, as the coordinator runs them):

* a decision on a registration (``WorkerJoined`` of a new host) and on a re-registration after a
  coordinator restart (every host awaited), CPU per decision, median of ``--repeats`` batches of
  500, taken with the job otherwise full;
* a state-file render (:class:`agent.durable.statefile.Renderer`) after one host changed (what each group
  commit of a registration storm pays) and a render from nothing (the first write, or after the
  wall clock drifted), and the file's size;
* the memory the hosts take in the state and in the renderer's cache (``tracemalloc``).

CPU is ``time.process_time``: on a busy machine it still counts only this process, but shared
caches make it read high; run it on a quiet one for figures. Prints one JSON object per size.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
import tracemalloc
from dataclasses import replace
from typing import Any

from agent.core.decide import decide
from agent.core.model import Phase, Policy, State, WorkerJoined, initial_state
from agent.durable import statefile

HOSTS_PER_SLICE = 100
BATCH = 500


def _join(i: int, s: int, h: int, incarnation: str | None = None) -> WorkerJoined:
    return WorkerJoined(
        s,
        h,
        incarnation or f"3f2a9c1e-{i:08d}-incarnation",
        f"gke-tpu-v5p-pool-{s:03d}-node-{h:03d}",
        f"tpu-v5p-pool-{s:03d}",
        0,
        registration=i,
    )


def _median_batch(fn: Any, repeats: int) -> float:
    """Median over ``repeats`` batches of ``fn(batch_index)``'s CPU seconds per item of its batch."""
    out = []
    for k in range(repeats):
        gc.collect()
        t = time.process_time()
        n = fn(k)
        out.append((time.process_time() - t) / n)
    return statistics.median(out)


def measure(hosts: int, repeats: int) -> dict[str, Any]:
    slices = hosts // HOSTS_PER_SLICE
    policy = Policy(num_slices=slices, hosts_per_slice=HOSTS_PER_SLICE)
    keys = [(s, h) for s in range(slices) for h in range(HOSTS_PER_SLICE)]
    state: State = initial_state(policy, 0.0)
    held_back = keys[-BATCH * repeats :]
    for i, (s, h) in enumerate(keys[: len(keys) - len(held_back)]):
        state = decide(state, _join(i, s, h), 1.0).state

    def registrations(k: int) -> int:
        nonlocal state
        for j, (s, h) in enumerate(held_back[k * BATCH : (k + 1) * BATCH]):
            state = decide(state, _join(10**6 + k * BATCH + j, s, h), 1.0).state
        return BATCH

    first = _median_batch(registrations, repeats)
    assert len(state.hosts) == hosts
    restored = replace(
        state,
        phase=Phase.RUNNING,
        deadline=None,
        active=policy.all_slices,
        expected_rejoin=frozenset(state.hosts),
        rejoin_deadline=1e9,
    )
    again = restored

    def reregistrations(k: int) -> int:
        nonlocal again
        for j, (s, h) in enumerate(keys[k * BATCH : (k + 1) * BATCH]):
            inc = again.hosts[(s, h)].incarnation
            again = decide(again, _join(2 * 10**6 + k * BATCH + j, s, h, inc), 2.0).state
        return BATCH

    rereg = _median_batch(reregistrations, repeats)

    renderer = statefile.Renderer()
    t = time.process_time()
    size = sum(map(len, renderer.chunks(state)))
    fresh = time.process_time() - t
    current = state

    def one_changed(k: int) -> int:
        nonlocal current
        key = keys[(k * 7919) % len(keys)]
        current = replace(
            current, hosts=current.hosts.with_record(key, replace(current.hosts[key], settled=k % 2 == 0))
        )
        renderer.chunks(current)
        return 1

    cached = _median_batch(one_changed, max(repeats, 9))
    tracemalloc.start()
    gc.collect()
    base = tracemalloc.get_traced_memory()[0]
    cold = statefile.Renderer()
    cold.chunks(state)
    gc.collect()
    cache_bytes = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    # The hosts' memory: a state built again under tracemalloc (it slows allocation: not while timing).
    tracemalloc.start()
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    fresh_state: State = initial_state(policy, 0.0)
    for i, (s, h) in enumerate(keys):
        fresh_state = decide(fresh_state, _join(i, s, h), 1.0).state
    gc.collect()
    state_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return {
        "hosts": hosts,
        "slices": slices,
        "decision_ms_registration": round(first * 1e3, 4),
        "decision_ms_reregistration_after_restart": round(rereg * 1e3, 4),
        "render_ms_one_host_changed": round(cached * 1e3, 3),
        "render_ms_from_nothing": round(fresh * 1e3, 1),
        "state_file_mib": round(size / 2**20, 2),
        "hosts_in_state_mib": round(state_bytes / 2**20, 1),
        "renderer_cache_mib": round(cache_bytes / 2**20, 1),
        "repeats": repeats,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.state_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="10000,25000", help="comma list of job sizes in hosts (multiples of 100)")
    ap.add_argument("--repeats", type=int, default=5, help="batches per figure (median)")
    ns = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in ns.hosts.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--hosts {ns.hosts!r}: expected a comma list of integers, e.g. 10000,25000")
    bad = [n for n in sizes if n < HOSTS_PER_SLICE * 2 or n % HOSTS_PER_SLICE]
    if bad or ns.repeats < 1 or any(n < 2 * BATCH * ns.repeats for n in sizes):
        ap.error(
            f"--hosts {ns.hosts!r} --repeats {ns.repeats}: each size must be a multiple of {HOSTS_PER_SLICE}, "
            f"at least {2 * BATCH * max(ns.repeats, 1)} ({BATCH} hosts a batch, twice, per repeat)"
        )
    for n in sizes:
        print(json.dumps(measure(n, ns.repeats)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
