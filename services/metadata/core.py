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
    CreateLedgerRequest,
    LedgerMetadata,
    LedgerState,
    RegisterBookieRequest,
    Segment,
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
    )


def check_update(request: UpdateLedgerRequest) -> None:
    if request.segments is not None:
        check_segments(request.segments)


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
