"""Goodput: the fraction of a run's wall time spent on work it keeps, faults and protection included.

For each trainer and recovery strategy, over a run of ``run_hours`` of wall time with a fault every
``fault_interval_minutes`` (kill, hang and notice mixed in the stated ``fault_mix``)::

    goodput = (1 - faults x mean fault cost / run seconds) x ideal step seconds / strategy's step seconds

* the strategy's step seconds: its fault-free runs' median seconds per full-capacity step (its steady
  cost of being protected: snapshots, frequent local checkpoints, the hooks' checks, included), from
  :data:`bench.recovery.SETTLE_STEPS` past the warm-up (what a process pays once at its start, a run of
  hours pays once; rows recorded before that measure give the whole run's); on MaxText the row's steady
  step time, read before each run's fault (:mod:`bench.recovery_maxtext`);
* ideal step seconds: the fastest strategy's, on the same trainer (work is worth what the least
  protected configuration pays for it);
* fault cost: per fault kind, the median over runs of the wall seconds a fault cost the strategy
  (``T - W / r``, :mod:`bench.recovery`: time beyond the work kept, steps on k of n slices counting
  k/n, steps computed again counting nothing), against each run's own pre-fault rate where it had one
  (``fault_cost_own_rate_seconds_median``), else against the fault-free runs' rate (on MaxText the local
  cost against the run's own step time, steps on fewer slices at the full-slice rate); the mean over the
  mix weights each measured kind by its share (a kind not measured for a trainer is left out and the
  row says which were);
* faults: ``run_hours x 60 / fault_interval_minutes``, spread so none overlaps another's recovery.

Each trainer's rows at its realistic replacement delay are combined per checkpoint period measured
there (MaxText's are published at 1,000 and 10,000 steps): a period's strategies are compared with
each other only. An example-trainer row invalid only against the fault-free runs' rate (a cost below
zero there: that rate's noise between runs) counts where every run has a cost against its own
pre-fault rate, none below zero, the basis used above; its reason is kept in the row's basis. The other
way round, a row valid against the fault-free runs' rate whose own-rate cost is below zero in a run (a
pre-fault window holding a cost the process pays once at its start) is weighed at the fault-free runs'
rate, and the row's basis says why. A period
whose MaxText rows' steady step times drifted (a strategy measured faster than plain MaxText by more than
the 2% being resolved, or MaxText's rewind, which does plain MaxText's work a step, off it by more than that
either way: :func:`bench.common.step_times_drifted`) gets no goodput: its ideal step, or the overheads it
weighs, would be the drift's.

Every input is measured by :mod:`bench.recovery` in the same invocation, or read from a recovery
result (``--recovery-json``) whose path and commit the config records (``inputs_from``,
``inputs_git_sha``) and the report prints; nothing is assumed. The
combination is arithmetic on those medians, stated here and in each row's inputs.

The ``projection`` rows carry the same figures on paper to a large job at a published interruption
rate (:data:`PUBLISHED_RATES`): the per-fault costs measured here (seconds on this machine, not the
minutes a full restart takes at scale), at the interval the published rate gives that job.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import cost_below_stall, log, own_rate_invalid, portable_path, rnd, step_times_drifted

NAME = "goodput"
FAULTS = ("kill", "hang", "notice")
RECOVERY_DEFAULTS: dict[str, Any] = {
    "checkpoint_periods": [50],
    "delays": [10.0],
    "state_mib": 1024,
}
"""The one point the inputs are measured at unless told otherwise (the example trainer's realistic
point in the Makefile's recovery run: checkpoint every 50 steps, replacement after 10 s, 1 GiB state)."""


@dataclass(frozen=True)
class PublishedRate:
    """A published count of unexpected job interruptions on a job of known size and length."""

    source: str
    interruptions: int
    days: float
    accelerators: int
    accelerator: str

    def interval_hours(self, chips: int) -> float:
        """Mean hours between interruptions for a job of ``chips``, the rate scaled linearly by size."""
        per_accelerator_hour = self.interruptions / (self.days * 24 * self.accelerators)
        return 1 / (per_accelerator_hour * chips)


PUBLISHED_RATES = (
    PublishedRate(
        source="The Llama 3 Herd of Models (Meta, 2024, arXiv:2407.21783), section 3.3.4: 419 unexpected interruptions "
        "in a 54-day snapshot of pre-training on 16,384 H100 GPUs",
        interruptions=419,
        days=54.0,
        accelerators=16_384,
        accelerator="H100 GPU",
    ),
)
"""The published rates the projection uses. No TPU-fleet interruption count of this form was found to
cite (Gemini's report, 2023, states its goodput, 85% rising to 97% with in-memory replicas, not a rate)."""
PROJECTION_CHIPS = 10_000


@dataclass
class Schedule:
    run_hours: float = 24.0
    fault_interval_minutes: float = 30.0
    """Wall-clock minutes between faults."""
    fault_mix: dict[str, float] = field(default_factory=lambda: dict.fromkeys(FAULTS, 1.0))
    """Relative weight of each fault kind."""

    def check(self) -> Schedule:
        bad = set(self.fault_mix) - set(FAULTS)
        if bad:
            raise ValueError(f"fault mix {sorted(bad)}: expected kinds among {list(FAULTS)}")
        if any(w < 0 for w in self.fault_mix.values()) or sum(self.fault_mix.values()) <= 0:
            raise ValueError(f"fault mix {self.fault_mix}: weights must be >= 0 with a positive sum")
        if self.run_hours <= 0 or self.fault_interval_minutes <= 0:
            raise ValueError(
                f"run_hours {self.run_hours}, fault_interval_minutes {self.fault_interval_minutes}: both must be > 0"
            )
        return self


def parse_mix(text: str) -> dict[str, float]:
    """``kill=1,hang=1,notice=1`` -> weights; a bad item is an error naming it."""
    out: dict[str, float] = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        kind, sep, w = item.partition("=")
        try:
            out[kind.strip()] = float(w) if sep else 1.0
        except ValueError:
            raise ValueError(f"fault mix item {item!r}: expected KIND=WEIGHT, e.g. kill=2") from None
    return out


def fault_cost_of(row: dict[str, Any]) -> tuple[float | None, str]:
    """A recovery row's per-fault cost and its basis. MaxText rows (:mod:`bench.recovery_maxtext`): the
    local cost against the run's own step time before the fault, with every step on fewer slices at the
    full-slice rate (as on a TPU slice; on this CPU such a step is faster). Else against the runs' own
    pre-fault rate when measured, else against the fault-free runs' rate."""
    full = row.get("fault_cost_if_shrunk_steps_took_full_time_seconds_median")
    if full is not None and row.get("fault_cost_method") == "local":
        return float(full), "own pre-fault step time, steps on fewer slices at the full-slice rate"
    own = row.get("fault_cost_own_rate_seconds_median")
    if own is not None:
        return float(own), "own pre-fault rate"
    ref = row.get("fault_cost_seconds_median")
    if ref is not None and row.get("fault_cost_method") == "local":
        return float(ref), "own pre-fault step time"
    return (float(ref), "fault-free runs' rate") if ref is not None else (None, "not measured")


def steady_of(row: dict[str, Any]) -> float | None:
    """A recovery row's steady seconds per full-capacity step: MaxText rows' steady step time (the faulted runs
    before their faults, :func:`bench.recovery_maxtext.steady_step_seconds`) where given, else its fault-free
    runs' median."""
    for key in ("steady_step_seconds_median", "fault_free_seconds_per_step"):
        if row.get(key):
            return float(row[key])
    return None


def goodput(
    steady_s: float, ideal_s: float, cost_s: float, sched: Schedule, interval_minutes: float | None = None
) -> float:
    """The formula in the module docstring; a run whose faults cost all its time keeps nothing."""
    interval = interval_minutes if interval_minutes is not None else sched.fault_interval_minutes
    kept = max(0.0, 1 - cost_s / (interval * 60))
    return kept * ideal_s / steady_s


def compute(recovery_rows: list[dict[str, Any]], sched: Schedule) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(goodput rows, projection rows) from recovery rows at one delay: per trainer and checkpoint period."""
    sched.check()
    rows: list[dict[str, Any]] = []
    projections: list[dict[str, Any]] = []
    valid = [r for r in recovery_rows if r.get("runs") and not r.get("invalid_reason")]
    for trainer, period in sorted({(r["trainer"], r.get("checkpoint_period")) for r in valid}, key=str):
        mine = [r for r in valid if r["trainer"] == trainer and r.get("checkpoint_period") == period]
        steady = {r["strategy"]: v for r in mine if (v := steady_of(r)) is not None}
        if not steady:
            continue
        ideal = min(steady.values())
        drift = step_times_drifted(mine)
        for strategy in sorted({r["strategy"] for r in mine}):
            costs: dict[str, float] = {}
            basis: dict[str, str] = {}
            runs: dict[str, int] = {}
            for r in (r for r in mine if r["strategy"] == strategy and r["fault"] in sched.fault_mix):
                c, b = fault_cost_of(r)
                if c is not None:
                    costs[r["fault"]], basis[r["fault"]], runs[r["fault"]] = c, b, int(r["runs"])
                    if r.get("reference_note"):
                        basis[r["fault"]] += f" (against the fault-free runs' rate: {r['reference_note']})"
                    if r.get("own_rate_note"):
                        basis[r["fault"]] += f" (not the own pre-fault rate: {r['own_rate_note']})"
            weights = {f: sched.fault_mix[f] for f in costs if sched.fault_mix[f] > 0}
            row: dict[str, Any] = {
                "trainer": trainer,
                "strategy": strategy,
                "checkpoint_period": period,
                "run_hours": sched.run_hours,
                "fault_interval_minutes": sched.fault_interval_minutes,
                "faults_in_run": rnd(sched.run_hours * 60 / sched.fault_interval_minutes, 2),
                "fault_mix": weights,
                "faults_measured": sorted(weights),
                "faults_not_measured": sorted(f for f, w in sched.fault_mix.items() if w > 0 and f not in weights),
                "fault_cost_seconds": {f: rnd(costs[f]) for f in sorted(weights)},
                "fault_cost_basis": {f: basis[f] for f in sorted(weights)},
                "runs": min(runs[f] for f in weights) if weights else 0,
                "steady_seconds_per_step": rnd(steady.get(strategy), 5),
                "ideal_seconds_per_step": rnd(ideal, 5),
            }
            bad = [
                r["basis_invalid"]
                for r in mine
                if r["strategy"] == strategy and r["fault"] in weights and r.get("basis_invalid")
            ]
            if strategy not in steady or not weights or drift or bad:
                row["goodput"] = None
                row["invalid_reason"] = drift or (
                    "no fault-free rate"
                    if strategy not in steady
                    else "no fault kind of the mix was measured"
                    if not weights
                    else "; ".join(bad)
                )
                rows.append(row)
                continue
            mean_cost = sum(costs[f] * w for f, w in weights.items()) / sum(weights.values())
            row["mean_fault_cost_seconds"] = rnd(mean_cost)
            row["steady_overhead"] = rnd(steady[strategy] / ideal - 1, 4)
            row["goodput"] = rnd(goodput(steady[strategy], ideal, mean_cost, sched), 4)
            rows.append(row)
            for rate in PUBLISHED_RATES:
                hours = rate.interval_hours(PROJECTION_CHIPS)
                projections.append(
                    {
                        "trainer": trainer,
                        "strategy": strategy,
                        "checkpoint_period": period,
                        "chips": PROJECTION_CHIPS,
                        "source": rate.source,
                        "interval_hours": rnd(hours, 3),
                        "mean_fault_cost_seconds": rnd(mean_cost),
                        "goodput": rnd(goodput(steady[strategy], ideal, mean_cost, sched, hours * 60), 4),
                    }
                )
    return rows, projections


def realistic_rows(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """A recovery result's rows at each trainer's realistic replacement delay, at every checkpoint period
    measured there (MaxText's are published at two periods; each period gets its own goodput rows).

    An example-trainer row marked invalid for its cost against the fault-free runs' rate (that rate's
    noise between runs) is kept when every run has a cost against its own pre-fault rate, none below
    zero (:func:`bench.common.own_rate_invalid`): that is the basis :func:`fault_cost_of` uses. Its
    reason moves to ``reference_note``. The other way round, an example-trainer row whose own-rate cost
    is below zero in a run (a pre-fault window too short to stand for the run: one that holds a cost the
    process pays once at its start, such as the sidecar's ``auto`` probe) but valid against the fault-free
    runs' rate is weighed at that rate; why moves to ``own_rate_note``. A row weighed at the fault-free
    runs' rate whose cost there is below a run's own stall (:func:`bench.common.cost_below_stall`) gets
    ``basis_invalid``, and its strategy no goodput: neither rate is the one its runs went on at."""
    cfg = rec.get("config") or {}
    out = []
    for r in rec.get("results") or []:
        tcfg = (cfg.get("by_trainer") or {}).get(r.get("trainer"), cfg)  # as bench.report.trainer_config
        if r.get("replacement_delay") != tcfg.get("realistic_delay"):
            continue
        if r.get("invalid_reason") and not own_rate_invalid(rec, r):
            r = {k: v for k, v in r.items() if k != "invalid_reason"} | {"reference_note": r["invalid_reason"]}
        elif (
            not r.get("invalid_reason")
            and r.get("fault_cost_own_rate_seconds_median") is not None
            and r.get("fault_cost_method") != "local"
            and (why := own_rate_invalid(rec, r))
        ):
            r = {k: v for k, v in r.items() if k != "fault_cost_own_rate_seconds_median"} | {"own_rate_note": why}
        if (
            not r.get("invalid_reason")
            and r.get("fault_cost_own_rate_seconds_median") is None
            and (why := cost_below_stall(rec, r, own_rate=False))
        ):
            r = r | {"basis_invalid": why}  # weighed at the fault-free runs' rate, which that run did not go on at
        out.append(r)
    return out


def run(
    quick: bool = False,
    sched: Schedule | None = None,
    recovery_result: dict[str, Any] | None = None,
    recovery_source: str | None = None,
    workdir: Path | None = None,
    **recovery_over: Any,
) -> dict[str, Any]:
    """Measure the components with :func:`bench.recovery.run` (unless ``recovery_result`` is given) and combine."""
    sched = (sched or Schedule()).check()
    t0 = time.monotonic()
    if recovery_result is None:
        from bench import recovery

        over = {"faults": list(FAULTS), "sweep_faults": list(FAULTS), **recovery_over}
        for k, v in ({} if quick else RECOVERY_DEFAULTS).items():
            if over.get(k) is None:
                over[k] = v
        if not quick and over.get("fault_free_runs") is None:
            over["fault_free_runs"] = min(3, over.get("runs") or 5)  # at least 3 fault-free references
        log("goodput: measuring its components with the recovery benchmark")
        from bench.common import git_state

        recovery_result = {
            **recovery.run(quick=quick, workdir=workdir, keep=workdir is not None, **over),
            "git_sha": git_state()["git_sha"],  # the commit this run measured (as the section's own)
        }
        recovery_source = "measured in this run (bench.recovery)"
    rows, projections = compute(realistic_rows(recovery_result), sched)
    rcfg = recovery_result.get("config") or {}
    return {
        "name": NAME,
        "quick": quick or bool(recovery_result.get("quick")),
        "config": {
            **asdict(sched),
            "formula": "(1 - faults x mean fault cost / run seconds) x ideal step seconds / strategy step seconds",
            "inputs_from": portable_path(recovery_source) if recovery_source else recovery_source,
            "inputs_git_sha": recovery_result.get("git_sha"),
            "recovery_config": {
                k: rcfg.get(k)
                for k in (
                    "trainers",
                    "strategies",
                    "faults",
                    "realistic_checkpoint_period",
                    "realistic_delay",
                    "runs",
                    "fault_free_runs",
                    "state_mib",
                    "state_bytes",
                )
            },
            "projection_chips": PROJECTION_CHIPS,
        },
        "results": rows,
        "projection": projections,
        "recovery_results": realistic_rows(recovery_result),
        "duration_s": round(time.monotonic() - t0, 1),
    }
