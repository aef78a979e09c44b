"""Baseline: MaxText-style rewind, but to an in-memory snapshot taken before every step.

The same as :mod:`simjob.strategies.checkpoint_rewind` (pathwaysutils'
``Manager.elastic_retry``, ``DATA_LOSS`` from the stand-in Pathways runtime,
growing back by ``ScaleUpSignalError``), except that the trainer copies its
state to host memory before every step and a re-run restores that copy when it
is newer than the last committed checkpoint: at most the step in flight is
lost, paid for by a device-to-host copy every step (Orbax's Pathways
``Snapshotter`` is the production form of this). The copy is taken before the
step because the step may donate its input state (``--trainer-arg=--donate``).

    python -m simjob.strategies.memory_snapshot [demo options] [--poll-interval 10]
"""

from __future__ import annotations

import argparse
import sys

from simjob.strategies.checkpoint_rewind import CheckpointRewind, rewind_main


class MemorySnapshot(CheckpointRewind):
    name = "memory_snapshot"
    trainer_module = "simjob.strategies.memory_snapshot"

    def trainer_args(self, ns: argparse.Namespace) -> list[str]:
        return [*super().trainer_args(ns), "--snapshot-every-step"]


def main(argv: list[str] | None = None) -> int:
    return rewind_main(argv, "python -m simjob.strategies.memory_snapshot", __doc__, MemorySnapshot())


if __name__ == "__main__":
    sys.exit(main())
