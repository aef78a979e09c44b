"""Drive the real MaxText on the CPU from the main venv: its arguments, a process, a sidecar.

The driving process runs in the main venv and hosts a real
:class:`agent.coordinator.Coordinator` on an event loop of its own thread
(:class:`Sidecar`); MaxText runs as a subprocess of the separate MaxText venv
(:class:`MaxTextRun`), started through ``python -m trainer_hooks.maxtext`` or
``python -m simjob.maxtext`` (with :mod:`simjob.maxtext.cpu_elastic`).
Used by tests/maxtext and ``python -m bench recovery``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.config import CoordinatorConfig
from agent.coordinator import Coordinator
from agent.core.model import Decision, Event, Policy, State
from simjob.cpu_devices import cpu_device_env

REPO = Path(__file__).resolve().parents[2]
MAXTEXT_VENV = REPO / ".venv-maxtext"
MAXTEXT_PYTHON = MAXTEXT_VENV / "bin" / "python"
PATCHED_MODULE = "simjob.maxtext"
"""``python -m simjob.maxtext``: the served MaxText with :mod:`simjob.maxtext.cpu_elastic` applied."""

JOB = "maxtext-job"
DEVICES = 4
"""CPU devices of a MaxText process unless a run says otherwise."""
MULTI_SLICE_DEVICES = 8
MULTI_SLICES = 4
"""The multi-slice job (issue 23): 8 CPU devices in 4 slices of 2 (``ELASTIC_SIDECAR_TEST_CPU_SLICES``), the
data axis across the slices (``dcn_data_parallelism``, :data:`MULTI_SLICE_MESH`), FSDP within each."""
MULTI_SLICE_MESH = ("dcn_data_parallelism=-1", "ici_fsdp_parallelism=-1")
"""MaxText's own multi-slice mesh: the slices (DCN) along ``data``, each slice's devices along ``fsdp``, so every
slice holds a whole replica of the state (the replica axis of Orbax's Pathways Snapshotter)."""
TINY_MODEL = (
    "hardware=cpu",
    "dataset_type=synthetic",
    "base_emb_dim=64",
    "base_num_decoder_layers=2",
    "base_mlp_dim=128",
    "base_num_query_heads=4",
    "base_num_kv_heads=4",
    "head_dim=16",
    "vocab_size=256",
    "max_target_length=64",
    "per_device_batch_size=1",
    "attention=dot_product",
    "dtype=float32",
    # A fixed schedule: a resumed run's losses then equal an uninterrupted run's.
    "learning_rate_schedule_steps=2000",
    # Only the sidecar's flushes checkpoint.
    "enable_checkpointing=true",
    "async_checkpointing=true",
    "checkpoint_period=1000000",
    "save_checkpoint_on_start=false",
    "save_checkpoint_on_completion=false",
    "enable_goodput_recording=false",
    "monitor_goodput=false",
    "enable_tensorboard=false",
    "skip_jax_distributed_system=true",
)
MODELS: dict[str, dict[str, str]] = {
    "tiny": {},
    # About ten times the tiny model's parameters (4 layers of width 128 against 2 of 64): the
    # done-when runs' "several times larger" model; the same job otherwise.
    "larger": {
        "base_emb_dim": "128",
        "base_num_decoder_layers": "4",
        "base_mlp_dim": "512",
        "head_dim": "32",
    },
}
"""Model sizes by name: overrides of :data:`TINY_MODEL`'s keys."""


def model_args(model: str = "tiny") -> list[str]:
    """:data:`TINY_MODEL` with the overrides of ``MODELS[model]`` (each key given once)."""
    if model not in MODELS:
        raise ValueError(f"unknown MaxText model size {model!r}: expected one of {sorted(MODELS)}")
    over = MODELS[model]
    out = [f"{k}={over[k]}" if (k := a.split("=", 1)[0]) in over else a for a in TINY_MODEL]
    missing = set(over) - {a.split("=", 1)[0] for a in TINY_MODEL}
    if missing:
        raise ValueError(f"MODELS[{model!r}] overrides keys the tiny model does not set: {sorted(missing)}")
    return out


START_TIMEOUT = 180.0
"""MaxText's imports and first compile: about 15 s alone, far more on a loaded 2-core machine."""
WAIT = 60.0
"""Anything after start-up: a flush, a hold, a resume, an in-process elastic restart."""


def maxtext_args(
    out: Path,
    run_name: str,
    steps: int,
    *extra: str,
    jax_cache: Path | None = None,
    reuse_cache: bool = False,
    model: str = "tiny",
    data: Path | None = None,
) -> list[str]:
    """MaxText's ``key=value`` arguments: the model, the job's settings, then ``extra``.

    ``jax_cache``: MaxText's persistent compile cache (``jax_cache_dir``, ``~/jax_cache`` by default),
    which must start empty, as a new job's does: the programs of earlier runs on this machine would
    make a rebuild look faster than a new job's. None (the default): a fresh directory under ``out``;
    a given one that already holds something is refused, unless ``reuse_cache`` (the tests whose
    assertions do not depend on compiles share one warm cache: :mod:`tests.maxtext.harness`).

    ``data``: an ArrayRecord file of :mod:`simjob.maxtext.grain_data` read by MaxText's grain pipeline
    instead of the synthetic batch (the same batch every step)."""
    if jax_cache is None:
        if reuse_cache:
            raise ValueError("reuse_cache=True needs the jax_cache to reuse; None makes a fresh one")
        out.mkdir(parents=True, exist_ok=True)
        jax_cache = Path(tempfile.mkdtemp(prefix=f"jax-cache-{run_name}-", dir=out))
    elif not reuse_cache and jax_cache.exists() and any(jax_cache.iterdir()):
        raise ValueError(f"jax_cache={jax_cache}: not empty; a run's compile cache must start empty, as a new job's")
    base = model_args(model)
    if data is not None:
        from simjob.maxtext.grain_data import maxtext_flags

        base = [a for a in base if not a.startswith("dataset_type=")] + maxtext_flags(data)
    return [
        *base,
        f"base_output_directory={out}",
        f"run_name={run_name}",
        f"steps={steps}",
        f"metrics_file={out / f'{run_name}-{steps}-metrics.jsonl'}",
        f"jax_cache_dir={jax_cache}",
        *extra,
    ]


def checkpoint_labels(out: Path, run_name: str) -> list[int]:
    """Committed checkpoint labels on disk (MaxText: the index of the step just run)."""
    d = out / run_name / "checkpoints"
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit() and (p / "commit_success.txt").exists())


