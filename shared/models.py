"""Ledger metadata, bookie registry rows and the metadata service's request/reply models.

These are the values that cross service boundaries as JSON. The metadata service speaks
them on `<prefix>.meta.<op>` (see `shared.metaclient` for the caller's side).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.digest import DigestType
from shared.protocol.placement import DEFAULT_LOCATION
from shared.quorum import QuorumSpec

# 1: the first format; 2: adds the creator token (BookKeeper's cToken); 3: adds the ledger's
# keys (master_key, mac_key).
METADATA_FORMAT_VERSION = 3
MAX_LEDGER_ID = 2**63 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LedgerState(StrEnum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


class BookieState(StrEnum):
    WRITABLE = "writable"
    READONLY = "readonly"
    LOST = "lost"


class Segment(_Strict):
    """One ensemble of a ledger, from `first_entry_id` until the next segment starts."""

    first_entry_id: int = Field(ge=0)
    bookies: list[str] = Field(min_length=1)


# What `LedgerMetadata.public()` leaves out: nothing a caller could sign entries or guess the
# password with.
PRIVATE_LEDGER_FIELDS = frozenset({"password_salt", "password_hash", "master_key", "mac_key"})


class LedgerMetadata(_Strict):
    ledger_id: int = Field(ge=0, le=MAX_LEDGER_ID)
    state: LedgerState
    ensemble_size: int = Field(ge=1)
    write_quorum: int = Field(ge=1)
    ack_quorum: int = Field(ge=1)
    digest: DigestType
    last_entry_id: int | None = None
    length: int = 0
    version: int = 0
    ctime: int = 0  # milliseconds since the epoch
    metadata: dict[str, str] = Field(default_factory=dict)
    segments: list[Segment]
    # A salted hash of the ledger password: the gateway checks callers against it.
    # Never returned by any public endpoint.
    password_salt: str = ""
    password_hash: str = ""
    format_version: int = METADATA_FORMAT_VERSION
    # BookKeeper's cToken: a random number the creator chose, so that a create retried after
    # a lost reply recognises its own ledger (0: none given).
    creator_token: int = 0
    # The ledger's keys, hex: `shared.digest.master_key(password)` (what its bookies check
    # on every add) and `shared.digest.mac_key(password)` (the `hmac` digest's key). Stored
    # so that a process that never saw the password can write the ledger's entries again:
    # the replicator copying a lost replica, and recovery of a ledger whose writer is gone.
    # BookKeeper's metadata format v3 stores the password itself for the same reason; only
    # the derived keys are stored here, so the password cannot be read back, but whoever can
    # read stored metadata (the metadata service, its database, the `meta.*` and ledger
    # watch subjects) can sign and add entries to every ledger: keep them as private as the
    # bookies' own subjects. "" (a ledger created before format 3): nobody can re-replicate
    # it. Never returned by any public endpoint.
    master_key: str = ""
    mac_key: str = ""

    @property
    def quorum(self) -> QuorumSpec:
        return QuorumSpec(self.ensemble_size, self.write_quorum, self.ack_quorum)

    def segment_for(self, entry_id: int) -> Segment:
        """The segment whose ensemble stores `entry_id`."""
        chosen = self.segments[0]
        for segment in self.segments:
            if segment.first_entry_id <= entry_id:
                chosen = segment
            else:
                break
        return chosen

    def public(self) -> dict[str, Any]:
        """What users see: everything but the password material and the ledger's keys."""
        return self.model_dump(mode="json", exclude=set(PRIVATE_LEDGER_FIELDS))


# The key of `BookieInfo.info` where a bookie's journal says when it registered (ms since
# the epoch, its own wall clock): stamped once per journal process, after its endpoints are
# subscribed, so a restarted bookie registers anew. Clients use it to tell a bookie that is
# just starting (its subscriptions may not be known everywhere yet) from one that is gone.
REGISTERED_AT = "registered_at"
# A bookie's network location, "/zone/rack" (QuireSettings.bookie_location), for placement
# (shared/protocol/placement.py); a registration without it counts as DEFAULT_LOCATION.
LOCATION = "location"


class BookieInfo(_Strict):
    bookie_id: str
    state: BookieState
    last_seen: int  # ms since the epoch of the last heartbeat
    lease_expires_at: int  # ms since the epoch
    info: dict[str, Any] = Field(default_factory=dict)  # what the bookie says of itself

    @property
    def location(self) -> str:
        return str(self.info.get(LOCATION, DEFAULT_LOCATION))


