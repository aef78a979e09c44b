"""The decision core's vocabulary: policy, state, events and actions.

Everything here is an immutable value. Sources turn the outside world into
events, :func:`agent.core.decide.decide` turns (state, event, now) into a new
state plus actions, and executors carry the actions out. Nothing in this module
does I/O or reads a clock.
"""

from __future__ import annotations

import enum
import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from agent.constants import EXIT_RESTART, INT32_MAX, INT32_MIN

HostKey = tuple[int, int]
"""(slice, host) of a worker sidecar."""


def _frozen(d: Mapping | None = None) -> Mapping:
    return MappingProxyType(dict(d or {}))


class _BySlice(ABC):
    """What :class:`Hosts` and :class:`HostKeys` share: (slice, host) keys kept as one container of
    hosts per slice, with their count."""

    __slots__ = ("_by_slice", "_len")

    _by_slice: dict[int, Any]
    _len: int

    @classmethod
    def _of(cls, by: dict[int, Any], n: int) -> Any:
        new = object.__new__(cls)
        new._by_slice, new._len = by, n
        return new

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        of = self._by_slice.get(key[0])
        return of is not None and key[1] in of

    def __iter__(self) -> Iterator[HostKey]:
        for s, of in self._by_slice.items():
            for h in of:
                yield (s, h)

    def __len__(self) -> int:
        return self._len

    @staticmethod
    @abstractmethod
    def _less(of: Any, hosts: set[int]) -> Any:
        """A slice's container less ``hosts`` (a new one: containers held are never changed)."""

    def without(self, keys: Iterable[HostKey]) -> Any:
        """The same kind of collection without ``keys`` (those not in it are ignored); copies only the
        slices they touch, each once."""
        drop: dict[int, set[int]] = {}
        for s, h in keys:
            of = self._by_slice.get(s)
            if of is not None and h in of:
                drop.setdefault(s, set()).add(h)
        if not drop:
            return self
        by = dict(self._by_slice)
        n = self._len
        for s, hosts in drop.items():
            rest = self._less(by[s], hosts)
            n -= len(hosts)
            if rest:
                by[s] = rest
            else:
                del by[s]
        return self._of(by, n)


