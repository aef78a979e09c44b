"""What the operator servers need from a daemon: a narrow status-and-commands interface.

The admin API (:mod:`agent.servers.admin`), the status it reports
(:mod:`agent.servers.status`) and the HTTP endpoints (:mod:`agent.servers.http`)
read the daemon and send it commands only through these protocols, so they
never import :mod:`agent.coordinator` or :mod:`agent.worker` (which import the
servers to start them). The daemons satisfy them structurally (mypy checks it
where they hand themselves over), and a test can serve any object that does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from agent.core.model import Decision, Event, State, TrainerFlushed
from agent.servers.feed import Feed


class JobConfig(Protocol):
    @property
    def job(self) -> str: ...


class CoordinatorView(Protocol):
    """The coordinator as its servers see it: its state and facts about itself, its decisions, and two commands."""

    @property
    def feed(self) -> Feed:
        """The newest decisions and their live subscribers."""
        ...

    @property
    def cfg(self) -> JobConfig: ...

    @property
    def state(self) -> State:
        """The decision core's current state (immutable)."""
        ...

    @property
    def last_reason(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    @property
    def fenced_by(self) -> int: ...

    @property
    def durable(self) -> bool:
        """Every decision so far reached the state file before its actions ran."""
        ...

    @property
    def durability_problem(self) -> str: ...

    @property
    def state_file_problem(self) -> str: ...

    @property
    def serving(self) -> bool:
        """The peer and trainer-link server is up."""
        ...

    @property
    def decisions_wedged(self) -> bool:
        """Events have waited long with nothing decided."""
        ...

    @property
    def trainer_conns(self) -> Mapping[int, object]:
        """Attached trainer processes, by process index."""
        ...

    async def request(self, ev: Event) -> Decision:
        """Submit an event (an operator command) and wait until the decision about it is recorded."""
        ...

    async def wait_flushed(self, generation: int, timeout: float) -> TrainerFlushed:
        """The trainer's next flush acknowledgement at ``generation`` or later; TimeoutError after ``timeout``."""
        ...


class WorkerConfigView(Protocol):
    @property
    def job(self) -> str: ...

    @property
    def slice(self) -> int: ...

    @property
    def host(self) -> int: ...

    @property
    def node(self) -> str: ...

    @property
    def health_target(self) -> str | None: ...


class NoticeView(Protocol):
    @property
    def detail(self) -> str: ...

    @property
    def deadline_unix(self) -> float: ...


class WorkerView(Protocol):
    """A worker sidecar as its servers see it (read-only: workers take no commands)."""

    @property
    def cfg(self) -> WorkerConfigView: ...

    @property
    def registered(self) -> asyncio.Event: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def node_pool(self) -> str: ...

    @property
    def incarnation(self) -> str: ...

    @property
    def notices(self) -> Mapping[str, NoticeView]: ...

    @property
    def generation(self) -> int: ...

    @property
    def last_reason(self) -> str: ...

    @property
    def feed(self) -> Feed: ...
