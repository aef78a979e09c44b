"""pathwaysutils' ``DeviceLossSimulator`` without its id() reuse (stand-in support, test-time only).

``pathwaysutils.test.mock_fault_injection.DeviceLossSimulator`` keeps its
bookkeeping (an array's devices, its generation, whether it is corrupted) in
dicts keyed by ``id(array)``. CPython reuses the address of a freed object, so
a new array can inherit a dead array's devices and corruption: reading a
shard held on a healthy slice then raises ``DATA_LOSS``, an error Pathways
would never raise. (Seen in the fault matrix: a host copy of the state read
from surviving slices failed at random, and the trainer fell back to its
checkpoint.) This subclass forgets an array's entries when the array is freed,
so each id means one array; the loss simulation itself is pathwaysutils'.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import jax
from pathwaysutils.test.mock_fault_injection import DeviceLossSimulator


class IdSafeDeviceLossSimulator(DeviceLossSimulator):  # type: ignore[misc]
    def _watch(self, arr: Any, known: bool) -> None:
        if known or not isinstance(arr, jax.Array) or isinstance(arr, jax.core.Tracer):
            return
        try:
            weakref.finalize(arr, self._forget, id(arr))
        except TypeError:  # not weak-referenceable: keep pathwaysutils' behaviour
            pass

    def _forget(self, arr_id: int) -> None:
        self._array_devices.pop(arr_id, None)
        self._array_generation.pop(arr_id, None)
        self._corrupted_array_ids.discard(arr_id)

    def track_array(self, arr: Any) -> None:
        known = id(arr) in self._array_devices
        super().track_array(arr)
        self._watch(arr, known)

    def bind_array_to_devices(self, arr: Any, devices: Sequence[Any]) -> None:
        known = id(arr) in self._array_devices
        super().bind_array_to_devices(arr, devices)
        self._watch(arr, known)
