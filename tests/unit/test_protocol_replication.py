"""LedgerReplication, the sans-IO re-replication of a ledger's fragments: which fragments
(tables), then scenarios against bookies and a metadata row held in a small in-test world
(read failures, corrupt replicas, add failures, CAS conflicts with a writer's ensemble
change and with a close, the throttle's accounting and the memory bound, counted)."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest

from shared.digest import DigestManager, DigestType, LedgerKeys
from shared.models import LedgerMetadata, LedgerState, Segment
from shared.protocol.messages import (
    AddSendFailed,
    BookieAddReply,
    BookieReadReply,
    Fragment,
    FragmentReplicated,
    LedgerUpdated,
    LedgerUpdateFailed,
    ListWritableBookies,
    ReadSendFailed,
    ReplicaCorrupt,
    ReplicationDone,
    ReplicationFailed,
    SendAdds,
    SendReads,
    UpdateLedger,
    WritableBookies,
)
from shared.protocol.placement import PlacementPolicy, PlacementRules
from shared.protocol.reader import ReadSettings
from shared.protocol.replication import (
    ByteRateLimiter,
    LedgerReplication,
    ReplicationPhase,
    ReplicationSettings,
    fragments_on,
    open_fragment_on,
)
from shared.quorum import write_set
from shared.status import ApiCodes, BookieStatus
from shared.wire import FLAG_RECOVERY_ADD, AddResult, ReadResult

LEDGER = 9
KEYS = LedgerKeys.from_password(b"pw")


def ledger(
    e: int,
    w: int,
    a: int,
    segments: list[tuple[int, list[str]]],
    state: LedgerState = LedgerState.CLOSED,
    last: int | None = None,
    digest: DigestType = DigestType.CRC32C,
) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=LEDGER,
        state=state,
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=a,
        digest=digest,
        last_entry_id=last,
        segments=[Segment(first_entry_id=f, bookies=b) for f, b in segments],
    )


# -- which fragments --------------------------------------------------------------------------

B3 = ["b0", "b1", "b2"]


@pytest.mark.parametrize(
    ("metadata", "bad", "expected"),
    [
        # E = Qw: every index holds every entry of the segment.
        (ledger(3, 3, 2, [(0, B3)], last=9), {"b1"}, [Fragment(0, 0, 9, 1, "b1")]),
        # Several segments: a non-last one ends where the next starts.
        (
            ledger(3, 3, 2, [(0, B3), (5, ["b0", "b3", "b2"])], last=9),
            {"b2"},
            [Fragment(0, 0, 4, 2, "b2"), Fragment(5, 5, 9, 2, "b2")],
        ),
        (
            ledger(3, 3, 2, [(0, B3), (5, ["b0", "b3", "b2"])], last=9),
            {"b1", "b3"},
            [Fragment(0, 0, 4, 1, "b1"), Fragment(5, 5, 9, 1, "b3")],
        ),
        # E > Qw: a one-entry segment holds entry 5 on indexes 1 and 2 (5 mod 4 = 1) only.
        (
            ledger(4, 2, 2, [(0, ["b0", "b1", "b2", "b3"]), (5, ["b0", "b1", "b2", "b3"])], last=5),
            {"b3", "b1"},
            [Fragment(0, 0, 4, 1, "b1"), Fragment(0, 0, 4, 3, "b3"), Fragment(5, 5, 5, 1, "b1")],
        ),
        # An empty last segment of a closed ledger, and one past its last entry.
        (
            ledger(3, 3, 2, [(0, B3), (10, ["b3", "b1", "b2"])], last=9),
            {"b1"},
            [Fragment(0, 0, 9, 1, "b1")],
        ),
        (
            ledger(3, 3, 2, [(0, B3), (5, ["b3", "b1", "b2"]), (8, ["b3", "b4", "b2"])], last=6),
            {"b2"},
            [Fragment(0, 0, 4, 2, "b2"), Fragment(5, 5, 6, 2, "b2")],
        ),
        # A ledger closed empty holds nothing.
        (ledger(3, 3, 2, [(0, B3)], last=-1), {"b0", "b1", "b2"}, []),
        # Open (or in recovery): the last segment is being written, left out.
        (ledger(3, 3, 2, [(0, B3)], state=LedgerState.OPEN), {"b1"}, []),
        (
            ledger(3, 3, 2, [(0, B3), (5, ["b0", "b3", "b2"])], state=LedgerState.IN_RECOVERY),
            {"b2", "b1"},
            [Fragment(0, 0, 4, 1, "b1"), Fragment(0, 0, 4, 2, "b2")],
        ),
        # A bookie of no segment.
        (ledger(3, 3, 2, [(0, B3)], last=9), {"b7"}, []),
    ],
)
def test_fragments_on(metadata: LedgerMetadata, bad: set[str], expected: list[Fragment]) -> None:
    assert fragments_on(metadata, bad) == expected


@pytest.mark.parametrize(
    ("state", "bad", "expected"),
    [
        (LedgerState.OPEN, {"b3"}, True),
        (LedgerState.IN_RECOVERY, {"b3"}, True),
        (LedgerState.OPEN, {"b1"}, False),  # only in an older segment
        (LedgerState.CLOSED, {"b3"}, False),
    ],
)
def test_open_fragment_on(state: LedgerState, bad: set[str], expected: bool) -> None:
    metadata = ledger(3, 3, 2, [(0, B3), (5, ["b0", "b3", "b2"])], state=state, last=None)
    if state is LedgerState.CLOSED:
        metadata = metadata.model_copy(update={"last_entry_id": 9})
    assert open_fragment_on(metadata, bad) is expected


# -- a small world: bookies holding frames, a metadata row, a clock -------------------------


def frames(count: int, digest: DigestType = DigestType.CRC32C, size: int = 16) -> list[bytes]:
    dm = DigestManager.for_keys(digest, KEYS)
    return [
        dm.sign(LEDGER, e, e - 1, (e + 1) * size, (b"%d-" % e).ljust(size, b"x"))
        for e in range(count)
    ]


class World:
    """Bookies with the frames of their write sets, the ledger's metadata row (CAS on its
    version), and a clock of 1 ms per answer. Answers are queued and delivered one at a
    time (what the core sent meanwhile waits), so sends overlap as over a network. Hooks
    bend one answer: `on_read`, `on_add`, `before_cas`."""

    def __init__(self, metadata: LedgerMetadata, entries: list[bytes], spare: list[str]) -> None:
        self.metadata = metadata
        self.frames = entries
        self.stored: dict[str, dict[int, bytes]] = {b: {} for b in spare}
        for entry_id, frame in enumerate(entries):
            bookies = metadata.segment_for(entry_id).bookies
            for index in write_set(entry_id, metadata.quorum):
                self.stored.setdefault(bookies[index], {})[entry_id] = frame
        self.down: set[str] = set()
        self.now_ms = 0
        self.queue: deque[Any] = deque()
        self.reads_asked: dict[str, list[int]] = {}
        self.on_read: Callable[[SendReads], Any] = lambda command: None
        self.on_add: Callable[[SendAdds], Any] = lambda command: None
        self.before_cas: Callable[[UpdateLedger], None] = lambda command: None
        self.bytes_at: list[tuple[int, int]] = []  # (ms, frame bytes) of each SendAdds
        self.buffered_max = 0
        self.locations: dict[str, str] = {}  # bookie -> network location, for placement

    def writable(self) -> tuple[str, ...]:
        return tuple(sorted(b for b in self.stored if b not in self.down))

    def answer(self, command: Any) -> Any:
        match command:
            case ListWritableBookies():
                writable = self.writable()
                located = tuple((b, self.locations[b]) for b in writable if b in self.locations)
                return WritableBookies(writable, located)
            case SendReads():
                self.reads_asked.setdefault(command.bookie_id, []).extend(command.entry_ids)
                special = self.on_read(command)
                if special is not None:
                    return special
                if command.bookie_id in self.down:
                    return ReadSendFailed(command.bookie_id, command.entry_ids, "down", False)
                held = self.stored[command.bookie_id]
                results = tuple(
                    ReadResult(LEDGER, e, BookieStatus.OK, held[e])
                    if e in held
                    else ReadResult(LEDGER, e, BookieStatus.NO_ENTRY)
                    for e in command.entry_ids
                )
                return BookieReadReply(
                    command.bookie_id, command.entry_ids, BookieStatus.OK, results
                )
            case SendAdds():
                self.bytes_at.append((self.now_ms, sum(len(i.frame) for i in command.items)))
                assert all(i.flags & FLAG_RECOVERY_ADD for i in command.items)
                assert all(i.master_key == KEYS.master_key for i in command.items)
                special = self.on_add(command)
                if special is not None:
                    return special
                for entry_id, item in zip(command.entry_ids, command.items, strict=True):
                    self.stored[command.bookie_id][entry_id] = item.frame
                results = tuple(AddResult(LEDGER, e, BookieStatus.OK) for e in command.entry_ids)
                return BookieAddReply(
                    command.bookie_id, command.entry_ids, BookieStatus.OK, results
                )
            case UpdateLedger():
                self.before_cas(command)
                request = command.request
                if request.expected_version != self.metadata.version:
                    return LedgerUpdateFailed(self.metadata, "BAD_VERSION")
                assert request.segments is not None and request.state is None
                self.metadata = self.metadata.model_copy(
                    update={"segments": request.segments, "version": self.metadata.version + 1}
                )
                return LedgerUpdated(self.metadata)
        raise AssertionError(command)

    def run(self, core: LedgerReplication, max_steps: int = 1_000_000) -> list[Any]:
        """Until the core is done; every command it gave, in order."""
        given: list[Any] = []
        for _ in range(max_steps):
            for command in core.take_commands():
                given.append(command)
                if isinstance(command, ReplicationDone | ReplicationFailed):
                    assert core.done
                    return given
                if isinstance(command, FragmentReplicated | ReplicaCorrupt):
                    continue
                self.queue.append(self.answer(command))
            self.buffered_max = max(self.buffered_max, core.buffered)
            if self.queue:
                self.now_ms += 1
                core.step(self.queue.popleft(), self.now_ms)
            else:
                self.now_ms += 10
                core.tick(self.now_ms)
        raise AssertionError("the replication does not end")

    def holds_fragment_on(self, bookie_id: str, index: int, first: int, last: int) -> bool:
        wanted = [e for e in range(first, last + 1) if index in write_set(e, self.metadata.quorum)]
        return all(self.stored[bookie_id].get(e) == self.frames[e] for e in wanted)


def replication(
    world: World,
    bad: set[str],
    seed: int = 1,
    placement: PlacementPolicy | None = None,
    **settings: Any,
) -> LedgerReplication:
    return LedgerReplication(
        world.metadata,
        bad,
        KEYS,
        world.now_ms,
        settings=ReplicationSettings(**settings),
        rng=random.Random(seed),
        placement=placement,
    )


def test_a_lost_bookie_of_a_closed_ledger_is_replaced_in_every_segment_by_one_bookie() -> None:
    metadata = ledger(
        3, 3, 2, [(0, B3), (40, ["b1", "b3", "b2"]), (70, ["b4", "b2", "b1"])], last=99
    )
    world = World(metadata, frames(100), spare=["b5", "b6"])
    world.down.add("b1")
    core = replication(world, {"b1"})
    given = world.run(core)
    assert isinstance(given[-1], ReplicationDone)
    done = [c for c in given if isinstance(c, FragmentReplicated)]
    assert [(d.fragment.segment_first_entry_id, d.entries) for d in done] == [
        (0, 40),
        (40, 30),
        (70, 30),
    ]
    # The same replacement for the same bad bookie, except where it is in the ensemble.
    first, second, third = (d.new_bookie_id for d in done)
    assert first == second and first not in {"b0", "b1", "b2", "b3"}
    assert third == first if first != "b4" else third not in {"b4", "b2", "b1"}
    stored = world.metadata
    assert all("b1" not in s.bookies for s in stored.segments)
    assert [s.bookies for s in stored.segments] == [
        ["b0", first, "b2"],
        [second, "b3", "b2"],
        ["b4", "b2", third],
    ]
    # The replacement holds every entry, byte for byte the frame it was written as.
    assert all(world.stored[first][e] == world.frames[e] for e in range(70))
    assert all(world.stored[third][e] == world.frames[e] for e in range(70, 100))
    assert core.entries_copied == 100 and core.bytes_copied == sum(map(len, world.frames))
    assert given[-1].metadata == stored
    assert "b1" not in world.reads_asked  # the bad bookie is asked only as a last resort


def test_hmac_ledgers_are_signed_again_with_the_stored_mac_key() -> None:
    metadata = ledger(3, 2, 2, [(0, B3)], last=29, digest=DigestType.HMAC)
    world = World(metadata, frames(30, DigestType.HMAC), spare=["b3"])
    world.down.add("b0")
    assert isinstance(world.run(replication(world, {"b0"}))[-1], ReplicationDone)
    assert world.holds_fragment_on("b3", 0, 0, 29)


def test_with_e_greater_than_qw_only_the_fragments_entries_are_read_and_copied() -> None:
    bookies = ["b0", "b1", "b2", "b3", "b4"]
    metadata = ledger(5, 2, 2, [(0, bookies)], last=99)
    world = World(metadata, frames(100), spare=["b5"])
    world.down.add("b2")
    given = world.run(replication(world, {"b2"}))
    [done] = [c for c in given if isinstance(c, FragmentReplicated)]
    wanted = [e for e in range(100) if 2 in write_set(e, metadata.quorum)]
    assert done.entries == len(wanted) == 40
    assert sorted(world.stored["b5"]) == wanted
    asked = sorted(e for entries in world.reads_asked.values() for e in entries)
    assert asked == wanted  # each wanted entry asked once, no other


def test_a_replica_that_fails_its_digest_is_reported_and_another_read() -> None:
    metadata = ledger(3, 3, 2, [(0, B3)], last=19)
    world = World(metadata, frames(20), spare=["b3"])
    world.stored["b0"][7] = world.frames[7][:-1] + b"!"
    world.stored["b1"][7] = world.frames[7][:-1] + b"!"
    world.down.add("b2")
    given = world.run(replication(world, {"b2"}))
    assert isinstance(given[-1], ReplicationFailed)
    assert given[-1].api == ApiCodes.UNAVAILABLE and "entry 7" in given[-1].detail
    assert [c.entry_id for c in given if isinstance(c, ReplicaCorrupt)] == [7, 7]
    assert not any(isinstance(c, UpdateLedger) for c in given)  # nothing stored


def test_a_corrupt_replica_is_read_past() -> None:
    metadata = ledger(3, 3, 2, [(0, B3)], last=19)
    world = World(metadata, frames(20), spare=["b3"])
    world.stored["b0"][7] = world.frames[7][:-1] + b"!"
    world.down.add("b2")
    given = world.run(replication(world, {"b2"}))
    assert isinstance(given[-1], ReplicationDone)
    assert [(c.bookie_id, c.entry_id) for c in given if isinstance(c, ReplicaCorrupt)] == [
        ("b0", 7)
    ]
    assert world.holds_fragment_on("b3", 2, 0, 19)


def test_an_entry_no_surviving_replica_has_fails_the_replication_and_stores_nothing() -> None:
    metadata = ledger(3, 2, 2, [(0, B3)], last=29)
    world = World(metadata, frames(30), spare=["b3"])
    world.down.add("b0")
    del world.stored["b1"][12]  # entry 12 is on b0 and b1 (12 mod 3 = 0)
    given = world.run(replication(world, {"b0"}))
    failed = given[-1]
    assert isinstance(failed, ReplicationFailed) and "entry 12" in failed.detail
    assert not any(isinstance(c, UpdateLedger) for c in given)
    assert world.metadata.segments[0].bookies == B3


def test_failed_adds_are_retried_then_fail_the_replication() -> None:
    metadata = ledger(3, 3, 2, [(0, B3)], last=49)
    world = World(metadata, frames(50), spare=["b3"])
    world.down.add("b1")
    failures = {"left": 5}

    def flaky(command: SendAdds) -> Any:
        if 20 in command.entry_ids and failures["left"]:
            failures["left"] -= 1
            return AddSendFailed(command.bookie_id, command.entry_ids, "timeout")
        return None

    world.on_add = flaky
    given = world.run(replication(world, {"b1"}, rereplication_add_tries=3))
    assert isinstance(given[-1], ReplicationFailed) and "entry 20" in given[-1].detail
    assert failures["left"] == 2  # three sends of entry 20, then no more
    assert not any(isinstance(c, UpdateLedger) for c in given)
    # With one failure per entry fewer than the tries, it goes through.
    world = World(metadata, frames(50), spare=["b3"])
    world.down.add("b1")
    failures["left"] = 2
    refused = {"done": False}

    def some_refused(command: SendAdds) -> Any:
        if not refused["done"] and len(command.entry_ids) > 1:
            refused["done"] = True
            statuses = [BookieStatus.OK, BookieStatus.IO_ERROR] * len(command.entry_ids)
            results = tuple(
                AddResult(LEDGER, e, s) for e, s in zip(command.entry_ids, statuses, strict=False)
            )
            for e, s in zip(command.entry_ids, statuses, strict=False):
                if s is BookieStatus.OK:
                    world.stored[command.bookie_id][e] = world.frames[e]
            return BookieAddReply(command.bookie_id, command.entry_ids, BookieStatus.OK, results)
        return flaky(command)

    world.on_add = some_refused
    given = world.run(replication(world, {"b1"}, rereplication_add_tries=3))
    assert isinstance(given[-1], ReplicationDone) and refused["done"]
    assert world.holds_fragment_on("b3", 1, 0, 49)


def test_a_bookie_refusing_the_key_fails_at_once() -> None:
    metadata = ledger(3, 3, 2, [(0, B3)], last=9)
    world = World(metadata, frames(10), spare=["b3"])
    world.down.add("b1")
    world.on_add = lambda c: BookieAddReply(c.bookie_id, c.entry_ids, BookieStatus.UNAUTHORIZED)
    given = world.run(replication(world, {"b1"}))
    assert isinstance(given[-1], ReplicationFailed) and given[-1].api == ApiCodes.UNAUTHORIZED
    assert sum(isinstance(c, SendAdds) for c in given) == 1


def test_no_writable_bookie_outside_the_ensemble() -> None:
    metadata = ledger(3, 3, 2, [(0, B3)], last=9)
    world = World(metadata, frames(10), spare=[])
    world.down.add("b1")
    given = world.run(replication(world, {"b1"}))
    assert isinstance(given[-1], ReplicationFailed)
    assert given[-1].api == ApiCodes.NOT_ENOUGH_BOOKIES


def test_nothing_to_do_is_done_at_once() -> None:
    core = LedgerReplication(ledger(3, 3, 2, [(0, B3)], last=9), {"b7"}, KEYS, 0)
    assert core.done and [type(c) for c in core.take_commands()] == [ReplicationDone]


# -- metadata conflicts (BookieRecoveryTest's metadata-conflict case) ------------------------


def open_world() -> World:
    """An open ledger: entries 0..59 in two closed segments, the writer on a third."""
    metadata = ledger(
        3,
        3,
        2,
        [(0, B3), (30, ["b0", "b1", "b3"]), (60, ["b0", "b3", "b4"])],
        state=LedgerState.OPEN,
    )
    world = World(metadata, frames(60), spare=["b5"])
    world.down.add("b1")
    return world


def test_a_writers_ensemble_change_meanwhile_is_merged() -> None:
    world = open_world()
    changed = {"done": False}

    def writer_changes_ensemble(command: UpdateLedger) -> None:
        if not changed["done"]:
            changed["done"] = True
            segments = [*world.metadata.segments, Segment(first_entry_id=75, bookies=B3[::-1])]
            world.metadata = world.metadata.model_copy(
                update={"segments": segments, "version": world.metadata.version + 1}
            )

    world.before_cas = writer_changes_ensemble
    given = world.run(replication(world, {"b1"}))
    assert isinstance(given[-1], ReplicationDone)
    cas = [c for c in given if isinstance(c, UpdateLedger)]
    assert len(cas) == 3  # the first lost, merged and sent again; then the second segment
    segments = world.metadata.segments
    assert [s.first_entry_id for s in segments] == [0, 30, 60, 75]
    assert all("b1" not in s.bookies for s in segments[:2])
    assert segments[2].bookies == ["b0", "b3", "b4"]  # the open segment: the writer's
    assert segments[3].bookies == ["b2", "b1", "b0"]  # the writer's change, kept
    assert world.metadata.state is LedgerState.OPEN


def test_a_close_meanwhile_is_merged() -> None:
    world = open_world()

    def close(command: UpdateLedger) -> None:
        if world.metadata.state is LedgerState.OPEN:
            world.metadata = world.metadata.model_copy(
                update={
                    "state": LedgerState.CLOSED,
                    "last_entry_id": 59,
                    "version": world.metadata.version + 1,
                }
            )

    world.before_cas = close
    given = world.run(replication(world, {"b1"}))
    assert isinstance(given[-1], ReplicationDone)
    stored = world.metadata
    assert stored.state is LedgerState.CLOSED and stored.last_entry_id == 59
    assert all("b1" not in s.bookies for s in stored.segments)


def test_a_fragment_someone_else_repaired_is_left_to_them() -> None:
    world = open_world()

    def other_replicator(command: UpdateLedger) -> None:
        segments = world.metadata.segments
        if segments[0].bookies[1] == "b1":
            first = Segment(first_entry_id=0, bookies=["b0", "b4", "b2"])
            world.metadata = world.metadata.model_copy(
                update={"segments": [first, *segments[1:]], "version": world.metadata.version + 1}
            )

    world.before_cas = other_replicator
    core = replication(world, {"b1"})
    given = world.run(core)
    assert isinstance(given[-1], ReplicationDone)
    assert core.repaired_by_others == 1
    assert [d.fragment.segment_first_entry_id for d in core.replicated] == [30]
    assert world.metadata.segments[0].bookies == ["b0", "b4", "b2"]


def test_a_cas_whose_answer_was_lost_is_recognised_as_ours() -> None:
    world = open_world()
    lost = {"left": 1}
    answer = world.answer

    def losing(command: Any) -> Any:
        reply = answer(command)
        if isinstance(reply, LedgerUpdated) and lost["left"]:
            lost["left"] -= 1
            return LedgerUpdateFailed(reply.metadata, "UNAVAILABLE (answer lost, re-read)")
        return reply

    world.answer = losing  # type: ignore[method-assign]
    core = replication(world, {"b1"})
    given = world.run(core)
    assert isinstance(given[-1], ReplicationDone)
    assert sum(isinstance(c, UpdateLedger) for c in given) == 2  # one per fragment
    assert len(core.replicated) == 2


@pytest.mark.parametrize("current", ["unknown", "segment gone"])
def test_a_cas_that_cannot_be_merged_fails_cleanly(current: str) -> None:
    world = open_world()
    core = replication(world, {"b1"})
    # Driven by hand up to the first CAS, which is then answered as the case says.
    while core.phase is not ReplicationPhase.UPDATE:
        for reply in [world.answer(c) for c in core.take_commands()]:
            world.now_ms += 1
            core.step(reply, world.now_ms)
    if current == "unknown":
        core.step(LedgerUpdateFailed(None, "UNAVAILABLE; re-read: UNAVAILABLE"), world.now_ms)
    else:
        # No segment starts where the fragment's did (no writer makes that: fail, not guess).
        segments = [Segment(first_entry_id=5, bookies=B3), *world.metadata.segments[1:]]
        gone = world.metadata.model_copy(
            update={"segments": segments, "version": world.metadata.version + 1}
        )
        core.step(LedgerUpdateFailed(gone, "BAD_VERSION"), world.now_ms)
    [failed] = [c for c in core.take_commands() if isinstance(c, ReplicationFailed)]
    assert failed.api == ApiCodes.UNAVAILABLE and core.phase is ReplicationPhase.FAILED
    assert not core.replicated


# -- bounds: memory, throttle ---------------------------------------------------------------


def test_memory_stays_bounded_whatever_the_fragments_size() -> None:
    metadata = ledger(3, 3, 2, [(0, B3)], last=19_999)
    world = World(metadata, frames(20_000), spare=["b3"])
    world.down.add("b0")
    core = replication(
        world, {"b0"}, rereplication_entry_batch_size=8, rereplication_batches_in_flight=3
    )
    assert isinstance(world.run(core)[-1], ReplicationDone)
    assert core.entries_copied == 20_000
    assert 8 <= world.buffered_max <= 24 and core.buffered_max <= 24
    assert len(world.bytes_at) >= 20_000 // 8  # adds of at most a batch each


def test_adds_go_in_batches_of_at_most_the_batch_size() -> None:
    metadata = ledger(3, 3, 2, [(0, B3)], last=999)
    world = World(metadata, frames(1000), spare=["b3"])
    world.down.add("b0")
    sizes: list[int] = []

    def record(command: SendAdds) -> None:
        sizes.append(len(command.entry_ids))

    world.on_add = record  # type: ignore[assignment]
    core = replication(world, {"b0"}, rereplication_entry_batch_size=10)
    assert isinstance(world.run(core)[-1], ReplicationDone)
    assert max(sizes) == 10 and sum(sizes) == 1000


def test_the_throttle_holds_the_copy_to_its_rate() -> None:
    metadata = ledger(3, 3, 2, [(0, B3)], last=499)
    entries = frames(500, size=964)  # 1,000-byte frames
    world = World(metadata, entries, spare=["b3"])
    world.down.add("b0")
    rate = 50_000  # bytes a second: 50 entries
    core = replication(world, {"b0"}, replication_rate_by_bytes=rate)
    assert isinstance(world.run(core)[-1], ReplicationDone)
    assert core.bytes_copied == 500_000
    batch_bytes = 10 * 1000
    sent = 0
    for at_ms, count in world.bytes_at:
        sent += count
        # Within any prefix of the run: the rate's worth plus the send that went into debt.
        assert sent <= rate * at_ms / 1000 + batch_bytes, (at_ms, sent)
    assert world.now_ms >= 500_000 * 1000 // rate - 1000  # it took about 10 s of its clock


def test_the_byte_rate_limiter() -> None:
    limiter = ByteRateLimiter(1000, now_ms=0)
    assert limiter.allows(0)
    limiter.spend(2500, 0)  # more than a second's worth: allowed, in debt
    assert not limiter.allows(2000) and limiter.allows(2500)
    limiter = ByteRateLimiter(1000, now_ms=0)
    assert limiter.allows(60_000)  # an idle minute keeps one second's worth only
    limiter.spend(1000, 60_000)
    limiter.spend(1, 60_000)
    assert not limiter.allows(60_000)
    unthrottled = ByteRateLimiter(-1, now_ms=0)
    unthrottled.spend(10**12, 0)
    assert unthrottled.allows(0)


def test_an_unknown_event_is_a_bug() -> None:
    core = replication(open_world(), {"b1"})
    with pytest.raises(AssertionError):
        core.step(object(), 0)  # type: ignore[arg-type]


def test_the_reader_settings_are_bounded_by_the_buffer() -> None:
    settings = ReplicationSettings(
        rereplication_entry_batch_size=5,
        rereplication_batches_in_flight=2,
        read=ReadSettings(read_window_max_entries=512, read_ahead_max_entries=4096),
    )
    world = open_world()
    core = LedgerReplication(world.metadata, {"b1"}, KEYS, 0, settings=settings)
    world.run(core)
    assert core.buffered_max <= 10


def test_a_bad_bookie_named_where_it_holds_nothing_is_replaced_with_nothing_copied() -> None:
    # Closed at entry 9: the segment at 10 is empty; b1 is named there all the same.
    metadata = ledger(3, 3, 2, [(0, ["b0", "b2", "b3"]), (10, B3)], last=9)
    assert fragments_on(metadata, {"b1"}) == []
    world = World(metadata, frames(10), spare=["b4"])
    world.down.add("b1")
    core = replication(world, {"b1"})
    given = world.run(core)
    assert isinstance(given[-1], ReplicationDone)
    [done] = core.replicated
    assert done.entries == 0 and done.new_bookie_id in {"b3", "b4"}
    assert world.metadata.segments[1].bookies == ["b0", done.new_bookie_id, "b2"]
    assert not any(isinstance(c, SendAdds | SendReads) for c in given)


# -- placement ------------------------------------------------------------------------------

RACKS = {"b0": "/z/r1", "b1": "/z/r1", "b2": "/z/r2", "b3": "/z/r2", "b4": "/z/r1", "b5": "/z/r2"}


@pytest.mark.parametrize("seed", range(5))
def test_rackaware_targets_move_marked_bookies_together(seed: int) -> None:
    """r1 r1 r2 r2 with E4/Qw2: the auditor marks b1 and b2 (auto-recovery's placement
    repair); placed one at a time, each beside a bookie of either rack, no rack would do;
    placed together they make r1 r2 r1 r2."""
    metadata = ledger(4, 2, 2, [(0, ["b0", "b1", "b2", "b3"])], last=39)
    world = World(metadata, frames(40), spare=["b4", "b5"])
    world.locations = RACKS
    policy = PlacementPolicy(PlacementRules(policy="rackaware"))
    given = world.run(replication(world, {"b1", "b2"}, seed=seed, placement=policy))
    assert isinstance(given[-1], ReplicationDone)
    assert world.metadata.segments[0].bookies == ["b0", "b5", "b4", "b3"]
    assert policy.check(world.metadata.segments[0].bookies, 2, RACKS).adherence.name == (
        "MEETS_STRICT"
    )
    done = [c for c in given if isinstance(c, FragmentReplicated)]
    assert done and not any(d.placement_fallback for d in done)


def test_a_rackaware_target_that_breaks_the_policy_is_flagged() -> None:
    metadata = ledger(2, 2, 2, [(0, ["b0", "b2"])], last=9)
    world = World(metadata, frames(10), spare=["b4"])  # only an r1 spare
    world.locations = RACKS
    policy = PlacementPolicy(PlacementRules(policy="rackaware"))
    given = world.run(replication(world, {"b2"}, placement=policy))
    [done] = [c for c in given if isinstance(c, FragmentReplicated)]
    assert done.new_bookie_id == "b4" and "no rackaware placement" in done.placement_fallback
    enforced = PlacementPolicy(
        PlacementRules(policy="rackaware", enforce_min_num_racks_per_write_quorum=True)
    )
    world = World(ledger(2, 2, 2, [(0, ["b0", "b2"])], last=9), frames(10), spare=["b4"])
    world.locations = RACKS
    given = world.run(replication(world, {"b2"}, placement=enforced))
    assert isinstance(given[-1], ReplicationFailed)
    assert given[-1].api == ApiCodes.NOT_ENOUGH_BOOKIES
