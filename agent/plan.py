"""``elastic-sidecar plan``: what each recovery strategy keeps of a job's training, on paper.

A Monte Carlo model of weeks of training under interruptions (docs/plan.md explains it). Each input
carries its source: ``measured`` (a bench row here), ``tpu`` (the borrowed TPU chip), ``published``
(with a citation), ``user`` (a flag or a preset's choice) or ``swept`` (unknown at real scale: a range
each trial draws from, so it shows in the p10-p90 band). The model functions are pure; ``run`` does the
printing and the files.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
from collections.abc import Callable, Mapping
from typing import Any

from agent import constants as C
from agent.config import number, whole

STRATEGIES = ("full_restart", "checkpoint_rewind", "multi_tier", "sidecar")
BASELINES = STRATEGIES[:3]
PHASES = ("detect", "rebuild", "restore", "recompute", "degraded", "fallback")
SOURCES = ("measured", "tpu", "published", "user", "swept")
SWEEP_MTBI_HOURS = (400.0, 200.0, 100.0, 50.0, 25.0, 12.0, 6.0, 4.0)
"""The interruption rates the plot draws (the whole job's mean time between interruptions)."""
EVENT_SAMPLE = 2000
"""Events drawn for the per-event means (loss breakdown, break-even), apart from the trials."""

Value = float | tuple[float, float]


@dataclasses.dataclass(frozen=True)
class Input:
    name: str
    value: Value
    """A point, or ``(lo, hi)``: a range each trial (or event, for ``per_event`` inputs) draws from."""
    source: str
    unit: str
    citation: str | None = None
    """Where a ``published``, ``measured`` or ``tpu`` figure comes from: a paper, an issue, a command."""
    per_event: bool = False

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"input {self.name}: source {self.source!r} is not one of {SOURCES}")
        if self.source == "published" and not self.citation:
            raise ValueError(f"input {self.name}: a published figure needs its citation")
        if self.source == "swept" and not isinstance(self.value, tuple):
            raise ValueError(f"input {self.name}: a swept input is a range, never a point")

    def draw(self, rng: random.Random) -> float:
        if not isinstance(self.value, tuple):
            return self.value
        lo, hi = self.value
        # Times and rates span orders of magnitude: draw them evenly in log; fractions evenly.
        if self.unit != "fraction" and lo > 0:
            return math.exp(rng.uniform(math.log(lo), math.log(hi)))
        return rng.uniform(lo, hi)

    def as_json(self) -> dict[str, Any]:
        v = list(self.value) if isinstance(self.value, tuple) else self.value
        return {"name": self.name, "value": v, "unit": self.unit, "source": self.source, "citation": self.citation}


# Citations (FACTS.md holds the checked figures; each names its own source).
_LLAMA3 = "Llama 3 paper: 419 unexpected interruptions in 54 days on 16,384 H100s (about 0.47 a day per 1,000 accelerators); no TPU rate is published"
_MAXTEXT_DEFAULTS = "MaxText 0.2.5 configs/base.yml"
_KEP467 = "JobSet KEP-467: a full JobSet restart at 1,000+ nodes takes several minutes"
_GCS = "GCS aggregate write 5-15 GB/s, as stated in issue 52"
_HOST_LINK = (
    "docs/host_link_tpu_v5e.json: python -m bench.host_link --state-gib 0.5 --runs 5 (a gVisor sandbox: a floor)"
)
_LINK = "unknown on a TPU VM: 0.94 GB/s a chip on the borrowed TPU v5e in a gVisor sandbox (docs/host_link_tpu_v5e.json) the floor, 25 GB/s a PCIe 4.0 x16 class link"
_DETECTION = "docs/benchmarks.json, detection: python -m bench detection --require-clean --json OUT"
_POLL = "pathwaysutils Manager.elastic_retry(poll_interval=10): slices re-probed every 10 s"
_MXLA = "MaxText megascale hang playbook: MXLA hang detection, default timeout 5 minutes"
_V5P = "Cloud TPU v5p: 4 chips a host (docs/maxtext.md, Sizing on paper)"
_STEP70 = "MaxText tiering table, Llama-2-70B on v5p: 692 tokens/s/chip, a 4M-token step on 1,024 chips is about 6 s"
_REBUILD = "unknown at scale: about 40 s for a 0.6B model on 3 v5e slices (maxtext#4043) is the floor; a 70B model on 1,024 chips is estimated at minutes"
_CACHE = "borrowed TPU v5e: compile 25.6 s / 41.6 s from an empty persistent cache, 4.4 s / 9.0 s loaded from it (FACTS.md section 10)"
_SOAK = (
    "unknown at scale: Google's snapshot-elastic soak on Pathways succeeded in 73-74% of runs (maxtext#4632), the floor"
)
_NOTICE = "GCE metadata server maintenance-event: about 60 s notice"


