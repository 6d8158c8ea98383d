"""`InMemoryMetadataStore`: the store contract (services/metadata/store.py) kept in memory.

The contract suite (tests/integration/test_metadata_contract.py) runs against it and
against PostgreSQL alike; the outbox is a list and its publisher's lock an asyncio.Lock.
"""

from __future__ import annotations

import asyncio
import bisect
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from services.metadata import core
from services.metadata.core import LedgerChange, OutboxRecord
from services.metadata.store import (
    MAX_BOOKIES_LISTED,
    BadVersion,
    BookieAlive,
    BookieRegistration,
    CookieBadVersion,
    LedgerClosedError,
    LedgerExists,
    NoSuchCookie,
    NoSuchLedger,
)
from shared.models import (
    NO_VERSION,
    BookieInfo,
    BookieState,
    ClusterSettings,
    Cookie,
    CreateLedgerRequest,
    DeleteCookieRequest,
    Leadership,
    LedgerMetadata,
    LedgerRangesReply,
    ListLedgersReply,
    ListUnderreplicatedReply,
    MarkUnderreplicatedRequest,
    PutCookieRequest,
    RegisterBookieRequest,
    SetClusterSettingsRequest,
    UnderreplicatedLedger,
    UpdateLedgerRequest,
)


class InMemoryMetadataStore:
    """The same contract in memory, for tests that need no PostgreSQL. Each operation runs
    without awaiting between its read and its write, so it is atomic like a PostgreSQL
    statement; it yields once first, so that concurrent callers interleave."""

    def __init__(self, instance_id: str | None = None) -> None:
        self._instance_id = instance_id or str(uuid.uuid4())
        self._ledgers: dict[int, LedgerMetadata] = {}
        # The ledgers' ids in order, so that a page is found by bisection, as PostgreSQL
        # finds it in its primary key: a page costs the same wherever it is.
        self._ledger_ids: list[int] = []
        self._next_ledger_id = 0  # the sequence: only moves forward
        self._bookies: dict[str, tuple[BookieState, int, int, dict[str, Any]]] = {}
        self._cookies: dict[str, Cookie] = {}
        self._settings: dict[str, Any] = {}
        self._urq: dict[int, UnderreplicatedLedger] = {}
        self._election = Leadership(leader_id=None, term=0, lease_expires_at=0)
        self._outbox: list[OutboxRecord] = []
        self._next_outbox_id = 1
        self._outbox_lock = asyncio.Lock()

    async def _enter(self) -> None:
        await asyncio.sleep(0)

    def _record(
        self,
        kind: str,
        data: dict[str, Any],
        now_ms: int,
        ledger_id: int | None = None,
        bookie_id: str | None = None,
    ) -> None:
        self._outbox.append(
            OutboxRecord(self._next_outbox_id, kind, ledger_id, bookie_id, data, now_ms)
        )
        self._next_outbox_id += 1

    async def close(self) -> None:
        pass

    # -- ledgers --------------------------------------------------------------------------

    async def create_ledger(self, request: CreateLedgerRequest, ctime_ms: int) -> LedgerMetadata:
        await self._enter()
        if request.ledger_id is not None:
            existing = self._ledgers.get(request.ledger_id)
            if existing is not None:
                if core.is_own_create(existing, request):
                    return existing
                raise LedgerExists(f"ledger {request.ledger_id} exists")
            ledger_id = request.ledger_id
        else:
            while self._next_ledger_id in self._ledgers:
                self._next_ledger_id += 1
            ledger_id = self._next_ledger_id
            self._next_ledger_id += 1
        meta = core.new_ledger(request, ledger_id, ctime_ms)
        self._ledgers[ledger_id] = meta
        bisect.insort(self._ledger_ids, ledger_id)
        self._record(
            core.LEDGER_CREATED, {"metadata": meta.model_dump(mode="json")}, ctime_ms, ledger_id
        )
        return meta

    async def get_ledger(self, ledger_id: int) -> LedgerMetadata:
        await self._enter()
        meta = self._ledgers.get(ledger_id)
        if meta is None:
            raise NoSuchLedger(f"no ledger {ledger_id}")
        return meta

    def _ids_after(self, after: int | None, limit: int) -> list[int]:
        first = bisect.bisect_right(self._ledger_ids, core.list_start(after))
        return self._ledger_ids[first : first + core.list_fetch_limit(limit)]

    async def list_ledgers(self, after: int | None, limit: int) -> ListLedgersReply:
        await self._enter()
        page, next_after = core.list_page(self._ids_after(after, limit), limit, key=int)
        return ListLedgersReply(ledgers=[self._ledgers[i] for i in page], next_after=next_after)

    async def ledger_ranges(self, after: int | None, limit: int) -> LedgerRangesReply:
        await self._enter()
        page, next_after = core.list_page(self._ids_after(after, limit), limit, key=int)
        return LedgerRangesReply(ranges=core.id_runs(page), next_after=next_after)

    async def update_ledger(self, request: UpdateLedgerRequest, now_ms: int) -> LedgerChange:
        await self._enter()
        current = self._ledgers.get(request.ledger_id)
        if current is None:
            raise NoSuchLedger(f"no ledger {request.ledger_id}")
        if current.version != request.expected_version:
            raise BadVersion(
                f"ledger {request.ledger_id} is at version {current.version}, "
                f"not {request.expected_version}",
                current,
            )
        violation = core.closed_ledger_violation(current, request)
        if violation:
            raise LedgerClosedError(violation)
        changes: dict[str, Any] = {"version": current.version + 1}
        for name in ("state", "last_entry_id", "length", "segments"):
            value = getattr(request, name)
            if value is not None:
                changes[name] = value
        updated = current.model_copy(update=changes)
        self._ledgers[request.ledger_id] = updated
        change = LedgerChange(
            metadata=updated,
            previous_state=current.state,
            segments_changed=updated.segments != current.segments,
        )
        self._record(
            core.LEDGER_CHANGED,
            {
                "metadata": updated.model_dump(mode="json"),
                "previous_state": current.state.value,
                "segments_changed": change.segments_changed,
            },
            now_ms,
            request.ledger_id,
        )
        return change

    async def delete_ledger(self, ledger_id: int, now_ms: int) -> None:
        await self._enter()
        if self._ledgers.pop(ledger_id, None) is None:
            raise NoSuchLedger(f"no ledger {ledger_id}")
        del self._ledger_ids[bisect.bisect_left(self._ledger_ids, ledger_id)]
        self._urq.pop(ledger_id, None)  # as the foreign key cascades
        self._record(core.LEDGER_DELETED, {}, now_ms, ledger_id)

    # -- bookies --------------------------------------------------------------------------

    def _bookie(self, bookie_id: str, now_ms: int) -> BookieInfo:
        state, last_seen, expires, info = self._bookies[bookie_id]
        return BookieInfo(
            bookie_id=bookie_id,
            state=core.bookie_state(state, expires, now_ms),
            last_seen=last_seen,
            lease_expires_at=expires,
            info=info,
        )

    async def register_bookie(
        self, request: RegisterBookieRequest, now_ms: int, lease_ms: int
    ) -> BookieRegistration:
        await self._enter()
        previous = None
        if request.bookie_id in self._bookies:
            previous = self._bookie(request.bookie_id, now_ms).state
        expires = core.lease_expiry_ms(now_ms, lease_ms)
        self._bookies[request.bookie_id] = (request.state, now_ms, expires, dict(request.info))
        info = self._bookie(request.bookie_id, now_ms)
        for event in core.bookie_events(info, previous):
            self._record(event.kind, event.data, now_ms, bookie_id=request.bookie_id)
        return BookieRegistration(info=info, previous_state=previous)

    async def unregister_bookie(self, bookie_id: str, now_ms: int) -> BookieInfo | None:
        await self._enter()
        if bookie_id not in self._bookies:
            return None
        state, last_seen, expires, info = self._bookies[bookie_id]
        self._bookies[bookie_id] = (state, last_seen, min(expires, now_ms), info)
        self._record("bookie.unregistered", {}, now_ms, bookie_id=bookie_id)
        return self._bookie(bookie_id, now_ms)

    async def remove_bookie(self, bookie_id: str, now_ms: int) -> None:
        await self._enter()
        if bookie_id not in self._bookies:
            return
        state, last_seen, expires, _ = self._bookies[bookie_id]
        if not core.lease_expired(expires, now_ms):
            raise BookieAlive(
                f"bookie {bookie_id} is registered {state.value} until {expires}: "
                "stop it before removing it"
            )
        del self._bookies[bookie_id]
        self._record(
            "bookie.removed",
            {"last_seen": last_seen, "lease_expires_at": expires},
            now_ms,
            bookie_id=bookie_id,
        )

    async def list_bookies(self, now_ms: int) -> list[BookieInfo]:
        await self._enter()
        return [self._bookie(b, now_ms) for b in sorted(self._bookies)[:MAX_BOOKIES_LISTED]]

    async def get_cookie(self, bookie_id: str) -> Cookie:
        await self._enter()
        return self._cookies.get(
            bookie_id, Cookie(bookie_id=bookie_id, data=None, version=NO_VERSION)
        )

    def _cookie_bad_version(self, bookie_id: str, expected: int) -> CookieBadVersion:
        current = self._cookies.get(
            bookie_id, Cookie(bookie_id=bookie_id, data=None, version=NO_VERSION)
        )
        return CookieBadVersion(
            f"cookie of {bookie_id} is at version {current.version}, not {expected}", current
        )

    async def put_cookie(self, request: PutCookieRequest, now_ms: int) -> Cookie:
        await self._enter()
        current = self._cookies.get(request.bookie_id)
        stored_version = NO_VERSION if current is None else current.version
        if stored_version != request.expected_version:
            raise self._cookie_bad_version(request.bookie_id, request.expected_version)
        cookie = Cookie(bookie_id=request.bookie_id, data=request.data, version=stored_version + 1)
        self._cookies[request.bookie_id] = cookie
        self._record(
            "bookie.cookie_written",
            {"version": cookie.version},
            now_ms,
            bookie_id=request.bookie_id,
        )
        return cookie

    async def delete_cookie(self, request: DeleteCookieRequest, now_ms: int) -> None:
        await self._enter()
        current = self._cookies.get(request.bookie_id)
        if current is None:
            raise NoSuchCookie(f"no cookie for {request.bookie_id}")
        if current.version != request.expected_version:
            raise self._cookie_bad_version(request.bookie_id, request.expected_version)
        del self._cookies[request.bookie_id]
        self._record(
            "bookie.cookie_deleted",
            {"version": current.version},
            now_ms,
            bookie_id=request.bookie_id,
        )

    # -- cluster --------------------------------------------------------------------------

    async def instance_id(self) -> str:
        await self._enter()
        return self._instance_id

    async def get_cluster_settings(self) -> ClusterSettings:
        await self._enter()
        return core.cluster_settings(self._settings)

    async def set_cluster_settings(
        self, request: SetClusterSettingsRequest, now_ms: int
    ) -> ClusterSettings:
        await self._enter()
        changes = core.settings_changes(request)
        if changes:
            self._settings.update(changes)
            self._record("cluster.settings_changed", changes, now_ms)
        return core.cluster_settings(self._settings)

    # -- under-replication ----------------------------------------------------------------

    async def mark_underreplicated(
        self, request: MarkUnderreplicatedRequest, now_ms: int
    ) -> UnderreplicatedLedger:
        await self._enter()
        if request.ledger_id not in self._ledgers:
            raise NoSuchLedger(f"no ledger {request.ledger_id}")
        current = self._urq.get(request.ledger_id)
        if current is None:
            marked = UnderreplicatedLedger(
                ledger_id=request.ledger_id,
                missing_bookies=core.missing_bookies(request.missing_bookies),
                mark_version=1,
                marked_at=now_ms,
            )
        else:
            marked = core.merge_mark(current, request.missing_bookies)
        self._urq[request.ledger_id] = marked
        if current is None or marked.mark_version != current.mark_version:
            self._record(
                "ledger.underreplicated",
                {"missing_bookies": marked.missing_bookies, "mark_version": marked.mark_version},
                now_ms,
                request.ledger_id,
            )
        return marked

    async def claim_underreplicated(
        self, worker_id: str, lease_ms: int, now_ms: int
    ) -> UnderreplicatedLedger | None:
        await self._enter()
        if not core.cluster_settings(self._settings).autorecovery_enabled:
            return None
        candidates = [u for u in self._urq.values() if core.claimable(u, now_ms)]
        if not candidates:
            return None
        chosen = min(candidates, key=lambda u: (u.marked_at, u.ledger_id))
        claimed = chosen.model_copy(
            update={"claimed_by": worker_id, "claim_expires_at": now_ms + lease_ms}
        )
        self._urq[chosen.ledger_id] = claimed
        return claimed

    def _held_by(self, ledger_id: int, worker_id: str) -> UnderreplicatedLedger | None:
        current = self._urq.get(ledger_id)
        return current if current is not None and current.claimed_by == worker_id else None

    async def renew_underreplicated(
        self, ledger_id: int, worker_id: str, lease_ms: int, now_ms: int
    ) -> bool:
        await self._enter()
        held = self._held_by(ledger_id, worker_id)
        if held is None:
            return False
        self._urq[ledger_id] = held.model_copy(update={"claim_expires_at": now_ms + lease_ms})
        return True

    async def release_underreplicated(self, ledger_id: int, worker_id: str) -> bool:
        await self._enter()
        held = self._held_by(ledger_id, worker_id)
        if held is None:
            return False
        self._urq[ledger_id] = held.model_copy(
            update={"claimed_by": None, "claim_expires_at": None}
        )
        return True

    async def mark_replicated(
        self, ledger_id: int, worker_id: str, mark_version: int | None, now_ms: int
    ) -> bool:
        await self._enter()
        held = self._held_by(ledger_id, worker_id)
        if held is None:
            return False
        if mark_version is not None and mark_version != held.mark_version:
            self._urq[ledger_id] = held.model_copy(
                update={"claimed_by": None, "claim_expires_at": None}
            )
            return False
        del self._urq[ledger_id]
        self._record("ledger.replicated", {"mark_version": held.mark_version}, now_ms, ledger_id)
        return True

    async def list_underreplicated(self, after: int | None, limit: int) -> ListUnderreplicatedReply:
        await self._enter()
        start = core.list_start(after)
        ids = sorted(i for i in self._urq if i > start)[: core.list_fetch_limit(limit)]
        page, next_after = core.list_page(ids, limit, key=int)
        return ListUnderreplicatedReply(ledgers=[self._urq[i] for i in page], next_after=next_after)

    # -- auditor election -----------------------------------------------------------------

    async def elect_auditor(self, candidate_id: str, lease_ms: int, now_ms: int) -> Leadership:
        await self._enter()
        won = core.elect(self._election, candidate_id, now_ms, lease_ms)
        if won is not None:
            if won.term != self._election.term:
                self._record(
                    "auditor.elected", {"leader_id": candidate_id, "term": won.term}, now_ms
                )
            self._election = won.model_copy(update={"is_leader": False})
        return core.leadership_seen_by(self._election, candidate_id, now_ms)

    async def renew_auditor(self, candidate_id: str, lease_ms: int, now_ms: int) -> Leadership:
        await self._enter()
        held = self._election
        if held.leader_id == candidate_id and not core.lease_expired(held.lease_expires_at, now_ms):
            self._election = held.model_copy(
                update={"lease_expires_at": core.lease_expiry_ms(now_ms, lease_ms)}
            )
        return core.leadership_seen_by(self._election, candidate_id, now_ms)

    async def resign_auditor(self, candidate_id: str, now_ms: int) -> Leadership:
        await self._enter()
        held = self._election
        if held.leader_id == candidate_id:
            self._election = held.model_copy(
                update={"lease_expires_at": min(held.lease_expires_at, now_ms)}
            )
        return core.leadership_seen_by(self._election, candidate_id, now_ms)

    async def who_is_auditor(self, now_ms: int) -> Leadership:
        await self._enter()
        return core.leadership_seen_by(self._election, None, now_ms)

    # -- outbox ---------------------------------------------------------------------------

    @asynccontextmanager
    async def outbox(self) -> AsyncIterator[InMemoryOutboxReader | None]:
        if self._outbox_lock.locked():
            yield None
            return
        async with self._outbox_lock:
            yield InMemoryOutboxReader(self)


class InMemoryOutboxReader:
    def __init__(self, store: InMemoryMetadataStore) -> None:
        self._store = store
        self.instance_id = store._instance_id

    async def fetch(self, limit: int, published: Sequence[OutboxRecord] = ()) -> list[OutboxRecord]:
        if published:
            await self.mark_published(published)
        await self._store._enter()
        return list(self._store._outbox[:limit])

    async def mark_published(self, records: Sequence[OutboxRecord]) -> None:
        await self._store._enter()
        done = {r.outbox_id for r in records}
        self._store._outbox = [r for r in self._store._outbox if r.outbox_id not in done]
