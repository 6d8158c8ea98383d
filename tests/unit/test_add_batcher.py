"""The client's per-bookie add batcher answers every send exactly once, whatever ends its
request: an answer, an unreachable bookie, or a cancellation before the request ever ran."""

from __future__ import annotations

import asyncio

from shared.protocol.driver import BookieAddBatcher, ProtocolObserver
from shared.protocol.messages import AddSendFailed, SendAdds
from shared.status import BookieStatus
from shared.wire import AddItem, AddResult

KEY = b"k" * 20


class Bookies:
    """A transport whose adds wait until released, and whose bookies may be gone."""

    max_send_bytes = 1 << 20

    def __init__(self) -> None:
        self.requests: list[tuple[str, int]] = []
        self.release = asyncio.Event()
        self.there = True

    async def add(self, bookie_id, items, traced=()):
        self.requests.append((bookie_id, len(items)))
        await self.release.wait()
        return BookieStatus.OK, [AddResult(1, i, BookieStatus.OK) for i in range(len(items))]

    async def has_responder(self, bookie_id: str) -> bool:
        return self.there


def send(entry_id: int) -> SendAdds:
    return SendAdds("b1", (entry_id,), (AddItem(0, KEY, b"%d" % entry_id),))


async def answers_of(batcher: BookieAddBatcher, sends: list[SendAdds], after_submit) -> list:
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in sends]
    for command, future in zip(sends, futures, strict=True):
        batcher.submit(command, future.set_result)
    after_submit()
    return await asyncio.wait_for(asyncio.gather(*futures), timeout=10)


async def test_a_request_cancelled_before_it_ran_still_answers_and_frees_its_slot() -> None:
    bookies = Bookies()
    batcher = BookieAddBatcher(bookies, ProtocolObserver(), max_requests_per_bookie=1)
    loop = asyncio.get_running_loop()
    # close() runs in the same turn as the flush that creates the request's task, after
    # it: the task is cancelled before its first step, so its body (and finally) never run.
    replies = await answers_of(batcher, [send(0), send(1)], lambda: loop.call_soon(batcher.close))
    assert bookies.requests == []  # it never ran
    assert all(isinstance(r, AddSendFailed) for r in replies), replies
    assert batcher.quiet


async def test_a_request_answered_normally_is_answered_once() -> None:
    bookies = Bookies()
    bookies.release.set()
    batcher = BookieAddBatcher(bookies, ProtocolObserver(), max_requests_per_bookie=1)
    replies = await answers_of(batcher, [send(0), send(1)], lambda: None)
    assert bookies.requests == [("b1", 2)]  # merged into one request
    assert [r.status for r in replies] == [BookieStatus.OK, BookieStatus.OK]
    await asyncio.sleep(0)  # let the done callbacks run: they must not answer again
    assert batcher.quiet and batcher._in_flight == {"b1": 0}


async def test_a_gone_bookie_fails_what_was_in_flight_and_later_sends_go_out() -> None:
    bookies = Bookies()
    bookies.there = False
    batcher = BookieAddBatcher(
        bookies, ProtocolObserver(), max_requests_per_bookie=1, probe_after_ms=10
    )
    replies = await answers_of(batcher, [send(0)], lambda: None)
    assert isinstance(replies[0], AddSendFailed) and "gone" in replies[0].reason
    bookies.there = True
    bookies.release.set()
    replies = await answers_of(batcher, [send(1)], lambda: None)  # its slot was freed
    assert replies[0].status == BookieStatus.OK


class NowaitBookies(Bookies):
    """A transport with `add_nowait` (as BookieClient): the answers wait until `answer`."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list = []  # (bookie id, item count, callback, stopped flag)

    def add_nowait(self, bookie_id, items, on_answer):
        entry = [bookie_id, len(items), on_answer, False]
        self.waiting.append(entry)

        def stop() -> None:
            entry[3] = True

        return stop

    def answer_all(self) -> None:
        for _, count, on_answer, stopped in self.waiting:
            if not stopped:
                on_answer(
                    (BookieStatus.OK, [AddResult(1, i, BookieStatus.OK) for i in range(count)])
                )
        self.waiting.clear()


async def test_add_nowait_answers_each_send_once_without_a_task() -> None:
    bookies = NowaitBookies()
    batcher = BookieAddBatcher(bookies, ProtocolObserver(), max_requests_per_bookie=1)
    replies = await answers_of(
        batcher,
        [send(0), send(1)],
        lambda: asyncio.get_running_loop().call_soon(bookies.answer_all),
    )
    assert bookies.requests == []  # `add` was never awaited
    assert [r.status for r in replies] == [BookieStatus.OK, BookieStatus.OK]
    assert batcher.quiet and batcher._in_flight == {"b1": 0}


async def test_add_nowait_gone_bookie_stops_the_wait_and_fails_its_sends() -> None:
    bookies = NowaitBookies()
    bookies.there = False
    batcher = BookieAddBatcher(
        bookies, ProtocolObserver(), max_requests_per_bookie=1, probe_after_ms=10
    )
    replies = await answers_of(batcher, [send(0)], lambda: None)
    assert isinstance(replies[0], AddSendFailed) and "gone" in replies[0].reason
    assert bookies.waiting[0][3]  # stopped: a late answer would not come through
    bookies.answer_all()
    assert batcher.quiet and batcher._in_flight == {"b1": 0}


async def test_add_nowait_close_fails_what_is_in_flight() -> None:
    bookies = NowaitBookies()
    batcher = BookieAddBatcher(bookies, ProtocolObserver(), max_requests_per_bookie=1)
    loop = asyncio.get_running_loop()
    replies = await answers_of(
        batcher, [send(0), send(1)], lambda: loop.call_soon(loop.call_soon, batcher.close)
    )
    assert all(isinstance(r, AddSendFailed) for r in replies), replies
    assert bookies.waiting and all(stopped for *_, stopped in bookies.waiting)
    assert batcher.quiet
