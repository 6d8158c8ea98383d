"""A writer handle's deadline in its client's wheel (shared/protocol/driver.py), against
bookies that answer at once and a clock the test sets: the armed deadline follows the
core's next one as it moves, so a ledger that adds again before its explicit-LAC deadline
is not ticked for it; an idle ledger is ticked once, writes its LAC and is left with
nothing armed. Counts ticks and requests; the one wait polls with a deadline."""

from __future__ import annotations

import asyncio

from shared.config import GatewaySettings
from shared.digest import DigestManager, parse_header
from shared.models import BookieInfo, LedgerMetadata, UpdateLedgerRequest
from shared.protocol.driver import ProtocolClient, WriterHandle
from shared.protocol.transport import BookieUnreachable
from shared.protocol.writer import LedgerWriter
from shared.status import BookieStatus
from shared.wire import AddItem, AddResult
from tests.support.protocol import KEY, metadata

LAC_INTERVAL_MS = 20
ADD_TIMEOUT_MS = 10_000
WAIT_S = 5.0


class Bookies:
    """Every add stored at once; the explicit LACs counted."""

    max_send_bytes = 1024 * 1024

    def __init__(self) -> None:
        self.lacs: list[tuple[str, int]] = []

    async def add(self, bookie_id: str, items: list[AddItem]):
        await asyncio.sleep(0)
        results = []
        for item in items:
            ledger_id, entry_id, _, _ = parse_header(item.frame)
            results.append(AddResult(ledger_id, entry_id, BookieStatus.OK))
        return BookieStatus.OK, results

    async def write_lac(self, bookie_id: str, items: list[tuple[int, bytes, int]]):
        self.lacs.extend((bookie_id, lac) for _, _, lac in items)
        return [BookieStatus.OK for _ in items]


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


async def test_the_armed_deadline_follows_the_core_and_an_idle_writer_ends_unarmed(
    monkeypatch,
) -> None:
    ticks: list[int] = []
    tick = LedgerWriter.tick

    def counting_tick(self, now_ms: int) -> None:
        ticks.append(now_ms)
        tick(self, now_ms)

    monkeypatch.setattr(LedgerWriter, "tick", counting_tick)
    clock, bookies = Clock(), Bookies()
    settings = GatewaySettings(
        explicit_lac_interval_ms=LAC_INTERVAL_MS, add_entry_timeout_ms=ADD_TIMEOUT_MS
    )
    client = ProtocolClient(bookies, None, settings, clock=clock)  # type: ignore[arg-type]
    core = LedgerWriter(
        metadata(),
        KEY,
        DigestManager("crc32c", b"pw"),
        add_entry_timeout_ms=ADD_TIMEOUT_MS,
        explicit_lac_interval_ms=LAC_INTERVAL_MS,
        now_ms=clock.ms,
    )
    handle = WriterHandle(core, client)
    for entry in range(5):
        # Each add comes before the LAC deadline of the one before: the LAC rides on it.
        clock.ms += LAC_INTERVAL_MS // 2
        await handle.append([b"entry"])
        await asyncio.sleep(0)  # the pump after the last answer
        assert core.lac == entry
        assert handle.deadline_ms == core.next_deadline_ms() == clock.ms + LAC_INTERVAL_MS
        assert len(client.deadlines) == 1
    assert ticks == []
    assert bookies.lacs == []
    # Idle from here: its deadline comes, it writes its LAC to its three bookies, once.
    clock.ms += LAC_INTERVAL_MS
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not (handle.quiet and client.quiet):
        assert loop.time() < deadline, "the idle writer did not write its LAC"
        await asyncio.sleep(0.005)
    assert len(ticks) == 1
    assert sorted(bookies.lacs) == [("b0", 4), ("b1", 4), ("b2", 4)]
    assert handle.deadline_ms is None and len(client.deadlines) == 0
    client.close()


