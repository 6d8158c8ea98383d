"""The auditor's decisions (BookKeeper's Auditor and LedgerChecker), pure: no IO, no clock.

Everything the auditor decides is here; services/auditor/ only reads the registry, the
ledgers and the bookies, feeds what it saw in, and carries out what comes back (marks in the
under-replication queue, events, cookie removals).

Vocabulary. A ledger's segment i covers entries [first_entry_id, next segment's
first_entry_id - 1]; the last segment ends at last_entry_id once the ledger is CLOSED and is
open-ended before. A *fragment* is what one bookie of a segment stores: the segment's range
x the entries whose write set (shared.quorum.write_set) holds that bookie's ensemble index.
A bookie that stores no entry of a segment (an empty segment of a closed ledger, or a range
shorter than the ensemble) holds no fragment there and is never marked for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from shared.models import LedgerMetadata, LedgerState
from shared.quorum import write_set


class MarkReason(StrEnum):
    """Why a ledger was marked under-replicated (the `reason` of `autorecovery.marked`)."""

    LOST_BOOKIE = "lost_bookie"
    CHECK_ALL = "check_all"
    REPLICAS_CHECK = "replicas_check"
    ENTRY_CORRUPT = "entry_corrupt"
    LIMBO = "limbo"
    PLACEMENT = "placement"
    MANUAL = "manual"
    DECOMMISSION = "decommission"


@dataclass(frozen=True, slots=True)
class StoredFragment:
    """The entries of segment `segment_index` stored on the bookie at `ensemble_index`.

    `last_entry_id` is inclusive; None: the open last segment of a ledger not yet closed
    (its end is not known, so it cannot be checked entry by entry yet)."""

    ledger_id: int
    segment_index: int
    segment_first_entry_id: int
    first_entry_id: int
    last_entry_id: int | None
    ensemble_index: int
    bookie_id: str

    @property
    def is_open(self) -> bool:
        return self.last_entry_id is None


def segment_range(metadata: LedgerMetadata, index: int) -> tuple[int, int | None]:
    """Inclusive [first, last] entry ids of segment `index` (last None: open-ended).
    An empty range has last < first."""
    segments = metadata.segments
    first = segments[index].first_entry_id
    if index + 1 < len(segments):
        return first, segments[index + 1].first_entry_id - 1
    if metadata.state is LedgerState.CLOSED:
        return first, -1 if metadata.last_entry_id is None else metadata.last_entry_id
    return first, None


def stored_entry_ids(metadata: LedgerMetadata, first: int, last: int, index: int) -> Iterator[int]:
    """The entries of [first, last] whose write set holds ensemble index `index`."""
    spec = metadata.quorum
    for entry_id in range(first, last + 1):
        if index in write_set(entry_id, spec):
            yield entry_id


def _first_and_last_stored(
    metadata: LedgerMetadata, first: int, last: int, index: int
) -> tuple[int, int] | None:
    # Each ensemble index recurs every E entries: the first and last stored entries are
    # within E of the range's ends, so this looks at no more than 2E entries.
    size = metadata.ensemble_size
    head = next(stored_entry_ids(metadata, first, min(last, first + size - 1), index), None)
    if head is None:
        return None
    tail = [e for e in stored_entry_ids(metadata, max(first, last - size + 1), last, index)]
    return head, tail[-1]


def fragments_on(metadata: LedgerMetadata, bookie_ids: Iterable[str]) -> list[StoredFragment]:
    """The fragments stored on `bookie_ids` that hold at least one entry, in segment order;
    the open last segment of a ledger not closed counts (it may hold entries) with
    last_entry_id None."""
    wanted = set(bookie_ids)
    found = []
    for seg_index, segment in enumerate(metadata.segments):
        first, last = segment_range(metadata, seg_index)
        for ens_index, bookie_id in enumerate(segment.bookies):
            if bookie_id not in wanted:
                continue
            if last is None:
                found.append(
                    StoredFragment(
                        metadata.ledger_id, seg_index, first, first, None, ens_index, bookie_id
                    )
                )
                continue
            ends = _first_and_last_stored(metadata, first, last, ens_index)
            if ends is not None:
                found.append(
                    StoredFragment(
                        metadata.ledger_id, seg_index, first, ends[0], ends[1], ens_index, bookie_id
                    )
                )
    return found


def bookies_to_mark(metadata: LedgerMetadata, bookie_ids: Iterable[str]) -> list[str]:
    """Which of `bookie_ids` to name when marking this ledger: those holding a fragment of
    it (sorted). Empty: the ledger does not need them."""
    return sorted({f.bookie_id for f in fragments_on(metadata, bookie_ids)})
