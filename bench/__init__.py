"""Benchmarks of elastic-sidecar: ``python -m bench <name> [--quick] [--json PATH]``.

Names: recovery, detection, scale, footprint, all. Results merge into ``docs/benchmarks.json``;
``python -m bench.report`` renders ``docs/benchmarks.md`` (and its plot) from that file alone.
"""
