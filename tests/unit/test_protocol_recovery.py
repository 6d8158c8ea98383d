"""LedgerRecovery, the sans-IO fence-and-close: its quorum rules one by one, driven by hand."""

from __future__ import annotations

import random

import pytest

from shared.digest import DigestManager, master_key
from shared.models import LedgerMetadata, LedgerState, Segment
from shared.protocol.messages import (
    BookieAddReply,
    BookieReadReply,
    FenceReply,
    FenceSendFailed,
    LedgerUpdated,
    LedgerUpdateFailed,
    RecoveryCommand,
    RecoveryDone,
    RecoveryFailed,
    SendAdds,
    SendFence,
    SendReads,
    UpdateLedger,
)
from shared.protocol.recovery import LedgerRecovery, RecoveryPhase
from shared.status import ApiCodes, BookieStatus
from shared.wire import FLAG_RECOVERY_ADD, AddResult, ReadItem, ReadResult

LEDGER = 5
DM = DigestManager("crc32c")


def metadata(e=3, w=3, a=2, state=LedgerState.OPEN, version=0, last=None) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=LEDGER,
        state=state,
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=a,
        digest="crc32c",
        version=version,
        last_entry_id=last,
        segments=[Segment(first_entry_id=0, bookies=[f"b{i}" for i in range(e)])],
    )


def recovery(md: LedgerMetadata, read_batch_size: int = 64) -> LedgerRecovery:
    return LedgerRecovery(
        md, master_key(b"pw"), DM, 0, retry_interval_ms=10, read_batch_size=read_batch_size
    )


def marked(r: LedgerRecovery) -> LedgerMetadata:
    [update] = r.take_commands()
    assert isinstance(update, UpdateLedger)
    assert update.request.state is LedgerState.IN_RECOVERY
    stored = r.metadata.model_copy(
        update={"state": LedgerState.IN_RECOVERY, "version": r.metadata.version + 1}
    )
    r.step(LedgerUpdated(stored), 1)
    return stored


def frame(entry_id: int, lac: int) -> bytes:
    return DM.sign(LEDGER, entry_id, lac, 10 * (entry_id + 1), b"e%d" % entry_id)


def read_reply(bookie: str, entry_id: int, status: BookieStatus, lac: int = -1) -> BookieReadReply:
    data = frame(entry_id, lac) if status is BookieStatus.OK else b""
    return BookieReadReply(
        bookie, (entry_id,), BookieStatus.OK, (ReadResult(LEDGER, entry_id, status, data),)
    )


def test_a_closed_ledger_is_recovered_at_once() -> None:
    md = metadata(state=LedgerState.CLOSED, last=7)
    r = recovery(md)
    assert r.take_commands() == [RecoveryDone(md)] and r.done


@pytest.mark.parametrize(
    ("e", "w", "a", "answering", "covered"),
    [
        (3, 3, 2, ["b0", "b1"], True),  # Qw - Qa + 1 = 2 of the one write set
        (3, 3, 2, ["b0"], False),
        (3, 2, 2, ["b0"], False),  # write set {b1, b2} has nobody
        (3, 2, 2, ["b0", "b1"], True),  # {0,1} {1,2} {2,0}: each has one
        (4, 3, 3, ["b0"], False),
        (4, 3, 3, ["b0", "b2"], True),  # Qw - Qa + 1 = 1 in each of {012} {123} {230} {301}
        (4, 3, 2, ["b0", "b2"], False),  # needs 2 in each write set
        (4, 3, 2, ["b0", "b1", "b2"], True),
    ],
)
def test_fencing_waits_for_qw_minus_qa_plus_one_in_every_write_set(
    e, w, a, answering, covered
) -> None:
    r = recovery(metadata(e, w, a))
    marked(r)
    fences = r.take_commands()
    assert fences == [SendFence(f"b{i}") for i in range(e)]
    for bookie in answering:
        r.step(FenceReply(bookie, BookieStatus.OK, 3), 2)
    assert (r.phase is RecoveryPhase.READ) is covered
    if not covered:
        # Unanswered bookies are asked again after the retry interval.
        for i in range(e):
            if f"b{i}" not in answering:
                r.step(FenceSendFailed(f"b{i}", "timeout"), 3)
        r.take_commands()
        r.tick(20)
        resent = [c for c in r.take_commands() if isinstance(c, SendFence)]
        assert sorted(c.bookie_id for c in resent) == sorted(
            f"b{i}" for i in range(e) if f"b{i}" not in answering
        )


