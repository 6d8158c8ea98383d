"""The `entries.acknowledged` event's figures, from the writer handle's report of each
acknowledged append (shared/protocol/driver.py `WriterHandle._complete`) to the gateway's
one-event-per-ledger-and-ensemble windows (services/gateway/ledgers.py): microsecond
latencies, payload bytes, the segment's bookies, an append confirmed across an ensemble
change reported in parts, every entry counted in the latency histogram."""

from __future__ import annotations

import asyncio
from typing import Any

from services.gateway.ledgers import Ledgers
from services.gateway.metrics import GatewayMetrics
from shared.config import GatewaySettings, QuireSettings
from shared.digest import DigestManager, parse_header
from shared.latency import latency_bucket
from shared.models import BookieInfo, LedgerMetadata, Segment, UpdateLedgerRequest
from shared.protocol.driver import ProtocolClient, ProtocolObserver, WriterHandle
from shared.protocol.messages import EnsembleChanged
from shared.protocol.transport import BookieUnreachable
from shared.protocol.writer import LedgerWriter
from shared.quorum import QuorumSpec
from shared.status import BookieStatus
from shared.wire import AddItem, AddResult
from tests.support.protocol import KEY, metadata

ADD_TIMEOUT_MS = 10_000
Q332 = QuorumSpec(3, 3, 2)


class Clock:
    """The client's ms clock and its microsecond clock, both set by the test (and the
    bookies below)."""

    def __init__(self) -> None:
        self.us = 1_000_000_000

    def ms(self) -> int:
        return self.us // 1000

    def micros(self) -> int:
        return self.us


class Bookies:
    """Every add stored, answered on a later turn; each request takes `request_us` of the
    clock when it is sent, and `dead` bookies fail theirs (no responder) after `dead_after_s`."""

    max_send_bytes = 1024 * 1024

    def __init__(self, clock: Clock, request_us: int = 0, dead: frozenset[str] = frozenset()):
        self.clock = clock
        self.request_us = request_us
        self.dead = dead
        self.dead_after_s = 0.0

    async def add(self, bookie_id: str, items: list[AddItem]):
        self.clock.us += self.request_us
        if bookie_id in self.dead:
            await asyncio.sleep(self.dead_after_s)
            raise BookieUnreachable(f"add to {bookie_id}: NoRespondersError", timed_out=False)
        await asyncio.sleep(0)
        results = []
        for item in items:
            ledger_id, entry_id, _, _ = parse_header(item.frame)
            results.append(AddResult(ledger_id, entry_id, BookieStatus.OK))
        return BookieStatus.OK, results

    async def write_lac(self, bookie_id: str, items: list[tuple[int, bytes, int]]):
        return [BookieStatus.OK for _ in items]

    def bookies_listed(self, bookies: list[BookieInfo]) -> None:
        pass


class Metadata:
    """Four writable bookies; every compare-and-set wins."""

    def __init__(self, ledger: LedgerMetadata) -> None:
        self.ledger = ledger

    async def list_bookies(self) -> list[BookieInfo]:
        far = 2**62
        return [
            BookieInfo(bookie_id=f"b{i}", state="writable", last_seen=0, lease_expires_at=far)
            for i in range(4)
        ]

    async def update_ledger(self, request: UpdateLedgerRequest) -> LedgerMetadata:
        self.ledger = self.ledger.model_copy(
            update={"segments": request.segments, "version": self.ledger.version + 1}
        )
        return self.ledger


class Acks(ProtocolObserver):
    def __init__(self) -> None:
        self.acks: list[tuple[Any, ...]] = []

    def adds_acknowledged(self, ledger_id, first, last, latency_us, nbytes, bookies, quorum):
        self.acks.append((ledger_id, first, last, latency_us, nbytes, list(bookies), quorum))


def writer(client: ProtocolClient, ledger: LedgerMetadata) -> WriterHandle:
    core = LedgerWriter(
        ledger, KEY, DigestManager("crc32c", b"pw"), add_entry_timeout_ms=ADD_TIMEOUT_MS
    )
    return WriterHandle(core, client)


async def test_an_append_is_reported_with_its_latency_in_microseconds_and_its_bytes() -> None:
    clock, acks = Clock(), Acks()
    bookies = Bookies(clock, request_us=250)  # three requests go out before any answer
    client = ProtocolClient(
        bookies,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        GatewaySettings(add_entry_timeout_ms=ADD_TIMEOUT_MS),
        observer=acks,
        clock=clock.ms,
        clock_us=clock.micros,
    )
    handle = writer(client, metadata(3, 3, 2))
    await handle.append([b"a" * 10, b"b" * 20, b"c" * 30])
    await handle.append([b"d" * 5])
    assert acks.acks == [
        (7, 0, 2, 750, 60, ["b0", "b1", "b2"], Q332),
        (7, 3, 3, 750, 5, ["b0", "b1", "b2"], Q332),
    ]
    client.close()


