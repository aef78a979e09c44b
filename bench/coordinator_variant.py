"""BENCHMARK ONLY: the coordinator with two scale changes applied in-process, as a what-if.

``python -m bench.coordinator_variant coordinator ...`` runs ``agent.cli.main``
after patching, in this process only:

* ``BENCH_KEEPALIVE_MS``: the transport keepalive interval of the coordinator's
  server (``agent.constants.GRPC_SERVER_KEEPALIVE_OPTIONS``; the daemons use
  500 ms), and the minimum ping interval it permits;
* ``BENCH_MEMO_UP_SLICES=1``: ``State.up_slices()`` remembers its answer for
  the last ``State`` object (states are immutable), so the 50 ms tick no
  longer walks every host when nothing changed.

It measures what the changes proposed in docs/benchmarks.md would buy; it
changes nothing in ``agent/``.
"""

from __future__ import annotations

import os
import sys


def _patch() -> None:
    from agent import constants as C

    ka = os.environ.get("BENCH_KEEPALIVE_MS")
    if ka:
        ms = int(ka)

        def adjust(opts: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
            out = []
            for k, v in opts:
                if k == "grpc.keepalive_time_ms":
                    v = ms
                elif k in ("grpc.http2.min_ping_interval_without_data_ms", "grpc.http2.min_time_between_pings_ms"):
                    v = min(v, ms // 2)
                out.append((k, v))
            return tuple(out)

        C.GRPC_SERVER_KEEPALIVE_OPTIONS = adjust(C.GRPC_SERVER_KEEPALIVE_OPTIONS)
    if os.environ.get("BENCH_MEMO_UP_SLICES") == "1":
        from agent.core import model

        original = model.State.up_slices
        last: list[object] = [None, None]

        def up_slices(self: model.State) -> frozenset[int]:
            if last[0] is self:
                return last[1]  # type: ignore[return-value]
            v = original(self)
            last[0], last[1] = self, v
            return v

        model.State.up_slices = up_slices  # type: ignore[method-assign]


def main() -> int:
    _patch()
    from agent.cli import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
