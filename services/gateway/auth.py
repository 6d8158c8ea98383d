"""Bearer-token authentication of the gateway's APIs (QUIRE_API_TOKENS).

With no tokens configured, authentication is off (the local cluster's default, bound to
127.0.0.1). With tokens, every HTTP endpoint but /healthz and /readyz, and every gRPC
method but health checking, needs `Authorization: Bearer <token>`; without a valid one
HTTP answers 401 UNAUTHORIZED (problem+json) and gRPC UNAUTHENTICATED.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from services.gateway.problems import api_problem
from shared.status import ApiCodes

OPEN_HTTP_PATHS = frozenset({"/healthz", "/readyz"})


class TokenError(ValueError):
    """QUIRE_API_TOKENS cannot be read."""


def load_tokens(spec: str) -> frozenset[str]:
    """Tokens from QUIRE_API_TOKENS: comma-separated, or `@/path` to a file with one token a
    line (blank lines and `#` comments ignored). Empty: authentication off."""
    spec = spec.strip()
    if not spec:
        return frozenset()
    if spec.startswith("@"):
        path = Path(spec[1:])
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise TokenError(f"cannot read the token file {path}: {exc}") from exc
        tokens = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    else:
        tokens = [token.strip() for token in spec.split(",") if token.strip()]
    if not tokens:
        raise TokenError("QUIRE_API_TOKENS names no token")
    return frozenset(tokens)


class TokenAuth:
    def __init__(self, tokens: frozenset[str]) -> None:
        self._tokens = tuple(t.encode() for t in tokens)

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def allows(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header value carries a valid bearer token. Every
        token is compared, in constant time, so timing tells nothing."""
        if not self.enabled:
            return True
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not credentials:
            return False
        given = credentials.strip().encode()
        found = False
        for token in self._tokens:
            found |= hmac.compare_digest(given, token)
        return found


class BearerAuthMiddleware:
    """ASGI middleware: refuses unauthenticated HTTP requests before any route runs."""

    def __init__(self, app: ASGIApp, auth: TokenAuth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_HTTP_PATHS or not self.auth.enabled:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if self.auth.allows(authorization):
            await self.app(scope, receive, send)
            return
        response = api_problem(
            ApiCodes.UNAUTHENTICATED,
            "a valid bearer token is required (Authorization: Bearer <token>)",
            headers={"WWW-Authenticate": 'Bearer realm="quire"'},
        )
        await response(scope, receive, send)