class Hosts(_BySlice, Mapping[HostKey, "HostRecord"]):
    """The hosts on record: an immutable mapping (slice, host) -> record, kept as one dict per slice.

    A change to one host makes a new mapping that copies that slice's dict and the index of slices
    (``hosts_per_slice + num_slices`` entries) and shares every other slice's dict with the old one.
    A flat copy cost 25,000 entries on each of 25,000 registrations (0.6 ms each, most of a
    registration's decision, and quadratic over a registration storm). Shared slice dicts also let a
    reader skip slices that did not change by identity (:class:`agent.durable.statefile.Renderer`). Nothing
    mutates a slice dict once a ``Hosts`` holds it.
    """

    __slots__ = ()

    _by_slice: dict[int, dict[int, HostRecord]]

    def __init__(self, records: Mapping[HostKey, HostRecord] | Iterable[tuple[HostKey, HostRecord]] = ()) -> None:
        by: dict[int, dict[int, HostRecord]] = {}
        pairs = records.items() if isinstance(records, Mapping) else records
        for (s, h), r in pairs:
            by.setdefault(s, {})[h] = r
        self._by_slice = by
        self._len = sum(len(d) for d in by.values())

    def __getitem__(self, key: HostKey) -> HostRecord:
        d = self._by_slice.get(key[0])
        if d is None or key[1] not in d:
            raise KeyError(key)
        return d[key[1]]

    def get(self, key: HostKey, default: HostRecord | None = None) -> HostRecord | None:  # type: ignore[override]
        d = self._by_slice.get(key[0])
        return default if d is None else d.get(key[1], default)

    def items(self) -> list[tuple[HostKey, HostRecord]]:  # type: ignore[override]
        """Every (key, record), slice by slice (a list: walked faster than a view over ``__getitem__``)."""
        return [((s, h), r) for s, d in self._by_slice.items() for h, r in d.items()]

    def slice_records(self, s: int) -> Mapping[int, HostRecord]:
        """Host -> record of one slice (read-only: shared with other mappings)."""
        return MappingProxyType(self._by_slice.get(s, {}))

    def slice_keys(self, s: int) -> Iterable[int]:
        """The hosts of slice ``s`` on record (a live view: read-only)."""
        return self._by_slice.get(s, {}).keys()

    def by_slice(self) -> Mapping[int, Mapping[int, HostRecord]]:
        """Slice -> its hosts' dict, the same object for as long as none of that slice's hosts changes
        (read-only: shared with other mappings)."""
        return MappingProxyType(self._by_slice)

    def with_records(self, changes: Mapping[HostKey, HostRecord]) -> Hosts:
        """A mapping with ``changes`` set (added or replaced); copies only the slices they touch."""
        if not changes:
            return self
        by = dict(self._by_slice)
        n = self._len
        copied: set[int] = set()
        for (s, h), r in changes.items():
            if s not in copied:
                by[s] = dict(by.get(s, ()))
                copied.add(s)
            d = by[s]
            n += h not in d
            d[h] = r
        return Hosts._of(by, n)

    def with_record(self, key: HostKey, record: HostRecord) -> Hosts:
        return self.with_records({key: record})

    @staticmethod
    def _less(of: dict[int, HostRecord], hosts: set[int]) -> dict[int, HostRecord]:
        return {h: r for h, r in of.items() if h not in hosts}

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Hosts):
            if other._by_slice is self._by_slice:
                return True
            if other._len != self._len or other._by_slice.keys() != self._by_slice.keys():
                return False
            return all(d is other._by_slice[s] or d == other._by_slice[s] for s, d in self._by_slice.items())
        if isinstance(other, Mapping):
            return len(other) == self._len and all(other.get(k, _MISSING) == r for k, r in self.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Hosts({dict(self.items())!r})"

    def __reduce__(self) -> tuple[type, tuple[list[tuple[HostKey, HostRecord]]]]:
        return (Hosts, (self.items(),))


_MISSING = object()


class HostKeys(_BySlice, AbstractSet[HostKey]):
    """An immutable set of (slice, host), kept as one frozenset per slice: removing one key copies that
    slice's set, not all keys (the hosts a restarted coordinator awaits are every host, and each of
    their re-registrations removes one: a flat 25,000-key copy each time was quadratic)."""

    __slots__ = ()

    _by_slice: dict[int, frozenset[int]]

    def __init__(self, keys: Iterable[HostKey] = ()) -> None:
        by: dict[int, set[int]] = {}
        for s, h in keys:
            by.setdefault(s, set()).add(h)
        self._by_slice = {s: frozenset(hs) for s, hs in by.items()}
        self._len = sum(len(hs) for hs in by.values())

    def slices(self) -> frozenset[int]:
        """The slices with a key in the set."""
        return frozenset(self._by_slice)

    def missing_from(self, hosts: Hosts) -> list[HostKey]:
        """The keys with no record in ``hosts``, sorted (set operations per slice, in C)."""
        return [
            (s, h) for s in sorted(self._by_slice) for h in sorted(self._by_slice[s].difference(hosts.slice_keys(s)))
        ]

    @staticmethod
    def _less(of: frozenset[int], hosts: set[int]) -> frozenset[int]:
        return of - hosts

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HostKeys):
            if other._by_slice is self._by_slice:
                return True
            return other._len == self._len and other._by_slice == self._by_slice
        if isinstance(other, AbstractSet):
            return len(other) == self._len and all(k in other for k in self)
        return NotImplemented

    def __hash__(self) -> int:
        return self._hash()

    def __repr__(self) -> str:
        return f"HostKeys({sorted(self)!r})"

    def __reduce__(self) -> tuple[type, tuple[list[HostKey]]]:
        return (HostKeys, (sorted(self),))


