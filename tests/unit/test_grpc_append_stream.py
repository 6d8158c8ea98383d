"""AppendStream's flow control, on the servicer alone: while appends are not acknowledged the
server reads at most its window ahead, and acknowledgements leave in entry order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from quire.v1 import ledgers_pb2 as pb
from services.gateway.grpc_api import APPEND_STREAM_WINDOW, LedgersServicer
from shared.config import GatewaySettings


class SlowLedgers:
    """The driver's append, held until released: entry ids dense, as the real one's."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.next_entry = 0
        self.batches: list[int] = []

    async def append(
        self, ledger_id: int, password: bytes | None, payloads: Sequence[bytes]
    ) -> tuple[int, int, int]:
        first = self.next_entry
        self.next_entry += len(payloads)
        self.batches.append(len(payloads))
        await self.release.wait()
        return first, self.next_entry - 1, self.next_entry - 1


class Context:
    def invocation_metadata(self):
        return (("quire-ledger-password", "pw"),)


async def test_the_server_reads_only_a_window_ahead_of_acknowledgements() -> None:
    ledgers = SlowLedgers()
    settings = GatewaySettings(max_batch_entries=100)
    servicer = LedgersServicer(ledgers, settings)  # type: ignore[arg-type]
    total = APPEND_STREAM_WINDOW * 4
    sent = 0

    async def requests() -> AsyncIterator[pb.AppendStreamRequest]:
        nonlocal sent
        for i in range(total):
            sent += 1
            yield pb.AppendStreamRequest(ledger_id=7, entry=b"%d" % i)

    acks: list[int] = []

    async def consume() -> None:
        async for ack in servicer.AppendStream(requests(), Context()):
            acks.append(ack.entry_id)

    consumer = asyncio.create_task(consume())
    await asyncio.sleep(0.3)  # the first append is held: the reader fills its window, no more
    assert acks == []
    in_flight = sum(ledgers.batches)
    assert sent <= in_flight + APPEND_STREAM_WINDOW + 1, (sent, in_flight)
    assert sent < total
    ledgers.release.set()
    await asyncio.wait_for(consumer, 10)
    assert acks == list(range(total))
    assert max(ledgers.batches) <= settings.max_batch_entries