# ---------------------------------------------------------------------------
# a MaxText process
# ---------------------------------------------------------------------------

_STEP_LINE = re.compile(r"completed step: (\d+), .*?\bloss: ([0-9.eE+-]+)")
_MESH_LINE = re.compile(r"Num_devices: (\d+), shape \(([\d, ]*)\)")
_HOOK_LINE = re.compile(r"^trainer_hooks\.maxtext: (\w+) (\{.*\})$")


class MaxTextRun:
    """One MaxText process; its stdout and stderr go to ``log``."""

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        out: Path,
        *,
        sidecar: Sidecar | None = None,
        module: str = "trainer_hooks.maxtext",
        env: dict[str, str] | None = None,
        python: Path = MAXTEXT_PYTHON,
        devices: int = DEVICES,
    ) -> None:
        if not Path(python).exists():
            raise FileNotFoundError(
                f"no MaxText interpreter at {python}: the MaxText runs need a Python 3.12 venv with "
                f"maxtext[tpu]==0.2.5 and this package at {MAXTEXT_VENV} (see tests/maxtext/harness.py)"
            )
        self.name = name
        self.args = list(args)
        self.log = out / f"{name}.log"
        self.metrics_file = Path(next(a for a in self.args if a.startswith("metrics_file=")).split("=", 1)[1])
        e = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("ELASTIC_SIDECAR_")
        }
        e.update(
            **cpu_device_env(devices),
            PYTHONUNBUFFERED="1",
            TF_CPP_MIN_LOG_LEVEL="2",
        )
        if sidecar is not None:
            e.update(ELASTIC_SIDECAR_ADDRESS=sidecar.address, ELASTIC_SIDECAR_JOB=JOB)
        e.update(env or {})
        self.started = time.monotonic()
        with open(self.log, "wb") as f:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [str(python), "-m", module, *self.args], cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=e
            )

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float = START_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not exit within {timeout} s\n{self.tail()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, n: int = 40) -> str:
        lines = self.text().splitlines()
        return f"--- last {n} lines of {self.log}:\n" + "\n".join(lines[-n:])

    def logged_steps(self) -> dict[int, float]:
        """MaxText's ``completed step: N, ... loss: X`` lines (N: index of the step run)."""
        return {int(m[1]): float(m[2]) for m in _STEP_LINE.finditer(self.text())}

    def losses(self) -> dict[int, float]:
        """Full-precision losses by step index, from MaxText's ``metrics_file``."""
        if not self.metrics_file.exists():
            return {}
        out: dict[int, float] = {}
        for line in self.metrics_file.read_text().splitlines():
            rec = json.loads(line)
            out[int(rec["step"])] = float(rec["learning/loss"])
        return out

    def events(self, path: Path) -> list[dict[str, Any]]:
        """The JSON lines of an events file (:mod:`simjob.maxtext.cpu_elastic`), for this process only."""
        if not path.exists():
            return []
        out = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [e for e in out if e.get("pid") == self.proc.pid]

    def meshes(self) -> list[tuple[int, tuple[int, ...]]]:
        """MaxText's own log of each mesh it built: ``Num_devices: N, shape (...)``."""
        return [
            (int(m[1]), tuple(int(x) for x in m[2].split(",") if x.strip())) for m in _MESH_LINE.finditer(self.text())
        ]

    def hook_lines(self, kind: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for line in self.text().splitlines():
            m = _HOOK_LINE.match(line.strip())
            if m and (kind is None or m[1] == kind):
                out.append((m[1], json.loads(m[2])))
        return out


# ---------------------------------------------------------------------------
# the sidecar: a real coordinator on its own event-loop thread
# ---------------------------------------------------------------------------


@dataclass
class Applied:
    at: float
    event: Any
    """The :data:`agent.core.model.Event` applied (typed loosely: tests read its fields)."""
    decision: Decision


@dataclass
class Sidecar:
    """A :class:`Coordinator` (policy ``num_slices``) listening on 127.0.0.1:0, in this process."""

    num_slices: int = 1
    log: list[Applied] = field(default_factory=list)
    hosts_per_slice: int = 1
    trainer_processes: int = 1
    """Above 1: a multi-controller job, one MaxText process per host (``--trainer-processes``)."""

    def __post_init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sidecar-loop", daemon=True)
        self._thread.start()
        cfg = CoordinatorConfig(
            job=JOB,
            listen="127.0.0.1:0",
            policy=Policy(
                num_slices=self.num_slices,
                hosts_per_slice=self.hosts_per_slice,
                trainer_processes=self.trainer_processes,
            ),
            heartbeat_interval=0.25,
            heartbeat_timeout=1.2,
            state_file=None,
            journal=None,
            log_format="json",
            log_level="warning",
        )

        async def start() -> Coordinator:
            coord = Coordinator(cfg)
            inner = coord.apply

            def apply(ev: Event, now: float) -> Decision:
                d = inner(ev, now)
                self.log.append(Applied(time.monotonic(), ev, d))
                return d

            coord.apply = apply  # type: ignore[method-assign]
            await coord.start()
            return coord

        self.coord: Coordinator = self._call(start(), 30)
        # The trainer link has its own listener (--trainer-listen); older coordinators served it on --listen.
        self.address = f"127.0.0.1:{getattr(self.coord, 'trainer_port', 0) or self.coord.port}"

    def _call(self, coro: Any, timeout: float) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def submit(self, ev: Event) -> None:
        self.loop.call_soon_threadsafe(self.coord.submit, ev)

    def request(self, ev: Event, timeout: float = 10.0) -> Decision:
        """``await coord.request(ev)`` on the coordinator's loop."""
        return self._call(self.coord.request(ev), timeout)

    @property
    def state(self) -> State:
        return self.coord.state

    def applied(self, kind: type, since: float = 0.0, pred: Callable[[Any], bool] = lambda e: True) -> list[Applied]:
        return [a for a in list(self.log) if isinstance(a.event, kind) and a.at >= since and pred(a.event)]

    def reasons(self, n: int = 25) -> list[str]:
        return [a.decision.reason for a in list(self.log) if type(a.event).__name__ not in ("Tick", "TrainerStepped")][
            -n:
        ]

    def wait_for(self, cond: Callable[[], Any], what: str, run: MaxTextRun | None = None, timeout: float = WAIT) -> Any:
        """Poll ``cond`` until true; fail early if ``run`` exits, with its log and the decisions."""
        deadline = time.monotonic() + timeout
        while True:
            v = cond()
            if v:
                return v
            ended = run is not None and run.poll() is not None
            if ended or time.monotonic() > deadline:
                why = f"{run.name} exited with {run.poll()}" if ended and run else f"timed out after {timeout} s"
                raise AssertionError(
                    f"{why} waiting for {what}; decisions:\n  "
                    + "\n  ".join(self.reasons())
                    + ("\n" + run.tail() if run else "")
                )
            time.sleep(0.005)

    def stop(self) -> None:
        try:
            self._call(self.coord.stop(grace=0.1), 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