# -- metadata service requests ------------------------------------------------------------


class CreateLedgerRequest(_Strict):
    ledger_id: int | None = Field(default=None, ge=0, le=MAX_LEDGER_ID)
    ensemble_size: int = Field(ge=1)
    write_quorum: int = Field(ge=1)
    ack_quorum: int = Field(ge=1)
    digest: DigestType
    password_salt: str = ""
    password_hash: str = ""
    metadata: dict[str, str] = Field(default_factory=dict)
    ensemble: list[str] = Field(min_length=1)
    # With a chosen ledger_id, a retry with the same non-zero token returns the ledger it
    # created instead of LEDGER_EXISTS (createLedgerAdv after a lost reply).
    creator_token: int = Field(default=0, ge=0, le=MAX_LEDGER_ID)
    # The ledger's keys, hex (LedgerMetadata.master_key and mac_key say why they are stored).
    master_key: str = Field(default="", pattern=r"^([0-9a-f]{40})?$")
    mac_key: str = Field(default="", pattern=r"^([0-9a-f]{40})?$")

    @model_validator(mode="after")
    def _check_quorum(self) -> CreateLedgerRequest:
        QuorumSpec(self.ensemble_size, self.write_quorum, self.ack_quorum)
        if len(self.ensemble) != self.ensemble_size or len(set(self.ensemble)) != len(
            self.ensemble
        ):
            raise ValueError("ensemble must hold ensemble_size distinct bookies")
        return self


class LedgerIdRequest(_Strict):
    ledger_id: int = Field(ge=0, le=MAX_LEDGER_ID)


class ListLedgersRequest(_Strict):
    after: int | None = Field(default=None, ge=-1)
    limit: int = Field(default=100, ge=1, le=1000)


class ListLedgersReply(_Strict):
    ledgers: list[LedgerMetadata]
    next_after: int | None


class LedgerRangesRequest(_Strict):
    """BookKeeper's getLedgerRanges: the ids of every ledger, as runs, a page at a time."""

    after: int | None = Field(default=None, ge=-1)
    limit: int = Field(default=10_000, ge=1, le=100_000)  # ids per page


class LedgerRangesReply(_Strict):
    # Inclusive [first, last] runs of consecutive existing ids, ascending.
    ranges: list[tuple[int, int]]
    next_after: int | None


class UpdateLedgerRequest(_Strict):
    """Compare-and-set: applies only if the stored row still has `expected_version`.

    Fields left as None are unchanged."""

    ledger_id: int = Field(ge=0, le=MAX_LEDGER_ID)
    expected_version: int = Field(ge=0)
    state: LedgerState | None = None
    last_entry_id: int | None = Field(default=None, ge=-1)
    length: int | None = Field(default=None, ge=0)
    segments: list[Segment] | None = None


class RegisterBookieRequest(_Strict):
    """Register or renew the lease of a bookie (its heartbeat)."""

    bookie_id: str = Field(pattern=r"^[A-Za-z0-9_-]+$")
    state: BookieState = BookieState.WRITABLE
    info: dict[str, Any] = Field(default_factory=dict)


class BookieIdRequest(_Strict):
    bookie_id: str = Field(pattern=r"^[A-Za-z0-9_-]+$")


class ListBookiesReply(_Strict):
    bookies: list[BookieInfo]


class Empty(_Strict):
    pass


# -- cluster state: cookies, instance id, settings ----------------------------------------

NO_VERSION = -1  # BookKeeper's Version.NEW: "there is nothing yet"


class CookieRequest(_Strict):
    bookie_id: str = Field(pattern=r"^[A-Za-z0-9_-]+$")


class PutCookieRequest(_Strict):
    """Write a bookie's cookie if the stored one is still at `expected_version`
    (NO_VERSION: only if there is none)."""

    bookie_id: str = Field(pattern=r"^[A-Za-z0-9_-]+$")
    data: str = Field(max_length=65_536)
    expected_version: int = Field(ge=NO_VERSION)


class DeleteCookieRequest(_Strict):
    bookie_id: str = Field(pattern=r"^[A-Za-z0-9_-]+$")
    expected_version: int = Field(ge=0)


class Cookie(_Strict):
    bookie_id: str
    data: str | None  # None: no cookie
    version: int  # NO_VERSION when there is none


class InstanceIdReply(_Strict):
    instance_id: str


