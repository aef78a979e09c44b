"""Options of ``elastic-sidecar demo`` and the fault specification parser."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.config import address, seconds, whole
from agent.constants import INT64_MAX

HOST_KINDS = ("kill", "hang", "notice", "metadata", "sidecar-restart", "stale-notice")
"""Faults aimed at one host, ``KIND:SLICE.HOST@STEP``. kill: SIGKILL the host; hang: SIGSTOP it;
notice: publish a GCE terminateOnHostMaintenance log entry for its node through Pub/Sub, then
kill it at the deadline; metadata: flip its stand-in metadata server to
TERMINATE_ON_HOST_MAINTENANCE, then kill it at the deadline; sidecar-restart: SIGKILL that host's
worker sidecar alone (its Pathways worker stays healthy) and start a new one; stale-notice: publish
a GCE upcomingMaintenance entry for its node whose window ended two days ago (a replayed or late
notice), and leave the host up."""
JOB_KINDS = ("coordinator-restart", "coordinator-stall", "trainer-kill")
"""Faults aimed at the job's own processes. ``coordinator-restart@STEP``: SIGKILL the coordinator,
start it again on the same state location; ``coordinator-stall:SECONDS@STEP``: SIGSTOP it, SIGCONT
after SECONDS; ``trainer-kill@STEP``: SIGKILL the trainer, start it again with the same arguments
(it restores from its Orbax checkpoint), as the JobSet would."""
HOST_TIMED_KINDS = ("sidecar-stall", "partition")
"""Faults aimed at one host for a while, ``KIND:SLICE.HOST:SECONDS@STEP``. sidecar-stall: SIGSTOP
that host's worker sidecar alone (its Pathways worker stays healthy), SIGCONT after SECONDS;
partition: cut that host's links to the coordinator (its stream and its heartbeat datagrams pass a
stand-in network path of their own, :class:`standins.netproxy.HostLink`) for SECONDS."""
SLICE_KINDS = ("slow",)
"""Faults aimed at a slice's pace, ``slow:SLICE:FACTOR@STEP``: from STEP on, the slice's work takes
FACTOR times as long (``slow:*:FACTOR@STEP``: every slice's); ``slow:SLICE:FACTOR@STEP+SECONDS``
for SECONDS only. The trainer's step then takes as long as its slowest active slice makes it, and
each host's stand-in libtpu metrics service shows what that host would (:mod:`simjob.slowdowns`)."""
FAULT_KINDS = HOST_KINDS + HOST_TIMED_KINDS + JOB_KINDS + SLICE_KINDS
MAX_SLOW_FACTOR = 100.0
"""A slice a hundred times slower is a hang, not a straggler (and would outlast any demo run)."""
ANNOUNCED = ("notice", "metadata")
RESTART_DELAY = 1.0
"""Seconds from a coordinator, sidecar or trainer kill until the demo starts it again."""
SAME_STEP_GAP = 0.2
"""Seconds between faults due at the same step (injected in the order given)."""
_FAULT_RE = re.compile(r"^(?P<kind>[a-z][a-z-]*)(?::(?P<arg>[^@]*))?@(?P<step>[^@]*)$")
_HOST_RE = re.compile(r"^(?P<slice>\d+)\.(?P<host>\d+)$")
_SLOW_RE = re.compile(r"^(?P<slice>\d+|\*):(?P<factor>[^:]+)$")
DEFAULT_FAULTS = ("kill:1.0@40", "hang:2.0@120")
FAULT_HELP = (
    "KIND:SLICE.HOST@STEP with KIND one of " + ", ".join(HOST_KINDS) + " (e.g. kill:1.0@40), "
    "or sidecar-stall:SLICE.HOST:SECONDS@STEP, partition:SLICE.HOST:SECONDS@STEP, coordinator-restart@STEP, "
    "coordinator-stall:SECONDS@STEP, "
    "trainer-kill@STEP, slow:SLICE:FACTOR@STEP, slow:SLICE:FACTOR@STEP+SECONDS or slow:*:FACTOR@STEP"
)


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    slice: int | None
    host: int | None
    at_step: int
    seconds: float | None = None
    factor: float | None = None
    """``slow``: how many times as long the slice's work takes (its slice None: every slice's)."""

    def __str__(self) -> str:
        if self.kind in SLICE_KINDS:
            where = "*" if self.slice is None else str(self.slice)
            until = "" if self.seconds is None else f"+{self.seconds:g}"
            return f"{self.kind}:{where}:{self.factor:g}@{self.at_step}{until}"
        if self.slice is not None and self.seconds is not None:
            return f"{self.kind}:{self.slice}.{self.host}:{self.seconds:g}@{self.at_step}"
        if self.slice is not None:
            return f"{self.kind}:{self.slice}.{self.host}@{self.at_step}"
        if self.seconds is not None:
            return f"{self.kind}:{self.seconds:g}@{self.at_step}"
        return f"{self.kind}@{self.at_step}"

    @property
    def on_host(self) -> bool:
        return self.kind in HOST_KINDS or self.kind in HOST_TIMED_KINDS


def parse_fault(text: str) -> FaultSpec:
    """``--fault`` values; a bad one raises ArgumentTypeError naming the value and what is expected."""

    def bad(why: str) -> argparse.ArgumentTypeError:
        return argparse.ArgumentTypeError(f"bad --fault {text!r}: {why}")

    m = _FAULT_RE.match(text.strip())
    if not m:
        raise bad(f"expected {FAULT_HELP}")
    kind, arg, step_s = m["kind"], m["arg"], m["step"]
    if kind not in FAULT_KINDS:
        raise bad(f"kind {kind!r} is not one of {', '.join(FAULT_KINDS)}")
    if kind in SLICE_KINDS:
        return _parse_slow(kind, arg, step_s, bad)
    if not step_s.isdigit():
        raise bad(f"step {step_s!r} is not a whole number")
    step = int(step_s)
    if kind in HOST_KINDS:
        h = _HOST_RE.match(arg or "")
        if arg is None or not h:
            raise bad(f"{kind} needs SLICE.HOST, e.g. {kind}:1.0@{step}")
        return FaultSpec(kind, int(h["slice"]), int(h["host"]), step)
    if kind in HOST_TIMED_KINDS:
        where, _, secs = (arg or "").partition(":")
        h = _HOST_RE.match(where)
        if not h or not secs:
            raise bad(f"{kind} needs SLICE.HOST:SECONDS, e.g. {kind}:2.0:3@{step}")
        return FaultSpec(kind, int(h["slice"]), int(h["host"]), step, _seconds(secs, bad))
    if kind == "coordinator-stall":
        if arg is None:
            raise bad(f"coordinator-stall needs SECONDS, e.g. coordinator-stall:3@{step}")
        return FaultSpec(kind, None, None, step, _seconds(arg, bad))
    if arg is not None:
        raise bad(f"{kind} takes no argument, e.g. {kind}@{step}")
    return FaultSpec(kind, None, None, step)


def _seconds(text: str, bad: Callable[[str], argparse.ArgumentTypeError]) -> float:
    """A fault's SECONDS: a number above 0 and at most an hour."""
    try:
        seconds = float(text)
    except ValueError:
        raise bad(f"seconds {text!r} is not a number") from None
    if not 0 < seconds <= 3600:
        raise bad(f"seconds {text!r} must be above 0 and at most 3600")
    return seconds


def _parse_slow(kind: str, arg: str | None, step_s: str, bad: Callable[[str], argparse.ArgumentTypeError]) -> FaultSpec:
    """``slow:SLICE:FACTOR@STEP[+SECONDS]``, SLICE a slice number or ``*`` (every slice)."""
    example = f"{kind}:2:1.5@40 or {kind}:2:1.5@40+5"
    m = _SLOW_RE.match(arg or "")
    if not m:
        raise bad(f"{kind} needs SLICE:FACTOR (SLICE a number or *), e.g. {example}")
    step_text, plus, secs = step_s.partition("+")
    if not step_text.isdigit():
        raise bad(f"step {step_text!r} is not a whole number")
    try:
        factor = float(m["factor"])
    except ValueError:
        raise bad(f"factor {m['factor']!r} is not a number") from None
    if not (math.isfinite(factor) and 1 < factor <= MAX_SLOW_FACTOR):
        raise bad(f"factor {m['factor']!r} must be above 1 and at most {MAX_SLOW_FACTOR:g}")
    seconds = _seconds(secs, bad) if plus else None
    where = None if m["slice"] == "*" else int(m["slice"])
    return FaultSpec(kind, where, None, int(step_text), seconds, factor)


def check_faults(
    faults: list[FaultSpec], slices: int, hosts: int, steps: int, kinds: tuple[str, ...] = FAULT_KINDS
) -> None:
    for f in faults:
        if f.kind not in kinds:
            raise ValueError(f"--fault {f}: kind {f.kind!r} is not supported here (only {', '.join(kinds)})")
        if f.on_host:
            assert f.slice is not None and f.host is not None
            if not 0 <= f.slice < slices:
                raise ValueError(f"--fault {f}: slice {f.slice} does not exist (slices 0..{slices - 1})")
            if not 0 <= f.host < hosts:
                raise ValueError(f"--fault {f}: host {f.host} does not exist (hosts 0..{hosts - 1} per slice)")
        elif f.slice is not None and not 0 <= f.slice < slices:
            raise ValueError(f"--fault {f}: slice {f.slice} does not exist (slices 0..{slices - 1})")
        if not 0 < f.at_step < steps:
            raise ValueError(f"--fault {f}: step {f.at_step} is outside 1..{steps - 1}")


class Given(argparse.Action):
    """Stores the value and notes that the user typed the option (``ns.given``), so that a
    default the user never chose can be fitted to the job, and a typed conflict refused."""

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: object, opt: object = None):
        setattr(ns, self.dest, values)
        ns.given = {*getattr(ns, "given", set()), self.dest}


