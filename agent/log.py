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
import json
import logging
import sys
import time
from collections.abc import Callable
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

MAX_VALUE_CHARS = 4096
"""The longest string value a log line or journal record keeps whole: longer ones (a peer's error text,
a reason quoting one) are cut, marked with how much was cut."""
MAX_LINE_BYTES = 64 * 1024
"""The longest log line or journal line (Cloud Logging takes 256 KB an entry). A record still longer
after its values are cut keeps its short fields and says it was cut."""
TRUNCATED_KEY = "truncated"

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


def _cut(value: Any, max_chars: int) -> Any:
    if isinstance(value, str):
        if len(value) <= max_chars:
            return value
        return f"{value[:max_chars]}...[cut {len(value) - max_chars} of {len(value)} characters]"
    if isinstance(value, dict):
        return {k: _cut(v, max_chars) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [_cut(v, max_chars) for v in value[:100]]
        if len(value) > 100:
            items.append(f"...[cut {len(value) - 100} of {len(value)} items]")
        return items
    return value


def bounded(record: dict[str, Any], max_bytes: int = MAX_LINE_BYTES, max_chars: int = MAX_VALUE_CHARS) -> str:
    """``record`` as one JSON line of at most ``max_bytes`` (newline excluded).

    Long strings are cut first (each keeps its first ``max_chars`` characters and a marker saying
    how much went); if the line is still too long, only the record's short fields stay, with
    ``"truncated"`` saying how long the whole line was.
    """
    line = json.dumps(record, default=str)
    if len(line.encode()) <= max_bytes:
        return line
    whole = len(line.encode())
    line = json.dumps(
        {**_cut(record, max_chars), TRUNCATED_KEY: f"a line of {whole} bytes, long values cut"}, default=str
    )
    if len(line.encode()) <= max_bytes:
        return line
    short: dict[str, Any] = {k: v for k, v in record.items() if isinstance(v, int | float | bool) or v is None}
    short.update({k: v[:200] for k, v in record.items() if isinstance(v, str)})
    short[TRUNCATED_KEY] = f"a line of {whole} bytes: only its short fields are kept"
    line = json.dumps(short, default=str)
    if len(line.encode()) <= max_bytes:
        return line
    return json.dumps({TRUNCATED_KEY: f"a line of {whole} bytes: too many fields to keep any"})


def _bounded_values(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """Log lines keep long values short (a peer's error text quoted whole would make a line of megabytes)."""
    for k, v in event.items():
        if isinstance(v, str | dict | list | tuple) and k != "exception":
            event[k] = _cut(v, MAX_VALUE_CHARS)
    return event


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
            _bounded_values,
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


class Backoff:
    """When to log a warning that repeats: the first time, then after intervals that double up to
    ``ceiling`` seconds, so a long outage still shows now and then without a line per retry.
    ``due()`` returns how many occurrences were held back since the last one logged, or None."""

    def __init__(self, first: float = 1.0, ceiling: float = 300.0, clock: Callable[[], float] = time.monotonic):
        self.first, self.ceiling, self.clock = first, ceiling, clock
        self.reset()

    def reset(self) -> None:
        """The condition cleared: its next occurrence is logged at once."""
        self._next_at: float | None = None
        self._interval = self.first
        self._held = 0

    def due(self) -> int | None:
        now = self.clock()
        if self._next_at is not None and now < self._next_at:
            self._held += 1
            return None
        if self._next_at is not None:
            self._interval = min(self._interval * 2, self.ceiling)
        self._next_at = now + self._interval
        held, self._held = self._held, 0
        return held
