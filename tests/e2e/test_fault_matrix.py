"""The fault matrix: the sidecar's own failures must never make the job's failure worse.

Every scenario runs the simulated job with real processes (coordinator,
worker sidecars, stand-in Pathways workers, the example trainer) through
:class:`simjob.harness.Demo`, puts one failure of the sidecar machinery in,
and asserts the four promises of issue 9:

* no hang: from the fault to the end of the run there is never a stretch
  longer than ``elastic_timeout_seconds`` (plus the start-up allowance of a
  process the scenario restarts) without a completed step or the run ending;
* no committed checkpoint lost or replaced by an older one: the newest
  committed step in the checkpoint directory, sampled every 50 ms, never goes
  down, and is still there at the end;
* at most 1 lost step (completed steps that had to be recomputed);
  a SIGKILLed trainer loses its memory, so there the bound is the
  checkpoint period;
* either training goes on to the final step (trainer and coordinator exit 0),
  or every process still running exits 42 with its reason.

Each scenario also records what it measured (detection, recovery, lost
steps, retries spent) to a JSON file: ``$ES_RELIABILITY_JSON`` if set (under
pytest-xdist one per worker, named with its id), else ``reliability.json`` in
pytest's base temp directory; ``python -m simjob.reliability_report`` renders
docs/reliability.md from it (or them).

Every scenario runs on the trainer's NumPy backend (the integration tier: what
is tested here is the sidecar machinery, not JAX); those whose outcome rests on
the real trainer (its checkpoint restore after a kill, the surviving slices'
replicas of a sharded state, an Orbax flush before a self-abort) run on the
JAX trainer with Orbax as well (``[jax]``, the e2e tier).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from simjob.demo_common import PY, flags
from simjob.harness import DEMO_JOB, Demo, free_port
from simjob.options import RESTART_DELAY, add_demo_args, parse_fault

JAX_TOO = pytest.mark.parametrize(
    "backend", [pytest.param("numpy", id="numpy"), pytest.param("jax", id="jax", marks=pytest.mark.e2e)]
)
"""A scenario whose outcome rests on the real trainer: on the NumPy backend and on the JAX trainer."""


@pytest.fixture
def backend() -> str:
    """The trainer backend of a scenario not parametrized over it (``JAX_TOO``)."""
    return "numpy"


TIMEOUT = 10.0
"""elastic_timeout_seconds of every scenario but the ones that wait for it to pass."""
STARTUP = 8.0
"""Allowance for a process the scenario starts again (the JAX trainer imports JAX and compiles: ~6 s here;
a coordinator starts in 1-2 s, then gives known hosts their rejoin grace)."""
SETTLE = 4.0
"""Allowance for the normal machinery around a fault (a flush, a mesh rebuild, the replacement delay's rounding)."""
STEPS = 30
CHECKPOINT_PERIOD = 10


# ---------------------------------------------------------------------------
# recording outcomes
# ---------------------------------------------------------------------------

_OUTCOMES: list[dict[str, Any]] = []


def _json_path(base: Path) -> Path:
    env = os.environ.get("ES_RELIABILITY_JSON")
    if not env:
        return base / "reliability.json"  # the base temp directory is each pytest-xdist worker's own
    path = Path(env)
    # pytest-xdist workers would overwrite one another's outcomes: each writes its own file beside the one named.
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return path.with_name(f"{path.stem}.{worker}{path.suffix}") if worker else path


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, Any]]]:
    yield _OUTCOMES
    path = _json_path(tmp_path_factory.getbasetemp())
    path.parent.mkdir(parents=True, exist_ok=True)
    old: list[dict[str, Any]] = []
    if path.exists() and os.environ.get("ES_RELIABILITY_APPEND"):
        old = json.loads(path.read_text()).get("runs", [])
    settings = {"checkpoint_period": CHECKPOINT_PERIOD, "timeout": TIMEOUT, "settle": SETTLE, "startup": STARTUP}
    doc = {"commit": _commit(), "settings": settings, "runs": old + _OUTCOMES}
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(f"\nfault matrix: {len(_OUTCOMES)} outcomes written to {path}")


def _commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+uncommitted" if dirty else "")


# ---------------------------------------------------------------------------
# one scenario
# ---------------------------------------------------------------------------


