"""How the hook steers pathwaysutils' ``elastic_retry`` under MaxText: one budget, exactly the slices decided.

MaxText 0.2.5 wraps its train function in ``Manager.elastic_retry`` with
``max_retries=elastic_max_retries``. Left alone, pathwaysutils counts every
attempt (a grow or a drain included) while the sidecar counts failures only,
and builds each attempt's mesh from Pathways' own view of healthy slices, so
a drained but healthy slice comes straight back. The hook changes two things
on the one ``Manager`` that MaxText keeps in ``elastic_utils.elastic_manager``
(:meth:`ElasticSeam.install`), nothing else:

**One retry budget: the sidecar's.** ``elastic_retry`` is given a
``retry_policy`` instead of ``max_retries``. An attempt the sidecar decided
(the hook raises ``ScaleUpSignalError`` or a ``DATA_LOSS`` error, or re-raises
a step's slice-loss error, only after the sidecar's resume) is retried and
spends nothing here: the sidecar has already counted it if it was a failure,
and never counts a grow or a drain. A slice-loss error the hook did not see
(raised outside a training step: a save, a compile) is reported to the sidecar
as a slice error from inside the policy, which blocks for its answer: a resume
retries, an abort ends the process with the abort's exit code (42 when the
budget is spent). MaxText's own ``ScaleUpSignalError`` (``maybe_elastic_scale_up``) is a grow:
retried, never reported as a failure, spending nothing (``grows`` counts it).
So every failure is counted exactly once, by the sidecar,
against MaxText's own ``elastic_max_retries``, and pathwaysutils never refuses
first (its ``ElasticRuntimeError``, a ``RuntimeError``, would exit 1).

**Exactly the slices decided.** The manager's class is swapped for a subclass
whose ``active_slice_indices`` setter keeps only the slices the sidecar last
resumed on (``allow``), and whose ``available_inactive_slices`` (filled by the
monitor thread, read by MaxText's ``maybe_elastic_scale_up`` every step) shows
only allowed slices. ``wait_for_slices`` still waits for enough healthy
slices; the attempt then runs on healthy ∩ decided, which is what
``elastic_utils.live_devices`` and so MaxText's mesh use. Before the first
resume nothing is filtered. Slice ids are the sidecar's (the JobSet job
index) and Pathways' ``device.slice_index``, which xpk makes the same
(``MEGASCALE_SLICE_ID`` from the job index).

Importing this module imports neither JAX nor pathwaysutils.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

_SLICE_IN_TEXT = re.compile(r"\bslice(?:[ _-]?(?:index|id))?\s*[=:#]?\s*\(?(\d+)", re.IGNORECASE)
_SLICES_IN_TEXT = re.compile(r"\bslices\s*[=:]?\s*[\[{(]([\d,\s]+)[\]})]", re.IGNORECASE)


def slices_named_in(text: str) -> set[int]:
    """Slice indices an error message names (``slice_index=1``, ``slice 2``, ``slices [0, 3]``)."""
    found = {int(m) for m in _SLICE_IN_TEXT.findall(text)}
    for group in _SLICES_IN_TEXT.findall(text):
        found |= {int(x) for x in re.findall(r"\d+", group)}
    return found


def is_scale_up_signal(err: BaseException) -> bool:
    """``err`` or its cause is pathwaysutils' ``ScaleUpSignalError`` (a grow, not a failure)."""
    manager = sys.modules.get("pathwaysutils.elastic.manager")
    cls = getattr(manager, "ScaleUpSignalError", None)
    chain: BaseException | None = err
    while isinstance(cls, type) and chain is not None:
        if isinstance(chain, cls):
            return True
        chain = chain.__cause__ or chain.__context__
    return False


def slice_of_devices(devices: Iterable[Any], slice_to_devices: Mapping[int, Sequence[Any]]) -> set[int]:
    """The slices ``devices`` belong to, by device id (as pathwaysutils groups them)."""
    by_id = {d.id: s for s, ds in slice_to_devices.items() for d in ds}
    return {by_id[d.id] for d in devices if d is not None and d.id in by_id}


