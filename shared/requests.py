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

from shared.natsfast import Requests
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
    requests: Requests | None = None,
) -> Msg:
    """`requests`: the lean request path over `nc` (`shared.natsfast`) to send by, if any."""
    if not recording():
        return await _request(nc, subject, data, timeout_s, headers, retries, requests)
    with nats_client_span(subject):
        headers = inject_headers(headers)
        return await _request(nc, subject, data, timeout_s, headers, retries, requests)


async def _request(
    nc: NatsClient,
    subject: str,
    data: bytes,
    timeout_s: float,
    headers: dict[str, str] | None,
    retries: int,
    requests: Requests | None,
) -> Msg:
    for attempt in range(retries + 1):
        try:
            if requests is not None:
                return await requests.request(subject, data, timeout_s, headers)
            return await nc.request(subject, data, timeout=timeout_s, headers=headers)
        except NoRespondersError:
            if attempt == retries:
                raise
            await asyncio.sleep(NO_RESPONDERS_BACKOFF_S * (attempt + 1))
    raise AssertionError("unreachable")
