"""``python -m bench <name> [--quick] [--json PATH] [--merge-into docs/benchmarks.json]``.

Names: goodput, recovery, step_overhead, detection, scale, flush, footprint,
all (goodput measures its inputs with the recovery benchmark; in ``all`` it
reuses that run's; ``all`` leaves out step_overhead, which runs MaxText:
about 30 minutes).  Every output has the
same top level: ``git_sha`` (HEAD when the run started), ``dirty`` (whether
``git status --porcelain`` showed changes), ``machine``, ``config`` (the
arguments) and ``results`` (a list of rows). ``--merge-into`` adds the
benchmark to a combined file (one entry per benchmark, the newest wins);
``python -m bench.report`` renders docs/benchmarks.md and its plots from that
file alone. ``--docs-dir DIR`` does both (merge into DIR/benchmarks.json and
render DIR/benchmarks.md). Nothing under docs/ is touched unless asked.

Exit status: 0 when every benchmark ran (whether or not it met its targets),
1 when one failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench.common import envelope, git_state, label_maxtext_model, log, machine, portable_argv, trainer_of
from bench.recovery import SETTLE_STEPS
from trainer_hooks.maxtext.snapshot import snapshot_every_arg

NAMES = ("goodput", "recovery", "step_overhead", "detection", "scale", "flush", "footprint")
ALL_ORDER = ("footprint", "flush", "detection", "recovery", "goodput", "scale")


def _floats(v: str) -> list[float]:
    return [float(x) for x in v.split(",") if x.strip()]


def _ints(v: str) -> list[int]:
    return [int(x) for x in v.split(",") if x.strip()]


def _words(v: str) -> list[str]:
    return [x.strip() for x in v.split(",") if x.strip()]


def _positive_int(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{v!r}: expected a whole number of 1 or more")
    return n


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("name", choices=[*NAMES, "all"])
    ap.add_argument("--quick", action="store_true", help="a small version (smoke test; figures not representative)")
    ap.add_argument("--json", type=Path, default=None, help="write the result (one benchmark's JSON) here")
    ap.add_argument("--merge-into", type=Path, default=None, help="merge the result into this combined JSON file")
    ap.add_argument(
        "--keep-other-periods",
        action="store_true",
        help="recovery, with --merge-into: keep the file's rows of this run's trainers at checkpoint periods this "
        "run did not run (each with its own run's commit), instead of replacing all of those trainers' rows",
    )
    ap.add_argument(
        "--keep-other-rows",
        action="store_true",
        help="scale, with --merge-into: keep the file's rows of sizes and scenarios this run did not run (each "
        "with its own run's commit), instead of replacing the whole section",
    )
    ap.add_argument("--docs-dir", type=Path, default=None, help="merge into DIR/benchmarks.json and render DIR")
    ap.add_argument(
        "--require-clean",
        action="store_true",
        help="refuse to run (exit 2) when the working tree has uncommitted changes: figures for the docs",
    )
    ap.add_argument("--repeats", type=int, default=None, help="runs per figure (recovery: runs per row)")
    ap.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep the runs' files here (default: temp, removed). recovery --trainer maxtext journals each "
        "finished run in DIR/recovery/maxtext/runs.jsonl: started again with the same DIR, clean commit and arguments, "
        "it goes on where it stopped (a 10,000-step period takes more than one sitting)",
    )
    g = ap.add_argument_group("recovery")
    g.add_argument(
        "--trainer",
        choices=["example", "maxtext", "all"],
        default="example",
        help="maxtext: the real MaxText 0.2.5 on the CPU (needs .venv-maxtext), full_restart, checkpoint_rewind, "
        "local_checkpoint_rewind and sidecar on one job, the kill fault (hang and notice rows say not run); "
        "--quick: 3 runs per row, checkpoint period 20, delay 1 s; a MaxText run takes 1-5 min on 2 cores "
        "(see bench/recovery_maxtext.py)",
    )
    g.add_argument(
        "--maxtext-model",
        choices=["tiny", "larger"],
        default=None,
        help="MaxText model size (default tiny); another size's rows are the trainer maxtext-<size>, kept and "
        "judged beside the tiny model's when merged",
    )
    g.add_argument(
        "--maxtext-min-slices",
        type=int,
        choices=[-1, 1, 2],
        default=None,
        help="MaxText's elastic_min_slice_count for checkpoint_rewind and sidecar: -1 (default) waits for both "
        "slices, 1 continues on the survivor and grows back when the replacement comes",
    )
    g.add_argument("--strategies", type=_words, default=None, help="comma list (default: all five)")
    g.add_argument("--faults", type=_words, default=None, help="comma list of kill,hang,notice (default: all)")
    g.add_argument("--delays", type=_floats, default=None, help="replacement delays in s, e.g. 5,30")
    g.add_argument("--checkpoint-periods", type=_ints, default=None, help="checkpoint periods in steps, e.g. 25,100")
    g.add_argument("--realistic-checkpoint-period", type=int, default=None)
    g.add_argument("--realistic-delay", type=float, default=None)
    g.add_argument("--sweep-faults", type=_words, default=None, help="faults run at the sweep's points")
    g.add_argument(
        "--sweep-strategies",
        type=_words,
        default=None,
        help="strategies run at the sweep's points other than the realistic one (default: all)",
    )
    g.add_argument(
        "--sweep",
        choices=["grid", "cross"],
        default=None,
        help="grid (default): every period x delay; cross: one axis at a time through the realistic point",
    )
    g.add_argument(
        "--fault-free-runs", type=int, default=None, help="rounds that run fault-free references (default: all)"
    )
    g.add_argument(
        "--fault-free-steps",
        type=int,
        default=None,
        help="example trainer: steps of each fault-free reference run (default: three checkpoint periods, at "
        f"least 100, plus the {SETTLE_STEPS} before its steady rate counts)",
    )
    g.add_argument("--state-mib", type=int, default=None, help="train state across all slices (>= 1024 documented)")
    g.add_argument("--no-donate", action="store_true", help="do not donate the state into the step")
    g.add_argument(
        "--snapshot-every",
        type=snapshot_every_arg,
        default=None,
        metavar="STEPS|auto",
        help="the sidecar's example trainer: steps between in-memory snapshots, or 'auto' (the default, the "
        "MaxText hook's: an interval measured to cost at most 1.5%% of the step, none once it reaches the "
        "checkpoint period); 1: before every step",
    )
    g.add_argument(
        "--local-checkpoint-period",
        type=int,
        default=None,
        help="local_checkpoint_rewind's checkpoint every N steps, both trainers (default: example 5, maxtext 20)",
    )
    g.add_argument("--poll-interval", type=float, default=None, help="pathwaysutils poll_interval (default 10)")
    g.add_argument("--seed", type=int, default=None, help="seed of the fault phases")
    g = ap.add_argument_group("scale")
    g.add_argument("--sizes", type=_ints, default=None, help="worker counts, e.g. 1000,4000,10000")
    g.add_argument("--cycles", type=int, default=None, help="hold/resume cycles per size")
    g.add_argument("--heartbeat-interval", type=float, default=None, help="default: the shipped default")
    g.add_argument("--heartbeat-timeout", type=float, default=None, help="default: the shipped default")
    g.add_argument("--profile", action="store_true", help="run the coordinator under cProfile")
    g.add_argument(
        "--heartbeats",
        choices=["datagram", "stream"],
        default="datagram",
        help="datagram (shipped): UDP heartbeats once the coordinator confirms them; stream: every heartbeat a "
        "message on the worker's stream (the design before datagrams; coordinator --heartbeat-datagrams off)",
    )
    g = ap.add_argument_group("scale (also: --repeats, runs of each size, default 3)")
    g.add_argument(
        "--scenarios",
        type=_words,
        default=None,
        help="comma list of hold_cycles (default), coordinator_restart (SIGKILL and restart the coordinator under "
        "load)",
    )
    g.add_argument(
        "--registration-rate",
        type=float,
        default=None,
        help="registrations each load generator starts per second at most (default 0: unpaced)",
    )
    g.add_argument("--rejoin-grace", type=float, default=None, help="the coordinator's --rejoin-grace (default 10)")
    g.add_argument(
        "--streams-per-connection",
        type=_positive_int,
        default=1,
        help="stand-in hosts whose streams share one TCP connection to the coordinator (default 1: one each, as "
        "real hosts). For a machine whose open-file limit cannot hold a socket a host: the rows say so "
        "(bench/scale_loadgen.py shared_channel_options says what is and is not the same)",
    )
    g = ap.add_argument_group("goodput (also takes the recovery options: the runs that measure its inputs)")
    g.add_argument("--run-hours", type=float, default=24.0, help="the stated run's length in hours (default 24)")
    g.add_argument(
        "--fault-interval-minutes", type=float, default=30.0, help="wall-clock minutes between faults (default 30)"
    )
    g.add_argument(
        "--fault-mix",
        default="kill=1,hang=1,notice=1",
        help="relative weight of each fault kind (default kill=1,hang=1,notice=1)",
    )
    g.add_argument(
        "--recovery-json",
        type=Path,
        default=None,
        help="combine the rows of this recovery result (python -m bench recovery --json, or a combined file such "
        "as docs/benchmarks.json: its recovery section) instead of running it; its commit is recorded",
    )
    g = ap.add_argument_group("step_overhead (also: --repeats, rounds, default 5)")
    g.add_argument(
        "--steps",
        type=int,
        default=None,
        help="fault-free MaxText steps per run (default 2000; each run is about 2 minutes on 2 cores)",
    )
    g.add_argument(
        "--concurrent",
        action="store_true",
        help="run plain MaxText and one other variant (--variants, default sidecar) side by side, each pinned to "
        "one CPU, then with the CPUs swapped; the overhead is the geometric mean of the two same-time ratios",
    )
    g.add_argument(
        "--variants",
        type=lambda v: [x for x in v.split(",") if x],
        default=None,
        help="the variants to run, plain among them: plain,elastic,sidecar (default all; plain,sidecar "
        "with --concurrent)",
    )
    g = ap.add_argument_group("flush")
    g.add_argument("--sizes-mib", type=_ints, default=None, help="state sizes in MiB, e.g. 256,1024")
    return ap


def recovery_of(data: dict[str, Any]) -> dict[str, Any]:
    """A recovery result: one (``python -m bench recovery --json``), or the ``recovery`` section of a combined
    file (``--merge-into``, docs/benchmarks.json); a file with neither is an error naming what it holds."""
    if "benchmarks" in data:
        sec = (data.get("benchmarks") or {}).get("recovery")
        if sec is None:
            raise ValueError(f"no recovery section in the combined file (it has {sorted(data['benchmarks'])})")
        return dict(sec)
    if data.get("name") not in (None, "recovery") or "results" not in data:
        raise ValueError(f"not a recovery result: name {data.get('name')!r}, keys {sorted(data)[:8]}")
    return data


# The recovery options, by their attribute on the parsed arguments: goodput measures its inputs with
# the recovery benchmark, so it takes the same ones. RECOVERY_ONLY go to the recovery benchmark alone.
RECOVERY_OPTIONS = (
    "strategies",
    "delays",
    "checkpoint_periods",
    "realistic_checkpoint_period",
    "realistic_delay",
    "seed",
    "state_mib",
    "snapshot_every",
    "local_checkpoint_period",
    "poll_interval",
    "maxtext_model",
    "maxtext_min_slices",
)
RECOVERY_ONLY = ("faults", "sweep_faults", "sweep_strategies", "sweep", "fault_free_runs", "fault_free_steps")


def recovery_options(ns: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments both :func:`bench.recovery.run` and :func:`bench.goodput.run` take."""
    opts = {opt: getattr(ns, opt) for opt in RECOVERY_OPTIONS}
    opts["trainers"] = ["example", "maxtext"] if ns.trainer == "all" else [ns.trainer]
    opts["runs"] = ns.repeats
    opts["donate"] = False if ns.no_donate else None
    return opts


