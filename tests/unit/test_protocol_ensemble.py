"""Ensemble choice and change, close conflicts and explicit LAC in the
sans-IO writer: scenarios pushed through the core, checked command by command."""

from __future__ import annotations

import random

import pytest

from shared.digest import DigestManager, master_key
from shared.models import LedgerMetadata, LedgerState, Segment
from shared.protocol.ensemble import choose_ensemble
from shared.protocol.messages import (
    AddSendFailed,
    BookieAddReply,
    CloseDone,
    CloseFailed,
    CompleteAdds,
    EnsembleChanged,
    FailAdds,
    LedgerUpdated,
    LedgerUpdateFailed,
    ListWritableBookies,
    SendAdds,
    SendWriteLac,
    UpdateLedger,
    WritableBookies,
)
from shared.protocol.writer import LedgerWriter
from shared.status import ApiCodes, BookieStatus, QuireError
from shared.wire import AddResult

LEDGER = 9
KEY = master_key(b"pw")


def metadata(e=3, w=3, a=2, bookies=None, version=0, state=LedgerState.OPEN) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=LEDGER,
        state=state,
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=a,
        digest="crc32c",
        version=version,
        segments=[Segment(first_entry_id=0, bookies=bookies or [f"b{i}" for i in range(e)])],
    )


def writer(e=3, w=3, a=2, **kw) -> LedgerWriter:
    md = metadata(e, w, a)
    return LedgerWriter(md, KEY, DigestManager(md.digest), rng=random.Random(1), **kw)


def ok(bookie: str, *entries: int) -> BookieAddReply:
    results = tuple(AddResult(LEDGER, e, BookieStatus.OK) for e in entries)
    return BookieAddReply(bookie, entries, BookieStatus.OK, results)


def sends(commands) -> dict[str, tuple[int, ...]]:
    return {c.bookie_id: c.entry_ids for c in commands if isinstance(c, SendAdds)}


def others(commands) -> list:
    return [c for c in commands if not isinstance(c, SendAdds)]


def stored(w: LedgerWriter, update: UpdateLedger) -> LedgerMetadata:
    """What the metadata store holds once `update` applied on the writer's metadata."""
    changes = {k: v for k, v in update.request.model_dump().items() if v is not None}
    changes.pop("ledger_id"), changes.pop("expected_version")
    if "segments" in changes:
        changes["segments"] = update.request.segments
    assert update.request.expected_version == w.metadata.version
    return w.metadata.model_copy(update={**changes, "version": w.metadata.version + 1})


def test_a_failed_bookie_is_replaced_by_cas_before_anything_is_sent_to_it() -> None:
    w = writer(3, 3, 3)
    w.add([b"a", b"b"], 0)
    w.take_commands()
    w.step(ok("b0", 0, 1), 0)
    w.step(ok("b1", 0, 1), 0)
    w.step(ok("b2", 0), 0)
    w.step(AddSendFailed("b2", (1,), "timeout"), 0)
    assert others(w.take_commands()) == [CompleteAdds(0, 0, 0, 1), ListWritableBookies()]
    w.step(WritableBookies(("b0", "b1", "b2", "b3", "b4")), 0)
    commands = w.take_commands()
    assert sends(commands) == {}  # nothing goes to the replacement before the CAS
    [update] = commands
    assert isinstance(update, UpdateLedger)
    new_segment = update.request.segments[-1]
    assert new_segment.first_entry_id == 1  # LAC + 1
    assert new_segment.bookies[:2] == ["b0", "b1"] and new_segment.bookies[2] in ("b3", "b4")
    # Adds made during the change wait for it.
    w.add([b"c"], 1)
    assert w.take_commands() == []
    w.step(LedgerUpdated(stored(w, update)), 0)
    commands = w.take_commands()
    new = new_segment.bookies[2]
    # Entry 1 is resent to the replacement only; entry 2 goes to its whole write set.
    assert sends(commands) == {new: (1, 2), "b0": (2,), "b1": (2,)}
    [changed] = others(commands)
    assert isinstance(changed, EnsembleChanged) and changed.replaced == ((2, "b2", new),)
    w.step(ok(new, 1, 2), 0)
    w.step(ok("b0", 2), 0)
    assert others(w.take_commands()) == [CompleteAdds(1, 1, 1, 2)]
    w.step(ok("b1", 2), 0)
    assert others(w.take_commands()) == [CompleteAdds(2, 2, 2, 3)]
    assert w.metadata.version == 1 and w.ensemble_changes == 1


