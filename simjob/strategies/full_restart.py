"""Baseline (a): full restart, what a JobSet restart does on a lost host.

Every process stops on the fault (JobSet deletes and recreates every pod; the
trainer is killed: without ``jax.distributed`` a SIGTERM does not save, FACTS
section 9). The pods of the surviving slices come back at once, the lost
slice's after the stand-in provisioner's delay; once every slice is available
the trainer starts afresh (process start, imports, JAX start-up), restores the
last committed periodic checkpoint and compiles its step again. The restart is
triggered at the moment of the fault, which flatters this baseline: a real
JobSet first has to notice the failed pod.

    python -m simjob.strategies.full_restart [demo options]   # the harness
    python -m simjob.strategies.full_restart trainer ...      # the trainer process it starts
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from simjob.options import FaultSpec
from simjob.strategies.common import (
    PlainTrainer,
    StandinJob,
    Strategy,
    add_strategy_args,
    parse_trainer_args,
    run_strategy,
)

EXIT_CRASHED = 3


class FullRestart(Strategy):
    name = "full_restart"
    trainer_module = "simjob.strategies.full_restart"

    def __init__(self) -> None:
        self.waiting: set[int] = set()

    def on_fault(self, job: StandinJob, f: FaultSpec) -> float:
        t = time.time()
        job.kill_trainer()
        for key in list(job.hosts):
            job.stop_host(*key)
        self.waiting.add(f.slice)
        # The surviving slices' pods are recreated at once; the lost slice waits for provisioning.
        for s in range(job.ns.slices):
            if s not in self.waiting:
                for h in range(job.ns.hosts_per_slice):
                    job.start_host(s, h)
        return t

    def on_slice_back(self, job: StandinJob, s: int) -> None:
        if s not in self.waiting:
            job.recreate_slice(s)
            return
        self.waiting.discard(s)
        for h in range(job.ns.hosts_per_slice):
            job.start_host(s, h)
        if not self.waiting:
            job.start_trainer()

    def restart_pending(self) -> bool:
        return bool(self.waiting)


def trainer_main(argv: list[str]) -> int:
    from simjob.trainer import EventLog
    from trainer_hooks import is_slice_down

    ns = parse_trainer_args(argv)
    events = EventLog(ns.events or ns.workdir / "trainer-events.jsonl")
    events("start", {"slices": ns.slices, "steps": ns.steps, "pid": os.getpid()})
    t = PlainTrainer(ns, events)
    try:
        events("jax_ready", {"devices": len(t.jax.devices())})
        all_slices = list(range(ns.slices))
        if not t.runtime.wait_available(all_slices, timeout=120.0):
            events("abort", {"reason": "slices not available"})
            return EXIT_CRASHED
        step = t.build(all_slices, 0, "full restart: fresh process, last committed periodic checkpoint")
        try:
            step = t.train(step)
        except t.jax.errors.JaxRuntimeError as e:
            if not is_slice_down(e):
                raise
            # A trainer without elasticity dies on a slice-down error; JobSet restarts everything.
            events("abort", {"reason": str(e)[:200]})
            return EXIT_CRASHED
        t.finish(step)
        return 0
    finally:
        t.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["trainer"]:
        return trainer_main(argv[1:])
    ap = argparse.ArgumentParser(
        prog="python -m simjob.strategies.full_restart",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_strategy_args(ap)
    return run_strategy(ap.parse_args(argv), FullRestart())


if __name__ == "__main__":
    sys.exit(main())
