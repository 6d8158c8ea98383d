"""The gRPC client (API.md section 3) on grpc.aio."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from quire.client.base import Entry, Ledger, QuireClient, QuireClientError
from quire.v1 import ledgers_pb2 as pb
from quire.v1 import ledgers_pb2_grpc as pb_grpc

PASSWORD_KEY = "quire-ledger-password"


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
        self, target: str, *, token: str | None = None, tls_ca: bytes | None = None
    ) -> None:
        """`token`: the bearer token, when the gateway wants one; `tls_ca`: PEM roots to
        trust, which also turns TLS on."""
        if tls_ca is not None:
            credentials = grpc.ssl_channel_credentials(tls_ca)
            self._channel = grpc.aio.secure_channel(target, credentials)
        else:
            self._channel = grpc.aio.insecure_channel(target)
        self._stub = pb_grpc.LedgersStub(self._channel)
        self._token = token

    async def aclose(self) -> None:
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
        reply = await self._unary(self._stub.Append, request, password)
        return reply.first_entry_id, reply.last_entry_id, reply.lac

    async def append_many(
        self, ledger_id: int, password: str, entries: Sequence[bytes], batch: int = 500
    ) -> tuple[int, int]:
        """Pipelined through AppendStream: the server acknowledges in entry order."""

        async def requests() -> AsyncIterator[pb.AppendStreamRequest]:
            for data in entries:
                yield pb.AppendStreamRequest(ledger_id=ledger_id, entry=data)

        first = last = -1
        try:
            async for ack in self._stub.AppendStream(requests(), metadata=self._metadata(password)):
                first = ack.entry_id if first < 0 else first
                last = ack.entry_id
        except grpc.aio.AioRpcError as error:
            raise _client_error(error) from None
        return first, last

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
        reply = await self._unary(self._stub.Close, pb.CloseRequest(ledger_id=ledger_id), password)
        return reply.last_entry_id

    async def recover(self, ledger_id: int, password: str) -> int:
        request = pb.RecoverRequest(ledger_id=ledger_id)
        return (await self._unary(self._stub.Recover, request, password)).last_entry_id
