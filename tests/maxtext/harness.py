"""What the MaxText tests share: the MaxText venv check, and :mod:`simjob.maxtext.job`'s driver.

The pytest process runs in the main venv and hosts a real
:class:`agent.coordinator.Coordinator` on an event loop of its own thread
(:class:`Sidecar`); MaxText runs as a subprocess of the separate MaxText venv
(:class:`MaxTextRun`), started through ``python -m trainer_hooks.maxtext``, or
``python -m simjob.maxtext`` (:data:`PATCHED_MODULE`) with the CPU elastic
patches. Both live in :mod:`simjob.maxtext.job` (the recovery benchmark drives
MaxText with them too); this module adds the venv check that fails a test, and one warm
compile cache that the runs of a pytest process share (:func:`maxtext_args`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from simjob.maxtext import job
from simjob.maxtext.job import (
    DEVICES,
    JOB,
    MAXTEXT_PYTHON,
    MAXTEXT_VENV,
    MODELS,
    PATCHED_MODULE,
    REPO,
    START_TIMEOUT,
    TINY_MODEL,
    WAIT,
    Applied,
    Sidecar,
    checkpoint_labels,
)

__all__ = [
    "DEVICES",
    "JOB",
    "MAXTEXT_PYTHON",
    "MAXTEXT_VENV",
    "MODELS",
    "PATCHED_MODULE",
    "REPO",
    "START_TIMEOUT",
    "TINY_MODEL",
    "WAIT",
    "Applied",
    "MaxTextRun",
    "Sidecar",
    "checkpoint_labels",
    "maxtext_args",
    "require_maxtext_venv",
    "shared_jax_cache",
]

SETUP_COMMANDS = f"""\
  cd {REPO}
  python3.12 -m venv .venv-maxtext
  .venv-maxtext/bin/pip install 'maxtext[tpu]==0.2.5'
  .venv-maxtext/bin/pip install --no-deps -e .
  .venv-maxtext/bin/pip install -c constraints.txt grpcio-health-checking grpcio-reflection structlog \\
      prometheus-client aiohttp hypothesis pytest
  .venv-maxtext/bin/pip check"""

_venv_checked: list[str] = []


def require_maxtext_venv() -> Path:
    """The MaxText venv's python, with our package installed; fail (never skip) without it."""
    if _venv_checked:
        return MAXTEXT_PYTHON
    if not MAXTEXT_PYTHON.exists():
        pytest.fail(
            f"the MaxText tests need a Python 3.12 venv with MaxText at {MAXTEXT_VENV}; create it with:\n{SETUP_COMMANDS}",
            pytrace=False,
        )
    probe = "import maxtext, pathwaysutils, orbax.checkpoint, trainer_hooks.maxtext, grpc_health"
    r = subprocess.run([str(MAXTEXT_PYTHON), "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.fail(
            f"{MAXTEXT_VENV} cannot run the served MaxText ({r.stderr.strip().splitlines()[-1:]}); "
            f"set it up with:\n{SETUP_COMMANDS}",
            pytrace=False,
        )
    _venv_checked.append("ok")
    return MAXTEXT_PYTHON


_shared_cache: list[Path] = []


def shared_jax_cache() -> Path:
    """The persistent compile cache this pytest process's MaxText runs share (one per xdist worker, each
    its own process), made on first use and removed at exit."""
    if not _shared_cache:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        path = Path(tempfile.mkdtemp(prefix=f"maxtext-jax-cache-{worker}-"))
        atexit.register(shutil.rmtree, path, True)
        _shared_cache.append(path)
    return _shared_cache[0]


def maxtext_args(out: Path, run_name: str, steps: int, *extra: str, fresh_cache: bool = False, **kw: Any) -> list[str]:
    """:func:`simjob.maxtext.job.maxtext_args` on :func:`shared_jax_cache`, warm with the programs of the
    runs before. JAX's persistent compilation cache keys an entry on the program, the jaxlib version, the
    XLA flags, the compile options (with the device assignment) and the devices
    (docs.jax.dev/en/latest/persistent_compilation_cache.html, "Cache key"; jax/_src/cache_key.py), so a hit
    runs the executable that compile would have built: the same numerics, less time. ``fresh_cache``: an
    empty cache of the run's own, as a new job's, for a test that asserts on compiles, cache hits, prepared
    programs or start-up figures."""
    if fresh_cache or "jax_cache" in kw:
        return job.maxtext_args(out, run_name, steps, *extra, **kw)
    return job.maxtext_args(out, run_name, steps, *extra, jax_cache=shared_jax_cache(), reuse_cache=True, **kw)


def cache_env(args: Sequence[str], env: dict[str, str] | None) -> dict[str, str] | None:
    """``env`` for a run on :func:`shared_jax_cache` caching every program it compiles (``env`` wins)."""
    if not _shared_cache or f"jax_cache_dir={_shared_cache[0]}" not in args:
        return env
    # JAX caches only programs that took a second to compile (its default); the tiny model's take less on an
    # idle machine, and each later run would compile every program skipped again.
    return {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", **(env or {})}


class MaxTextRun(job.MaxTextRun):
    """:class:`simjob.maxtext.job.MaxTextRun`, failing the test (never skipping it) without the MaxText venv."""

    def __init__(
        self, name: str, args: Sequence[str], out: Path, *, env: dict[str, str] | None = None, **kw: Any
    ) -> None:
        super().__init__(name, args, out, python=require_maxtext_venv(), env=cache_env(args, env), **kw)
