"""``elastic-sidecar demo --mode multi-controller``: one JAX process per host.

As the single-controller demo (:mod:`simjob.harness`: the coordinator, one
stand-in Pathways worker and one worker sidecar per host, the stand-in
provisioner), but the trainer (its mode :mod:`simjob.mc_trainer`) is started once per
host, joined by ``jax.distributed`` on loopback with CPU (gloo) collectives.
The coordinator runs with ``--trainer-processes N``.

A fault on a host hits that host's trainer process too: ``kill`` SIGKILLs it
with the host, ``hang`` SIGSTOPs it with the host; ``notice`` and
``metadata`` announce the host's end and kill it (and its trainer process, if
still there) at ``--notice-deadline``.

**Stand-in for JobSet's restart.** When a trainer process exits with a code
JobSet restarts on (42, or 127-255), it deletes every pod of the job. A pod
deletion is graceful (Kubernetes, "Pod Lifecycle: Termination of Pods"): the
container gets SIGTERM, and SIGKILL only after ``terminationGracePeriodSeconds``
(the overlay's 120 s for a slice pod). So the trainer processes on hosts that
were not hit get SIGTERM and the grace (JAX takes SIGTERM once
``jax.distributed`` is up, so a process blocked in a collective stays until its
hooks end it); a process on a host the fault hit goes at once (the host is
gone or replaced); the coordinator is ended. Once every trainer process is
gone, it recreates them, the coordinator with the next ``--restart-attempt``;
like pods waiting for their nodes, the new processes start only once no host
is about to go (an announced death still pending) and every host is up again
(the provisioner replaced lost slices). A process that vanished with its host
(SIGKILL) gives JobSet no exit code: a node that dies is not a failed container.

Per fault the summary adds ``all_exited_seconds`` (the fault until every
trainer process of that attempt is gone) and ``restart_to_first_step_seconds``
(the restarted processes' start until process 0 completes a step), with
``resumed_from_step`` and the attempt's exit codes.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from simjob.cpu_devices import cpu_device_env
from simjob.demo_common import (
    PY,
    SetupError,
    committed_steps,
    drive,
    finish_line,
    fit,
    free_port,
    preflight,
    prepare_workdir,
)
from simjob.demo_common import flags as _flags
from simjob.harness import Demo, Job
from simjob.options import MC_DEFAULT_FAULTS, MC_KINDS, FaultSpec
from simjob.steps import events_path
from simjob.summary import read_jsonl, render

RESTART_EXIT_CODES = frozenset({42, *range(127, 256)})
"""Exit codes xpk's JobSet failure policy restarts on (FACTS section 5)."""
MAX_RESTARTS = 5
"""The stand-in gives up after this many restarts (a real JobSet's maxRestarts)."""
JOBSET_RESTART_DELAY = 1.0
"""Seconds from deleting the job's pods until their replacements start."""
JOBSET_REACTION_SECONDS = 1.0
"""Seconds from the first exit JobSet restarts on until it deletes the job's other pods."""
POD_TERMINATION_GRACE = 120.0
"""A deleted slice pod's ``terminationGracePeriodSeconds`` (deploy/overlays/multi-controller):
seconds from SIGTERM until SIGKILL."""


def _container_code(code: int | None) -> int | None:
    """Popen's -N (ended by signal N) as a container reports it: 128 + N."""
    return 128 - code if code is not None and code < 0 else code


