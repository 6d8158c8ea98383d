"""The gateway's sans-IO client protocol: table-driven rules and scenario transcripts.

Scenarios push events through a LedgerWriter / LedgerReader and check the commands that
come out, the way h11's tests drive a connection without a socket."""

from __future__ import annotations

import random

import pytest

from services.gateway.core import (
    AddSendFailed,
    BookieAddReply,
    BookieReadReply,
    CompleteAdds,
    EntryRead,
    EntryReadFailed,
    FailAdds,
    LedgerReader,
    LedgerWriter,
    ListWritableBookies,
    ReadSendFailed,
    ReplicaCorrupt,
    SendAdds,
    SendReads,
    WritableBookies,
    choose_ensemble,
    lac_from_replies,
)
from shared.digest import DigestManager, master_key
from shared.models import LedgerMetadata, LedgerState, Segment
from shared.status import ApiCodes, BookieStatus, QuireError
from shared.wire import AddResult, ReadResult

LEDGER = 7
KEY = master_key(b"pw")


def metadata(e: int = 3, w: int = 3, a: int = 2, digest: str = "crc32c") -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=LEDGER,
        state=LedgerState.OPEN,
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=a,
        digest=digest,
        segments=[Segment(first_entry_id=0, bookies=[f"b{i}" for i in range(e)])],
    )


def writer(e: int = 3, w: int = 3, a: int = 2, timeout_ms: int = 1000, **kw) -> LedgerWriter:
    md = metadata(e, w, a)
    return LedgerWriter(md, KEY, DigestManager(md.digest), add_entry_timeout_ms=timeout_ms, **kw)


def ok(bookie: str, *entries: int) -> BookieAddReply:
    return BookieAddReply(
        bookie,
        entries,
        BookieStatus.OK,
        tuple(AddResult(LEDGER, e, BookieStatus.OK) for e in entries),
    )


def status(bookie: str, st: BookieStatus, *entries: int) -> BookieAddReply:
    return BookieAddReply(
        bookie, entries, BookieStatus.OK, tuple(AddResult(LEDGER, e, st) for e in entries)
    )


def outcomes(w: LedgerWriter) -> list:
    return [c for c in w.take_commands() if not isinstance(c, SendAdds)]


# -- choose_ensemble ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bookies", "size", "error"),
    [
        (["b1", "b2", "b3"], 3, None),
        (["b1", "b2", "b3", "b4"], 2, None),
        (["b1", "b1", "b2"], 3, ApiCodes.NOT_ENOUGH_BOOKIES),  # duplicates count once
        (["b1", "b2"], 3, ApiCodes.NOT_ENOUGH_BOOKIES),
        ([], 1, ApiCodes.NOT_ENOUGH_BOOKIES),
    ],
)
def test_choose_ensemble(bookies: list[str], size: int, error) -> None:
    if error is not None:
        with pytest.raises(QuireError) as info:
            choose_ensemble(bookies, size, random.Random(1))
        assert info.value.api == error
        return
    chosen = choose_ensemble(bookies, size, random.Random(1))
    assert len(chosen) == len(set(chosen)) == size and set(chosen) <= set(bookies)
    # The same seed picks the same ensemble whatever the input order.
    assert chosen == choose_ensemble(list(reversed(bookies)), size, random.Random(1))


# -- writer: sends -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "entries", "expected"),
    [
        ((3, 3, 2), 1, {"b0": (0,), "b1": (0,), "b2": (0,)}),
        ((3, 2, 2), 3, {"b0": (0, 2), "b1": (0, 1), "b2": (1, 2)}),
        ((4, 2, 1), 4, {"b0": (0, 3), "b1": (0, 1), "b2": (1, 2), "b3": (2, 3)}),
        ((1, 1, 1), 2, {"b0": (0, 1)}),
    ],
)
def test_adds_go_to_the_write_set_batched_per_bookie(spec, entries, expected) -> None:
    w = writer(*spec)
    assert w.add([b"x"] * entries, now_ms=0) == (0, entries - 1)
    sends = w.take_commands()
    assert all(isinstance(s, SendAdds) for s in sends)
    assert {s.bookie_id: s.entry_ids for s in sends} == expected
    assert all(item.master_key == KEY for s in sends for item in s.items)


