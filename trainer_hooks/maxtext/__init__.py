"""Serve the real MaxText: the sidecar's hooks in MaxText's pre-training loop, without a fork.

Start MaxText through it with the usual MaxText arguments::

    ELASTIC_SIDECAR_ADDRESS=127.0.0.1:29313 ELASTIC_SIDECAR_JOB=my-job \\
        python -m trainer_hooks.maxtext src/maxtext/configs/base.yml run_name=... [key=value ...]

Port 29313 is the coordinator's trainer link (its ``--trainer-listen``); when
the coordinator demands a token, ``ELASTIC_SIDECAR_TOKEN_FILE`` names the file
holding it. (The config ``.yml`` is optional, as for
``python -m maxtext.trainers.pre_train.train``; MaxText resolves
``src/maxtext/configs/...`` against the installed wheel.)
``ELASTIC_SIDECAR_SNAPSHOT_EVERY`` sets the snapshot interval (steps, 0 for
none, or ``auto``, the default). Without
``ELASTIC_SIDECAR_ADDRESS`` MaxText runs unchanged, with a warning on stderr.
``python -m trainer_hooks.maxtext --check`` says whether the installed
MaxText, pathwaysutils, Orbax and JAX are releases the hook was verified
against (:mod:`trainer_hooks.maxtext.compat`), starting nothing.
See :mod:`trainer_hooks.maxtext.hook` for what is wrapped and how holds,
flushes, resumes and aborts map onto MaxText.

Importing this package imports neither MaxText nor JAX; they load when
:func:`main` runs.
"""

from trainer_hooks.maxtext.hook import ENV_ADDRESS, ENV_JOB, EXIT_RESTART, MaxTextHook, main, settings_from_config

__all__ = ["ENV_ADDRESS", "ENV_JOB", "EXIT_RESTART", "MaxTextHook", "main", "settings_from_config"]
