"""What the metadata tests build alike."""

from __future__ import annotations

from typing import Any

from shared.models import CreateLedgerRequest

ENSEMBLE = ["bookie-1", "bookie-2", "bookie-3"]


def create_request(ledger_id: int | None = None, **extra: Any) -> CreateLedgerRequest:
    """An E3/Qw3/Qa2 crc32c create over ENSEMBLE (with a chosen id when given)."""
    return CreateLedgerRequest(
        ledger_id=ledger_id,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        digest="crc32c",
        ensemble=ENSEMBLE,
        **extra,
    )
