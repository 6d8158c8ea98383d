"""The sans-IO writer (shared.protocol.writer): table-driven rules and scenario transcripts.

Scenarios push events through a LedgerWriter and check the commands that come out, the way
h11's tests drive a connection without a socket."""

from __future__ import annotations

import random

import pytest

from shared.digest import DigestManager
from shared.protocol.messages import (
    AddSendFailed,
    BookieAddReply,
    CompleteAdds,
    FailAdds,
    ListWritableBookies,
    SendAdds,
    SendWriteLac,
    UpdateLedger,
    WritableBookies,
)
from shared.protocol.placement import PlacementPolicy, PlacementRules
from shared.protocol.writer import LedgerWriter
from shared.status import ApiCodes, BookieStatus, QuireError
from shared.wire import AddResult
from tests.support.protocol import KEY, LEDGER, metadata


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
    w.step(ok("b0", 0), 0)
    w.step(ok("b1", 0), 0)
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
    w.step(ok("b0", 2), 0)
    w.step(ok("b1", 2), 0)  # entry 2 reached Qa but 0 and 1 did not
    assert outcomes(w) == []
    w.step(ok("b0", 1), 0)
    w.step(ok("b2", 1), 0)
    assert outcomes(w) == []
    w.step(ok("b1", 0), 0)
    w.step(ok("b2", 0), 0)
    assert outcomes(w) == [CompleteAdds(0, 2, 2, 3)]
    w.step(ok("b2", 2), 0)  # late acks change nothing
    w.step(ok("b0", 0), 0)
    assert outcomes(w) == [] and w.lac == 2 and w.pending_count == 0


def test_qa_reached_with_one_bookie_silent() -> None:
    w = writer(3, 3, 2)
    w.add([b"a", b"b"], 0)
    w.take_commands()
    for bookie in ("b0", "b1"):  # b2 never answers
        w.step(ok(bookie, 0, 1), 0)
    assert outcomes(w) == [CompleteAdds(0, 1, 1, 2)]


def test_a_failed_bookie_is_tolerated_when_qw_exceeds_qa() -> None:
    w = writer(3, 3, 2)
    w.add([b"a"], 0)
    w.take_commands()
    w.step(AddSendFailed("b2", (0,), "no responders"), 0)
    w.step(ok("b0", 0), 0)
    assert outcomes(w) == []
    w.step(ok("b1", 0), 0)
    assert outcomes(w) == [CompleteAdds(0, 0, 0, 1)] and w.broken is None


def test_a_second_failure_leaves_the_ack_quorum_out_of_reach() -> None:
    w = writer(3, 3, 2)
    w.add([b"a"], 0)
    w.take_commands()
    w.step(ok("b0", 0), 0)
    w.step(AddSendFailed("b2", (0,), "no responders"), 0)
    w.step(status("b1", BookieStatus.IO_ERROR, 0), 0)
    # The ack quorum is out of reach: replace at once; with no bookie to spare, fail.
    assert outcomes(w) == [ListWritableBookies()]
    w.step(WritableBookies(("b0", "b1", "b2")), 0)
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
    w.step(ok("b0", 0), 0)
    w.step(ok("b1", 0), 0)
    w.step(status("b2", reply_status, 1), 0)
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
    w.step(ok("b0", 0), 0)
    w.step(failure, 0)
    assert outcomes(w) == [ListWritableBookies()]
    w.step(WritableBookies(("b0", "b1", "b2")), 0)  # nobody outside the ensemble
    api = ApiCodes.NOT_ENOUGH_BOOKIES
    assert outcomes(w) == [FailAdds(0, 1, api, w.broken.detail)]
    assert w.metadata.version == 0 and len(w.metadata.segments) == 1  # nothing half-visible
    w.step(ok("b1", 0), 0)  # too late: the handle is broken
    assert outcomes(w) == [] and w.lac == -1


def test_timeout_fails_pending_adds_after_add_entry_timeout() -> None:
    w = writer(timeout_ms=1000)
    w.add([b"a"], now_ms=100)
    w.take_commands()
    w.tick(1099)
    assert outcomes(w) == []
    w.step(ok("b0", 0), 0)
    w.tick(1100)
    [fail] = outcomes(w)
    assert (fail.first_entry_id, fail.last_entry_id, fail.api) == (0, 0, ApiCodes.TIMEOUT)


def test_replies_for_another_ledger_or_bookie_are_ignored() -> None:
    w = writer(4, 2, 2)
    w.add([b"a"], 0)  # write set b0, b1
    w.take_commands()
    w.step(ok("b3", 0), 0)
    w.step(BookieAddReply("b0", (0,), BookieStatus.OK, (AddResult(LEDGER + 1, 0, 0),)), 0)
    # b3 is not in the write set: ignored. b0 answered about another ledger: entry 0 is
    # missing from its answer, a failure; with Qw = Qa b0 must be replaced.
    assert outcomes(w) == [ListWritableBookies()]
    w.step(WritableBookies(()), 0)
    [fail] = outcomes(w)
    assert isinstance(fail, FailAdds) and fail.api == ApiCodes.NOT_ENOUGH_BOOKIES
    w.step(ok("b1", 0), 0)
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


