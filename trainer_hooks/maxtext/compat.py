"""What the hook relies on in MaxText, pathwaysutils, Orbax and JAX, checked once at start.

The hook replaces module attributes of MaxText's pre-training module, wraps
MaxText's checkpoint restore, subclasses pathwaysutils' ``Manager`` and
drives Orbax's Pathways ``Snapshotter``: none of that is an API those
projects promise to keep. :data:`BOUNDS` is the window of releases the hook
was verified against, each bound with its reason; :func:`differences` lists
the attributes that are not where the hook expects them. At start
(:func:`check_at_start`) and under ``python -m trainer_hooks.maxtext --check``
a release outside the window exits 2 naming it and why, before MaxText starts.

A release that is merely untested runs, with a warning, when
``ELASTIC_SIDECAR_ALLOW_UNTESTED=1`` (or ``--allow-untested``) says so. A
release with a known defect is refused even then: running it is not a gamble
but a known loss. Reading versions imports nothing heavy (importlib.metadata);
:func:`differences` imports the packages it checks.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import os
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

# packaging is PyPA's implementation of PEP 440 version and specifier semantics (what pip itself
# uses); pathwaysutils and maxtext[tpu] depend on it too.
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

ENV_ALLOW_UNTESTED = "ELASTIC_SIDECAR_ALLOW_UNTESTED"
EXIT_INCOMPATIBLE = 2


class Outside(enum.Enum):
    """What a release that fails a bound is."""

    UNTESTED = "untested"  # not verified; may work; runs with the override
    DEFECT = "known defect"  # verified to break the hook; refused even with the override


@dataclass(frozen=True)
class Bound:
    package: str  # the distribution's name, as ``pip`` and importlib.metadata know it
    requires: str  # a PEP 440 specifier every accepted release satisfies
    outside: Outside
    reason: str


BOUNDS: tuple[Bound, ...] = (
    Bound(
        "maxtext",
        ">=0.2.5",
        Outside.UNTESTED,
        "the seams (train.initialize, training_loop_iteration, checkpointing, elastic_utils) were read "
        "and tested in 0.2.5 only",
    ),
    Bound("maxtext", "<=0.2.5", Outside.UNTESTED, "0.2.5 is the newest release the seams were verified against"),
    Bound(
        "pathwaysutils",
        ">=0.1.13",
        Outside.DEFECT,
        "before 0.1.13 Manager.elastic_retry deletes every live array at each elastic event "
        "(_elastic_event_cleanup: jax.clear_caches(), then delete() on each of jax.live_arrays(); read in "
        "0.1.7 to 0.1.12), which would wipe the hook's snapshots; MaxText 0.2.5 itself allows >=0.1.11",
    ),
    Bound(
        "pathwaysutils",
        "<=0.1.13",
        Outside.UNTESTED,
        "0.1.13 is the newest release the Manager seams were verified against",
    ),
    Bound(
        "orbax-checkpoint",
        ">=0.12.8",
        Outside.UNTESTED,
        "the Pathways Snapshotter (orbax.checkpoint.v1.training.pathways) was tested on 0.12.8 only; "
        "MaxText 0.2.5 allows >=0.12.4. Before 0.12.8 it keeps one array a leaf and splits the replicas at "
        "load (read in 0.12.4 to 0.12.7), so the hook cannot drop a lost slice's replica before Orbax's load",
    ),
    Bound(
        "orbax-checkpoint",
        "<=0.12.8",
        Outside.UNTESTED,
        "0.12.8 is the newest release the Snapshotter was verified against",
    ),
    Bound("jax", ">=0.12.0.1", Outside.UNTESTED, "the snapshot copies and restores were tested on jax 0.12.0.1 only"),
    Bound("jax", "<=0.12.0.1", Outside.UNTESTED, "0.12.0.1 is the newest jax the hook was verified against"),
)
"""The window: one row per bound, each with why. Outside an UNTESTED bound nothing is known to
break, it was just never verified; outside a DEFECT bound something is known to."""

PACKAGES: tuple[str, ...] = tuple(dict.fromkeys(b.package for b in BOUNDS))


@dataclass(frozen=True)
class Finding:
    """One package's verdict: ``verdict`` is "ok", "untested", "known defect" or "not installed"."""

    package: str
    version: str | None
    verdict: str
    reason: str

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    @property
    def overridable(self) -> bool:
        return self.verdict == Outside.UNTESTED.value

    def __str__(self) -> str:
        return f"{self.package} {self.version or '(not installed)'}: {self.verdict}: {self.reason}"


def window(package: str) -> str:
    return ", ".join(b.requires for b in BOUNDS if b.package == package)


