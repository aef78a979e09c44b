"""Structured logs: one JSON object per line in Cloud Logging's format.

Cloud Logging lifts these fields out of a JSON line on stdout (FACTS section 7):
``severity``, ``message``, ``time``, ``logging.googleapis.com/sourceLocation``,
``logging.googleapis.com/labels`` and ``logging.googleapis.com/operation``. The
labels carry the job, slice, host and generation; the operation ties together
every line of one recovery (``id`` = ``recovery-<generation>``).
``--log-format console`` renders the same events for a person at a terminal.

The process's labels (``jobset``, ``role``, and for workers ``slice`` and
``host``) are fixed by :func:`configure` and added to every line, whichever
task or thread logs it (Pub/Sub callbacks run on their own threads). Records
of the standard ``logging`` module (grpc, aiohttp, the Pub/Sub client) go
through the same renderer, so stdout holds nothing but these JSON lines.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import UTC, datetime
from typing import Any

import structlog

_LEVEL_TO_SEVERITY = {
    "debug": "DEBUG",
    "info": "INFO",
    "warning": "WARNING",
    "warn": "WARNING",
    "error": "ERROR",
    "critical": "CRITICAL",
    "exception": "ERROR",
}

LABELS_KEY = "logging.googleapis.com/labels"
OPERATION_KEY = "logging.googleapis.com/operation"
SOURCE_KEY = "logging.googleapis.com/sourceLocation"
_LABEL_FIELDS = ("jobset", "role", "slice", "host", "generation")
_static_labels: dict[str, str] = {}
"""The process's own labels, set by :func:`configure`."""


def _cloud_logging(_: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "severity": _LEVEL_TO_SEVERITY.get(event.pop("level", method), "DEFAULT"),
        "message": str(event.pop("event", "")),
        "time": datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
    }
    labels = {**_static_labels, **{k: str(event.pop(k)) for k in _LABEL_FIELDS if k in event}}
    if labels:
        out[LABELS_KEY] = labels
    op = event.pop("operation", None)
    if op:
        out[OPERATION_KEY] = {"id": op, "producer": "elastic-sidecar", **event.pop("operation_flags", {})}
    loc = {k: event.pop(k) for k in ("pathname", "lineno", "func_name") if k in event}
    if loc:
        out[SOURCE_KEY] = {
            "file": loc.get("pathname", ""),
            "line": str(loc.get("lineno", "")),
            "function": loc.get("func_name", ""),
        }
    out.update(event)
    return out


def _console_labels(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    # At a terminal the job name is noise; who is speaking is not.
    for k in ("role", "slice", "host"):
        if k in _static_labels:
            event.setdefault(k, _static_labels[k])
    return event


class _StdlibBridge(logging.Handler):
    """Sends records of the standard logging module through structlog."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            logger = structlog.get_logger(record.name)
            fields: dict[str, Any] = {"logger": record.name}
            if record.exc_info:
                fields["exc_info"] = record.exc_info
            logger.log(record.levelno, record.getMessage(), **fields)
        except Exception:  # logging must never take the daemon down
            self.handleError(record)


def configure(fmt: str = "json", level: str = "info", **labels: Any) -> None:
    """Set up structlog for this process; ``labels`` go on every line."""
    if fmt not in ("json", "console"):
        raise ValueError(f"--log-format must be 'json' or 'console', got {fmt!r}")
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        raise ValueError(f"--log-level must be one of debug, info, warning, error; got {level!r}")
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.format_exc_info,
    ]
    if fmt == "json":
        processors += [
            structlog.processors.CallsiteParameterAdder(
                [
                    structlog.processors.CallsiteParameter.PATHNAME,
                    structlog.processors.CallsiteParameter.LINENO,
                    structlog.processors.CallsiteParameter.FUNC_NAME,
                ],
                # A library's record: point at the library's line, not at the bridge.
                additional_ignores=["logging", __name__],
            ),
            _cloud_logging,
            structlog.processors.JSONRenderer(default=str),
        ]
    else:
        processors += [
            _console_labels,
            structlog.processors.TimeStamper(fmt="%H:%M:%S.%f"),
            structlog.dev.ConsoleRenderer(colors=False),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    _static_labels.clear()
    _static_labels.update({k: str(v) for k, v in labels.items() if v is not None})
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h, _StdlibBridge)]:
        root.removeHandler(h)
    root.addHandler(_StdlibBridge())
    # Libraries only speak up for warnings unless this daemon runs at debug level.
    root.setLevel(lvl if lvl <= logging.DEBUG else max(lvl, logging.WARNING))
    # google-api-core turns propagation of the "google" logger off the first time a client is
    # built, unless that logger is already configured: then the Pub/Sub client's records would
    # bypass these JSON lines. Configure it (a level of its own) and keep it propagating.
    google = logging.getLogger("google")
    google.setLevel(root.level)
    google.propagate = True
    quiet_cancelled_rpcs()


def _not_a_cancelled_rpc(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, asyncio.CancelledError)


def quiet_cancelled_rpcs() -> None:
    """Drop grpc.aio's ERROR record (with a multi-line traceback) for a handler cancelled at shutdown.

    ``server.stop()`` cancels the streams still open (a worker's Join, a health Watch);
    that is how a server ends, not an error.
    """
    lg = logging.getLogger("grpc._cython.cygrpc")
    if _not_a_cancelled_rpc not in lg.filters:
        lg.addFilter(_not_a_cancelled_rpc)


def get(name: str = "elastic-sidecar") -> Any:
    return structlog.get_logger(name)