DEFAULT_MIN_SLICES = 2
DEMO_STRAGGLER_WINDOW = 0.5
"""Seconds: a demo step is tens of milliseconds, so a window of a real job's size would hold the whole run."""
DEMO_STRAGGLER_EVIDENCE_SECONDS = 7.0
"""How long a slice must stand out before the demo's coordinator calls it a straggler: longer than
a transient the issue names (5 s), short enough for a 400-step run."""


def min_slices(ns: argparse.Namespace) -> int:
    """``--min-slices``, or its default 2 (the job's slice count when it has fewer)."""
    v = getattr(ns, "min_slices", None)
    return min(DEFAULT_MIN_SLICES, ns.slices) if v is None else int(v)


def check_flags(ns: argparse.Namespace) -> None:
    """Options that contradict each other or the mode; a ValueError names them."""
    typed: set[str] = getattr(ns, "given", set())
    mc = getattr(ns, "mode", "single-controller") == "multi-controller"
    if not mc:
        if ns.no_sidecar:
            raise ValueError("--no-sidecar needs --mode multi-controller")
    else:
        numpy = getattr(ns, "trainer_backend", "jax") == "numpy"
        for flag, on in (
            ("--via-proxy", ns.via_proxy),
            ("--trainer-arg", ns.trainer_arg),
            ("--trainer-backend numpy", numpy),
        ):
            if on:
                raise ValueError(f"{flag} is for the single-controller demo, not --mode multi-controller")
    if getattr(ns, "plot", None) is not None:
        if mc:
            raise ValueError("--plot is for the single-controller demo, not --mode multi-controller")
        from simjob.plot import MISSING, available

        if not available():
            raise ValueError(MISSING)
    if "baseline_window" in typed and not ns.no_sidecar:
        raise ValueError("--baseline-window applies only with --no-sidecar")


