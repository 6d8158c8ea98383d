"""Requests from a client (the gateway, the bench) to bookies over NATS, in
the binary wire codec: the `shared.protocol.transport.BookieTransport` over NATS.

A thin transport: every failure to get a decodable answer (timeout, no responder, a micro
error, a malformed reply) is a `BookieUnreachable`, which the cores treat as "this replica
did not answer"."""

from __future__ import annotations

import json

from nats.aio.client import Client as NatsClient

from shared import wire
from shared.protocol.transport import BookieUnreachable
from shared.requests import request
from shared.status import BookieStatus
from shared.subjects import Subjects
from shared.telemetry import inject_headers

# Room for the wire framing around the items of one request.
REQUEST_OVERHEAD_BYTES = 4096
MICRO_ERROR_HEADER = "Nats-Service-Error"
# A bookie that has no responder is most likely dead: ask again only briefly (60 ms), so
# that its replacement is not held up, yet a bookie that is just starting is not replaced.
NO_RESPONDERS_RETRIES = 2


class BookieClient:
    """BookieTransport over NATS."""

    def __init__(
        self, nc: NatsClient, subjects: Subjects, *, add_timeout_ms: int, read_timeout_ms: int
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._add_timeout_s = add_timeout_ms / 1000
        self._read_timeout_ms = read_timeout_ms
        self._read_timeout_s = read_timeout_ms / 1000

    @property
    def max_send_bytes(self) -> int:
        """The most item bytes one request may carry: under the server's max_payload."""
        return max(self._nc.max_payload - REQUEST_OVERHEAD_BYTES, 1024)

    async def _request(self, bookie_id: str, op: str, body: bytes, timeout_s: float) -> bytes:
        subject = self._subjects.bookie(bookie_id, op)
        try:
            msg = await request(
                self._nc,
                subject,
                body,
                timeout_s=timeout_s,
                headers=inject_headers(),
                retries=NO_RESPONDERS_RETRIES,
            )
        except TimeoutError as exc:  # nats.errors.TimeoutError is one
            raise BookieUnreachable(
                f"{op} to {bookie_id}: timed out after {timeout_s} s", timed_out=True
            ) from exc
        except Exception as exc:  # no responders, connection closed, payload too big
            raise BookieUnreachable(f"{op} to {bookie_id}: {type(exc).__name__}") from exc
        if msg.headers and MICRO_ERROR_HEADER in msg.headers:
            raise BookieUnreachable(f"{op} to {bookie_id}: {msg.headers[MICRO_ERROR_HEADER]}")
        return msg.data

    async def add(
        self, bookie_id: str, items: list[wire.AddItem]
    ) -> tuple[BookieStatus, list[wire.AddResult]]:
        data = await self._request(
            bookie_id, "add", wire.encode_add_request(items), self._add_timeout_s
        )
        try:
            return wire.decode_add_reply(data)
        except wire.WireError as exc:
            raise BookieUnreachable(f"add reply from {bookie_id}: {exc}") from exc

    async def read(
        self, bookie_id: str, items: list[wire.ReadItem]
    ) -> tuple[BookieStatus, list[wire.ReadResult]]:
        """The request carries this client's read timeout: the bookie drops it unread once
        it waited that long in its queue (nobody waits for the answer any more)."""
        body = wire.encode_read_request(items, self._read_timeout_ms)
        data = await self._request(bookie_id, "read", body, self._read_timeout_s)
        try:
            return wire.decode_read_reply(data)
        except wire.WireError as exc:
            raise BookieUnreachable(f"read reply from {bookie_id}: {exc}") from exc

    async def fence(self, bookie_id: str, ledger_id: int, master_key: bytes) -> wire.LacReply:
        """Fence the ledger on the bookie (durable before it answers); its LAC comes back."""
        data = await self._request(
            bookie_id,
            "fence",
            wire.encode_fence_request(ledger_id, master_key),
            self._read_timeout_s,
        )
        try:
            return wire.decode_lac_reply(data)
        except wire.WireError as exc:
            raise BookieUnreachable(f"fence reply from {bookie_id}: {exc}") from exc

    async def write_lac(self, bookie_id: str, items: list[wire.WriteLacItem]) -> list[BookieStatus]:
        """Explicit LACs of one or more ledgers: one status each."""
        data = await self._request(
            bookie_id, "write_lac", wire.encode_write_lac_request(items), self._add_timeout_s
        )
        try:
            return wire.decode_write_lac_reply(data, len(items))
        except wire.WireError as exc:
            raise BookieUnreachable(f"write_lac reply from {bookie_id}: {exc}") from exc

    async def read_lac(self, bookie_id: str, ledger_id: int) -> wire.LacReply:
        data = await self._request(
            bookie_id, "read_lac", wire.encode_read_lac_request(ledger_id), self._read_timeout_s
        )
        try:
            return wire.decode_lac_reply(data)
        except wire.WireError as exc:
            raise BookieUnreachable(f"read_lac reply from {bookie_id}: {exc}") from exc

    async def info(self, bookie_id: str, timeout_s: float = 2.0) -> dict:
        """What the bookie says of itself (its journal's `info`): space, state, marks, files."""
        data = await self._request(bookie_id, "info", b"", timeout_s)
        try:
            return json.loads(data)
        except ValueError as exc:
            raise BookieUnreachable(f"info from {bookie_id}: not JSON") from exc


__all__ = ["BookieClient", "BookieUnreachable"]