# -- writer: flow control and back-pressure ---------------------------------------------------


def add(w: LedgerWriter, *payloads: bytes) -> None:
    w.add(list(payloads), 0)


def sent(w: LedgerWriter) -> list[tuple[str, tuple[int, ...]]]:
    """The SendAdds that go out now, as (bookie, entry ids)."""
    return [(c.bookie_id, c.entry_ids) for c in w.take_commands() if isinstance(c, SendAdds)]


FLOW = [
    # (action, the sends that go out after it); limit 1 request per bookie, E = Qw = 3.
    (lambda w: add(w, b"a"), [("b0", (0,)), ("b1", (0,)), ("b2", (0,))]),
    (lambda w: add(w, b"b"), []),  # each bookie has its one request unanswered: held
    (lambda w: add(w, b"c"), []),
    # An answer releases what was held for that bookie, merged into one request.
    (lambda w: w.step(ok("b0", 0), 1), [("b0", (1, 2))]),
    # A failure (timeout, no responders) is an answer as well.
    (lambda w: w.step(AddSendFailed("b1", (0,), "timeout"), 2), [("b1", (1, 2))]),
    # A stray answer (nothing of this writer is out to b3) releases nothing.
    (lambda w: w.step(ok("b3", 0), 3), []),
    (lambda w: add(w, b"d"), []),  # b0 and b1 have (1, 2) out, b2 still (0,)
    (lambda w: w.step(ok("b2", 0), 4), [("b2", (1, 2, 3))]),
]


def test_flow_control_holds_at_the_limit_and_merges_on_an_answer() -> None:
    w = writer(max_add_requests_per_bookie=1)
    for step, (action, expected) in enumerate(FLOW):
        action(w)
        assert sent(w) == expected, f"step {step}"
    # Every SendAdds handed out counts once; held ones count when held, again when sent.
    assert w.add_requests_sent == 3 + 1 + 1 + 1
    assert w.add_sends_held == 3 + 3 + 3


@pytest.mark.parametrize(("limit", "held"), [(None, 0), (1, 3), (2, 0)])
def test_flow_control_limit_per_bookie(limit: int | None, held: int) -> None:
    w = writer(max_add_requests_per_bookie=limit)
    add(w, b"a")
    first = sent(w)
    add(w, b"b")
    second = sent(w)
    assert len(first) == 3 and len(second) == 3 - held
    assert (w.add_requests_sent, w.add_sends_held) == (6 - held, held)


def test_a_broken_writer_drops_what_it_held() -> None:
    w = writer(max_add_requests_per_bookie=1)
    add(w, b"a")
    sent(w)
    add(w, b"b")
    assert sent(w) == []
    w.step(status("b0", BookieStatus.FENCED, 0), 1)
    assert [type(c) for c in w.take_commands()] == [FailAdds]
    for bookie in ("b1", "b2"):  # their answers come, and nothing held goes out
        w.step(ok(bookie, 0), 2)
        assert w.take_commands() == []


@pytest.mark.parametrize(
    ("max_pending", "pending", "count", "fits"),
    [
        (None, 5, 100, True),  # no bound
        (4, 0, 10, True),  # a batch larger than the bound goes alone
        (4, 2, 2, True),
        (4, 2, 3, False),
        (4, 4, 1, False),
    ],
)
def test_back_pressure_fits(max_pending, pending: int, count: int, fits: bool) -> None:
    w = writer(max_pending_adds=max_pending)
    if pending:
        w.add([b"p"] * pending, 0)
    assert w.fits(count) is fits


# -- writer: deadlines ------------------------------------------------------------------------


def _idle(explicit_lac_interval_ms: int = 200) -> LedgerWriter:
    """Entry 0 added at 100 and acknowledged: the bookies lack LAC 0."""
    w = writer(explicit_lac_interval_ms=explicit_lac_interval_ms)
    w.add([b"a"], 100)
    w.take_commands()
    w.step(ok("b0", 0), 110)
    w.step(ok("b1", 0), 110)
    w.take_commands()
    return w


def _fresh() -> LedgerWriter:
    return writer(explicit_lac_interval_ms=200)


def _pending() -> LedgerWriter:
    w = writer(timeout_ms=1000)
    w.add([b"a"], 100)
    w.take_commands()
    return w


def _lac_sent() -> LedgerWriter:
    w = _idle()
    w.tick(300)
    w.take_commands()
    return w


