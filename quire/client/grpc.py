"""The gRPC client (API.md section 3) on grpc.aio."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from quire.client.base import (
    WRITER_REDIRECT,
    WRITER_UNREACHABLE,
    Entry,
    Ledger,
    QuireClient,
    QuireClientError,
)
from quire.v1 import ledgers_pb2 as pb
from quire.v1 import ledgers_pb2_grpc as pb_grpc

PASSWORD_KEY = "quire-ledger-password"
# The most ledgers whose writer's gateway a client remembers (the oldest are forgotten:
# their next append is redirected again).
WRITERS_KEPT = 4096
ERROR_CODE_KEY = "quire-error-code"
# WRITER_REDIRECT's trailing metadata: the writer's gateway, gRPC host:port.
WRITER_GRPC_KEY = "quire-writer-grpc"


def _writer_of(error: grpc.aio.AioRpcError) -> str | None:
    """The writer's address when a gateway answered WRITER_REDIRECT, else None."""
    if error.code() is not grpc.StatusCode.FAILED_PRECONDITION:
        return None
    trailing = dict(error.trailing_metadata() or ())
    if trailing.get(ERROR_CODE_KEY) != WRITER_REDIRECT:
        return None
    return trailing.get(WRITER_GRPC_KEY)


# gRPC core's words for a call that found no connection to make (refused, unresolvable,
# timed out connecting): the request was never sent.
NOT_CONNECTED = "failed to connect to all addresses"


def _from_writer(error: grpc.aio.AioRpcError, writer: str) -> QuireClientError:
    """An error from the writer a gateway redirected to: UNAVAILABLE because no connection
    to it could be made means its gateway cannot be reached (a connection lost during
    the call is no such proof: the append may have gone through)."""
    trailing = dict(error.trailing_metadata() or ())
    if (
        error.code() is grpc.StatusCode.UNAVAILABLE
        and ERROR_CODE_KEY not in trailing
        and NOT_CONNECTED in (error.details() or "")
    ):
        detail = f"the ledger's writer at {writer} does not answer: {error.details()}"
        return QuireClientError(WRITER_UNREACHABLE, detail, error.code().name)
    return _client_error(error)


def _client_error(error: grpc.aio.AioRpcError) -> QuireClientError:
    code = error.code().name
    status = rpc_status.from_call(error)
    if status is not None:
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                code = info.reason
    return QuireClientError(code, error.details() or "", error.code().name)


def _ledger(message: pb.Ledger) -> Ledger:
    return Ledger(
        ledger_id=message.ledger_id,
        state=message.state,
        ensemble_size=message.ensemble_size,
        write_quorum=message.write_quorum,
        ack_quorum=message.ack_quorum,
        digest=message.digest,
        last_entry_id=message.last_entry_id if message.HasField("last_entry_id") else None,
        length=message.length,
        version=message.version,
        ctime=message.ctime,
        metadata=dict(message.metadata),
        segments=[
            {"first_entry_id": s.first_entry_id, "bookies": list(s.bookies)}
            for s in message.segments
        ],
    )


