"""What the demo's runs share: process helpers, set-up checks, signals, live output, one run.

:mod:`simjob.harness` runs both modes (one trainer process, or one per host) on this module.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import re
import signal
import socket
import sys
import tempfile
import termios
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent.auth import read_token_file
from agent.config import is_loopback
from simjob.options import FaultSpec, check_faults, check_flags, parse_fault
from simjob.ports import free_port
from simjob.summary import journal_row, trainer_row
from simjob.text import fit  # re-exported: simjob.harness imports it from here

__all__ = ["PY", "flags", "free_port"]

PY = sys.executable

EXIT_USAGE = 2
BENIGN_EXITS = frozenset({0, 3, 42})
"""Exit codes a sidecar or trainer ends with by design: done, aborted by an operator, restart."""


class SetupError(ValueError):
    """A demo that cannot start: one line on stderr, exit 2."""


def flags(**kw: object) -> list[str]:
    """--key value pairs from keyword arguments (underscores become dashes)."""
    out: list[str] = []
    for k, v in kw.items():
        if v is not None:
            out += ["--" + k.replace("_", "-"), str(v)]
    return out


def committed_steps(ckdir: Path) -> list[int]:
    """Steps Orbax committed in ``ckdir`` (it writes a step under a temporary name and renames it when done)."""
    if not ckdir.is_dir():
        return []
    return sorted(int(p.name) for p in ckdir.iterdir() if p.is_dir() and p.name.isdigit())


# -- set-up ------------------------------------------------------------------------


def prepare_workdir(ns: argparse.Namespace, prefix: str) -> Path:
    """The run's work directory, created; a SetupError names what is wrong with ``--workdir``."""
    if ns.workdir is None:
        return Path(tempfile.mkdtemp(prefix=prefix)).resolve()
    workdir = Path(ns.workdir).resolve()
    if workdir.exists() and not workdir.is_dir():
        raise SetupError(f"--workdir {ns.workdir}: exists and is not a directory")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SetupError(f"--workdir {ns.workdir}: cannot create it ({e.strerror or e})") from None
    if not os.access(workdir, os.W_OK | os.X_OK):
        raise SetupError(f"--workdir {ns.workdir}: not writable")
    _lock_workdir(workdir)
    ck = workdir / "checkpoints"
    if ck.is_dir() and any(ck.iterdir()):
        raise SetupError(f"--workdir {workdir} already holds checkpoints; pass an empty --workdir")
    return workdir


WORKDIR_LOCK = "demo.lock"
"""The file in the work directory a running demo holds an exclusive flock on, with its pid in it."""
_held_locks: list[int] = []
"""Descriptors of the work directory locks this process holds: open until it exits."""