class McJob(Job):
    """The job's processes, with one trainer process per host."""

    def __init__(self, ns: argparse.Namespace, workdir: Path) -> None:
        super().__init__(ns, workdir)
        self.attempt = 0
        self.keys = [(s, h) for s in range(ns.slices) for h in range(ns.hosts_per_slice)]
        self.trainers: dict[tuple[int, int], subprocess.Popen[bytes]] = {}

    @property
    def processes(self) -> int:
        return len(self.keys)

    def spawn_coordinator(self, **kw: Any) -> subprocess.Popen[bytes]:
        saved = getattr(self.ns, "coordinator_arg", None)
        self.ns.coordinator_arg = [
            *(saved or []),
            f"--trainer-processes={self.processes}",
            f"--restart-attempt={self.attempt}",
        ]
        try:
            return super().spawn_coordinator(**kw)
        finally:
            self.ns.coordinator_arg = saved

    def start_trainer(self) -> None:
        """Every host's trainer process, joined by a jax.distributed coordinator on a fresh port."""
        ns = self.ns
        jax_coordinator = f"127.0.0.1:{free_port()}"
        per_host = max(1, ns.devices_per_slice // ns.hosts_per_slice)
        self.trainers = {}
        for index, (s, h) in enumerate(self.keys):
            env = {
                **self.env,
                **cpu_device_env(per_host),
                "ELASTIC_SIDECAR_ADDRESS": self.trainer_addr,
                "ELASTIC_SIDECAR_JOB": "elastic-demo",
            }
            cmd = [PY, "-m", "simjob.trainer", "--mode", "multi-controller"] + _flags(
                sidecar=self.trainer_addr,
                job="elastic-demo",
                workdir=self.workdir,
                process_id=index,
                num_processes=self.processes,
                jax_coordinator=jax_coordinator,
                host_name=self.node(s, h),
                steps=ns.steps,
                checkpoint_period=ns.checkpoint_period,
                step_seconds=ns.step_seconds,
                events=self.workdir / "trainer-events.jsonl",
                elastic_timeout_seconds=ns.timeout,
            )
            if getattr(ns, "no_sidecar", False):
                cmd.append("--no-sidecar")
            self.trainers[(s, h)] = subprocess.Popen(
                cmd, stdout=self._log(f"trainer-{s}.{h}.log"), stderr=subprocess.STDOUT, env=env, process_group=0
            )
        self.trainer = self.trainers[self.keys[0]]

    def signal_trainer(self, s: int, h: int, sig: int) -> None:
        p = self.trainers.get((s, h))
        if p is not None and p.poll() is None:
            p.send_signal(sig)

    def delete_pods(self, hit: set[tuple[int, int]]) -> None:
        """JobSet deletes the pods: SIGTERM to the trainer processes on hosts not hit (their grace
        runs from now), SIGKILL to those on hosts the fault hit (a stopped one too)."""
        for key, p in self.trainers.items():
            if p.poll() is None:
                if key in hit:
                    p.kill()
                    p.send_signal(signal.SIGCONT)
                else:
                    p.terminate()

    def end_trainers(self) -> None:
        """The grace is over: SIGKILL to every trainer process still there."""
        for p in self.trainers.values():
            if p.poll() is None:
                p.kill()
                p.send_signal(signal.SIGCONT)
        for p in self.trainers.values():
            p.wait()

    def stop_all(self) -> dict[str, int | None]:
        for p in self.trainers.values():
            if p is not self.trainer and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in self.trainers.values():
            if p is not self.trainer:
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        return super().stop_all()


class McDemo(Demo):
    """One run of the multi-controller job, JobSet restarts included."""

    job: McJob

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.attempts: list[dict[str, Any]] = [{"attempt": 0, "started": time.time(), "fault": None}]
        self.restart_due: float | None = None
        self.done = False

    def make_job(self, ns: argparse.Namespace, workdir: Path) -> Job:
        return McJob(ns, workdir)

    # -- faults ----------------------------------------------------------------------

    def inject(self, f: FaultSpec) -> None:
        super().inject(f)
        assert f.slice is not None and f.host is not None
        if f.kind == "kill":
            self.job.signal_trainer(f.slice, f.host, signal.SIGKILL)
        elif f.kind == "hang":
            self.job.signal_trainer(f.slice, f.host, signal.SIGSTOP)
        cur = self.attempts[-1]
        cur.setdefault("hit", set()).add((f.slice, f.host))
        if cur["fault"] is None:
            cur["fault"] = len(self.records) - 1

    # -- the loop ----------------------------------------------------------------------

    def tick(self) -> bool:
        for ev in self.trainer_events():
            if ev.get("kind") == "step":
                self.last_step = max(self.last_step, int(ev["step"]))
                cur = self.attempts[-1]
                if cur.get("first_step") is None and ev["t"] >= cur["started"]:
                    cur["first_step"] = ev["t"]
                    cur["first_step_number"] = int(ev["step"])
            elif ev.get("kind") == "resumed":
                cur = self.attempts[-1]
                if cur.get("resumed_from_step") is None and ev["t"] >= cur["started"]:
                    cur["resumed_from_step"] = int(ev["from_step"])
                    cur["restored_from"] = ev.get("restored_from")
        if not self.check_children():
            return False
        mono = time.monotonic()
        job = self.job
        while self.pending and self.last_step >= self.pending[0].at_step and self.restart_due is None:
            self.inject(self.pending.pop(0))
        for when, f in [d for d in self.deaths if d[0] <= mono]:
            self.deaths.remove((when, f))
            assert f.slice is not None and f.host is not None
            job.hosts[(f.slice, f.host)].signal(signal.SIGKILL)
            job.signal_trainer(f.slice, f.host, signal.SIGKILL)
            self.provisioner.slice_lost(f.slice, mono)
            self.say(f"  +{self.elapsed():7.3f}s  [harness] host {f.slice}.{f.host} died at its deadline")
        for s in self.provisioner.poll(mono):
            self.say(f"  +{self.elapsed():7.3f}s  [provisioner] slice {s} recreated")
        if mono > self.deadline:
            self.say(f"elastic-sidecar demo: giving up after --run-timeout {self.ns.run_timeout:g} s")
            self.gave_up = True
            return False
        return self._jobset(mono)

    def _jobset(self, mono: float) -> bool:
        """The stand-in for JobSet's failure policy; False once the job is over."""
        job = self.job
        cur = self.attempts[-1]
        hit = cur.setdefault("hit", set())
        # A process ended by a signal exits 128 + the signal in a container; one that vanished
        # with its host (hit by the fault) gives JobSet no exit code at all.
        codes = {k: _container_code(p.poll()) if k not in hit else p.poll() for k, p in job.trainers.items()}
        if self.restart_due is None:
            if all(c == 0 for c in codes.values()):
                cur["exit_codes"] = {f"{s}.{h}": c for (s, h), c in codes.items()}
                self.done = True
                return False
            if cur.get("all_exited") is None and cur["fault"] is not None:
                if all(c is not None for k, c in codes.items() if k not in hit):
                    cur["all_exited"] = time.time()  # every process on a host that was not hit is gone
            if not any(c is not None and c in RESTART_EXIT_CODES for k, c in codes.items() if k not in hit):
                if any(c not in (None, 0) for k, c in codes.items() if k not in hit):
                    # Any other exit code fails the JobSet (xpk): no restart.
                    cur["exit_codes"] = {f"{s}.{h}": c for (s, h), c in codes.items()}
                    self.say(f"  +{self.elapsed():7.3f}s  [jobset] failed: exit codes {cur['exit_codes']}")
                    return False
                window = getattr(self.ns, "baseline_window", 60.0)
                if self.ns.no_sidecar and cur["fault"] is not None and cur.get("all_exited") is None:
                    since = time.time() - self.records[cur["fault"]].time
                    if since > window:
                        alive = [f"{s}.{h}" for (s, h), c in codes.items() if c is None and (s, h) not in hit]
                        cur["still_running"] = alive
                        cur["still_running_after"] = round(since, 3)
                        self.say(
                            f"  [baseline] {len(alive)} trainer process(es) still there {since:.0f} s after the fault"
                        )
                        return False
                return True
            cur.setdefault("first_restart_exit", mono)
            if mono < cur["first_restart_exit"] + JOBSET_REACTION_SECONDS:
                return True
            # JobSet restarts the job: it deletes every pod still there (a hung host's too) and
            # recreates them once they are gone, at the latest when their grace is over.
            if cur.get("cleaned_up") is None:
                job.delete_pods(hit)
                cur["cleaned_up"] = time.time()
                cur["grace_ends"] = mono + POD_TERMINATION_GRACE
            if any(p.poll() is None for p in job.trainers.values()) and mono < cur["grace_ends"]:
                return True
            job.end_trainers()
            cur["exit_codes"] = {
                f"{s}.{h}": (p.returncode if (s, h) in hit else _container_code(p.returncode))
                for (s, h), p in job.trainers.items()
            }
            self.exits["trainer"].append(max((c for c in cur["exit_codes"].values() if c is not None), default=None))
            self.say(
                f"  +{self.elapsed():7.3f}s  [jobset] a trainer process exited with a restart code; every pod "
                f"deleted (exit codes {cur['exit_codes']}); restarting the job"
            )
            if job.coordinator is not None:
                try:
                    job.coordinator.wait(3)
                except subprocess.TimeoutExpired:
                    job.kill_coordinator()
                self.exits["coordinator"].append(job.coordinator.returncode)
                self.coordinator_down = True  # ended with the attempt: not a failure of its own
            if len(self.attempts) > MAX_RESTARTS:
                self.say(f"  [jobset] {MAX_RESTARTS} restarts used up; giving up")
                return False
            self.restart_due = mono + JOBSET_RESTART_DELAY
            return True
        # Pods wait for their nodes: no announced death pending, every host up again.
        hosts_up = len(job.hosts) == job.processes and all(h.alive() for h in job.hosts.values())
        if mono < self.restart_due or self.deaths or self.provisioner._due or not hosts_up:
            return True
        self.restart_due = None
        cur["committed_at_restart"] = committed_steps(job.workdir / "checkpoints")
        job.attempt += 1
        job.start_coordinator()
        self.coordinator_down = False
        job.start_trainer()
        self.attempts.append({"attempt": job.attempt, "started": time.time(), "fault": None})
        self.say(
            f"  +{self.elapsed():7.3f}s  [jobset] restart attempt {job.attempt}: coordinator and trainer processes"
        )
        return True

    def diagnose(self) -> dict[str, Any]:
        """Where a run that gave up was stuck: read before every process is stopped.

        Each trainer process of the current attempt (alive or its exit code, its last event),
        each host's processes, and the coordinator's last decisions from its journal.
        """
        job = self.job
        base = job.workdir / "trainer-events.jsonl"
        procs: dict[str, Any] = {}
        for index, (key, p) in enumerate(job.trainers.items()):
            last = (read_jsonl(events_path(base, index)) or [{}])[-1]
            procs[f"{key[0]}.{key[1]}"] = {
                "exit_code": p.poll(),
                "last_event": {k: last.get(k) for k in ("kind", "step", "from_step", "reason") if k in last}
                if last
                else None,
            }
        journal = [f"{j.get('trigger')}: {j.get('reason')}" for j in read_jsonl(job.journal_path)[-6:]]
        return {
            "attempt": job.attempt,
            "restart_due": self.restart_due is not None,
            "trainer_processes": procs,
            "hosts": {f"{s}.{h}": [p.poll() for p in host.procs] for (s, h), host in job.hosts.items()},
            "coordinator_exit_code": None if job.coordinator is None else job.coordinator.poll(),
            "journal_tail": journal,
        }

    def finish(self, *, interrupted: bool = False) -> dict[str, Any]:
        stuck = self.diagnose() if self.gave_up else None
        summary = super().finish(interrupted=interrupted)
        if stuck is not None:
            summary["gave_up"] = stuck
        for i, f in enumerate(summary["faults"]):
            rec = self.records[i]
            att = next((a for a in self.attempts if a["fault"] == i), None)
            nxt = self.attempts[self.attempts.index(att) + 1] if att and att is not self.attempts[-1] else None
            f["all_exited_seconds"] = round(att["all_exited"] - rec.time, 3) if att and att.get("all_exited") else None
            f["jobset_cleanup_seconds"] = (
                round(att["cleaned_up"] - rec.time, 3) if att and att.get("cleaned_up") else None
            )
            f["exit_codes"] = att.get("exit_codes") if att else None
            f["restart_to_first_step_seconds"] = (
                round(nxt["first_step"] - nxt["started"], 3) if nxt and nxt.get("first_step") else None
            )
            f["resumed_from_step"] = nxt.get("resumed_from_step") if nxt else None
            f["committed_at_restart"] = att.get("committed_at_restart") if att else None
            if att and "still_running" in att:
                f["still_running_after_seconds"] = att["still_running_after"]
                f["processes_still_running"] = att["still_running"]
        summary["mode"] = "multi-controller"
        summary["trainer_processes"] = self.job.processes
        summary["attempts"] = [
            {
                k: (round(v - self.t_start, 3) if k in ("started", "all_exited", "first_step", "cleaned_up") else v)
                for k, v in a.items()
                if k not in ("hit", "first_restart_exit", "grace_ends")
            }
            for a in self.attempts
        ]
        summary["completed"] = self.done
        summary["sidecar"] = not self.ns.no_sidecar
        return summary


def run_mc_demo(ns: argparse.Namespace) -> int:
    try:
        faults = preflight(ns, MC_DEFAULT_FAULTS, MC_KINDS)
        if ns.slices * ns.hosts_per_slice < 2:
            raise ValueError("--mode multi-controller needs at least 2 hosts (--slices x --hosts-per-slice)")
        workdir = prepare_workdir(ns, "elastic-demo-mc-")
    except ValueError as e:
        print(f"elastic-sidecar demo: {e}", file=sys.stderr)
        return 2
    say = (lambda *_: None) if ns.quiet else (lambda msg: print(msg, flush=True))
    demo = McDemo(ns, workdir, faults, say)
    n = ns.slices * ns.hosts_per_slice
    say(
        fit(
            "elastic-sidecar demo (multi-controller): ",
            f"{ns.slices} slices x {ns.hosts_per_slice} host(s) = {n} JAX processes, {ns.steps} steps, "
            f"faults: {' '.join(map(str, faults)) or 'none'}; workdir {workdir}",
        )
    )
    say(f"  status page http://{demo.job.http_addr}/   admin API {demo.job.admin_addr}")
    try:
        summary, stopped = drive(demo)
    except SetupError as e:
        print(f"elastic-sidecar demo: {e}", file=sys.stderr)
        return 2
    print(render(summary, demo.t_start, workdir, timeline=False, journal_path=demo.job.journal_path))
    for f in summary["faults"]:
        print(
            fit(
                "  ",
                f"{f['fault']}: every trainer process on the other hosts gone {f['all_exited_seconds']} s after the "
                f"fault (every pod deleted by the JobSet stand-in at {f['jobset_cleanup_seconds']} s); restart to "
                f"first step {f['restart_to_first_step_seconds']} s, resumed from step {f['resumed_from_step']}",
            )
        )
    if "gave_up" in summary:
        print(fit("  ", f"gave up; where it was (None: still running): {json.dumps(summary['gave_up'])}"))
    if ns.summary_json:
        ns.summary_json.parent.mkdir(parents=True, exist_ok=True)
        ns.summary_json.write_text(json.dumps(summary, indent=2))
    code = finish_line(demo, stopped)
    if code is not None:
        return code
    return 0 if summary["completed"] else 1
