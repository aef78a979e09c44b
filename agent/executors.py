"""Executors: carry the core's actions out, to the trainer processes' links and to the workers
(a datagram each where their heartbeats come by datagram, their streams otherwise)."""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, Any

from agent import constants as C
from agent import log as logmod
from agent.core.model import (
    AbortTrainer,
    Action,
    FlushTrainer,
    HoldTrainer,
    PrepareTrainer,
    ResumeSource,
    ResumeTrainer,
    TellWorkers,
)
from agent.links import Link
from agent.sources.heartbeat_datagrams import command_datagram, command_position
from protos.elastic_sidecar.v1 import peer_pb2, trainer_pb2

if TYPE_CHECKING:
    from agent.coordinator import Coordinator

log = logmod.get("coordinator")
STREAM_COPIES_PER_PASS = 100
"""Worker commands queued onto streams per event-loop pass. Queuing thousands at once would hold the
loop for one long pass, in which the heartbeat datagram socket overflows and disconnects wait;
every worker has had the datagram copy already."""


def trainer_command(a: Action) -> trainer_pb2.SidecarCommand | None:
    match a:
        case HoldTrainer():
            return trainer_pb2.SidecarCommand(
                hold=trainer_pb2.Hold(
                    generation=a.generation,
                    flush=a.flush,
                    down_slices=sorted(a.down_slices),
                    reason=a.reason,
                    snapshot=a.snapshot,
                    prepare_wait_seconds=a.prepare_wait,
                )
            )
        case ResumeTrainer():
            src = trainer_pb2.Resume.MEMORY if a.source == ResumeSource.MEMORY else trainer_pb2.Resume.CHECKPOINT
            return trainer_pb2.SidecarCommand(
                resume=trainer_pb2.Resume(
                    generation=a.generation, active_slices=sorted(a.active), source=src, reason=a.reason
                )
            )
        case AbortTrainer():
            return trainer_pb2.SidecarCommand(
                abort=trainer_pb2.Abort(generation=a.generation, exit_code=a.exit_code, reason=a.reason)
            )
        case FlushTrainer():
            return trainer_pb2.SidecarCommand(flush=trainer_pb2.Flush(generation=a.generation, reason=a.reason))
        case PrepareTrainer():
            prepare = trainer_pb2.Prepare(generation=a.generation, active=sorted(a.active), reason=a.reason)
            return trainer_pb2.SidecarCommand(prepare=prepare)
    return None


class TrainerExecutor:
    """Sends hold, resume, abort, flush and prepare to every attached trainer process, stamped with the epoch."""

    def __init__(self, coord: Coordinator) -> None:
        self.c = coord

    def carry_out(self, a: Action) -> None:
        c = self.c
        cmd = trainer_command(a)
        assert cmd is not None
        cmd.epoch = c.epoch
        cmd.epoch_coordinator = c.coordinator_id
        cmd.epoch_proof = c.epoch_proof
        if isinstance(a, HoldTrainer):
            # Multi-controller: every process stops at this one boundary (0: the next one).
            cmd.hold.at_step = c.group.hold_step(a.generation)
        missing = c.cfg.policy.trainer_processes - len(c.trainer_conns)
        if not c.trainer_conns:
            log.warning("no trainer attached; command will be repeated when it attaches", command=type(a).__name__)
        elif missing > 0:
            log.warning(
                "not every trainer process is attached; the others get the command when the job is whole again",
                command=type(a).__name__,
                attached=sorted(c.trainer_conns),
            )
        for conn in c.trainer_conns.values():
            conn.outbox.put_nowait(cmd)


class WorkerExecutor:
    """Tells every worker a command: by datagram first, on its stream where that fails or goes unacknowledged."""

    def __init__(self, coord: Coordinator) -> None:
        self.c = coord
        self.stream_copies: collections.deque[tuple[Link, Any]] = collections.deque()
        """Worker commands waiting for their stream (oldest first): see STREAM_COPIES_PER_PASS."""
        self._due = asyncio.Event()

    def carry_out(self, a: TellWorkers) -> None:
        c = self.c
        msg = peer_pb2.CoordinatorMessage(
            command=peer_pb2.PeerCommand(generation=a.generation, kind=a.kind, reason=a.reason, epoch=c.epoch)
        )
        # By datagram where the worker's heartbeats come by datagram (agent.sources.heartbeat_datagrams):
        # every worker hears at once, where thousands of stream writes queue behind each other. Only
        # workers without datagrams, and those that do not acknowledge it in time, get the stream's copy.
        by_datagram: list[Link] = []
        failed = 0
        for (slice_, host), conn in c.workers.items():
            if conn.reply is not None and c.datagrams.send(
                conn.reply, command_datagram(conn.token, slice_, host, msg.command)
            ):
                by_datagram.append(conn)
            else:
                failed += conn.reply is not None
                self.stream_copies.append((conn, msg))
        c.metrics.count_command_datagrams("sent", len(by_datagram))
        c.metrics.count_command_datagrams("failed", failed)
        self._due.set()
        if by_datagram:
            asyncio.get_running_loop().call_later(C.COMMAND_ACK_SECONDS, self._unacknowledged, by_datagram, msg)

    def _unacknowledged(self, conns: list[Link], msg: peer_pb2.CoordinatorMessage) -> None:
        """A command's datagram was not acknowledged (lost, or the worker is slow): send it on the stream."""
        key = command_position(msg.command.generation, msg.command.kind)
        late = [c for c in conns if c.acked < key and not c.closed.is_set()]
        self.c.metrics.count_command_datagrams("unacknowledged", len(late))
        if late:
            self.stream_copies.extend((c, msg) for c in late)
            self._due.set()

    async def copy_to_streams(self) -> None:
        """Queue worker commands onto their streams, STREAM_COPIES_PER_PASS per loop pass, in order."""
        pending = self.stream_copies
        while True:
            await self._due.wait()
            self._due.clear()
            while pending:
                for _ in range(min(STREAM_COPIES_PER_PASS, len(pending))):
                    conn, msg = pending.popleft()
                    if not conn.closed.is_set():
                        conn.outbox.put_nowait(msg)
                await asyncio.sleep(0)