def test_no_ack_is_confirmed_while_the_ensemble_changes() -> None:
    w = writer(3, 3, 2)
    w.add([b"a"], 0)
    w.take_commands()
    w.step(AddSendFailed("b2", (0,), "gone"), 0)
    w.step(AddSendFailed("b1", (0,), "gone"), 0)  # the ack quorum is out of reach: change now
    assert others(w.take_commands()) == [ListWritableBookies()]
    w.step(WritableBookies(("b3", "b4", "b5")), 0)
    [update] = w.take_commands()
    w.step(ok("b0", 0), 0)  # one ack: still not enough, and no confirmation during a change
    assert w.take_commands() == [] and w.lac == -1
    w.step(LedgerUpdated(stored(w, update)), 0)
    segment = w.metadata.segments[-1]
    assert segment.first_entry_id == 0 and len(w.metadata.segments) == 1  # replaced in place
    new1, new2 = segment.bookies[1], segment.bookies[2]
    assert sends(w.take_commands()) == {new1: (0,), new2: (0,)}
    w.step(ok(new1, 0), 0)
    assert others(w.take_commands())[0] == CompleteAdds(0, 0, 0, 1)


def test_an_unreachable_bookie_is_replaced_at_its_first_failed_write() -> None:
    """No responder (not a timeout): nothing in flight to it can complete, so the change
    starts at once instead of after ensemble_change_delay_ms, and nothing more is
    acknowledged on the Qw-1 bookies meanwhile (BookKeeper without delayEnsembleChange)."""
    w = writer(3, 3, 2, ensemble_change_delay_ms=10)
    w.add([b"a", b"b"], 0)
    w.take_commands()
    w.step(AddSendFailed("b2", (0,), "no responders", timed_out=False), 0)
    assert w.take_commands() == [ListWritableBookies()]
    # Entry 0 reaches Qa on the other two, but waits for the new segment to be stored.
    w.step(ok("b0", 0, 1), 0)
    w.step(ok("b1", 0, 1), 0)
    assert w.take_commands() == []
    w.step(WritableBookies(("b0", "b1", "b2", "b3")), 0)
    [update] = w.take_commands()
    assert isinstance(update, UpdateLedger)
    assert update.request.segments[-1] == Segment(first_entry_id=0, bookies=["b0", "b1", "b3"])


def test_a_timed_out_bookie_still_waits_for_the_delay() -> None:
    w = writer(3, 3, 2, ensemble_change_delay_ms=10)
    w.add([b"a"], 0)
    w.take_commands()
    w.step(AddSendFailed("b2", (0,), "timed out", timed_out=True), 0)
    assert w.take_commands() == []
    w.tick(10)
    assert w.take_commands() == [ListWritableBookies()]


def test_delayed_write_failure_completes_first_and_replaces_after_the_delay() -> None:
    w = writer(3, 3, 2, ensemble_change_delay_ms=10)
    w.add([b"a"], 0)
    w.take_commands()
    w.step(AddSendFailed("b2", (0,), "timeout"), 0)
    assert w.take_commands() == []  # the ack quorum is still reachable: no change yet
    w.step(ok("b0", 0), 0)
    w.step(ok("b1", 0), 0)
    assert others(w.take_commands()) == [CompleteAdds(0, 0, 0, 1)]
    w.tick(9)
    assert w.take_commands() == []
    w.tick(10)  # ensemble_change_delay_ms after the failure
    assert w.take_commands() == [ListWritableBookies()]
    # No bookie to spare: keep writing on the degraded ensemble, retry later.
    w.step(WritableBookies(("b0", "b1", "b2")), 0)
    assert w.take_commands() == [] and w.broken is None
    w.add([b"b"], 20)
    w.take_commands()
    w.step(ok("b0", 1), 0)
    w.step(ok("b1", 1), 0)
    assert others(w.take_commands()) == [CompleteAdds(1, 1, 1, 2)]
    w.tick(500)
    assert w.take_commands() == []
    w.tick(1_020)  # ensemble_change_retry_ms after the failed attempt
    assert w.take_commands() == [ListWritableBookies()]


