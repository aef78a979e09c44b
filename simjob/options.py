"""Options of ``elastic-sidecar demo`` and the fault specification parser."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from agent.config import address

FAULT_KINDS = ("kill", "hang", "notice", "metadata")
"""kill: SIGKILL the host; hang: SIGSTOP it; notice: publish a GCE terminateOnHostMaintenance
log entry for its node through Pub/Sub, then kill it at the deadline; metadata: flip its
stand-in metadata server to TERMINATE_ON_HOST_MAINTENANCE, then kill it at the deadline."""
ANNOUNCED = ("notice", "metadata")
_FAULT_RE = re.compile(r"^(?P<kind>[a-z]+):(?P<slice>\d+)\.(?P<host>\d+)@(?P<step>\d+)$")
DEFAULT_FAULTS = ("kill:1.0@40", "hang:2.0@120")


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    slice: int
    host: int
    at_step: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.slice}.{self.host}@{self.at_step}"


def parse_fault(text: str) -> FaultSpec:
    m = _FAULT_RE.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(
            f"bad --fault {text!r}: expected KIND:SLICE.HOST@STEP with KIND one of {', '.join(FAULT_KINDS)}, "
            "e.g. kill:1.0@40"
        )
    if m["kind"] not in FAULT_KINDS:
        raise argparse.ArgumentTypeError(
            f"bad --fault {text!r}: kind {m['kind']!r} is not one of {', '.join(FAULT_KINDS)}"
        )
    return FaultSpec(m["kind"], int(m["slice"]), int(m["host"]), int(m["step"]))


def check_faults(faults: list[FaultSpec], slices: int, hosts: int, steps: int) -> None:
    for f in faults:
        if not 0 <= f.slice < slices:
            raise ValueError(f"--fault {f}: slice {f.slice} does not exist (slices 0..{slices - 1})")
        if not 0 <= f.host < hosts:
            raise ValueError(f"--fault {f}: host {f.host} does not exist (hosts 0..{hosts - 1} per slice)")
        if not 0 < f.at_step < steps:
            raise ValueError(f"--fault {f}: step {f.at_step} is outside 1..{steps - 1}")


def _int_at_least(lo: int):
    def conv(v: str) -> int:
        try:
            i = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {v!r}") from None
        if i < lo:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {lo}, got {v!r}")
        return i

    return conv


def _seconds(v: str) -> float:
    try:
        f = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {v!r}") from None
    if f < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {v!r}")
    return f


def add_demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slices", type=_int_at_least(1), default=4, help="slices in the simulated job (default 4)")
    p.add_argument("--hosts-per-slice", type=_int_at_least(1), default=1, help="hosts per slice (default 1)")
    p.add_argument("--devices-per-slice", type=_int_at_least(1), default=2, help="CPU devices per slice (default 2)")
    p.add_argument("--steps", type=_int_at_least(2), default=200, help="training steps (default 200)")
    p.add_argument("--step-seconds", type=_seconds, default=0.05, help="pad each step to this long (default 0.05)")
    p.add_argument("--checkpoint-period", type=_int_at_least(1), default=50, help="periodic Orbax save every N steps")
    p.add_argument(
        "--min-slices",
        type=int,
        default=2,
        help="elastic_min_slice_count: -1 waits for all slices, k continues on >= k (default 2)",
    )
    p.add_argument("--timeout", type=_seconds, default=60.0, help="elastic_timeout_seconds (default 60)")
    p.add_argument("--max-retries", type=_int_at_least(1), default=10, help="elastic_max_retries (default 10)")
    p.add_argument(
        "--replacement-delay",
        type=_seconds,
        default=5.0,
        help="seconds until the stand-in provisioner recreates a lost slice (default 5)",
    )
    p.add_argument("--no-replacement", action="store_true", help="never recreate lost slices")
    p.add_argument(
        "--notice-deadline",
        type=_seconds,
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
        metavar="KIND:SLICE.HOST@STEP",
        help=f"inject a fault (repeatable); kinds: {', '.join(FAULT_KINDS)}. "
        f"Default when none is given: {' '.join(DEFAULT_FAULTS)}",
    )
    p.add_argument("--no-faults", action="store_true", help="run without any fault")
    p.add_argument("--summary-json", type=Path, default=None, help="write the summary as JSON here")
    p.add_argument("--log-format", choices=["json", "console"], default="json", help="sidecar log format")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.add_argument("--run-timeout", type=_seconds, default=600.0, help="give up on the whole demo after this long")
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
