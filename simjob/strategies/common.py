"""What the baseline strategies share: the example trainer without a sidecar, and a harness.

:class:`PlainTrainer` is :class:`simjob.trainer.Trainer` (same model, mesh,
batches, step padding, periodic async Orbax saves, stand-in Pathways runtime
and ``DATA_LOSS`` injection) with no :class:`trainer_hooks.ElasticSession`: a
strategy decides what happens on a slice-down error.

:func:`run_strategy` is the demo harness (:mod:`simjob.harness`) without
sidecars: one stand-in Pathways worker per host (its own process group), the
trainer process, the stand-in provisioner and the same fault injection; a
:class:`Strategy` says what the job does on a fault and when a slice comes
back. It prints the demo's summary and writes ``--summary-json`` with the
same fields.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from simjob import trainer as sim_trainer
from simjob.cpu_devices import cpu_device_env
from simjob.demo_common import child_env
from simjob.harness import _Tail, free_port
from simjob.options import DEFAULT_FAULTS, FaultSpec, check_faults, parse_fault
from simjob.summary import FaultRecord, render, summarize
from standins.provisioner import Provisioner

PY = sys.executable

# ---------------------------------------------------------------------------
# the trainer without a sidecar
# ---------------------------------------------------------------------------


def parse_trainer_args(argv: list[str]) -> argparse.Namespace:
    """The example trainer's options (``--sidecar`` is not used here)."""
    return sim_trainer.parse_args(["--sidecar", "unused:0", *argv])


class PlainTrainer(sim_trainer.Trainer):
    """The example trainer's model and checkpoints, driven by a strategy instead of a sidecar."""

    def __init__(self, ns: argparse.Namespace, events: sim_trainer.EventLog) -> None:  # noqa: D107
        super().__init__(ns, events, connect=False)

    def build(self, slices: list[int] | tuple[int, ...], generation: int, reason: str) -> int:
        """A mesh over ``slices`` and the state from the newest committed checkpoint; returns its step."""
        from jax.sharding import Mesh

        t0 = time.monotonic()
        self.manager.wait_until_finished()
        waited = time.monotonic() - t0
        self._new_simulator()
        self.runtime.apply(self.sim, self.slice_devices)
        self.mesh = Mesh(self.np.array([self.slice_devices[s] for s in slices]), ("replica", "model"))
        self.step_fn, self.batch_sh = self._build_step_fn(self.mesh)
        t_restore = time.monotonic()
        self.state = None  # the old mesh's state, replaced by the checkpoint: not held while that is read
        self.state, step, restored_from = self._restore(self.mesh)
        self.active = tuple(slices)
        dt = time.monotonic() - t0
        self.events(
            "resumed",
            {
                "generation": generation,
                "from_step": step,
                "slices": list(slices),
                "restored_from": restored_from,
                "rebuild_seconds": dt,
                "checkpoint_wait_seconds": round(waited, 4),
                "phase_seconds": {"restore": round(time.monotonic() - t_restore, 4)},
                "reason": reason,
            },
        )
        return step

    def train(self, step: int, boundary: Any = None) -> int:
        """Steps until ``--steps``; a slice-down ``JaxRuntimeError`` is logged and raised."""
        ns = self.ns
        while step < ns.steps:
            if boundary is not None:
                boundary(step)
            self.runtime.apply(self.sim, self.slice_devices)
            t0 = time.monotonic()
            x, y = self._batch(step, len(self.active))
            try:
                xs = self.jax.device_put(x, self.batch_sh)
                ys = self.jax.device_put(y, self.batch_sh)
                new_state, loss = self.step_fn(self.state, xs, ys)
                self.runtime.collective(self.active)
                loss_v = float(self.jax.block_until_ready(loss))
            except self.jax.errors.JaxRuntimeError as e:
                lost = sorted(self.runtime.lost_slices() & set(self.active))
                self.events("step_failed", {"step": step + 1, "slices": lost, "error": str(e)[:200]})
                raise
            self.state = new_state
            pad = ns.step_seconds - (time.monotonic() - t0)
            if pad > 0:
                time.sleep(pad)
            step += 1
            dt = time.monotonic() - t0
            self.events("step", {"step": step, "seconds": dt, "loss": loss_v, "slices": list(self.active)})
            if step % ns.checkpoint_period == 0:
                host = self._gather(self.runtime.lost_slices())
                if host is not None:
                    self.manager.save(step, args=self.ocp.args.Composite(state=self.ocp.args.StandardSave(host)))
                    self.events("checkpoint_started", {"step": step})
        return step

    def finish(self, step: int) -> None:
        self.manager.wait_until_finished()
        if step not in self.manager.all_steps(read=True):
            host = self._gather(self.runtime.lost_slices())
            if host is not None:
                self.manager.save(
                    step, args=self.ocp.args.Composite(state=self.ocp.args.StandardSave(host)), force=True
                )
                self.manager.wait_until_finished()
        self.events("finished", {"step": step, "committed_steps": sorted(self.manager.all_steps(read=True))})


