"""One open stream to a worker sidecar or a trainer process: what its source and the executors share."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from agent.sources.heartbeat_datagrams import Reply

EOF_GRACE_SECONDS = 0.05
"""How long a stream's end waits for the cancellation that follows a dead peer's EOF (grpc.aio reads both)."""


@dataclass
class Link:
    """One open stream to a worker or the trainer: its outgoing queue."""

    outbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    last_seen: float = field(default_factory=time.monotonic)
    """When the peer last sent a message (tells a hung peer from a killed one). Until a just-registered
    worker's first message it lies ahead of its registration reply (its longer first timeout, see PeerService.Join)."""
    replied_at: float = 0.0
    """When its registration reply was written (monotonic)."""
    credited: float = -1.0
    """The ``last_seen`` its registration was credited with: while ``last_seen`` still equals it, nothing
    has been heard since the reply (a message sets ``last_seen`` to the time it was read)."""
    cause: str = ""
    """Why the coordinator ended the stream ("heartbeat_timeout", "replaced", "fenced")."""
    incarnation: str = ""
    health_address: str = ""
    health_check: str = ""
    token: bytes = b""
    """This registration's heartbeat datagram token (empty: datagrams are off)."""
    datagrams: bool = False
    """A heartbeat datagram of this registration arrived (the worker was told so)."""
    reply: Reply | None = None
    """Where this registration's heartbeat datagrams come from: commands go there too."""
    datagram_key: bytes = b""
    """Its heartbeat datagram's bytes, matched without parsing (DatagramReceiver.known)."""
    acked: tuple[int, int] = (-1, 0)
    """(generation, COMMAND_ORDER) of the newest command datagram the worker acknowledged."""
    registration: int = 0
    """This Join stream's number (a worker's registrations are numbered in order): every
    observation about it (its end, a check of its host, a health report) names it, and the
    core drops one about a registration that has since been replaced."""
    first_seen: int = 0
    """The registration at which this incarnation first registered: of two live sidecars claiming one
    host, the one first seen later (the newer process) speaks for it."""
    who: str = ""
    """Pod, node and peer address of the sidecar, for operators (a duplicate's warning names both)."""
    replaced_by: str = ""
    """Why a newer sidecar ended this stream: the ALREADY_EXISTS status the older one gets."""
    judged: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the verdict on this registration's end (away or lost) has been submitted."""


class Refused(Exception):
    """A stream refused at its start: the gRPC status and the message the peer gets."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
