"""The sans-IO reader (shared.protocol.reader): table-driven rules and scenario transcripts.

Scenarios push events through a LedgerReader and check the commands that come out, the way
h11's tests drive a connection without a socket; `run` plays the bookies (each send answered
by a rule after a delay, the clock ticking) for the scenarios that need many round trips."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

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
from shared.protocol.reader import LedgerReader, ReadSettings, lac_from_replies
from shared.quorum import QuorumSpec, read_order, write_set
from shared.status import ApiCodes, BookieStatus
from shared.wire import ReadResult
from tests.support.protocol import LEDGER, metadata

BLOCK = 4  # sticky_read_block_entries of these tests: entries 0-3 prefer b0, 4-7 b1, ...


@cache
def frame(entry_id: int) -> bytes:
    return DigestManager("crc32c").sign(
        LEDGER, entry_id, entry_id - 1, entry_id + 1, b"p%d" % entry_id
    )


def entry(entry_id: int) -> EntryRead:
    return EntryRead(entry_id, b"p%d" % entry_id, entry_id - 1, entry_id + 1)


def reader(e: int = 3, w: int = 3, a: int = 2, **settings) -> LedgerReader:
    settings = {"read_entry_timeout_ms": 500, "sticky_read_block_entries": BLOCK, **settings}
    return LedgerReader(metadata(e, w, a), DigestManager("crc32c"), ReadSettings(**settings))


def read_ok(bookie: str, *entries: int, frame_of=frame) -> BookieReadReply:
    results = tuple(ReadResult(LEDGER, e, BookieStatus.OK, frame_of(e)) for e in entries)
    return BookieReadReply(bookie, entries, BookieStatus.OK, results)


def read_status(bookie: str, st: BookieStatus, *entries: int) -> BookieReadReply:
    return BookieReadReply(
        bookie, entries, BookieStatus.OK, tuple(ReadResult(LEDGER, e, st) for e in entries)
    )


def sends_of(commands) -> dict[str, tuple[int, ...]]:
    sends: dict[str, tuple[int, ...]] = {}
    for c in commands:
        if isinstance(c, SendReads):
            sends[c.bookie_id] = sends.get(c.bookie_id, ()) + c.entry_ids
    return sends


def delivered(commands) -> list:
    return [c for c in commands if isinstance(c, EntryRead | EntryReadFailed)]


# -- the bookies of a scenario ------------------------------------------------------------------

Answer = Callable[[SendReads, int], BookieReadReply | ReadSendFailed | None]


def answer_all(send: SendReads, now_ms: int) -> BookieReadReply:
    return read_ok(send.bookie_id, *send.entry_ids)


@dataclass
class Run:
    """What a scenario saw: every send (time, command), every delivery, and the most
    entries any bookie had unanswered and the furthest entry asked past the next one."""

    sends: list[tuple[int, SendReads]] = field(default_factory=list)
    delivered: list[EntryRead | EntryReadFailed] = field(default_factory=list)
    in_flight_max: dict[str, int] = field(default_factory=dict)
    ahead_max: int = 0
    now_ms: int = 0

    def asked(self, bookie: str) -> list[int]:
        return [e for _, s in self.sends if s.bookie_id == bookie for e in s.entry_ids]


def run(
    r: LedgerReader,
    first: int,
    last: int,
    answer: Answer = answer_all,
    *,
    delay_ms: int = 5,
    tick_ms: int = 5,
    until_ms: int = 120_000,
    take: Callable[[int], bool] = lambda now_ms: True,
) -> Run:
    """Read first..last: each send answered `delay_ms` later by `answer` (None: never), the
    clock ticking every `tick_ms`. `take(now)` False means the consumer takes nothing then
    (the driver calls neither take_commands nor step: the core does not run)."""
    seen = Run()
    inbox: list[tuple[int, BookieReadReply | ReadSendFailed]] = []
    r.read(first, last, 0)
    now_ms = 0
    furthest, sent = -1, 0
    while now_ms <= until_ms:
        if take(now_ms):
            for command in r.take_commands():
                if isinstance(command, SendReads):
                    seen.sends.append((now_ms, command))
                    event = answer(command, now_ms)
                    if event is not None:
                        inbox.append((now_ms + delay_ms, event))
                else:
                    seen.delivered.append(command)
            for _, send in seen.sends[sent:]:
                furthest = max(furthest, *send.entry_ids)
                seen.in_flight_max.setdefault(send.bookie_id, 0)
            sent = len(seen.sends)
            for bookie in seen.in_flight_max:
                in_flight = r.in_flight(bookie)
                assert in_flight <= r.window(bookie) <= r.settings.read_window_max_entries
                seen.in_flight_max[bookie] = max(seen.in_flight_max.get(bookie, 0), in_flight)
            if seen.sends:
                seen.ahead_max = max(seen.ahead_max, furthest - r.next_entry_id)
            if r.done:
                break
        now_ms += tick_ms
        if take(now_ms):
            due = [event for at, event in inbox if at <= now_ms]
            inbox = [(at, event) for at, event in inbox if at > now_ms]
            for event in due:
                r.step(event, now_ms)
            r.tick(now_ms)
    seen.now_ms = now_ms
    return seen


# -- replica choice: sticky blocks ---------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "first_asked"),
    [
        # E = Qw: every entry of a block goes to the block's bookie, blocks rotate.
        ((3, 3, 2), [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 0]),
        # E4/Qw3: the block's bookie lacks one entry in four; its next neighbour holds it.
        ((4, 3, 2), [0, 1, 0, 0, 1, 1, 2, 1, 2, 2, 2, 3, 0]),
        # E5/Qw2: a bookie stores 2 entries in 5; the others go to their nearest holder.
        ((5, 2, 2), [0, 1, 2, 3, 4, 1, 1, 2, 3, 4, 0, 2, 3]),
    ],
)
def test_each_block_is_asked_of_its_bookie_first(spec, first_asked: list[int]) -> None:
    quorum = QuorumSpec(*spec)
    order = [read_order(e, quorum, BLOCK) for e in range(len(first_asked))]
    assert [o[0] for o in order] == first_asked
    for e, o in enumerate(order):
        assert sorted(o) == sorted(write_set(e, quorum))  # only replicas, each once


@pytest.mark.parametrize("spec", [(3, 3, 2), (4, 3, 2), (5, 2, 2)])
def test_a_range_spreads_over_the_ensemble_in_contiguous_runs(spec) -> None:
    e, w, a = spec
    r = reader(e, w, a, sticky_read_block_entries=16)
    seen = run(r, 0, 16 * e * 4 - 1)
    assert [c.entry_id for c in seen.delivered] == list(range(16 * e * 4))
    asked = {f"b{i}": seen.asked(f"b{i}") for i in range(e)}
    assert sum(len(v) for v in asked.values()) == 16 * e * 4  # no entry asked twice
    for bookie, entries in asked.items():
        # Even load: each bookie is asked a share of the range.
        assert abs(len(entries) - 16 * 4) <= 16 * 4 // 2, (bookie, len(entries))
        if e == w:  # whole blocks: runs of 16 contiguous entries
            runs = [entries[i : i + 16] for i in range(0, len(entries), 16)]
            assert all(run_ == list(range(run_[0], run_[0] + 16)) for run_ in runs)


def test_an_unreachable_bookie_is_asked_last_for_the_entries_still_to_come() -> None:
    r = reader(3, 3, 2, read_window_initial_entries=4)
    r.read(0, 11, 0)
    assert sends_of(r.take_commands()) == {
        "b0": (0, 1, 2, 3),
        "b1": (4, 5, 6, 7),
        "b2": (8, 9, 10, 11),
    }
    r.step(ReadSendFailed("b1", (4, 5, 6, 7), "no responders", timed_out=False), 1)
    # Its entries went on to their next replica (b2), at no budget cost.
    assert sends_of(r.take_commands()) == {}  # b2's window (4) is full
    r.step(read_ok("b2", 8, 9, 10, 11), 2)
    assert sends_of(r.take_commands()) == {"b2": (4, 5, 6, 7)}
    assert r.retries == 0 and r.retries_refused == 0


# -- delivery in order, bounded ----------------------------------------------------------------


def test_entries_are_delivered_in_order_whatever_order_they_arrive_in() -> None:
    r = reader(3, 3, 2)
    r.read(0, 11, 0)
    assert sends_of(r.take_commands()) == {
        "b0": (0, 1, 2, 3),
        "b1": (4, 5, 6, 7),
        "b2": (8, 9, 10, 11),
    }
    r.step(read_ok("b2", 8, 9, 10, 11), 1)
    r.step(read_ok("b1", 4, 5, 6, 7), 2)
    assert delivered(r.take_commands()) == [] and r.buffered == 12
    r.step(read_ok("b0", 0, 1, 2, 3), 3)
    assert delivered(r.take_commands()) == [entry(e) for e in range(12)] and r.done


def test_nothing_is_asked_past_the_read_ahead_while_the_next_entry_is_missing() -> None:
    """Entry 0 never comes: everything after it is read into the reorder buffer, but never
    more than read_ahead_max_entries past it."""

    def all_but_zero(send: SendReads, now_ms: int):
        entries = [e for e in send.entry_ids if e != 0]
        return read_ok(send.bookie_id, *entries) if entries else None

    r = reader(3, 3, 2, read_ahead_max_entries=40, read_entry_timeout_ms=100_000)
    seen = run(r, 0, 999, all_but_zero, until_ms=2_000)
    assert seen.delivered == [] and not r.done
    assert max(e for _, s in seen.sends for e in s.entry_ids) == 39
    assert r.buffered == 40


def test_a_consumer_that_stops_taking_stops_the_reading() -> None:
    """While the consumer takes nothing (ms 100 to 900) nothing is asked; it resumes after."""
    r = reader(3, 3, 2, read_ahead_max_entries=64)
    seen = run(r, 0, 9_999, take=lambda now_ms: not 100 <= now_ms < 900)
    assert [c.entry_id for c in seen.delivered] == list(range(10_000))
    assert not [at for at, _ in seen.sends if 100 <= at < 900]
    assert seen.ahead_max < 64


def test_an_empty_range_is_done_at_once() -> None:
    r = reader()
    r.read(5, 4, 0)
    assert r.done and r.take_commands() == []


# -- windows: bounds, growth, shrink ---------------------------------------------------------


def test_windows_grow_while_answers_are_fast_and_never_pass_their_bounds() -> None:
    r = reader(3, 3, 2, read_window_max_entries=100, read_batch_entries=16)
    seen = run(r, 0, 19_999, delay_ms=5)
    assert [c.entry_id for c in seen.delivered] == list(range(20_000))
    assert all(r.window(b) == 100 for b in ("b0", "b1", "b2"))
    assert max(seen.in_flight_max.values()) == 100
    assert all(len(s.entry_ids) <= 16 for _, s in seen.sends)
    assert seen.ahead_max < r.settings.read_ahead_max_entries


@pytest.mark.parametrize(
    ("delay_ms", "window"),
    [(10, 100), (30, 16), (60, 1)],
    ids=["quick_grows", "middling_holds", "slow_eases_off"],
)
def test_the_window_follows_how_soon_the_bookie_answers(delay_ms: int, window: int) -> None:
    """Quicker than half of speculative_read_timeout_ms (50) grows it, slower than all of it
    shrinks it (the entries queued at the bookie), in between holds it."""
    r = reader(
        1,
        1,
        1,
        speculative_read_timeout_ms=50,
        read_window_max_entries=100,
        read_entry_timeout_ms=10_000,
    )
    seen = run(r, 0, 499, delay_ms=delay_ms, tick_ms=5)
    assert len(seen.delivered) == 500
    assert r.window("b0") == window


@pytest.mark.parametrize(
    "busy",
    [
        lambda send: BookieReadReply(
            send.bookie_id, send.entry_ids, BookieStatus.TOO_MANY_REQUESTS
        ),
        lambda send: ReadSendFailed(send.bookie_id, send.entry_ids, "timed out"),
    ],
    ids=["too_many_requests", "timeout"],
)
def test_a_busy_bookie_halves_its_window_and_backs_off(busy) -> None:
    r = reader(1, 1, 1, read_window_initial_entries=8, read_backoff_initial_ms=100)
    r.read(0, 99, 0)
    [send] = r.take_commands()
    r.step(read_ok("b0", *send.entry_ids), 1)  # fast: 8 answered, window 16
    assert r.window("b0") == 16
    [send] = [c for c in r.take_commands() if isinstance(c, SendReads)]
    assert send.entry_ids == tuple(range(8, 24))
    r.step(busy(send), 2)
    assert r.window("b0") == 8 and r.backoffs == 1
    assert r.take_commands() == []  # backing off: the entries wait
    r.tick(101)
    assert r.take_commands() == []
    r.tick(102)
    assert sends_of(r.take_commands()) == {"b0": tuple(range(8, 16))}  # a window, in order
    r.step(busy(send), 103)
    assert r.window("b0") == 4
    r.tick(302)
    assert r.take_commands() == []  # the backoff doubled: 200 ms
    r.tick(303)
    assert sends_of(r.take_commands()) == {"b0": (8, 9, 10, 11)}


def test_a_silent_bookie_times_out_per_request_not_per_range() -> None:
    """b0 never answers: each request to it times out on its own (a window's worth), the
    entries waiting for it go to the others meanwhile, and the range is read to the end."""

    def b0_silent(send: SendReads, now_ms: int):
        return None if send.bookie_id == "b0" else answer_all(send, now_ms)

    r = reader(
        3,
        3,
        2,
        read_entry_timeout_ms=100,
        read_ahead_max_entries=256,
        read_retry_budget_max_tokens=10_000,
    )
    seen = run(r, 0, 9_999, b0_silent, delay_ms=20)
    assert [c.entry_id for c in seen.delivered] == list(range(10_000))
    b0_sends = [s for _, s in seen.sends if s.bookie_id == "b0"]
    assert r.backoffs == len(b0_sends)  # one timeout per request
    sizes = [len(s.entry_ids) for s in b0_sends]
    assert sizes[:5] == [16, 8, 4, 2, 1] and set(sizes[5:]) <= {1}  # the window halving


# -- fallback, retries, the budget -----------------------------------------------------------


@pytest.mark.parametrize(
    ("first_failure", "corrupt"),
    [
        (read_status("b0", BookieStatus.IO_ERROR, 0), False),
        (ReadSendFailed("b0", (0,), "timeout"), False),
        (BookieReadReply("b0", (0,), BookieStatus.BAD_REQUEST), False),
        (read_ok("b0", 0, frame_of=lambda e: frame(e)[:-1] + b"X"), True),  # digest mismatch
        (read_ok("b0", 0, frame_of=lambda e: frame(1)), True),  # another entry's frame
    ],
)
def test_a_failed_replica_falls_back_to_the_next(first_failure, corrupt) -> None:
    r = reader()
    r.read(0, 0, 0)
    r.take_commands()
    r.step(first_failure, 1)
    commands = r.take_commands()
    assert sends_of(commands) == {"b1": (0,)}
    assert any(isinstance(c, ReplicaCorrupt) for c in commands) == corrupt
    r.step(read_ok("b1", 0), 2)
    assert r.take_commands() == [entry(0)] and r.done


def test_no_entry_from_every_replica_is_no_such_entry() -> None:
    r = reader()
    r.read(5, 5, 0)
    for bookie in ("b1", "b2", "b0"):  # block 1 prefers b1, then around the ring
        assert sends_of(r.take_commands()) == {bookie: (5,)}
        r.step(read_status(bookie, BookieStatus.NO_ENTRY, 5), 1)
    [failed] = r.take_commands()
    assert isinstance(failed, EntryReadFailed) and failed.api == ApiCodes.NO_SUCH_ENTRY
    assert r.done


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
        ([BookieStatus.TOO_MANY_REQUESTS] * 3, ApiCodes.TOO_MANY_REQUESTS),
        ([None] * 3, ApiCodes.TIMEOUT),
    ],
)
def test_read_outcome_when_every_replica_keeps_failing(statuses, api) -> None:
    """Each replica always answers the same: failures for good end the entry at once,
    timeouts and refusals after read_max_tries rounds (2 here) over its replicas."""
    by_bookie = dict(zip(("b0", "b1", "b2"), statuses, strict=True))

    def answer(send: SendReads, now_ms: int):
        st = by_bookie[send.bookie_id]
        if st is None:
            return ReadSendFailed(send.bookie_id, send.entry_ids, "timed out")
        if st == "unreachable":
            return ReadSendFailed(send.bookie_id, send.entry_ids, "no responders", timed_out=False)
        return read_status(send.bookie_id, st, *send.entry_ids)

    r = reader(read_max_tries=2)
    seen = run(r, 0, 0, answer)
    [failed] = seen.delivered
    assert isinstance(failed, EntryReadFailed) and failed.api == api and r.done
    assert failed.detail.startswith("entry 0: ")
    transient = sum(1 for st in statuses if st is None or st is BookieStatus.TOO_MANY_REQUESTS)
    definite = len(statuses) - transient
    # Every replica is named; transient ones were tried until 2 rounds' worth of tries ran out.
    assert all(f"b{i}: " in failed.detail for i in range(3))
    assert len(seen.sends) == definite + (2 * 3 if transient else 0)


def test_every_replica_busy_backs_off_instead_of_multiplying_the_load() -> None:
    """A cluster answering TOO_MANY_REQUESTS to everything: the reader asks each bookie
    less and less often (windows of 1, doubling backoffs), then fails the first entry."""

    def refuse(send: SendReads, now_ms: int):
        return BookieReadReply(send.bookie_id, send.entry_ids, BookieStatus.TOO_MANY_REQUESTS)

    r = reader(read_max_tries=3, read_backoff_initial_ms=50, read_backoff_max_ms=400)
    seen = run(r, 0, 999, refuse)
    [failed] = seen.delivered
    assert failed.api == ApiCodes.TOO_MANY_REQUESTS and failed.entry_id == 0
    assert "b0: answered TOO_MANY_REQUESTS" in failed.detail
    asked = sum(len(s.entry_ids) for _, s in seen.sends)
    # Each bookie's windows halve: 16 + 8 + 4 + 2 + 1, then one entry a try.
    assert asked <= 3 * (2 * 16 + 3), asked
    for bookie in ("b0", "b1", "b2"):
        times = [at for at, s in seen.sends if s.bookie_id == bookie]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert gaps == sorted(gaps), (bookie, gaps)  # the backoff only grows


def test_the_retry_budget_bounds_retries_on_other_replicas() -> None:
    """b0 is slow (times out) for every entry; with 3 tokens and no refill, 3 entries go on
    to b1 and the rest wait for b0 to come back from its backoff."""
    slow_until_ms = 1_000

    def b0_slow(send: SendReads, now_ms: int):
        if send.bookie_id == "b0" and now_ms < slow_until_ms:
            return None
        return answer_all(send, now_ms)

    r = reader(
        3,
        3,
        2,
        read_retry_budget_max_tokens=3,
        read_retry_budget_token_ratio=0,
        read_window_initial_entries=8,
        read_entry_timeout_ms=200,
    )
    seen = run(r, 0, 3, b0_slow)
    assert [c.entry_id for c in seen.delivered] == [0, 1, 2, 3]
    assert r.retries == 3 and seen.asked("b1") == [0, 1, 2]
    # Entry 3 waited for b0, every retry elsewhere refused, until b0 answered.
    assert seen.asked("b0").count(3) == r.retries_refused + 1 > 2


def test_entries_read_at_the_first_ask_refill_the_budget() -> None:
    r = reader(
        read_retry_budget_max_tokens=2,
        read_retry_budget_token_ratio=0.5,
        sticky_read_block_entries=6,  # all of them asked of b0 first
    )
    r.read(0, 5, 0)
    r.take_commands()
    for e in (0, 1, 2):  # two retries empty the bucket; the third is refused
        r.step(ReadSendFailed("b0", (e,), "timed out"), 1)
    assert r.retries == 2 and r.retries_refused == 1
    r.step(read_ok("b1", 0, 1), 2)  # read by a retry: earns nothing
    r.step(read_ok("b0", 3, 4), 3)  # read at the first ask: half a token each
    r.step(ReadSendFailed("b0", (5,), "timed out"), 4)
    assert r.retries == 3 and r.retries_refused == 1


def test_a_slow_replica_gets_a_speculative_read_and_the_first_answer_wins() -> None:
    r = reader(read_entry_timeout_ms=1000, speculative_read_timeout_ms=50)
    r.read(0, 0, 0)
    assert sends_of(r.take_commands()) == {"b0": (0,)}
    r.tick(49)
    assert r.take_commands() == []
    r.tick(50)
    assert sends_of(r.take_commands()) == {"b1": (0,)}
    r.step(read_ok("b1", 0), 60)
    assert r.take_commands() == [entry(0)] and r.done
    assert r.speculative_reads == 1


def test_speculative_reads_never_fail_an_entry_while_a_replica_may_answer() -> None:
    r = reader(read_entry_timeout_ms=1000, speculative_read_timeout_ms=10)
    r.read(0, 0, 0)
    r.tick(10)
    r.tick(20)  # b0 and b1 asked: one speculative read per entry, however slow
    assert r.speculative_reads == 1
    assert sends_of(r.take_commands()) == {"b0": (0,), "b1": (0,)}
    r.step(BookieReadReply("b1", (0,), BookieStatus.NO_ENTRY), 30)
    assert r.take_commands() == [] and not r.done  # b0 is still out
    r.step(read_ok("b0", 0), 40)
    assert r.take_commands() == [entry(0)]


def test_speculative_reads_spend_the_budget_too() -> None:
    r = reader(
        read_entry_timeout_ms=1000,
        speculative_read_timeout_ms=10,
        read_retry_budget_max_tokens=1,
        read_retry_budget_token_ratio=0,
    )
    r.read(0, 1, 0)
    r.take_commands()
    r.tick(10)
    assert sends_of(r.take_commands()) == {"b1": (0,)}
    assert r.speculative_reads == 1 and r.retries_refused == 1  # entry 1 was refused


def test_tick_moves_a_silent_replica_on_and_a_late_good_answer_still_counts() -> None:
    r = reader()
    r.read(0, 0, 0)
    r.take_commands()
    r.tick(499)
    assert r.take_commands() == []
    r.tick(500)
    assert sends_of(r.take_commands()) == {"b1": (0,)}
    r.step(read_ok("b0", 0), 600)  # the first replica answers after all
    assert r.take_commands() == [entry(0)]
    r.step(read_ok("b1", 0), 601)
    assert r.take_commands() == []


def test_a_partial_batch_answer_is_asked_again_of_the_same_bookie() -> None:
    r = reader(1, 1, 1)
    r.read(0, 2, 0)
    r.take_commands()
    prefix = read_ok("b0", 0)  # the bookie answered a prefix only
    r.step(BookieReadReply("b0", (0, 1, 2), BookieStatus.OK, prefix.results), 1)
    commands = r.take_commands()
    assert sends_of(commands) == {"b0": (1, 2)}
    assert delivered(commands) == [entry(0)]


def test_read_requests_are_bounded() -> None:
    r = reader(1, 1, 1, read_batch_entries=2, read_window_initial_entries=5)
    r.read(0, 9, 0)
    assert [c.entry_ids for c in r.take_commands()] == [(0, 1), (2, 3), (4,)]


def test_a_failed_entry_ends_the_read() -> None:
    r = reader(1, 1, 1, read_window_initial_entries=4)
    r.read(0, 99, 0)
    r.take_commands()
    r.step(read_ok("b0", 0, 2, 3), 1)  # 1 is missing: asked again
    r.step(read_ok("b0", 1, frame_of=lambda e: b"junk"), 2)  # corrupt, no other replica
    commands = r.take_commands()
    assert [c.entry_id for c in delivered(commands)] == [0, 1]
    assert isinstance(commands[-1], EntryReadFailed) and r.done
    assert sends_of(commands) == {}  # nothing more is asked
    r.tick(10_000)
    assert r.take_commands() == []


# -- the LAC --------------------------------------------------------------------------------


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


# -- the options of a reader that copies replicas (replication.LedgerReplication) -------------


def test_avoided_bookies_are_asked_last() -> None:
    core = LedgerReader(
        metadata(3, 3, 2),
        DigestManager("crc32c"),
        ReadSettings(sticky_read_block_entries=BLOCK),
        avoid={"b0"},
    )
    core.read(0, 11, 0)
    sends = sends_of(core.take_commands())
    assert "b0" not in sends and sorted(sends["b1"] + sends["b2"]) == list(range(12))
    # Asked of b0 only once both others failed it.
    failed: dict[int, set[str]] = {}
    while "b0" not in sends:
        for bookie_id, entries in sends.items():
            core.step(read_status(bookie_id, BookieStatus.IO_ERROR, *entries), 1)
            for e in entries:
                failed.setdefault(e, set()).add(bookie_id)
        sends = sends_of(core.take_commands())
    assert all(failed[e] == {"b1", "b2"} for e in sends["b0"])


def test_only_wanted_entries_are_read_and_delivered() -> None:
    core = reader(4, 2, 2)
    core.read(0, 19, 0, wanted=lambda e: e % 4 in (0, 3))
    asked = sends_of(core.take_commands())
    assert sorted(e for entries in asked.values() for e in entries) == [
        e for e in range(20) if e % 4 in (0, 3)
    ]
    for bookie_id, entries in asked.items():
        core.step(read_ok(bookie_id, *entries), 1)
    got = [c.entry_id for c in delivered(core.take_commands())]
    assert got == [0, 3, 4, 7, 8, 11, 12, 15, 16, 19] and core.done


def test_admit_until_paces_the_reader() -> None:
    core = reader()
    core.read(0, 99, 0, admit_until=9)
    asked = sends_of(core.take_commands())
    assert sorted(e for entries in asked.values() for e in entries) == list(range(10))
    for bookie_id, entries in asked.items():
        core.step(read_ok(bookie_id, *entries), 1)
    assert len(delivered(core.take_commands())) == 10
    assert core.buffered == 0 and not core.done  # nothing more until the consumer says
    core.admit_until(14, 2)
    asked = sends_of(core.take_commands())
    assert sorted(e for entries in asked.values() for e in entries) == list(range(10, 15))