def _common(params: float, hosts: int, step: Value, mtbi_hours: float, rebuild: tuple[float, float]) -> list[Input]:
    return [
        Input("params", params, "user", "parameters"),
        Input(
            "bytes_per_param",
            12.0,
            "published",
            "bytes",
            f"{_MAXTEXT_DEFAULTS}: fp32 weights and Adam's two fp32 moments",
        ),
        Input("slices", 4, "user", "slices"),
        Input("hosts_per_slice", hosts, "user", "hosts"),
        Input("chips_per_host", 4, "published", "chips", _V5P),
        Input("step_seconds", step, "published" if not isinstance(step, tuple) else "swept", "s", _STEP70),
        # MaxText's default checkpoint_period (10,000 steps) is 17 h at a 6 s step: a user sets a shorter one.
        Input("checkpoint_period_steps", 1_000, "user", "steps"),
        Input("local_checkpoint_minutes", 5.0, "user", "min"),
        Input("min_slices", 3, "user", "slices"),
        Input("mtbi_hours", mtbi_hours, "published", "h", _LLAMA3),
        Input("announced_share", (0.0, 0.3), "swept", "fraction"),
        Input("notice_lead_seconds", 60.0, "published", "s", _NOTICE),
        Input("hang_share", (0.0, 0.2), "swept", "fraction"),
        Input("replacement_minutes", (5.0, 60.0), "swept", "min", per_event=True),
        Input("rebuild_seconds", rebuild, "swept", "s", _REBUILD),
        Input("rebuild_cached_fraction", (0.17, 0.22), "tpu", "fraction", _CACHE),
        Input("restart_seconds", (120.0, 300.0), "published", "s", _KEP467),
        Input("storage_gb_per_s", (5.0, 15.0), "published", "GB/s", _GCS),
        Input("host_link_gb_per_s", (0.94, 25.0), "swept", "GB/s", _LINK),
        Input("snapshot_slowdown_over_copy", 0.010, "tpu", "fraction", _HOST_LINK),
        Input("snapshot_budget", 0.015, "user", "fraction", "trainer_hooks/maxtext/interval.py BUDGET"),
        Input(
            "hook_seconds_per_step",
            0.00034,
            "measured",
            "s",
            "docs/maxtext.md: hook_seconds_per_step, python -m bench recovery",
        ),
        Input("multi_tier_extra_overhead", (0.0, 0.005), "swept", "fraction"),
        Input("recovery_success", (0.74, 1.0), "swept", "fraction", _SOAK),
        Input("detect_kill_sidecar_seconds", 0.008, "measured", "s", _DETECTION),
        Input("detect_hang_sidecar_seconds", 1.392, "measured", "s", _DETECTION),
        Input("detect_kill_baseline_seconds", 10.0, "published", "s", _POLL),
        Input("detect_hang_baseline_seconds", 300.0, "published", "s", _MXLA),
        Input("weeks", 4.0, "user", "weeks"),
    ]


def _mtbi_for(chips: int) -> float:
    """The whole job's hours between interruptions at the Llama 3 rate per accelerator (_LLAMA3)."""
    return 24.0 / (419 / 54 / 16_384 * chips)


# v5p-512 is 64 hosts (256 chips), v5p-128 16 hosts (64 chips); four slices of each.
PRESETS: dict[str, list[Input]] = {
    "llama3-70b-v5p": _common(70.6e9, 64, 6.0, round(_mtbi_for(4 * 256), 1), (40.0, 600.0)),
    "llama3-8b-v5p": _common(8.0e9, 16, (2.0, 4.0), round(_mtbi_for(4 * 64), 1), (40.0, 300.0)),
}


def with_user(inputs: list[Input], **values: Value | None) -> list[Input]:
    """The inputs with the given ones set by the user (a point, or a range: source ``user``)."""
    out = []
    for i in inputs:
        v = values.get(i.name)
        out.append(i if v is None else dataclasses.replace(i, value=v, source="user", citation=None))
    return out


