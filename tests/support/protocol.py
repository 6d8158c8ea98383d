"""The ledger the protocol cores' table tests run against (tests/unit/test_protocol_*.py)."""

from __future__ import annotations

from shared.digest import master_key
from shared.models import LedgerMetadata, LedgerState, Segment

LEDGER = 7
KEY = master_key(b"pw")


def metadata(e: int = 3, w: int = 3, a: int = 2, digest: str = "crc32c") -> LedgerMetadata:
    """An open ledger of E bookies b0..b(E-1), one segment from entry 0."""
    return LedgerMetadata(
        ledger_id=LEDGER,
        state=LedgerState.OPEN,
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=a,
        digest=digest,
        segments=[Segment(first_entry_id=0, bookies=[f"b{i}" for i in range(e)])],
    )
