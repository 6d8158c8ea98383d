"""The gateway's gRPC API (API.md section 3): service `quire.v1.Ledgers` over `Ledgers`,
the same driver the HTTP API uses, with the same operations, limits and error codes.

Errors leave as gRPC statuses whose details carry a `google.rpc.ErrorInfo` (domain
`quire.v1`, reason = the stable code string) and whose trailing metadata carries
`quire-error-code`. Standard health checking and server reflection are served too.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from quire.v1 import ledgers_pb2 as pb
from quire.v1 import ledgers_pb2_grpc as pb_grpc
from services.gateway.auth import TokenAuth
from services.gateway.ledgers import Ledgers, Page, WriterElsewhere
from services.gateway.limits import check_entry_size, check_payloads
from services.gateway.tracing import grpc_interceptors
from shared.config import GatewaySettings
from shared.digest import DigestType
from shared.models import MAX_LEDGER_ID, LedgerMetadata, LedgerState
from shared.status import ApiCodes, QuireError

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Ledgers"].full_name  # "quire.v1.Ledgers"
PASSWORD_KEY = "quire-ledger-password"
ERROR_CODE_KEY = "quire-error-code"
# WRITER_REDIRECT's trailing metadata: where the ledger's writer is (gRPC, HTTP).
WRITER_GRPC_KEY = "quire-writer-grpc"
WRITER_HTTP_KEY = "quire-writer-http"
ERROR_DOMAIN = "quire.v1"
# AppendStream reads at most this many entries ahead of their acknowledgements; beyond
# it the server stops reading and HTTP/2 flow control holds the client back.
APPEND_STREAM_WINDOW = 1024
# A ReadBatches or TailBatches message carries at most this many payload bytes (an entry
# larger alone), far below the largest message (max_batch_bytes).
READ_BATCH_BYTES = 1 << 20
# Tail asks the LAC long poll to wait at most this long before asking again, so that a
# cancelled or closed stream is noticed.
TAIL_POLL_MS = 1000

# API code -> gRPC status: the gRPC column of the table HTTP statuses sit in (ApiCodes).
GRPC_STATUS: dict[str, grpc.StatusCode] = {
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "UNAUTHORIZED": grpc.StatusCode.PERMISSION_DENIED,
    "NO_SUCH_LEDGER": grpc.StatusCode.NOT_FOUND,
    "NO_SUCH_ENTRY": grpc.StatusCode.NOT_FOUND,
    "NO_SUCH_BOOKIE": grpc.StatusCode.NOT_FOUND,
    "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "LEDGER_CLOSED": grpc.StatusCode.FAILED_PRECONDITION,
    "LEDGER_FENCED": grpc.StatusCode.FAILED_PRECONDITION,
    # Another gateway holds the writer: not writable here, as LEDGER_FENCED was before
    # writers were recorded, so a client that knows no redirect fails as it did then.
    "WRITER_REDIRECT": grpc.StatusCode.FAILED_PRECONDITION,
    "ENTRY_TOO_LARGE": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "TOO_MANY_REQUESTS": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "NOT_ENOUGH_BOOKIES": grpc.StatusCode.UNAVAILABLE,
    "UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "TIMEOUT": grpc.StatusCode.DEADLINE_EXCEEDED,
    "INTERNAL": grpc.StatusCode.INTERNAL,
}

T = TypeVar("T")


class _Status(
    collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status
):
    pass


def grpc_status_for(code: str) -> grpc.StatusCode:
    return GRPC_STATUS.get(code, grpc.StatusCode.UNKNOWN)


def error_status(code: str, detail: str, extra: tuple[tuple[str, str], ...] = ()) -> grpc.Status:
    info = error_details_pb2.ErrorInfo(reason=code, domain=ERROR_DOMAIN)
    packed = any_pb2.Any()
    packed.Pack(info)
    status = status_pb2.Status(
        code=grpc_status_for(code).value[0], message=detail, details=[packed]
    )
    converted = rpc_status.to_status(status)
    return _Status(
        converted.code,
        converted.details,
        (*converted.trailing_metadata, (ERROR_CODE_KEY, code), *extra),
    )


async def abort_with(context: grpc.aio.ServicerContext, error: QuireError) -> None:
    extra: tuple[tuple[str, str], ...] = ()
    if isinstance(error, WriterElsewhere):
        extra = ((WRITER_GRPC_KEY, error.writer.grpc), (WRITER_HTTP_KEY, error.writer.http))
    await context.abort_with_status(error_status(error.api.code, error.detail, extra))


def invalid(detail: str) -> QuireError:
    return QuireError(ApiCodes.INVALID_ARGUMENT, detail)


def ledger_message(metadata: LedgerMetadata) -> pb.Ledger:
    public = metadata.public()
    return pb.Ledger(
        ledger_id=public["ledger_id"],
        state=public["state"],
        ensemble_size=public["ensemble_size"],
        write_quorum=public["write_quorum"],
        ack_quorum=public["ack_quorum"],
        digest=public["digest"],
        last_entry_id=public["last_entry_id"],
        length=public["length"],
        version=public["version"],
        ctime=public["ctime"],
        metadata=public["metadata"],
        segments=[pb.Segment(**segment) for segment in public["segments"]],
    )


def close_message(metadata: LedgerMetadata) -> pb.CloseResponse:
    return pb.CloseResponse(
        state=metadata.state.value,
        last_entry_id=metadata.last_entry_id if metadata.last_entry_id is not None else -1,
        length=metadata.length,
    )


def split_by_bytes(
    entries: list[tuple[int, bytes]], limit_bytes: int
) -> Iterator[list[tuple[int, bytes]]]:
    """`entries` in order, in runs of at most `limit_bytes` of payload (an entry larger than
    that alone in its run)."""
    run: list[tuple[int, bytes]] = []
    size = 0
    for entry in entries:
        if run and size + len(entry[1]) > limit_bytes:
            yield run
            run, size = [], 0
        run.append(entry)
        size += len(entry[1])
    if run:
        yield run


def entry_messages(page: Page) -> Iterator[pb.Entry]:
    """`Read` and `Tail`: one message an entry."""
    for entry_id, data in page.entries:
        yield pb.Entry(entry_id=entry_id, data=data, lac=page.lac)


def batch_messages(page: Page) -> Iterator[pb.EntryBatch]:
    """`ReadBatches` and `TailBatches`: a page's entries in as few messages as
    READ_BATCH_BYTES allows."""
    for run in split_by_bytes(page.entries, READ_BATCH_BYTES):
        yield pb.EntryBatch(entries=[pb.Entry(entry_id=e, data=d, lac=page.lac) for e, d in run])


def check_id(value: int, what: str) -> int:
    if not 0 <= value <= MAX_LEDGER_ID:
        raise invalid(f"{what} must be between 0 and {MAX_LEDGER_ID}, not {value}")
    return value


def password_of(context: grpc.aio.ServicerContext) -> bytes | None:
    for key, value in context.invocation_metadata() or ():
        if key == PASSWORD_KEY:
            return value.encode() if isinstance(value, str) else value
    return None


class LedgersServicer(pb_grpc.LedgersServicer):
    def __init__(self, ledgers: Ledgers, settings: GatewaySettings) -> None:
        self._ledgers = ledgers
        self._settings = settings

    async def _unary(self, context: grpc.aio.ServicerContext, call: Awaitable[T]) -> T:
        """Run one call; a QuireError ends the RPC with its status. Anything else is a
        bug: logged, and the client gets INTERNAL, never a dead server."""
        try:
            return await call
        except QuireError as error:
            await abort_with(context, error)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("gRPC call failed")
            await abort_with(context, QuireError(ApiCodes.INTERNAL, "internal error"))
        raise AssertionError("unreachable: abort raises")

    async def _stream(
        self, context: grpc.aio.ServicerContext, make: Callable[[], AsyncIterator[T]]
    ) -> AsyncIterator[T]:
        try:
            async for item in make():
                yield item
        except QuireError as error:
            await abort_with(context, error)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("gRPC stream failed")
            await abort_with(context, QuireError(ApiCodes.INTERNAL, "internal error"))

    # -- ledgers -------------------------------------------------------------------------

    async def Create(self, request: pb.CreateRequest, context: Any) -> pb.Ledger:
        async def create() -> pb.Ledger:
            try:
                digest = DigestType(request.digest or DigestType.CRC32C)
            except ValueError:
                raise invalid(
                    f"digest must be one of {[d.value for d in DigestType]}, not {request.digest!r}"
                ) from None
            created = await self._ledgers.create(
                ensemble_size=request.ensemble_size or 3,
                write_quorum=request.write_quorum or 3,
                ack_quorum=request.ack_quorum or 2,
                digest=digest,
                password=request.password.encode(),
                metadata=dict(request.metadata),
            )
            return ledger_message(created)

        return await self._unary(context, create())

    async def Get(self, request: pb.GetRequest, context: Any) -> pb.Ledger:
        async def get() -> pb.Ledger:
            return ledger_message(await self._ledgers.get(check_id(request.ledger_id, "ledger_id")))

        return await self._unary(context, get())

    async def List(self, request: pb.ListRequest, context: Any) -> pb.ListResponse:
        async def list_() -> pb.ListResponse:
            limit = request.limit or 100
            if not 1 <= limit <= 1000:
                raise invalid(f"limit must be between 1 and 1000, not {limit}")
            after = request.after if request.HasField("after") else None
            page = await self._ledgers.list(after, limit)
            reply = pb.ListResponse(ledgers=[ledger_message(m) for m in page.ledgers])
            if page.next_after is not None:
                reply.next_after = page.next_after
            return reply

        return await self._unary(context, list_())

    async def Delete(self, request: pb.DeleteRequest, context: Any) -> pb.DeleteResponse:
        async def delete() -> pb.DeleteResponse:
            ledger_id = check_id(request.ledger_id, "ledger_id")
            await self._ledgers.delete(ledger_id, password_of(context))
            return pb.DeleteResponse()

        return await self._unary(context, delete())

    async def Close(self, request: pb.CloseRequest, context: Any) -> pb.CloseResponse:
        async def close() -> pb.CloseResponse:
            ledger_id = check_id(request.ledger_id, "ledger_id")
            return close_message(await self._ledgers.close(ledger_id, password_of(context)))

        return await self._unary(context, close())

    async def Recover(self, request: pb.RecoverRequest, context: Any) -> pb.CloseResponse:
        async def recover() -> pb.CloseResponse:
            ledger_id = check_id(request.ledger_id, "ledger_id")
            return close_message(await self._ledgers.recover(ledger_id, password_of(context)))

        return await self._unary(context, recover())

    # -- entries -------------------------------------------------------------------------

    async def Append(self, request: pb.AppendRequest, context: Any) -> pb.AppendResponse:
        async def append() -> pb.AppendResponse:
            ledger_id = check_id(request.ledger_id, "ledger_id")
            payloads = list(request.entries)
            check_payloads(payloads, self._settings)
            first, last, lac = await self._ledgers.append(ledger_id, password_of(context), payloads)
            return pb.AppendResponse(first_entry_id=first, last_entry_id=last, lac=lac)

        return await self._unary(context, append())

    async def AppendStream(
        self, request_iterator: AsyncIterator[pb.AppendStreamRequest], context: Any
    ) -> AsyncIterator[pb.AppendAck]:
        # Servicer streaming methods must be async generator functions themselves.
        stream = self._stream(context, lambda: self._append_stream(request_iterator, context))
        async for ack in stream:
            yield ack

    async def _append_stream(
        self, requests: AsyncIterator[pb.AppendStreamRequest], context: Any
    ) -> AsyncIterator[pb.AppendAck]:
        """Entries are read into a bounded queue and appended in batches of whatever has
        arrived, one batch at a time, so entry ids follow the stream's order."""
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=APPEND_STREAM_WINDOW)
        ledger: list[int] = []
        password = password_of(context)

        async def read() -> None:
            async for request in requests:
                if not ledger:
                    ledger.append(check_id(request.ledger_id, "ledger_id"))
                elif request.ledger_id not in (0, ledger[0]):
                    raise invalid("every message of a stream must name the same ledger")
                check_entry_size(len(request.entry), self._settings)
                await queue.put(request.entry)
            await queue.put(None)

        reader = asyncio.create_task(read())
        try:
            done = False
            while not done:
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    reader.result()  # the reader failed: raise its error
                    continue
                first = getter.result()
                if first is None:
                    break
                batch = [first]
                while not queue.empty() and len(batch) < self._settings.max_batch_entries:
                    item = queue.get_nowait()
                    if item is None:
                        done = True
                        break
                    batch.append(item)
                start, last, lac = await self._ledgers.append(ledger[0], password, batch)
                for entry_id in range(start, last + 1):
                    yield pb.AppendAck(entry_id=entry_id, lac=lac)
            await reader
        finally:
            reader.cancel()

    async def Read(self, request: pb.ReadRequest, context: Any) -> AsyncIterator[pb.Entry]:
        async for entry in self._stream(context, lambda: self._read(request, context)):
            yield entry

    def _range(self, request: pb.ReadRequest, context: Any) -> AsyncGenerator[Page, None]:
        ledger_id = check_id(request.ledger_id, "ledger_id")
        first = check_id(request.from_entry_id, "from_entry_id")
        last = (
            check_id(request.to_entry_id, "to_entry_id")
            if request.HasField("to_entry_id")
            else None  # up to the LAC
        )
        if last is not None and last < first:
            raise invalid(f"to_entry_id {last} is before from_entry_id {first}")
        return self._ledgers.read_stream(
            ledger_id, password_of(context), first, last, request.unconfirmed
        )

    async def _read(self, request: pb.ReadRequest, context: Any) -> AsyncIterator[pb.Entry]:
        async for page in self._counted(self._range(request, context)):
            for message in entry_messages(page):
                yield message

    async def ReadBatches(
        self, request: pb.ReadRequest, context: Any
    ) -> AsyncIterator[pb.EntryBatch]:
        async for batch in self._stream(context, lambda: self._read_batches(request, context)):
            yield batch

    async def _read_batches(
        self, request: pb.ReadRequest, context: Any
    ) -> AsyncIterator[pb.EntryBatch]:
        async for page in self._counted(self._range(request, context)):
            for message in batch_messages(page):
                yield message

    async def _counted(self, pages: AsyncGenerator[Page, None]) -> AsyncIterator[Page]:
        """The pages as they are read, each counted (what the gateway holds of the range at
        once). A cancelled call stops the read."""
        async with aclosing(pages):
            async for page in pages:
                self._ledgers.metrics.read_stream_batches.observe(len(page.entries))
                yield page

    async def Tail(self, request: pb.TailRequest, context: Any) -> AsyncIterator[pb.Entry]:
        async for entry in self._stream(context, lambda: self._tail(request, context)):
            yield entry

    async def _tail(self, request: pb.TailRequest, context: Any) -> AsyncIterator[pb.Entry]:
        async for page in self._tail_pages(request, context):
            for message in entry_messages(page):
                yield message

    async def TailBatches(
        self, request: pb.TailRequest, context: Any
    ) -> AsyncIterator[pb.EntryBatch]:
        async for batch in self._stream(context, lambda: self._tail_batches(request, context)):
            yield batch

    async def _tail_batches(
        self, request: pb.TailRequest, context: Any
    ) -> AsyncIterator[pb.EntryBatch]:
        async for page in self._tail_pages(request, context):
            for message in batch_messages(page):
                yield message

    async def _tail_pages(self, request: pb.TailRequest, context: Any) -> AsyncIterator[Page]:
        """Follow the LAC until cancelled; a closed ledger's stream ends after its last entry."""
        ledger_id = check_id(request.ledger_id, "ledger_id")
        following = check_id(request.from_entry_id, "from_entry_id")
        password = password_of(context)
        while True:
            lac = await self._ledgers.read_lac(ledger_id, password, following - 1, TAIL_POLL_MS)
            if lac >= following:
                pages = self._ledgers.read_stream(ledger_id, password, following, lac)
                async for page in self._counted(pages):
                    yield page
                    following += len(page.entries)
                continue
            metadata = await self._ledgers.get(ledger_id)
            if metadata.state is LedgerState.CLOSED and following > (metadata.last_entry_id or -1):
                return

    async def ReadLac(self, request: pb.ReadLacRequest, context: Any) -> pb.ReadLacResponse:
        async def read_lac() -> pb.ReadLacResponse:
            ledger_id = check_id(request.ledger_id, "ledger_id")
            if request.timeout_ms < 0:
                raise invalid(f"timeout_ms must not be negative, not {request.timeout_ms}")
            after = request.after if request.HasField("after") else None
            lac = await self._ledgers.read_lac(
                ledger_id, password_of(context), after, request.timeout_ms
            )
            return pb.ReadLacResponse(lac=lac)

        return await self._unary(context, read_lac())


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without a valid bearer token (`authorization` metadata) with
    UNAUTHENTICATED; health checking stays open, as /healthz and /readyz do."""

    OPEN_PREFIXES = ("/grpc.health.v1.Health/",)

    def __init__(self, auth: TokenAuth) -> None:
        self._auth = auth

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or details.method.startswith(self.OPEN_PREFIXES):
            return handler
        metadata = dict(details.invocation_metadata or ())
        if self._auth.allows(metadata.get("authorization")):
            return handler
        return _refusing(handler)


def _refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same streaming shape that ends the call UNAUTHENTICATED."""
    status = error_status("UNAUTHORIZED", "a valid bearer token is required")
    status = status._replace(code=grpc.StatusCode.UNAUTHENTICATED)

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort_with_status(status)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort_with_status(status)
        yield  # never reached: abort raises; the yield makes this a stream handler

    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, **serializers)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming, **serializers)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, **serializers)
    return grpc.stream_stream_rpc_method_handler(streaming, **serializers)


async def start_grpc_server(
    ledgers: Ledgers,
    settings: GatewaySettings,
    auth: TokenAuth | None = None,
    on_bound: Callable[[int], None] | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Serve `quire.v1.Ledgers`, health checking and reflection on the configured port;
    the server and the port it bound. `on_bound` gets the port before the first call can
    come (the gateway's advertised address may name it)."""
    # Tracing outermost: a call refused for its token is traced and answered with
    # `traceresponse` too.
    interceptors = grpc_interceptors(SERVICE_NAME)
    if auth is not None and auth.enabled:
        interceptors.append(TokenInterceptor(auth))
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", settings.max_batch_bytes),
            ("grpc.max_send_message_length", settings.max_batch_bytes),
        ],
    )
    pb_grpc.add_LedgersServicer_to_server(LedgersServicer(ledgers, settings), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = f"{settings.http_host}:{settings.grpc_port}"
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        credentials = grpc.ssl_server_credentials(
            [(settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes())]
        )
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise RuntimeError(f"cannot bind gRPC on {settings.http_host}:{settings.grpc_port}")
    if on_bound is not None:
        on_bound(port)
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port
