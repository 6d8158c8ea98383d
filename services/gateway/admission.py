"""Admission control for the HTTP API: a bound on requests in flight per client (429
TOO_MANY_REQUESTS with Retry-After beyond it) and a deadline on each request's progress (504
TIMEOUT before the answer starts; a streamed answer that stalls that long is cut).

A client is its bearer token when it sends one, else its address. The LAC long poll is
bounded by its own `timeout_ms` (at most long_poll_max_timeout_ms), not by the deadline.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import defaultdict

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.problems import ResponseCut, api_problem
from shared.status import ApiCodes, QuireError

RETRY_AFTER_S = 1


def client_key(scope: Scope) -> str:
    """Who is asking: a hash of the bearer token, else the peer address."""
    for name, value in scope.get("headers") or ():
        if name == b"authorization" and value:
            return "token:" + hashlib.sha256(value).hexdigest()[:16]
    client = scope.get("client")
    return f"addr:{client[0]}" if client else "addr:unknown"


def is_long_poll(scope: Scope) -> bool:
    return scope["path"].endswith("/lac") and b"timeout_ms" in scope.get("query_string", b"")


class AdmissionControl:
    """ASGI middleware: per-client concurrency bound, and a per-request deadline."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_in_flight_per_client: int,
        request_timeout_ms: int,
        long_poll_timeout_ms: int,
    ) -> None:
        self.app = app
        self.max_in_flight = max_in_flight_per_client
        self.request_timeout_s = request_timeout_ms / 1000
        # A long poll waits up to its own timeout_ms: its deadline is longer.
        self.long_poll_timeout_s = long_poll_timeout_ms / 1000
        self.in_flight: dict[str, int] = defaultdict(int)
        self.rejected = 0
        self.timed_out = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in ("/healthz", "/readyz", "/metrics"):
            await self.app(scope, receive, send)
            return
        key = client_key(scope)
        if self.in_flight[key] >= self.max_in_flight:
            self.rejected += 1
            response = api_problem(
                ApiCodes.TOO_MANY_REQUESTS,
                f"more than {self.max_in_flight} requests in flight from this client",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
            await response(scope, receive, send)
            return
        self.in_flight[key] += 1
        try:
            await self._with_deadline(scope, receive, send)
        finally:
            self.in_flight[key] -= 1
            if not self.in_flight[key]:
                del self.in_flight[key]

    async def _with_deadline(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False
        timeout_s = self.long_poll_timeout_s if is_long_poll(scope) else self.request_timeout_s
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s) as deadline:

                async def tracking_send(message: Message) -> None:
                    nonlocal started
                    started = started or message["type"] == "http.response.start"
                    if message["type"] != "http.response.body" or deadline.expired():
                        await send(message)
                        return
                    # The deadline is on the gateway's progress: each part of a body it
                    # writes starts it anew (a range read streams for as long as it goes
                    # on), and the time a slow client takes to accept a part does not count.
                    deadline.reschedule(None)
                    await send(message)
                    deadline.reschedule(loop.time() + timeout_s)

                await self.app(scope, receive, tracking_send)
        except TimeoutError:
            self.timed_out += 1
            if started:  # too late for a 504
                stalled = QuireError(ApiCodes.TIMEOUT, f"no progress within {timeout_s:.1f} s")
                raise ResponseCut(stalled) from None
            response = api_problem(
                ApiCodes.TIMEOUT, f"the request took longer than {timeout_s:.1f} s"
            )
            await response(scope, receive, send)