def _delayed_change() -> LedgerWriter:
    """b2 failed entry 0 at 120; the ack quorum is still reachable."""
    w = writer(timeout_ms=1000, ensemble_change_delay_ms=50)
    w.add([b"a"], 100)
    w.take_commands()
    w.step(AddSendFailed("b2", (0,), "timeout"), 120)
    return w


def _change_retry() -> LedgerWriter:
    """The delayed change found no bookie to spare at 180; entry 0 completed."""
    w = _delayed_change()
    w.step(ok("b0", 0), 130)
    w.step(ok("b1", 0), 130)
    w.take_commands()
    w.tick(170)
    w.take_commands()
    w.step(WritableBookies(("b0", "b1", "b2")), 180)
    return w


def _change_in_flight() -> LedgerWriter:
    w = _delayed_change()
    w.tick(170)
    w.take_commands()
    return w


def _broken() -> LedgerWriter:
    w = _pending()
    w.abort(ApiCodes.UNAVAILABLE, "stopping")
    w.take_commands()
    return w


def _closing_with_a_failed_bookie() -> LedgerWriter:
    w = _change_retry()
    w.start_close()
    w.take_commands()
    return w


@pytest.mark.parametrize(
    ("state", "deadline", "due"),
    [
        (_fresh, None, None),
        (_pending, 1100, FailAdds),  # add_entry_timeout_ms after the oldest add
        (_idle, 300, SendWriteLac),  # explicit_lac_interval_ms after the last add
        (lambda: _idle(explicit_lac_interval_ms=0), None, None),
        (_lac_sent, None, None),  # idle and the bookies have its LAC: nothing, ever
        (_delayed_change, 170, ListWritableBookies),  # the delay, before the timeout at 1100
        (_change_retry, 1180, ListWritableBookies),  # ensemble_change_retry_ms later
        (_change_in_flight, 1100, FailAdds),  # only the timeout while the change runs
        (_broken, None, None),
        (_closing_with_a_failed_bookie, None, None),  # nothing left to write
    ],
)
def test_next_deadline_and_a_tick_before_it_does_nothing(state, deadline, due) -> None:
    w = state()
    assert w.take_commands() == []
    assert w.next_deadline_ms() == deadline
    if deadline is None:
        w.tick(10_000_000)
        assert w.take_commands() == []
        return

    def snapshot(w: LedgerWriter) -> tuple:
        return (w.lac, w.broken, w.pending_count, w.closing, w.ensemble_changes, w._change)

    before = snapshot(w)
    w.tick(deadline - 1)
    assert w.take_commands() == []
    assert snapshot(w) == before and w.next_deadline_ms() == deadline
    w.tick(deadline)
    assert due in {type(c) for c in w.take_commands()}
    moved = w.next_deadline_ms()
    assert moved is None or moved > deadline


# -- ensemble change under a placement policy -------------------------------------------------

RACKS = (("b0", "/z/r1"), ("b1", "/z/r2"), ("b2", "/z/r1"), ("b3", "/z/r2"), ("b4", "/z/r1"))


@pytest.mark.parametrize("seed", range(5))
def test_rackaware_ensemble_change_keeps_each_write_quorum_on_two_racks(seed: int) -> None:
    w = writer(
        4,
        2,
        2,
        rng=random.Random(seed),
        placement=PlacementPolicy(PlacementRules(policy="rackaware")),
    )
    w.add([b"a"], 0)  # entry 0 on b0, b1
    w.take_commands()
    w.step(AddSendFailed("b1", (0,), "no responders"), 0)
    assert outcomes(w) == [ListWritableBookies()]
    # b4 (r1) and b5 (r2) are writable: only b5 keeps (b0, x) and (x, b2) on two racks.
    w.step(WritableBookies(("b0", "b2", "b3", "b4", "b5"), (*RACKS, ("b5", "/z/r2"))), 0)
    [update] = outcomes(w)
    assert isinstance(update, UpdateLedger)
    assert update.request.segments[-1].bookies == ["b0", "b5", "b2", "b3"]


def test_enforced_rackaware_change_without_a_fitting_bookie_fails_not_enough_bookies() -> None:
    policy = PlacementPolicy(
        PlacementRules(policy="rackaware", enforce_min_num_racks_per_write_quorum=True)
    )
    w = writer(4, 2, 2, placement=policy)
    w.add([b"a"], 0)
    w.take_commands()
    w.step(AddSendFailed("b1", (0,), "no responders"), 0)
    assert outcomes(w) == [ListWritableBookies()]
    w.step(WritableBookies(("b0", "b2", "b3", "b4"), RACKS), 0)  # only r1 to spare
    [fail] = outcomes(w)
    assert isinstance(fail, FailAdds) and fail.api == ApiCodes.NOT_ENOUGH_BOOKIES
    assert "no rackaware placement" in fail.detail