def test_frames_carry_the_lac_at_send_time_and_the_running_length() -> None:
    w = writer()
    dm = DigestManager("crc32c")
    w.add([b"aa"], 0)
    first = {s.bookie_id: s for s in w.take_commands()}["b0"].items[0].frame
    w.step(ok("b0", 0))
    w.step(ok("b1", 0))
    w.take_commands()
    w.add([b"bbb"], 1)
    second = {s.bookie_id: s for s in w.take_commands()}["b1"].items[0].frame
    e0, e1 = dm.verify(first, LEDGER, 0), dm.verify(second, LEDGER, 1)
    assert (e0.lac, e0.length, e0.payload) == (-1, 2, b"aa")
    assert (e1.lac, e1.length, e1.payload) == (0, 5, b"bbb")


def test_sends_are_split_under_the_byte_bound() -> None:
    w = writer(1, 1, 1, max_send_bytes=400)  # 168 bytes an item
    w.add([b"x" * 100] * 5, 0)
    sends = w.take_commands()
    assert [s.entry_ids for s in sends] == [(0, 1), (2, 3), (4,)]


# -- writer: completion ----------------------------------------------------------------------


def test_acks_out_of_order_complete_in_entry_order_once() -> None:
    w = writer()
    w.add([b"a", b"b", b"c"], 0)
    w.take_commands()
    w.step(ok("b0", 2))
    w.step(ok("b1", 2))  # entry 2 reached Qa but 0 and 1 did not
    assert outcomes(w) == []
    w.step(ok("b0", 1))
    w.step(ok("b2", 1))
    assert outcomes(w) == []
    w.step(ok("b1", 0))
    w.step(ok("b2", 0))
    assert outcomes(w) == [CompleteAdds(0, 2, 2, 3)]
    w.step(ok("b2", 2))  # late acks change nothing
    w.step(ok("b0", 0))
    assert outcomes(w) == [] and w.lac == 2 and w.pending_count == 0


def test_qa_reached_with_one_bookie_silent() -> None:
    w = writer(3, 3, 2)
    w.add([b"a", b"b"], 0)
    w.take_commands()
    for bookie in ("b0", "b1"):  # b2 never answers
        w.step(ok(bookie, 0, 1))
    assert outcomes(w) == [CompleteAdds(0, 1, 1, 2)]


def test_a_failed_bookie_is_tolerated_when_qw_exceeds_qa() -> None:
    w = writer(3, 3, 2)
    w.add([b"a"], 0)
    w.take_commands()
    w.step(AddSendFailed("b2", (0,), "no responders"))
    w.step(ok("b0", 0))
    assert outcomes(w) == []
    w.step(ok("b1", 0))
    assert outcomes(w) == [CompleteAdds(0, 0, 0, 1)] and w.broken is None


def test_a_second_failure_leaves_the_ack_quorum_out_of_reach() -> None:
    w = writer(3, 3, 2)
    w.add([b"a"], 0)
    w.take_commands()
    w.step(ok("b0", 0))
    w.step(AddSendFailed("b2", (0,), "no responders"))
    w.step(status("b1", BookieStatus.IO_ERROR, 0))
    # The ack quorum is out of reach: replace at once; with no bookie to spare, fail.
    assert outcomes(w) == [ListWritableBookies()]
    w.step(WritableBookies(("b0", "b1", "b2")))
    [fail] = outcomes(w)
    assert isinstance(fail, FailAdds) and fail.api == ApiCodes.NOT_ENOUGH_BOOKIES
    assert "b1" in fail.detail and "b2" in fail.detail


