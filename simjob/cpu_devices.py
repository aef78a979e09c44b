"""The environment of a JAX process that runs ``n`` virtual CPU devices (the stand-in for a TPU slice's chips).

``--xla_force_host_platform_device_count`` gives the process ``n`` CPU devices. XLA:CPU runs every
device's program on one thread pool of ``max(DefaultThreadPoolSize(), n)`` threads
(``xla/pjrt/cpu/cpu_client.cc``; ``DefaultThreadPoolSize`` in ``xla/pjrt/utils.cc`` reads ``PJRT_NPROC``,
else ``NPROC``, else the core count), and its in-process collectives block the thread they run on while
they wait for every participant (``InProcessCommunicator``). Collectives of one device may overlap (a
collective is a scheduling dependency of the next, not a completion one: ``xla/runtime/execution_graph.h``),
so with only ``n`` threads all of them can block while one device's part of the collective waits for a
free thread: XLA aborts after 40 s ("Termination timeout for `all reduce RendezvousKey...`"). Seen in
MaxText runs on 8 devices after a shrink and a grow (every elastic run of one quick benchmark round before
this, intermittently in tests). More threads than can block at once
remove that starvation; the extra threads cost nothing while they sleep. A TPU runs each chip's program
on the chip, so this is a property of the CPU stand-in only.
"""

from __future__ import annotations

import os

THREADS_PER_DEVICE = 8
"""XLA:CPU threads per virtual device: up to 4 workers of one device's program can each block in a
collective (``ExecuteSession::kMaxWorkers``), twice that leaves room for the devices still computing."""


def cpu_device_env(devices: int) -> dict[str, str]:
    """``XLA_FLAGS`` and ``PJRT_NPROC`` for a process with ``devices`` virtual CPU devices (JAX on the CPU)."""
    if devices < 1:
        raise ValueError(f"devices={devices}: expected a whole number >= 1")
    threads = max(os.cpu_count() or 1, THREADS_PER_DEVICE * devices)
    return {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "PJRT_NPROC": str(threads),
    }