class CheckpointWatch(threading.Thread):
    """Samples the committed steps of the checkpoint directory (step directories with a plain number name:
    Orbax's, and the NumPy backend's, both renamed into place once complete)."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.newest = -1
        self.went_down: list[tuple[int, int]] = []  # (newest before, newest after)
        self._halt = threading.Event()

    def committed(self) -> list[int]:
        try:
            return sorted(int(p.name) for p in self.root.iterdir() if p.name.isdigit())
        except FileNotFoundError:
            return []

    def sample(self) -> None:
        steps = self.committed()
        now = max(steps, default=-1)
        if now < self.newest:
            self.went_down.append((self.newest, now))
        self.newest = max(self.newest, now)

    def run(self) -> None:
        while not self._halt.wait(0.05):
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        self.join(2)
        self.sample()


@dataclass
class Scenario:
    """A running scenario: the demo, what it measured, what it expects."""

    key: str
    title: str
    tmp: Path
    args: list[str]
    backend: str = "numpy"
    expect: str = "complete"  # "complete" or "exit42"
    lost_max: int = 1
    restarts_trainer: bool = False
    restarts_coordinator: bool = False
    steps: int = STEPS
    how: str = ""
    hold_trainer: bool = False
    """Start the trainer only when the test calls ``demo.start_trainer()``."""
    planned: list[str] = field(default_factory=list)
    """Faults the demo puts in itself at their step, as given to ``elastic-sidecar demo --fault``."""
    demo: Demo | None = None
    ckpt: CheckpointWatch | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    t_fault: float | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    t_end: float | None = None

    def ns(self) -> argparse.Namespace:
        p = argparse.ArgumentParser()
        add_demo_args(p)
        return p.parse_args(
            [
                "--workdir",
                str(self.tmp / "job"),
                "--steps",
                str(self.steps),
                "--step-seconds",
                "0.1",
                "--checkpoint-period",
                str(CHECKPOINT_PERIOD),
                "--timeout",
                str(TIMEOUT),
                "--replacement-delay",
                "3",
                "--run-timeout",
                "150",
                "--min-slices",
                "2",
                "--trainer-backend",
                self.backend,
                *self.args,
            ]
        )

    @property
    def timeout(self) -> float:
        assert self.demo is not None
        return float(self.demo.ns.timeout)

    def start(self) -> Demo:
        ns = self.ns()
        workdir = Path(ns.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self.lines: list[str] = []
        self.demo = Demo(ns, workdir, [parse_fault(f) for f in self.planned], self.lines.append)
        self.ckpt = CheckpointWatch(workdir / "checkpoints")
        self.demo.start(hold_trainer=self.hold_trainer)
        self.ckpt.start()
        return self.demo

    # -- driving ------------------------------------------------------------------

    def until(self, what: str, cond: Callable[[], bool], timeout: float = 60.0) -> None:
        assert self.demo is not None
        if not self.demo.run(until=cond, timeout=timeout):
            raise AssertionError(f"{self.key}: never reached {what} within {timeout:g} s")

    def until_step(self, n: int) -> None:
        assert self.demo is not None
        demo = self.demo
        self.until(f"step {n}", lambda: demo.last_step >= n)

    def phase(self) -> str | None:
        assert self.demo is not None
        st = self.demo.status.read(timeout=0.3)
        return None if st is None else str(st.get("phase"))

    def until_phase(self, phase: str, timeout: float = 60.0) -> dict[str, Any]:
        assert self.demo is not None
        demo = self.demo
        seen: dict[str, Any] = {}

        def at() -> bool:
            st = demo.status.read(timeout=0.3)
            if st is not None and st.get("phase") == phase:
                seen.update(st)
                return True
            return False

        self.until(f"coordinator phase {phase}", at, timeout)
        return seen

    def fault(self, spec: str) -> None:
        assert self.demo is not None
        self.demo.inject(parse_fault(spec))
        self.t_fault = self.t_fault or time.time()

    def mark_fault(self) -> None:
        self.t_fault = self.t_fault or time.time()

    def kill_coordinator(self, *, restart: bool = True, keep_state: bool = True) -> str:
        """SIGKILL the coordinator (recording its phase); start it again after 1 s, with or without its state file."""
        assert self.demo is not None
        job = self.demo.job
        st = self.demo.status.read(timeout=0.3)
        phase = None if st is None else st.get("phase")
        self.notes.setdefault("phase_at_kill", phase)
        self.mark_fault()
        self.restarts_coordinator = self.restarts_coordinator or restart

        def drop_state() -> None:
            job.state_path.unlink(missing_ok=True)

        self.demo.kill_coordinator(
            restart_after=RESTART_DELAY if restart else None,
            before_restart=None if keep_state else drop_state,
            even_if_exited=True,
            record=True,
        )
        return str(phase)

    def finish(self, timeout: float | None = None) -> dict[str, Any]:
        """Run to the end (a run still going well past every allowance counts as hung); stop everything."""
        assert self.demo is not None and self.ckpt is not None
        demo = self.demo
        if timeout is None:
            timeout = self.timeout + SETTLE + STARTUP + 20.0
        try:
            ended = demo.run(timeout=timeout)
            self.notes["run_ended"] = ended
            if ended and demo.job.coordinator is not None and not demo.coordinator_down:
                # The trainer is gone; a live coordinator must follow within the timeout (a decision it
                # cannot make durable waits --durability-bound first).
                with contextlib.suppress(subprocess.TimeoutExpired):
                    demo.job.coordinator.wait(self.timeout + SETTLE)
            self.t_end = time.time()
        finally:
            self.summary = demo.finish()
            self.ckpt.stop()
        if self.t_fault is None and demo.records:
            self.t_fault = demo.records[0].time  # a planned fault: when the demo put it in
        return self.summary

    # -- the promises -------------------------------------------------------------------

    def events(self) -> list[dict[str, Any]]:
        assert self.demo is not None
        path = self.demo.workdir / "trainer-events.jsonl"
        out = []
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out

    def journal(self) -> list[dict[str, Any]]:
        assert self.demo is not None
        out = []
        for p in (
            self.demo.job.journal_path.with_name(self.demo.job.journal_path.name + ".1"),
            self.demo.job.journal_path,
        ):
            if p.exists():
                for line in p.read_text().splitlines():
                    with contextlib.suppress(json.JSONDecodeError):
                        out.append(json.loads(line))
        return out

    def longest_stall(self) -> float:
        """The longest stretch after the fault with no completed step (the run's end closes the last one)."""
        assert self.t_fault is not None and self.t_end is not None
        times = sorted(e["t"] for e in self.events() if e["kind"] in ("step", "abort", "finished"))
        last = self.t_fault
        worst = 0.0
        for t in [t for t in times if t > self.t_fault] + [self.t_end]:
            worst = max(worst, t - last)
            last = t
        return worst

    def check(self) -> None:
        s = self.summary
        assert self.ckpt is not None and self.demo is not None
        assert self.notes.get("run_ended"), f"the run did not end on its own (hung?); exits {s.get('process_exits')}"
        restarted = self.restarts_trainer or self.restarts_coordinator
        allowance = self.timeout + SETTLE + (STARTUP if restarted else 0.0)
        stall = self.longest_stall()
        self.notes["longest_stall_seconds"] = round(stall, 3)
        assert stall <= allowance, f"no progress for {stall:.1f} s after the fault (allowed {allowance:g} s)"
        assert not self.ckpt.went_down, f"newest committed checkpoint went down: {self.ckpt.went_down}"
        final = max(self.ckpt.committed(), default=-1)
        assert final >= self.ckpt.newest, f"committed step {self.ckpt.newest} is gone (newest now {final})"
        assert s["lost_steps"] <= self.lost_max, (
            f"lost {s['lost_steps']} steps (at most {self.lost_max}): {s['rewinds']}"
        )
        codes = s["exit_codes"]
        if self.expect == "complete":
            assert s["final_step"] == self.steps and codes.get("trainer") == 0, (
                f"training did not complete: final step {s['final_step']}, exits {s['process_exits']}"
            )
            assert codes.get("coordinator") == 0, f"coordinator exited {codes.get('coordinator')}, not 0"
        else:
            assert codes.get("trainer") == 42, f"trainer exited {codes.get('trainer')}, not 42"
            abort = [e for e in self.events() if e["kind"] == "abort"]
            assert abort and abort[-1].get("reason"), "the trainer exited 42 without saying why"
            self.notes["trainer_reason"] = abort[-1]["reason"]
            if not self.demo.coordinator_down:
                assert codes.get("coordinator") == 42, f"coordinator exited {codes.get('coordinator')}, not 42"
                last = self.journal()[-1]["reason"] if self.journal() else ""
                assert last, "the coordinator exited 42 without a reason in its journal"
                self.notes["coordinator_reason"] = last

    def no_shrink(self) -> None:
        small = [e for e in self.events() if e["kind"] in ("step", "resumed") and len(e["slices"]) < 4]
        assert not small, f"the job shrank: {small[0]}"

    def retries(self, expected: int, *, state_kept: bool = True) -> None:
        """The failures injected cost exactly ``expected`` retries; the sidecar's own faults cost none.

        Without its state file a restarted coordinator cannot know the retries spent before it
        (no participant reports them): it may count fewer, never more.
        """
        s = self.summary
        spent = s["failure_recoveries"]
        assert s["failure_recoveries_journal"] == expected, (
            f"{s['failure_recoveries_journal']} failure recoveries in the journal, expected {expected}"
        )
        if state_kept:
            assert spent == expected, f"retries_used {spent}, expected {expected}"
        else:
            assert spent is not None and spent <= expected, f"retries_used {spent}, expected at most {expected}"

    def outcome(self, failure: str | None) -> dict[str, Any]:
        s = self.summary
        f0 = s.get("faults", [{}])[0] if s.get("faults") else {}
        codes = s.get("exit_codes", {})
        if codes.get("trainer") == 0 and s.get("final_step") == self.steps:
            result = "training completed"
        elif codes.get("trainer") == 42:
            result = "exit 42"
        else:
            result = f"trainer exit {codes.get('trainer')}"
        end = None
        if self.t_fault is not None and self.t_end is not None and result != "training completed":
            end = round(self.t_end - self.t_fault, 3)
        return {
            "key": self.key,
            "backend": self.backend,
            "title": self.title,
            "how": self.how,
            "passed": failure is None,
            "failure": failure,
            "result": result,
            "expected": "training completes" if self.expect == "complete" else "every process exits 42",
            "detection_seconds": f0.get("detection_seconds"),
            "detection_source": f0.get("detection_source"),
            "recovery_seconds": f0.get("recovery_seconds") if result == "training completed" else end,
            "lost_steps": s.get("lost_steps"),
            "retries_spent": s.get("failure_recoveries"),
            "retries_in_journal": s.get("failure_recoveries_journal"),
            "final_step": s.get("final_step"),
            "exit_codes": codes,
            "process_exits": s.get("process_exits"),
            "wall_seconds": s.get("wall_seconds"),
            **self.notes,
        }


def _said(line: str) -> str:
    """A coordinator log line as severity and message (JSON lines also carry file paths)."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        return line[:300]
    return f"{rec.get('severity', '')}: {rec.get('message', '')}"[:300]


@contextlib.contextmanager
def scenario(
    outcomes: list[dict[str, Any]], tmp: Path, backend: str, key: str, title: str, *args: str, **kw: Any
) -> Iterator[Scenario]:
    sc = Scenario(key, title, tmp, list(args), backend=backend, **kw)
    failure: str | None = None
    try:
        sc.start()
        yield sc
    except BaseException as e:
        failure = f"{type(e).__name__}: {e}".strip()[:600]
        raise
    finally:
        if sc.demo is not None and not sc.summary:
            with contextlib.suppress(Exception):
                sc.summary = sc.demo.finish()
            if sc.ckpt is not None:
                sc.ckpt.stop()
        outcomes.append(sc.outcome(failure))
        if failure is not None and sc.demo is not None:
            print(f"{key}: logs in {sc.demo.workdir / 'logs'}")


# ---------------------------------------------------------------------------
# coordinator SIGKILL in each phase, with and without its state file
# ---------------------------------------------------------------------------

# Every phase with its state file; without it, the default run keeps the running phase (a blind
# coordinator adopting a training trainer), the rest run with --runslow.
STATE = pytest.mark.parametrize(
    "keep_state",
    [pytest.param(True, id="with-state"), pytest.param(False, id="without-state", marks=pytest.mark.slow)],
)
STATE_ALWAYS = pytest.mark.parametrize(
    "keep_state", [pytest.param(True, id="with-state"), pytest.param(False, id="without-state")]
)


@STATE
def test_coordinator_kill_while_starting(
    outcomes: list[dict[str, Any]], tmp_path: Path, backend: str, keep_state: bool
) -> None:
    with scenario(
        outcomes,
        tmp_path,
        backend,
        f"coordinator-kill-starting-{'state' if keep_state else 'nostate'}",
        f"coordinator SIGKILL while starting, {'with' if keep_state else 'without'} its state file",
        how="kill before the trainer attaches (the trainer starts just after), restart 1 s later",
        hold_trainer=True,
    ) as sc:
        # Held: on two busy cores a NumPy trainer attached before the first status poll (CI, stop 58).
        sc.until_phase("starting")
        assert sc.kill_coordinator(keep_state=keep_state) == "starting"
        assert sc.demo is not None
        sc.demo.start_trainer()
        sc.finish()
        sc.check()
        sc.no_shrink()
        sc.retries(0)


@STATE_ALWAYS
def test_coordinator_kill_while_running(
    outcomes: list[dict[str, Any]], tmp_path: Path, backend: str, keep_state: bool
) -> None:
    with scenario(
        outcomes,
        tmp_path,
        backend,
        f"coordinator-kill-running-{'state' if keep_state else 'nostate'}",
        f"coordinator SIGKILL while running, {'with' if keep_state else 'without'} its state file",
        how="kill at step 8, restart 1 s later",
    ) as sc:
        sc.until_step(8)
        assert sc.kill_coordinator(keep_state=keep_state) == "running"
        sc.finish()
        sc.check()
        sc.no_shrink()
        sc.retries(0)


@pytest.mark.parametrize(
    ("flush", "keep_state", "backend"),
    [
        pytest.param(True, True, "numpy", id="flush-with-state"),
        pytest.param(True, False, "numpy", id="flush-without-state", marks=pytest.mark.slow),
        pytest.param(False, True, "numpy", id="no-flush-with-state"),
        pytest.param(False, False, "numpy", id="no-flush-without-state", marks=pytest.mark.slow),
        # The survivors' replicas of the sharded state (pathwaysutils' split and concatenate) on the real trainer.
        pytest.param(False, True, "jax", id="no-flush-with-state-jax", marks=pytest.mark.e2e),
    ],
)
def test_coordinator_kill_while_holding(
    outcomes: list[dict[str, Any]], tmp_path: Path, backend: str, keep_state: bool, flush: bool
) -> None:
    """A host dies; the coordinator is killed while its hold waits for the trainer's step boundary."""
    # min -1: the hold waits for the replacement and flushes; min 2: the survivors go on from memory.
    with scenario(
        outcomes,
        tmp_path,
        backend,
        f"coordinator-kill-holding-{'flush' if flush else 'noflush'}-{'state' if keep_state else 'nostate'}",
        f"coordinator SIGKILL while holding {'with' if flush else 'without'} flush, "
        f"{'with' if keep_state else 'without'} its state file",
        "--min-slices",
        "-1" if flush else "2",
        "--step-seconds",
        "0.5",
        steps=14,
        how="steps of 0.5 s; the trainer SIGSTOPped at step 6, then host 1.0 SIGKILLed, so the hold waits for "
        "the step boundary; the coordinator is killed once /status says holding, then the trainer continues",
    ) as sc:
        sc.until_step(6)
        assert sc.demo is not None and sc.demo.job.trainer is not None
        trainer = sc.demo.job.trainer
        # Stopped, the trainer cannot reach its step boundary: /status says holding for as long as the test
        # needs, however busy the machine (a running trainer acknowledged within a step, 0.5 s, a window
        # that polls of /status could miss).
        trainer.send_signal(signal.SIGSTOP)
        try:
            sc.fault("kill:1.0@6")
            st = sc.until_phase("holding", timeout=30.0)
            sc.notes["hold_flush"] = st.get("hold_flush")
            sc.kill_coordinator(keep_state=keep_state)
        finally:
            trainer.send_signal(signal.SIGCONT)
        sc.finish()
        sc.check()
        sc.retries(1, state_kept=keep_state)


@pytest.mark.parametrize(
    ("keep_state", "replaced"),
    [
        pytest.param(True, True, id="with-state"),
        pytest.param(False, True, id="without-state", marks=pytest.mark.slow),
        pytest.param(True, False, id="with-state-never-replaced", marks=pytest.mark.slow),
        pytest.param(False, False, id="without-state-never-replaced"),
    ],
)
def test_coordinator_kill_while_waiting(
    outcomes: list[dict[str, Any]], tmp_path: Path, backend: str, keep_state: bool, replaced: bool
) -> None:
    """Replaced: the slice comes back 5 s after the loss and training goes on. Never replaced: the
    restarted coordinator must still end the wait at the timeout (4 s) with exit 42."""
    state = "state" if keep_state else "nostate"
    with scenario(
        outcomes,
        tmp_path,
        backend,
        f"coordinator-kill-waiting-{state}" + ("" if replaced else "-never-replaced"),
        f"coordinator SIGKILL while waiting for slices, {'with' if keep_state else 'without'} its state file"
        + ("" if replaced else ", the slice never comes back"),
        "--min-slices",
        "-1",
        *(["--replacement-delay", "5"] if replaced else ["--no-replacement", "--timeout", "4"]),
        expect="complete" if replaced else "exit42",
        how="min slices -1, host 1.0 SIGKILLed at step 8 "
        + ("(replacement after 5 s)" if replaced else "(no replacement, timeout 4 s)")
        + "; kill once /status says waiting",
    ) as sc:
        sc.until_step(8)
        sc.fault("kill:1.0@8")
        sc.until_phase("waiting", timeout=10.0)
        sc.kill_coordinator(keep_state=keep_state)
        sc.finish()
        sc.check()
        sc.retries(1, state_kept=keep_state)


@STATE
def test_coordinator_kill_when_failed(
    outcomes: list[dict[str, Any]], tmp_path: Path, backend: str, keep_state: bool
) -> None:
    with scenario(
        outcomes,
        tmp_path,
        backend,
        f"coordinator-kill-failed-{'state' if keep_state else 'nostate'}",
        f"coordinator SIGKILL after the job failed, {'with' if keep_state else 'without'} its state file",
        "--min-slices",
        "-1",
        "--no-replacement",
        "--timeout",
        "4",
        expect="exit42",
        how="min slices -1, no replacement, timeout 4 s: host 1.0 SIGKILLed at step 8; "
        "the coordinator is killed (or found exited) in FAILED and started again 1 s later",
    ) as sc:
        sc.until_step(8)
        sc.fault("kill:1.0@8")
        sc.until(
            "phase failed or the coordinator's exit",
            lambda: sc.phase() == "failed" or sc.demo.job.coordinator.poll() is not None,  # type: ignore[union-attr]
            timeout=20.0,
        )
        sc.kill_coordinator(keep_state=keep_state)
        sc.finish()
        # The restarted coordinator must not start the failed job again: it exits 42 too.
        sc.check()


# ---------------------------------------------------------------------------
# the coordinator's own machinery
# ---------------------------------------------------------------------------


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.fail(
            f"the ENOSPC scenario needs a small tmpfs for the state directory and `mount -t tmpfs` failed "
            f"(exit {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}); run the suite as root "
            "or with CAP_SYS_ADMIN"
        )
    st = os.statvfs(where)
    if not os.path.ismount(where) or st.f_blocks * st.f_frsize > 4 << 20:
        subprocess.run(["umount", "-l", str(where)], check=False)
        pytest.fail(f"`mount -t tmpfs -o size={size}` succeeded but {where} is not a small file system of its own")


def _fill(where: Path) -> Path:
    """Fill the (small, see _mount_tmpfs) file system at ``where`` to the last byte; never more than 8 MiB."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    written = 0
    try:
        for size in (65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while written < 8 << 20 and (n := os.write(fd, b"\0" * size)):
                    written += n
    finally:
        os.close(fd)
    return filler


def test_state_writes_fail_then_recover(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    state_dir = tmp_path / "state-tmpfs"
    _mount_tmpfs(state_dir, "1m")
    try:
        with scenario(
            outcomes,
            tmp_path,
            backend,
            "state-writes-enospc",
            "state-file writes fail (ENOSPC) for 3 s, then recover",
            "--state-dir",
            str(state_dir),
            how="state dir on a 1 MiB tmpfs filled up at step 8, host 1.0 SIGKILLed 0.2 s later; "
            "the filler is deleted 3 s after that",
        ) as sc:
            sc.until_step(8)
            sc.mark_fault()
            filler = _fill(state_dir)
            time.sleep(0.2)
            sc.fault("kill:1.0@8")
            t_full = time.time()
            sc.until("3 s of ENOSPC", lambda: time.time() - t_full >= 3.0, timeout=10)
            filler.unlink()
            sc.finish()
            sc.check()
            log = (sc.demo.workdir / "logs" / "coordinator.log").read_text()  # type: ignore[union-attr]
            said = [ln for ln in log.splitlines() if "No space left" in ln or "ENOSPC" in ln or "durab" in ln.lower()]
            sc.notes["coordinator_said"] = _said(said[0]) if said else None
            assert said, "the coordinator never said its state writes failed"
            state = json.loads(sc.demo.job.state_path.read_text())  # type: ignore[union-attr]
            gens = [j["generation"] for j in sc.journal()]
            assert state["generation"] == max(gens), (
                f"state file at generation {state['generation']}, journal {max(gens)}"
            )
    finally:
        subprocess.run(["umount", "-l", str(state_dir)], check=False)


def test_coordinator_stall(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    with scenario(
        outcomes,
        tmp_path,
        backend,
        "coordinator-stall-3s",
        "coordinator stalled 3 s (SIGSTOP, SIGCONT)",
        how="coordinator-stall:3@8",
    ) as sc:
        sc.until_step(8)
        sc.fault("coordinator-stall:3@8")
        sc.finish()
        sc.check()
        sc.no_shrink()
        sc.retries(0)


def test_two_coordinators_on_one_state_dir(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    with scenario(
        outcomes,
        tmp_path,
        backend,
        "two-coordinators-same-state-dir",
        "a second coordinator starts on the same state directory",
        how="at step 8 a second coordinator (own ports) starts on the same state dir; once it says it waits on the lock "
        "the run goes on",
    ) as sc:
        sc.until_step(8)
        sc.mark_fault()
        job = sc.demo.job  # type: ignore[union-attr]
        epoch_before = json.loads(job.state_path.read_text()).get("epoch")
        second = job.spawn_coordinator(
            name="coordinator-2",
            listen=f"127.0.0.1:{free_port()}",
            trainer_listen=f"127.0.0.1:{free_port()}",
            admin_listen=f"127.0.0.1:{free_port()}",
            http_listen=f"127.0.0.1:{free_port()}",
        )
        log2_path = job.logs / "coordinator-2.log"
        # Until the second says it waits on the lock (it may take seconds to start on loaded cores).
        sc.until(
            "the second coordinator waiting on the lock",
            lambda: log2_path.exists() and "lock" in log2_path.read_text().lower(),
            timeout=30,
        )
        sc.notes["second_exit_while_first_ran"] = second.poll()
        epoch_during = json.loads(job.state_path.read_text()).get("epoch")
        sc.finish()
        sc.check()
        sc.no_shrink()
        sc.retries(0)
        log2 = log2_path.read_text()
        waiting = [ln for ln in log2.splitlines() if "lock" in ln.lower()]
        sc.notes["second_said"] = _said(waiting[0]) if waiting else None
        assert "lock" in log2.lower(), f"the second coordinator did not wait on the lock: {log2[-500:]}"
        # While the first held the lock the second wrote nothing: the state file kept the first's epoch.
        assert epoch_during == epoch_before, f"state file epoch went {epoch_before} -> {epoch_during}"


def test_two_coordinators_older_is_fenced(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    """A replacement coordinator on another state dir takes the workers and the trainer; the old one is fenced."""
    with scenario(
        outcomes,
        tmp_path,
        backend,
        "two-coordinators-other-state-dir",
        "a second coordinator on another state directory takes over; the older is fenced",
        "--via-proxy",
        steps=120,
        how="links pass a forwarder; at step 8 coordinator B (new state dir) starts and the forwarder moves every "
        "link to it; once B has the trainer and every host the links go back to A (a flap), which must refuse them "
        "as older",
    ) as sc:
        sc.until_step(8)
        sc.mark_fault()
        job = sc.demo.job  # type: ignore[union-attr]
        b_peer, b_trainer = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        b_http = f"127.0.0.1:{free_port()}"
        b_dir = tmp_path / "state-b"
        b_dir.mkdir()
        b = job.spawn_coordinator(
            name="coordinator-b",
            listen=b_peer,
            trainer_listen=b_trainer,
            admin_listen=f"127.0.0.1:{free_port()}",
            http_listen=b_http,
            state_dir=b_dir,
        )
        b_log, a_log_path = job.logs / "coordinator-b.log", job.logs / "coordinator.log"

        def said(path: Path, *texts: str) -> list[str]:
            text = path.read_text() if path.exists() else ""
            return [ln for ln in text.splitlines() if any(t.lower() in ln.lower() for t in texts)]

        # Each step waits for what it needs, not a fixed time: on two loaded cores B once took 5 s to
        # listen, and the links flapped back to A before they had ever reached B.
        sc.until("coordinator B listening", lambda: bool(said(b_log, "coordinator listening")), timeout=30)
        assert job.peer_proxy is not None and job.trainer_proxy is not None
        a_peer, a_trainer = job.peer_proxy.target, job.trainer_proxy.target
        job.peer_proxy.retarget(b_peer)
        job.trainer_proxy.retarget(b_trainer)
        sc.until(
            "the trainer and every host on coordinator B",
            lambda: bool(said(b_log, "trainer attached")) and len(said(b_log, ") registered")) >= 4,
            timeout=30,
        )
        job.peer_proxy.retarget(a_peer)
        job.trainer_proxy.retarget(a_trainer)
        sc.until(
            "coordinator A refusing the newer links",
            lambda: bool(said(a_log_path, "fenc", "FAILED_PRECONDITION")),
            timeout=30,
        )
        fenced = said(a_log_path, "fenc", "FAILED_PRECONDITION")
        sc.notes["older_said"] = _said(fenced[0]) if fenced else None
        job.peer_proxy.retarget(b_peer)
        job.trainer_proxy.retarget(b_trainer)
        sc.finish()
        sc.notes["b_exit"] = b.returncode
        assert fenced, "coordinator A never said it was fenced when the newer participants came back to it"
        stale = [e for e in sc.events() if e["kind"] in ("stale_command", "fenced")]
        sc.notes["trainer_refused"] = len(stale)
        # Training went on to the end (steered by B); A's exit is not the job's.
        s = sc.summary
        assert s["final_step"] == sc.steps and s["exit_codes"]["trainer"] == 0, s["process_exits"]
        assert s["lost_steps"] <= 1, s["rewinds"]
        assert not sc.ckpt.went_down  # type: ignore[union-attr]


# ---------------------------------------------------------------------------
# the trainer and the worker sidecars
# ---------------------------------------------------------------------------


@JAX_TOO
def test_trainer_kill(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    with scenario(
        outcomes,
        tmp_path,
        backend,
        "trainer-kill",
        "trainer SIGKILL (started again, as the JobSet would)",
        lost_max=CHECKPOINT_PERIOD,
        restarts_trainer=True,
        how="trainer-kill@15; the demo starts it again 1 s later with the same arguments",
    ) as sc:
        sc.until_step(15)
        sc.fault("trainer-kill@15")
        sc.finish()
        sc.check()
        again = [e for e in sc.events() if e["kind"] == "resumed"][-1]
        sc.notes["restored_from"] = again["restored_from"]


@JAX_TOO
def test_sidecar_gone_while_trainer_holds(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    with scenario(
        outcomes,
        tmp_path,
        backend,
        "sidecar-gone-while-held",
        "coordinator gone for good while the trainer holds",
        "--min-slices",
        "-1",
        "--no-replacement",
        "--timeout",
        "6",
        expect="exit42",
        how="min slices -1, no replacement, timeout 6 s: host 1.0 SIGKILLed at step 8, the trainer holds; "
        "the coordinator is SIGKILLed once /status says waiting and not restarted",
    ) as sc:
        sc.until_step(8)
        sc.fault("kill:1.0@8")
        sc.until_phase("waiting", timeout=10.0)
        t_kill = time.time()
        sc.kill_coordinator(restart=False)
        sc.finish()
        codes = sc.summary["process_exits"]["trainer"]
        exit_t = max((e["t"] for e in sc.events() if e["kind"] == "abort"), default=None)
        sc.notes["trainer_exit_after_kill_seconds"] = None if exit_t is None else round(exit_t - t_kill, 3)
        sc.check()
        assert exit_t is not None and exit_t - t_kill <= 6 + SETTLE, (exit_t, t_kill, codes)
        assert sc.ckpt.newest >= 8, f"the hold did not flush: newest committed step {sc.ckpt.newest}"  # type: ignore[union-attr]


def test_worker_sidecar_restart_on_healthy_host(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    with scenario(
        outcomes,
        tmp_path,
        backend,
        "sidecar-restart-healthy-host",
        "worker sidecar restart on a healthy host",
        how="sidecar-restart:1.0@8 (SIGKILL the sidecar alone, a new one 1 s later; Pathways stays up)",
    ) as sc:
        sc.until_step(8)
        sc.fault("sidecar-restart:1.0@8")
        sc.finish()
        sc.check()
        sc.no_shrink()
        sc.retries(0)


def test_stream_blip(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    with scenario(
        outcomes,
        tmp_path,
        backend,
        "stream-blip",
        "every worker stream cut once (same processes reconnect)",
        "--via-proxy",
        how="at step 8 the forwarder resets every worker sidecar's connection to the coordinator",
    ) as sc:
        sc.until_step(8)
        sc.mark_fault()
        assert sc.demo is not None and sc.demo.job.peer_proxy is not None
        sc.notes["streams_cut"] = sc.demo.job.peer_proxy.cut()
        sc.finish()
        sc.check()
        sc.no_shrink()
        sc.retries(0)


# ---------------------------------------------------------------------------
# pauses, lying peers, clocks (issue 24): none of these kills a host, so none may cost a retry
# ---------------------------------------------------------------------------


# 12 s is past every link's timeout (the workers' peer keepalive, 5 + 2 s, the longest) and past the
# decision watch's DECISIONS_WEDGED_SECONDS (agent/loop_watch.py, 10 s); 30 s takes the same paths, under --runslow.
@pytest.mark.parametrize("seconds", [12, pytest.param(30, marks=pytest.mark.slow)])
def test_coordinator_paused(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str, seconds: int) -> None:
    """Long enough that the worker sidecars' and the trainer's links time out and reconnect: the old
    streams' ends and their hosts' checks are decided after the new registrations, and must not touch them."""
    steps = 80 + 10 * seconds
    with scenario(
        outcomes,
        tmp_path,
        backend,
        f"coordinator-paused-{seconds}s",
        f"coordinator paused {seconds} s (SIGSTOP, SIGCONT)",
        "--timeout",
        str(seconds + TIMEOUT),
        steps=steps,
        how=f"coordinator-stall:{seconds}@20, {steps} steps, elastic_timeout_seconds {seconds + TIMEOUT:g}",
    ) as sc:
        sc.until_step(20)
        sc.fault(f"coordinator-stall:{seconds}@20")
        sc.finish(timeout=seconds + 120.0)
        sc.check()
        sc.no_shrink()
        sc.retries(0)


def test_sidecar_paused(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    with scenario(
        outcomes,
        tmp_path,
        backend,
        "sidecar-paused-3s",
        "one worker sidecar paused 3 s, its Pathways worker healthy",
        steps=120,
        how="sidecar-stall:1.0:3@20 (SIGSTOP of the sidecar alone, past the 1.2 s heartbeat timeout)",
    ) as sc:
        sc.until_step(20)
        sc.fault("sidecar-stall:1.0:3@20")
        sc.finish()
        sc.check()
        sc.no_shrink()
        sc.retries(0)
        said = [_said(ln) for ln in (sc.demo.job.logs / "coordinator.log").read_text().splitlines() if "1.0" in ln]  # type: ignore[union-attr]
        away = [ln for ln in said if "still answers" in ln]
        sc.notes["coordinator_said"] = away[0] if away else None
        assert away, "the coordinator never found host 1.0's Pathways worker up while its sidecar was paused"


def test_forged_epoch(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    """One Join with the peer token and epoch_seen=2**62 but no valid proof: logged and ignored."""
    import grpc

    from protos.elastic_sidecar.v1 import peer_pb2, peer_pb2_grpc

    with scenario(
        outcomes,
        tmp_path,
        backend,
        "forged-epoch",
        "a Join claims epoch 2**62 with the peer token but no valid proof",
        steps=80,
        how="at step 15 a client with the peer token registers as host 0.0 (its incarnation from the state file) "
        "with epoch_seen=2**62 and a made-up proof",
    ) as sc:
        sc.until_step(15)
        sc.mark_fault()
        job = sc.demo.job  # type: ignore[union-attr]
        token = job.peer_token_file.read_text().strip()
        hosts = json.loads(job.state_path.read_text())["hosts"]
        inc = next(h["incarnation"] for h in hosts if (h["slice"], h["host"]) == (0, 0))
        reg = peer_pb2.Register(
            identity=peer_pb2.HostIdentity(slice=0, host=0, incarnation=inc, node="gke-demo-slice0-host0-r0"),
            job="elastic-demo",
            epoch_seen=2**62,
            epoch_seen_coordinator="forger",
            epoch_seen_proof=b"\x00" * 32,
            # The real host's Pathways worker, so that the forger's own stream ending is no loss either:
            # this row is about the epoch, not about a peer-token holder impersonating a worker.
            health_address=f"127.0.0.1:{job.pw_ports[(0, 0)]}",
            health_check="grpc",
        )
        with grpc.insecure_channel(job.coord_addr) as ch:
            replies = peer_pb2_grpc.PeerStub(ch).Join(
                iter([peer_pb2.WorkerMessage(register=reg)]), metadata=(("authorization", f"Bearer {token}"),)
            )
            first = next(replies)
            sc.notes["forger_got"] = first.WhichOneof("msg")
            replies.cancel()
        sc.finish()
        sc.check()
        sc.no_shrink()
        sc.retries(0)
        log = (job.logs / "coordinator.log").read_text()
        ignored = [_said(ln) for ln in log.splitlines() if "without a valid proof" in ln]
        sc.notes["coordinator_said"] = ignored[0] if ignored else None
        assert ignored, "the coordinator did not say it ignored the unproven epoch"
        assert "superseded by a newer coordinator" not in log, "the forged epoch fenced the coordinator"


def _shift_state_times(path: Path, seconds: float) -> None:
    """What a coordinator started after the wall clock stepped by ``-seconds`` reads: every wall-clock
    time in its state file ``seconds`` away from its clock (the file is written as the old process saw it)."""
    doc = json.loads(path.read_text())

    def move(v: Any) -> Any:
        return None if v is None else float(v) + seconds

    doc["written_at"] = move(doc.get("written_at"))
    for h in doc.get("hosts", []):
        h["registered_at"] = move(h.get("registered_at"))
    doc["slice_errors"] = {k: move(v) for k, v in (doc.get("slice_errors") or {}).items()}
    for key in ("drains", "planned"):
        for d in (doc.get(key) or {}).values():
            for f in ("since", "deadline", "starts_at"):
                d[f] = move(d.get(f))
    path.write_text(json.dumps(doc, indent=1))


# Forward under --runslow: the default run keeps the process path (back), and
# tests/agent/test_clock_steps.py restores and repairs a state file stepped either way.
@pytest.mark.parametrize("step", [-3600, pytest.param(3600, marks=pytest.mark.slow)])
def test_clock_stepped_across_a_coordinator_restart(
    outcomes: list[dict[str, Any]], tmp_path: Path, backend: str, step: int
) -> None:
    """A host is killed (one retry), the coordinator is killed before the replacement settles and
    restarts with the wall clock stepped by ``step``: the replacement repairs the slice, the job grows
    back to 4 slices and finishes with that one retry."""
    with scenario(
        outcomes,
        tmp_path,
        backend,
        f"clock-step-{'back' if step < 0 else 'forward'}-1h",
        f"the wall clock stepped {'back' if step < 0 else 'forward'} 1 h across a coordinator restart",
        steps=150,
        restarts_coordinator=True,
        how="kill:1.0@15; 1 s later the coordinator is SIGKILLed and started again with its state file's times "
        f"{abs(step)} s {'ahead of' if step < 0 else 'behind'} its clock (what a clock stepped "
        f"{'back' if step < 0 else 'forward'} 1 h reads)",
    ) as sc:
        sc.until_step(15)
        sc.fault("kill:1.0@15")
        t = time.time()
        sc.until("1 s after the kill", lambda: time.time() - t >= 1.0, timeout=10)
        job = sc.demo.job  # type: ignore[union-attr]
        sc.demo.kill_coordinator(  # type: ignore[union-attr]
            restart_after=RESTART_DELAY,
            before_restart=lambda: _shift_state_times(job.state_path, -step),
            record=False,
        )
        sc.finish(timeout=120.0)
        sc.check()
        sc.retries(1)
        last = [e for e in sc.events() if e["kind"] == "step"][-1]
        sc.notes["final_slices"] = len(last["slices"])
        assert len(last["slices"]) == 4, f"the job did not grow back onto the replaced slice: {last}"


def test_sidecar_restarted_while_the_coordinator_is_down(
    outcomes: list[dict[str, Any]], tmp_path: Path, backend: str
) -> None:
    with scenario(
        outcomes,
        tmp_path,
        backend,
        "sidecar-restart-while-coordinator-down",
        "a worker sidecar restarted (new incarnation) while the coordinator was down",
        steps=120,
        restarts_coordinator=True,
        how="at step 15 the coordinator is SIGKILLed; host 1.0's sidecar is SIGKILLed and a new one started; "
        "1 s later the coordinator starts again on its state",
    ) as sc:
        sc.until_step(15)
        job = sc.demo.job  # type: ignore[union-attr]
        sc.mark_fault()

        def restart_sidecar() -> None:
            job.kill_sidecar(1, 0)
            job.start_sidecar(1, 0)

        sc.demo.kill_coordinator(restart_after=RESTART_DELAY, before_restart=restart_sidecar, record=True)  # type: ignore[union-attr]
        sc.finish(timeout=120.0)
        sc.check()
        sc.no_shrink()
        sc.retries(0)


def test_host_partitioned(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    """Host 1.0's stream and heartbeat datagrams pass a stand-in network path of their own
    (standins.netproxy.HostLink), cut for 10 s; its Pathways worker stays up."""
    with scenario(
        outcomes,
        tmp_path,
        backend,
        "host-partitioned-10s",
        "one host's links to the coordinator cut for 10 s, its Pathways worker healthy",
        "--fault",
        "partition:1.0:10@20",  # gives host 1.0 its own link; the scenario injects the fault itself
        steps=200,
        how="partition:1.0:10@20 (its stream's bytes held and its heartbeat datagrams dropped, both ways)",
    ) as sc:
        sc.until_step(20)
        sc.fault("partition:1.0:10@20")
        sc.finish(timeout=120.0)
        sc.check()
        sc.no_shrink()
        sc.retries(0)


# ---------------------------------------------------------------------------
# one host, one voice; notices must be current; clean exits; a slice back only whole (issue 56)
# ---------------------------------------------------------------------------

BESIDE_SECONDS = float(os.environ.get("ES_BESIDE_SECONDS", "8"))
"""How long the second worker sidecar for one host runs beside the first (the issue saw the loss cycle
within 8 s; ES_BESIDE_SECONDS=60 runs its done-when's minute)."""


def test_a_second_sidecar_for_one_host(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    """Two sidecar processes claim one host (a stale pod beside its replacement, a manifest mistake): the
    newer one speaks for the host, the older one is refused and stands by; no recovery, no shrink."""
    with scenario(
        outcomes,
        tmp_path,
        backend,
        "duplicate-sidecar",
        f"a second worker sidecar for host 1.0 beside the first for {BESIDE_SECONDS:g} s",
        steps=max(130, int(BESIDE_SECONDS * 10) + 80),
        how="at step 15 a second `agent worker` for slice 1 host 0 (another pod and node, the same Pathways "
        f"worker) starts, and is killed {BESIDE_SECONDS:g} s later",
    ) as sc:
        sc.until_step(15)
        sc.mark_fault()
        job = sc.demo.job  # type: ignore[union-attr]
        cmd = [PY, "-m", "agent", "worker"] + flags(
            job=DEMO_JOB,
            coordinator=job.coord_addr,
            slice=1,
            host=0,
            node="gke-demo-slice1-host0-stale",
            node_pool="demo-pool-1",
            pod=f"{DEMO_JOB}-worker-1-0-stale",
            health_target=f"127.0.0.1:{job.pw_ports[(1, 0)]}",
            log_format="json",
            peer_token_file=job.peer_token_file,
            http_listen="none",
        )
        log = (job.logs / "host-1.0-second.log").open("wb")
        second = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=job.env)
        try:
            end = time.monotonic() + BESIDE_SECONDS
            sc.until("the second sidecar's time", lambda: time.monotonic() >= end, timeout=BESIDE_SECONDS + 30)
            assert second.poll() is None, "the second sidecar exited"
        finally:
            second.kill()
            second.wait()
            log.close()
        sc.finish()
        sc.check()
        sc.no_shrink()
        sc.retries(0)
        said = [_said(ln) for ln in (job.logs / "coordinator.log").read_text().splitlines()]
        sc.notes["coordinator_said"] = next((ln for ln in said if "two sidecars claim one host" in ln), None)
        assert sc.notes["coordinator_said"], "the coordinator never reported the two sidecars"


STALE_REASON = "ignored: the disruption was to be over"
"""What the coordinator's journal says of a notice whose window ended long ago (agent.core.decide)."""


def test_a_two_day_old_notice_for_a_live_node(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    """Put in by the demo itself, as `elastic-sidecar demo --fault stale-notice:1.0@15` does."""
    with scenario(
        outcomes,
        tmp_path,
        backend,
        "stale-notice",
        "a maintenance notice two days old for a live node",
        "--fault",
        "stale-notice:1.0@15",  # starts the Pub/Sub emulator
        planned=["stale-notice:1.0@15"],
        steps=80,
        how="stale-notice:1.0@15: a GCE upcomingMaintenance entry whose window ended two days ago, for host "
        "1.0's node, through the Pub/Sub emulator; the host stays up",
    ) as sc:
        sc.until_step(15)
        sc.until(
            "the coordinator to set the notice aside",
            lambda: any(STALE_REASON in j["reason"] for j in sc.journal()),
            timeout=30.0,
        )
        sc.finish()
        sc.check()
        sc.no_shrink()
        sc.retries(0)
        journal = sc.journal()
        stale = [j["reason"] for j in journal if STALE_REASON in j["reason"]]
        sc.notes["coordinator_said"] = stale[0] if stale else None
        assert len(stale) == 1 and "gke-demo-slice1-host0" in stale[0], stale
        assert sc.t_fault is not None
        held = [j["reason"] for j in journal if j["time"] >= sc.t_fault and _acts(j, "HoldTrainer")]
        assert not held, f"the stale notice held the trainer: {held}"


def _acts(entry: dict[str, Any], kind: str) -> bool:
    return any(a.get("type") == kind for a in entry.get("actions", []))


def test_state_dir_full_at_exit(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    state_dir = tmp_path / "state-tmpfs"
    _mount_tmpfs(state_dir, "1m")
    try:
        with scenario(
            outcomes,
            tmp_path,
            backend,
            "state-dir-full-at-exit",
            "the coordinator's state directory full when the job completes",
            "--state-dir",
            str(state_dir),
            how=f"state dir on a 1 MiB tmpfs, filled up at step 20 of {STEPS} and left full: the coordinator's "
            "last decisions and the journal's close at exit meet ENOSPC",
        ) as sc:
            sc.until_step(20)
            sc.mark_fault()
            _fill(state_dir)
            sc.finish()
            sc.check()  # the coordinator exits 0, the code the completed job earned
            sc.no_shrink()
            log = (sc.demo.workdir / "logs" / "coordinator.log").read_text()  # type: ignore[union-attr]
            said = [_said(ln) for ln in log.splitlines() if "could not be flushed at shutdown" in ln]
            sc.notes["coordinator_said"] = said[0] if said else None
            assert said, "the coordinator did not say its journal's last lines were lost at shutdown"
            assert "Traceback" not in log, log[-3000:]
    finally:
        subprocess.run(["umount", "-l", str(state_dir)], check=False)


def test_a_second_trainer_link(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    """A second trainer process for the job (a stale pod, a second launch) connects with the job's name."""
    from protos.elastic_sidecar.v1 import trainer_pb2
    from trainer_hooks.link import SidecarLink

    with scenario(
        outcomes,
        tmp_path,
        backend,
        "second-trainer-link",
        "a second trainer link for the job, for 5 s",
        steps=90,
        how="at step 15 a second trainer link (trainer_hooks' SidecarLink with the job's name) connects to "
        "the coordinator's trainer listener and keeps trying for 5 s",
    ) as sc:
        sc.until_step(15)
        sc.mark_fault()
        assert sc.t_fault is not None
        job = sc.demo.job  # type: ignore[union-attr]
        link = SidecarLink(job.trainer_addr, lambda: trainer_pb2.TrainerHello(job=DEMO_JOB, step_in_memory=-1))
        link.start()
        try:
            end = time.monotonic() + 5.0
            sc.until("5 s of the second link", lambda: time.monotonic() >= end, timeout=30.0)
            attached, said = link.connected.is_set(), link.last_error
        finally:
            link.close()
        sc.finish()
        sc.check()
        sc.no_shrink()
        sc.retries(0)
        sc.notes["second_said"] = said
        assert not attached and "ALREADY_EXISTS" in said, f"the second link: attached {attached}, said {said!r}"
        # The job's own trainer kept its link: no attach decided after the second link came.
        again = [j["reason"] for j in sc.journal() if j["time"] >= sc.t_fault and "trainer attached" in j["reason"]]
        assert not again, f"the trainer attached again after the second link came: {again}"


def test_two_host_slice_one_host_lost_and_back(outcomes: list[dict[str, Any]], tmp_path: Path, backend: str) -> None:
    """The trainer names a slice, not a host: one host of it lost and back proves nothing of the other,
    so the slice returns only with its replacement (every host new). Either may be decided first, the
    trainer's report or the host's timeout: a report of the older generation still marks a slice that is out."""
    with scenario(
        outcomes,
        tmp_path,
        backend,
        "two-host-slice-one-host-back",
        "in a slice of 2 hosts one host hangs and comes back; the slice returns only when replaced",
        "--hosts-per-slice",
        "2",
        "--replacement-delay",
        "9",
        steps=160,
        how="4 slices of 2 hosts: host 1.1 (sidecar and Pathways worker) SIGSTOPped at "
        "step 15, so the trainer names slice 1, and continued 4.5 s later; slice 1 recreated (both hosts) 9 s "
        "after the hang",
    ) as sc:
        sc.until_step(15)
        sc.fault("hang:1.1@15")
        job = sc.demo.job  # type: ignore[union-attr]
        back = time.monotonic() + 4.5
        sc.until("4.5 s of the hang", lambda: time.monotonic() >= back, timeout=30.0)
        job.hosts[(1, 1)].signal(signal.SIGCONT)
        t_back = time.time()
        sc.until("slice 1's replacement", lambda: job.hosts[(1, 0)].generation > 0, timeout=30.0)
        t_new = time.time()
        sc.finish()
        sc.check()
        journal = sc.journal()
        sc.notes["decided_first"] = next((j["reason"] for j in journal if _acts(j, "HoldTrainer")), "")[:60]
        came = [
            j["reason"]
            for j in journal
            if "host 1.1" in j["reason"] and "came back after it was declared lost" in j["reason"] and j["time"] < t_new
        ]
        sc.notes["coordinator_said"] = came[0] if came else None
        assert came, "host 1.1 was not declared lost and back before slice 1's replacement"
        steps = [e for e in sc.events() if e["kind"] == "step"]
        early = [e for e in steps if t_back <= e["t"] < t_new and 1 in e["slices"]]
        sc.notes["steps_without_slice_1_before_its_replacement"] = sum(
            1 for e in steps if t_back <= e["t"] < t_new and 1 not in e["slices"]
        )
        assert not early, f"slice 1 came back before its replacement, with only host 1.1 back: {early[0]}"
        sc.retries(1)
        assert len(steps[-1]["slices"]) == 4, f"the job did not grow back onto the replaced slice: {steps[-1]}"
