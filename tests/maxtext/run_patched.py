"""``python -m tests.maxtext.run_patched <MaxText arguments>``: the served MaxText for tests.

The same entry point as ``python -m trainer_hooks.maxtext``; with
``ELASTIC_SIDECAR_TEST_CPU_ELASTIC=1`` it first applies
:mod:`tests.maxtext.cpu_elastic_support` so MaxText's elastic path runs on
the CPU. Test support only.
"""

import os

from tests.maxtext import cpu_elastic_support

if __name__ == "__main__":
    if os.environ.get(cpu_elastic_support.ENV) == "1":
        cpu_elastic_support.apply()
    from trainer_hooks.maxtext import main

    main()
