"""What the coordinator remembers across a restart of its own process, and the rule for it.

**The rule (write-ahead).** A decision's new state is made durable here
*before* any of its actions runs (see ``Coordinator._decision_loop``). The
state is the record of intent: everything that a restarted coordinator must
carry on with, and everything it must send again, can be read from it:

* ``phase`` (FAILED with its exit code, for the same JobSet restart attempt),
  ``generation``, the policy the job runs with (trainer settings adopted at
  start included), ``retries_used``;
* the pending hold (``hold_*``) or the unacknowledged resume
  (``trainer.resume_pending``): sent again when the trainer re-attaches;
* an operator hold, drains and drains planned for a later window (with their
  notices' times), slice errors and
  the newest notice time per node: a restart neither lifts a drain nor grows
  back onto a lost slice nor forgets that a notice was already handled;
* the hosts it knew with their incarnation, node and node pool (the node
  map), which get a rejoin grace, so a restart never judges anyone lost;
* the trainer's committed step and step in memory.

What is *not* kept is re-learnt from the participants: live links,
heartbeats, step timings (a step count is not intent: it is written only
along with something that is), and, if this file is gone altogether, the
trainer's and the workers' own reports (generation, slices, held step;
:mod:`agent.core.decide`).

Times in the state are on the decision clock (``time.monotonic()``); here they
are stored as wall-clock seconds and mapped back on restore. Writes are
atomic: temp file, fsync, rename, fsync of the directory, and bounded in time
(:class:`BoundedWriter`: a write that hangs counts as failed). A file that cannot
be read is moved aside (``state.json.unreadable-<time>``) and the coordinator
starts as if it had none, saying so; it never crash-loops on it.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent import log as logmod
from agent.core.model import Drain, HostRecord, Phase, Policy, State, TrainerView, _frozen

log = logmod.get("coordinator")

VERSION = 2
"""Version 1 (before the write-ahead rule) is still read; older or newer is not."""

INTENT_FIELDS = (
    "phase",
    "generation",
    "active",
    "hosts",
    "slice_errors",
    "trainer_errors",
    "lost_incarnations",
    "drains",
    "planned",
    "notice_times",
    "operator_hold",
    "expected_rejoin",
    "retries_used",
    "hold_flush",
    "hold_snapshot",
    "hold_prepare_wait",
    "hold_reason",
    "hold_down",
    "exit_code",
    "policy",
)
TRAINER_INTENT_FIELDS = ("committed_step", "resume_pending", "generation", "active", "surviving", "step_in_memory")


def intent_changed(a: State, b: State) -> bool:
    """Whether ``b`` carries intent that ``a`` does not (a write is due).

    Unchanged parts of a state are shared between states, so this is mostly
    identity checks: cheap even with 10,000 hosts on record.
    """
    if a is b:
        return False
    for f in INTENT_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        if x is not y and x != y:
            return True
    ta, tb = a.trainer, b.trainer
    return any(getattr(ta, f) != getattr(tb, f) for f in TRAINER_INTENT_FIELDS)


def _wall(t: float | None, offset: float) -> float | None:
    return None if t is None else round(t + offset, 6)


def snapshot(state: State, *, epoch: int = 0, restart_attempt: int = 0, offset: float | None = None) -> dict[str, Any]:
    """The persisted form of a state. ``offset`` maps the decision clock to wall-clock seconds."""
    off = time.time() - time.monotonic() if offset is None else offset
    head = _head(state, epoch, restart_attempt, off)
    head["hosts"] = [_host(s, h, r, off) for (s, h), r in sorted(state.hosts.items())]
    return head


def _head(state: State, epoch: int, restart_attempt: int, off: float) -> dict[str, Any]:
    """Everything in a snapshot but its hosts (see :class:`Renderer`: the hosts are most of the file)."""
    p = state.policy
    t = state.trainer
    return {
        "version": VERSION,
        "epoch": epoch,
        "restart_attempt": restart_attempt,
        "written_at": round(time.monotonic() + off, 3),
        "phase": str(state.phase),
        "exit_code": state.exit_code,
        "generation": state.generation,
        "policy": {
            "elastic_min_slice_count": p.elastic_min_slice_count,
            "elastic_timeout_seconds": p.elastic_timeout_seconds,
            "elastic_max_retries": p.elastic_max_retries,
        },
        "active": sorted(state.active),
        "retries_used": state.retries_used,
        "operator_hold": state.operator_hold,
        "hold_flush": state.hold_flush,
        "hold_snapshot": state.hold_snapshot,
        "hold_prepare_wait": state.hold_prepare_wait,
        "hold_reason": state.hold_reason,
        "hold_down": sorted(state.hold_down),
        # A restore expects every host on record back (``_restore``), so only the others are written:
        # after a restart the hosts still awaited would otherwise be a second copy of the host list.
        "expected_rejoin": [list(k) for k in state.expected_rejoin.missing_from(state.hosts)],
        "slice_errors": {str(s): _wall(v, off) for s, v in sorted(state.slice_errors.items())},
        "trainer_errors": {str(s): _wall(v, off) for s, v in sorted(state.trainer_errors.items())},
        "lost_incarnations": [[s, h, inc] for (s, h), inc in sorted(state.lost_incarnations.items())],
        "drains": {str(s): _drain_record(d, off) for s, d in sorted(state.drains.items())},
        "planned": {str(s): _drain_record(d, off) for s, d in sorted(state.planned.items())},
        "notice_times": dict(sorted(state.notice_times.items())),
        "trainer": {
            "generation": t.generation,
            "committed_step": t.committed_step,
            "last_step": t.last_step,
            "step_in_memory": t.step_in_memory,
            "active": sorted(t.active),
            "surviving": sorted(t.surviving),
            "resume_pending": t.resume_pending,
        },
    }


def _host(s: int, h: int, r: HostRecord, off: float) -> dict[str, Any]:
    return {
        "slice": s,
        "host": h,
        "incarnation": r.incarnation,
        "node": r.node,
        "node_pool": r.node_pool,
        "registered_at": _wall(r.registered_at, off),
        "healthy": r.healthy,
        "settled": r.settled,
        "away": r.away_since is not None,
    }


OFFSET_TOLERANCE_SECONDS = 0.5
"""How far the wall clock may drift from the decision clock before :class:`Renderer` renders every host afresh.

