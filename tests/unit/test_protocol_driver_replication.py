"""`ProtocolClient.replicate` (shared/protocol/driver.py) over bookies and a metadata store in
memory: a lost bookie's fragments copied to a spare, the ensembles stored, every copied
frame byte for byte the one written, and a ledger without stored keys refused clearly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.config import GatewaySettings
from shared.digest import DigestManager, LedgerKeys
from shared.metaclient import MetadataError
from shared.models import (
    BookieInfo,
    BookieState,
    LedgerMetadata,
    LedgerState,
    Segment,
    UpdateLedgerRequest,
)
from shared.protocol.driver import ProtocolClient, ProtocolObserver
from shared.protocol.messages import FragmentReplicated
from shared.protocol.replication import ReplicationSettings
from shared.protocol.transport import BookieUnreachable
from shared.status import ApiCodes, BookieStatus, QuireError
from shared.wire import FLAG_RECOVERY_ADD, AddItem, AddResult, ReadItem
from tests.support.protocol import LEDGER, MemoryBookies

PASSWORD = b"pw"
KEYS = LedgerKeys.from_password(PASSWORD)
ENTRIES = 3_000


def closed_ledger() -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=LEDGER,
        state=LedgerState.CLOSED,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        digest="crc32c",
        last_entry_id=ENTRIES - 1,
        segments=[
            Segment(first_entry_id=0, bookies=["b0", "b1", "b2"]),
            Segment(first_entry_id=1_000, bookies=["b1", "b3", "b2"]),
        ],
        master_key=KEYS.master_key.hex(),
        mac_key=KEYS.mac_key.hex(),
    )


class Bookies(MemoryBookies):
    """MemoryBookies that also take adds (only recovery adds with the ledger's key, each
    frame the very one written) and may be down."""

    def __init__(self, ledger: LedgerMetadata, frames: dict[int, bytes]) -> None:
        super().__init__(ledger, frames)
        self.down: set[str] = set()
        self.added: dict[str, list[int]] = {}

    async def read(self, bookie_id: str, items: list[ReadItem]) -> Any:
        if bookie_id in self.down:
            raise BookieUnreachable("no responders")
        return await super().read(bookie_id, items)

    def bookies_listed(self, bookies: list[BookieInfo]) -> None:
        """What a transport hears of the registrations (a method of BookieTransport from
        the writer's no-responders rule on): nothing to do in memory."""

    async def add(self, bookie_id: str, items: list[AddItem]) -> Any:
        await asyncio.sleep(0)
        if bookie_id in self.down:
            raise BookieUnreachable("no responders")
        results = []
        for item in items:
            assert item.flags & FLAG_RECOVERY_ADD and item.master_key == KEYS.master_key
            entry_id = int.from_bytes(item.frame[8:16])
            assert item.frame == self.frames[entry_id]
            self.stored.setdefault(bookie_id, set()).add(entry_id)
            self.added.setdefault(bookie_id, []).append(entry_id)
            results.append(AddResult(LEDGER, entry_id, BookieStatus.OK))
        return BookieStatus.OK, results


class Meta:
    """The metadata calls a replication makes, on one row."""

    def __init__(self, ledger: LedgerMetadata, bookies: list[str]) -> None:
        self.ledger = ledger
        self.bookies = bookies
        self.updates = 0

    async def get_ledger(self, ledger_id: int) -> LedgerMetadata:
        return self.ledger

    async def update_ledger(self, request: UpdateLedgerRequest) -> LedgerMetadata:
        if request.expected_version != self.ledger.version:
            raise MetadataError("BAD_VERSION", "lost", current=self.ledger)
        self.updates += 1
        self.ledger = self.ledger.model_copy(
            update={"segments": request.segments, "version": self.ledger.version + 1}
        )
        return self.ledger

    async def list_bookies(self) -> list[BookieInfo]:
        far = 2**62
        return [
            BookieInfo(bookie_id=b, state=BookieState.WRITABLE, last_seen=0, lease_expires_at=far)
            for b in self.bookies
        ]


class Corrupt(ProtocolObserver):
    def __init__(self) -> None:
        self.reported: list[tuple[str, int]] = []

    def replica_corrupt(self, ledger_id: int, command: Any) -> None:
        self.reported.append((command.bookie_id, command.entry_id))


def frames() -> dict[int, bytes]:
    dm = DigestManager.for_keys("crc32c", KEYS)
    return {
        e: dm.sign(LEDGER, e, e - 1, (e + 1) * 9, b"entry %03d" % (e % 1000))
        for e in range(ENTRIES)
    }


async def test_a_lost_bookies_fragments_go_to_a_spare_and_the_ensembles_are_stored() -> None:
    ledger = closed_ledger()
    bookies = Bookies(ledger, frames())
    bookies.down.add("b1")
    meta = Meta(ledger, ["b0", "b2", "b4"])  # b3 not writable: b4 for both
    observer = Corrupt()
    client = ProtocolClient(bookies, meta, GatewaySettings(), observer=observer)
    heard: list[FragmentReplicated] = []
    settings = ReplicationSettings(rereplication_entry_batch_size=50, read=client.read_settings())
    result = await client.replicate(ledger, ["b1"], settings=settings, on_fragment=heard.append)
    assert result.metadata == meta.ledger and meta.updates == 2
    assert [s.bookies for s in meta.ledger.segments] == [["b0", "b4", "b2"], ["b4", "b3", "b2"]]
    assert result.fragments == tuple(heard) and len(heard) == 2
    assert result.entries == ENTRIES and sorted(bookies.added["b4"]) == list(range(ENTRIES))
    assert result.bytes == sum(len(f) for f in bookies.frames.values())
    assert "b1" not in bookies.entries_asked  # read from the survivors only
    assert observer.reported == []
    # The spare serves the ledger alone: every entry reads back from it.
    alone = meta.ledger.model_copy(
        update={
            "segments": [Segment(first_entry_id=0, bookies=["b4"])],
            "ensemble_size": 1,
            "write_quorum": 1,
            "ack_quorum": 1,
        }
    )
    got = []
    async for batch in client.read_stream(alone, PASSWORD, 0, ENTRIES - 1):
        got.extend(batch)
    assert [e.entry_id for e in got] == list(range(ENTRIES))


async def test_a_ledger_without_stored_keys_is_refused_clearly() -> None:
    ledger = closed_ledger().model_copy(update={"master_key": "", "mac_key": ""})
    client = ProtocolClient(Bookies(ledger, frames()), Meta(ledger, []), GatewaySettings())
    with pytest.raises(QuireError) as info:
        await client.replicate(ledger, ["b1"])
    assert info.value.api == ApiCodes.INVALID_ARGUMENT
    assert "cannot be re-replicated" in str(info.value)


async def test_no_spare_for_a_segment_fails_and_what_was_replicated_stays() -> None:
    ledger = closed_ledger()
    bookies = Bookies(ledger, frames())
    bookies.down.add("b1")
    meta = Meta(ledger, ["b2", "b3"])
    client = ProtocolClient(bookies, meta, GatewaySettings())
    with pytest.raises(QuireError) as info:
        await client.replicate(ledger, ["b1"])
    # b3 replaced b1 in the first segment; the second holds b3 already: nothing left.
    assert info.value.api == ApiCodes.NOT_ENOUGH_BOOKIES and meta.updates == 1
    assert [s.bookies for s in meta.ledger.segments] == [["b0", "b3", "b2"], ["b1", "b3", "b2"]]
