"""The real MaxText as a simulated multi-slice job on the CPU: shared by tests/maxtext and the recovery benchmark.

* :mod:`simjob.maxtext.cpu_elastic` - stand-ins applied inside a MaxText
  process: CPU devices that carry a ``slice_index`` (so MaxText's own
  multi-slice mesh and pathwaysutils' slice grouping run), Pathways detected
  (its elastic path), a slice that dies while a step runs with the error
  surfacing at a later read or wait, and a per-step event log.
* :mod:`simjob.maxtext.grain_data` - a small pre-tokenized ArrayRecord data
  set for MaxText's grain pipeline, written by the tests themselves.
* ``python -m simjob.maxtext <MaxText arguments>`` - the served MaxText
  (``python -m trainer_hooks.maxtext``) with those patches applied first.
* :mod:`simjob.maxtext.job` - what drives it from the main venv: the tiny
  model's arguments, a MaxText subprocess of the MaxText venv, and a real
  coordinator on an event-loop thread of the driving process.

Nothing in ``agent/`` or ``trainer_hooks/`` imports this package. Importing it
imports neither MaxText nor JAX.
"""
