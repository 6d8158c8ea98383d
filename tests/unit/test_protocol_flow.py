"""The writer's flow control per bookie (shared/protocol/flow.py), on its own: what goes out,
what is held, what an answer releases. The writer's use of it is in test_protocol_writer.py."""

from __future__ import annotations

import pytest

from shared.protocol.flow import (
    MAX_ITEMS_PER_SEND,
    AddFlowControl,
    chunk_adds,
    merge_sends,
    split_add_reply,
)
from shared.protocol.messages import SendAdds
from shared.status import BookieStatus
from shared.wire import AddItem, AddResult

KEY = bytes(20)


def queued(*entry_ids: int, size: int = 10) -> list[tuple[int, AddItem]]:
    return [(e, AddItem(0, KEY, bytes(size))) for e in entry_ids]


def sent(sends) -> list[tuple[str, tuple[int, ...]]]:
    return [(s.bookie_id, s.entry_ids) for s in sends]


def test_sends_go_out_until_the_limit_then_are_held() -> None:
    flow = AddFlowControl(max_requests_per_bookie=2, max_send_bytes=1 << 20)
    assert sent(flow.sends({"b1": queued(0), "b2": queued(0)})) == [("b1", (0,)), ("b2", (0,))]
    assert sent(flow.sends({"b1": queued(1)})) == [("b1", (1,))]
    assert sent(flow.sends({"b1": queued(2)})) == []  # b1 has 2 unanswered
    assert sent(flow.sends({"b1": queued(3), "b2": queued(1)})) == [("b2", (1,))]
    assert (flow.requests_sent, flow.sends_held) == (4, 2)


def test_an_answer_releases_everything_held_merged_with_what_is_queued() -> None:
    flow = AddFlowControl(max_requests_per_bookie=1, max_send_bytes=1 << 20)
    flow.sends({"b1": queued(0)})
    flow.sends({"b1": queued(1)})
    flow.sends({"b1": queued(2)})
    assert sent(flow.sends({})) == []
    flow.answered("b1")
    assert sent(flow.sends({"b1": queued(3)})) == [("b1", (1, 2, 3))]
    assert sent(flow.sends({"b1": queued(4)})) == []  # the merged send is unanswered


@pytest.mark.parametrize(
    "answers, expected",
    [
        (["b2"], []),  # another bookie's answer releases nothing of b1
        (["b1", "b1"], [("b1", (1,))]),  # a stray second answer changes nothing more
    ],
)
def test_only_an_answer_of_that_bookie_releases(answers: list[str], expected) -> None:
    flow = AddFlowControl(max_requests_per_bookie=1, max_send_bytes=1 << 20)
    flow.sends({"b1": queued(0)})
    flow.sends({"b1": queued(1)})
    for bookie_id in answers:
        flow.answered(bookie_id)
    assert sent(flow.sends({})) == expected


def test_clear_drops_what_was_held_and_released() -> None:
    flow = AddFlowControl(max_requests_per_bookie=1, max_send_bytes=1 << 20)
    flow.sends({"b1": queued(0), "b2": queued(0)})
    flow.sends({"b1": queued(1), "b2": queued(1)})
    flow.answered("b1")  # b1's held send is released, b2's still held
    flow.clear()
    flow.answered("b2")
    assert sent(flow.sends({})) == []


def test_no_bound_never_holds() -> None:
    flow = AddFlowControl(max_requests_per_bookie=None, max_send_bytes=1 << 20)
    for entry_id in range(10):
        assert sent(flow.sends({"b1": queued(entry_id)})) == [("b1", (entry_id,))]
    assert flow.sends_held == 0


@pytest.mark.parametrize(
    "count, size, max_send_bytes, expected_lengths",
    [
        (3, 10, 1000, [3]),
        (3, 10, 84, [2, 1]),  # 42 bytes an item counted (frame + 32)
        (2, 5000, 1000, [1, 1]),  # an item over the bound goes alone
        (MAX_ITEMS_PER_SEND + 1, 1, 1 << 30, [MAX_ITEMS_PER_SEND, 1]),
        (0, 10, 1000, []),
    ],
)
def test_chunk_adds_bounds_each_send(
    count: int, size: int, max_send_bytes: int, expected_lengths: list[int]
) -> None:
    sends = list(chunk_adds("b1", queued(*range(count), size=size), max_send_bytes))
    assert [len(s.entry_ids) for s in sends] == expected_lengths
    assert [e for s in sends for e in s.entry_ids] == list(range(count))


# -- merging the sends of many writers into one request -----------------------------------


def send_of(bookie_id: str, ledger_id: int, *entry_ids: int):
    items = tuple(AddItem(0, KEY, b"%d/%d" % (ledger_id, e)) for e in entry_ids)
    return SendAdds(bookie_id, entry_ids, items)


def test_merged_sends_are_answered_each_with_its_own_results_in_order() -> None:

    sends = [send_of("b1", 7, 0, 1), send_of("b1", 8, 5), send_of("b1", 7, 2)]
    items = merge_sends(sends)
    assert [i.frame for i in items] == [b"7/0", b"7/1", b"8/5", b"7/2"]
    results = [
        AddResult(7, 0, BookieStatus.OK),
        AddResult(7, 1, BookieStatus.FENCED),
        AddResult(8, 5, BookieStatus.OK),
        AddResult(7, 2, BookieStatus.OK),
    ]
    replies = split_add_reply(sends, BookieStatus.OK, results)
    assert [r.entry_ids for r in replies] == [(0, 1), (5,), (2,)]
    assert [r.results for r in replies] == [tuple(results[:2]), (results[2],), (results[3],)]
    assert {r.status for r in replies} == {BookieStatus.OK}


@pytest.mark.parametrize(
    "status, results, expected",
    [
        # A refusal of the whole request: each send gets the refusal.
        ("READ_ONLY", 0, "READ_ONLY"),
        # A reply that breaks one-result-per-item: nothing in it is trusted.
        ("OK", 2, "IO_ERROR"),
        ("OK", 4, "IO_ERROR"),
    ],
)
def test_a_merged_reply_that_cannot_be_split_fails_every_send(
    status: str, results: int, expected: str
) -> None:

    sends = [send_of("b1", 7, 0, 1), send_of("b1", 8, 5)]
    answer = [AddResult(7, e, BookieStatus.OK) for e in range(results)]
    replies = split_add_reply(sends, BookieStatus[status], answer)
    assert [(r.entry_ids, r.status, r.results) for r in replies] == [
        ((0, 1), BookieStatus[expected], ()),
        ((5,), BookieStatus[expected], ()),
    ]
