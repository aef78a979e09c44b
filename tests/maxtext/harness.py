"""What the MaxText tests share: the MaxText venv check, and :mod:`simjob.maxtext.job`'s driver.

The pytest process runs in the main venv and hosts a real
:class:`agent.coordinator.Coordinator` on an event loop of its own thread
(:class:`Sidecar`); MaxText runs as a subprocess of the separate MaxText venv
(:class:`MaxTextRun`), started through ``python -m trainer_hooks.maxtext``, or
``python -m simjob.maxtext`` (:data:`PATCHED_MODULE`) with the CPU elastic
patches. Both live in :mod:`simjob.maxtext.job` (the recovery benchmark drives
MaxText with them too); this module adds the venv check that fails a test.
"""

from __future__ import annotations

import subprocess
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
    maxtext_args,
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


class MaxTextRun(job.MaxTextRun):
    """:class:`simjob.maxtext.job.MaxTextRun`, failing the test (never skipping it) without the MaxText venv."""

    def __init__(self, name: str, args: Sequence[str], out: Path, **kw: Any) -> None:
        super().__init__(name, args, out, python=require_maxtext_venv(), **kw)