class CountingBookies(Bookies):
    """`Bookies` that counts the add requests (and their items) each bookie gets."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, int]] = []

    async def add(self, bookie_id: str, items: list[AddItem]):
        self.requests.append((bookie_id, len(items)))
        return await super().add(bookie_id, items)


async def test_the_appends_of_many_ledgers_in_one_turn_go_to_a_free_bookie_as_one_request() -> None:
    """With its request slots free, a bookie still gets one request for the sends of every
    writer pumped in a turn (the many-ledger shape: each ledger adds one entry), not the first
    writer's alone and the rest merged behind it."""
    ledgers = 50
    clock, bookies = Clock(), CountingBookies()
    settings = GatewaySettings(add_entry_timeout_ms=ADD_TIMEOUT_MS)
    client = ProtocolClient(bookies, None, settings, clock=clock)  # type: ignore[arg-type]
    handles = [
        WriterHandle(
            LedgerWriter(
                metadata().model_copy(update={"ledger_id": ledger_id}),
                KEY,
                DigestManager("crc32c", b"pw"),
                add_entry_timeout_ms=ADD_TIMEOUT_MS,
                now_ms=clock.ms,
            ),
            client,
        )
        for ledger_id in range(1, ledgers + 1)
    ]
    await asyncio.gather(*(handle.append([b"entry"]) for handle in handles))
    assert sorted(bookies.requests) == [("b0", ledgers), ("b1", ledgers), ("b2", ledgers)]
    client.close()


class DeadBookieB2(CountingBookies):
    """`CountingBookies` where b2 has no responder (its process is gone)."""

    def __init__(self) -> None:
        super().__init__()
        self.listed: list[list[str]] = []

    async def add(self, bookie_id: str, items: list[AddItem]):
        if bookie_id == "b2":
            self.requests.append((bookie_id, len(items)))
            raise BookieUnreachable("add to b2: NoRespondersError", timed_out=False)
        return await super().add(bookie_id, items)

    def bookies_listed(self, bookies: list[BookieInfo]) -> None:
        self.listed.append([b.bookie_id for b in bookies])


class Metadata:
    """Four writable bookies; every compare-and-set wins."""

    def __init__(self, ledger: LedgerMetadata) -> None:
        self.ledger = ledger
        self.updates: list[UpdateLedgerRequest] = []

    async def list_bookies(self) -> list[BookieInfo]:
        far = 2**62
        return [
            BookieInfo(bookie_id=f"b{i}", state="writable", last_seen=0, lease_expires_at=far)
            for i in range(4)
        ]

    async def update_ledger(self, request: UpdateLedgerRequest) -> LedgerMetadata:
        self.updates.append(request)
        self.ledger = self.ledger.model_copy(
            update={"segments": request.segments, "version": self.ledger.version + 1}
        )
        return self.ledger


async def test_a_bookie_with_no_responder_is_replaced_at_its_first_failed_write() -> None:
    """Qa=2 of Qw=3 would let the add complete without b2; but b2 could not be reached at
    all, so the writer replaces it at once (no ensemble_change_delay_ms): the add completes
    only once the new segment is stored, and one request was all b2 got."""
    clock, bookies = Clock(), DeadBookieB2()
    meta = Metadata(metadata(3, 3, 2))
    settings = GatewaySettings(add_entry_timeout_ms=ADD_TIMEOUT_MS)
    client = ProtocolClient(bookies, meta, settings, clock=clock)  # type: ignore[arg-type]
    core = LedgerWriter(
        meta.ledger, KEY, DigestManager("crc32c", b"pw"), add_entry_timeout_ms=ADD_TIMEOUT_MS
    )
    handle = WriterHandle(core, client)
    await handle.append([b"entry"])
    [update] = meta.updates
    assert update.segments[-1].bookies == ["b0", "b1", "b3"]
    assert bookies.listed == [["b0", "b1", "b2", "b3"]]  # the registrations, for the transport
    # The entry goes to the replacement too (after the append completed on b0 and b1).
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not (handle.quiet and client.quiet):
        assert loop.time() < deadline, "the entry was not resent to the replacement"
        await asyncio.sleep(0.005)
    assert sorted(b for b, _ in bookies.requests) == ["b0", "b1", "b2", "b3"]
    client.close()