@dataclasses.dataclass(frozen=True)
class Job:
    """One trial's world: every swept input drawn, the derived times in seconds."""

    slices: int
    min_slices: int
    step: float
    ckpt_period: float
    local_period: float
    copy: float
    """One chip's share of the state over the host link: a snapshot's or a save's device-to-host copy."""
    storage_read: float
    rebuild: float
    cached: float
    restart: float
    success: float
    announced: float
    notice_usable: bool
    hang: float
    detect_sc: tuple[float, float]
    detect_base: tuple[float, float]
    snapshot_every: int
    overhead: dict[str, float]


def _job(v: Mapping[str, Input], rng: random.Random) -> Job:
    d = {k: i.draw(rng) for k, i in v.items() if not i.per_event}
    state = d["params"] * d["bytes_per_param"]
    slices = int(d["slices"])
    copy = state / (d["hosts_per_slice"] * d["chips_per_host"]) / (d["host_link_gb_per_s"] * 1e9)
    step = d["step_seconds"]
    ckpt, local = d["checkpoint_period_steps"] * step, d["local_checkpoint_minutes"] * 60
    # trainer_hooks' auto interval: one snapshot's slowdown within the budget, and no save while one copies
    # (Orbax's Snapshotter skips a save while the previous one is in flight).
    slowdown = d["snapshot_slowdown_over_copy"] * copy
    every = max(1, math.ceil(slowdown / (d["snapshot_budget"] * step)), math.ceil(copy / step))
    # An async save blocks the step for its device-to-host copy; the write to storage runs beside it.
    base = copy / ckpt
    overhead = {
        "full_restart": base,
        "checkpoint_rewind": base,
        "multi_tier": base + copy / local + d["multi_tier_extra_overhead"],
        "sidecar": base + slowdown / (every * step) + d["hook_seconds_per_step"] / step,
    }
    return Job(
        slices=slices,
        min_slices=int(d["min_slices"]),
        step=step,
        ckpt_period=ckpt,
        local_period=local,
        copy=copy,
        storage_read=state / (d["storage_gb_per_s"] * 1e9),
        rebuild=d["rebuild_seconds"],
        cached=d["rebuild_cached_fraction"],
        restart=d["restart_seconds"],
        success=d["recovery_success"],
        announced=d["announced_share"],
        notice_usable=d["notice_lead_seconds"] >= step,
        hang=d["hang_share"],
        detect_sc=(d["detect_kill_sidecar_seconds"], d["detect_hang_sidecar_seconds"]),
        detect_base=(d["detect_kill_baseline_seconds"], d["detect_hang_baseline_seconds"]),
        snapshot_every=every,
        overhead=overhead,
    )


Loss = dict[str, float]


def _zero() -> Loss:
    return dict.fromkeys(PHASES, 0.0)


def event_losses(job: Job, kind: str, u1: float, replacement: float, failed: bool) -> dict[str, Loss]:
    """Seconds of the whole job's training each strategy loses to one interruption, by phase.

    ``kind`` is ``kill``, ``hang`` or ``notice`` (announced, drained at a step boundary); ``u1`` where in
    a checkpoint (or snapshot) period it came; ``replacement`` the seconds until a new slice is up;
    ``failed`` whether the sidecar's in-process recovery fails (it then falls back to a full restart).
    Time on k of n slices loses (n - k) / n of it; a stall loses all of it.
    """
    n = job.slices
    hang = kind == "hang"
    d_base = job.detect_base[1] if hang else job.detect_base[0]
    d_sc = 0.0 if kind == "notice" else job.detect_sc[1] if hang else job.detect_sc[0]
    shrink = n >= 2 and n - 1 >= job.min_slices
    out: dict[str, Loss] = {}

    # Full restart: every process goes; the job waits for the replacement, restarts, compiles, reads the
    # checkpoint from storage and recomputes the steps since it.
    full = _zero()
    full.update(
        detect=d_base,
        degraded=replacement,
        rebuild=job.restart + job.rebuild,
        restore=job.storage_read,
        recompute=u1 * job.ckpt_period,
    )
    out["full_restart"] = full

    # MaxText's elastic rewind: restore the last checkpoint on the slices left, run on them until the
    # replacement, then rewind again at the grow (a scale-up also restores the last checkpoint).
    for name, period, restore in (
        ("checkpoint_rewind", job.ckpt_period, job.storage_read),
        ("multi_tier", job.local_period, job.copy),
    ):
        loss = _zero()
        loss.update(detect=d_base, rebuild=job.rebuild, restore=restore, recompute=u1 * period)
        if shrink:
            ran = max(0.0, replacement - d_base - job.rebuild - restore)
            loss["degraded"] = ran / n
            loss["rebuild"] += job.rebuild * job.cached
            loss["restore"] += restore
            loss["recompute"] += (ran % period) * (n - 1) / n
        else:
            loss["degraded"] = replacement
        out[name] = loss

    sc = _zero()
    if failed or n < 2:
        sc["fallback"] = (d_sc + job.rebuild if n >= 2 else 0.0) + sum(full.values())
    else:
        # The survivors hold in memory: a notice drains at a step boundary and loses nothing; a crash loses
        # the steps since the newest complete snapshot. The grow keeps the state and the full mesh's program.
        lost = 0.0 if kind == "notice" else u1 * job.snapshot_every * job.step + job.copy
        sc.update(detect=d_sc, rebuild=job.rebuild, restore=job.copy, recompute=lost)
        if shrink:
            ran = max(0.0, replacement - d_sc - job.rebuild - job.copy)
            sc["degraded"] = ran / n
            sc["rebuild"] += job.rebuild * job.cached
            sc["restore"] += job.copy
        else:
            sc["degraded"] = replacement
            sc["rebuild"] = job.rebuild * job.cached
    out["sidecar"] = sc
    return out


