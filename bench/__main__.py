"""``python -m bench <name> [--quick] [--json PATH]``: run elastic-sidecar's benchmarks.

Names: recovery, detection, scale, flush, footprint, all. Results are merged
into ``docs/benchmarks.json`` and ``docs/benchmarks.md`` (with PNG plots) is
rendered again; ``--docs-dir`` points that elsewhere and ``--no-docs`` skips it.
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

from bench.common import ROOT, environment, log

NAMES = ("recovery", "detection", "scale", "flush", "footprint")
ALL_ORDER = ("footprint", "flush", "detection", "recovery", "scale")


def _floats(v: str) -> list[float]:
    return [float(x) for x in v.split(",") if x.strip()]


def _ints(v: str) -> list[int]:
    return [int(x) for x in v.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("name", choices=[*NAMES, "all"])
    ap.add_argument("--quick", action="store_true", help="a small single-run version (CI smoke test)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    ap.add_argument("--docs-dir", type=Path, default=ROOT / "docs", help="where benchmarks.md/.json/*.png go")
    ap.add_argument("--no-docs", action="store_true", help="do not touch the docs")
    ap.add_argument("--repeats", type=int, default=None, help="override the number of repeats")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the runs' files here (default: temp, removed)")
    ap.add_argument("--delays", type=_floats, default=None, help="recovery: provisioning delays, e.g. 0,10,60")
    ap.add_argument("--sizes", type=_ints, default=None, help="scale: worker counts, e.g. 1000,4000,10000")
    ap.add_argument("--cycles", type=int, default=None, help="scale: hold cycles per size")
    ap.add_argument("--profile", action="store_true", help="scale: run the coordinator under cProfile")
    ap.add_argument(
        "--what-if",
        type=_ints,
        default=None,
        help="scale: worker counts for the what-if run (keepalive 5 s, memoized up_slices); default 4000, '' for none",
    )
    ap.add_argument("--sizes-mib", type=_ints, default=None, help="flush: state sizes in MiB, e.g. 256,1024")
    return ap


def run_one(name: str, ns: argparse.Namespace) -> dict[str, Any]:
    wd = ns.workdir / name if ns.workdir else None
    if name == "recovery":
        from bench import recovery

        return recovery.run(quick=ns.quick, repeats=ns.repeats, delays=ns.delays, workdir=wd, keep=wd is not None)
    if name == "detection":
        from bench import detection

        return detection.run(quick=ns.quick, repeats=ns.repeats, workdir=wd)
    if name == "scale":
        from bench import scale

        return scale.run(
            quick=ns.quick, sizes=ns.sizes, cycles=ns.cycles, workdir=wd, profile=ns.profile, what_if=ns.what_if
        )
    if name == "flush":
        from bench import flush

        return flush.run(quick=ns.quick, repeats=ns.repeats, sizes_mib=ns.sizes_mib, workdir=wd)
    from bench import footprint

    return footprint.run(quick=ns.quick, repeats=ns.repeats, workdir=wd)


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the benchmarks' cleanup (their finally blocks)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    ns = build_parser().parse_args(argv)
    names = list(ALL_ORDER) if ns.name == "all" else [ns.name]
    env_info = environment()
    results: list[dict[str, Any]] = []
    failed = False
    t0 = time.monotonic()
    for name in names:
        log(f"{name}: starting{' (quick)' if ns.quick else ''}")
        t = time.monotonic()
        try:
            r = run_one(name, ns)
        except Exception as e:  # noqa: BLE001 - one failed benchmark must not lose the others
            traceback.print_exc()
            r = {"name": name, "quick": ns.quick, "error": f"{type(e).__name__}: {e}"}
            failed = True
        r["environment"] = env_info
        r["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        r["load_average"] = [round(x, 2) for x in os.getloadavg()]
        r.setdefault("duration_s", round(time.monotonic() - t, 1))
        results.append(r)
        for tg in r.get("targets", []):
            verdict = {True: "met", False: "MISSED", None: "not measured"}[tg["met"]]
            log(f"  {name}: {tg['name']}: {tg['measured']} {tg['unit']} (target {tg['target']}): {verdict}")
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        payload: Any = results[0] if ns.name != "all" else {"benchmarks": {r["name"]: r for r in results}}
        ns.json.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    if not ns.no_docs:
        from bench.report import update

        path = update(ns.docs_dir, results)
        log(f"wrote {path}")
    log(f"done in {time.monotonic() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
