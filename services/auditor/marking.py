"""How the auditor marks ledgers under-replicated, and walks every ledger to decide which."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from shared.autorecovery import MarkDecision, MarkReason, bookies_to_mark
from shared.events import EventPublisher
from shared.metaclient import MetadataClient, MetadataError
from shared.models import LedgerMetadata, MetaErrorCode

log = logging.getLogger(__name__)

LEDGER_PAGE_SIZE = 100


class Marker:
    """Marks through metadata `urq.mark` (which publishes `ledger.underreplicated`), each
    mark also an `autorecovery.marked` event with its reason. `require_leader` raises
    unless this auditor leads: it is called before every mark."""

    def __init__(
        self,
        meta: MetadataClient,
        events: EventPublisher,
        require_leader: Callable[[], None],
    ) -> None:
        self._meta = meta
        self._events = events
        self.require_leader = require_leader
        self.marks = 0  # ledgers this auditor marked
        self.marks_by_reason: dict[str, int] = {}

    async def mark(self, decision: MarkDecision) -> bool:
        """Mark one ledger; False if it no longer exists."""
        self.require_leader()
        bookie_ids = list(decision.bookie_ids)
        try:
            await self._meta.mark_underreplicated(decision.ledger_id, bookie_ids)
        except MetadataError as exc:
            if exc.code is MetaErrorCode.NO_SUCH_LEDGER:
                return False
            raise
        self.marks += 1
        reason = decision.reason.value
        self.marks_by_reason[reason] = self.marks_by_reason.get(reason, 0) + 1
        log.info(
            "ledger marked under-replicated",
            extra={"ledger_id": decision.ledger_id, "bookies": bookie_ids, "reason": reason},
        )
        self._events.emit(
            "autorecovery.marked",
            ledger_id=decision.ledger_id,
            bookie_id=bookie_ids[0],
            bookie_ids=bookie_ids,
            reason=reason,
        )
        return True

    async def ledgers(self) -> AsyncIterator[list[LedgerMetadata]]:
        """Every ledger, a page at a time."""
        after: int | None = None
        while True:
            page = await self._meta.list_ledgers(after=after, limit=LEDGER_PAGE_SIZE)
            yield page.ledgers
            if page.next_after is None:
                return
            after = page.next_after

    async def mark_ledgers_on(self, bookie_ids: set[str], reason: MarkReason) -> int:
        """Mark every ledger whose segments name any of `bookie_ids`, naming those of them it
        holds; how many ledgers were marked."""
        marked = 0
        if not bookie_ids:
            return marked
        async for page in self.ledgers():
            for metadata in page:
                named = bookies_to_mark(metadata, bookie_ids)
                if named and await self.mark(
                    MarkDecision(metadata.ledger_id, tuple(named), reason)
                ):
                    marked += 1
        return marked

    async def needed(self, bookie_id: str) -> bool:
        """Whether any ledger's segments still name `bookie_id`."""
        async for page in self.ledgers():
            if any(bookies_to_mark(metadata, {bookie_id}) for metadata in page):
                return True
        return False
