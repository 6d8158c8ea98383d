"""GrpcClient and a gateway's WRITER_REDIRECT (quire/client/grpc.py), against a gRPC server in
this process whose Append always redirects: the client follows once, to the address in the
trailing metadata, and a second redirect is an error, never a loop."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from quire.client import GrpcClient, QuireClientError
from quire.v1 import ledgers_pb2 as pb
from quire.v1 import ledgers_pb2_grpc as pb_grpc
from services.gateway.grpc_api import WRITER_GRPC_KEY, WRITER_HTTP_KEY, error_status


class AlwaysElsewhere(pb_grpc.LedgersServicer):
    def __init__(self) -> None:
        self.address = ""
        self.appends = 0

    async def Append(self, request: pb.AppendRequest, context: Any) -> pb.AppendResponse:
        self.appends += 1
        writer = ((WRITER_GRPC_KEY, self.address), (WRITER_HTTP_KEY, "http://unused"))
        await context.abort_with_status(error_status("WRITER_REDIRECT", "elsewhere", writer))
        raise AssertionError("unreachable: abort raises")


async def test_followed_once_never_a_loop() -> None:
    servicer = AlwaysElsewhere()
    server = grpc.aio.server()
    pb_grpc.add_LedgersServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    servicer.address = f"127.0.0.1:{port}"
    await server.start()
    try:
        async with GrpcClient(servicer.address) as client:
            with pytest.raises(QuireClientError) as refused:
                await client.append(7, "pw", [b"zero"])
        assert refused.value.code == "WRITER_REDIRECT"
        assert refused.value.status == "FAILED_PRECONDITION"
        assert servicer.appends == 2
    finally:
        await server.stop(None)
