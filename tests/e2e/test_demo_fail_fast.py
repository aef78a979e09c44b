"""The demo fails fast and says why, and a stop signal stops every process of it.

Real processes: the demo is started as an operator would start it, and what is
checked is its exit code, what it printed, and which of its processes are left.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from simjob.demo_common import SetupError, prepare_workdir, resolve_faults
from simjob.options import DEFAULT_FAULTS, FAULT_KINDS, add_demo_args

pytestmark = pytest.mark.e2e

DEMO = [sys.executable, "-m", "agent", "demo"]


def _ns(*args: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_demo_args(p)
    return p.parse_args(list(args))


def _descendants(root: int) -> set[int]:
    """Every process below ``root`` now (read from /proc)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            parent[int(d.name)] = int(stat.rpartition(")")[2].split()[1])
    out: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier and pid not in out}
        out |= frontier
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_held_admin_port_fails_at_once_naming_the_port(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        addr = f"127.0.0.1:{held.getsockname()[1]}"
        t0 = time.monotonic()
        proc = subprocess.run(
            [*DEMO, "--workdir", str(tmp_path / "job"), "--admin-address", addr],
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert addr in proc.stderr and "--admin-address" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert took < 20, took


def test_a_child_that_exits_with_an_error_ends_the_demo_with_its_error_line(tmp_path: Path) -> None:
    """The coordinator refuses its arguments (exit 2): the demo ends then, not at --run-timeout."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            *DEMO,
            "--workdir",
            str(tmp_path / "job"),
            "--no-faults",
            "--steps",
            "100000",
            "--run-timeout",
            "600",
            "--coordinator-arg=--no-such-flag",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()
    assert "the coordinator exited with code 2" in proc.stderr, proc.stderr
    assert "--no-such-flag" in " ".join(last[-3:]), proc.stderr  # its last error line, said last
    assert took < 200, took  # far from the 600 s --run-timeout


# SIGHUP under --runslow: test_its_terminal_closing_stops_every_process sends it the way a terminal does and
# checks exit 129 and every process gone; the demo handles the three signals alike.
@pytest.mark.parametrize(
    ("sig", "code", "group"),
    [
        (signal.SIGINT, 130, True),
        (signal.SIGTERM, 143, False),
        pytest.param(signal.SIGHUP, 129, False, marks=pytest.mark.slow),
    ],
)
def test_a_stop_signal_while_training_stops_every_process(
    tmp_path: Path, sig: signal.Signals, code: int, group: bool
) -> None:
    """Ctrl-C (SIGINT to the demo's process group), SIGTERM or SIGHUP to the demo alone: every process
    the demo started is gone when it exits, and it exits 128 + the signal.

    On the way, a periodic checkpoint the trainer saved counts as committed once Orbax committed it
    (the coordinator's ``/status``), as a flush would."""
    work = tmp_path / "job"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        http = f"127.0.0.1:{s.getsockname()[1]}"
    proc = subprocess.Popen(
        [
            *DEMO,
            *("--workdir", str(work), "--no-faults", "--steps", "100000", "--run-timeout", "600"),
            *("--checkpoint-period", "10", "--http-address", http),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        events = work / "trainer-events.jsonl"
        deadline = time.monotonic() + 180
        committed: list[int] = []
        while time.monotonic() < deadline and proc.poll() is None and not committed:
            if events.exists():
                evs = [json.loads(x) for x in events.read_text().splitlines() if x.endswith("}")]
                committed = [e["step"] for e in evs if e["kind"] == "checkpoint_committed"]
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0]
        assert committed, "the trainer never reported a periodic checkpoint committed"
        assert (work / "checkpoints" / str(committed[0])).is_dir()
        deadline = time.monotonic() + 30
        status: dict[str, object] = {}
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://{http}/status", timeout=5) as r:
                status = json.loads(r.read())
            if int(status["last_committed_step"]) >= committed[0]:  # type: ignore[call-overload]
                break
            time.sleep(0.2)
        assert int(status["last_committed_step"]) >= committed[0], status  # type: ignore[call-overload]
        children = _descendants(proc.pid)
        assert len(children) >= 10, children  # coordinator, trainer, 4 x (Pathways worker + sidecar)
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate(timeout=30)
            left: list[bytes] = []
            for pid in children:  # in process groups of their own: not reached by the group's SIGKILL
                try:
                    if _alive(pid):
                        left.append(Path(f"/proc/{pid}/cmdline").read_bytes())
                        os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            pytest.fail(f"the demo had not exited 60 s after {signal.Signals(sig).name}; still alive: {left}\n{out}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, out
    assert signal.Signals(sig).name in out, out
    time.sleep(0.5)
    left = [pid for pid in children if _alive(pid)]
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes() for p in left]


def test_its_terminal_closing_stops_every_process(tmp_path: Path) -> None:
    """The demo's terminal goes away (a closed window, a dropped ssh session): the kernel hangs the
    terminal up and sends SIGHUP to its controlling process, the demo, whose writes to it now fail.
    Its children, in process groups of their own, get no SIGHUP: the demo must stop them (exit 129)."""
    master, slave = os.openpty()

    def controlling_terminal() -> None:  # runs after setsid (start_new_session): the pty becomes ours
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        [*DEMO, "--workdir", str(tmp_path / "job"), "--no-faults", "--steps", "100000", "--run-timeout", "600"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=controlling_terminal,  # noqa: PLW1509  (the test's own process is single-threaded here)
    )
    os.close(slave)
    out = bytearray()
    stop_reading = threading.Event()

    def read_terminal() -> None:  # a terminal nobody reads fills up and blocks the demo's prints
        while not stop_reading.is_set():
            if select.select([master], [], [], 0.2)[0]:
                try:
                    out.extend(os.read(master, 65536))
                except OSError:
                    return

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    children: set[int] = set()
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None and len(children) < 10:
            time.sleep(0.5)
            children = _descendants(proc.pid)
        assert proc.poll() is None and len(children) >= 10, (children, out.decode(errors="replace"))
        children = _descendants(proc.pid)
        stop_reading.set()
        reader.join()
        os.close(master)  # the last close of the master side hangs the terminal up
        master = -1
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the demo had not exited 60 s after its terminal hung up\n{out.decode(errors='replace')}")
    finally:
        if master >= 0:
            stop_reading.set()
            reader.join()
            os.close(master)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            for pid in children:  # in process groups of their own: not reached by the group's SIGKILL
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    left: dict[int, bytes] = {}
    for pid in children:
        try:
            if _alive(pid):
                left[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass  # gone meanwhile
    assert code == 128 + signal.SIGHUP, (code, out.decode(errors="replace"), left)
    assert not left, left


def test_a_work_directory_in_use_by_a_running_demo_is_refused_before_anything_in_it_is_touched(
    tmp_path: Path,
) -> None:
    work = tmp_path / "job"
    first = subprocess.Popen(
        [*DEMO, "--workdir", str(work), "--no-faults", "--steps", "100000", "--run-timeout", "600", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and first.poll() is None and len(_descendants(first.pid)) < 10:
            time.sleep(0.5)
        assert first.poll() is None, first.communicate()[0]
        token = (work / "peer-token").read_bytes()
        logs = sorted(p.name for p in (work / "logs").iterdir())
        t0 = time.monotonic()
        second = subprocess.run(
            [*DEMO, "--workdir", str(work), "--no-faults"], capture_output=True, text=True, timeout=60
        )
        took = time.monotonic() - t0
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"--workdir {work} is in use by a running demo (pid {first.pid})" in second.stderr, second.stderr
        assert took < 30, took
        assert (work / "peer-token").read_bytes() == token
        assert sorted(p.name for p in (work / "logs").iterdir()) == logs
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        try:
            first.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate(timeout=30)
    assert first.returncode == 128 + signal.SIGTERM


def test_the_work_directory_lock_goes_with_the_process_that_held_it(tmp_path: Path) -> None:
    """flock(2) locks go when their holder dies, even by SIGKILL: no stale lock to clean up."""
    work = tmp_path / "job"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time, argparse; from simjob.demo_common import prepare_workdir; "
            f"prepare_workdir(argparse.Namespace(workdir={str(work)!r}), 'x'); print('held', flush=True); "
            "time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(SetupError, match=f"in use by a running demo \\(pid {holder.pid}\\)"):
            prepare_workdir(argparse.Namespace(workdir=work), "x")
    finally:
        holder.kill()
        holder.wait()
    assert prepare_workdir(argparse.Namespace(workdir=work), "x") == work.resolve()
    with pytest.raises(SetupError, match="in use"):  # a second open file description, even in one process
        prepare_workdir(argparse.Namespace(workdir=work), "x")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--no-faults", "--fault", "kill:1.0@3"], "--no-faults conflicts with --fault"),
        (["--no-sidecar"], "--no-sidecar needs --mode multi-controller"),
        (["--mode", "multi-controller", "--via-proxy"], "--via-proxy"),
        (["--mode", "multi-controller", "--baseline-window", "5"], "--baseline-window applies only"),
        (["--mode", "multi-controller", "--plot", "r.png"], "--plot is for the single-controller demo"),
    ],
)
def test_conflicting_flags_are_refused(tmp_path: Path, args: list[str], needle: str) -> None:
    proc = subprocess.run(
        [*DEMO, "--workdir", str(tmp_path / "job"), *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_bad_workdir_is_one_line_exit_2(tmp_path: Path) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("x")
    for bad, why in ((afile, "not a directory"), (afile / "below", "cannot create it")):
        proc = subprocess.run([*DEMO, "--workdir", str(bad)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert str(bad) in proc.stderr and why in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_default_faults_fit_a_short_or_small_run() -> None:
    """A default fault the user never typed is moved into --steps or dropped, with a note; a typed one is checked."""
    notes: list[str] = []
    faults = resolve_faults(_ns("--steps", "5"), DEFAULT_FAULTS, FAULT_KINDS, notes.append)
    assert [f.kind for f in faults] == ["kill", "hang"]
    assert all(0 < f.at_step < 5 for f in faults), faults
    assert len(notes) == 2 and all("past --steps 5" in n for n in notes), notes

    notes.clear()
    faults = resolve_faults(_ns("--slices", "2"), DEFAULT_FAULTS, FAULT_KINDS, notes.append)
    assert [str(f) for f in faults] == ["kill:1.0@40"]
    assert notes and "hang:2.0@120 dropped" in notes[0], notes

    with pytest.raises(ValueError, match="step 500"):
        resolve_faults(_ns("--steps", "100", "--fault", "kill:1.0@500"), DEFAULT_FAULTS, FAULT_KINDS, notes.append)
    with pytest.raises(SetupError, match="conflicts"):
        resolve_faults(_ns("--no-faults", "--fault", "kill:1.0@5"), DEFAULT_FAULTS, FAULT_KINDS, notes.append)


def test_a_trainer_killed_by_a_signal_is_named_with_its_log_and_its_threads_stacks(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from simjob.harness import Demo, Job

    job = Job(_ns(), tmp_path / "job")
    job.logs.mkdir(parents=True, exist_ok=True)
    log = job.logs / "trainer.log"
    with log.open("wb") as out:  # a child as the demo starts it: its environment, its log
        job.trainer = subprocess.Popen(
            [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=job.env,
        )
    assert job.trainer.wait(30) == -signal.SIGSEGV
    why = Demo.trainer_failure(SimpleNamespace(job=job))  # type: ignore[arg-type]
    assert why == f"the trainer was killed by SIGSEGV (exit -11; its log: {log})"
    assert "Fatal Python error: Segmentation fault" in log.read_text()