Every time in one file is on the same offset, so their distances stay exact; only where the whole file
sits on the wall clock may be off by this much, which moves a restore's rejoin and phase deadlines by
at most as much (and :func:`_rebase` clamps it anyway). A render from nothing holds the GIL for under
half a second at 25,000 hosts (docs/design.md): NTP's slew (at most 500 ppm) reaches
0.5 s in no less than 1,000 s, a stepped clock at once."""


class Renderer:
    """Renders states to the state file's bytes, rendering again only the slices whose hosts changed.

    The hosts are most of the file (about 175 bytes each: 1.75 MB at 10,000 hosts). Rendering them all on
    every write cost about 75 ms of Python at 10,000 hosts (holding the GIL, so the event loop stalled
    with it), and during a registration storm every group commit that adds a host writes the file.
    A state shares every slice whose hosts did not change with the state before it
    (:class:`agent.core.model.Hosts` keeps one dict per slice, never mutated once held), so a slice
    seen before (the same dict) keeps its rendered block; in a slice that changed, a record seen before
    (the same object: records are immutable) keeps its line. The lines use one wall-clock offset, the
    one of the first render, until the wall clock drifts from it by more than
    :data:`OFFSET_TOLERANCE_SECONDS` (a stepped or slewed clock): then everything is rendered again
    with the new one, so every time in one file is on one offset, as :func:`_rebase` needs. The file
    reads back as :func:`snapshot`'s dict, hosts one to a line. Not thread-safe: one write at a time
    (:class:`BoundedWriter` runs them so).
    """

    def __init__(self) -> None:
        self._offset: float | None = None
        self._blocks: dict[int, tuple[Mapping[int, HostRecord], bytes]] = {}
        """Slice -> (the hosts' dict it was rendered from, compared by identity; its lines joined)."""
        self._lines: dict[tuple[int, int], tuple[HostRecord, bytes]] = {}
        """(slice, host) -> (the record it was rendered from, compared by identity; its line)."""

    def render(self, state: State, *, epoch: int = 0, restart_attempt: int = 0, offset: float | None = None) -> bytes:
        """The file's bytes (:meth:`chunks` joined)."""
        return b"".join(self.chunks(state, epoch=epoch, restart_attempt=restart_attempt, offset=offset))

    def chunks(
        self, state: State, *, epoch: int = 0, restart_attempt: int = 0, offset: float | None = None
    ) -> list[bytes]:
        """The file's bytes in a few pieces, for :func:`write` (the hosts' piece is megabytes: not copied again)."""
        off = time.time() - time.monotonic() if offset is None else offset
        if self._offset is None or abs(off - self._offset) > OFFSET_TOLERANCE_SECONDS:
            self._offset, self._blocks, self._lines = off, {}, {}
        off = self._offset
        by_slice = state.hosts.by_slice()
        seen, lines = self._blocks, self._lines
        blocks: dict[int, tuple[Mapping[int, HostRecord], bytes]] = {}
        for s in sorted(by_slice):
            of = by_slice[s]
            if not of:
                continue
            block = seen.get(s)
            if block is None or block[0] is not of:
                rendered = []
                for h in sorted(of):
                    r = of[h]
                    line = lines.get((s, h))
                    if line is None or line[0] is not r:
                        line = lines[(s, h)] = (r, json.dumps(_host(s, h, r, off), separators=(",", ":")).encode())
                    rendered.append(line[1])
                block = (of, b",\n  ".join(rendered))
            blocks[s] = block
        self._blocks = blocks  # (lines of hosts gone stay cached: at most one per host of the job)
        head = json.dumps(_head(state, epoch, restart_attempt, off), indent=1)
        # ``head`` ends with "\n}": the hosts go in as its last key.
        if not blocks:
            return [head[:-2].encode(), b',\n "hosts": []\n}\n']
        body = b",\n  ".join(b for _, b in blocks.values())
        return [head[:-2].encode(), b',\n "hosts": [\n  ', body, b"\n ]\n}\n"]


def _drain_record(d: Drain, off: float) -> dict[str, Any]:
    return {
        "since": _wall(d.since, off),
        "kind": d.kind,
        "source": d.source,
        "reason": d.reason,
        "deadline": _wall(d.deadline, off),
        "node": d.node,
        "starts_at": _wall(d.starts_at, off),
        "ends_at": _wall(d.ends_at, off),
        "replace": d.replace,
    }


def _drain(d: Mapping[str, Any], off: float, now: float) -> Drain:
    return Drain(
        since=_mono(d["since"], off) or now,
        kind=str(d["kind"]),
        source=str(d["source"]),
        reason=str(d.get("reason", "")),
        deadline=_mono(d.get("deadline"), off),
        node=str(d.get("node", "")),
        starts_at=_mono(d.get("starts_at"), off),
        ends_at=_mono(d.get("ends_at"), off),
        replace=d.get("replace") is True,
    )


def write(path: Path, data: Mapping[str, Any] | bytes | list[bytes]) -> None:
    """Write ``data`` (a :func:`snapshot`, or :class:`Renderer`'s bytes or chunks) to ``path`` atomically and
    durably; OSError on failure."""
    if isinstance(data, (bytes, list)):
        pieces = [data] if isinstance(data, bytes) else data
    else:
        pieces = [json.dumps(data, indent=1).encode()]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                f.write(piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class WriteHung(OSError):
    """A state write did not return within its bound (a stalled disk): it counts as failed."""


class BoundedWriter:
    """Runs state writes with a time bound, one at a time, on a thread of their own.

    A write that blocks (a stalled disk, an NFS server gone) is treated like a
    failed one once ``bound`` passes: :meth:`run` raises :class:`WriteHung` and
    the caller carries on (not durable). The hung write stays outstanding on its
    daemon thread (a thread cannot be cancelled, and a daemon one never keeps
    the process from exiting); until it returns, every further :meth:`run`
    fails at once instead of starting another write, so writes never pile up
    behind a stuck disk nor land out of order.
    """

    def __init__(self) -> None:
        self._pending: asyncio.Future[None] | None = None
        self._started = 0.0

    @property
    def hung_for(self) -> float:
        """Seconds the outstanding write has been running (0.0: none outstanding)."""
        if self._pending is None or self._pending.done():
            return 0.0
        return time.monotonic() - self._started

    async def run(self, fn: Callable[..., None], *args: Any, bound: float) -> None:
        """``fn(*args)`` on a thread; OSError as ``fn`` raises it, or :class:`WriteHung`."""
        pending = self._pending
        if pending is not None:
            if not pending.done():
                raise WriteHung(
                    errno.ETIMEDOUT,
                    f"an earlier state write has not returned after {self.hung_for:.1f} s (a stalled disk?); "
                    "no new write starts until it does",
                )
            if not pending.cancelled():
                pending.exception()  # a late result of a write already counted as failed
            self._pending = None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if fut.done():
                return
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

        def work() -> None:
            error: BaseException | None = None
            try:
                fn(*args)
            except BaseException as e:
                error = e
            try:
                loop.call_soon_threadsafe(settle, error)
            except RuntimeError:
                pass  # the loop is gone (the process is stopping)

        self._pending, self._started = fut, time.monotonic()
        threading.Thread(target=work, name="state-write", daemon=True).start()
        try:
            await asyncio.wait_for(asyncio.shield(fut), bound)
        except TimeoutError:
            raise WriteHung(
                errno.ETIMEDOUT, f"the state write did not return within {bound:.1f} s (a stalled disk?)"
            ) from None
        self._pending = None


class StateFileError(ValueError):
    """The file exists but cannot be used; the message says why and what was done."""


@dataclass(frozen=True)
class Restored:
    state: State
    epoch: int
    """The epoch of the coordinator that wrote the file (0: none)."""
    note: str
    """One sentence for the log: what was restored and how."""


def read(path: Path) -> dict[str, Any]:
    """The file's contents as a version-2 dict; StateFileError when it is unreadable."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StateFileError(f"state file {path} cannot be read ({e})") from e
    if not isinstance(raw, dict):
        raise StateFileError(f"state file {path} holds {type(raw).__name__}, expected a JSON object")
    version = raw.get("version")
    if version == 1:
        return _from_v1(raw)
    if version != VERSION:
        raise StateFileError(f"state file {path} has version {version!r}; this coordinator reads 1 and {VERSION}")
    return raw


def _from_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 1 kept the phase, generation, slices, retries, host keys and steps."""
    return {
        "version": VERSION,
        "epoch": 0,
        "restart_attempt": 0,
        "phase": raw.get("phase"),
        "exit_code": None,
        "generation": raw.get("generation"),
        "active": raw.get("active", []),
        "retries_used": raw.get("retries_used", 0),
        "hold_flush": raw.get("hold_flush", False),
        "hold_reason": raw.get("hold_reason", ""),
        "hold_down": raw.get("hold_down", []),
        "hosts": [],
        "expected_rejoin": raw.get("hosts", []),
        "trainer": {"committed_step": raw.get("committed_step", -1), "last_step": raw.get("last_step", 0)},
    }


def restore(
    raw: Mapping[str, Any], fresh: State, now: float, *, restart_attempt: int = 0, offset: float | None = None
) -> Restored:
    """Merge a read file into a freshly initialised state (whose policy comes from the command line).

    * RUNNING stays RUNNING; HOLDING repeats its hold when the trainer
      re-attaches; WAITING keeps waiting (a pending resume goes out again).
      In each, every known host gets ``rejoin_grace_seconds`` before anyone is
      judged lost, and the phase deadline starts again from now.
    * FAILED or COMPLETED of the same JobSet restart attempt stays so (the
      coordinator tells a trainer that attaches, then exits with the same
      code). From an earlier attempt, the job starts fresh with its retries
      back (xpk restarted it on exit 42), but its generation never goes
      backwards and its committed step is kept.
    """
    off = _rebase(raw, now) if offset is None else offset
    try:
        return _restore(raw, fresh, now, restart_attempt, off)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise StateFileError(f"state file is malformed: {type(e).__name__}: {e}") from e


MAX_DOWNTIME_SECONDS = 600.0
"""Longest time between a file's write and its restore that restoring believes (see :func:`_rebase`)."""


def _rebase(raw: Mapping[str, Any], now: float) -> float:
    """The offset that maps the file's wall-clock times onto this process's decision clock.

    Times in one file were all written with one offset, so their distances from
    ``written_at`` are exact; only how long ago the file was written depends on
    the wall clock, which may have been stepped across the restart (NTP, a VM
    migration, a wrong RTC). So the write is placed ``time.time() - written_at``
    seconds ago, clamped to ``[0, MAX_DOWNTIME_SECONDS]``: a clock stepped back
    cannot put a recorded time in the future (a loss mark no host could repair,
    a host registered after every later mark), nor a step forward put them hours
    in the past.
    """
    written = raw.get("written_at")
    if not isinstance(written, (int, float)):
        return time.time() - time.monotonic()
    ago = min(max(time.time() - float(written), 0.0), MAX_DOWNTIME_SECONDS)
    return float(written) - (now - ago)


def _mono(t: Any, off: float) -> float | None:
    return None if t is None else float(t) - off


def _restore(raw: Mapping[str, Any], fresh: State, now: float, attempt: int, off: float) -> Restored:
    policy = _saved_policy(raw, fresh.policy)
    phase = Phase(raw["phase"])
    generation = int(raw["generation"])
    epoch = int(raw.get("epoch") or 0)
    tr = raw.get("trainer") or {}
    committed = int(tr.get("committed_step", -1))
    same_attempt = int(raw.get("restart_attempt") or 0) == attempt
    base = replace(fresh, policy=policy, generation=generation)
    base = replace(base, trainer=replace(base.trainer, committed_step=committed, last_step=int(tr.get("last_step", 0))))
    if phase.terminal and not same_attempt:
        return Restored(
            base,
            epoch,
            f"the file is from an earlier restart attempt ({phase}); starting fresh at generation {generation}, "
            f"committed step {committed}",
        )
    if phase.terminal:
        code = raw.get("exit_code")
        done = replace(
            base,
            phase=phase,
            exit_code=int(code) if code is not None else None,
            deadline=None,
            retries_used=int(raw.get("retries_used", 0)),
        )
        return Restored(done, epoch, f"the job already {'failed' if phase == Phase.FAILED else 'completed'}")
    return _in_phase(_live_state(raw, base, now, off), phase, epoch, now)


def _saved_policy(raw: Mapping[str, Any], policy: Policy) -> Policy:
    """The command line's policy with the trainer settings the job had adopted, where they still fit."""
    saved = raw.get("policy")
    if not saved:
        return policy
    try:
        return policy.with_trainer_settings(
            int(saved["elastic_min_slice_count"]),
            float(saved["elastic_timeout_seconds"]),
            int(saved["elastic_max_retries"]),
        )
    except ValueError:
        return policy  # the file's settings no longer fit this job's shape: the command line's stand


def _live_state(raw: Mapping[str, Any], base: State, now: float, off: float) -> State:
    """The state of a job that had not ended: hosts, errors, drains, the trainer's view and the pending hold."""
    policy = base.policy

    def in_job(s: int, h: int = 0) -> bool:
        return 0 <= s < policy.num_slices and 0 <= h < policy.hosts_per_slice

    hosts = _hosts(raw, in_job, now, off)
    expected = frozenset(hosts) | frozenset(
        (int(s), int(h)) for s, h in raw.get("expected_rejoin", []) if in_job(int(s), int(h))
    )
    errors = {int(s): _mono(v, off) for s, v in (raw.get("slice_errors") or {}).items() if in_job(int(s))}
    named = {int(s): _mono(v, off) for s, v in (raw.get("trainer_errors") or {}).items() if in_job(int(s))}
    drains = {int(s): _drain(d, off, now) for s, d in (raw.get("drains") or {}).items() if in_job(int(s))}
    planned = {int(s): _drain(d, off, now) for s, d in (raw.get("planned") or {}).items() if in_job(int(s))}
    return replace(
        base,
        trainer=_trainer_view(raw.get("trainer") or {}, policy, now),
        active=frozenset(int(s) for s in raw.get("active", [])) & policy.all_slices,
        retries_used=int(raw.get("retries_used", 0)),
        operator_hold=bool(raw.get("operator_hold", False)),
        # The records are kept so that a host that re-registers with the same
        # incarnation is known; they count only once it has.
        hosts=_frozen(hosts),
        slice_errors=_frozen({s: t for s, t in errors.items() if t is not None}),
        trainer_errors=_frozen({s: t for s, t in named.items() if t is not None}),
        lost_incarnations=_frozen(
            {(int(s), int(h)): str(inc) for s, h, inc in raw.get("lost_incarnations", []) if in_job(int(s), int(h))}
        ),
        drains=_frozen(drains),
        planned=_frozen(planned),
        notice_times=_frozen({str(k): float(v) for k, v in (raw.get("notice_times") or {}).items()}),
        expected_rejoin=expected,
        rejoin_deadline=now + policy.rejoin_grace_seconds if expected else None,
        hold_flush=bool(raw.get("hold_flush", False)),
        hold_snapshot=bool(raw.get("hold_snapshot", False)),
        hold_prepare_wait=None if (w := raw.get("hold_prepare_wait")) is None else float(w),
        hold_reason=str(raw.get("hold_reason", "")),
        hold_down=frozenset(int(s) for s in raw.get("hold_down", [])) & policy.all_slices,
    )


def _hosts(
    raw: Mapping[str, Any], in_job: Callable[[int, int], bool], now: float, off: float
) -> dict[tuple[int, int], HostRecord]:
    hosts: dict[tuple[int, int], HostRecord] = {}
    for r in raw.get("hosts", []):
        s, h = int(r["slice"]), int(r["host"])
        if in_job(s, h):
            t_reg = _mono(r.get("registered_at"), off) or 0.0
            hosts[(s, h)] = HostRecord(
                str(r["incarnation"]),
                str(r.get("node", "")),
                str(r.get("node_pool", "")),
                t_reg,
                bool(r.get("healthy", True)),
                t_reg,
                bool(r.get("settled", True)),
                # Its sidecar was away (the host still answered): it stays so until the sidecar is back.
                now if r.get("away") else None,
            )
    return hosts


def _trainer_view(tr: Mapping[str, Any], policy: Policy, now: float) -> TrainerView:
    return TrainerView(
        generation=int(tr.get("generation", 0)),
        committed_step=int(tr.get("committed_step", -1)),
        last_step=int(tr.get("last_step", 0)),
        step_in_memory=int(tr.get("step_in_memory", -1)),
        active=frozenset(int(s) for s in tr.get("active", [])) & policy.all_slices,
        surviving=frozenset(int(s) for s in tr.get("surviving", [])) & policy.all_slices,
        resume_pending=bool(tr.get("resume_pending", False)),
        detached_since=now,
    )


def _in_phase(state: State, phase: Phase, epoch: int, now: float) -> Restored:
    """The restored state in its phase, with the phase's deadline starting again from now."""
    policy = state.policy
    if phase == Phase.STARTING:
        # Not started: nothing to protect; hosts simply register again.
        starting = replace(
            state, phase=Phase.STARTING, hosts=_frozen(), expected_rejoin=frozenset(), rejoin_deadline=None
        )
        return Restored(starting, epoch, "restored a job that had not started yet")
    if phase == Phase.RUNNING:
        return Restored(replace(state, phase=Phase.RUNNING, deadline=None), epoch, "restored a running job")
    if phase == Phase.WAITING:
        waiting = replace(state, phase=Phase.WAITING, deadline=now + policy.elastic_timeout_seconds)
        return Restored(waiting, epoch, "restored a held job waiting for slices")
    flushes = state.hold_flush or state.hold_snapshot  # a trainer that cannot keep the snapshot flushes
    ack = policy.elastic_timeout_seconds + (policy.flush_timeout_seconds if flushes else 0.0)
    holding = replace(state, phase=Phase.HOLDING, deadline=now + ack)
    return Restored(holding, epoch, "restored a pending hold; it is sent again when the trainer attaches")


@dataclass(frozen=True)
class Loaded:
    """What a coordinator found in its state file at start."""

    restored: Restored | None
    """None: no file, or one that could not be used."""
    note: str = ""
    """What happened to the file (restored, unreadable and moved aside, ...); empty: no file."""
    problem: str = ""
    """Set when a file was found but could not be used (it was moved aside)."""


def load(path: Path | None, fresh: State, now: float, restart_attempt: int) -> Loaded:
    """Read and restore ``path`` at start; an unusable file is moved aside and the start goes on without it."""
    if path is None or not path.exists():
        return Loaded(None)
    try:
        restored = restore(read(path), fresh, now, restart_attempt=restart_attempt)
    except StateFileError as e:
        moved = move_aside(path)
        note = f"{e}; moved aside to {moved}" if moved else f"{e}; could not move it aside"
        log.error(
            "state file unusable; starting without it and rebuilding from what the workers and the trainer report",
            state_file=str(path),
            error=str(e),
            moved_to=str(moved) if moved else None,
        )
        return Loaded(None, note, note)
    st = restored.state
    log.info(
        "restored coordinator state: " + restored.note,
        state_file=str(path),
        phase=str(st.phase),
        generation=st.generation,
        active=sorted(st.active),
        epoch_on_file=restored.epoch,
    )
    return Loaded(restored, restored.note)


def move_aside(path: Path) -> Path | None:
    """Rename an unusable state file so that it is kept for a person but no longer read."""
    target = path.with_name(f"{path.name}.unreadable-{int(time.time())}")
    try:
        os.replace(path, target)
    except OSError:
        return None
    return target