def test_recovery_rewrites_what_it_finds_and_stops_where_enough_bookies_lack_it() -> None:
    r = recovery(metadata())
    marked(r)
    r.take_commands()
    for bookie in ("b0", "b1"):
        r.step(FenceReply(bookie, BookieStatus.OK, 0), 2)  # LAC 0
    # First the entry at the LAC, for the ledger's length.
    assert [c.bookie_id for c in r.take_commands()] == ["b0", "b1", "b2"]
    r.step(read_reply("b0", 0, BookieStatus.OK), 3)
    r.take_commands()
    # Entry 1: b0 has it (maybe acknowledged): re-written to the full write set.
    r.step(read_reply("b1", 1, BookieStatus.NO_ENTRY), 4)
    assert r.take_commands() == []
    r.step(read_reply("b0", 1, BookieStatus.OK, lac=0), 4)
    commands = r.take_commands()
    adds = [c for c in commands if isinstance(c, SendAdds)]
    assert sorted(c.bookie_id for c in adds) == ["b0", "b1", "b2"]
    assert all(item.flags & FLAG_RECOVERY_ADD for c in adds for item in c.items)
    # Entry 2: UNKNOWN never counts as absent; NO_ENTRY and NO_LEDGER do (2 needed), from
    # fenced bookies (b2 answers its fence late, while reading).
    r.step(read_reply("b0", 2, BookieStatus.UNKNOWN_LEDGER_STATE), 5)
    r.step(read_reply("b1", 2, BookieStatus.NO_ENTRY), 5)
    assert r.phase is RecoveryPhase.READ
    r.step(FenceReply("b2", BookieStatus.OK, 0), 5)
    r.step(read_reply("b2", 2, BookieStatus.NO_LEDGER), 5)
    assert r.phase is RecoveryPhase.CLOSE
    for bookie in ("b0", "b1"):
        r.step(
            BookieAddReply(bookie, (1,), BookieStatus.OK, (AddResult(LEDGER, 1, BookieStatus.OK),)),
            6,
        )
    [close] = [c for c in r.take_commands() if isinstance(c, UpdateLedger)]
    assert close.request.state is LedgerState.CLOSED
    assert close.request.last_entry_id == 1 and close.request.length == 20
    closed = r.metadata.model_copy(
        update={"state": LedgerState.CLOSED, "last_entry_id": 1, "version": 2}
    )
    r.step(LedgerUpdated(closed), 7)
    assert r.take_commands() == [RecoveryDone(closed)]


def test_a_recovery_that_loses_the_close_adopts_the_winner() -> None:
    r = recovery(metadata(3, 3, 3))
    marked(r)
    r.take_commands()
    r.step(FenceReply("b0", BookieStatus.OK, -1), 2)  # Qw - Qa + 1 = 1
    r.step(read_reply("b0", 0, BookieStatus.NO_ENTRY), 3)
    [close] = [c for c in r.take_commands() if isinstance(c, UpdateLedger)]
    winner = r.metadata.model_copy(
        update={"state": LedgerState.CLOSED, "last_entry_id": -1, "version": 5}
    )
    r.step(LedgerUpdateFailed(winner, "BAD_VERSION"), 4)
    assert r.take_commands() == [RecoveryDone(winner)]


def test_wrong_key_and_timeout_fail_the_recovery() -> None:
    r = recovery(metadata())
    marked(r)
    r.take_commands()
    r.step(FenceReply("b0", BookieStatus.UNAUTHORIZED), 2)
    [failed] = r.take_commands()
    assert isinstance(failed, RecoveryFailed) and failed.api == ApiCodes.UNAUTHORIZED
    slow = recovery(metadata())
    slow.tick(slow.recovery_timeout_ms)
    [failed] = [c for c in slow.take_commands() if isinstance(c, RecoveryFailed)]
    assert failed.api == ApiCodes.TIMEOUT


