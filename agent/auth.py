"""Bearer tokens for the admin API and the peer (worker -> coordinator) service.

A token lives in a file: a mounted Kubernetes Secret (``deploy/common/secrets.yaml``),
read once at start-up. Calls carry it in the ``authorization`` metadata as
``Bearer <token>``; the server compares with :func:`hmac.compare_digest`.

What each port checks:

* admin port (``--admin-listen``): every ``elastic_sidecar.v1.Admin`` call needs
  the admin token (when ``--admin-token-file`` is given); ``grpc.health.v1`` and
  server reflection stay open so probes and ``grpcurl list`` work without it.
* coordinator port (``--listen``): ``elastic_sidecar.v1.Peer/Join`` needs the
  peer token (when ``--peer-token-file`` is given); ``grpc.health.v1`` stays open
  for kubelet probes.
* trainer port (``--trainer-listen``, ``127.0.0.1:29313`` by default): the
  ``TrainerLink`` lives on a listener of its own, on loopback, since the trainer
  runs in the coordinator's pod. Any other address needs ``--trainer-token-file``;
  the trainer hooks then present the token from the file named by
  ``ELASTIC_SIDECAR_TOKEN_FILE``. Without either, nobody outside the pod can
  evict the trainer's link, report ``Finished`` or rewrite the policy.

A refused call is logged with the method, the peer address and whether the
token was missing or wrong; the token itself is never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from agent import log as logmod
from agent.errors import ConfigError

log = logmod.get("auth")

PLACEHOLDER_PREFIX = "REPLACE-ME"
"""The repository's Secrets hold placeholders starting with this; a daemon must not run with one."""
METADATA_KEY = "authorization"
SCHEME = "Bearer"


class BearerToken:
    """A secret read from a file; its value never shows in ``repr`` or logs."""

    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str) -> None:
        self._value = value.encode("ascii")
        self.source = source
        """Where it came from (a file path), for messages."""

    def matches(self, presented: str) -> bool:
        try:
            candidate = presented.encode("ascii")
        except UnicodeEncodeError:
            return False
        return hmac.compare_digest(candidate, self._value)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata that presents this token."""
        return ((METADATA_KEY, f"{SCHEME} {self._value.decode('ascii')}"),)

    def __repr__(self) -> str:
        return f"BearerToken(source={self.source!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BearerToken) and hmac.compare_digest(self._value, other._value)

    def __hash__(self) -> int:
        return hash(self.source)


def read_token_file(path: str | Path, flag: str) -> BearerToken:
    """The token in ``path`` (surrounding whitespace stripped); ConfigError naming ``flag`` and the file otherwise."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{flag} {p}: no such file (mount the token Secret there)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{flag} {p}: cannot read the token file: {e}") from None
    token = raw.strip()
    if not token:
        raise ConfigError(f"{flag} {p} is empty; expected a bearer token (e.g. `openssl rand -hex 32`)")
    if token.startswith(PLACEHOLDER_PREFIX):
        raise ConfigError(
            f"{flag} {p} holds the repository's placeholder ({PLACEHOLDER_PREFIX}...); "
            "put a generated token in the Secret (deploy/README.md, 'Tokens')"
        )
    bad = sorted({c for c in token if not 0x21 <= ord(c) <= 0x7E})
    if bad:
        raise ConfigError(
            f"{flag} {p}: the token may only hold printable ASCII without spaces (it travels in gRPC metadata); "
            f"found {', '.join(repr(c) for c in bad[:5])}"
        )
    return BearerToken(token, str(p))


def presented_token(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    """The bearer token in call metadata; None when absent, "" when the header is malformed."""
    for key, value in metadata or ():
        if key.lower() != METADATA_KEY:
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() != SCHEME.lower():
            return ""
        return token.strip()
    return None


OnRefused = Callable[[str, str], None]
"""Called with (service label, "missing" | "wrong") for every refused call (metrics)."""


class BearerAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls to the protected services without the right bearer token (UNAUTHENTICATED).

    ``protected`` are full service names (``elastic_sidecar.v1.Admin``); every
    other method on the server (health, reflection, the trainer link) passes.
    """

    def __init__(
        self, token: BearerToken, protected: Sequence[str], *, label: str, on_refused: OnRefused | None = None
    ) -> None:
        self.token = token
        self.prefixes = tuple(f"/{name}/" for name in protected)
        self.label = label
        self.on_refused = on_refused

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = details.method or ""
        if not method.startswith(self.prefixes):
            return await continuation(details)
        presented = presented_token(details.invocation_metadata)
        if presented and self.token.matches(presented):
            return await continuation(details)
        handler = await continuation(details)
        if handler is None:  # an unknown method: let gRPC answer UNIMPLEMENTED
            return handler
        why = "missing" if presented is None else ("malformed" if presented == "" else "wrong")
        return self._refusal(handler, method, why)

    def _refusal(self, handler: grpc.RpcMethodHandler, method: str, why: str) -> grpc.RpcMethodHandler:
        label, on_refused = self.label, self.on_refused

        async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
            log.warning(
                f"{label} call refused: {why} bearer token",
                method=method,
                peer=context.peer(),
                token=why,
                service=label,
            )
            if on_refused is not None:
                on_refused(label, why)
            detail = {
                "missing": f"this call needs `{METADATA_KEY}: {SCHEME} <token>` metadata ({label} token)",
                "malformed": f"the `{METADATA_KEY}` metadata must be `{SCHEME} <token>`",
                "wrong": f"the {label} token does not match",
            }[why]
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, detail)

        kind = (handler.request_streaming, handler.response_streaming)
        factory = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[kind]
        return factory(
            refuse,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def server_credentials(cert_chain: bytes, private_key: bytes) -> grpc.ServerCredentials:
    """TLS for the admin port (server authentication only; clients present the bearer token)."""
    return grpc.ssl_server_credentials([(private_key, cert_chain)])
