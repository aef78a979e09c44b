"""``python -m simjob.maxtext <MaxText arguments>``: the served MaxText on the CPU.

The same entry point as ``python -m trainer_hooks.maxtext``; with
``ELASTIC_SIDECAR_TEST_CPU_ELASTIC=1`` it first applies
:mod:`simjob.maxtext.cpu_elastic` so MaxText's elastic path runs on the CPU
(CPU slices, and a slice that can die while a step runs). Tests and benchmarks only.
"""

import os

from simjob.maxtext import cpu_elastic

if __name__ == "__main__":
    if os.environ.get(cpu_elastic.ENV) == "1":
        cpu_elastic.apply()
    from trainer_hooks.maxtext import main

    main()
