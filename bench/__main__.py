"""``python -m bench <name>|all [--quick] [--json PATH] [--merge-into docs/benchmarks.json]``.

Every output holds ``git_sha`` (HEAD when the run started), ``dirty``, ``machine``, ``config`` and
``results`` (rows). ``--merge-into`` keeps the newest run of each benchmark in a combined file, which
``python -m bench.report`` renders; ``--docs-dir DIR`` does both. The TPU host-link copy is its own
command: ``python -m bench.host_link``.

Exit status: 0 when every benchmark ran, 1 when one failed, 2 on a dirty tree with --require-clean.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import (
    SCHEMA_VERSION,
    git_state,
    log,
    machine,
    maxtext_label,
    portable_argv,
    positive,
    trainer_of,
)

NAMES = ("recovery", "detection", "scale", "footprint")
SCALE_OPTIONS = (
    "sizes", "cycles", "heartbeat_interval", "heartbeat_timeout", "scenarios", "rejoin_grace", "streams_per_connection",
)  # fmt: skip
"""The options ``bench.scale.run`` takes by name, as parsed."""


def listed(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    """An argparse type: a comma list of ``kind``."""

    def parse(v: str) -> list[Any]:
        return [kind(x.strip()) for x in v.split(",") if x.strip()]

    parse.__name__ = f"comma list of {getattr(kind, '__name__', kind)}"  # argparse's error names it
    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = ap.add_argument
    add("name", choices=[*NAMES, "all"])
    add("--quick", action="store_true", help="a small version (smoke test; figures not representative)")
    add("--json", type=Path, default=None, help="write the result (one benchmark's JSON) here")
    add("--merge-into", type=Path, default=None, help="merge the result into this combined JSON file")
    add("--docs-dir", type=Path, default=None, help="merge into DIR/benchmarks.json and render DIR")
    add("--require-clean", action="store_true", help="refuse to run (exit 2) on a dirty working tree")
    add("--repeats", type=positive(int), default=None, help="runs per figure (recovery: runs per row)")
    add("--workdir", type=Path, default=None, help="keep the runs' files here (default: temp, removed)")
    add = ap.add_argument_group("recovery (the real MaxText; needs .venv-maxtext)").add_argument
    add("--trainer", choices=["maxtext"], default="maxtext", help="the trainer recovered (MaxText, the only one)")
    add("--maxtext-model", choices=["tiny", "larger"], default="tiny", help="model size (default tiny)")
    add(
        "--maxtext-min-slices",
        type=int,
        choices=[-1, 1, 2],
        default=1,
        help="elastic_min_slice_count of both elastic strategies: 1 (default) continues on the survivors, "
        "-1 waits for every slice",
    )
    add("--strategies", type=listed(str), default=None, help="comma list (default: all four)")
    add("--delays", type=listed(float), default=None, help="replacement delays in s (default 10; quick 1)")
    add("--checkpoint-periods", type=listed(int), default=None, help="in steps (default 1000; quick 20)")
    add("--local-checkpoint-period", type=int, default=None, help="local_checkpoint_rewind's, in steps")
    add("--seed", type=int, default=0, help="seed of the fault phases")
    add = ap.add_argument_group("scale").add_argument
    add("--sizes", type=listed(int), default=None, help="worker counts (default 10000,25000; quick 200)")
    add("--cycles", type=positive(int), default=None, help="hold cycles a run (default 3)")
    add("--heartbeat-interval", type=float, default=None, help="default: the shipped default")
    add("--heartbeat-timeout", type=float, default=None, help="default: the shipped default")
    add("--scenarios", type=listed(str), default=None, help="comma list: hold_cycles (default), coordinator_restart")
    add("--rejoin-grace", type=float, default=None, help="the coordinator's --rejoin-grace (default 10)")
    add(
        "--streams-per-connection",
        type=positive(int),
        default=1,
        help="stand-in hosts whose streams share one TCP connection (default 1: one each, as real hosts)",
    )
    return ap


def run_recovery(ns: argparse.Namespace, root: Path) -> dict[str, Any]:
    from bench import recovery_maxtext as rm

    # The default matrix (one period, one delay, 3 rounds) keeps `python -m bench all` within the refresh
    # time bench/report.py states.
    periods = ns.checkpoint_periods or ([20] if ns.quick else [1000])
    delays = ns.delays or ([1.0] if ns.quick else [10.0])
    runs = ns.repeats or 3
    r = rm.run(
        strategies=ns.strategies or list(rm.STRATEGIES),
        cases=[("kill", p, d) for p in periods for d in delays],
        runs=runs,
        seed=ns.seed,
        root=root,
        model=ns.maxtext_model,
        min_slices=ns.maxtext_min_slices,
        local_checkpoint_period=ns.local_checkpoint_period,
    )
    label = maxtext_label(ns.maxtext_model)  # a run of one model size replaces only its rows
    cfg = {"trainers": [label], "runs": runs, "checkpoint_periods": periods, "delays": delays, "quick": ns.quick}
    out: dict[str, Any] = {"quick": ns.quick, "config": cfg | {"maxtext": r["config"]}}
    for key, rows in (("results", r["rows"]), ("runs", r["runs"])):
        out[key] = [{**x, "trainer": label} for x in rows]
    return out


def run_one(name: str, ns: argparse.Namespace) -> dict[str, Any]:
    """One benchmark in its own directory: under ``--workdir``, kept, or a temporary one, removed."""
    wd = ns.workdir / name if ns.workdir else Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    wd.mkdir(parents=True, exist_ok=True)
    try:
        if name == "recovery":
            return run_recovery(ns, wd)
        opts = {k: getattr(ns, k) for k in SCALE_OPTIONS} if name == "scale" else {}
        return dict(importlib.import_module(f"bench.{name}").run(wd, quick=ns.quick, repeats=ns.repeats, **opts))
    finally:
        if ns.workdir is None:
            shutil.rmtree(wd, ignore_errors=True)


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the benchmarks' cleanup (their finally blocks)


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")


def wrap(
    name: str, r: dict[str, Any], git: dict[str, Any], argv: list[str], started: str, host: dict[str, Any]
) -> dict[str, Any]:
    """A benchmark's dict in the common shape: provenance (HEAD when it started), config, rows, then the rest."""
    extra = {k: v for k, v in r.items() if k not in ("config", "results")}
    return {
        "schema": SCHEMA_VERSION,
        "name": name,
        **git,
        "machine": host,
        "config": {"argv": portable_argv(argv), **(r.get("config") or {})},
        "results": list(r.get("results") or []),
        **extra,
        "started_at": started,
        "finished_at": now(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    argv = sys.argv[1:] if argv is None else argv
    ns = build_parser().parse_args(argv)
    git = git_state()
    if git["dirty"]:
        if ns.require_clean:
            log("the working tree has uncommitted changes (git status --porcelain); commit them first")
            return 2
        log("the working tree has uncommitted changes: the results will say dirty: true")
    results: list[dict[str, Any]] = []
    failed = False
    t0 = time.monotonic()
    for name in NAMES if ns.name == "all" else [ns.name]:
        log(f"{name}: starting{' (quick)' if ns.quick else ''}")
        started, host, t = now(), machine(), time.monotonic()
        try:
            r = run_one(name, ns)
        except Exception as e:  # noqa: BLE001 - one failed benchmark must not lose the others
            traceback.print_exc()
            r = {"quick": ns.quick, "error": f"{type(e).__name__}: {e}", "results": []}
            failed = True
        r.setdefault("duration_s", round(time.monotonic() - t, 1))
        results.append(wrap(name, r, git, argv, started, host))
        log(f"{name}: {len(r.get('results') or [])} result rows in {r['duration_s']} s")
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        payload: Any = results[0] if len(results) == 1 else combine(results)
        ns.json.write_text(json.dumps(payload, indent=1, default=str) + "\n")
        log(f"wrote {ns.json}")
    for store in [p for p in (ns.merge_into, ns.docs_dir / "benchmarks.json" if ns.docs_dir else None) if p]:
        merge(store, results)
        log(f"merged into {store}")
    if ns.docs_dir is not None:
        from bench.report import write

        log(f"wrote {write(ns.docs_dir / 'benchmarks.json', ns.docs_dir)}")
    log(f"done in {time.monotonic() - t0:.0f} s")
    return 1 if failed else 0


def combine(sections: list[dict[str, Any]]) -> dict[str, Any]:
    """Several benchmarks in one file: the common top level over per-benchmark sections. ``git_sha`` is
    the newest run's commit when every section ran clean at a known commit, else None; ``git_shas`` lists
    every commit a figure comes from."""
    shas = sorted(set().union(*(section_shas(s) for s in sections)) if sections else set())
    clean = bool(sections) and "unknown" not in shas and all(s.get("dirty") is False for s in sections)
    newest = max(sections, key=lambda s: str(s.get("started_at") or ""))["git_sha"] if clean else None
    return {
        "schema": SCHEMA_VERSION,
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
    """Every commit a section's figures come from (one per trainer, or one per scale row)."""
    by_trainer = (s.get("config") or {}).get("by_trainer") or {}
    shas = {str(c.get("git_sha")) for c in by_trainer.values() if c.get("git_sha")}
    shas |= {str(r["run"]["git_sha"]) for r in s.get("results") or [] if (r.get("run") or {}).get("git_sha")}
    return shas or {s.get("git_sha") or "unknown"}


def merge_recovery(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A recovery run of one model size replaces only that size's rows; each size keeps its run's config and
    commit under ``config["by_trainer"]``. A dirty run, or one at no known commit, replaces the section."""
    mine = {trainer_of(r) for r in new.get("results") or []}
    others = {trainer_of(r) for r in old.get("results") or []} - mine
    if not (mine and others and old.get("git_sha") and new.get("git_sha")):
        return new
    if old.get("dirty") is not False or new.get("dirty") is not False:
        return new
    old_cfg = old.get("config", {})
    old_by = old_cfg.get("by_trainer") or {}
    plain_cfg = {k: v for k, v in old_cfg.items() if k != "by_trainer"}
    old_run = {k: old.get(k) for k in RUN_KEYS}
    by_trainer = {t: {**old_run, **old_by.get(t, plain_cfg)} for t in sorted(others)}
    new_cfg = {k: v for k, v in new.get("config", {}).items() if k != "by_trainer"}
    by_trainer.update({t: {**new_cfg, **{k: new.get(k) for k in RUN_KEYS}} for t in mine})
    out = dict(new)
    out["config"] = {**new_cfg, "trainers": sorted(by_trainer), "by_trainer": by_trainer}
    for key in ("results", "runs"):
        out[key] = [r for r in old.get(key) or [] if trainer_of(r) not in mine] + list(new.get(key) or [])
    return out


def merge(store: Path, new: list[dict[str, Any]]) -> dict[str, Any]:
    """Each benchmark's newest run replaces its section of ``store`` (recovery: only its model size's rows)."""
    try:
        old = json.loads(store.read_text()).get("benchmarks", {}) if store.exists() else {}
    except (json.JSONDecodeError, AttributeError):
        old = {}
    sections = {k: v for k, v in old.items() if isinstance(v, dict) and v.get("schema") == SCHEMA_VERSION}
    for s in new:
        if s["name"] == "recovery" and "recovery" in sections:
            s = merge_recovery(sections["recovery"], s)
        sections[s["name"]] = s
    data = combine([sections[k] for k in NAMES if k in sections])
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return data


if __name__ == "__main__":
    sys.exit(main())
