"""Binding the daemon's gRPC listeners: a port another process holds is an error naming its flag.

grpcio sets ``SO_REUSEPORT`` on server ports unless told otherwise, so a second
process could bind a port this one holds and take some of its connections
(FACTS section 6); every server is built with
:data:`agent.constants.GRPC_SERVER_OPTIONS`, which turns that off, and binds
through :func:`bind` here. A failed bind in grpc's C core raises a bare
``RuntimeError`` and prints its cause as a plain-text line on the process's
stderr; :func:`bind` keeps that line out of the JSON log stream and puts its
cause into the error instead, which names the address and the flag that set it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator

import grpc

from agent import constants as C
from agent.auth import BearerAuthInterceptor, BearerToken

_BIND_ERROR = re.compile(r"Error in bind for address '[^']*': ([^)]*)\)")
_stderr_lock = threading.Lock()


class ListenError(OSError):
    """An address a server was told to listen on could not be bound."""


@contextlib.contextmanager
def _stderr_captured() -> Iterator[list[str]]:
    """Collect what is written to file descriptor 2 meanwhile (grpc's C core logs there directly)."""
    out: list[str] = []
    with _stderr_lock, tempfile.TemporaryFile() as tmp:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no stderr at all (closed): nothing to keep clean
            yield out
            return
        try:
            os.dup2(tmp.fileno(), 2)
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out.append(tmp.read().decode("utf-8", "replace"))


def bind(
    server: grpc.aio.Server,
    listen: str,
    flag: str,
    credentials: grpc.ServerCredentials | None = None,
) -> int:
    """Add ``listen`` to ``server`` and return the bound port.

    Raises :class:`ListenError` naming ``listen`` and ``flag`` (with the
    kernel's reason, e.g. "Address already in use") when it cannot be bound.
    """
    try:
        with _stderr_captured() as captured:
            port = (
                server.add_secure_port(listen, credentials)
                if credentials is not None
                else server.add_insecure_port(listen)
            )
    except RuntimeError:
        port = 0
    text = "".join(captured)
    if port:
        if text:
            sys.stderr.write(text)  # not ours to hide
        return port
    m = _BIND_ERROR.search(text)
    why = m.group(1) if m else (text.strip().splitlines() or ["address unavailable"])[-1]
    held = " (another process holds this port)" if "in use" in why.lower() else ""
    raise ListenError(f"could not listen on {listen} ({flag}): {why}{held}")


def grpc_server(
    token: BearerToken | None,
    service: str,
    label: str,
    on_refused: Callable[[str, str], None],
    options: tuple[tuple[str, int], ...] = C.GRPC_SERVER_KEEPALIVE_OPTIONS,
) -> grpc.aio.Server:
    """A gRPC server whose ``service`` needs ``token`` (when given); health stays open.
    ``on_refused(service, why)`` counts each refused call."""
    interceptors = []
    if token is not None:
        interceptors.append(BearerAuthInterceptor(token, [service], label=label, on_refused=on_refused))
    return grpc.aio.server(options=list(options), interceptors=interceptors)