def test_recovery_reads_ask_the_whole_write_set_of_the_fenced_ensemble() -> None:
    r = recovery(metadata(3, 3, 2))
    marked(r)
    r.take_commands()
    for bookie in ("b0", "b1"):
        r.step(FenceReply(bookie, BookieStatus.OK, -1), 2)
    reads = r.take_commands()
    assert all(isinstance(c, SendReads) for c in reads)
    assert sorted(c.bookie_id for c in reads) == ["b0", "b1", "b2"]


# -- the read window ---------------------------------------------------------------------------


def fenced(r: LedgerRecovery, lac: int, bookies: tuple[str, ...] | None = None) -> list:
    """Mark and fence (every bookie, or `bookies`, answering with `lac`); the first reads."""
    marked(r)
    r.take_commands()
    for bookie in bookies or r.metadata.segments[-1].bookies:
        r.step(FenceReply(bookie, BookieStatus.OK, lac), 2)
    return r.take_commands()


def answer(command: SendReads, holds: dict[str, set[int]]) -> BookieReadReply:
    """A bookie's whole answer: the entries it holds, NO_ENTRY for the others."""
    results = tuple(
        ReadResult(LEDGER, e, BookieStatus.OK, frame(e, -1))
        if e in holds[command.bookie_id]
        else ReadResult(LEDGER, e, BookieStatus.NO_ENTRY)
        for e in command.entry_ids
    )
    return BookieReadReply(command.bookie_id, command.entry_ids, BookieStatus.OK, results)


def add_ok(command: SendAdds) -> BookieAddReply:
    results = tuple(AddResult(LEDGER, e, BookieStatus.OK) for e in command.entry_ids)
    return BookieAddReply(command.bookie_id, command.entry_ids, BookieStatus.OK, results)


def run_to_close(
    r: LedgerRecovery, first: list, holds: dict[str, set[int]], rng: random.Random
) -> tuple[int, list[int], int]:
    """Answer every request, in an order `rng` picks (so later entries are often decided
    before earlier ones); (last entry closed at, entries re-written in order, highest
    entry read)."""
    waiting: list[RecoveryCommand] = list(first)
    rewritten: list[int] = []
    highest_read = -1
    now = 3
    while not r.done:
        assert waiting, f"recovery stalled in phase {r.phase}"
        command = waiting.pop(rng.randrange(len(waiting)))
        now += 1
        match command:
            case SendReads():
                highest_read = max(highest_read, *command.entry_ids)
                r.step(answer(command, holds), now)
            case SendAdds():
                r.step(add_ok(command), now)
            case UpdateLedger():
                assert command.request.state is LedgerState.CLOSED
                update = {
                    "state": LedgerState.CLOSED,
                    "last_entry_id": command.request.last_entry_id,
                    "version": r.metadata.version + 1,
                }
                r.step(LedgerUpdated(r.metadata.model_copy(update=update)), now)
            case _:
                raise AssertionError(f"unexpected {command!r}")
        for issued in r.take_commands():
            if isinstance(issued, SendAdds) and issued.bookie_id == "b0":
                rewritten.extend(issued.entry_ids)  # in the order the writer sends them
            if not isinstance(issued, RecoveryDone):
                waiting.append(issued)
    assert r.result is not None and r.result.last_entry_id is not None
    return r.result.last_entry_id, rewritten, highest_read