class ClusterSettings(_Strict):
    # BookKeeper's autoRecoveryDaemonEnabled switch (`bookkeeper shell autorecovery`): while
    # it is off the auditor runs none of its audits and the under-replication queue hands out
    # no claims, so no replicator worker starts re-replicating a ledger (operator commands
    # and entry.corrupt events still mark ledgers, for when it is on again).
    autorecovery_enabled: bool = True
    # BookKeeper's lostBookieRecoveryDelay: seconds the auditor waits after a bookie is lost
    # before marking the bookie's ledgers under-replicated (it reads it at each look at the
    # registry; a change reschedules a waiting audit from then).
    lost_bookie_recovery_delay_s: int = Field(default=0, ge=0, le=86_400)


class SetClusterSettingsRequest(_Strict):
    """Fields left as None are unchanged."""

    autorecovery_enabled: bool | None = None
    lost_bookie_recovery_delay_s: int | None = Field(default=None, ge=0, le=86_400)


# -- the under-replication queue ----------------------------------------------------------

WORKER_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"


class MarkUnderreplicatedRequest(_Strict):
    ledger_id: int = Field(ge=0, le=MAX_LEDGER_ID)
    missing_bookies: list[str] = Field(min_length=1, max_length=1000)


class ClaimUnderreplicatedRequest(_Strict):
    worker_id: str = Field(pattern=WORKER_ID_PATTERN)
    lease_ms: int = Field(default=60_000, ge=100, le=3_600_000)


class UnderreplicatedLedger(_Strict):
    ledger_id: int
    missing_bookies: list[str]  # sorted, no repeats
    # Bumped by every mark that added a bookie: "replicated" of an older mark only releases.
    mark_version: int
    marked_at: int  # ms since the epoch of the first mark
    claimed_by: str | None = None
    claim_expires_at: int | None = None


class ClaimUnderreplicatedReply(_Strict):
    ledger: UnderreplicatedLedger | None  # None: nothing to do (or autorecovery disabled)


class UnderreplicatedClaimRequest(_Strict):
    """Release, renew or finish a claim; only its holder may."""

    ledger_id: int = Field(ge=0, le=MAX_LEDGER_ID)
    worker_id: str = Field(pattern=WORKER_ID_PATTERN)
    lease_ms: int = Field(default=60_000, ge=100, le=3_600_000)  # for renew
    mark_version: int | None = Field(default=None, ge=0)  # for replicated


class ClaimOutcome(_Strict):
    done: bool  # False: the claim was not (or no longer) this worker's


class ListUnderreplicatedRequest(_Strict):
    after: int | None = Field(default=None, ge=-1)
    limit: int = Field(default=100, ge=1, le=1000)


class ListUnderreplicatedReply(_Strict):
    ledgers: list[UnderreplicatedLedger]
    next_after: int | None


# -- auditor election ---------------------------------------------------------------------


class ElectRequest(_Strict):
    candidate_id: str = Field(pattern=WORKER_ID_PATTERN)
    lease_ms: int = Field(default=6_000, ge=100, le=600_000)


class Leadership(_Strict):
    leader_id: str | None  # None: no leader holds a lease now
    term: int  # bumped each time another candidate wins
    lease_expires_at: int  # ms since the epoch
    is_leader: bool = False  # whether the asking candidate is the leader


class LedgerWatchEvent(_Strict):
    """Published on `Subjects.ledger_watch(id)` after each committed change, in commit
    order. Best effort (core NATS): a watcher that must not miss a change re-reads."""

    ledger_id: int
    metadata: LedgerMetadata | None  # None: the ledger was deleted


# -- the reply envelope -------------------------------------------------------------------


class MetaErrorCode(StrEnum):
    BAD_REQUEST = "BAD_REQUEST"
    NO_SUCH_LEDGER = "NO_SUCH_LEDGER"
    LEDGER_EXISTS = "LEDGER_EXISTS"
    BAD_VERSION = "BAD_VERSION"  # the CAS lost; `current` holds the stored metadata
    LEDGER_CLOSED = "LEDGER_CLOSED"  # the update would change what a close fixed for good
    NO_SUCH_COOKIE = "NO_SUCH_COOKIE"
    BOOKIE_ALIVE = "BOOKIE_ALIVE"  # a bookie whose lease still holds cannot be removed
    UNAVAILABLE = "UNAVAILABLE"  # PostgreSQL unreachable: the outcome is unknown, re-read
    INTERNAL = "INTERNAL"


class MetaError(_Strict):
    code: MetaErrorCode
    message: str
    current: LedgerMetadata | None = None


class MetaReply(_Strict):
    ok: bool
    result: Any = None
    error: MetaError | None = None
