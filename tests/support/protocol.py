"""The ledger the protocol cores' table tests run against (tests/unit/test_protocol_*.py),
and bookies in memory for the driver's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from shared.digest import master_key
from shared.models import BookieInfo, LedgerMetadata, LedgerState, Segment
from shared.quorum import write_set
from shared.status import BookieStatus
from shared.wire import ReadItem, ReadResult

ReadReply = tuple[BookieStatus, list[ReadResult]]

LEDGER = 7
KEY = master_key(b"pw")


def metadata(e: int = 3, w: int = 3, a: int = 2, digest: str = "crc32c") -> LedgerMetadata:
    """An open ledger of E bookies b0..b(E-1), one segment from entry 0."""
    return LedgerMetadata(
        ledger_id=LEDGER,
        state=LedgerState.OPEN,
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=a,
        digest=digest,
        segments=[Segment(first_entry_id=0, bookies=[f"b{i}" for i in range(e)])],
    )


class MemoryBookies:
    """The read side of a `BookieTransport` over frames held in memory, for tests of the
    driver's reads: each bookie holds the entries of its write sets, answers on a later turn
    of the event loop (as over NATS), and counts its requests and the most entries asked of
    it and unanswered at once. `answer` may replace a bookie's answer to a request."""

    max_send_bytes = 1 << 20

    def __init__(self, ledger: LedgerMetadata, frames: dict[int, bytes]) -> None:
        self.ledger_id = ledger.ledger_id
        self.stored: dict[str, set[int]] = {}
        for entry_id in frames:
            bookies = ledger.segment_for(entry_id).bookies
            for index in write_set(entry_id, ledger.quorum):
                self.stored.setdefault(bookies[index], set()).add(entry_id)
        self.frames = frames
        self.requests: dict[str, int] = {}
        self.entries_asked: dict[str, list[int]] = {}
        self.in_flight: dict[str, int] = {}
        self.in_flight_max: dict[str, int] = {}
        self.cancelled = 0
        self.answer: Callable[[str, list[ReadItem]], Awaitable[ReadReply] | None] = (
            lambda bookie_id, items: None
        )

    async def read(self, bookie_id: str, items: list[ReadItem]) -> ReadReply:
        self.requests[bookie_id] = self.requests.get(bookie_id, 0) + 1
        self.entries_asked.setdefault(bookie_id, []).extend(item.entry_id for item in items)
        in_flight = self.in_flight.get(bookie_id, 0) + len(items)
        self.in_flight[bookie_id] = in_flight
        self.in_flight_max[bookie_id] = max(self.in_flight_max.get(bookie_id, 0), in_flight)
        try:
            await asyncio.sleep(0)
            special = self.answer(bookie_id, items)
            if special is not None:
                return await special
            stored = self.stored.get(bookie_id, set())
            return BookieStatus.OK, [
                ReadResult(
                    self.ledger_id, item.entry_id, BookieStatus.OK, self.frames[item.entry_id]
                )
                if item.entry_id in stored
                else ReadResult(self.ledger_id, item.entry_id, BookieStatus.NO_ENTRY)
                for item in items
            ]
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight[bookie_id] -= len(items)

    async def has_responder(self, bookie_id: str) -> bool:
        """Bookies in memory never go away."""
        return True

    def bookies_listed(self, bookies: list[BookieInfo]) -> None:
        """Registrations change nothing for bookies in memory."""