@pytest.mark.parametrize(
    ("lac", "holds", "batch", "closed_at"),
    [
        # Everything up to 9 on every bookie, read 4 at a time.
        (2, {"b0": set(range(10)), "b1": set(range(10)), "b2": set(range(10))}, 4, 9),
        # One at a time, as before the window.
        (2, {"b0": set(range(10)), "b1": set(range(10)), "b2": set(range(10))}, 1, 9),
        # 5 is on two bookies (so never missing: one "no" is not enough), 6 on none: the
        # end. 7 and 8 are on b0 (never acknowledged) and must not be re-written although
        # read in the same window.
        (-1, {"b0": {0, 1, 2, 3, 4, 5, 7, 8}, "b1": set(range(6)), "b2": set(range(5))}, 8, 5),
        # The same with a window so large that the whole tail is read at once.
        (-1, {"b0": {0, 1, 2, 3, 4, 5, 7, 8}, "b1": set(range(6)), "b2": set(range(5))}, 64, 5),
        # A hole at 3, entries past it on two bookies: the end is the FIRST missing entry.
        (0, {"b0": {0, 1, 2, 4, 5}, "b1": {0, 1, 2, 4, 5}, "b2": {0, 1, 2}}, 3, 2),
        # Nothing past the LAC.
        (4, {"b0": set(range(5)), "b1": set(range(5)), "b2": set(range(5))}, 2, 4),
        # An empty ledger.
        (-1, {"b0": set(), "b1": set(), "b2": set()}, 5, -1),
    ],
)
@pytest.mark.parametrize("seed", range(8))
def test_the_window_rewrites_in_order_everything_below_the_first_missing_entry(
    lac, holds, batch, closed_at, seed
) -> None:
    r = recovery(metadata(3, 3, 2), read_batch_size=batch)
    first = fenced(r, lac)
    reads = [c for c in first if isinstance(c, SendReads)]
    # One read per bookie for the whole first window (the entry at the LAC included).
    start = max(lac, 0)
    assert sorted(c.bookie_id for c in reads) == ["b0", "b1", "b2"]
    assert all(c.entry_ids == tuple(range(start, start + batch)) for c in reads)
    last, rewritten, highest_read = run_to_close(r, first, holds, random.Random(seed))
    assert last == closed_at
    assert rewritten == list(range(lac + 1, closed_at + 1))
    assert r.recovered_entries == closed_at - lac
    # Never read further than one window past the end.
    assert highest_read < closed_at + 1 + batch


def test_a_window_asks_each_bookie_only_for_its_write_sets() -> None:
    r = recovery(metadata(3, 2, 2), read_batch_size=3)
    reads = fenced(r, -1)
    # Qw 2 of 3: entry 0 -> b0 b1, 1 -> b1 b2, 2 -> b2 b0.
    assert {c.bookie_id: c.entry_ids for c in reads} == {"b0": (0, 2), "b1": (0, 1), "b2": (1, 2)}


def test_a_partial_answer_is_asked_again_of_the_same_bookie() -> None:
    r = recovery(metadata(3, 3, 2), read_batch_size=4)
    fenced(r, -1)
    # b0 answers only a prefix (0, 1) of (0, 1, 2, 3): it is asked for 2 and 3 again.
    results = tuple(ReadResult(LEDGER, e, BookieStatus.OK, frame(e, -1)) for e in (0, 1))
    r.step(BookieReadReply("b0", (0, 1, 2, 3), BookieStatus.OK, results), 3)
    commands = r.take_commands()
    reads = {c.bookie_id: c.entry_ids for c in commands if isinstance(c, SendReads)}
    # 0 and 1 were re-written at once, so the window moved on by two: 4 and 5 are asked of
    # every bookie, in the same read as 2 and 3 for b0.
    assert reads == {"b0": (2, 3, 4, 5), "b1": (4, 5), "b2": (4, 5)}
    assert {c.bookie_id for c in commands if isinstance(c, SendAdds)} == {"b0", "b1", "b2"}


def test_a_found_entry_waits_for_the_entries_before_it() -> None:
    r = recovery(metadata(3, 3, 2), read_batch_size=4)
    fenced(r, -1)
    later = tuple(ReadResult(LEDGER, e, BookieStatus.OK, frame(e, -1)) for e in (1, 2, 3))
    r.step(BookieReadReply("b0", (1, 2, 3), BookieStatus.OK, later), 3)
    assert not [c for c in r.take_commands() if isinstance(c, SendAdds)]
    r.step(read_reply("b1", 0, BookieStatus.OK), 4)
    [add] = [c for c in r.take_commands() if isinstance(c, SendAdds) and c.bookie_id == "b2"]
    assert add.entry_ids == (0, 1, 2, 3)