class GrpcClient(QuireClient):
    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls_ca: bytes | None = None,
        channel_options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        """`token`: the bearer token, when the gateway wants one; `tls_ca`: PEM roots to
        trust, which also turns TLS on; `channel_options`: gRPC channel arguments, for
        this client's every channel."""
        self._tls_ca = tls_ca
        self._options = list(channel_options)
        self._channel = self._open(target)
        self._stub = pb_grpc.LedgersStub(self._channel)
        self._token = token
        # Channels to the gateways that hold writers this client was redirected to, and
        # which ledger's writer each holds (oldest first; a ledger's writer never changes).
        self._writers: dict[str, tuple[grpc.aio.Channel, pb_grpc.LedgersStub]] = {}
        self._writer_of: OrderedDict[int, str] = OrderedDict()

    def _open(self, target: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        options = [*self._options, *options]
        if self._tls_ca is not None:
            credentials = grpc.ssl_channel_credentials(self._tls_ca)
            return grpc.aio.secure_channel(target, credentials, options)
        return grpc.aio.insecure_channel(target, options)

    def _writer_stub(self, target: str) -> pb_grpc.LedgersStub:
        if target not in self._writers:
            # A subchannel of its own: gRPC shares connections between channels to one
            # target, and a shared one to a writer that was down waits out its backoff.
            channel = self._open(target, [("grpc.use_local_subchannel_pool", 1)])
            self._writers[target] = (channel, pb_grpc.LedgersStub(channel))
        return self._writers[target][1]

    async def aclose(self) -> None:
        for channel, _ in self._writers.values():
            await channel.close()
        await self._channel.close()

    def _metadata(self, password: str | None = None) -> tuple[tuple[str, str], ...]:
        pairs = []
        if password is not None:
            pairs.append((PASSWORD_KEY, password))
        if self._token:
            pairs.append(("authorization", f"Bearer {self._token}"))
        return tuple(pairs)

    async def _unary(self, method: Any, request: Any, password: str | None = None) -> Any:
        try:
            return await method(request, metadata=self._metadata(password))
        except grpc.aio.AioRpcError as error:
            raise _client_error(error) from None

    async def _writer_call(self, name: str, request: Any, password: str) -> Any:
        """An append or close: where a gateway answers that another holds the ledger's
        writer, the same call there, once (the writer never redirects); from then on the
        ledger's calls go there at once."""
        writer = self._writer_of.get(request.ledger_id)
        if writer is None:
            try:
                return await getattr(self._stub, name)(request, metadata=self._metadata(password))
            except grpc.aio.AioRpcError as error:
                writer = _writer_of(error)
                if writer is None:
                    raise _client_error(error) from None
            self._remember(request.ledger_id, writer)
        stub = self._writer_stub(writer)
        try:
            return await getattr(stub, name)(request, metadata=self._metadata(password))
        except grpc.aio.AioRpcError as error:
            raise await self._from_writer(error, writer) from None

    def _remember(self, ledger_id: int, writer: str) -> None:
        self._writer_of[ledger_id] = writer
        while len(self._writer_of) > WRITERS_KEPT:
            self._writer_of.popitem(last=False)

    async def _from_writer(self, error: grpc.aio.AioRpcError, writer: str) -> QuireClientError:
        """The error of a call redirected to `writer`. A writer that does not answer is
        forgotten: its channel would wait out a reconnect backoff before trying again, and
        a gateway that comes back at that address must be asked at once."""
        failure = _from_writer(error, writer)
        if failure.code == WRITER_UNREACHABLE:
            for ledger_id in [k for k, v in self._writer_of.items() if v == writer]:
                del self._writer_of[ledger_id]
            if writer in self._writers:
                await self._writers.pop(writer)[0].close()
        return failure

    async def create(
        self,
        *,
        password: str,
        ensemble_size: int = 3,
        write_quorum: int = 3,
        ack_quorum: int = 2,
        digest: str = "crc32c",
        metadata: dict[str, str] | None = None,
    ) -> Ledger:
        request = pb.CreateRequest(
            ensemble_size=ensemble_size,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            digest=digest,
            password=password,
            metadata=metadata or {},
        )
        return _ledger(await self._unary(self._stub.Create, request))

    async def get(self, ledger_id: int) -> Ledger:
        return _ledger(await self._unary(self._stub.Get, pb.GetRequest(ledger_id=ledger_id)))

    async def list(
        self, after: int | None = None, limit: int = 100
    ) -> tuple[list[Ledger], int | None]:
        request = pb.ListRequest(limit=limit)
        if after is not None:
            request.after = after
        reply = await self._unary(self._stub.List, request)
        next_after = reply.next_after if reply.HasField("next_after") else None
        return [_ledger(m) for m in reply.ledgers], next_after

    async def delete(self, ledger_id: int, password: str) -> None:
        await self._unary(self._stub.Delete, pb.DeleteRequest(ledger_id=ledger_id), password)

    async def append(
        self, ledger_id: int, password: str, entries: Sequence[bytes]
    ) -> tuple[int, int, int]:
        request = pb.AppendRequest(ledger_id=ledger_id, entries=list(entries))
        reply = await self._writer_call("Append", request, password)
        return reply.first_entry_id, reply.last_entry_id, reply.lac

    async def append_many(
        self, ledger_id: int, password: str, entries: Sequence[bytes], batch: int = 500
    ) -> tuple[int, int]:
        """Pipelined through AppendStream: the server acknowledges in entry order. A
        gateway that does not hold the writer refuses the stream before its first
        acknowledgement, so the whole stream goes again to the writer it names."""

        async def requests() -> AsyncIterator[pb.AppendStreamRequest]:
            for data in entries:
                yield pb.AppendStreamRequest(ledger_id=ledger_id, entry=data)

        first = last = -1
        writer = self._writer_of.get(ledger_id)
        stub = self._stub if writer is None else self._writer_stub(writer)
        while True:
            try:
                call = stub.AppendStream(requests(), metadata=self._metadata(password))
                async for ack in call:
                    first = ack.entry_id if first < 0 else first
                    last = ack.entry_id
                return first, last
            except grpc.aio.AioRpcError as error:
                if writer is not None:
                    raise await self._from_writer(error, writer) from None
                writer = _writer_of(error) if first < 0 else None
                if writer is None:
                    raise _client_error(error) from None
                self._remember(ledger_id, writer)
                stub = self._writer_stub(writer)

    async def read_stream(
        self,
        ledger_id: int,
        password: str,
        first: int,
        last: int | None,
        unconfirmed: bool = False,
    ) -> AsyncIterator[Entry]:
        request = pb.ReadRequest(ledger_id=ledger_id, from_entry_id=first, unconfirmed=unconfirmed)
        if last is not None:
            request.to_entry_id = last
        call = self._stub.ReadBatches(request, metadata=self._metadata(password))
        async for entry in self._batched_entries(call):
            yield entry

    async def tail(self, ledger_id: int, password: str, first: int = 0) -> AsyncIterator[Entry]:
        request = pb.TailRequest(ledger_id=ledger_id, from_entry_id=first)
        call = self._stub.TailBatches(request, metadata=self._metadata(password))
        async for entry in self._batched_entries(call):
            yield entry

    async def _batched_entries(self, call: Any) -> AsyncIterator[Entry]:
        """The entries of a ReadBatches or TailBatches call; a reader that stops early
        cancels it, which stops the gateway's read."""
        try:
            async for batch in call:
                for message in batch.entries:
                    yield Entry(message.entry_id, message.data)
        except grpc.aio.AioRpcError as error:
            raise _client_error(error) from None
        finally:
            call.cancel()

    async def read_lac(
        self, ledger_id: int, password: str, after: int | None = None, timeout_ms: int = 0
    ) -> int:
        request = pb.ReadLacRequest(ledger_id=ledger_id, timeout_ms=timeout_ms)
        if after is not None:
            request.after = after
        return (await self._unary(self._stub.ReadLac, request, password)).lac

    async def close(self, ledger_id: int, password: str) -> int:
        reply = await self._writer_call("Close", pb.CloseRequest(ledger_id=ledger_id), password)
        self._writer_of.pop(ledger_id, None)  # closed: no more writes to send anywhere
        return reply.last_entry_id

    async def recover(self, ledger_id: int, password: str) -> int:
        request = pb.RecoverRequest(ledger_id=ledger_id)
        return (await self._unary(self._stub.Recover, request, password)).last_entry_id
