"""``elastic-sidecar demo --mode multi-controller``: now a mode of :mod:`simjob.harness`.

Kept while :mod:`agent.cli` imports :func:`run_mc_demo` from here.
"""

from simjob.harness import run_demo as run_mc_demo

__all__ = ["run_mc_demo"]