def _event(job: Job, v: Mapping[str, Input], rng: random.Random) -> dict[str, Loss]:
    # A fixed number of draws an event, whatever its kind: trials at other rates see the same events.
    a, h, u1, f = rng.random(), rng.random(), rng.random(), rng.random()
    replacement = v["replacement_minutes"].draw(rng) * 60
    kind = "notice" if a < job.announced and job.notice_usable else "hang" if h < job.hang else "kill"
    return event_losses(job, kind, u1, replacement, f >= job.success)


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    i = int(pos)
    return s[i] if i + 1 >= len(s) else s[i] + (s[i + 1] - s[i]) * (pos - i)


def goodputs(inputs: list[Input], mtbi_hours: float, trials: int, seed: int) -> dict[str, dict[str, Any]]:
    """Per strategy: the goodput of each trial (a job of ``weeks`` of wall time) and its steady overhead.

    Interruptions arrive as a Poisson process. The trials share their random numbers across rates (the
    arrivals are one unit-rate stream scaled by ``mtbi_hours``), so a higher rate only adds events.
    """
    v = {i.name: i for i in inputs}
    horizon = v["weeks"].draw(random.Random(0)) * 7 * 86400
    master = random.Random(seed)
    res: dict[str, dict[str, list[float]]] = {s: {"goodput": [], "overhead": []} for s in STRATEGIES}
    for _ in range(trials):
        job = _job(v, random.Random(master.getrandbits(64)))
        ev_rng = random.Random(master.getrandbits(64))
        lost = dict.fromkeys(STRATEGIES, 0.0)
        t = ev_rng.expovariate(1.0) * mtbi_hours * 3600
        while t < horizon:
            for s, loss in _event(job, v, ev_rng).items():
                lost[s] += sum(loss.values())
            t += ev_rng.expovariate(1.0) * mtbi_hours * 3600
        for s in STRATEGIES:
            o = job.overhead[s]
            res[s]["goodput"].append((1 - o) * max(0.0, 1 - lost[s] / horizon))
            res[s]["overhead"].append(o)
    return res


def per_event(inputs: list[Input], seed: int, n: int = EVENT_SAMPLE) -> dict[str, Loss]:
    """Mean seconds lost an event by phase, and the mean steady overhead, over ``n`` drawn events."""
    v = {i.name: i for i in inputs}
    rng = random.Random(seed + 1)
    acc = {s: {**_zero(), "overhead": 0.0} for s in STRATEGIES}
    for _ in range(n):
        job = _job(v, rng)
        for s, loss in _event(job, v, rng).items():
            for k, x in loss.items():
                acc[s][k] += x / n
            acc[s]["overhead"] += job.overhead[s] / n
    return acc