class ElasticSeam:
    """The hook's hold on pathwaysutils' manager (see the module docstring).

    ``ask_sidecar(error)`` reports a slice-loss error the hook did not see and
    blocks for the sidecar's answer (it returns on a resume; it exits the
    process on an abort).
    """

    def __init__(
        self,
        ask_sidecar: Callable[[BaseException], None],
        on_grow: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._ask_sidecar = ask_sidecar
        self._on_grow = on_grow
        self._lock = threading.Lock()
        self.allowed: frozenset[int] | None = None
        """Slices the sidecar last resumed on; None: not decided yet (no filter)."""
        self._decided: set[int] = set()
        """ids of errors the hook raised (or re-raised) after the sidecar's resume."""
        self.manager: Any = None
        self.decided_attempts = 0
        """Attempts pathwaysutils retried on the sidecar's word (grows, drains, shrinks)."""
        self.reported_failures = 0
        """Slice-loss errors from outside a step that the policy reported to the sidecar."""
        self.grows = 0
        """``ScaleUpSignalError`` retries MaxText raised by itself (``maybe_elastic_scale_up``)."""

    # -- what the hook calls ---------------------------------------------------------

    def allow(self, slices: Iterable[int]) -> None:
        with self._lock:
            self.allowed = frozenset(slices)

    def decided(self, err: BaseException) -> BaseException:
        """Mark ``err`` as raised on the sidecar's word; returns it (``raise seam.decided(e)``)."""
        self._decided.add(id(err))
        return err

    @staticmethod
    def no_usable_slices(healthy: frozenset[int], decided: frozenset[int]) -> BaseException:
        """No slice is both healthy and decided: an elastic failure (a ``DATA_LOSS`` error, which
        ``elastic_retry`` hands to :meth:`retry_policy`, so the sidecar decides again or aborts with 42),
        never pathwaysutils' ``ValueError`` from ``Manager.default_device`` (exit 1)."""
        import jax

        print(
            f"trainer_hooks.maxtext: elastic_error "
            f'{{"healthy": {sorted(healthy)}, "decided": {sorted(decided)}, "why": "no slice both healthy and decided"}}',
            file=sys.stderr,
            flush=True,
        )
        return jax.errors.JaxRuntimeError(
            f"DATA_LOSS: elastic-sidecar: no slice is both healthy and decided "
            f"(healthy {sorted(healthy)}, decided slices {sorted(decided)})"
        )

    def retry_policy(self, attempt: int, error: BaseException) -> bool:
        """pathwaysutils' ``retry_policy``: always retry; the sidecar alone may refuse (by aborting).

        MaxText's own ``ScaleUpSignalError`` (``maybe_elastic_scale_up``, e.g. when Pathways
        reports a slice healthy after the sidecar resumed on it) is a grow, never a failure: it is
        retried without a word to the sidecar and spends nothing; ``on_grow`` lets the hook
        acknowledge the mesh the next attempt builds.
        """
        chain: BaseException | None = error
        while chain is not None:
            if id(chain) in self._decided:
                self._decided.discard(id(chain))
                self.decided_attempts += 1
                return True
            chain = chain.__cause__ or chain.__context__
        if is_scale_up_signal(error):
            self.grows += 1
            if self._on_grow is not None:
                self._on_grow(error)
            return True
        self.reported_failures += 1
        self._ask_sidecar(error)  # exits unless the sidecar resumes
        return True

    def mesh_slices(self, devices: Iterable[Any]) -> set[int]:
        """The slices a mesh's devices span (Pathways' grouping)."""
        return slice_of_devices(devices, self.slice_map())

    def slice_map(self) -> Mapping[int, Sequence[Any]]:
        """Slice index -> devices, as pathwaysutils groups them."""
        import jax
        from pathwaysutils.elastic import elastic

        if self.manager is not None:
            return self.manager.slice_to_devices
        return elastic.get_slice_to_devices(jax.devices())

    def unhealthy(self, slices: Iterable[int]) -> set[int]:
        """Of ``slices``, those pathwaysutils' health check finds down (on Pathways a tiny computation each)."""
        from pathwaysutils.elastic import elastic

        mapping = self.slice_map()
        wanted = {s: mapping[s] for s in slices if s in mapping}
        if not wanted:
            return set()
        return set(wanted) - set(elastic.get_active_slice_indices(slice_to_devices=wanted))

    # -- installing -------------------------------------------------------------------

    def install(self, config: Any) -> None:
        """Take over MaxText's manager (create it as MaxText would); idempotent."""
        from maxtext.utils import elastic_utils

        elastic_utils.ensure_elastic_manager_initialized(config)
        mgr = elastic_utils.elastic_manager
        if mgr is None or getattr(mgr, "_elastic_sidecar_seam", None) is self:
            return
        base = type(mgr)
        seam = self
        active = base.active_slice_indices

        class SidecarSteeredManager(base):  # type: ignore[misc,valid-type]
            """pathwaysutils' Manager, on exactly the slices the elastic sidecar decided."""

            @property
            def active_slice_indices(self) -> frozenset[int]:
                return active.fget(self)

            @active_slice_indices.setter
            def active_slice_indices(self, value: Any) -> None:
                allowed = seam.allowed
                kept = frozenset(value) if allowed is None else frozenset(value) & allowed
                if value and not kept:
                    # pathwaysutils' default_device would raise ValueError("No active slices"), an exit 1.
                    raise seam.no_usable_slices(frozenset(value), allowed or frozenset())
                active.fset(self, kept)

            @property
            def available_inactive_slices(self) -> frozenset[int]:
                found = self.__dict__.get("_sidecar_available", frozenset())
                allowed = seam.allowed
                return frozenset(found) if allowed is None else frozenset(found) & allowed

            @available_inactive_slices.setter
            def available_inactive_slices(self, value: Any) -> None:
                self.__dict__["_sidecar_available"] = frozenset(value)

        mgr.__dict__["_sidecar_available"] = frozenset(mgr.__dict__.get("available_inactive_slices", frozenset()))
        mgr.__class__ = SidecarSteeredManager
        original = mgr.elastic_retry

        def elastic_retry(*args: Any, max_retries: int | None = None, retry_policy: Any = None, **kwargs: Any) -> Any:
            # max_retries (MaxText passes elastic_max_retries) is the sidecar's budget now.
            return original(*args, retry_policy=seam.retry_policy, **kwargs)

        mgr.elastic_retry = elastic_retry
        mgr._elastic_sidecar_seam = self
        self.manager = mgr
