"""Flow control of one writer's add requests, per bookie. Pure: no IO, no clock.

At most `max_requests_per_bookie` SendAdds go unanswered per bookie (None: no bound). The
driver answers each SendAdds with exactly one BookieAddReply or AddSendFailed, and the
writer reports each answer here (`answered`); meanwhile further sends to that bookie are
held, and on its next answer everything held for it goes out merged with what is queued
then (`chunk_adds`). Under a trickle of appends (a rate, not a burst) every append would
otherwise be a message of its own to each bookie, and the per-message cost (client, NATS,
three journals) saturated the machine at half the entries/s that batches reach; held sends
go out together, so batches form by themselves as load grows, with no added wait when a
bookie is idle. The writer's add timeouts run meanwhile; a broken writer drops what was
held (`clear`): its adds have failed.

The same holds across writers: a client with thousands of ledgers, each adding a trickle,
would send each ledger's adds to a bookie as a request of its own. `merge_sends` and
`split_add_reply` let a driver send the sends of many writers to one bookie as one
request and give each writer its own answer (BookKeeper's per-bookie channel, which
pipelines the adds of every ledger of a client).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shared.protocol.messages import BookieAddReply, SendAdds
from shared.status import BookieStatus
from shared.wire import AddItem, AddResult

# Bounds on what one SendAdds carries.
MAX_ITEMS_PER_SEND = 4096
DEFAULT_MAX_SEND_BYTES = 1024 * 1024
# gateway.max_add_requests_per_bookie's default (shared.config), which the simulator runs too.
DEFAULT_MAX_ADD_REQUESTS_PER_BOOKIE = 2

Queued = list[tuple[int, AddItem]]  # (entry id, item) waiting to go to one bookie


class AddFlowControl:
    """Turns a writer's queued adds into SendAdds, holding back what would pass the bound."""

    def __init__(self, max_requests_per_bookie: int | None, max_send_bytes: int) -> None:
        assert max_requests_per_bookie is None or max_requests_per_bookie >= 1
        self.max_requests_per_bookie = max_requests_per_bookie
        self.max_send_bytes = max_send_bytes
        self._in_flight: dict[str, int] = {}  # SendAdds awaiting their answer
        self._held: dict[str, list[SendAdds]] = {}  # sends held back meanwhile
        self._released: dict[str, Queued] = {}  # what an answer released: out next
        self.requests_sent = 0  # every SendAdds handed to the driver
        self.sends_held = 0  # every SendAdds held back (and later merged)

    def sends(self, outbox: dict[str, Queued]) -> list[SendAdds]:
        """The SendAdds to hand to the driver now, for what was released and what is queued
        in `outbox` (which this empties)."""
        sends: list[SendAdds] = []
        for bookie_id, released in self._released.items():
            # An answer came: what was held goes out merged with what is queued now.
            merged = [*released, *outbox.pop(bookie_id, [])]
            sends.extend(self._sent(s) for s in chunk_adds(bookie_id, merged, self.max_send_bytes))
        self._released.clear()
        for bookie_id, queued in outbox.items():
            for send in chunk_adds(bookie_id, queued, self.max_send_bytes):
                if self._at_limit(bookie_id):
                    self._held.setdefault(bookie_id, []).append(send)
                    self.sends_held += 1
                else:
                    sends.append(self._sent(send))
        outbox.clear()
        return sends

    @property
    def has_released(self) -> bool:
        """Something an answer released waits to go out (`sends`)."""
        return bool(self._released)

    def answered(self, bookie_id: str) -> None:
        """One SendAdds to the bookie was answered: what was held for it is released. A
        stray answer (no SendAdds of this writer is out to that bookie) changes nothing."""
        in_flight = self._in_flight.get(bookie_id, 0)
        if in_flight == 0:
            return
        self._in_flight[bookie_id] = in_flight - 1
        held = self._held.pop(bookie_id, None)
        if held:
            released = self._released.setdefault(bookie_id, [])
            for send in held:
                released.extend(zip(send.entry_ids, send.items, strict=True))

    def clear(self) -> None:
        """Drop everything held or released (the writer broke: those adds have failed)."""
        self._held.clear()
        self._released.clear()

    def _at_limit(self, bookie_id: str) -> bool:
        limit = self.max_requests_per_bookie
        return limit is not None and self._in_flight.get(bookie_id, 0) >= limit

    def _sent(self, send: SendAdds) -> SendAdds:
        self._in_flight[send.bookie_id] = self._in_flight.get(send.bookie_id, 0) + 1
        self.requests_sent += 1
        return send


def chunk_adds(bookie_id: str, queued: Queued, max_send_bytes: int) -> Iterable[SendAdds]:
    """Split one bookie's queue into sends under max_send_bytes (one oversized item alone)."""
    start, size = 0, 0
    for i, (_, item) in enumerate(queued):
        item_size = len(item.frame) + 32
        if i > start and (size + item_size > max_send_bytes or i - start >= MAX_ITEMS_PER_SEND):
            yield _send(bookie_id, queued[start:i])
            start, size = i, 0
        size += item_size
    if start < len(queued):
        yield _send(bookie_id, queued[start:])


def _send(bookie_id: str, queued: Queued) -> SendAdds:
    return SendAdds(bookie_id, tuple(e for e, _ in queued), tuple(i for _, i in queued))


# -- one request for the adds of many writers ---------------------------------------------


def send_size(command: SendAdds) -> int:
    """The bytes `chunk_adds` counts for a send."""
    return sum(len(item.frame) + 32 for item in command.items)


def merge_sends(commands: Sequence[SendAdds]) -> list[AddItem]:
    """The items of several writers' sends to one bookie, as one add request, in order."""
    return [item for command in commands for item in command.items]


def split_add_reply(
    commands: Sequence[SendAdds], status: BookieStatus, results: Sequence[AddResult]
) -> list[BookieAddReply]:
    """One merged request's answer as each send's own answer. A bookie answers one result
    per item, in order; an answer that does not (a refusal of the whole request, or one
    that breaks that rule) gives each send no results, which its writer counts as that
    bookie's failure for each of its entries."""
    total = sum(len(command.items) for command in commands)
    if status is not BookieStatus.OK or len(results) != total:
        failed = status if status is not BookieStatus.OK else BookieStatus.IO_ERROR
        return [BookieAddReply(c.bookie_id, c.entry_ids, failed, ()) for c in commands]
    replies, start = [], 0
    for command in commands:
        end = start + len(command.items)
        replies.append(
            BookieAddReply(command.bookie_id, command.entry_ids, status, tuple(results[start:end]))
        )
        start = end
    return replies