MC_KINDS = ("kill", "hang", "notice", "metadata")
"""Faults of ``--mode multi-controller``."""
MC_DEFAULT_FAULTS = ("kill:1.0@40",)


def add_demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mode",
        choices=["single-controller", "multi-controller"],
        default="single-controller",
        help="single-controller (default): one trainer process over every slice, as with Pathways; "
        "multi-controller: one JAX CPU process per host joined by jax.distributed (gloo collectives), "
        "a lost host ends the attempt (exit 42) and a stand-in for JobSet restarts the job; faults "
        + ", ".join(MC_KINDS)
        + f" (default {' '.join(MC_DEFAULT_FAULTS)})",
    )
    p.add_argument("--slices", type=whole(1), default=4, help="slices in the simulated job (default 4)")
    p.add_argument("--hosts-per-slice", type=whole(1), default=1, help="hosts per slice (default 1)")
    p.add_argument("--devices-per-slice", type=whole(1), default=2, help="CPU devices per slice (default 2)")
    p.add_argument("--steps", type=whole(2, INT64_MAX), default=200, help="training steps (default 200)")
    p.add_argument(
        "--step-seconds", type=seconds(zero_ok=True), default=0.05, help="pad each step to this long (default 0.05)"
    )
    p.add_argument("--checkpoint-period", type=whole(1), default=50, help="periodic Orbax save every N steps")
    p.add_argument(
        "--min-slices",
        type=whole(-1),
        default=None,
        action=Given,
        help="elastic_min_slice_count: -1 waits for all slices, k continues on >= k "
        f"(default {DEFAULT_MIN_SLICES}, or --slices when fewer)",
    )
    p.add_argument("--timeout", type=seconds(), default=60.0, help="elastic_timeout_seconds (default 60)")
    p.add_argument("--max-retries", type=whole(1), default=10, help="elastic_max_retries (default 10)")
    p.add_argument(
        "--replacement-delay",
        type=seconds(zero_ok=True),
        default=5.0,
        help="seconds until the stand-in provisioner recreates a lost slice (default 5)",
    )
    p.add_argument("--no-replacement", action="store_true", help="never recreate lost slices")
    p.add_argument(
        "--notice-deadline",
        type=seconds(zero_ok=True),
        default=4.0,
        help="seconds from a notice or metadata fault until its host dies (default 4)",
    )
    p.add_argument(
        "--workdir", type=Path, default=None, help="checkpoints, logs and journals (default: a new temp dir)"
    )
    p.add_argument(
        "--fault",
        action="append",
        type=parse_fault,
        default=None,
        metavar="FAULT",
        help=f"inject a fault (repeatable): {FAULT_HELP}. kill SIGKILLs the host, hang SIGSTOPs it, "
        "notice/metadata announce its maintenance and kill it at --notice-deadline, sidecar-restart "
        "SIGKILLs its worker sidecar alone and starts a new one; coordinator-restart SIGKILLs the "
        f"coordinator and starts it {RESTART_DELAY:g} s later on the same state, coordinator-stall "
        "SIGSTOPs it for SECONDS, trainer-kill SIGKILLs the trainer and starts it again (it restores "
        "from its checkpoint); slow makes slice SLICE's work (every slice's for *) take FACTOR (above 1) "
        "times as long from STEP on, for SECONDS only with +SECONDS, and the training step with it. "
        f"Faults due at the same step go in the order given, {SAME_STEP_GAP:g} s "
        f"apart. Default when none is given: {' '.join(DEFAULT_FAULTS)} (moved into a shorter --steps, dropped "
        "where the host does not exist); not with --no-faults",
    )
    p.add_argument("--no-faults", action="store_true", help="run without any fault (not with --fault)")
    p.add_argument(
        "--straggler-window-seconds",
        type=seconds(),
        default=DEMO_STRAGGLER_WINDOW,
        help="each worker sidecar's window over its host's libtpu metrics (the stand-in service the demo "
        f"runs per host; default {DEMO_STRAGGLER_WINDOW:g}, demo-sized: the detector wants a few normal windows "
        "for its baseline before a fault at step 40)",
    )
    p.add_argument(
        "--no-sidecar",
        action="store_true",
        help="--mode multi-controller only: the baseline, trainer processes without the hooks (the sidecars "
        "still run, nobody acts on what they see); the run ends --baseline-window seconds after the first "
        "fault if trainer processes are still there",
    )
    p.add_argument(
        "--baseline-window",
        type=seconds(zero_ok=True),
        default=60.0,
        action=Given,
        help="with --no-sidecar: how long after the fault to wait for every trainer process to be gone (default 60)",
    )
    p.add_argument("--summary-json", type=Path, default=None, help="write the summary as JSON here")
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PATH",
        help="draw the run to PATH (PNG): steps over time per slice set, each fault and its recovery's phases "
        "marked (needs matplotlib)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="the coordinator's state location (state file and journal; default: in --workdir)",
    )
    p.add_argument(
        "--via-proxy",
        action="store_true",
        help="route the worker sidecars' and the trainer's links through a loopback TCP forwarder "
        "(what the fault-matrix tests cut to make a stream blip)",
    )
    p.add_argument(
        "--coordinator-arg",
        action="append",
        default=None,
        metavar="ARG",
        help="pass ARG on to the coordinator (repeatable; write --coordinator-arg=--rejoin-grace=5)",
    )
    p.add_argument(
        "--trainer-arg",
        action="append",
        default=None,
        metavar="ARG",
        help="pass ARG on to the example trainer (repeatable; write --trainer-arg=--donate or "
        "--trainer-arg=--hidden=65536 for a larger state)",
    )
    p.add_argument(
        "--trainer-backend",
        choices=["jax", "numpy"],
        default="jax",
        help="the example trainer's backend: jax (default; JAX on CPU devices, Orbax checkpoints) or numpy (the "
        "same loop, hooks and events on NumPy arrays, .npz checkpoints: no jit, sharding or Orbax)",
    )
    p.add_argument("--log-format", choices=["json", "console"], default="json", help="sidecar log format")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.add_argument("--run-timeout", type=seconds(), default=600.0, help="give up on the whole demo after this long")
    p.add_argument(
        "--admin-address",
        type=address,
        default=None,
        metavar="HOST:PORT",
        help="the coordinator's admin API (default: a free loopback port, printed at start); "
        "drive the job with `elastic-sidecar admin --address ...`",
    )
    p.add_argument(
        "--admin-token-file",
        type=Path,
        default=None,
        help="file with the admin API's bearer token (default: none, the admin API is not authenticated)",
    )
    p.add_argument(
        "--http-address",
        type=address,
        default=None,
        metavar="HOST:PORT",
        help="the coordinator's HTTP server: status page, /metrics, /readyz (default: a free loopback port)",
    )
    p.add_argument(
        "--kube-api",
        action="store_true",
        help="serve a stand-in Kubernetes API on loopback that lists the hosts as the JobSet's pods (xpk's "
        "labels) and kills a host when its pod is deleted; for `elastic-sidecar drill` (single-controller)",
    )
    p.add_argument(
        "--kubeconfig-out",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the stand-in API's kubeconfig here (implies --kube-api; default: kubeconfig in --workdir)",
    )
