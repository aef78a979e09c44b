"""Recovery: the same simulated job and fault under three strategies.

* ``full_restart`` (:mod:`simjob.strategies.full_restart`): every process stops
  on the fault, the job waits for all slices (the provisioning delay), starts
  the trainer afresh and restores the last periodic checkpoint.
* ``checkpoint_rewind`` (:mod:`simjob.strategies.checkpoint_rewind`): MaxText's
  way, pathwaysutils ``Manager.elastic_retry`` (poll_interval 10 s,
  minimum_slice_count set) re-runs training from the last committed
  checkpoint on ``DATA_LOSS``, and again when it grows back.
* ``elastic_sidecar``: the real ``python -m agent demo`` (reactive: the host is
  SIGKILLed); ``elastic_sidecar_notice`` as well when the demo knows the
  ``notice`` fault kind.

Every run uses the example trainer (4 slices x 2 CPU devices, 50 ms steps,
periodic async Orbax saves), the stand-in Pathways workers and provisioner,
and one fault in the middle of a checkpoint period. All figures are computed
here, the same way for every strategy, from the trainer's event log:

* ``recovery_s``: fault until progress is regained: the trainer completes a
  step numbered above the last step it completed before its recovery began
  (the first ``resumed`` after the fault; a step that was in flight at the
  fault and finished counts as completed before);
* ``lost_steps``: completed steps that were computed again (the rewind);
* ``fault_cost_s``: full-capacity training seconds the fault cost, from the
  fault until the run ends (after the strategy is back on every slice): wall
  time minus useful work, a step on k of n slices counting k/n of a nominal
  step, less the fault-free overhead rate measured before the fault;
* ``goodput``: 1 - fault_cost_s / N for a run with one such fault every N s.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import PY, ROOT, env, log, median, read_jsonl, rnd, target

NAME = "recovery"
BASE_CMD = {
    "full_restart": [PY, "-m", "simjob.strategies.full_restart"],
    "checkpoint_rewind": [PY, "-m", "simjob.strategies.checkpoint_rewind"],
    "elastic_sidecar": [PY, "-m", "agent", "demo"],
    "elastic_sidecar_notice": [PY, "-m", "agent", "demo"],
}
LABELS = {
    "full_restart": "(a) full restart",
    "checkpoint_rewind": "(b) checkpoint rewind (MaxText / pathwaysutils)",
    "elastic_sidecar": "(c) elastic-sidecar, reactive (kill)",
    "elastic_sidecar_notice": "(c) elastic-sidecar, proactive (notice)",
}


@dataclass
class Config:
    slices: int = 4
    devices_per_slice: int = 2
    step_seconds: float = 0.05
    checkpoint_period: int = 50
    fault_step: int = 75
    fault_slice: int = 1
    min_slices: int = 2
    timeout: float = 180.0
    poll_interval: float = 10.0
    delays: list[float] = field(default_factory=lambda: [1.0, 10.0, 60.0])
    """1 s, not 0: with an instant replacement the demo trainer can read a replica on the replaced
    slice that the simulator still marks lost (a race in simjob/trainer.py, see docs/benchmarks.md)."""
    realistic_delay: float = 60.0
    repeats: int = 3
    long_delay_repeats: int = 2
    """Runs at delays of 30 s and more (each takes over a minute per strategy), to keep the suite near 25 min."""
    fault_every_s: list[float] = field(default_factory=lambda: [600.0, 3600.0])
    # Seconds each strategy's run continues after the provisioning delay: enough to be back on
    # every slice and run a little (rewind: up to one 10 s poll, then a rewind of up to a period).
    margin_s: dict[str, float] = field(
        default_factory=lambda: {
            "full_restart": 7.0,
            "checkpoint_rewind": 16.0,
            "elastic_sidecar": 5.0,
            "elastic_sidecar_notice": 5.0,
        }
    )
    quick: bool = False

    def repeats_for(self, delay: float) -> int:
        return min(self.repeats, self.long_delay_repeats) if delay >= 30 else self.repeats

    @classmethod
    def make(cls, quick: bool, repeats: int | None = None, delays: list[float] | None = None) -> Config:
        c = cls()
        if quick:
            c.quick = True
            c.checkpoint_period = 20
            c.fault_step = 30
            c.delays = [1.0]
            c.realistic_delay = 1.0
            c.repeats = 1
            c.margin_s = {
                "full_restart": 3.0,
                "checkpoint_rewind": 3.0,
                "elastic_sidecar": 2.0,
                "elastic_sidecar_notice": 2.0,
            }
        if repeats is not None:
            c.repeats = repeats
            c.long_delay_repeats = repeats
        if delays:
            c.delays = sorted(delays)
            if c.realistic_delay not in c.delays:
                c.realistic_delay = max(c.delays)
        return c


def notice_available() -> bool:
    try:
        from simjob.options import FAULT_KINDS
    except ImportError:
        return False
    return "notice" in FAULT_KINDS


def strategies() -> list[str]:
    names = ["full_restart", "checkpoint_rewind", "elastic_sidecar"]
    if notice_available():
        names.append("elastic_sidecar_notice")
    return names


# ---------------------------------------------------------------------------
# one run
# ---------------------------------------------------------------------------


def _steps_for(cfg: Config, strategy: str, delay: float) -> int:
    """Steps for a run that ends a little after the strategy is back on every slice.

    A full restart makes no progress while it waits for the slice, so its run needs no steps for the delay.
    """
    wait = 0.0 if strategy == "full_restart" else delay
    return cfg.fault_step + int(math.ceil((wait + cfg.margin_s[strategy]) / cfg.step_seconds))


def run_one(cfg: Config, strategy: str, delay: float, rep: int, root: Path) -> dict[str, Any]:
    wd = root / f"{strategy}-d{delay:g}-r{rep}"
    if wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    steps = _steps_for(cfg, strategy, delay)
    kind = "notice" if strategy == "elastic_sidecar_notice" else "kill"
    run_timeout = 120.0 + delay + steps * cfg.step_seconds * 2
    cmd = [
        *BASE_CMD[strategy],
        "--workdir",
        str(wd / "job"),
        "--slices",
        str(cfg.slices),
        "--devices-per-slice",
        str(cfg.devices_per_slice),
        "--steps",
        str(steps),
        "--step-seconds",
        str(cfg.step_seconds),
        "--checkpoint-period",
        str(cfg.checkpoint_period),
        "--min-slices",
        str(cfg.min_slices),
        "--timeout",
        str(cfg.timeout),
        "--replacement-delay",
        str(delay),
        "--fault",
        f"{kind}:{cfg.fault_slice}.0@{cfg.fault_step}",
        "--summary-json",
        str(wd / "summary.json"),
        "--quiet",
        "--run-timeout",
        str(run_timeout),
    ]
    if strategy == "checkpoint_rewind":
        cmd += ["--poll-interval", str(cfg.poll_interval)]
    t0 = time.monotonic()
    with open(wd / "output.log", "wb") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env(), cwd=ROOT, timeout=run_timeout + 60)
    wall = time.monotonic() - t0
    summary = json.loads((wd / "summary.json").read_text()) if (wd / "summary.json").exists() else {}
    m = analyse(wd / "job", summary, cfg.slices, strategy)
    m.update(
        {
            "strategy": strategy,
            "delay_s": delay,
            "rep": rep,
            "exit_code": proc.returncode,
            "run_wall_s": round(wall, 2),
            "steps": steps,
            "workdir": str(wd),
        }
    )
    if proc.returncode != 0:
        m["error"] = f"exit code {proc.returncode}; see {wd / 'output.log'}"
    return m


def demo_fault_time(job: Path, summary: dict[str, Any]) -> float | None:
    """The demo's fault time, rebuilt from its summary and journal.

    The demo's summary JSON carries detection_seconds but not the fault time:
    the fault time is the detection record's time minus detection_seconds (the
    detection record is the first journal record after the last pre-fault
    step in which the slice is not up).
    """
    faults = summary.get("faults") or []
    if not faults:
        return None
    f = faults[0]
    for key in ("time", "fault_time", "t"):
        if isinstance(f.get(key), (int, float)):
            return float(f[key])
    steps = [e for e in read_jsonl(job / "trainer-events.jsonl") if e.get("kind") == "step"]
    journal = read_jsonl(job / "journal.jsonl")
    if f.get("detection_seconds") is not None:
        before = [e["t"] for e in steps if e["step"] == f["step_at_fault"]]
        t_lo = min(before) if before else 0.0
        det = next((j for j in journal if j["time"] >= t_lo and f["slice"] not in j.get("up_slices", [])), None)
        if det is not None:
            return float(det["time"]) - float(f["detection_seconds"])
    if f.get("recovery_seconds") is not None:
        reg = next((e for e in steps if e["step"] > f["step_at_fault"]), None)
        if reg is not None:
            return float(reg["t"]) - float(f["recovery_seconds"])
    return None


def analyse(job: Path, summary: dict[str, Any], num_slices: int, strategy: str) -> dict[str, Any]:
    tev = read_jsonl(job / "trainer-events.jsonl")
    hev = read_jsonl(job / "harness-events.jsonl")
    steps = [e for e in tev if e.get("kind") == "step"]
    resumes = [e for e in tev if e.get("kind") == "resumed"]
    fault = next((h for h in hev if h.get("kind") == "fault"), None)
    ft = float(fault["fault_time"]) if fault else demo_fault_time(job, summary)
    out: dict[str, Any] = {"recovery_s": None, "lost_steps": None, "fault_cost_s": None}
    if ft is None or not steps:
        out["error"] = "no fault time or no steps"
        return out
    last_before = max((e["step"] for e in steps if e["t"] <= ft), default=0)
    r = next((x for x in resumes if x["t"] > ft), None)
    s_star = max((e["step"] for e in steps if e["t"] <= r["t"]), default=0) if r else last_before
    t_from = r["t"] if r else ft
    regained = next((e for e in steps if e["t"] > t_from and e["step"] > s_star), None)
    out["step_at_fault"] = last_before
    out["progress_at_recovery_start"] = s_star
    out["recovery_s"] = rnd(regained["t"] - ft) if regained else None
    out["lost_steps"] = max(0, s_star - int(r["from_step"])) if r else 0
    out["restored_from"] = r.get("restored_from") if r else None
    out["slices_after"] = len(r["slices"]) if r else None

    # Goodput: useful work after the fault (step k on n of N slices counts n/N nominal steps).
    pre = [e for e in steps if e["t"] <= ft and len(e["slices"]) == num_slices and e["step"] > 3]
    t_nom = median(e["seconds"] for e in pre) or 0.0
    final: dict[int, dict[str, Any]] = {}
    for e in steps:
        final[e["step"]] = e
    t_end = max(e["t"] for e in steps)
    window = t_end - ft
    useful = sum(len(e["slices"]) / num_slices * t_nom for k, e in final.items() if k > last_before and e["t"] > ft)
    base_rate = 0.0
    if len(pre) >= 10:
        a, b = pre[0], pre[-1]
        span = b["t"] - a["t"]
        if span > 0:
            base_rate = max(0.0, (span - (b["step"] - a["step"]) * t_nom) / span)
    out["nominal_step_s"] = rnd(t_nom)
    out["fault_free_overhead"] = rnd(base_rate)
    out["window_s"] = rnd(window)
    out["fault_cost_s"] = rnd(window - useful - base_rate * window) if window > 0 else None
    out["back_on_all_slices"] = bool(steps and len(steps[-1]["slices"]) == num_slices)

    # Where the time went.
    phases: dict[str, float | None] = {}
    if strategy == "full_restart":
        spawn = next((h["t"] for h in hev if h.get("kind") == "trainer_spawn" and h["t"] > ft), None)
        start = next((e["t"] for e in tev if e.get("kind") == "start" and e["t"] > ft), None)
        ready = next((e["t"] for e in tev if e.get("kind") == "jax_ready" and e["t"] > ft), None)
        first = next((e["t"] for e in steps if r is not None and e["t"] > r["t"]), None)
        phases = {
            "wait_for_slices_s": rnd(spawn - ft) if spawn else None,
            "process_start_s": rnd(start - spawn) if start and spawn else None,
            "jax_start_s": rnd(ready - start) if ready and start else None,
            "restore_s": rnd(r["rebuild_seconds"]) if r else None,
            "to_resumed_s": rnd(r["t"] - ready) if r and ready else None,
            "first_step_s": rnd(first - r["t"]) if first and r else None,
            "recompute_s": rnd(regained["t"] - first) if regained and first else None,
        }
    elif strategy == "checkpoint_rewind":
        failed = next((e["t"] for e in tev if e.get("kind") == "step_failed" and e["t"] >= ft), None)
        first = next((e["t"] for e in steps if r is not None and e["t"] > r["t"]), None)
        phases = {
            "detect_data_loss_s": rnd(failed - ft) if failed else None,
            "retry_to_resumed_s": rnd(r["t"] - failed) if r and failed else None,
            "restore_s": rnd(r["rebuild_seconds"]) if r else None,
            "first_step_s": rnd(first - r["t"]) if first and r else None,
            "recompute_s": rnd(regained["t"] - first) if regained and first else None,
        }
        scale = next((e for e in tev if e.get("kind") == "scale_up_signal" and e["t"] > ft), None)
        phases["scale_up_after_fault_s"] = rnd(scale["t"] - ft) if scale else None
    else:
        f = (summary.get("faults") or [{}])[0]
        first = next((e["t"] for e in steps if r is not None and e["t"] > r["t"]), None)
        phases = {
            "detection_s": f.get("detection_seconds"),
            "hold_s": f.get("hold_seconds"),
            "rebuild_s": rnd(r["rebuild_seconds"]) if r else None,
            "first_step_s": rnd(first - r["t"]) if first and r else None,
            "demo_summary_recovery_s": f.get("recovery_seconds"),
            "demo_summary_lost_steps": f.get("lost_steps"),
            "detection_source": f.get("detection_source"),
        }
    out["phases"] = phases
    # Progress after the fault, for the plot.
    pts = [(round(e["t"] - ft, 3), e["step"], len(e["slices"])) for e in steps if e["t"] >= ft - 1.0]
    stride = max(1, len(pts) // 300)
    out["progress"] = pts[::stride] + ([pts[-1]] if pts and pts[-1] not in pts[::stride] else [])
    return out


# ---------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------


def run(
    quick: bool = False,
    repeats: int | None = None,
    delays: list[float] | None = None,
    workdir: Path | None = None,
    keep: bool = False,
) -> dict[str, Any]:
    cfg = Config.make(quick, repeats, delays)
    root = Path(workdir or tempfile.mkdtemp(prefix="bench-recovery-"))
    root.mkdir(parents=True, exist_ok=True)
    names = strategies()
    runs: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for delay in cfg.delays:
        reps = cfg.repeats_for(delay)
        for rep in range(reps):
            for s in names:  # interleaved, so drift hits every strategy alike
                if s == "elastic_sidecar_notice" and delay != cfg.realistic_delay:
                    continue  # a notice does not depend on the delay: run it at the realistic one only
                log(f"recovery: {s} delay {delay:g}s run {rep + 1}/{reps}")
                m = run_one(cfg, s, delay, rep, root)
                log(
                    f"  -> recovery {m.get('recovery_s')} s, lost {m.get('lost_steps')}, "
                    f"cost {m.get('fault_cost_s')} s{' ERROR ' + m['error'] if m.get('error') else ''}"
                )
                runs.append(m)
    table: dict[str, dict[str, Any]] = {}
    for s in names:
        table[s] = {}
        for delay in cfg.delays:
            every = [r for r in runs if r["strategy"] == s and r["delay_s"] == delay]
            if not every:
                continue
            rs = [r for r in every if not r.get("error")]  # a failed run's figures do not count
            cost = median(r.get("fault_cost_s") for r in rs)
            row: dict[str, Any] = {
                "runs": len(rs),
                "failed_runs": len(every) - len(rs),
                "failures": [r["error"] for r in every if r.get("error")],
                "recovery_s": rnd(median(r.get("recovery_s") for r in rs), 3),
                "recovery_s_all": [r.get("recovery_s") for r in rs],
                "lost_steps": median(r.get("lost_steps") for r in rs),
                "lost_steps_all": [r.get("lost_steps") for r in rs],
                "fault_cost_s": rnd(cost, 3),
                "goodput": {
                    f"{n:g}": (rnd(max(0.0, 1.0 - cost / n), 4) if cost is not None else None)
                    for n in cfg.fault_every_s
                },
                "phases": _median_phases([r.get("phases", {}) for r in rs]),
            }
            table[s][f"{delay:g}"] = row
    ratios: dict[str, Any] = {"delay_s": cfg.realistic_delay, "per_delay": {}}
    for delay in cfg.delays:
        key = f"{delay:g}"
        c = table["elastic_sidecar"][key]["recovery_s"]
        per = {}
        for s in ("full_restart", "checkpoint_rewind"):
            v = table[s][key]["recovery_s"]
            per[s] = rnd(v / c, 2) if v is not None and c else None
        ratios["per_delay"][key] = per
    real = ratios["per_delay"][f"{cfg.realistic_delay:g}"]
    ratios["full_restart"] = real["full_restart"]
    ratios["checkpoint_rewind"] = real["checkpoint_rewind"]
    # A progress timeline per strategy at the realistic delay (first run), for the plot.
    timelines = {}
    for s in names:
        r = next((x for x in runs if x["strategy"] == s and x["delay_s"] == cfg.realistic_delay), None)
        if r is not None:
            timelines[s] = r.get("progress", [])
    for r in runs:
        r.pop("progress", None)
    rk = f"{cfg.realistic_delay:g}"
    side = table["elastic_sidecar"][rk]
    targets = [
        target(
            "recovery vs full restart",
            ">= 10x faster",
            ratios["full_restart"],
            "x",
            None if ratios["full_restart"] is None else ratios["full_restart"] >= 10,
            f"at the realistic provisioning delay of {cfg.realistic_delay:g} s",
        ),
        target(
            "recovery vs checkpoint rewind",
            ">= 3x faster",
            ratios["checkpoint_rewind"],
            "x",
            None if ratios["checkpoint_rewind"] is None else ratios["checkpoint_rewind"] >= 3,
            f"at the realistic provisioning delay of {cfg.realistic_delay:g} s",
        ),
        target(
            "lost steps on a crash (kill)",
            "<= 1",
            side["lost_steps"],
            "steps",
            None if side["lost_steps"] is None else max(x for x in side["lost_steps_all"] if x is not None) <= 1,
            "worst run",
        ),
    ]
    if "elastic_sidecar_notice" in table:
        n = table["elastic_sidecar_notice"][rk]
        worst = max((x for x in n["lost_steps_all"] if x is not None), default=None)
        targets.append(
            target(
                "lost steps on a notice",
                "0",
                n["lost_steps"],
                "steps",
                None if worst is None else worst == 0,
                "worst run",
            )
        )
    else:
        targets.append(
            target(
                "lost steps on a notice",
                "0",
                None,
                "steps",
                None,
                "not yet available: the demo has no `notice` fault kind (simjob.options.FAULT_KINDS)",
            )
        )
    result = {
        "name": NAME,
        "quick": cfg.quick,
        "config": asdict(cfg),
        "strategies": {s: LABELS[s] for s in names},
        "table": table,
        "ratios": ratios,
        "timelines": timelines,
        "runs": runs,
        "targets": targets,
        "duration_s": round(time.monotonic() - t0, 1),
        "workdir": str(root),
    }
    if not keep and not workdir:
        shutil.rmtree(root, ignore_errors=True)
        result["workdir"] = None
    return result


def _median_phases(ps: list[dict[str, Any]]) -> dict[str, Any]:
    keys = {k for p in ps for k in p}
    out: dict[str, Any] = {}
    for k in sorted(keys):
        vals = [p.get(k) for p in ps]
        nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
        out[k] = rnd(median(nums), 3) if nums else next((v for v in vals if v is not None), None)
    return out