def test_only_a_fenced_bookies_no_counts() -> None:
    """An unfenced bookie may still get the old writer's add (resent to it after an
    ensemble change the writer made before the fence): its NO_ENTRY must not end the
    ledger, or an entry acknowledged later would be cut off (simulator seed 1028)."""
    r = recovery(metadata(3, 3, 3), read_batch_size=2)  # Qw - Qa + 1 = 1
    fenced(r, -1, bookies=("b0",))
    for bookie in ("b1", "b2"):
        r.step(FenceSendFailed(bookie, "timeout"), 3)  # partitioned from the recovery
    r.step(read_reply("b2", 0, BookieStatus.NO_ENTRY), 3)
    r.step(read_reply("b1", 0, BookieStatus.NO_LEDGER), 3)
    assert r.phase is RecoveryPhase.READ
    r.step(read_reply("b0", 0, BookieStatus.OK), 3)
    r.take_commands()
    r.step(read_reply("b2", 1, BookieStatus.NO_ENTRY), 4)
    r.step(read_reply("b1", 1, BookieStatus.NO_ENTRY), 4)
    r.step(read_reply("b0", 1, BookieStatus.UNKNOWN_LEDGER_STATE), 4)
    assert r.phase is RecoveryPhase.READ and r.take_commands() == []
    # The retry asks again and fences the bookies that have not answered a fence.
    r.tick(20)
    again = r.take_commands()
    assert sorted(c.bookie_id for c in again if isinstance(c, SendFence)) == ["b1", "b2"]
    assert SendReads("b2", (ReadItem(LEDGER, 1),)) in again
    r.step(FenceReply("b2", BookieStatus.OK, -1), 21)
    r.step(read_reply("b2", 1, BookieStatus.NO_ENTRY), 22)
    assert r.phase is RecoveryPhase.CLOSE


def test_rewrites_not_yet_acknowledged_hold_back_the_reads() -> None:
    r = recovery(metadata(3, 3, 2), read_batch_size=1)  # at most 2 re-writes unanswered
    fenced(r, -1)
    for entry_id in (0, 1):
        r.step(read_reply("b0", entry_id, BookieStatus.OK), 3)
        commands = r.take_commands()
    adds = [c for c in commands if isinstance(c, SendAdds)]
    assert r.writer is not None and r.writer.pending_count == 2
    assert not [c for c in commands if isinstance(c, SendReads)]  # entry 2 waits
    r.step(add_ok(SendAdds("b0", (0,), ())), 4)
    r.step(add_ok(SendAdds("b1", (0,), ())), 4)
    assert adds and r.writer.pending_count == 1
    assert {c.bookie_id for c in r.take_commands() if isinstance(c, SendReads)} == {
        "b0",
        "b1",
        "b2",
    }


# -- the phase transition table ---------------------------------------------------------------

P = RecoveryPhase
ALLOWED = {
    (P.MARK, P.FENCE),  # marked IN_RECOVERY (or found so)
    (P.MARK, P.MARK_RETRY),  # the CAS's outcome and the re-read failed
    (P.MARK, P.DONE),  # found CLOSED
    (P.MARK_RETRY, P.MARK),
    (P.FENCE, P.READ),  # every write set has Qw - Qa + 1 fenced bookies
    (P.READ, P.CLOSE),  # every entry below the end was handed to the writer
    (P.CLOSE, P.DONE),
    *((phase, P.FAILED) for phase in (P.MARK, P.MARK_RETRY, P.FENCE, P.READ, P.CLOSE)),
}


@pytest.mark.parametrize(("source", "target"), [(s, t) for s in P for t in P])
def test_phase_transitions_follow_the_table(source: RecoveryPhase, target: RecoveryPhase) -> None:
    r = recovery(metadata())
    r.phase = source
    if (source, target) in ALLOWED:
        r._enter(target)
        assert r.phase is target
    else:
        with pytest.raises(AssertionError, match="not allowed"):
            r._enter(target)
        assert r.phase is source


def test_a_finished_recovery_stays_finished() -> None:
    r = recovery(metadata(state=LedgerState.CLOSED, last=3))
    assert r.phase is RecoveryPhase.DONE
    r.tick(100_000)  # past its timeout: a done recovery does not fail
    r.step(FenceReply("b0", BookieStatus.OK, 3), 100_001)
    assert r.phase is RecoveryPhase.DONE
