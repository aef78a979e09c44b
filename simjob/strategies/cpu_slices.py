"""TEST SUPPORT: pathwaysutils' elastic ``Manager`` on plain CPU devices.

pathwaysutils groups devices into slices by ``device.slice_index``
(``elastic.get_slice_to_devices``) and probes a slice by running a small
``pmap`` on it (``elastic.DefaultSliceHealthChecker``). On this machine the
CPU devices have no ``slice_index`` and the probe cannot see a lost stand-in
Pathways worker (FACTS section 2: the ``DeviceLossSimulator`` does not poison
the probe unless the simulator already knows the slice is lost). Two narrow
seams fix that, and nothing else of pathwaysutils is touched:

* :class:`CpuSliceManager` - a ``Manager`` subclass whose ``__init__`` runs the
  real one with ``elastic.get_slice_to_devices`` replaced, for that call only,
  by the trainer's explicit grouping (slice -> its CPU devices);
* :func:`standin_slice_health` - a context manager that replaces
  ``elastic.DefaultSliceHealthChecker`` by :class:`StandinSliceHealthChecker`,
  a subclass that runs the real ``pmap`` probe and then also drops the slices
  whose stand-in Pathways workers are not serving (what Pathways' resource
  manager would report). ``Manager.elastic_retry``'s ``wait_for_slices`` and
  its monitor thread both reach the checker through that module global.

Use only in the simulated job and its benchmarks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence, Set
from typing import Any
from unittest import mock

from pathwaysutils.elastic import elastic
from pathwaysutils.elastic import manager as pw_manager

from standins.pathways_runtime import PathwaysRuntime


class CpuSliceManager(pw_manager.Manager):
    """TEST SUPPORT: ``Manager`` over CPU devices grouped as ``slice_to_devices``."""

    def __init__(self, slice_to_devices: Mapping[int, Sequence[Any]]) -> None:
        grouping = {int(s): list(devs) for s, devs in slice_to_devices.items()}
        devices = [d for s in sorted(grouping) for d in grouping[s]]
        with mock.patch.object(elastic, "get_slice_to_devices", lambda _devices: dict(grouping)):
            super().__init__(devices)


class StandinSliceHealthChecker(elastic.DefaultSliceHealthChecker):
    """TEST SUPPORT: the real ``pmap`` probe, minus slices whose stand-in workers are down."""

    runtime: PathwaysRuntime | None = None

    def validate(self) -> Set[int]:
        active = set(super().validate())
        if self.runtime is not None:
            active &= set(self.runtime.available_slices())
        return frozenset(active)


@contextlib.contextmanager
def standin_slice_health(runtime: PathwaysRuntime) -> Iterator[type[StandinSliceHealthChecker]]:
    """Make pathwaysutils' default slice probe also consult the stand-in Pathways workers."""
    checker = type("BoundStandinSliceHealthChecker", (StandinSliceHealthChecker,), {"runtime": runtime})
    with mock.patch.object(elastic, "DefaultSliceHealthChecker", checker):
        yield checker
