"""``elastic-sidecar``: the daemon's roles and the simulated job.

    elastic-sidecar coordinator --num-slices 4 ...   # beside the trainer
    elastic-sidecar worker --slice 2 --host 0 ...    # beside each TPU host
    elastic-sidecar admin status                     # look at a running job and steer it
    elastic-sidecar inject job.yaml > elastic.yaml   # add the sidecars to a JobSet from xpk
    elastic-sidecar drill --jobset J --slice 1       # delete a TPU pod; did the job hold its state?
    elastic-sidecar demo                             # a simulated 4-slice job on this machine
    elastic-sidecar plan --preset llama3-70b-v5p     # what each recovery strategy keeps, on paper

Exit codes: 0 done, 2 bad usage or configuration, 3 aborted by an operator, 42 the job must be
restarted (xpk restarts workloads that exit 42); the demo: 130, 143 or 129 stopped by SIGINT, SIGTERM
or SIGHUP (its terminal closed; every process of it stopped too).
`elastic-sidecar admin --help` and `elastic-sidecar drill --help` list those commands' own exit codes.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import sys

from agent import constants as C
from agent.config import ConfigError, CoordinatorConfig, WorkerConfig, add_coordinator_args, add_worker_args


def _version() -> str:
    try:
        return importlib.metadata.version("elastic-sidecar")
    except importlib.metadata.PackageNotFoundError:  # a source tree never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="elastic-sidecar",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = ap.add_subparsers(dest="role", metavar="{coordinator,worker,admin,inject,demo,drill,plan}")
    sub.required = True
    add_coordinator_args(sub.add_parser("coordinator", help="run the coordinator sidecar (one per job)"))
    add_worker_args(sub.add_parser("worker", help="run a worker sidecar (one per TPU host)"))
    # Each of these commands lives in its own module, which adds its arguments; its docstring is its help.
    for name, module_name, help_text in (
        (
            "admin",
            "admin_cli",
            "status, decisions, hold/resume/drain/undrain/checkpoint/abort through the coordinator's admin API",
        ),
        ("inject", "inject", "print a JobSet (xpk's Pathways or multi-controller shape) with elastic-sidecar added"),
        (
            "drill",
            "drill",
            "delete one TPU pod of a slice and report whether the job held its state (exit 0) or not (1)",
        ),
        ("plan", "plan", "model a job's goodput under interruptions for each recovery strategy (docs/plan.md)"),
    ):
        module = importlib.import_module(f"agent.{module_name}")
        getattr(module, f"add_{name}_args")(
            sub.add_parser(
                name,
                help=help_text,
                description=module.__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
        )
    demo = sub.add_parser(
        "demo",
        help="run a simulated multi-slice job on this machine with real processes",
        description="Run the simulated multi-slice job: coordinator, worker sidecars, stand-in Pathways "
        "workers, a real JAX trainer with Orbax checkpoints, and injected faults.",
    )
    try:
        from simjob.options import add_demo_args
    except ModuleNotFoundError as e:  # the production wheel: the demo is not in it (pyproject.toml)
        if e.name != "simjob":
            raise
        demo.set_defaults(demo_unavailable=True)
    else:
        add_demo_args(demo)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    # Known arguments first: without simjob the demo's parser has no options, and a user who typed
    # `demo --steps 20` needs to hear that the demo is missing, not that --steps is unknown.
    ns, extra = ap.parse_known_args(argv)
    if getattr(ns, "demo_unavailable", False):
        print(
            "elastic-sidecar demo: needs a source checkout (this install holds the daemon and hooks only): "
            "git clone <this repository> && cd elastic-sidecar && make demo",
            file=sys.stderr,
        )
        return C.EXIT_USAGE
    if extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if ns.role == "coordinator":
            from agent import coordinator
            from agent import log as logmod

            cfg = CoordinatorConfig.from_args(ns)
            # Configured here as serve() configures it, so the warnings are JSON lines like the rest.
            logmod.configure(cfg.log_format, cfg.log_level, jobset=cfg.job, role="coordinator")
            for warning in cfg.warnings():
                logmod.get().warning(warning)
            return asyncio.run(coordinator.serve(cfg))
        if ns.role == "worker":
            from agent import worker

            return asyncio.run(worker.serve(WorkerConfig.from_args(ns)))
        if ns.role == "admin":
            from agent import admin_cli

            return admin_cli.run(ns)
        if ns.role == "inject":
            from agent import inject

            return inject.run(ns)
        if ns.role == "drill":
            from agent import drill

            return drill.run(ns)
        if ns.role == "plan":
            from agent import plan

            return plan.run(ns)
        from simjob.harness import run_demo  # either --mode

        return run_demo(ns)
    except ConfigError as e:
        print(f"elastic-sidecar {ns.role}: {e}", file=sys.stderr)
        return C.EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
