"""Benchmarks of elastic-sidecar: ``python -m bench <name> [--quick] [--json PATH]``.

Names: recovery, detection, scale, flush, footprint, all. Results go to
``docs/benchmarks.md`` (with PNG plots beside it) and ``docs/benchmarks.json``.
"""
