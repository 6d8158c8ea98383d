"""`ProtocolClient.read_stream` (shared/protocol/driver.py) over bookies in memory
(tests/support/protocol.py:MemoryBookies): what a range read sends, counted (requests,
entries, the most in flight), and what a consumer that stops does to it."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any

import pytest

from shared.config import GatewaySettings
from shared.digest import DigestManager
from shared.protocol.driver import ProtocolClient, ProtocolObserver
from shared.status import ApiCodes, BookieStatus, QuireError
from shared.wire import ReadItem
from tests.support.protocol import LEDGER, MemoryBookies, metadata

PASSWORD = b"pw"
ENTRIES = 100_000


def frames(count: int) -> dict[int, bytes]:
    dm = DigestManager("crc32c", PASSWORD)
    return {e: dm.sign(LEDGER, e, e - 1, e + 1, b"entry %d" % e) for e in range(count)}


FRAMES = frames(ENTRIES)


class Counts(ProtocolObserver):
    def __init__(self) -> None:
        self.read = 0
        self.failed = 0
        self.backoffs = 0

    def entries_read(self, ok: bool, count: int) -> None:
        if ok:
            self.read += count
        else:
            self.failed += count

    def read_backoffs(self, count: int) -> None:
        self.backoffs += count


def client(bookies: MemoryBookies, **settings: Any) -> tuple[ProtocolClient, Counts]:
    counts = Counts()
    meta: Any = None  # reads need no metadata service
    return ProtocolClient(bookies, meta, GatewaySettings(**settings), observer=counts), counts


async def test_a_range_of_100000_entries_streams_in_order_in_bounded_windows() -> None:
    ledger = metadata(3, 3, 2)
    bookies = MemoryBookies(ledger, FRAMES)
    # No speculative reads: their timer runs in real time, and on a loaded machine (a whole
    # suite beside this one) a pause past it asked a second replica for entries, which this
    # test, about windows and order, counts as asked twice.
    protocol, counts = client(bookies, speculative_read_timeout_ms=0)
    settings = protocol.settings
    taken = 0  # the next entry the consumer needs
    furthest_ahead = 0

    def watch(bookie_id: str, items: list[ReadItem]) -> None:
        nonlocal furthest_ahead
        furthest_ahead = max(furthest_ahead, max(i.entry_id for i in items) - taken)

    bookies.answer = watch
    stream = protocol.read_stream(ledger, PASSWORD, 0, ENTRIES - 1)
    async with aclosing(stream):
        async for batch in stream:
            assert [e.entry_id for e in batch] == list(range(taken, taken + len(batch)))
            assert batch[0].payload == b"entry %d" % taken
            taken += len(batch)
    assert taken == ENTRIES and counts.read == ENTRIES
    # Every entry asked once, of one bookie, in requests of at most read_batch_entries,
    # never more than the window unanswered at a bookie, none far past the consumer.
    asked = sorted(e for entries in bookies.entries_asked.values() for e in entries)
    assert asked == list(range(ENTRIES))
    requests = sum(bookies.requests.values())
    assert requests >= ENTRIES // settings.read_batch_entries
    assert max(bookies.in_flight_max.values()) <= settings.read_window_max_entries
    assert furthest_ahead < 2 * settings.read_ahead_max_entries
    # Sticky blocks: each bookie is asked a third of the range, in whole blocks.
    block = settings.sticky_read_block_entries
    for entries in bookies.entries_asked.values():
        assert abs(len(entries) - ENTRIES // 3) <= block
        starts = sorted(e for e in entries if e % block == 0)
        assert len(starts) * block >= len(entries) - block


async def test_a_consumer_that_stops_cancels_what_is_in_flight_and_sends_no_more() -> None:
    ledger = metadata(3, 3, 2)
    bookies = MemoryBookies(ledger, FRAMES)
    protocol, _ = client(bookies)
    stream = protocol.read_stream(ledger, PASSWORD, 0, ENTRIES - 1)
    first = await anext(stream)
    assert first[0].entry_id == 0
    await stream.aclose()
    sent = sum(bookies.requests.values())
    for _ in range(10):
        await asyncio.sleep(0)
    assert sum(bookies.requests.values()) == sent < ENTRIES // 64  # a start only
    assert all(n == 0 for n in bookies.in_flight.values())


async def test_a_consumer_that_pauses_holds_the_reading() -> None:
    ledger = metadata(3, 3, 2)
    bookies = MemoryBookies(ledger, FRAMES)
    protocol, _ = client(bookies, read_ahead_max_entries=1000)
    stream = protocol.read_stream(ledger, PASSWORD, 0, ENTRIES - 1)
    async with aclosing(stream):
        await anext(stream)
        await asyncio.sleep(0)  # the requests sent with that batch reach their bookies
        sent = sum(bookies.requests.values())
        for _ in range(50):  # the consumer does not come back for a while
            await asyncio.sleep(0)
        assert sum(bookies.requests.values()) == sent  # the reader waited with it
        asked = max(e for entries in bookies.entries_asked.values() for e in entries)
        assert asked < 2 * 1000


@pytest.mark.parametrize(("unconfirmed", "ends_quietly"), [(False, False), (True, True)])
async def test_an_entry_no_replica_has(unconfirmed: bool, ends_quietly: bool) -> None:
    ledger = metadata(3, 3, 2)
    bookies = MemoryBookies(ledger, frames(300))
    protocol, _ = client(bookies)
    got: list[int] = []

    async def read() -> None:
        stream = protocol.read_stream(ledger, PASSWORD, 0, 499, unconfirmed=unconfirmed)
        async with aclosing(stream):
            async for batch in stream:
                got.extend(e.entry_id for e in batch)

    if ends_quietly:
        await read()
    else:
        with pytest.raises(QuireError) as info:
            await read()
        assert info.value.api == ApiCodes.NO_SUCH_ENTRY
        assert str(info.value).startswith("entry 300: ")
    assert got == list(range(300))  # every entry before it came out first


async def test_bookies_that_refuse_every_read_fail_the_range_after_backoffs() -> None:
    ledger = metadata(3, 3, 2)
    bookies = MemoryBookies(ledger, FRAMES)

    async def refuse() -> tuple[BookieStatus, list]:
        return BookieStatus.TOO_MANY_REQUESTS, []

    bookies.answer = lambda bookie_id, items: refuse()
    protocol, counts = client(
        bookies, read_backoff_initial_ms=1, read_backoff_max_ms=4, read_max_tries=2
    )
    stream = protocol.read_stream(ledger, PASSWORD, 0, ENTRIES - 1)
    with pytest.raises(QuireError) as info:
        async with aclosing(stream):
            async for _ in stream:
                pass
    assert info.value.api == ApiCodes.TOO_MANY_REQUESTS
    assert "entry 0: b0: answered TOO_MANY_REQUESTS" in str(info.value)
    assert counts.backoffs >= 6 and counts.failed == 1
    # Windows halve at each refusal: a few first windows' worth in all, not the range.
    asked = sum(len(entries) for entries in bookies.entries_asked.values())
    assert asked <= 3 * 2 * protocol.settings.read_window_initial_entries + 3 * 6
