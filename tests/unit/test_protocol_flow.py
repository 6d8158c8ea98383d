"""The writer's flow control per bookie (shared/protocol/flow.py), on its own: what goes out,
what is held, what an answer releases. The writer's use of it is in test_protocol_writer.py."""

from __future__ import annotations

import pytest

from shared.protocol.flow import MAX_ITEMS_PER_SEND, AddFlowControl, chunk_adds
from shared.wire import AddItem

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