def break_even(sc: Loss, base: Loss) -> dict[str, Any]:
    """Where the sidecar's goodput crosses ``base``'s, in the job's mean hours between interruptions.

    Goodput is about (1 - o)(1 - rate x loss), a line in the rate for each strategy: the sidecar keeps
    more ``always``, ``never``, or only when interruptions come more often (``more_often``) or less
    often (``less_often``) than every ``mtbi_hours``.
    """
    l_s, l_b = sum(sc[k] for k in PHASES), sum(base[k] for k in PHASES)
    gain = (1 - base["overhead"]) * l_b - (1 - sc["overhead"]) * l_s  # per unit of rate
    cost = sc["overhead"] - base["overhead"]
    if gain > 0 and cost > 0:
        return {"baseline": "", "sidecar_keeps_more": "more_often", "mtbi_hours": round(gain / cost / 3600, 1)}
    if gain < 0 and cost < 0:
        return {"baseline": "", "sidecar_keeps_more": "less_often", "mtbi_hours": round(gain / cost / 3600, 1)}
    return {
        "baseline": "",
        "sidecar_keeps_more": "always" if gain >= 0 and cost <= 0 and (gain, cost) != (0, 0) else "never",
        "mtbi_hours": None,
    }


def young_daly_seconds(save_seconds: float, mtbi_seconds: float) -> float:
    """Daly's higher-order estimate of the best checkpoint period, sqrt(2 d M) - d (Young's first-order
    rule, sqrt(2 d M), when d is small against M): Daly, FGCS 22 (2006)."""
    return max(save_seconds, math.sqrt(2 * save_seconds * mtbi_seconds) - save_seconds)


def recommend(inputs: list[Input], mtbi_hours: float, seed: int) -> dict[str, Any]:
    v = {i.name: i for i in inputs}
    job = _job(v, random.Random(seed))
    state = v["params"].value * v["bytes_per_param"].value  # type: ignore[operator]
    storage = v["storage_gb_per_s"].value
    slowest = state / (min(storage) if isinstance(storage, tuple) else storage) / 1e9
    period = max(young_daly_seconds(job.copy, mtbi_hours * 3600), slowest)
    # Per slice rate held, the smallest job at which the sidecar keeps more than every baseline.
    per_slice = v["slices"].value / mtbi_hours  # type: ignore[operator]
    smallest = None
    for n in range(2, int(v["slices"].value) + 1):  # type: ignore[arg-type]
        # The model's what-if, not a user input: the sources stay.
        size = {"slices": float(n), "min_slices": float(n - 1)}
        trial = [dataclasses.replace(i, value=size[i.name]) if i.name in size else i for i in inputs]
        means = per_event(trial, seed, n=400)
        m = n / per_slice * 3600
        g = {s: (1 - means[s]["overhead"]) * (1 - sum(means[s][k] for k in PHASES) / m) for s in STRATEGIES}
        if all(g["sidecar"] > g[b] for b in BASELINES):
            smallest = n
            break
    return {
        "checkpoint_period_steps": math.ceil(period / job.step),
        "checkpoint_period_minutes": round(period / 60, 1),
        "checkpoint_period_rule": "Young/Daly sqrt(2 d M) - d with d the save's device-to-host copy, "
        "at least one write of the state at the slowest storage rate",
        "snapshot_every_steps": job.snapshot_every,
        "min_slices": smallest,
        "min_slices_rule": "the fewest slices (at this rate per slice) at which the sidecar keeps more than every baseline",
    }


def plan(inputs: list[Input], trials: int, seed: int, sweep_trials: int = 0) -> dict[str, Any]:
    """The whole answer as JSON-ready data: goodput per strategy, loss per event, break-even, advice."""
    v = {i.name: i for i in inputs}
    mtbi = float(v["mtbi_hours"].value)  # type: ignore[arg-type]
    runs = goodputs(inputs, mtbi, trials, seed)
    means = per_event(inputs, seed)
    strategies = []
    for s in STRATEGIES:
        g, o = runs[s]["goodput"], runs[s]["overhead"]
        m = means[s]
        loss = {k: round(m[k] / 60, 3) for k in PHASES}
        loss["steady_overhead"] = round(m["overhead"] * mtbi * 60, 3)
        loss["total"] = round(sum(loss.values()), 3)
        strategies.append(
            {
                "strategy": s,
                "goodput": {q: round(_quantile(g, p), 4) for q, p in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9))},
                "loss_per_event_minutes": loss,
                "steady_overhead_fraction": round(_quantile(o, 0.5), 5),
            }
        )
    out: dict[str, Any] = {
        "mtbi_hours": mtbi,
        "trials": trials,
        "seed": seed,
        "strategies": strategies,
        "break_even": [{**break_even(means["sidecar"], means[b]), "baseline": b} for b in BASELINES],
        "recommendations": recommend(inputs, mtbi, seed),
        "inputs": [i.as_json() for i in inputs],
    }
    if sweep_trials:
        out["sweep"] = sweep(inputs, sweep_trials, seed)
    return out


