"""What the read surfaces themselves cost: one range streamed whole through HTTP (the JSON
document, and NDJSON read by `HttpClient.read_stream`) and gRPC (`ReadBatches` read by
`GrpcClient.read_stream`, and `Read`, one entry a message), from the gateway's own app and
servicer over a `Ledgers` whose `read_stream` hands out pages already in memory. No
bookies, NATS or metadata: the figures are the surfaces' cost alone (encoding, chunked
HTTP/1.1 or HTTP/2, the client's parsing), the server and the client on one event loop, so
on one core.

    python -m services.gateway.bench_stream [--entries 100000] [--entry-size 1024]
        [--page-entries 1000] [--rounds 3]

Prints, for each surface, the best of `--rounds` reads: entries/s and payload MB/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable

import grpc
import httpx
import uvicorn

from quire.client import GrpcClient, HttpClient
from quire.v1 import ledgers_pb2 as pb
from quire.v1 import ledgers_pb2_grpc as pb_grpc
from services.gateway.grpc_api import start_grpc_server
from services.gateway.http import create_app
from services.gateway.ledgers import Page
from services.gateway.metrics import GatewayMetrics
from services.gateway.service import EmbeddedServer, bind_socket
from shared.config import GatewaySettings

PASSWORD = "pw"


class MemoryLedgers:
    """`Ledgers.read_stream` over one closed ledger whose entries all carry the same
    payload, in pages of `page_entries`: what the surfaces get, at no cost of its own."""

    def __init__(self, entries: int, entry_size: int, page_entries: int) -> None:
        self.entries = entries
        self.payload = os.urandom(entry_size)
        self.page_entries = page_entries
        self.metrics = GatewayMetrics()

    async def read_stream(
        self,
        ledger_id: int,
        password: bytes | None,
        first: int,
        last: int | None,
        unconfirmed: bool = False,
    ) -> AsyncGenerator[Page, None]:
        end = self.entries - 1 if last is None else min(last, self.entries - 1)
        for start in range(first, end + 1, self.page_entries):
            stop = min(start + self.page_entries, end + 1)
            entry_ids = range(start, stop)
            yield Page([(i, self.payload) for i in entry_ids], self.entries - 1, stop > end)


async def best_rate(rounds: int, read: Callable[[], Awaitable[int]]) -> float:
    """The best entries/s of `rounds` reads (each returns the entries it read)."""
    rates = []
    for _ in range(rounds):
        started = time.perf_counter()
        count = await read()
        rates.append(count / (time.perf_counter() - started))
    return max(rates)


async def bench(args: argparse.Namespace) -> None:
    ledgers = MemoryLedgers(args.entries, args.entry_size, args.page_entries)
    settings = GatewaySettings(http_port=0, grpc_port=0)
    app = create_app(ledgers, settings)  # type: ignore[arg-type]
    server = EmbeddedServer(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off"))
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    grpc_server, grpc_port = await start_grpc_server(ledgers, settings)  # type: ignore[arg-type]
    while not server.started:
        await asyncio.sleep(0.01)
    last = args.entries - 1
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:

            async def json_document() -> int:
                path = "/v1/ledgers/0/entries"
                headers = {"Quire-Ledger-Password": PASSWORD}
                async with http.stream("GET", path, headers=headers) as response:
                    async for _ in response.aiter_bytes():
                        pass
                return args.entries

            json_rate = await best_rate(args.rounds, json_document)
            rates = {"HTTP JSON (bytes read, not parsed)": json_rate}

        async with HttpClient(url) as client:

            async def ndjson() -> int:
                return sum([1 async for _ in client.read_stream(0, PASSWORD, 0, last)])

            rates["HTTP NDJSON, HttpClient.read_stream"] = await best_rate(args.rounds, ndjson)
        async with GrpcClient(f"127.0.0.1:{grpc_port}") as grpc_client:

            async def grpc_batches() -> int:
                return sum([1 async for _ in grpc_client.read_stream(0, PASSWORD, 0, last)])

            rates["gRPC ReadBatches, GrpcClient.read_stream"] = await best_rate(
                args.rounds, grpc_batches
            )
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = pb_grpc.LedgersStub(channel)

            async def grpc_entries() -> int:
                request = pb.ReadRequest(ledger_id=0, from_entry_id=0, to_entry_id=last)
                call = stub.Read(request, metadata=(("quire-ledger-password", PASSWORD),))
                return sum([1 async for _ in call])

            rates["gRPC Read (an entry a message)"] = await best_rate(args.rounds, grpc_entries)
    finally:
        await grpc_server.stop(None)
        server.should_exit = True
        await serving
        sock.close()
    print(
        f"{args.entries} entries of {args.entry_size} bytes, pages of {args.page_entries}, "
        f"best of {args.rounds}"
    )
    for surface, rate in rates.items():
        print(f"{surface:40} {rate:>10,.0f} entries/s {rate * args.entry_size / 1e6:>8.1f} MB/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--entry-size", type=int, default=1024)
    parser.add_argument("--page-entries", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
