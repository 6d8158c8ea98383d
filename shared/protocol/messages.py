"""The messages of the client protocol: the events a driver feeds the cores (`step`) and the
commands they hand back (`take_commands`). Plain frozen data, no behaviour: the writer
(`writer.py`), the reader (`reader.py`) and recovery (`recovery.py`) share them, and a
driver (the gateway's, the bench's, the simulator's) pattern-matches on them.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.models import LedgerMetadata, UpdateLedgerRequest
from shared.status import BOOKIE_STATUS_TO_API, ApiCode, ApiCodes, BookieStatus
from shared.wire import AddItem, AddResult, ReadItem, ReadResult

# A bookie's "I do not have it": the only answers that may count as absent.
ABSENT = frozenset({BookieStatus.NO_ENTRY, BookieStatus.NO_LEDGER})


def api_for_status(status: BookieStatus) -> ApiCode:
    """The one table (shared.status) decides what a bookie status means to the user."""
    return BOOKIE_STATUS_TO_API.get(status, ApiCodes.INTERNAL)


# -- metadata commands and events (shared by the writer and recovery) -------------------------


@dataclass(frozen=True, slots=True)
class UpdateLedger:
    """Compare-and-set the ledger's metadata. The driver answers with LedgerUpdated, or with
    LedgerUpdateFailed carrying what is stored now (it re-reads when the outcome is unknown)."""

    request: UpdateLedgerRequest


@dataclass(frozen=True, slots=True)
class LedgerUpdated:
    metadata: LedgerMetadata


@dataclass(frozen=True, slots=True)
class LedgerUpdateFailed:
    """The CAS lost (or its outcome is unknown): `current` is the stored metadata, None if it
    could not be read either."""

    current: LedgerMetadata | None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ListWritableBookies:
    """The writer needs replacements: the driver answers with WritableBookies."""


@dataclass(frozen=True, slots=True)
class WritableBookies:
    """`locations`: (bookie, network location) of the registered bookies, writable or not,
    for placement; a bookie missing from it is at the default location."""

    bookie_ids: tuple[str, ...]
    locations: tuple[tuple[str, str], ...] = ()


# -- writer events and commands ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BookieAddReply:
    """A bookie answered one SendAdds: `status` is the batch status; when it is OK, `results`
    holds one status per entry (an entry sent but missing from them counts as IO_ERROR)."""

    bookie_id: str
    entry_ids: tuple[int, ...]
    status: BookieStatus
    results: tuple[AddResult, ...] = ()


@dataclass(frozen=True, slots=True)
class AddSendFailed:
    """A SendAdds got no answer: it timed out (the bookie may be slow, the add may still
    land) or could not be delivered (no responder: the bookie is down; an undecodable
    reply)."""

    bookie_id: str
    entry_ids: tuple[int, ...]
    reason: str
    timed_out: bool = True


@dataclass(frozen=True, slots=True)
class SendAdds:
    bookie_id: str
    entry_ids: tuple[int, ...]
    items: tuple[AddItem, ...]


@dataclass(frozen=True, slots=True)
class SendWriteLac:
    """An explicit LAC for one bookie (fire and forget: the next add carries it too)."""

    bookie_id: str
    lac: int


@dataclass(frozen=True, slots=True)
class CompleteAdds:
    """Entries first..last are acknowledged; `lac` is the new last add confirmed (== last)."""

    first_entry_id: int
    last_entry_id: int
    lac: int
    length: int


@dataclass(frozen=True, slots=True)
class FailAdds:
    first_entry_id: int
    last_entry_id: int
    api: ApiCode
    detail: str


@dataclass(frozen=True, slots=True)
class EnsembleChanged:
    """A new segment is stored: `replaced` maps ensemble index -> (old bookie, new bookie).
    `placement_fallback`: why the replacements break the placement policy (not enforced, so
    placed anyway), empty when they keep it."""

    first_entry_id: int
    replaced: tuple[tuple[int, str, str], ...]
    metadata: LedgerMetadata
    placement_fallback: str = ""


@dataclass(frozen=True, slots=True)
class CloseDone:
    """The ledger is CLOSED as `metadata` says (by this writer, or by a recovery it yields to)."""

    metadata: LedgerMetadata


@dataclass(frozen=True, slots=True)
class CloseFailed:
    api: ApiCode
    detail: str


WriterCommand = (
    SendAdds
    | SendWriteLac
    | CompleteAdds
    | FailAdds
    | UpdateLedger
    | ListWritableBookies
    | EnsembleChanged
    | CloseDone
    | CloseFailed
)
WriterEvent = BookieAddReply | AddSendFailed | LedgerUpdated | LedgerUpdateFailed | WritableBookies


# -- reader events and commands ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BookieReadReply:
    """A bookie answered one SendReads. A bookie may answer a prefix of a batch (its reply
    must fit in one message): what it left out is asked again of the same bookie."""

    bookie_id: str
    entry_ids: tuple[int, ...]
    status: BookieStatus
    results: tuple[ReadResult, ...] = ()


@dataclass(frozen=True, slots=True)
class ReadSendFailed:
    """A SendReads got no answer: it timed out (the bookie may be slow) or could not be
    delivered (no responder: the bookie is down)."""

    bookie_id: str
    entry_ids: tuple[int, ...]
    reason: str
    timed_out: bool = True


@dataclass(frozen=True, slots=True)
class SendReads:
    bookie_id: str
    items: tuple[ReadItem, ...]

    @property
    def entry_ids(self) -> tuple[int, ...]:
        return tuple(item.entry_id for item in self.items)


@dataclass(frozen=True, slots=True)
class EntryRead:
    entry_id: int
    payload: bytes
    lac: int  # the LAC that rode on the entry
    length: int


@dataclass(frozen=True, slots=True)
class EntryReadFailed:
    entry_id: int
    api: ApiCode
    detail: str


@dataclass(frozen=True, slots=True)
class ReplicaCorrupt:
    """A bookie returned a frame that failed its digest: report it for repair."""

    bookie_id: str
    entry_id: int
    detail: str


ReaderCommand = SendReads | EntryRead | EntryReadFailed | ReplicaCorrupt


# -- recovery events and commands -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendFence:
    """Fence the ledger on one bookie (the journal's "fence": durable before it answers)."""

    bookie_id: str


@dataclass(frozen=True, slots=True)
class FenceReply:
    bookie_id: str
    status: BookieStatus
    lac: int = -1


@dataclass(frozen=True, slots=True)
class FenceSendFailed:
    bookie_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class RecoveryDone:
    """The ledger is CLOSED; `metadata.last_entry_id` is its last entry, for good."""

    metadata: LedgerMetadata


@dataclass(frozen=True, slots=True)
class RecoveryFailed:
    """Nothing was closed; the ledger may be left IN_RECOVERY (a later recovery ends it)."""

    api: ApiCode
    detail: str


RecoveryCommand = (
    UpdateLedger
    | SendFence
    | SendReads
    | SendAdds
    | ListWritableBookies
    | EnsembleChanged
    | ReplicaCorrupt
    | RecoveryDone
    | RecoveryFailed
)
RecoveryEvent = (
    FenceReply
    | FenceSendFailed
    | BookieReadReply
    | ReadSendFailed
    | BookieAddReply
    | AddSendFailed
    | LedgerUpdated
    | LedgerUpdateFailed
    | WritableBookies
)


# -- re-replication events and commands (replication.py) ----------------------------------------


@dataclass(frozen=True, slots=True)
class Fragment:
    """BookKeeper's LedgerFragment: the entries first..last (inclusive) of the segment that
    starts at `segment_first_entry_id` whose write set holds `ensemble_index`, stored there
    on `bookie_id`."""

    segment_first_entry_id: int
    first_entry_id: int
    last_entry_id: int
    ensemble_index: int
    bookie_id: str


@dataclass(frozen=True, slots=True)
class FragmentReplicated:
    """Every entry of `fragment` is durable on `new_bookie_id`, and the stored metadata
    (`metadata`) names it in the fragment's place."""

    fragment: Fragment
    new_bookie_id: str
    entries: int
    bytes: int  # frame bytes written to the new bookie
    metadata: LedgerMetadata
    placement_fallback: str = ""  # why the new bookie breaks the placement policy, if it does


@dataclass(frozen=True, slots=True)
class ReplicationDone:
    """No fragment of the bad bookies is left to copy (`metadata` as stored now), except
    the open last segment of a ledger that is not closed (`replication.open_fragment_on`)."""

    metadata: LedgerMetadata


@dataclass(frozen=True, slots=True)
class ReplicationFailed:
    """The fragments replicated before the failure stay replicated; the rest are not."""

    api: ApiCode
    detail: str


ReplicationCommand = (
    ListWritableBookies
    | SendReads
    | SendAdds
    | UpdateLedger
    | ReplicaCorrupt
    | FragmentReplicated
    | ReplicationDone
    | ReplicationFailed
)
ReplicationEvent = (
    WritableBookies
    | BookieReadReply
    | ReadSendFailed
    | BookieAddReply
    | AddSendFailed
    | LedgerUpdated
    | LedgerUpdateFailed
)
