"""Stand-in for Kueue, JobSet and GKE bringing a lost slice back.

On GKE, losing one node of a multi-host TPU slice recreates every VM of the
slice (FACTS section 4), and the replacement pods start after scheduling and
provisioning, which takes minutes in real clusters. Here a lost slice is
recreated ``delay`` seconds after the loss by calling ``recreate(slice)``.
"""

from __future__ import annotations

from collections.abc import Callable


class Provisioner:
    def __init__(self, delay: float, recreate: Callable[[int], None], *, enabled: bool = True) -> None:
        self.delay = delay
        self.enabled = enabled
        self._recreate = recreate
        self._due: dict[int, float] = {}

    def slice_lost(self, slice_index: int, now: float) -> None:
        if self.enabled and slice_index not in self._due:
            self._due[slice_index] = now + self.delay

    def poll(self, now: float) -> list[int]:
        done = [s for s, t in self._due.items() if t <= now]
        for s in done:
            del self._due[s]
            self._recreate(s)
        return done
