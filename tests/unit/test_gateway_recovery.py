"""LedgerRecovery, the sans-IO fence-and-close: its quorum rules one by one, driven by hand."""

from __future__ import annotations

import pytest

from services.gateway.core import (
    BookieAddReply,
    BookieReadReply,
    LedgerUpdated,
    LedgerUpdateFailed,
    SendAdds,
    SendReads,
    UpdateLedger,
)
from services.gateway.recovery import (
    FenceReply,
    FenceSendFailed,
    LedgerRecovery,
    RecoveryDone,
    RecoveryFailed,
    SendFence,
)
from shared.digest import DigestManager, master_key
from shared.models import LedgerMetadata, LedgerState, Segment
from shared.status import ApiCodes, BookieStatus
from shared.wire import FLAG_RECOVERY_ADD, AddResult, ReadResult

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


def recovery(md: LedgerMetadata) -> LedgerRecovery:
    return LedgerRecovery(md, master_key(b"pw"), DM, 0, retry_interval_ms=10)


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
    assert (r.phase == "read") is covered
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
    # Entry 2: UNKNOWN never counts as absent; NO_ENTRY and NO_LEDGER do (2 needed).
    r.step(read_reply("b0", 2, BookieStatus.UNKNOWN_LEDGER_STATE), 5)
    r.step(read_reply("b1", 2, BookieStatus.NO_ENTRY), 5)
    assert r.phase == "read"
    r.step(read_reply("b2", 2, BookieStatus.NO_LEDGER), 5)
    assert r.phase == "close"
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
