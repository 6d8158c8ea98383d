"""Async Python clients for Quire: one over HTTP, one over gRPC, with the same interface.

    async with HttpClient("http://127.0.0.1:7480") as client:      # or GrpcClient("127.0.0.1:7481")
        ledger = await client.create_ledger(password="pw", ensemble_size=3, write_quorum=3,
                                            ack_quorum=2)
        await ledger.append(b"hello")
        await ledger.append_many([b"a", b"b", b"c"])
        async for entry in ledger.tail(0):
            ...
        await ledger.close()

Errors a server gives are `QuireClientError` with the API's stable `code`
(`NO_SUCH_LEDGER`, `LEDGER_CLOSED`, ...), whichever transport carried them.
"""

from quire.client.base import Entry, Ledger, LedgerHandle, QuireClient, QuireClientError
from quire.client.grpc import GrpcClient
from quire.client.http import HttpClient

__all__ = [
    "Entry",
    "GrpcClient",
    "HttpClient",
    "Ledger",
    "LedgerHandle",
    "QuireClient",
    "QuireClientError",
]
