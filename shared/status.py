"""Bookie statuses (BookKeeper's numbers) and the one table that maps them to API codes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class BookieStatus(IntEnum):
    """BookKeeper's `BookkeeperProtocol.StatusCode` numbers, plus Quire's CORRUPT."""

    OK = 0
    NO_LEDGER = 402  # ENOLEDGER
    NO_ENTRY = 403  # ENOENTRY
    BAD_REQUEST = 404  # EBADREQ
    IO_ERROR = 501  # EIO
    UNAUTHORIZED = 502  # EUA
    BAD_VERSION = 503  # EBADVERSION
    FENCED = 504  # EFENCED
    READ_ONLY = 505  # EREADONLY
    TOO_MANY_REQUESTS = 506  # ETOOMANYREQUESTS
    UNKNOWN_LEDGER_STATE = 507  # EUNKNOWNLEDGERSTATE
    CORRUPT = 600  # Quire: the stored entry failed its digest check


@dataclass(frozen=True)
class ApiCode:
    code: str
    http_status: int
    title: str


class ApiCodes:
    """The stable, machine-readable error codes of API.md, with their HTTP statuses."""

    INVALID_ARGUMENT = ApiCode("INVALID_ARGUMENT", 400, "Invalid argument")
    UNAUTHORIZED = ApiCode("UNAUTHORIZED", 403, "Unauthorized")
    UNAUTHENTICATED = ApiCode("UNAUTHORIZED", 401, "Unauthenticated")
    NO_SUCH_LEDGER = ApiCode("NO_SUCH_LEDGER", 404, "No such ledger")
    NO_SUCH_ENTRY = ApiCode("NO_SUCH_ENTRY", 404, "No such entry")
    NO_SUCH_BOOKIE = ApiCode("NO_SUCH_BOOKIE", 404, "No such bookie")
    LEDGER_CLOSED = ApiCode("LEDGER_CLOSED", 409, "Ledger closed")
    LEDGER_FENCED = ApiCode("LEDGER_FENCED", 409, "Ledger fenced")
    # Not an error: another gateway holds the OPEN ledger's writer (a 307 to it over HTTP).
    WRITER_REDIRECT = ApiCode("WRITER_REDIRECT", 307, "Writer on another gateway")
    ENTRY_TOO_LARGE = ApiCode("ENTRY_TOO_LARGE", 413, "Entry too large")
    TOO_MANY_REQUESTS = ApiCode("TOO_MANY_REQUESTS", 429, "Too many requests")
    INTERNAL = ApiCode("INTERNAL", 500, "Internal error")
    NOT_ENOUGH_BOOKIES = ApiCode("NOT_ENOUGH_BOOKIES", 503, "Not enough bookies")
    UNAVAILABLE = ApiCode("UNAVAILABLE", 503, "Unavailable")
    TIMEOUT = ApiCode("TIMEOUT", 504, "Timeout")


# What a bookie status means to the user when it is the final word on a request.
BOOKIE_STATUS_TO_API: dict[BookieStatus, ApiCode] = {
    BookieStatus.NO_LEDGER: ApiCodes.NO_SUCH_ENTRY,
    BookieStatus.NO_ENTRY: ApiCodes.NO_SUCH_ENTRY,
    BookieStatus.BAD_REQUEST: ApiCodes.INVALID_ARGUMENT,
    BookieStatus.IO_ERROR: ApiCodes.UNAVAILABLE,
    BookieStatus.UNAUTHORIZED: ApiCodes.UNAUTHORIZED,
    BookieStatus.BAD_VERSION: ApiCodes.INTERNAL,
    BookieStatus.FENCED: ApiCodes.LEDGER_FENCED,
    BookieStatus.READ_ONLY: ApiCodes.NOT_ENOUGH_BOOKIES,
    BookieStatus.TOO_MANY_REQUESTS: ApiCodes.TOO_MANY_REQUESTS,
    BookieStatus.UNKNOWN_LEDGER_STATE: ApiCodes.UNAVAILABLE,
    BookieStatus.CORRUPT: ApiCodes.UNAVAILABLE,
}


class QuireError(Exception):
    """An error a user can cause or must be told about, carrying its API code."""

    def __init__(self, api: ApiCode, detail: str) -> None:
        super().__init__(detail)
        self.api = api
        self.detail = detail