# --------------------------------------------------------------------------
# policy
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """What the job looks like and how elastic it may be.

    The three ``elastic_*`` settings keep MaxText's names and meanings
    (``src/maxtext/configs/base.yml``): ``elastic_min_slice_count`` of -1 waits
    for every slice, k continues on at least k; ``elastic_timeout_seconds``
    bounds one wait for enough slices; ``elastic_max_retries`` is read by its
    name: N allows N recoveries from failures (N + 1 attempts, the first
    included), and the failure after them is terminal. A grow, a drain or a
    re-synchronisation spends none. (pathwaysutils' ``ElasticRetryLimit(N)``
    allows N attempts including the first, grows included; with the sidecar's
    hook MaxText's loop never applies that limit: see docs/maxtext.md. One
    definition everywhere: README.md, ``--help`` and this core.)
    """

    num_slices: int
    hosts_per_slice: int = 1
    elastic_min_slice_count: int = -1
    elastic_timeout_seconds: float = 300.0
    elastic_max_retries: int = 10
    rejoin_grace_seconds: float = 10.0
    """After a coordinator restart, how long known hosts get to re-register: counted from the restart,
    and again from each awaited host's re-registration while they keep coming back
    (:func:`agent.core.membership.rejoin_deadline_after`)."""
    start_timeout_seconds: float = 600.0
    """How long a fresh job waits for its slices and trainer to come up (at least
    ``elastic_timeout_seconds``): process and pod start-up is not a slice wait."""
    flush_timeout_seconds: float = 600.0
    """How long a flush may take. A hold that flushes is acknowledged within
    ``elastic_timeout_seconds + flush_timeout_seconds``: MaxText uses
    ``elastic_timeout_seconds`` only to wait for slices, never for a save."""
    settle_seconds: float = 1.0
    """A slice that was lost counts as back only once each of its lost hosts has
    stayed registered and healthy this long (a new incarnation, or the same
    process back from a loss that is not a flap: see ``flap_losses``)."""
    flap_losses: int = 2
    """A host declared lost this many times within ``flap_window_seconds`` is
    flapping: the same process coming back repairs nothing any more, only a new
    incarnation (a replacement) does."""
    flap_window_seconds: float = 600.0
    unnamed_error_wait_seconds: float = 3.0
    """After a slice error that names no slice, a hold does not resume on the same
    slices for this long: the host behind it (hung, or dying) is usually found by
    then (heartbeat timeout plus a check), within the recovery already counted,
    instead of resuming and spending a second one on the same failure."""
    hang_step_factor: float = 20.0
    """RUNNING with no step report for this many times the median step time
    (and at least ``hang_min_seconds``) is a suspected hang."""
    hang_min_seconds: float = 60.0
    notice_lead_seconds: float = 120.0
    """How long before an announced disruption starts its slice is drained: enough
    for the trainer to reach a step boundary and flush a checkpoint."""
    trainer_processes: int = 1
    """JAX processes of the trainer. Above 1 the job is multi-controller (one
    process per host, joined by ``jax.distributed``): it cannot shrink, so a
    lost slice means abort-and-restart (exit 42), after a collective flush when
    the loss was announced. The coordinator presents the processes to the core
    as one trainer (:mod:`agent.trainer_group`)."""
    straggler_drain_interval_seconds: float = 3600.0
    """At most one straggler drain in this long unless an operator asks (docs/stragglers.md): a
    detector that is wrong must not drain the job down a slice at a time."""
    straggler_replace: bool = False
    """``--straggler-replace``: once the job runs without a straggler it drained, cordon that slice's nodes
    and delete its pods (:class:`ReplaceSlice`), so the JobSet recreates them elsewhere."""

    def __post_init__(self) -> None:
        # First, every field a number the checks below can compare: NaN fails no comparison
        # (``nan <= 0`` is false), and a count must fit the wire's int32 fields (protos/).
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "float" and not (isinstance(v, (int, float)) and math.isfinite(v)):
                raise ValueError(f"{f.name} must be a finite number, got {v!r}")
            if f.type == "int" and not (isinstance(v, int) and INT32_MIN <= v <= INT32_MAX):
                raise ValueError(f"{f.name} must be a whole number from {INT32_MIN} to {INT32_MAX}, got {v!r}")
        for name in ("flush_timeout_seconds", "hang_step_factor", "hang_min_seconds", "start_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.flap_losses < 1:
            raise ValueError(f"flap_losses must be >= 1, got {self.flap_losses}")
        if self.flap_window_seconds < 0 or self.unnamed_error_wait_seconds < 0:
            raise ValueError(
                f"flap_window_seconds and unnamed_error_wait_seconds must be >= 0, got "
                f"{self.flap_window_seconds} and {self.unnamed_error_wait_seconds}"
            )
        if self.settle_seconds < 0 or self.rejoin_grace_seconds < 0:
            raise ValueError(
                f"settle_seconds and rejoin_grace_seconds must be >= 0, got {self.settle_seconds} and "
                f"{self.rejoin_grace_seconds}"
            )
        if self.num_slices < 1:
            raise ValueError(f"num_slices must be >= 1, got {self.num_slices}")
        if self.hosts_per_slice < 1:
            raise ValueError(f"hosts_per_slice must be >= 1, got {self.hosts_per_slice}")
        k = self.elastic_min_slice_count
        if k != -1 and not 1 <= k <= self.num_slices:
            raise ValueError(
                f"elastic_min_slice_count must be -1 (all slices) or between 1 and "
                f"num_slices={self.num_slices}, got {k}"
            )
        if self.elastic_timeout_seconds <= 0:
            raise ValueError(f"elastic_timeout_seconds must be > 0, got {self.elastic_timeout_seconds}")
        if self.elastic_max_retries < 1:
            raise ValueError(f"elastic_max_retries must be >= 1, got {self.elastic_max_retries}")
        if self.trainer_processes < 1:
            raise ValueError(f"trainer_processes must be >= 1, got {self.trainer_processes}")
        if not self.straggler_drain_interval_seconds > 0:
            raise ValueError(
                f"straggler_drain_interval_seconds must be > 0, got {self.straggler_drain_interval_seconds}"
            )
        if not self.notice_lead_seconds >= 0:
            raise ValueError(f"notice_lead_seconds must be >= 0, got {self.notice_lead_seconds}")

    @property
    def multi_controller(self) -> bool:
        """One JAX process per host: every slice is needed, a lost one ends the attempt (exit 42)."""
        return self.trainer_processes > 1

    @property
    def max_recoveries(self) -> int:
        """Recoveries from failures allowed: ``elastic_max_retries`` of them (see the class docstring)."""
        return self.elastic_max_retries

    @property
    def min_slices(self) -> int:
        """Fewest slices training may run on (all of them for a multi-controller job)."""
        k = self.elastic_min_slice_count
        return self.num_slices if k == -1 or self.multi_controller else k

    @property
    def all_slices(self) -> frozenset[int]:
        return frozenset(range(self.num_slices))

    def with_trainer_settings(self, min_slice_count: int, timeout_seconds: float, max_retries: int) -> Policy:
        """The policy after adopting the trainer's own elastic flags."""
        from dataclasses import replace

        return replace(
            self,
            elastic_min_slice_count=min_slice_count,
            elastic_timeout_seconds=timeout_seconds,
            elastic_max_retries=max_retries,
        )


# --------------------------------------------------------------------------
# state
# --------------------------------------------------------------------------


class Phase(enum.StrEnum):
    """Where the job is in its recovery loop; see :mod:`agent.core.decide`."""

    STARTING = "starting"
    RUNNING = "running"
    HOLDING = "holding"
    WAITING = "waiting"
    FAILED = "failed"
    COMPLETED = "completed"

    @property
    def terminal(self) -> bool:
        return self in (Phase.FAILED, Phase.COMPLETED)


class ResumeSource(enum.StrEnum):
    MEMORY = "memory"
    CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class HostRecord:
    """A registered, live worker sidecar."""

    incarnation: str
    node: str = ""
    node_pool: str = ""
    registered_at: float = 0.0
    healthy: bool = True
    healthy_since: float = 0.0
    settled: bool = False
    """Healthy since ``healthy_since`` for at least ``settle_seconds`` (set by the core on a later event)."""
    away_since: float | None = None
    """Its sidecar's stream closed while the host's Pathways worker still
    answered the coordinator's own check: the host is up, its sidecar is
    restarting (or its stream blipped). A new incarnation replaces it with no loss."""
    registration: int = 0
    """Which registration (one Join stream; the coordinator numbers them) this record is:
    an observation about another one (an older stream's end, its probe result) is stale."""
    rival: str = ""
    """The incarnation this one took the host over from without a loss (a sidecar restart, or a second
    sidecar claiming the host): that incarnation registering again means two sidecars are flapping."""


@dataclass(frozen=True)
class TrainerView:
    """What the coordinator knows of the trainer process."""

    attached: bool = False
    generation: int = 0
    step_in_memory: int = -1
    last_step: int = 0
    committed_step: int = -1
    active: frozenset[int] = frozenset()
    """Slices the trainer's mesh spans."""
    surviving: frozenset[int] = frozenset()
    """Slices of that mesh that stayed up throughout: its replicas in memory."""
    resume_pending: bool = False
    """A ResumeTrainer went out that the trainer has not acknowledged; repeated when it re-attaches."""
    held: bool = False
    """The trainer said (hello or acknowledgement) it is blocked in a hold."""
    detached_since: float | None = None
    """When its link closed (None while attached or before it ever attached)."""
    last_step_at: float | None = None
    """When the newest step report arrived (not persisted: a step count is not intent)."""
    step_seconds: tuple[float, ...] = ()
    """Durations of the newest steps, for the median in hang suspicion."""
    saves: tuple[tuple[int, float], ...] = ()
    """(bytes, seconds) of the trainer's newest timed flushes: what the next flush is expected to take
    (:func:`agent.core.drains.expected_flush`). Not persisted: after a restart it is unknown until one."""


@dataclass(frozen=True)
class Drain:
    """Why a slice is kept out of training although its hosts are up."""

    since: float
    kind: str
    source: str
    reason: str
    deadline: float | None = None
    node: str = ""
    starts_at: float | None = None
    """When the announced disruption begins (decision clock), if the notice said."""
    ends_at: float | None = None
    """When the announced disruption is over (decision clock), if the notice said: its window's end."""
    replace: bool = False
    """A straggler drain under ``--straggler-replace`` whose :class:`ReplaceSlice` has not gone out yet: it
    goes out once the trainer resumed without the slice (:func:`agent.core.stragglers.replacements`)."""


@dataclass(frozen=True)
class State:
    policy: Policy
    phase: Phase
    generation: int = 0
    active: frozenset[int] = frozenset()
    """Slices the trainer runs on (RUNNING) or last ran on."""
    hosts: Hosts = field(default_factory=Hosts)
    """Any mapping given here is kept as :class:`Hosts` (``__post_init__``)."""
    lost_incarnations: Mapping[HostKey, str] = field(default_factory=_frozen)
    """The incarnation each host had when it was declared lost: that process
    coming back (a hung host waking up) repairs only if it is not flapping."""
    host_losses: Mapping[HostKey, tuple[float, ...]] = field(default_factory=_frozen)
    """When each host was declared lost, within ``flap_window_seconds`` (newest last)."""
    unnamed_error_until: float | None = None
    """A slice error named no slice: no resume on unchanged slices before this time."""
    slice_errors: Mapping[int, float] = field(default_factory=_frozen)
    """Slice -> when the trainer reported it lost or a host of it was lost; cleared by a replacement host."""
    trainer_errors: Mapping[int, float] = field(default_factory=_frozen)
    """Slice -> when the trainer named it in a slice error. The trainer does not say which host failed,
    so this mark is cleared only once every host of the slice has registered since and settled."""
    drains: Mapping[int, Drain] = field(default_factory=_frozen)
    """Slices excluded by a notice or an operator; a replacement host lifts it."""
    planned: Mapping[int, Drain] = field(default_factory=_frozen)
    """Drains announced for later: ``since`` is when each begins (its window's start
    minus ``notice_lead_seconds``); a Tick at or after it moves it to ``drains``."""
    notice_times: Mapping[str, float] = field(default_factory=_frozen)
    """Newest event time seen per node or node pool, to drop out-of-order notices."""
    operator_hold: bool = False
    """An operator asked to hold: no resume until an operator resumes."""
    expected_rejoin: HostKeys = field(default_factory=HostKeys)
    """Hosts known before a coordinator restart that have not re-registered yet."""
    rejoin_deadline: float | None = None
    """End of the rejoin grace: until then no host in ``expected_rejoin`` is judged lost."""
    retries_used: int = 0
    deadline: float | None = None
    """Phase deadline: start, hold acknowledgement, wait for slices, rejoin grace."""
    hold_flush: bool = False
    hold_snapshot: bool = False
    """The pending hold asked for an in-memory snapshot at its step instead of a flush (a drain from memory)."""
    hold_prepare_wait: float | None = None
    """The pending hold's bound on training on for the next mesh's program (:class:`HoldTrainer`)."""
    hold_reason: str = ""
    hold_down: frozenset[int] = frozenset()
    trainer: TrainerView = TrainerView()
    exit_code: int | None = None
    straggler_drained_at: float | None = None
    """When the straggler detector last drained a slice (decision clock). Not persisted: a restarted
    coordinator still sees a straggler drain that stands in ``drains``."""

    def __post_init__(self) -> None:
        # Any mapping or set given is kept in the form whose one-host changes copy one slice.
        if not isinstance(self.hosts, Hosts):
            object.__setattr__(self, "hosts", Hosts(self.hosts))
        if not isinstance(self.expected_rejoin, HostKeys):
            object.__setattr__(self, "expected_rejoin", HostKeys(self.expected_rejoin))

    def slice_up(self, s: int) -> bool:
        """Every host of the slice registered and healthy, and no unrepaired error or drain.

        An error is repaired by a host that registered after it and has settled
        (``settle_seconds`` registered and healthy: see :func:`settled`); a
        reconnect of the same process keeps its registration time, so it repairs nothing.
        An error the trainer named needs every host of the slice so repaired.
        """
        of = self.hosts.slice_records(s)
        records = [of.get(h) for h in range(self.policy.hosts_per_slice)]
        if any(r is None or not r.healthy for r in records):
            return False
        for mark in (self.slice_errors.get(s), getattr(self.drains.get(s), "since", None)):
            if mark is not None and not any(r is not None and r.registered_at > mark and r.settled for r in records):
                return False
        named = self.trainer_errors.get(s)
        return named is None or all(r is not None and r.registered_at > named and r.settled for r in records)

    @functools.cached_property
    def _up(self) -> frozenset[int]:
        # States are immutable, so the answer is computed once per state: the
        # tick must not walk every host of a 10,000-host job each time. A state
        # derived from one whose answer is known (carry_up) looks again only at
        # the slices that can differ: each of 10,000 registrations walked every
        # host, and registering 10,000 workers took minutes.
        seed = self.__dict__.get("_up_seed")
        if seed is not None:
            up, dirty = seed
            return (up - dirty) | frozenset(s for s in dirty if self.slice_up(s))
        return self.up_slices_afresh()

    def up_slices_afresh(self) -> frozenset[int]:
        """The up slices worked out from every host (what the cached answer must equal)."""
        return frozenset(s for s in range(self.policy.num_slices) if self.slice_up(s))

    def carry_up(self, parent: State, slices: Iterable[int] | None) -> None:
        """Derive this state's up slices from ``parent``'s (this state was made from it).

        ``slices``: the slices whose hosts may differ from the parent's; None when
        unknown, and then, if the hosts differ at all, everything is worked out afresh.
        Slices whose error or drain marks differ are looked at again too.
        """
        if self.policy is not parent.policy:
            return
        up: frozenset[int]
        dirty: frozenset[int]
        if "_up" in parent.__dict__:
            up, dirty = parent.__dict__["_up"], frozenset()
        elif "_up_seed" in parent.__dict__:
            up, dirty = parent.__dict__["_up_seed"]
        else:
            return
        more: set[int] = set()
        if self.hosts is not parent.hosts:
            if slices is None:
                return
            more.update(slices)
        for a, b in (
            (parent.slice_errors, self.slice_errors),
            (parent.trainer_errors, self.trainer_errors),
            (parent.drains, self.drains),
        ):
            if a is not b:
                more.update(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        object.__setattr__(self, "_up_seed", (up, dirty | more))

    def up_slices(self) -> frozenset[int]:
        return self._up

    def down_slices(self) -> frozenset[int]:
        return self.policy.all_slices - self.up_slices()


def initial_state(policy: Policy, now: float) -> State:
    """A fresh coordinator: wait for slices and the trainer before the first start."""
    wait = max(policy.start_timeout_seconds, policy.elastic_timeout_seconds)
    return State(policy=policy, phase=Phase.STARTING, deadline=now + wait)


# --------------------------------------------------------------------------
# events (inputs)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerJoined:
    slice: int
    host: int
    incarnation: str
    node: str = ""
    node_pool: str = ""
    generation_seen: int = 0
    """Newest generation this worker saw from any coordinator (a blind one starts above it)."""
    registration: int = 0
    """The coordinator's number for this Join stream (see :attr:`HostRecord.registration`)."""


@dataclass(frozen=True)
class WorkerLost:
    slice: int
    host: int
    incarnation: str
    cause: str
    """"stream_closed" (killed), "heartbeat_timeout" (hung), "shutdown"."""
    silent_seconds: float = 0.0
    """How long the host had been silent when it was declared lost."""
    registration: int = 0
    """The registration this observation is about: for any other one it is stale."""


@dataclass(frozen=True)
class WorkerAway:
    """A worker's stream closed, but the coordinator's own check of that host's
    Pathways worker still succeeded: its sidecar restarts (or the stream
    blipped); the host is not lost."""

    slice: int
    host: int
    incarnation: str
    detail: str = ""
    registration: int = 0
    """The registration this observation is about: for any other one it is stale."""


@dataclass(frozen=True)
class WorkerHealth:
    """A worker's local health checker (its Pathways worker) changed verdict."""

    slice: int
    host: int
    incarnation: str
    healthy: bool
    detail: str = ""
    registration: int = 0
    """The registration this observation is about: for any other one it is stale."""


@dataclass(frozen=True)
class TrainerSettings:
    """The trainer's own elastic flags (MaxText names), when it reports them."""

    elastic_min_slice_count: int
    elastic_timeout_seconds: float
    elastic_max_retries: int


@dataclass(frozen=True)
class TrainerAttached:
    generation: int
    step_in_memory: int
    active: frozenset[int] = frozenset()
    settings: TrainerSettings | None = None
    committed_step: int = -1
    held: bool = False
    """The trainer is blocked in a hold (it says so in its hello)."""


@dataclass(frozen=True)
class TrainerDetached:
    pass


@dataclass(frozen=True)
class TrainerStepped:
    step: int
    generation: int
    seconds: float = 0.0


@dataclass(frozen=True)
class TrainerSliceError:
    slices: frozenset[int]
    message: str
    step: int
    generation: int


@dataclass(frozen=True)
class TrainerHeld:
    generation: int
    step: int
    committed_step: int
    flush_seconds: float = 0.0
    flush_bytes: int = 0
    flush_error: str = ""
    """A flush was asked for and did not commit: why (never counted as committed)."""
    disagreement: str = ""
    """Multi-controller: the processes held at different steps (which ones where); never resumable."""


@dataclass(frozen=True)
class TrainerResumed:
    generation: int
    step: int
    active: frozenset[int]
    restored_from: str


@dataclass(frozen=True)
class TrainerFlushed:
    generation: int
    committed_step: int
    flush_seconds: float = 0.0
    flush_bytes: int = 0
    flush_error: str = ""


@dataclass(frozen=True)
class TrainerFinished:
    step: int


@dataclass(frozen=True)
class NodeNotice:
    """An announced disruption, or its end, for a node, a node pool or a slice.

    Sources: Pub/Sub (GKE notifications, Cloud Logging sink), a worker's
    metadata-server watcher, an operator. ``slice`` is set when the source
    knows it (a worker's own metadata server, an operator); otherwise the core
    maps ``node`` (or, for pool-level events, ``node_pool``) to slices through
    the hosts that registered with it.
    """

    kind: str
    source: str
    node: str = ""
    node_pool: str = ""
    slice: int | None = None
    deadline: float | None = None
    """When the node is expected to go, on the decision clock (None: unknown)."""
    event_time: float | None = None
    """Wall-clock time of the event, only to order notices for one node."""
    cleared: bool = False
    """The disruption is over or cancelled: lift what an earlier notice started or planned."""
    reason: str = ""
    starts_at: float | None = None
    """When a scheduled disruption begins (decision clock). Later than
    ``now + notice_lead_seconds``: the drain is planned for ``starts_at - lead``;
    otherwise, or None (imminent, in progress), the slice drains now."""
    ends_at: float | None = None
    """When the disruption's window ends (decision clock; GCE ``windowEndTime``), if the source says."""


@dataclass(frozen=True)
class OperatorCommand:
    """An admin call: hold, resume, drain, undrain (a drain undone), checkpoint or abort."""

    kind: str
    reason: str
    slice: int | None = None
    restart: bool = False
    force: bool = False
    """undrain: lift a drain a notice started too, not only an operator's."""


@dataclass(frozen=True)
class StragglerVerdict:
    """A straggler verdict that changes something (a new straggler, a drain, an alert, a recovery).

    From the coordinator's detector (:mod:`agent.stragglers`, docs/stragglers.md). ``drain`` drains
    ``slice`` as an operator drain does, never below ``min_slices`` and at most one in
    ``straggler_drain_interval_seconds`` unless ``operator_asked``; ``alert`` and ``keep`` change
    nothing: their reason goes to the log and the journal.
    """

    slice: int
    """-1 for a verdict on the whole job."""
    scope: str
    """"slice" or "job"."""
    action: str
    """"drain", "alert" or "keep"."""
    reason: str
    slowdown: float | None = None
    lateness: float | None = None
    since: float | None = None
    """When the slowdown began to be seen (unix seconds)."""
    operator_asked: bool = False


@dataclass(frozen=True)
class Tick:
    """Time passed; lets deadlines fire."""


Event = (
    WorkerJoined
    | WorkerLost
    | WorkerAway
    | WorkerHealth
    | TrainerAttached
    | TrainerDetached
    | TrainerStepped
    | TrainerSliceError
    | TrainerHeld
    | TrainerResumed
    | TrainerFlushed
    | TrainerFinished
    | NodeNotice
    | OperatorCommand
    | StragglerVerdict
    | Tick
)


# --------------------------------------------------------------------------
# actions (outputs)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class HoldTrainer:
    """Stop at the next step boundary; flush first when ``flush``.

    ``snapshot`` (never with ``flush``): a drain whose state stays on the slices that remain: make the
    newest in-memory snapshot the held step's (one save to host memory, nothing to storage) before
    acknowledging; a trainer that cannot keep it there (no snapshots, no replica per slice) flushes.
    ``prepare_wait`` (with ``snapshot``): seconds the trainer may train on first while the next mesh's
    program is being built (:func:`agent.core.drains.prepare_wait`; None: the trainer's own default).
    """

    generation: int
    flush: bool
    down_slices: frozenset[int]
    reason: str
    snapshot: bool = False
    prepare_wait: float | None = None


@dataclass(frozen=True)
class ResumeTrainer:
    generation: int
    active: frozenset[int]
    source: ResumeSource
    reason: str


@dataclass(frozen=True)
class PrepareTrainer:
    """Advice: the job will next run on exactly ``active`` (a drain was planned or began); the trainer may
    build that mesh's program now, so the resume onto it need not compile. Never acknowledged."""

    generation: int
    active: frozenset[int]
    reason: str


@dataclass(frozen=True)
class AbortTrainer:
    generation: int
    reason: str
    exit_code: int = EXIT_RESTART


@dataclass(frozen=True)
class FlushTrainer:
    """Make the current step durable without holding (an operator checkpoint)."""

    generation: int
    reason: str


@dataclass(frozen=True)
class TellWorkers:
    """Fan a command out to every worker sidecar."""

    generation: int
    kind: str
    reason: str


@dataclass(frozen=True)
class ReplaceSlice:
    """Cordon the nodes of ``slice``'s pods and delete the pods, so that the JobSet recreates them on other
    nodes (``--straggler-replace``); the new hosts' registrations lift the slice's drain and it grows back."""

    slice: int
    reason: str


@dataclass(frozen=True)
class ExitCoordinator:
    exit_code: int
    reason: str


Action = (
    HoldTrainer
    | ResumeTrainer
    | PrepareTrainer
    | AbortTrainer
    | FlushTrainer
    | TellWorkers
    | ReplaceSlice
    | ExitCoordinator
)


@dataclass(frozen=True)
class Decision:
    state: State
    actions: tuple[Action, ...]
    reason: str
    """One human-readable sentence: goes to logs, the journal and dashboards."""
    rejected: str = ""
    """Set when an operator command does not fit the state: why (FAILED_PRECONDITION)."""
    outcome: str = ""
    """A short token for metrics when an input was set aside: "foreign", "duplicate", "out_of_order"."""