@pytest.mark.parametrize(
    ("reply_status", "api"),
    [
        (BookieStatus.FENCED, ApiCodes.LEDGER_FENCED),
        (BookieStatus.UNAUTHORIZED, ApiCodes.UNAUTHORIZED),
    ],
)
def test_unrecoverable_statuses_break_the_handle_at_once(reply_status, api) -> None:
    w = writer(3, 3, 2)
    w.add([b"a", b"b"], 0)
    w.take_commands()
    w.step(ok("b0", 0))
    w.step(ok("b1", 0))
    w.step(status("b2", reply_status, 1))
    assert outcomes(w) == [CompleteAdds(0, 0, 0, 1), FailAdds(1, 1, api, w.broken.detail)]
    with pytest.raises(QuireError) as info:
        w.add([b"c"], 1)
    assert info.value.api == api
    assert w.last_entry_id == 1  # a refused add takes no entry id


@pytest.mark.parametrize(
    "failure",
    [
        AddSendFailed("b1", (0, 1), "timeout"),
        status("b1", BookieStatus.READ_ONLY, 0, 1),
        status("b1", BookieStatus.TOO_MANY_REQUESTS, 0, 1),
        BookieAddReply("b1", (0, 1), BookieStatus.BAD_REQUEST),
        BookieAddReply("b1", (0, 1), BookieStatus.OK, ()),
    ],
)
def test_with_qw_equal_qa_one_failure_needs_a_replacement(failure) -> None:
    w = writer(3, 2, 2)
    w.add([b"a", b"b"], 0)  # entry 0 on b0,b1; entry 1 on b1,b2
    w.take_commands()
    w.step(ok("b0", 0))
    w.step(failure)
    assert outcomes(w) == [ListWritableBookies()]
    w.step(WritableBookies(("b0", "b1", "b2")))  # nobody outside the ensemble
    api = ApiCodes.NOT_ENOUGH_BOOKIES
    assert outcomes(w) == [FailAdds(0, 1, api, w.broken.detail)]
    assert w.metadata.version == 0 and len(w.metadata.segments) == 1  # nothing half-visible
    w.step(ok("b1", 0))  # too late: the handle is broken
    assert outcomes(w) == [] and w.lac == -1


def test_timeout_fails_pending_adds_after_add_entry_timeout() -> None:
    w = writer(timeout_ms=1000)
    w.add([b"a"], now_ms=100)
    w.take_commands()
    w.tick(1099)
    assert outcomes(w) == []
    w.step(ok("b0", 0))
    w.tick(1100)
    [fail] = outcomes(w)
    assert (fail.first_entry_id, fail.last_entry_id, fail.api) == (0, 0, ApiCodes.TIMEOUT)


def test_replies_for_another_ledger_or_bookie_are_ignored() -> None:
    w = writer(4, 2, 2)
    w.add([b"a"], 0)  # write set b0, b1
    w.take_commands()
    w.step(ok("b3", 0))
    w.step(BookieAddReply("b0", (0,), BookieStatus.OK, (AddResult(LEDGER + 1, 0, 0),)))
    # b3 is not in the write set: ignored. b0 answered about another ledger: entry 0 is
    # missing from its answer, a failure; with Qw = Qa b0 must be replaced.
    assert outcomes(w) == [ListWritableBookies()]
    w.step(WritableBookies(()))
    [fail] = outcomes(w)
    assert isinstance(fail, FailAdds) and fail.api == ApiCodes.NOT_ENOUGH_BOOKIES
    w.step(ok("b1", 0))
    assert outcomes(w) == [] and w.lac == -1


def test_close_refuses_new_adds_and_abort_fails_pending() -> None:
    w = writer()
    w.add([b"a"], 0)
    w.start_close()
    with pytest.raises(QuireError) as info:
        w.add([b"b"], 0)
    assert info.value.api == ApiCodes.LEDGER_CLOSED
    w.abort(ApiCodes.NO_SUCH_LEDGER, "deleted")
    assert outcomes(w) == [FailAdds(0, 0, ApiCodes.NO_SUCH_LEDGER, "deleted")]


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