def run_one(name: str, ns: argparse.Namespace, done: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """One benchmark; ``done``: the raw results of the benchmarks this invocation already ran."""
    wd = ns.workdir / name if ns.workdir else None
    if name == "goodput":
        from bench import goodput

        sched = goodput.Schedule(ns.run_hours, ns.fault_interval_minutes, goodput.parse_mix(ns.fault_mix))
        source, rec = None, (done or {}).get("recovery")
        if rec is not None:
            source = "the recovery benchmark of this invocation"
        elif ns.recovery_json is not None:
            rec, source = recovery_of(json.loads(ns.recovery_json.read_text())), str(ns.recovery_json)
        return goodput.run(
            quick=ns.quick,
            sched=sched,
            recovery_result=rec,
            recovery_source=source,
            workdir=wd,
            **recovery_options(ns),
            **({"fault_free_runs": ns.fault_free_runs} if ns.fault_free_runs else {}),
        )
    if name == "recovery":
        from bench import recovery

        only = {opt: getattr(ns, opt) for opt in RECOVERY_ONLY}
        return recovery.run(quick=ns.quick, workdir=wd, keep=wd is not None, **recovery_options(ns), **only)
    if name == "step_overhead":
        from bench import step_overhead

        variants = ns.variants or (["plain", "sidecar"] if ns.concurrent else list(step_overhead.VARIANTS))
        return step_overhead.run(
            quick=ns.quick,
            rounds=ns.repeats,
            steps=ns.steps,
            workdir=wd,
            model=ns.maxtext_model or "tiny",
            variants=variants,
            concurrent=ns.concurrent,
        )
    if name == "detection":
        from bench import detection

        return detection.run(quick=ns.quick, repeats=ns.repeats, workdir=wd)
    if name == "scale":
        from bench import scale

        return scale.run(
            quick=ns.quick,
            sizes=ns.sizes,
            cycles=ns.cycles,
            workdir=wd,
            profile=ns.profile,
            heartbeat_interval=ns.heartbeat_interval,
            heartbeat_timeout=ns.heartbeat_timeout,
            heartbeats=ns.heartbeats,
            runs=ns.repeats,
            scenarios=ns.scenarios,
            registration_rate=ns.registration_rate,
            rejoin_grace=ns.rejoin_grace,
            streams_per_connection=ns.streams_per_connection,
        )
    if name == "flush":
        from bench import flush

        return flush.run(quick=ns.quick, repeats=ns.repeats, sizes_mib=ns.sizes_mib, workdir=wd)
    from bench import footprint

    return footprint.run(quick=ns.quick, repeats=ns.repeats, workdir=wd)


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the benchmarks' cleanup (their finally blocks)


def wrap(
    name: str, r: dict[str, Any], git: dict[str, Any], argv: list[str], started: str, host: dict[str, Any]
) -> dict[str, Any]:
    """A benchmark's dict in the common shape: provenance first, its config and rows, the rest as extras."""
    extra = {k: v for k, v in r.items() if k not in ("name", "config", "results", "git_sha", "dirty", "machine")}
    out = envelope(
        name, {"argv": portable_argv(argv), **(r.get("config") or {})}, list(r.get("results") or []), **extra
    )
    out.update(git)  # HEAD when the run started, not when it ended
    out["machine"] = host  # as it was when the run started (its load average then)
    mod = sys.modules.get(f"bench.{name}")
    out["method"] = (mod.__doc__ or "").strip() if mod else None
    out["started_at"] = started
    out["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    out["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    argv = sys.argv[1:] if argv is None else argv
    ns = build_parser().parse_args(argv)
    names = list(ALL_ORDER) if ns.name == "all" else [ns.name]
    git = git_state()
    if git["dirty"]:
        if ns.require_clean:
            log("the working tree has uncommitted changes (git status --porcelain); commit them first")
            return 2
        log("the working tree has uncommitted changes: the results will say dirty: true")
    results: list[dict[str, Any]] = []
    done: dict[str, dict[str, Any]] = {}
    failed = False
    t0 = time.monotonic()
    for name in names:
        log(f"{name}: starting{' (quick)' if ns.quick else ''}")
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        host = machine()
        t = time.monotonic()
        try:
            r = run_one(name, ns, done)
        except Exception as e:  # noqa: BLE001 - one failed benchmark must not lose the others
            traceback.print_exc()
            r = {"quick": ns.quick, "error": f"{type(e).__name__}: {e}", "results": []}
            failed = True
        r.setdefault("duration_s", round(time.monotonic() - t, 1))
        done[name] = {**r, **git}
        results.append(wrap(name, r, git, argv, started, host))
        log(f"{name}: {len(r.get('results') or [])} result rows in {r['duration_s']} s")
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        payload: Any = results[0] if len(results) == 1 else combine(results)
        ns.json.write_text(json.dumps(payload, indent=1, default=str) + "\n")
        log(f"wrote {ns.json}")
    targets = [p for p in (ns.merge_into, ns.docs_dir / "benchmarks.json" if ns.docs_dir else None) if p]
    for store in targets:
        merge(store, results, keep_periods=ns.keep_other_periods, keep_rows=ns.keep_other_rows)
        log(f"merged into {store}")
    if ns.docs_dir is not None:
        from bench.report import write

        log(f"wrote {write(ns.docs_dir / 'benchmarks.json', ns.docs_dir)}")
    log(f"done in {time.monotonic() - t0:.0f} s")
    return 1 if failed else 0


def combine(sections: list[dict[str, Any]]) -> dict[str, Any]:
    """Several benchmarks in one file: the common top level over per-benchmark sections.

    ``git_sha`` is the commit of the newest run (by ``started_at``) when every section ran on a
    clean tree at a known commit, else None; ``git_shas`` lists every commit any figure comes
    from (a recovery section's trainers may each have their own), and each section keeps its own
    ``git_sha``. ``dirty`` is true when any section's tree was dirty;
    ``results`` is every row, each with its ``benchmark``.
    """
    shas = sorted(set().union(*(section_shas(s) for s in sections)) if sections else set())
    clean = bool(sections) and "unknown" not in shas and all(s.get("dirty") is False for s in sections)
    newest = max(sections, key=lambda s: str(s.get("started_at") or ""))["git_sha"] if clean else None
    return {
        "schema": 2,
        "git_sha": newest,
        "git_shas": shas,
        "dirty": any(s.get("dirty") is not False for s in sections),
        "machine": sections[-1]["machine"] if sections else machine(),
        "config": {s["name"]: s["config"] for s in sections},
        "results": [{"benchmark": s["name"], **row} for s in sections for row in s["results"]],
        "benchmarks": {s["name"]: s for s in sections},
    }


RUN_KEYS = ("git_sha", "dirty", "started_at", "duration_s", "machine", "load_average_at_end")
"""What says which run a trainer's recovery rows come from: kept with its config under ``by_trainer``."""


def section_shas(s: dict[str, Any]) -> set[str]:
    """Every commit a section's figures come from (a recovery section may hold one per trainer, a scale
    section one per row)."""
    by_trainer = (s.get("config") or {}).get("by_trainer") or {}
    shas = {str(c.get("git_sha")) for c in by_trainer.values() if c.get("git_sha")}
    shas |= {str(r["run"]["git_sha"]) for r in s.get("results") or [] if (r.get("run") or {}).get("git_sha")}
    return shas or {s.get("git_sha") or "unknown"}


def _period_key(trainer: str, period: Any) -> str:
    """``by_trainer``'s key for a trainer's rows at one checkpoint period kept from an earlier run."""
    return f"{trainer} (period {period})"


def keep_other_periods(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` (a recovery run of some trainers) with the rows of ``old`` at checkpoint periods the new run did
    not run, for the same trainers, kept beside them (``--keep-other-periods``): so that a trainer's periods can
    be published by separate runs (MaxText's 10,000-step period takes hours on its own). Each kept period keeps
    its run's config and commit under ``config["by_trainer"]["<trainer> (period <P>)"]``; the trainer's own
    entry is the new run's (its realistic point). Both runs must be clean and name their trainers, else ``new``."""
    mine = set(new.get("config", {}).get("trainers") or [])
    if old.get("dirty") is not False or new.get("dirty") is not False or not mine or not old.get("git_sha"):
        return new
    ran = {(trainer_of(r), r.get("checkpoint_period")) for r in new.get("results") or []}

    def kept(r: dict[str, Any]) -> bool:
        return trainer_of(r) in mine and (trainer_of(r), r.get("checkpoint_period")) not in ran

    kept_rows = [r for r in old.get("results") or [] if kept(r)]
    if not kept_rows:
        return new
    old_cfg = old.get("config", {})
    by_old = old_cfg.get("by_trainer") or {}
    old_run = {k: old.get(k) for k in RUN_KEYS}
    out = dict(new)
    cfg = dict(new.get("config", {}))
    by_trainer = dict(cfg.get("by_trainer") or {t: {k: v for k, v in cfg.items() if k != "by_trainer"} for t in mine})
    for t, period in sorted({(trainer_of(r), r.get("checkpoint_period")) for r in kept_rows}, key=str):
        key = _period_key(t, period)
        source = by_old.get(key) or {
            **old_run,
            **by_old.get(t, {k: v for k, v in old_cfg.items() if k != "by_trainer"}),
        }
        by_trainer[key] = source
    cfg["by_trainer"] = by_trainer
    out["config"] = cfg
    out["results"] = list(new.get("results") or []) + kept_rows
    for key in ("ratios", "runs", "fault_free_runs"):
        out[key] = list(new.get(key) or []) + [r for r in old.get(key) or [] if kept(r)]
    return out


def merge_recovery(old: dict[str, Any], new: dict[str, Any], keep_periods: bool = False) -> dict[str, Any]:
    """A recovery run for some trainers replaces only those trainers' rows.

    So the example trainer and MaxText can be run separately (each with the rounds it can afford)
    into one section, also at different commits when both ran on a clean tree: each trainer keeps
    the config it ran with and its run's commit, start and duration under ``config["by_trainer"]``
    (the page prints them per trainer), and the section's ``git_sha`` is the newest run's. A dirty
    run, or one that names no trainer, replaces the section.
    """
    if keep_periods:
        new = keep_other_periods(old, new)
    mine = set(new.get("config", {}).get("trainers") or [])
    if old.get("dirty") is not False or new.get("dirty") is not False or not mine:
        return new
    if not old.get("git_sha") or not new.get("git_sha"):
        return new
    old_cfg = old.get("config", {})
    old_run = {k: old.get(k) for k in RUN_KEYS}
    by_trainer = {
        t: {
            **old_run,
            **(old_cfg.get("by_trainer") or {}).get(t, {k: v for k, v in old_cfg.items() if k != "by_trainer"}),
        }
        for t in old_cfg.get("trainers") or []
        if t not in mine
    }
    # Periods kept from an earlier run of the same trainer (keep_other_periods) and of other trainers.
    by_trainer.update(
        {
            k: v
            for k, v in ((new.get("config") or {}).get("by_trainer") or {}).items()
            if k not in mine and " (period " in k
        }
    )
    by_trainer.update(
        {
            k: v
            for k, v in (old_cfg.get("by_trainer") or {}).items()
            if " (period " in k and k.split(" (period ")[0] not in mine
        }
    )
    if not by_trainer:
        return new
    new_cfg = {k: v for k, v in new.get("config", {}).items() if k != "by_trainer"}
    new_run = {k: new.get(k) for k in RUN_KEYS}
    by_trainer.update({t: {**new_cfg, **new_run} for t in mine})
    out = dict(new)
    out["config"] = {
        **new_cfg,
        "trainers": sorted(k for k in by_trainer if " (period " not in k),
        "by_trainer": by_trainer,
    }
    for key in ("results", "ratios", "runs", "fault_free_runs"):
        out[key] = [r for r in old.get(key) or [] if trainer_of(r) not in mine] + list(new.get(key) or [])
    return out


def _scale_key(r: dict[str, Any]) -> tuple[int, str]:
    return int(r.get("workers") or 0), str(r.get("scenario") or "hold_cycles")


def scale_run(s: dict[str, Any]) -> dict[str, Any]:
    """What says which run a scale row comes from (``row["run"]`` once rows of several runs share a section)."""
    cfg = s.get("config") or {}
    return {
        **{k: s.get(k) for k in ("git_sha", "dirty", "started_at", "duration_s")},
        "net_core_rmem_max": cfg.get("net_core_rmem_max"),
        "argv": cfg.get("argv"),
        "machine": {k: (s.get("machine") or {}).get(k) for k in MACHINE_KEYS},
    }


MACHINE_KEYS = ("cores", "cores_usable", "memory_gib", "cpu_model", "python")
"""What a scale row's run says of the machine it ran on (rows of several runs may come from different VMs)."""


def keep_other_rows(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` (a scale run) with ``old``'s rows of the (workers, scenario) pairs it did not run kept beside its
    own (``--keep-other-rows``): so that a size or a scenario can be published by a run of its own (a 25,000-worker
    restart takes a while). Every row then names its run (``row["run"]``: commit, start, duration, rmem_max,
    command line). Both runs must be clean full runs at a known commit, else ``new``."""
    if any(s.get("dirty") is not False or s.get("quick") or not s.get("git_sha") for s in (old, new)):
        return new
    ran = {_scale_key(r) for r in new.get("results") or []}
    kept = [r for r in old.get("results") or [] if _scale_key(r) not in ran]
    if not kept:
        return new
    old_run, new_run = scale_run(old), scale_run(new)
    order = {name: i for i, name in enumerate(("hold_cycles", "health_reports", "coordinator_restart"))}
    rows = [{**r, "run": r.get("run") or old_run} for r in kept]
    rows += [{**r, "run": new_run} for r in new.get("results") or []]
    rows.sort(key=lambda r: (order.get(_scale_key(r)[1], 9), _scale_key(r)[0]))
    # The kept rows' runs in detail too (the page reads e.g. the load generators' CPUs from them).
    sizes = [x for x in old.get("sizes") or [] if _scale_key(x) not in ran] + list(new.get("sizes") or [])
    return {**new, "results": rows, "sizes": sizes}


def merge(
    store: Path, new: list[dict[str, Any]], keep_periods: bool = False, keep_rows: bool = False
) -> dict[str, Any]:
    old: dict[str, Any] = {}
    if store.exists():
        try:
            old = json.loads(store.read_text()).get("benchmarks", {})
        except (json.JSONDecodeError, AttributeError):
            old = {}
    sections = {k: v for k, v in old.items() if isinstance(v, dict) and v.get("schema") == 2}
    for s in new:
        if s["name"] == "recovery":
            # Runs written before MaxText's rows were labelled by model size (bench.common.maxtext_label).
            s = label_maxtext_model(s)
        if s["name"] == "recovery" and "recovery" in sections:
            s = merge_recovery(sections["recovery"], s, keep_periods=keep_periods)
        if s["name"] == "scale" and "scale" in sections and keep_rows:
            s = keep_other_rows(sections["scale"], s)
        sections[s["name"]] = s
    data = combine([sections[k] for k in NAMES if k in sections])
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return data


if __name__ == "__main__":
    sys.exit(main())