class KilledWithAddsInFlight(CountingBookies):
    """b2's process dies while `hung` add requests are in flight to it: they are never
    answered, and it has no responder any more."""

    def __init__(self, hung: int) -> None:
        super().__init__()
        self.hung = hung
        self.probed: list[str] = []

    async def add(self, bookie_id: str, items: list[AddItem]):
        if bookie_id == "b2" and self.hung > 0:
            self.hung -= 1
            self.requests.append((bookie_id, len(items)))
            await asyncio.Event().wait()  # never answered
        if bookie_id == "b2":
            self.requests.append((bookie_id, len(items)))
            raise BookieUnreachable("add to b2: NoRespondersError", timed_out=False)
        return await super().add(bookie_id, items)

    async def has_responder(self, bookie_id: str) -> bool:
        self.probed.append(bookie_id)
        return bookie_id != "b2"

    def bookies_listed(self, bookies: list[BookieInfo]) -> None:
        pass


async def test_adds_in_flight_to_a_killed_bookie_fail_once_a_probe_finds_it_gone() -> None:
    """Two adds hang on b2 (its request slots full: nothing new reaches it to meet "no
    responders"); the probe after add_bookie_probe_ms finds b2 gone, the hung adds fail as
    unreachable, and the writer replaces b2 then, not after add_bookie_timeout_ms."""
    clock, bookies = Clock(), KilledWithAddsInFlight(hung=2)
    meta = Metadata(metadata(3, 3, 2))
    settings = GatewaySettings(
        add_entry_timeout_ms=ADD_TIMEOUT_MS, add_bookie_probe_ms=10, max_add_requests_per_bookie=2
    )
    client = ProtocolClient(bookies, meta, settings, clock=clock)  # type: ignore[arg-type]
    core = LedgerWriter(
        meta.ledger,
        KEY,
        DigestManager("crc32c", b"pw"),
        add_entry_timeout_ms=ADD_TIMEOUT_MS,
        max_add_requests_per_bookie=2,
    )
    handle = WriterHandle(core, client)
    for _ in range(2):  # completed on b0 and b1; their adds to b2 hang
        await handle.append([b"entry"])
    assert meta.updates == []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not meta.updates:
        assert loop.time() < deadline, "the killed bookie was not replaced"
        await asyncio.sleep(0.005)
    [update] = meta.updates
    assert update.segments[-1].bookies == ["b0", "b1", "b3"]
    assert bookies.probed[0] == "b2" and set(bookies.probed) == {"b2"}
    client.close()


async def test_append_future_resolves_with_the_lac_and_waits_out_back_pressure() -> None:
    """`append_future` (the paced bench's append, no coroutine): a future of the LAC; with
    the core's pending bound full, the append waits for room (a Task) and then resolves
    with the LAC too."""
    clock, bookies = Clock(), Bookies()
    settings = GatewaySettings(add_entry_timeout_ms=ADD_TIMEOUT_MS)
    client = ProtocolClient(bookies, None, settings, clock=clock)  # type: ignore[arg-type]
    core = LedgerWriter(
        metadata(),
        KEY,
        DigestManager("crc32c", b"pw"),
        add_entry_timeout_ms=ADD_TIMEOUT_MS,
        max_pending_adds=2,
        now_ms=clock.ms,
    )
    handle = WriterHandle(core, client)
    futures = [handle.append_future([b"entry"]) for _ in range(3)]
    assert not isinstance(futures[0], asyncio.Task)
    assert isinstance(futures[2], asyncio.Task)  # the bound of 2 was full: it waits
    lacs = await asyncio.wait_for(asyncio.gather(*futures), WAIT_S)
    # Each resolves with the LAC once its entry is acknowledged (entries 0-2 in order).
    assert all(lac >= entry for entry, lac in enumerate(lacs)) and lacs == sorted(lacs)
    assert lacs[-1] == 2
    assert core.lac == 2
    client.close()
