"""The metadata service's pure decisions: bookie state from leases, list pagination,
update checks, which events a change produces, how a bad request is described.

No IO, no clock: time comes in as `now_ms`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from shared.models import (
    METADATA_FORMAT_VERSION,
    BookieInfo,
    BookieState,
    ClusterSettings,
    CreateLedgerRequest,
    Leadership,
    LedgerMetadata,
    LedgerState,
    LedgerWatchEvent,
    RegisterBookieRequest,
    Segment,
    SetClusterSettingsRequest,
    UnderreplicatedLedger,
    UpdateLedgerRequest,
)

T = TypeVar("T")

# How many validation errors a BAD_REQUEST message lists before it stops.
MAX_REPORTED_ERRORS = 5


class InvalidRequest(ValueError):
    """A well-formed request that asks for something the metadata cannot hold."""


# -- bookies ------------------------------------------------------------------------------


def lease_expired(lease_expires_at_ms: int, now_ms: int) -> bool:
    """A lease that expires at T no longer holds at T."""
    return lease_expires_at_ms <= now_ms


def bookie_state(declared: BookieState, lease_expires_at_ms: int, now_ms: int) -> BookieState:
    """What the cluster should believe: the declared state while the lease holds, else lost."""
    return BookieState.LOST if lease_expired(lease_expires_at_ms, now_ms) else declared


def lease_expiry_ms(now_ms: int, lease_ms: int) -> int:
    return now_ms + lease_ms


def check_registration(request: RegisterBookieRequest) -> None:
    if request.state is BookieState.LOST:
        raise InvalidRequest(
            "a bookie registers as writable or readonly; lost is what an expired lease means"
        )


def registration_is_news(previous: BookieState | None, current: BookieState) -> bool:
    """A first registration or a change of state (including coming back from lost) is an
    event; a heartbeat that changes nothing is not."""
    return previous is None or previous != current


# -- ledgers ------------------------------------------------------------------------------


def new_ledger(request: CreateLedgerRequest, ledger_id: int, ctime_ms: int) -> LedgerMetadata:
    """A ledger as it is born: OPEN, version 0, one segment from entry 0 on its ensemble."""
    return LedgerMetadata(
        ledger_id=ledger_id,
        state=LedgerState.OPEN,
        ensemble_size=request.ensemble_size,
        write_quorum=request.write_quorum,
        ack_quorum=request.ack_quorum,
        digest=request.digest,
        last_entry_id=None,
        length=0,
        version=0,
        ctime=ctime_ms,
        metadata=dict(request.metadata),
        segments=[Segment(first_entry_id=0, bookies=list(request.ensemble))],
        password_salt=request.password_salt,
        password_hash=request.password_hash,
        format_version=METADATA_FORMAT_VERSION,
        creator_token=request.creator_token,
        master_key=request.master_key,
        mac_key=request.mac_key,
    )


def is_own_create(existing: LedgerMetadata, request: CreateLedgerRequest) -> bool:
    """A create retried after a lost reply finds the ledger it made itself: same creator
    token (BookKeeper's cToken), same shape. Without a token nobody can tell."""
    return (
        request.creator_token != 0
        and existing.creator_token == request.creator_token
        and existing.ensemble_size == request.ensemble_size
        and existing.write_quorum == request.write_quorum
        and existing.ack_quorum == request.ack_quorum
    )


def check_update(request: UpdateLedgerRequest) -> None:
    if request.segments is not None:
        check_segments(request.segments)


def closed_ledger_violation(stored: LedgerMetadata, request: UpdateLedgerRequest) -> str | None:
    """Why this update may not apply to a CLOSED ledger, or None. A closed ledger's last
    entry and length never change and it never reopens; its segments may change, so that
    re-replication can replace the bookies of a closed ledger, as BookKeeper's does."""
    if stored.state is not LedgerState.CLOSED:
        return None
    if request.state not in (None, LedgerState.CLOSED):
        return f"ledger {stored.ledger_id} is closed: it cannot become {request.state.value}"
    if request.last_entry_id not in (None, stored.last_entry_id):
        return f"ledger {stored.ledger_id} is closed at entry {stored.last_entry_id}"
    if request.length not in (None, stored.length):
        return f"ledger {stored.ledger_id} is closed with length {stored.length}"
    return None


def check_segments(segments: Sequence[Segment]) -> None:
    """The shape BookKeeper's ensembles map has: starts at entry 0, keys strictly
    increasing, no bookie twice in one ensemble."""
    if not segments:
        raise InvalidRequest("segments must not be empty")
    if segments[0].first_entry_id != 0:
        raise InvalidRequest("the first segment must start at entry 0")
    for before, after in zip(segments, segments[1:], strict=False):
        if after.first_entry_id <= before.first_entry_id:
            raise InvalidRequest("segments must start at strictly increasing entry ids")
    for segment in segments:
        if len(set(segment.bookies)) != len(segment.bookies):
            raise InvalidRequest(f"segment at entry {segment.first_entry_id} names a bookie twice")


@dataclass(frozen=True)
class LedgerChange:
    """A compare-and-set that won: the new metadata and what it replaced."""

    metadata: LedgerMetadata
    previous_state: LedgerState
    segments_changed: bool


@dataclass(frozen=True)
class EventSpec:
    kind: str
    data: dict[str, Any] = field(default_factory=dict)


def change_events(change: LedgerChange) -> list[EventSpec]:
    """ "ledger.closed" when the ledger becomes CLOSED, else "ledger.updated"."""
    meta = change.metadata
    common: dict[str, Any] = {
        "version": meta.version,
        "state": meta.state.value,
        "previous_state": change.previous_state.value,
    }
    if meta.state is LedgerState.CLOSED and change.previous_state is not LedgerState.CLOSED:
        return [
            EventSpec(
                "ledger.closed",
                {
                    **common,
                    "last_entry_id": meta.last_entry_id,
                    "length": meta.length,
                    "ensemble_changed": change.segments_changed,
                },
            )
        ]
    data = {**common, "ensemble_changed": change.segments_changed}
    if change.segments_changed:
        data["segments"] = [s.model_dump(mode="json") for s in meta.segments]
    return [EventSpec("ledger.updated", data)]


def bookie_events(info: BookieInfo, previous: BookieState | None) -> list[EventSpec]:
    if not registration_is_news(previous, info.state):
        return []
    return [
        EventSpec(
            "bookie.registered",
            {
                "state": info.state.value,
                "previous_state": previous.value if previous is not None else None,
                "lease_expires_at": info.lease_expires_at,
            },
        )
    ]


# -- the outbox: stored changes -> published events --------------------------------------

# Outbox row kinds whose events are built from the row; a row of any other kind is
# published as one event of that kind with the row's data.
LEDGER_CREATED = "ledger.created"
LEDGER_CHANGED = "ledger.changed"  # a won compare-and-set
LEDGER_DELETED = "ledger.deleted"


@dataclass(frozen=True)
class OutboxRecord:
    """A change as the store wrote it, in the transaction that made it."""

    outbox_id: int
    kind: str
    ledger_id: int | None
    bookie_id: str | None
    data: dict[str, Any]
    ts_ms: int


def outbox_events(record: OutboxRecord) -> tuple[list[EventSpec], LedgerWatchEvent | None]:
    """What to publish for a stored change: its events (for the event stream) and, for a
    ledger change, the notification its watchers get."""
    data = record.data
    if record.kind == LEDGER_CREATED:
        meta = LedgerMetadata.model_validate(data["metadata"])
        created = EventSpec(
            LEDGER_CREATED,
            {
                "ensemble_size": meta.ensemble_size,
                "write_quorum": meta.write_quorum,
                "ack_quorum": meta.ack_quorum,
                "digest": meta.digest.value,
                "ensemble": meta.segments[0].bookies,
                "ctime": meta.ctime,
            },
        )
        return [created], LedgerWatchEvent(ledger_id=meta.ledger_id, metadata=meta)
    if record.kind == LEDGER_CHANGED:
        meta = LedgerMetadata.model_validate(data["metadata"])
        change = LedgerChange(
            metadata=meta,
            previous_state=LedgerState(data["previous_state"]),
            segments_changed=bool(data["segments_changed"]),
        )
        return change_events(change), LedgerWatchEvent(ledger_id=meta.ledger_id, metadata=meta)
    if record.kind == LEDGER_DELETED:
        assert record.ledger_id is not None
        watch = LedgerWatchEvent(ledger_id=record.ledger_id, metadata=None)
        return [EventSpec(LEDGER_DELETED, {})], watch
    return [EventSpec(record.kind, dict(data))], None


def event_id(instance_id: str, outbox_id: int, index: int) -> str:
    """The Nats-Msg-Id: the same for every publish of the same change, whichever instance
    publishes it, and distinct across clusters (a recreated database restarts the ids)."""
    suffix = "" if index == 0 else f"-{index}"
    return f"{instance_id}-{outbox_id}{suffix}"


@dataclass
class OutboxCursor:
    """Decides which stored changes may be published now, in outbox id order.

    Ids come from a sequence: a row may commit after a higher id did. A gap after the
    last published id therefore waits until every transaction that was running when the
    gap was first seen has finished (the gap is then a rollback, or filled). A row that
    still commits below the cursor (possible only in that race) is published late rather
    than lost."""

    last_published_id: int
    # In-progress transaction ids when the current gap was first seen, and the first id
    # after the gap.
    gap_xids: frozenset[int] | None = None
    gap_next_id: int | None = None

    def publishable(self, ids: Sequence[int], in_progress_xids: frozenset[int]) -> int:
        """How many of `ids` (ascending, unpublished) may be published now."""
        expected = self.last_published_id + 1
        for count, outbox_id in enumerate(ids):
            if outbox_id < expected or outbox_id == expected:
                expected = max(expected, outbox_id + 1)
                continue
            if self._gap_over(outbox_id, in_progress_xids):
                expected = outbox_id + 1
                continue
            return count
        return len(ids)

    def _gap_over(self, next_id: int, in_progress_xids: frozenset[int]) -> bool:
        if self.gap_next_id != next_id or self.gap_xids is None:
            self.gap_next_id, self.gap_xids = next_id, in_progress_xids
            return not in_progress_xids
        if self.gap_xids & in_progress_xids:
            return False
        self.gap_next_id, self.gap_xids = None, None
        return True

    def published(self, ids: Sequence[int]) -> None:
        if ids:
            self.last_published_id = max(self.last_published_id, max(ids))


def snapshot_in_progress(snapshot: str) -> frozenset[int]:
    """The in-progress transaction ids of a PostgreSQL snapshot "xmin:xmax:xip,xip"."""
    xip = snapshot.split(":")[2]
    return frozenset(int(x) for x in xip.split(",") if x)


# -- the under-replication queue ----------------------------------------------------------


def missing_bookies(bookies: Sequence[str]) -> list[str]:
    """The stored form: sorted, each once."""
    return sorted(set(bookies))


def merge_mark(current: UnderreplicatedLedger, bookies: Sequence[str]) -> UnderreplicatedLedger:
    """Adding to an existing mark: the union of missing bookies; the mark version moves
    only if a bookie was added (a worker finishing an older mark must not clear it)."""
    merged = missing_bookies([*current.missing_bookies, *bookies])
    if merged == current.missing_bookies:
        return current
    return current.model_copy(
        update={"missing_bookies": merged, "mark_version": current.mark_version + 1}
    )


def claimable(ledger: UnderreplicatedLedger, now_ms: int) -> bool:
    return (
        ledger.claimed_by is None
        or ledger.claim_expires_at is None
        or lease_expired(ledger.claim_expires_at, now_ms)
    )


# -- auditor election ---------------------------------------------------------------------


def current_leader(leader_id: str | None, lease_expires_at_ms: int, now_ms: int) -> str | None:
    return None if leader_id is None or lease_expired(lease_expires_at_ms, now_ms) else leader_id


def elect(held: Leadership, candidate_id: str, now_ms: int, lease_ms: int) -> Leadership | None:
    """The candidate's win (a new term unless it already led), or None if another
    candidate holds an unexpired lease."""
    leader = current_leader(held.leader_id, held.lease_expires_at, now_ms)
    if leader is not None and leader != candidate_id:
        return None
    term = held.term if leader == candidate_id else held.term + 1
    return Leadership(
        leader_id=candidate_id,
        term=term,
        lease_expires_at=lease_expiry_ms(now_ms, lease_ms),
        is_leader=True,
    )


def leadership_seen_by(held: Leadership, candidate_id: str | None, now_ms: int) -> Leadership:
    """What a candidate (or anyone) is told: no leader once the lease lapsed."""
    leader = current_leader(held.leader_id, held.lease_expires_at, now_ms)
    return Leadership(
        leader_id=leader,
        term=held.term,
        lease_expires_at=held.lease_expires_at,
        is_leader=leader is not None and leader == candidate_id,
    )


# -- cluster settings ---------------------------------------------------------------------


def settings_changes(request: SetClusterSettingsRequest) -> dict[str, Any]:
    """The settings a request changes (None: unchanged)."""
    return request.model_dump(exclude_none=True)


def cluster_settings(stored: dict[str, Any]) -> ClusterSettings:
    """Stored values over the defaults; names no longer known are ignored."""
    known = ClusterSettings.model_fields.keys()
    return ClusterSettings.model_validate({k: v for k, v in stored.items() if k in known})


# -- ledger ranges ------------------------------------------------------------------------


def id_runs(ids: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending ids as inclusive runs of consecutive ids: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    runs: list[tuple[int, int]] = []
    for ledger_id in ids:
        if runs and runs[-1][1] + 1 == ledger_id:
            runs[-1] = (runs[-1][0], ledger_id)
        else:
            runs.append((ledger_id, ledger_id))
    return runs


# -- listing ------------------------------------------------------------------------------


def list_start(after: int | None) -> int:
    """Ids strictly greater than this are listed; ids start at 0."""
    return -1 if after is None else after


def list_fetch_limit(limit: int) -> int:
    """Fetch one row more than asked, to learn whether another page exists."""
    return limit + 1


def list_page(rows: Sequence[T], limit: int, key: Callable[[T], int]) -> tuple[list[T], int | None]:
    """The page to answer and the `next_after` cursor (None when nothing follows)."""
    page = list(rows[:limit])
    if len(rows) > limit and page:
        return page, key(page[-1])
    return page, None


# -- bad requests -------------------------------------------------------------------------


def describe_validation_error(exc: ValidationError) -> str:
    """One line a caller can act on: "field: problem; field: problem"."""
    parts = []
    for error in exc.errors(include_url=False)[:MAX_REPORTED_ERRORS]:
        where = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    more = exc.error_count() - MAX_REPORTED_ERRORS
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


# libpq's target_session_attrs that connect only to a server taking writes.
PRIMARY_SESSION_ATTRS = frozenset({"read-write", "primary"})


def multi_host_problem(hosts: Sequence[str], target_session_attrs: str | None) -> str | None:
    """Why a database URL naming `hosts` is unsafe for the metadata service, or None.
    Several hosts (a primary and its standbys) need target_session_attrs=read-write (or
    primary): with libpq's default, `any`, a connection may land on a standby, which
    answers reads from a past that may be behind what was acknowledged and fails writes."""
    if len([h for h in hosts if h]) <= 1 or target_session_attrs in PRIMARY_SESSION_ATTRS:
        return None
    return (
        f"the database URL names {len(hosts)} hosts ({', '.join(hosts)}) with "
        f"target_session_attrs={target_session_attrs or 'any'}: add "
        "target_session_attrs=read-write so that only the primary is used"
    )
