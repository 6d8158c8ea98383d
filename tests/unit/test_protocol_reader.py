"""The sans-IO reader (shared.protocol.reader): table-driven rules and scenario transcripts.

Scenarios push events through a LedgerReader and check the commands that come out, the way
h11's tests drive a connection without a socket."""

from __future__ import annotations

import pytest

from shared.digest import DigestManager
from shared.protocol.messages import (
    BookieReadReply,
    EntryRead,
    EntryReadFailed,
    ReadSendFailed,
    ReplicaCorrupt,
    SendReads,
)
from shared.protocol.reader import LedgerReader, lac_from_replies
from shared.status import ApiCodes, BookieStatus
from shared.wire import ReadResult
from tests.support.protocol import LEDGER, metadata

# -- reader ------------------------------------------------------------------------------------


def frames(*entries: int, payload: bytes = b"p") -> dict[int, bytes]:
    dm = DigestManager("crc32c")
    return {e: dm.sign(LEDGER, e, e - 1, e + 1, payload + bytes([e])) for e in entries}


FRAMES = frames(0, 1, 2, 3)


def reader(e: int = 3, w: int = 3, a: int = 2) -> LedgerReader:
    return LedgerReader(metadata(e, w, a), DigestManager("crc32c"), read_entry_timeout_ms=500)


def read_ok(bookie: str, *entries: int, frame=None) -> BookieReadReply:
    return BookieReadReply(
        bookie,
        entries,
        BookieStatus.OK,
        tuple(
            ReadResult(LEDGER, e, BookieStatus.OK, frame if frame is not None else FRAMES[e])
            for e in entries
        ),
    )


def read_status(bookie: str, st: BookieStatus, *entries: int) -> BookieReadReply:
    return BookieReadReply(
        bookie, entries, BookieStatus.OK, tuple(ReadResult(LEDGER, e, st) for e in entries)
    )


def sends_of(commands) -> dict[str, tuple[int, ...]]:
    return {c.bookie_id: c.entry_ids for c in commands if isinstance(c, SendReads)}


def test_reads_go_to_the_first_replica_of_each_write_set() -> None:
    r = reader(3, 2, 2)
    r.read(range(4), 0)
    assert sends_of(r.take_commands()) == {"b0": (0, 3), "b1": (1,), "b2": (2,)}
    r.step(read_ok("b0", 0, 3), 1)
    assert [c.entry_id for c in r.take_commands()] == [0, 3]


@pytest.mark.parametrize(
    ("first_failure", "corrupt"),
    [
        (read_status("b0", BookieStatus.IO_ERROR, 0), False),
        (ReadSendFailed("b0", (0,), "timeout"), False),
        (BookieReadReply("b0", (0,), BookieStatus.BAD_REQUEST), False),
        (read_ok("b0", 0, frame=FRAMES[0][:-1] + b"X"), True),  # digest mismatch
        (read_ok("b0", 0, frame=FRAMES[1]), True),  # another entry's frame
    ],
)
def test_a_failed_replica_falls_back_to_the_next(first_failure, corrupt) -> None:
    r = reader()
    r.read([0], 0)
    r.take_commands()
    r.step(first_failure, 1)
    commands = r.take_commands()
    assert sends_of(commands) == {"b1": (0,)}
    assert any(isinstance(c, ReplicaCorrupt) for c in commands) == corrupt
    r.step(read_ok("b1", 0), 2)
    assert r.take_commands() == [EntryRead(0, b"p\x00", -1, 1)] and r.done


def test_no_entry_from_every_replica_is_no_such_entry() -> None:
    r = reader()
    r.read([5], 0)
    for bookie in ("b2", "b0", "b1"):  # write set of 5 with E=3: 2, 0, 1
        assert sends_of(r.take_commands()) == {bookie: (5,)}
        r.step(read_status(bookie, BookieStatus.NO_ENTRY, 5), 1)
    [failed] = r.take_commands()
    assert isinstance(failed, EntryReadFailed) and failed.api == ApiCodes.NO_SUCH_ENTRY


@pytest.mark.parametrize(
    ("statuses", "api"),
    [
        (
            [BookieStatus.NO_ENTRY, BookieStatus.NO_LEDGER, BookieStatus.NO_ENTRY],
            ApiCodes.NO_SUCH_ENTRY,
        ),
        ([BookieStatus.NO_ENTRY, None, BookieStatus.NO_ENTRY], ApiCodes.TIMEOUT),
        ([BookieStatus.NO_ENTRY, "unreachable", None], ApiCodes.UNAVAILABLE),
        ([BookieStatus.IO_ERROR, BookieStatus.NO_ENTRY, None], ApiCodes.UNAVAILABLE),
        ([BookieStatus.UNAUTHORIZED] * 3, ApiCodes.UNAUTHORIZED),
        (
            [BookieStatus.CORRUPT, BookieStatus.NO_ENTRY, BookieStatus.NO_ENTRY],
            ApiCodes.UNAVAILABLE,
        ),
    ],
)
def test_read_outcome_when_every_replica_failed(statuses, api) -> None:
    r = reader()
    r.read([0], 0)
    for bookie, st in zip(("b0", "b1", "b2"), statuses, strict=True):
        r.take_commands()
        if st is None:
            r.step(ReadSendFailed(bookie, (0,), "timeout"), 1)
        elif st == "unreachable":
            r.step(ReadSendFailed(bookie, (0,), "no responders", timed_out=False), 1)
        else:
            r.step(read_status(bookie, st, 0), 1)
    [failed] = [c for c in r.take_commands() if isinstance(c, EntryReadFailed)]
    assert failed.api == api and r.done


def test_tick_moves_a_silent_replica_on_and_a_late_good_answer_still_counts() -> None:
    r = reader()
    r.read([0], now_ms=0)
    r.take_commands()
    r.tick(499)
    assert r.take_commands() == []
    r.tick(500)
    assert sends_of(r.take_commands()) == {"b1": (0,)}
    r.step(read_ok("b0", 0), 600)  # the first replica answers after all
    assert r.take_commands() == [EntryRead(0, b"p\x00", -1, 1)]
    r.step(read_ok("b1", 0), 601)
    assert r.take_commands() == []


def test_a_partial_batch_answer_is_asked_again_of_the_same_bookie() -> None:
    r = reader(1, 1, 1)
    r.read([0, 1, 2], 0)
    r.take_commands()
    prefix = read_ok("b0", 0)  # the bookie answered a prefix only
    r.step(BookieReadReply("b0", (0, 1, 2), BookieStatus.OK, prefix.results), 1)
    commands = r.take_commands()
    assert sends_of(commands) == {"b0": (1, 2)}
    assert [c.entry_id for c in commands if isinstance(c, EntryRead)] == [0]


def test_read_batches_are_bounded() -> None:
    r = LedgerReader(metadata(1, 1, 1), DigestManager("crc32c"), read_batch_entries=2)
    r.read(range(5), 0)
    assert [c.entry_ids for c in r.take_commands()] == [(0, 1), (2, 3), (4,)]


@pytest.mark.parametrize(
    ("replies", "expected"),
    [
        ([(BookieStatus.OK, 3), (BookieStatus.OK, 5), (BookieStatus.IO_ERROR, -1)], 5),
        ([(BookieStatus.NO_LEDGER, -1), (BookieStatus.NO_ENTRY, -1)], -1),
        ([(BookieStatus.NO_LEDGER, -1), (BookieStatus.IO_ERROR, -1)], None),
        ([], None),
    ],
)
def test_lac_from_replies(replies, expected) -> None:
    assert lac_from_replies(replies) == expected
