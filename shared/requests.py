"""NATS request/reply with the one retry that is always safe.

"No responders" means nobody took the request, so nothing happened: asking again a few
times, briefly, is safe. It happens for real while a service starts or restarts (its
subscription is moments away), and now and then right after a subscription was flushed
(seen on this NATS server). Timeouts are not retried: the outcome is unknown.

A request made in a sampled span runs in a CLIENT span whose `traceparent` it carries."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import NoRespondersError

from shared.telemetry import inject_headers, nats_client_span, recording

NO_RESPONDERS_RETRIES = 5
NO_RESPONDERS_BACKOFF_S = 0.02


async def request(
    nc: NatsClient,
    subject: str,
    data: bytes,
    *,
    timeout_s: float,
    headers: dict[str, str] | None = None,
    retries: int = NO_RESPONDERS_RETRIES,
) -> Msg:
    if not recording():
        return await _request(nc, subject, data, timeout_s, headers, retries)
    with nats_client_span(subject):
        return await _request(nc, subject, data, timeout_s, inject_headers(headers), retries)


async def _request(
    nc: NatsClient,
    subject: str,
    data: bytes,
    timeout_s: float,
    headers: dict[str, str] | None,
    retries: int,
) -> Msg:
    for attempt in range(retries + 1):
        try:
            return await nc.request(subject, data, timeout=timeout_s, headers=headers)
        except NoRespondersError:
            if attempt == retries:
                raise
            await asyncio.sleep(NO_RESPONDERS_BACKOFF_S * (attempt + 1))
    raise AssertionError("unreachable")