@pytest.mark.parametrize(
    ("state", "api"),
    [
        (LedgerState.IN_RECOVERY, ApiCodes.LEDGER_FENCED),
        (LedgerState.CLOSED, ApiCodes.LEDGER_FENCED),
    ],
)
def test_a_recovery_wins_over_an_ensemble_change(state, api) -> None:
    w = writer(3, 3, 3)
    w.add([b"a"], 0)
    w.take_commands()
    w.step(AddSendFailed("b2", (0,), "timeout"), 0)
    w.take_commands()
    w.step(WritableBookies(("b3",)), 0)
    w.take_commands()
    current = metadata(version=1, state=state)
    w.step(LedgerUpdateFailed(current, "BAD_VERSION"), 0)
    [fail] = others(w.take_commands())
    assert fail == FailAdds(0, 0, api, w.broken.detail)
    with pytest.raises(QuireError):
        w.add([b"b"], 1)


def test_an_ensemble_change_is_rebased_over_an_unrelated_change() -> None:
    w = writer(3, 3, 3)
    w.add([b"a"], 0)
    w.take_commands()
    w.step(AddSendFailed("b2", (0,), "timeout"), 0)
    w.take_commands()
    w.step(WritableBookies(("b3",)), 0)
    [first] = w.take_commands()
    # Someone bumped the version without touching the last segment (say, custom metadata).
    bumped = w.metadata.model_copy(update={"version": 1, "metadata": {"k": "v"}})
    w.step(LedgerUpdateFailed(bumped, "BAD_VERSION"), 0)
    [retry] = w.take_commands()
    assert retry.request.expected_version == 1
    assert retry.request.segments == first.request.segments
    # A CAS whose answer was lost but which did land: re-read shows our segments.
    landed = bumped.model_copy(update={"version": 2, "segments": retry.request.segments})
    w.step(LedgerUpdateFailed(landed, "UNAVAILABLE"), 0)
    assert sends(w.take_commands()) == {"b3": (0,)}
    assert w.metadata.version == 2


def test_close_cas_and_its_conflicts() -> None:
    w = writer()
    w.add([b"a"], 0)
    w.take_commands()
    w.step(ok("b0", 0), 0)
    w.step(ok("b1", 0), 0)
    w.take_commands()
    w.start_close()
    [update] = w.take_commands()
    assert update.request.state is LedgerState.CLOSED and update.request.last_entry_id == 0
    # Lost to a recovery that closed at another entry: fenced.
    closed = metadata(version=2, state=LedgerState.CLOSED).model_copy(update={"last_entry_id": 3})
    w.step(LedgerUpdateFailed(closed, "BAD_VERSION"), 0)
    [failed] = w.take_commands()
    assert isinstance(failed, CloseFailed) and failed.api == ApiCodes.LEDGER_FENCED
    # A close whose answer was lost: the re-read shows it closed at our LAC.
    w2 = writer()
    w2.start_close()
    w2.take_commands()
    mine = metadata(version=1, state=LedgerState.CLOSED).model_copy(update={"last_entry_id": -1})
    w2.step(LedgerUpdateFailed(mine, "UNAVAILABLE"), 0)
    assert w2.take_commands() == [CloseDone(mine)]


def test_explicit_lac_is_sent_when_idle() -> None:
    w = writer(explicit_lac_interval_ms=100)
    w.add([b"a"], 0)
    w.take_commands()
    w.step(ok("b0", 0), 0)
    w.step(ok("b1", 0), 0)
    w.take_commands()
    w.tick(50)
    assert w.take_commands() == []
    w.tick(100)
    assert w.take_commands() == [SendWriteLac(b, 0) for b in ("b0", "b1", "b2")]
    w.tick(300)
    assert w.take_commands() == []  # once per LAC


def test_fenced_bookie_breaks_the_writer_even_after_the_entry_completed() -> None:
    w = writer(3, 3, 2)
    w.add([b"a"], 0)
    w.take_commands()
    w.step(ok("b0", 0), 0)
    w.step(ok("b1", 0), 0)
    w.take_commands()
    fenced = (AddResult(LEDGER, 0, BookieStatus.FENCED),)
    w.step(BookieAddReply("b2", (0,), BookieStatus.OK, fenced), 0)
    assert w.broken is not None and w.broken.api == ApiCodes.LEDGER_FENCED


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