def sweep(inputs: list[Input], trials: int, seed: int) -> list[dict[str, Any]]:
    """Goodput p10/p50/p90 per strategy at each of :data:`SWEEP_MTBI_HOURS` (the plot's data)."""
    rows = []
    for mtbi in SWEEP_MTBI_HOURS:
        runs = goodputs(inputs, mtbi, trials, seed)
        rows.append(
            {
                "mtbi_hours": mtbi,
                **{s: [round(_quantile(runs[s]["goodput"], q), 4) for q in (0.1, 0.5, 0.9)] for s in STRATEGIES},
            }
        )
    return rows


# The command line: everything below does I/O.

_FLAGS: tuple[tuple[str, str, Callable[[str], float], str], ...] = (
    ("--params", "params", number(1e6, 1e15, "parameter count"), "the model's parameter count"),
    (
        "--state-bytes",
        "state_bytes",
        number(1e6, 1e18, "byte count"),
        "the training state's bytes (instead of --params)",
    ),
    ("--slices", "slices", whole(1, 10_000), "slices in the job"),
    ("--hosts-per-slice", "hosts_per_slice", whole(1, 100_000), "TPU hosts a slice"),
    ("--step-seconds", "step_seconds", number(1e-3, 86_400, "number of seconds"), "seconds a training step"),
    ("--checkpoint-period", "checkpoint_period_steps", whole(1, C.INT32_MAX), "steps between checkpoints"),
    (
        "--local-checkpoint-minutes",
        "local_checkpoint_minutes",
        number(0.1, 1e5, "number of minutes"),
        "multi-tier: minutes between local checkpoints",
    ),
    ("--min-slices", "min_slices", whole(1, 10_000), "elastic_min_slice_count: the fewest slices to go on with"),
    (
        "--mtbi-hours",
        "mtbi_hours",
        number(1e-3, 1e7, "number of hours"),
        "the whole job's mean hours between interruptions",
    ),
    ("--announced-share", "announced_share", number(0, 1, "fraction"), "the share of interruptions announced ahead"),
    ("--notice-lead-seconds", "notice_lead_seconds", number(0, 86_400, "number of seconds"), "an announcement's lead"),
    (
        "--replacement-minutes",
        "replacement_lo",
        number(0, 1e5, "number of minutes"),
        "minutes until a new slice is up (the range's low end)",
    ),
    (
        "--replacement-minutes-max",
        "replacement_hi",
        number(0, 1e5, "number of minutes"),
        "the range's high end (default: --replacement-minutes)",
    ),
    (
        "--rebuild-seconds",
        "rebuild_lo",
        number(0, 1e5, "number of seconds"),
        "seconds to re-initialise and compile for a new mesh (low end)",
    ),
    (
        "--rebuild-seconds-max",
        "rebuild_hi",
        number(0, 1e5, "number of seconds"),
        "the range's high end (default: --rebuild-seconds)",
    ),
    (
        "--recovery-success",
        "recovery_success",
        number(0, 1, "fraction"),
        "the share of in-process recoveries that succeed",
    ),
    ("--weeks", "weeks", number(0.01, 520, "number of weeks"), "weeks of training each trial runs"),
)


def add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=sorted(PRESETS), default="llama3-70b-v5p", help="the job to start from")
    for flag, dest, conv, help_ in _FLAGS:
        p.add_argument(flag, dest=dest, type=conv, default=None, help=help_)
    p.add_argument("--trials", type=whole(10, 1_000_000), default=500, help="jobs simulated (default 500)")
    p.add_argument("--seed", type=whole(0), default=1, help="the random seed (default 1: the same answer every run)")
    p.add_argument("--json", metavar="PATH", help="write the whole answer as JSON")
    p.add_argument("--plot", metavar="PATH", help="draw goodput against the interruption rate (PNG; needs matplotlib)")


