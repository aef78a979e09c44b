"""What the hook relies on in MaxText, pathwaysutils and Orbax, checked once at start.

The hook replaces module attributes of MaxText's pre-training module, wraps
MaxText's checkpoint restore, subclasses pathwaysutils' ``Manager`` and
drives Orbax's Pathways ``Snapshotter``: none of that is an API those
projects promise to keep. A release that moved one of them would otherwise
fail mid-run with an ``AttributeError`` (exit 1, which fails the JobSet).
:func:`differences` lists everything that is not as the hook was built for;
``python -m trainer_hooks.maxtext`` exits 2 naming them before MaxText starts.

Importing this module imports nothing heavy; :func:`differences` imports
the packages it checks.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from importlib import metadata
from typing import Any

PINNED = {"maxtext": "0.2.5", "pathwaysutils": "0.1.13"}
"""The releases the hook's seams were read against (``constraints-maxtext.txt``)."""

TRAIN_MODULE = "maxtext.trainers.pre_train.train"

ATTRIBUTES: tuple[tuple[str, str, str], ...] = (
    # (module, attribute path, what the hook does with it)
    (TRAIN_MODULE, "initialize", "wrapped: connect once MaxText parsed its config"),
    (TRAIN_MODULE, "training_loop_iteration", "wrapped: the step boundary"),
    (TRAIN_MODULE, "main", "run as MaxText's entry"),
    ("maxtext.common.checkpointing", "load_state_if_possible", "wrapped: the restore ladder"),
    ("maxtext.common.checkpointing", "save_checkpoint", "flushes"),
    ("maxtext.common.checkpointing", "wait_until_finished", "flushes"),
    ("maxtext.common.checkpointing", "all_steps", "committed steps"),
    ("maxtext.common.checkpointing", "latest_step", "committed steps"),
    ("maxtext.utils.maxtext_utils", "setup_training_state", "calls load_state_if_possible each attempt"),
    ("maxtext.utils.elastic_utils", "ensure_elastic_manager_initialized", "the seam takes MaxText's manager"),
    ("maxtext.utils.elastic_utils", "elastic_enabled", "elastic or not"),
    ("maxtext.utils.elastic_utils", "maybe_elastic_scale_up", "raises ScaleUpSignalError"),
    ("pathwaysutils.elastic.manager", "Manager.elastic_retry", "the seam's retry_policy"),
    ("pathwaysutils.elastic.manager", "Manager.active_slice_indices", "the seam filters it (a property)"),
    ("pathwaysutils.elastic.manager", "ScaleUpSignalError", "a grow"),
    ("pathwaysutils.elastic.elastic", "get_slice_to_devices", "device -> slice"),
    ("pathwaysutils.elastic.elastic", "get_active_slice_indices", "slice health"),
    ("pathwaysutils.experimental.split_by_mesh_axis", "split_by_mesh_axis", "the Snapshotter's split"),
    ("pathwaysutils.experimental.concatenate_by_mesh_axis", "concatenate_by_mesh_axis", "the Snapshotter's load"),
    ("orbax.checkpoint", "v1.training.pathways.Snapshotter.save", "snapshots"),
    ("orbax.checkpoint", "v1.training.pathways.Snapshotter.load", "restores"),
    ("orbax.checkpoint", "v1.training.pathways.Snapshotter.join", "restores"),
    ("orbax.checkpoint", "v1.training.pathways.Snapshotter.latest", "the snapshot's step"),
)

PARAMETERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "maxtext.common.checkpointing",
        "load_state_if_possible",
        ("checkpoint_manager", "data_iterator", "abstract_unboxed_pre_state"),
    ),
    (TRAIN_MODULE, "training_loop_iteration", ("jax_device_state", "python_vars", "immutable_data")),
    ("pathwaysutils.elastic.manager", "Manager.elastic_retry", ("retry_policy",)),
)


def _resolve(module: str, path: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in path.split("."):
        obj = inspect.getattr_static(obj, part) if isinstance(obj, type) else getattr(obj, part)
    return obj


def differences(version: Callable[[str], str] = metadata.version) -> list[str]:
    """What differs from what the hook was built for; empty when everything matches."""
    found: list[str] = []
    for dist, want in PINNED.items():
        try:
            have = version(dist)
        except metadata.PackageNotFoundError:
            have = "not installed"
        if have != want:
            found.append(f"{dist} {have} (the hook is built for {want})")
    for module, path, use in ATTRIBUTES:
        try:
            obj = _resolve(module, path)
        except Exception as e:  # ImportError, AttributeError: named either way
            found.append(f"{module}.{path} missing ({type(e).__name__}; {use})")
            continue
        if path == "Manager.active_slice_indices" and not isinstance(obj, property):
            found.append(f"{module}.{path} is not a property ({use})")
    for module, path, names in PARAMETERS:
        try:
            fn = _resolve(module, path)
            params = set(inspect.signature(fn).parameters)
        except Exception:  # already reported as missing above
            continue
        lacking = [n for n in names if n not in params]
        if lacking:
            found.append(f"{module}.{path} has no parameter(s) {lacking}")
    return found
