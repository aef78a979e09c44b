"""Baseline recovery strategies for the recovery benchmark (``python -m bench recovery``).

The benchmark runs the same simulated job (the example trainer's model, step
time, checkpoint period, stand-in Pathways workers and provisioner) under
three strategies and compares them:

* :mod:`simjob.strategies.full_restart` - what a JobSet restart does: every
  process stops on the fault, the job waits until all slices are available
  again (the provisioning delay), starts the trainer afresh and restores the
  last periodic checkpoint.
* :mod:`simjob.strategies.checkpoint_rewind` - what MaxText does with
  ``elastic_enabled``: the training function runs under pathwaysutils'
  ``Manager.elastic_retry``, learns of the loss from ``DATA_LOSS`` and re-runs
  from the last committed checkpoint (also when it grows back).
* elastic-sidecar itself - the real ``elastic-sidecar demo``.

:mod:`simjob.strategies.cpu_slices` is test support only: it lets
pathwaysutils' ``Manager`` run on plain CPU devices (which carry no
``slice_index``) grouped into simulated slices. Nothing in ``agent/`` or
``trainer_hooks/`` imports this package.

Every strategy writes the demo's trainer event log (``trainer-events.jsonl``:
``start``, ``resumed``, ``step``, ``step_failed``, ``finished``) and a summary
computed by :func:`simjob.summary.summarize`, so the benchmark reads all three
the same way.
"""