async def test_an_append_confirmed_across_an_ensemble_change_is_reported_per_segment() -> None:
    """E3 Qw2 Qa2: entry 0 goes to b0 and b1 and is confirmed; entry 1 goes to b1 and b2,
    and b2 is gone: the new segment starts at entry 1 with b3 for b2. One append of both
    entries is reported as entry 0 on the old ensemble and entry 1 on the new."""
    clock, acks = Clock(), Acks()
    bookies = Bookies(clock, dead=frozenset({"b2"}))
    bookies.dead_after_s = 0.02  # after b0 and b1 answered entry 0
    meta = Metadata(metadata(3, 2, 2))
    client = ProtocolClient(
        bookies,  # type: ignore[arg-type]
        meta,  # type: ignore[arg-type]
        GatewaySettings(add_entry_timeout_ms=ADD_TIMEOUT_MS),
        observer=acks,
        clock=clock.ms,
        clock_us=clock.micros,
    )
    handle = writer(client, meta.ledger)
    await handle.append([b"x" * 100, b"y" * 7])
    assert meta.ledger.segments == [
        Segment(first_entry_id=0, bookies=["b0", "b1", "b2"]),
        Segment(first_entry_id=1, bookies=["b0", "b1", "b3"]),
    ]
    q322 = QuorumSpec(3, 2, 2)
    assert [(a[1], a[2], a[4], a[5], a[6]) for a in acks.acks] == [
        (0, 0, 100, ["b0", "b1", "b2"], q322),
        (1, 1, 7, ["b0", "b1", "b3"], q322),
    ]
    client.close()


class Events:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, dict[str, Any]]] = []

    def emit(self, kind: str, /, **data: Any) -> None:
        self.emitted.append((kind, data))


def gateway() -> tuple[Ledgers, Events]:
    events = Events()
    ledgers = Ledgers(
        None,  # type: ignore[arg-type]
        QuireSettings(),
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        events,  # type: ignore[arg-type]
        GatewayMetrics(),
    )
    return ledgers, events


def test_a_window_counts_every_entry_in_its_histogram_and_reads_the_old_summary_off_it() -> None:
    ledgers, events = gateway()
    bookies = ["b0", "b1", "b2"]
    ledgers.adds_acknowledged(5, 0, 0, 800, 10, bookies, Q332)
    ledgers.adds_acknowledged(5, 1, 20_000, 1_234, 400_000, bookies, Q332)  # one big append
    ledgers.adds_acknowledged(5, 20_001, 20_001, 98_765, 20, bookies, Q332)
    ledgers.adds_acknowledged(6, 0, 1, 2_000, 2, ["b3", "b4", "b5"], QuorumSpec(3, 2, 2))
    ledgers.flush_ack_events()
    assert events.emitted == [
        (
            "entries.acknowledged",
            {
                "ledger_id": 5,
                "count": 20_002,
                "first_entry_id": 0,
                "last_entry_id": 20_001,
                "bytes": 400_030,
                "ensemble": bookies,
                "ensemble_size": 3,
                "write_quorum": 3,
                "ack_quorum": 2,
                "latency_us": {"800": 1, str(latency_bucket(1_234)): 20_000, "98700": 1},
                "latency_ms_p50": 1.23,
                "latency_ms_p99": 1.23,
                "latency_ms_max": 98.7,
            },
        ),
        (
            "entries.acknowledged",
            {
                "ledger_id": 6,
                "count": 2,
                "first_entry_id": 0,
                "last_entry_id": 1,
                "bytes": 2,
                "ensemble": ["b3", "b4", "b5"],
                "ensemble_size": 3,
                "write_quorum": 2,
                "ack_quorum": 2,
                "latency_us": {"2000": 2},
                "latency_ms_p50": 2.0,
                "latency_ms_p99": 2.0,
                "latency_ms_max": 2.0,
            },
        ),
    ]
    ledgers.flush_ack_events()  # a quiet second: no event
    assert len(events.emitted) == 2


def test_an_ensemble_change_ends_the_window_so_that_an_event_has_one_ensemble() -> None:
    ledgers, events = gateway()
    old, new = ["b0", "b1", "b2"], ["b0", "b1", "b3"]
    ledgers.adds_acknowledged(5, 0, 9, 500, 100, old, Q332)
    changed = metadata(3, 3, 2).model_copy(
        update={
            "ledger_id": 5,
            "segments": [
                Segment(first_entry_id=0, bookies=old),
                Segment(first_entry_id=10, bookies=new),
            ],
        }
    )
    ledgers.ensemble_changed(EnsembleChanged(10, ((2, "b2", "b3"),), changed))
    ledgers.adds_acknowledged(5, 10, 14, 700, 50, new, Q332)
    # A segment that changes without the writer's own ensemble change ends it too.
    ledgers.adds_acknowledged(5, 15, 15, 700, 10, ["b0", "b4", "b3"], Q332)
    ledgers.flush_ack_events()
    summary = [
        (kind, d.get("first_entry_id"), d.get("last_entry_id"), d.get("ensemble"), d.get("count"))
        for kind, d in events.emitted
    ]
    assert summary == [
        ("entries.acknowledged", 0, 9, old, 10),
        ("ledger.ensemble_changed", 10, None, None, None),
        ("entries.acknowledged", 10, 14, new, 5),
        ("entries.acknowledged", 15, 15, ["b0", "b4", "b3"], 1),
    ]
