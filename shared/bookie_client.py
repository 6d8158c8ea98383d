"""Requests from a client (the gateway, the bench) to bookies over NATS, in
the binary wire codec: the `shared.protocol.transport.BookieTransport` over NATS.

A thin transport: every failure to get a decodable answer (timeout, no responder, a micro
error, a malformed reply) is a `BookieUnreachable`, which the cores treat as "this replica
did not answer".

A request made for a traced operation is a CLIENT span `send <subject>` whose `traceparent`
travels in the NATS headers: any request while the current span records (a recovery's
fences and reads: `shared.requests.request` opens it), and an add request carrying traced
appends (`add(traced=...)`: child of the first, linked to the others), which a batch of
several ledgers' adds sends in no span of its own. Any other request carries no header."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Sequence

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from opentelemetry.trace import NonRecordingSpan, SpanContext, use_span

from shared import clock, wire
from shared.models import REGISTERED_AT, BookieInfo
from shared.natsfast import Requests
from shared.protocol.transport import BookieUnreachable
from shared.requests import request
from shared.status import BookieStatus
from shared.subjects import Subjects
from shared.telemetry import inject_headers, nats_client_span

# Room for the wire framing around the items of one request.
REQUEST_OVERHEAD_BYTES = 4096
MICRO_ERROR_HEADER = "Nats-Service-Error"
# A bookie that registered less than new_bookie_grace_ms ago (or that this client has not
# seen registered) may not have its subscriptions known everywhere yet: its "no responders"
# is asked again briefly (60 ms), so that a bookie that is just starting is not replaced.
# From a bookie registered longer ago, "no responders" means it is gone: a failed request at
# once (BookKeeper's client fails the write when the bookie's connection closes), so that
# the writer's ensemble change starts at the first failed write.
NEW_BOOKIE_GRACE_MS = 5_000
NO_RESPONDERS_RETRIES = 2
# How long a probe (has_responder) waits for the journal's answer; only "no responders",
# which comes at once, says anything.
PROBE_TIMEOUT_S = 1.0
# A bound on the registrations remembered (bookie ids that come and go).
MAX_BOOKIES_REMEMBERED = 10_000
# How long an operator call on a bookie's garbage collector (gc.details, gc.suspend, ...)
# waits by default: these answer from memory. A gc call with `wait` passes its own.
GC_ADMIN_TIMEOUT_S = 5.0


def wall_clock_ms() -> int:
    """Registrations are wall-clock times (stamped by the bookie's machine)."""
    return clock.wall_ms()


def no_responders_retries(registered_at_ms: int | None, now_ms: int, grace_ms: int) -> int:
    """How often to ask a bookie again after "no responders": briefly while it may still be
    starting (registered less than `grace_ms` ago, or not known registered), never after."""
    if registered_at_ms is not None and now_ms - registered_at_ms >= grace_ms:
        return 0
    return NO_RESPONDERS_RETRIES


class BookieAdminError(Exception):
    """A bookie answered an operator call with `{"ok": false, "error": code, "message": ...}`:
    BAD_REQUEST for input it refused (it changed nothing), GC_FAILED for a GC run that
    failed part way (what it did before stays done)."""

    def __init__(self, bookie_id: str, op: str, code: str, message: str) -> None:
        super().__init__(f"{op} on {bookie_id}: {code}: {message}")
        self.bookie_id, self.op, self.code, self.message = bookie_id, op, code, message


def admin_answer(bookie_id: str, op: str, data: bytes) -> dict:
    """A bookie's JSON answer to an operator call, without its "ok": `{"ok": false}` raises
    BookieAdminError; an answer that is not such an object, BookieUnreachable (no usable
    answer, as for the other calls)."""
    try:
        answer = json.loads(data)
    except ValueError as exc:
        raise BookieUnreachable(f"{op} from {bookie_id}: not JSON") from exc
    if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
        raise BookieUnreachable(f'{op} from {bookie_id}: no "ok" in {data[:200]!r}')
    if not answer.pop("ok"):
        code = str(answer.get("error", "ERROR"))
        raise BookieAdminError(bookie_id, op, code, str(answer.get("message", "")))
    return answer


OnAddAnswer = Callable[[tuple[BookieStatus, list[wire.AddResult]] | BookieUnreachable], None]


def _add_answer(
    bookie_id: str, answer: Msg | Exception, timeout_s: float
) -> tuple[BookieStatus, list[wire.AddResult]] | BookieUnreachable:
    """An add request's answer as `add` returns or raises it."""
    if isinstance(answer, TimeoutError):
        return BookieUnreachable(f"add to {bookie_id}: timed out after {timeout_s} s", True)
    if isinstance(answer, Exception):
        return BookieUnreachable(f"add to {bookie_id}: {type(answer).__name__}")
    if answer.headers and MICRO_ERROR_HEADER in answer.headers:
        return BookieUnreachable(f"add to {bookie_id}: {answer.headers[MICRO_ERROR_HEADER]}")
    try:
        return wire.decode_add_reply(answer.data)
    except wire.WireError as exc:
        return BookieUnreachable(f"add reply from {bookie_id}: {exc}")


class BookieClient:
    """BookieTransport over NATS."""

    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects,
        *,
        add_timeout_ms: int,
        read_timeout_ms: int,
        new_bookie_grace_ms: int = NEW_BOOKIE_GRACE_MS,
        wall_clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._nc = nc
        # Requests to the bookies take the lean path (shared.natsfast): per add, the
        # client's Python is most of an unloaded round trip's time.
        self._requests = Requests(nc)
        self._subjects = subjects
        self._add_timeout_s = add_timeout_ms / 1000
        self._read_timeout_ms = read_timeout_ms
        self._read_timeout_s = read_timeout_ms / 1000
        self._new_bookie_grace_ms = new_bookie_grace_ms
        self._wall_clock = wall_clock
        # bookie id -> when its journal registered (ms since the epoch), as last listed.
        self._registered_at: dict[str, int] = {}

    def bookies_listed(self, bookies: Iterable[BookieInfo]) -> None:
        """What the metadata last said of the bookies: when each registered (the
        `registered_at` its journal puts in its registration's info)."""
        for bookie in bookies:
            registered_at = bookie.info.get(REGISTERED_AT)
            if isinstance(registered_at, int):
                self._registered_at[bookie.bookie_id] = registered_at
        if len(self._registered_at) > MAX_BOOKIES_REMEMBERED:
            self._registered_at.clear()  # bounded; the next listing fills it again

    def _no_responders_retries(self, bookie_id: str) -> int:
        return no_responders_retries(
            self._registered_at.get(bookie_id), self._wall_clock(), self._new_bookie_grace_ms
        )

    @property
    def max_send_bytes(self) -> int:
        """The most item bytes one request may carry: under the server's max_payload."""
        return max(self._nc.max_payload - REQUEST_OVERHEAD_BYTES, 1024)

    async def _request(
        self,
        bookie_id: str,
        op: str,
        body: bytes,
        timeout_s: float,
        traced: Sequence[SpanContext] = (),
    ) -> bytes:
        """One request; in a CLIENT span of its own when `traced` names traced operations
        (the first is its parent; else `request` traces it if the current span records)."""
        subject = self._subjects.bookie(bookie_id, op)
        if not traced:
            return await self._send(bookie_id, op, subject, body, timeout_s, None)
        with nats_client_span(
            subject,
            parent=traced[0],
            links=traced[1:],
            attributes={"quire.bookie_id": bookie_id},
        ) as span:
            headers = inject_headers()
            if span is None:
                return await self._send(bookie_id, op, subject, body, timeout_s, headers)
            # `request` would open a second CLIENT span under this one: it sees this span
            # as not recording, and sends the headers that carry it.
            with use_span(NonRecordingSpan(span.get_span_context())):
                return await self._send(bookie_id, op, subject, body, timeout_s, headers)

    async def _send(
        self,
        bookie_id: str,
        op: str,
        subject: str,
        body: bytes,
        timeout_s: float,
        headers: dict[str, str] | None,
    ) -> bytes:
        try:
            msg = await request(
                self._nc,
                subject,
                body,
                timeout_s=timeout_s,
                headers=headers,
                retries=self._no_responders_retries(bookie_id),
                requests=self._requests,
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
        self, bookie_id: str, items: list[wire.AddItem], traced: Sequence[SpanContext] = ()
    ) -> tuple[BookieStatus, list[wire.AddResult]]:
        """`traced`: the span contexts of the traced appends whose entries are among
        `items` (see the module docstring)."""
        data = await self._request(
            bookie_id, "add", wire.encode_add_request(items), self._add_timeout_s, traced
        )
        try:
            return wire.decode_add_reply(data)
        except wire.WireError as exc:
            raise BookieUnreachable(f"add reply from {bookie_id}: {exc}") from exc

    def add_nowait(
        self, bookie_id: str, items: list[wire.AddItem], on_answer: OnAddAnswer
    ) -> Callable[[], None] | None:
        """`add` without a task or a future: `on_answer` gets (status, results) or a
        BookieUnreachable, later and once; what it returns stops the wait (no answer
        then). It sends in no span (the add batcher's requests are traced only through
        `add(traced=...)`). A "no responders" from a bookie that may still be starting is
        asked again as `add` asks it. None when the lean path is not set up yet (the first
        request sets it up): the caller takes `add`'s path."""
        requests = self._requests
        if not requests.ready:
            return None
        subject = self._subjects.bookie(bookie_id, "add")
        body = wire.encode_add_request(items)
        retry: list[asyncio.Task[None]] = []

        def answered(answer: Msg | Exception) -> None:
            if isinstance(answer, NoRespondersError) and self._no_responders_retries(bookie_id):
                retry.append(asyncio.ensure_future(self._add_again(bookie_id, items, on_answer)))
                return
            on_answer(_add_answer(bookie_id, answer, self._add_timeout_s))

        stop = requests.send(subject, body, self._add_timeout_s, answered)

        def stop_all() -> None:
            stop()
            for task in retry:
                task.cancel()

        return stop_all

    async def _add_again(
        self, bookie_id: str, items: list[wire.AddItem], on_answer: OnAddAnswer
    ) -> None:
        try:
            answer: tuple[BookieStatus, list[wire.AddResult]] | BookieUnreachable
            answer = await self.add(bookie_id, items)
        except BookieUnreachable as exc:
            answer = exc
        on_answer(answer)

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

    async def has_responder(self, bookie_id: str) -> bool:
        """Whether the bookie's journal still has a subscription: NATS answers a request
        nobody subscribes to with "no responders" at once; an answer, an error or a timeout
        means a journal took it. A bookie that registered only just may lack it for a moment:
        it counts as there."""
        subject = self._subjects.bookie(bookie_id, "info")
        try:
            await self._nc.request(subject, b"", timeout=PROBE_TIMEOUT_S)
        except NoRespondersError:
            return self._no_responders_retries(bookie_id) > 0
        except Exception:  # a timeout, a closed connection: no proof that it is gone
            return True
        return True

    async def info(self, bookie_id: str, timeout_s: float = 2.0) -> dict:
        """What the bookie says of itself (its journal's `info`): space, state, marks, files."""
        data = await self._request(bookie_id, "info", b"", timeout_s)
        try:
            return json.loads(data)
        except ValueError as exc:
            raise BookieUnreachable(f"info from {bookie_id}: not JSON") from exc

    # -- the bookie's garbage collector (its ledgerstore answers; JSON in, JSON out) ----------

    async def _admin(self, bookie_id: str, op: str, body: dict, timeout_s: float) -> dict:
        """One JSON call to the bookie's garbage collector: its answer without "ok"."""
        data = await self._request(bookie_id, op, json.dumps(body).encode(), timeout_s)
        return admin_answer(bookie_id, op, data)

    async def gc(
        self,
        bookie_id: str,
        force_major: bool = False,
        force_minor: bool = False,
        wait: bool = False,
        timeout_s: float = GC_ADMIN_TIMEOUT_S,
    ) -> dict:
        """Trigger a GC run now (BookKeeper's forceGC): `{"triggered": true}` at once, or with
        `wait` `{"run": {...}}` once the run ended (give a `timeout_s` long enough for it)."""
        body = {"force_major": force_major, "force_minor": force_minor, "wait": wait}
        return await self._admin(bookie_id, "gc", body, timeout_s)

    async def gc_details(self, bookie_id: str, timeout_s: float = GC_ADMIN_TIMEOUT_S) -> dict:
        """The collector's state (BookKeeper's GarbageCollectionStatus, and Quire's figures)."""
        return (await self._admin(bookie_id, "gc.details", {}, timeout_s))["details"]

    async def gc_suspend(
        self, bookie_id: str, major: bool, minor: bool, timeout_s: float = GC_ADMIN_TIMEOUT_S
    ) -> dict:
        """Suspend major and/or minor compaction: `{"suspendMajor", "suspendMinor"}` after."""
        body = {"major": major, "minor": minor}
        return await self._admin(bookie_id, "gc.suspend", body, timeout_s)

    async def gc_resume(
        self, bookie_id: str, major: bool, minor: bool, timeout_s: float = GC_ADMIN_TIMEOUT_S
    ) -> dict:
        """Resume major and/or minor compaction: `{"suspendMajor", "suspendMinor"}` after."""
        body = {"major": major, "minor": minor}
        return await self._admin(bookie_id, "gc.resume", body, timeout_s)

    async def gc_explain(self, bookie_id: str, timeout_s: float = GC_ADMIN_TIMEOUT_S) -> dict:
        """Every entry log on the bookie's disk, its usage, the ledgers that pin it, and what
        the next minor and major compaction would do with it."""
        return await self._admin(bookie_id, "gc.explain", {}, timeout_s)


__all__ = ["BookieAdminError", "BookieClient", "BookieUnreachable"]