def installed(version: Callable[[str], str] = metadata.version) -> dict[str, str | None]:
    """Each checked package's installed version (None when absent), as importlib.metadata finds it
    first on ``sys.path``."""
    found: dict[str, str | None] = {}
    for package in PACKAGES:
        try:
            found[package] = version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def assess(versions: Mapping[str, str | None]) -> list[Finding]:
    """One finding per package of :data:`BOUNDS`, the worst of the bounds it fails."""
    findings = []
    for package in PACKAGES:
        have = versions.get(package)
        if have is None:
            findings.append(Finding(package, None, "not installed", "the hook needs it"))
            continue
        try:
            parsed = Version(have)
        except InvalidVersion:
            findings.append(Finding(package, have, Outside.UNTESTED.value, "not a PEP 440 version"))
            continue
        # prereleases=True: a dev or rc build is judged by its number, not dropped by the
        # specifier's default of excluding prereleases.
        failed = [
            b
            for b in BOUNDS
            if b.package == package and not SpecifierSet(b.requires).contains(parsed, prereleases=True)
        ]
        defects = [b for b in failed if b.outside is Outside.DEFECT]
        if failed:
            worst = defects or failed
            findings.append(
                Finding(
                    package,
                    have,
                    worst[0].outside.value,
                    f"outside {worst[0].requires}: " + "; ".join(b.reason for b in worst),
                )
            )
        else:
            findings.append(Finding(package, have, "ok", f"inside the verified window {window(package)}"))
    return findings


def allow_untested_from_env(env: Mapping[str, str] = os.environ) -> bool:
    raw = env.get(ENV_ALLOW_UNTESTED, "").strip()
    if raw in ("", "0"):
        return False
    if raw == "1":
        return True
    raise ValueError(f"{ENV_ALLOW_UNTESTED}={raw!r}: expected 1 (run untested releases) or 0 / unset")


def split(findings: list[Finding], allow_untested: bool) -> tuple[list[Finding], list[Finding]]:
    """(refused, allowed with a warning): untested releases pass only with the override; a known
    defect or a missing package never does."""
    refused = [f for f in findings if not f.ok and not (allow_untested and f.overridable)]
    warned = [f for f in findings if not f.ok and allow_untested and f.overridable]
    return refused, warned


def window_table() -> str:
    """:data:`BOUNDS` as text, for ``--help``."""
    rows = [("package", "requires", "outside it", "why")] + [
        (b.package, b.requires, b.outside.value, b.reason) for b in BOUNDS
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lead = sum(widths) + 6
    lines = []
    for r in rows:
        head = "  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True))
        why = textwrap.wrap(r[3], width=max(40, 100 - lead), break_long_words=False, break_on_hyphens=False) or [""]
        lines.append(f"{head}  {why[0]}")
        lines.extend(" " * lead + w for w in why[1:])
    return "\n".join(lines)


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


def differences() -> list[str]:
    """The seams that are not as the hook uses them; empty when every one is there.

    Not overridable: a missing seam fails mid-run with an ``AttributeError``
    (exit 1, which fails the JobSet), whatever the version says.
    """
    found: list[str] = []
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


HINT = f"python -m trainer_hooks.maxtext --help shows the window; {ENV_ALLOW_UNTESTED}=1 runs untested releases"


def _warn(prefix: str, warned: list[Finding]) -> None:
    for f in warned:
        print(
            f"{prefix}: WARNING: untested release allowed by {ENV_ALLOW_UNTESTED}=1: {f}",
            file=sys.stderr,
            flush=True,
        )


def check_at_start(
    say: Callable[[str, dict[str, Any]], None],
    prefix: str,
    *,
    env: Mapping[str, str] = os.environ,
    version: Callable[[str], str] = metadata.version,
    seams: Callable[[], list[str]] | None = None,
) -> None:
    """Before MaxText starts: exit 2 naming every release outside the window and every missing
    seam; warn for each untested release the override lets through."""
    try:
        allow = allow_untested_from_env(env)
    except ValueError as e:
        print(f"{prefix}: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_INCOMPATIBLE) from None
    refused, warned = split(assess(installed(version)), allow)
    if warned:
        say("untested", {"allowed": [str(f) for f in warned]})
        _warn(prefix, warned)
    differs = [str(f) for f in refused] + (seams or differences)()
    if differs:
        say("incompatible", {"differs": differs})
        print(
            f"{prefix}: error: not what the hook was verified against: " + "; ".join(differs) + f" ({HINT})",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(EXIT_INCOMPATIBLE)


def _remedy(f: Finding) -> str:
    if f.overridable:
        return f" ({ENV_ALLOW_UNTESTED}=1 would run it)"
    if f.verdict == Outside.DEFECT.value:
        return f" (refused even with {ENV_ALLOW_UNTESTED}=1: install {f.package}{window(f.package).replace(' ', '')})"
    return ""


def _location(package: str) -> str:
    try:
        return str(metadata.distribution(package).locate_file(""))
    except metadata.PackageNotFoundError:
        return "-"


def check_command(
    prefix: str,
    *,
    env: Mapping[str, str] = os.environ,
    version: Callable[[str], str] = metadata.version,
    location: Callable[[str], str] = _location,
) -> int:
    """``--check``: print each package's version, where it was found and its verdict; 0 when the
    hook would start (untested releases counting only under the override), 2 otherwise. Reads
    versions only: imports none of the packages."""
    try:
        allow = allow_untested_from_env(env)
    except ValueError as e:
        print(f"{prefix}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_INCOMPATIBLE
    findings = assess(installed(version))
    refused, warned = split(findings, allow)
    for f in findings:
        print(f"{f}  [{location(f.package)}]")
    _warn(prefix, warned)
    if refused:
        print("incompatible: " + "; ".join(f"{f}{_remedy(f)}" for f in refused))
        return EXIT_INCOMPATIBLE
    print("compatible" + (" with untested releases (allowed)" if warned else ": every release inside the window"))
    return 0
