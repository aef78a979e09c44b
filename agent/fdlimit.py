"""The coordinator's open-file limit: one descriptor for every worker sidecar's connection.

Every worker sidecar keeps one gRPC stream to the coordinator, so the coordinator's process holds
one socket per host (10,020 descriptors at 10,000 workers in ``python -m bench scale``), besides
its listeners, the trainer links, its state files and operator connections. Python keeps the
soft ``RLIMIT_NOFILE`` it was started with, and a container often starts with a small one:
containerd 2.x leaves the limit to systemd's default of 1024 (soft) : 524288 (hard), and says
that "software that needs a higher limit should request to raise the soft limit for its process"
(containerd pull request #8924; docs/containerd-2.0.md, "LimitNOFILE configuration has been
removed"). With 1024 the coordinator would refuse the connection of about the 1,000th worker
(``accept`` fails with EMFILE) and those hosts would never register.

So the coordinator raises its soft limit to the hard limit at start, as Go programs do by
themselves since Go 1.19 (release notes, package os). When even the hard limit cannot hold the
job's hosts it says so at start (an ERROR naming both numbers, and the gauge
``elastic_sidecar_open_files_limit``) and serves anyway: refusing to start would hold the trainer
behind the coordinator's startup probe, which is worse for the job than some hosts unwatched.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from agent import log as logmod

log = logmod.get("coordinator")

RESERVED = 256
"""Descriptors besides the workers' connections: listeners (gRPC, UDP heartbeats, admin, HTTP),
trainer links, the state file and journal, the Pub/Sub client's channel, gRPC's own pipes and
epoll, scrapes and admin calls in flight, and a worker's second connection while its first is
torn down (10,020 were open at 10,000 workers with nothing else going on)."""


@dataclass(frozen=True)
class OpenFiles:
    before: int
    """The soft limit the process was started with."""
    soft: int
    """The soft limit after raising it."""
    hard: int
    need: int
    """Descriptors the job needs: its hosts, its trainer processes and ``RESERVED``."""

    @property
    def enough(self) -> bool:
        return self.soft == resource.RLIM_INFINITY or self.soft >= self.need


def need(hosts: int, trainer_processes: int = 1) -> int:
    """Open files a coordinator for ``hosts`` worker sidecars and ``trainer_processes`` trainers needs."""
    return hosts + trainer_processes + RESERVED


def raise_open_files(hosts: int, trainer_processes: int = 1) -> OpenFiles:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; report whether it holds the job."""
    unlimited = resource.RLIM_INFINITY
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = before
    target = hard if hard != unlimited else max(before, 2 * need(hosts, trainer_processes))
    if before != unlimited and target > before:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # e.g. a hard limit past the kernel's fs.nr_open
            soft = before
    return OpenFiles(before=before, soft=soft, hard=hard, need=need(hosts, trainer_processes))


def raise_for_job(hosts: int, trainer_processes: int) -> OpenFiles:
    """:func:`raise_open_files`, logged: raised (INFO), or still too low for the job's hosts (ERROR)."""
    got = raise_open_files(hosts, trainer_processes)
    if got.soft != got.before:
        log.info("open-file limit raised", before=got.before, limit=got.soft, hard=got.hard, need=got.need)
    if not got.enough:
        log.error(
            "open-file limit too low for the job's hosts: the workers past it cannot connect",
            hosts=hosts,
            need=got.need,
            limit=got.soft,
            hard=got.hard,
            fix="raise the container's RLIMIT_NOFILE hard limit (e.g. the container runtime's LimitNOFILE)",
        )
    return got