def _lock_workdir(workdir: Path) -> None:
    """Refuse a work directory another running demo uses, before anything in it is touched.

    flock(2): the lock belongs to the open file description and goes when its last descriptor is
    closed, which the kernel does when the process ends, however it ends: a demo that was killed
    leaves no stale lock. Python's descriptors are not inherited by the processes the demo starts
    (PEP 446), so a child it left behind does not keep the directory locked either.
    """
    path = workdir / WORKDIR_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise SetupError(f"--workdir {workdir}: cannot create {path.name} ({e.strerror or e})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise SetupError(
            f"--workdir {workdir} is in use by a running demo{who}: give another --workdir, or stop that demo"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held_locks.append(fd)


def resolve_faults(
    ns: argparse.Namespace,
    defaults: tuple[str, ...],
    kinds: tuple[str, ...],
    note: Callable[[str], None],
) -> list[FaultSpec]:
    """The run's faults: the ones typed (checked strictly), or the defaults fitted to the job.

    A default fault the user never typed is moved into a shorter run (its step scaled to
    ``--steps``) or dropped where its slice or host does not exist, each with a note.
    """
    typed: list[FaultSpec] | None = ns.fault
    if ns.no_faults and typed:
        raise SetupError(f"--no-faults conflicts with --fault {' '.join(map(str, typed))}: give one or the other")
    if ns.no_faults:
        return []
    if typed:
        check_faults(typed, ns.slices, ns.hosts_per_slice, ns.steps, kinds=kinds)
        return typed
    out = []
    default_steps = 200  # --steps' default, which the default faults are placed for
    for text in defaults:
        f = parse_fault(text)
        if f.slice is not None and (f.slice >= ns.slices or (f.host or 0) >= ns.hosts_per_slice):
            note(f"note: default fault {f} dropped: no host {f.slice}.{f.host} with --slices {ns.slices}")
            continue
        if f.at_step >= ns.steps:
            step = max(1, min(ns.steps - 1, f.at_step * ns.steps // default_steps))
            moved = FaultSpec(f.kind, f.slice, f.host, step, f.seconds)
            note(f"note: default fault {f} is past --steps {ns.steps}; moved to step {step} ({moved})")
            f = moved
        out.append(f)
    out.sort(key=lambda f: f.at_step)
    check_faults(out, ns.slices, ns.hosts_per_slice, ns.steps, kinds=kinds)
    return out


def check_port_free(flag: str, addr: str | None) -> None:
    """A SetupError naming ``flag`` and its address when another process listens there already
    (the coordinator would exit 2 at start; better said before anything starts)."""
    if not addr:
        return
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return  # the coordinator names what is wrong with it
    fam, typ, proto, _, sa = infos[0]
    with socket.socket(fam, typ, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(sa)
        except OSError as e:
            raise SetupError(
                f"{flag} {addr}: cannot listen there ({e.strerror}; another process holds the port?)"
            ) from None


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process the demo or a benchmark strategy starts: unbuffered output, and
    PYTHONFAULTHANDLER, so that one killed by a fatal signal (SIGSEGV) leaves every thread's stack in its log."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **extra}


# -- signals -----------------------------------------------------------------------


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What stops the demo and every process it started, exiting 128 + the signal: Ctrl-C, a kill, and a
hang-up (its terminal closed, an ssh session gone). The demo's children run in process groups of their
own, which a terminal's SIGHUP does not reach: without the demo they would be orphans."""


class Interrupted(KeyboardInterrupt):
    """A stop signal (:data:`STOP_SIGNALS`) reached the demo: stop every process, exit 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise(signum: int, frame: object) -> None:
    if signum == signal.SIGHUP:
        _off_hung_up_terminal()
    raise Interrupted(signum)


def _off_hung_up_terminal() -> None:
    """Point standard output and error at /dev/null where they are a terminal that hung up: on Linux every
    write to a hung-up terminal fails with EIO (and so does tcgetattr), and a failed print must not stop the
    demo from stopping its processes (nor Python's final flush turn the exit code into 120)."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            try:
                termios.tcgetattr(fd)
            except termios.error as e:
                if e.args[0] == errno.EIO:
                    os.dup2(null, fd)
    finally:
        os.close(null)


def catch_stop_signals() -> None:
    """The :data:`STOP_SIGNALS` raise :class:`Interrupted`.

    Set explicitly: a shell starts a background job with SIGINT ignored, and Python then
    installs no handler of its own (the demo would ignore Ctrl-C sent to its group).
    """
    for s in STOP_SIGNALS:
        signal.signal(s, _raise)


@contextmanager
def signals_deferred() -> Iterator[list[int]]:
    """While the job's processes are being stopped, a second stop signal is noted, not raised."""
    seen: list[int] = []
    old = {s: signal.signal(s, lambda n, _f: seen.append(n)) for s in STOP_SIGNALS}
    try:
        yield seen
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# -- reading the children's logs ---------------------------------------------------

_ERROR_WORD = re.compile(r"(error|exception|failed|could not)", re.IGNORECASE)
_LOG_FIELDS = {"severity", "message", "time", "logging.googleapis.com/labels", "logging.googleapis.com/sourceLocation"}


def last_error(log: Path) -> str | None:
    """The last ERROR line of a child's log, as one short line.

    A JSON log line at ERROR or CRITICAL gives its message and fields; otherwise the last
    plain line that reads as an error (a Python traceback's last line, a C library's line).
    """
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()[-400:]
    except OSError:
        return None
    plain: str | None = None
    for line in reversed(lines):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if str(rec.get("severity", rec.get("level", ""))).upper() in ("ERROR", "CRITICAL"):
                extra = " ".join(f"{k}={v}" for k, v in rec.items() if k not in _LOG_FIELDS)
                return f"{rec.get('message', rec.get('event', ''))}: {extra}".rstrip(": ")
            continue
        if plain is None and _ERROR_WORD.search(line) and not line.startswith(("File ", "Traceback")):
            plain = line
    return plain


class JsonTail:
    """Reads the JSON lines a file gains."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.buf = ""

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, encoding="utf-8") as f:
            f.seek(self.pos)
            data = f.read()
            self.pos = f.tell()
        self.buf += data
        *lines, self.buf = self.buf.split("\n")
        out = []
        for x in lines:
            try:
                out.append(json.loads(x))
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
        return out


class LiveReport:
    """Prints the coordinator's decisions and the trainer's notable events as they happen,
    and a progress line every ``period`` seconds while it trains."""

    def __init__(
        self,
        say: Callable[[str], None],
        t_start: float,
        journal: Path,
        checkpoints: Path,
        steps: int,
        period: float = 5.0,
    ) -> None:
        self._row = journal_row
        self.say = say
        self.t_start = t_start
        self.journal = JsonTail(journal)
        self.checkpoints = checkpoints
        self.steps = steps
        self.period = period
        self.next_progress = time.monotonic() + period
        self.step = 0
        self.slices: list[int] | None = None
        self.last_shown: tuple[int, int | None] | None = None
        self.quiet_until = 0.0

    def line(self, t: float, text: str) -> None:
        self.say(fit(f"  +{t - self.t_start:7.3f}s  ", text))

    def trainer_event(self, ev: dict[str, Any]) -> None:
        if ev.get("kind") == "step":
            self.step = max(self.step, int(ev["step"]))
            self.slices = ev.get("slices", self.slices)
            return
        text = trainer_row(ev)
        if text is not None:
            self.line(float(ev.get("t", time.time())), text)

    def poll(self) -> None:
        for j in self.journal.read():
            text = self._row(j)
            if text is not None:
                self.line(float(j["time"]), text)
        now = time.monotonic()
        if now < self.next_progress:
            return
        self.next_progress = now + self.period
        done = committed_steps(self.checkpoints)
        shown = (self.step, done[-1] if done else None)
        if shown == self.last_shown and now < self.quiet_until:
            return  # nothing moved: say so only every few periods
        self.last_shown, self.quiet_until = shown, now + 3 * self.period
        on = f" on slices {','.join(map(str, self.slices))}" if self.slices else ""
        what = (
            "waiting for the trainer's first step (JAX start-up)"
            if self.step == 0 and not self.slices
            else f"step {self.step}/{self.steps}{on}"
        )
        self.line(time.time(), f"[progress] {what}; committed {shown[1] if done else 'none'}")


# -- one run, start to end -------------------------------------------------------------


def drive(demo: Any) -> tuple[dict[str, Any], int | None]:
    """Start the job, run it to its end, stop every process; the summary and, when a stop signal
    (SIGINT, SIGTERM, SIGHUP) ended it, the exit code 128 + the signal. A SetupError raised while starting
    passes through once every process is stopped."""
    catch_stop_signals()
    stopped: int | None = None
    try:
        demo.start()
        if not demo.ns.quiet:
            demo.report_live()
        demo.run()
    except Interrupted as e:
        stopped = e.exit_code
        print(f"elastic-sidecar demo: {e}: stopping every process of the demo", file=sys.stderr, flush=True)
    finally:
        with signals_deferred() as seen:
            summary = demo.finish(interrupted=stopped is not None)
        if seen and stopped is None:
            stopped = 128 + seen[0]
    return summary, stopped


def preflight(ns: argparse.Namespace, defaults: tuple[str, ...], kinds: tuple[str, ...]) -> list[FaultSpec]:
    """The checks before anything starts; a ValueError (SetupError among them) names the problem."""
    check_flags(ns)
    faults = resolve_faults(ns, defaults, kinds, lambda msg: print(msg, file=sys.stderr))
    if ns.min_slices is not None and ns.min_slices != -1 and not 1 <= ns.min_slices <= ns.slices:
        raise ValueError(f"--min-slices must be -1 or between 1 and --slices={ns.slices}, got {ns.min_slices}")
    if ns.admin_token_file is not None:
        read_token_file(ns.admin_token_file, "--admin-token-file")
    if ns.admin_address and not ns.admin_token_file and not is_loopback(ns.admin_address):
        raise ValueError(f"--admin-address {ns.admin_address} is not a loopback address: give --admin-token-file")
    check_port_free("--admin-address", ns.admin_address)
    check_port_free("--http-address", ns.http_address)
    return faults


def finish_line(demo: Any, stopped: int | None) -> int | None:
    """The exit code of a demo that was stopped or failed (None: the job's own), with one line
    on stderr saying why."""
    if stopped is not None:
        return stopped
    if demo.failure is not None:
        text, code = demo.failure
        print(fit("elastic-sidecar demo: failed: ", text), file=sys.stderr)
        return code if code > 0 else 1
    why = demo.trainer_failure()
    if why:
        print(fit("elastic-sidecar demo: ", why), file=sys.stderr)
    return None