def trainer_env(ns: argparse.Namespace) -> dict[str, str]:
    return child_env(**cpu_device_env(ns.slices * ns.devices_per_slice))


# ---------------------------------------------------------------------------
# the harness
# ---------------------------------------------------------------------------


class StandinJob:
    """Stand-in Pathways workers (one process group per host) and the trainer process."""

    def __init__(self, ns: argparse.Namespace, workdir: Path, trainer_module: str, trainer_args: list[str]) -> None:
        self.ns = ns
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.trainer_module = trainer_module
        self.trainer_args = trainer_args
        self.pw_ports = {(s, h): free_port() for s in range(ns.slices) for h in range(ns.hosts_per_slice)}
        self.hosts: dict[tuple[int, int], subprocess.Popen[bytes]] = {}
        self.trainer: subprocess.Popen[bytes] | None = None
        self.trainer_starts = 0
        self._files: list[IO[bytes]] = []
        self.env = child_env()
        self.harness_events = sim_trainer.EventLog(workdir / "harness-events.jsonl")

    def _log(self, name: str) -> IO[bytes]:
        f = open(self.logs / name, "ab")  # noqa: SIM115
        self._files.append(f)
        return f

    def start_host(self, s: int, h: int) -> None:
        self.hosts[(s, h)] = subprocess.Popen(
            [PY, "-m", "standins.pathways_worker", "--port", str(self.pw_ports[(s, h)])],
            stdout=self._log(f"host-{s}.{h}.log"),
            stderr=subprocess.STDOUT,
            process_group=0,
            env=self.env,
        )

    def signal_host(self, s: int, h: int, sig: int) -> None:
        p = self.hosts.get((s, h))
        if p is None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass

    def stop_host(self, s: int, h: int) -> None:
        p = self.hosts.pop((s, h), None)
        if p is None:
            return
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        p.wait()

    def recreate_slice(self, s: int) -> None:
        for h in range(self.ns.hosts_per_slice):
            self.stop_host(s, h)
            self.start_host(s, h)

    def start_all_hosts(self) -> None:
        for s in range(self.ns.slices):
            for h in range(self.ns.hosts_per_slice):
                if (s, h) not in self.hosts:
                    self.start_host(s, h)

    def start_trainer(self) -> None:
        ns = self.ns
        cmd = [
            PY,
            "-m",
            self.trainer_module,
            "trainer",
            "--workdir",
            str(self.workdir),
            "--slices",
            str(ns.slices),
            "--devices-per-slice",
            str(ns.devices_per_slice),
            "--steps",
            str(ns.steps),
            "--checkpoint-period",
            str(ns.checkpoint_period),
            "--step-seconds",
            str(ns.step_seconds),
            "--events",
            str(self.workdir / "trainer-events.jsonl"),
            *self.trainer_args,
            *(getattr(ns, "trainer_arg", None) or []),
        ]
        for (s, h), port in sorted(self.pw_ports.items()):
            cmd += ["--pathways", f"{s}.{h}=127.0.0.1:{port}"]
        self.trainer_starts += 1
        self.harness_events("trainer_spawn", {"n": self.trainer_starts})
        self.trainer = subprocess.Popen(
            cmd, stdout=self._log("trainer.log"), stderr=subprocess.STDOUT, env=trainer_env(ns)
        )

    def kill_trainer(self) -> None:
        if self.trainer is not None and self.trainer.poll() is None:
            self.trainer.kill()
            self.trainer.wait()

    def stop_all(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        if self.trainer is not None:
            if self.trainer.poll() is None:
                self.trainer.terminate()
                try:
                    self.trainer.wait(5)
                except subprocess.TimeoutExpired:
                    self.trainer.kill()
                    self.trainer.wait()
            codes["trainer"] = self.trainer.returncode
        for key in list(self.hosts):
            self.stop_host(*key)
        for f in self._files:
            f.close()
        return codes


class Strategy:
    """What the job does on a fault and when a lost slice is back."""

    name = "strategy"
    trainer_module = ""

    def trainer_args(self, ns: argparse.Namespace) -> list[str]:
        return []

    def on_fault(self, job: StandinJob, f: FaultSpec) -> float:
        """Inject ``f``; returns its time (time.time())."""
        sig = signal.SIGSTOP if f.kind == "hang" else signal.SIGKILL
        t = time.time()
        job.signal_host(f.slice, f.host, sig)
        return t

    def on_slice_back(self, job: StandinJob, s: int) -> None:
        job.recreate_slice(s)

    def restart_pending(self) -> bool:
        """Whether a stopped trainer is going to be started again."""
        return False


def add_strategy_args(p: argparse.ArgumentParser) -> None:
    from simjob.options import add_demo_args

    add_demo_args(p)


def run_strategy(ns: argparse.Namespace, strategy: Strategy) -> int:
    faults: list[FaultSpec] = [] if ns.no_faults else (ns.fault or [parse_fault(f) for f in DEFAULT_FAULTS])
    try:
        check_faults(faults, ns.slices, ns.hosts_per_slice, ns.steps, kinds=("kill", "hang"))
    except ValueError as e:
        print(f"{strategy.name}: {e}", file=sys.stderr)
        return 2
    workdir = (ns.workdir or Path(tempfile.mkdtemp(prefix=f"{strategy.name}-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    say = (lambda *_: None) if ns.quiet else (lambda msg: print(msg, flush=True))
    job = StandinJob(ns, workdir, strategy.trainer_module, strategy.trainer_args(ns))
    say(
        f"{strategy.name}: {ns.slices} slices, {ns.steps} steps, faults {' '.join(map(str, faults)) or 'none'}; "
        f"workdir {workdir}"
    )
    t_start = time.time()
    provisioner = Provisioner(
        ns.replacement_delay, lambda s: strategy.on_slice_back(job, s), enabled=not ns.no_replacement
    )
    records: list[FaultRecord] = []
    pending = sorted(faults, key=lambda f: f.at_step)
    tail = _Tail(workdir / "trainer-events.jsonl")
    last_step = 0
    codes: dict[str, int | None] = {}
    try:
        job.start_all_hosts()
        job.start_trainer()
        deadline = time.monotonic() + ns.run_timeout
        while True:
            for ev in tail.read():
                if ev.get("kind") == "step":
                    last_step = max(last_step, int(ev["step"]))
            while pending and last_step >= pending[0].at_step:
                f = pending.pop(0)
                t = strategy.on_fault(job, f)
                records.append(FaultRecord(f.kind, f.slice, f.host, f.at_step, t, last_step))
                job.harness_events("fault", {"fault": str(f), "fault_time": t, "step_seen": last_step})
                say(f"  +{t - t_start:7.3f}s  [harness] {f.kind} host {f.slice}.{f.host} at step {last_step}")
                provisioner.slice_lost(f.slice, time.monotonic())
            for s in provisioner.poll(time.monotonic()):
                job.harness_events("slice_recreated", {"slice": s})
                say(f"  +{time.time() - t_start:7.3f}s  [provisioner] slice {s} recreated")
            assert job.trainer is not None
            if job.trainer.poll() is not None and not strategy.restart_pending():
                break
            if time.monotonic() > deadline:
                say(f"{strategy.name}: giving up after --run-timeout {ns.run_timeout:g} s")
                break
            time.sleep(0.02)
    except KeyboardInterrupt:
        say("interrupted")
    finally:
        codes = job.stop_all()
    wall = time.time() - t_start
    summary = summarize(workdir, records, t_start, wall, codes)
    summary["strategy"] = strategy.name
    print(render(summary, t_start, workdir, timeline=not ns.quiet))
    if ns.summary_json:
        ns.summary_json.parent.mkdir(parents=True, exist_ok=True)
        ns.summary_json.write_text(json.dumps(summary, indent=2))
    return 0 if codes.get("trainer") == 0 else int(codes.get("trainer") or 1)
