"""Ledger metadata, bookie registry rows and the metadata service's request/reply models.

These are the values that cross service boundaries as JSON. The metadata service speaks
them on `<prefix>.meta.<op>` (see `shared.metaclient` for the caller's side).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.digest import DigestType
from shared.quorum import QuorumSpec

METADATA_FORMAT_VERSION = 1
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
        """What users see: everything but the password material."""
        return self.model_dump(mode="json", exclude={"password_salt", "password_hash"})


class BookieInfo(_Strict):
    bookie_id: str
    state: BookieState
    last_seen: int  # ms since the epoch of the last heartbeat
    lease_expires_at: int  # ms since the epoch
    info: dict[str, Any] = Field(default_factory=dict)


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


# -- the reply envelope -------------------------------------------------------------------


class MetaErrorCode(StrEnum):
    BAD_REQUEST = "BAD_REQUEST"
    NO_SUCH_LEDGER = "NO_SUCH_LEDGER"
    LEDGER_EXISTS = "LEDGER_EXISTS"
    BAD_VERSION = "BAD_VERSION"  # the CAS lost; `current` holds the stored metadata
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
