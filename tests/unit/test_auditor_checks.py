"""What the auditor makes of one entry a check read (services/auditor/checks.py)."""

from __future__ import annotations

import pytest

from services.auditor.checks import digest_manager, frame_outcome
from shared import wire
from shared.autorecovery import ReadOutcome
from shared.digest import DigestManager, DigestType
from shared.models import LedgerMetadata, LedgerState, Segment
from shared.status import BookieStatus


def metadata(digest: DigestType) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=5,
        state=LedgerState.CLOSED,
        ensemble_size=1,
        write_quorum=1,
        ack_quorum=1,
        digest=digest,
        last_entry_id=0,
        segments=[Segment(first_entry_id=0, bookies=["a"])],
    )


def flipped(frame: bytes, at: int) -> bytes:
    return frame[:at] + bytes([frame[at] ^ 1]) + frame[at + 1 :]


@pytest.mark.parametrize("digest", [DigestType.CRC32, DigestType.CRC32C, DigestType.DUMMY])
def test_an_ok_answer_is_checked_against_the_ledgers_digest(digest: DigestType) -> None:
    manager = digest_manager(metadata(digest))
    assert manager is not None
    frame = DigestManager(digest).sign(5, 3, 2, 40, b"payload")
    assert frame_outcome(wire.ReadResult(5, 3, BookieStatus.OK, frame), manager, 5) is (
        ReadOutcome.OK
    )
    damaged = flipped(frame, len(frame) - 1)
    expected = ReadOutcome.OK if digest is DigestType.DUMMY else ReadOutcome.CORRUPT
    assert frame_outcome(wire.ReadResult(5, 3, BookieStatus.OK, damaged), manager, 5) is expected
    # Another entry's frame is never this one's, whatever the digest.
    other = DigestManager(digest).sign(5, 4, 2, 40, b"payload")
    assert frame_outcome(wire.ReadResult(5, 3, BookieStatus.OK, other), manager, 5) is (
        ReadOutcome.CORRUPT
    )


def test_an_hmac_ledger_is_checked_by_its_header_only() -> None:
    assert digest_manager(metadata(DigestType.HMAC)) is None
    frame = DigestManager(DigestType.HMAC, b"secret").sign(5, 3, 2, 40, b"payload")
    ok = wire.ReadResult(5, 3, BookieStatus.OK, frame)
    assert frame_outcome(ok, None, 5) is ReadOutcome.OK
    assert frame_outcome(wire.ReadResult(5, 3, BookieStatus.OK, flipped(frame, 9)), None, 5) is (
        ReadOutcome.CORRUPT
    )
    assert frame_outcome(wire.ReadResult(5, 3, BookieStatus.OK, b"short"), None, 5) is (
        ReadOutcome.CORRUPT
    )


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (BookieStatus.NO_ENTRY, ReadOutcome.MISSING),
        (BookieStatus.CORRUPT, ReadOutcome.CORRUPT),
        (BookieStatus.UNKNOWN_LEDGER_STATE, ReadOutcome.LIMBO),
        (BookieStatus.TOO_MANY_REQUESTS, ReadOutcome.UNREACHABLE),
    ],
)
def test_other_answers_need_no_frame(status: BookieStatus, outcome: ReadOutcome) -> None:
    manager = digest_manager(metadata(DigestType.CRC32C))
    assert frame_outcome(wire.ReadResult(5, 3, status), manager, 5) is outcome