def _span(lo: float | None, hi: float | None) -> Value | None:
    if lo is None and hi is None:
        return None
    lo = hi if lo is None else lo
    hi = lo if hi is None else hi
    assert lo is not None and hi is not None
    return (min(lo, hi), max(lo, hi)) if lo != hi else lo


def inputs_from_args(ns: argparse.Namespace) -> list[Input]:
    values: dict[str, Value | None] = {
        dest: getattr(ns, dest) for _, dest, _, _ in _FLAGS if "_lo" not in dest and "_hi" not in dest
    }
    values["replacement_minutes"] = _span(ns.replacement_lo, ns.replacement_hi)
    values["rebuild_seconds"] = _span(ns.rebuild_lo, ns.rebuild_hi)
    if ns.state_bytes is not None:
        values["params"], values["bytes_per_param"] = ns.state_bytes, 1.0
    values.pop("state_bytes")
    if ns.slices is not None and ns.min_slices is None:
        values["min_slices"] = float(max(1, ns.slices - 1))
    return with_user(PRESETS[ns.preset], **values)


def table(result: dict[str, Any]) -> str:
    head = (
        f"{'strategy':<18} {'p10':>6} {'p50':>6} {'p90':>6}  {'min/event':>9} "
        + " ".join(f"{k:>9}" for k in PHASES)
        + f" {'overhead':>9}"
    )
    lines = [
        f"goodput over the job at one interruption every {result['mtbi_hours']:g} h ({result['trials']} trials)",
        head,
    ]
    for s in result["strategies"]:
        g, loss = s["goodput"], s["loss_per_event_minutes"]
        lines.append(
            f"{s['strategy']:<18} {g['p10']:>6.3f} {g['p50']:>6.3f} {g['p90']:>6.3f}  {loss['total']:>9.1f} "
            + " ".join(f"{loss[k]:>9.2f}" for k in PHASES)
            + f" {s['steady_overhead_fraction']:>9.2%}"
        )
    lines.append("min/event includes the steady overhead spread over the time between interruptions.")
    for b in result["break_even"]:
        h, when = b["mtbi_hours"], b["sidecar_keeps_more"]
        say = {"always": "at every rate", "never": "at no rate"}.get(
            when
        ) or f"when interruptions come {when.replace('_', ' ')} than every {h} h"
        lines.append(f"sidecar against {b['baseline']}: keeps more {say}")
    r = result["recommendations"]
    lines.append(
        f"recommended: checkpoint every {r['checkpoint_period_steps']} steps ({r['checkpoint_period_minutes']} min, Young/Daly), "
        f"snapshot every {r['snapshot_every_steps']} steps, min slices {r['min_slices'] or 'none: no size tried gains'}"
    )
    lines.append("inputs:")
    for i in result["inputs"]:
        v = i["value"]
        shown = f"{v[0]:g}-{v[1]:g}" if isinstance(v, list) else f"{v:g}"
        lines.append(f"  {i['name']:<30} {shown:>14} {i['unit']:<9} {i['source']:<9} {i['citation'] or ''}")
    return "\n".join(lines)


def draw(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    rows = result["sweep"]
    x = [24 / r["mtbi_hours"] for r in rows]
    for s in STRATEGIES:
        p10, p50, p90 = ([r[s][i] for r in rows] for i in range(3))
        (line,) = ax.plot(x, p50, marker="o", label=s)
        ax.fill_between(x, p10, p90, color=line.get_color(), alpha=0.2)
    ax.axvline(24 / result["mtbi_hours"], color="grey", linestyle=":", label="this job's rate")
    ax.set_xscale("log")
    ax.set_xlabel("interruptions a day (whole job)")
    ax.set_ylabel("goodput (p50; band p10-p90 over the swept inputs)")
    ax.set_title("elastic-sidecar plan: " + result.get("preset", ""))
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def run(ns: argparse.Namespace) -> int:
    if ns.plot:
        try:
            import matplotlib  # noqa: F401
        except ModuleNotFoundError:
            print(
                "elastic-sidecar plan: --plot needs matplotlib: pip install 'elastic-sidecar[bench]'", file=sys.stderr
            )
            return C.EXIT_USAGE
    inputs = inputs_from_args(ns)
    result = {
        "preset": ns.preset,
        **plan(inputs, ns.trials, ns.seed, sweep_trials=max(10, ns.trials // 3) if ns.plot else 0),
    }
    print(table(result))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(result, f, indent=1)
    if ns.plot:
        draw(result, ns.plot)
    return 0
