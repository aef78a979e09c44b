"""In-process hooks the training loop calls; light by design.

Importing this package imports grpcio and protobuf only: never the daemon
(``agent``), aiohttp, or a Pub/Sub client. The per-step call costs a deque
check when nothing is pending.
"""

from trainer_hooks.session import (
    AbortTraining,
    Directive,
    ElasticSession,
    ElasticSettings,
    FlushResult,
    SidecarAddressError,
    is_slice_down,
)

__all__ = [
    "AbortTraining",
    "Directive",
    "ElasticSession",
    "ElasticSettings",
    "FlushResult",
    "SidecarAddressError",
    "is_slice_down",
]
