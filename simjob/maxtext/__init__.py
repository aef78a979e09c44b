"""The real MaxText as a simulated multi-slice job on the CPU: shared by tests/maxtext and the recovery benchmark.

* :mod:`simjob.maxtext.cpu_elastic` - patches applied inside a MaxText process
  so that its Pathways-only elastic path runs on CPU devices grouped into
  slices, with pathwaysutils' own device-loss simulator (a slice lost inside a
  step) and a per-step event log.
* ``python -m simjob.maxtext <MaxText arguments>`` - the served MaxText
  (``python -m trainer_hooks.maxtext``) with those patches applied first.
* :mod:`simjob.maxtext.job` - what drives it from the main venv: the tiny
  model's arguments, a MaxText subprocess of the MaxText venv, and a real
  coordinator on an event-loop thread of the driving process.

Nothing in ``agent/`` or ``trainer_hooks/`` imports this package. Importing it
imports neither MaxText nor JAX.
"""
