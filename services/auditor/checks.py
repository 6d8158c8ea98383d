"""The auditor's reads of bookies for its checks (BookKeeper's LedgerChecker): carries out
a plan of `shared.autorecovery.FragmentCheck`s and says what each bookie answered.

Every entry read OK has its frame checked against the ledger's digest. An `hmac` ledger
needs its mac key, which is derived from the password; the metadata holds no key yet, so
for those ledgers only the frame's header (ledger and entry ids) is checked and the ledger
is counted as `digest_unverified` in the check's findings.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from shared import wire
from shared.autorecovery import FragmentCheck, ReadOutcome, read_outcome
from shared.bookie_client import BookieClient, BookieUnreachable
from shared.digest import DigestManager, DigestMismatch, DigestType, parse_header
from shared.models import LedgerMetadata
from shared.status import BookieStatus


@dataclass
class LedgerCheckResult:
    ledger_id: int
    outcomes: list[tuple[str, ReadOutcome]] = field(default_factory=list)
    entries_read: int = 0
    digest_verified: bool = True


def digest_manager(metadata: LedgerMetadata) -> DigestManager | None:
    """The ledger's digest, or None when it cannot be verified without its password."""
    if metadata.digest is DigestType.HMAC:
        return None
    return DigestManager(metadata.digest)


def frame_outcome(
    result: wire.ReadResult, digest: DigestManager | None, ledger_id: int
) -> ReadOutcome:
    outcome = read_outcome(result.status)
    if result.status is not BookieStatus.OK:
        return outcome
    try:
        if digest is None:
            if parse_header(result.frame)[:2] != (ledger_id, result.entry_id):
                return ReadOutcome.CORRUPT
        else:
            digest.check(result.frame, ledger_id, result.entry_id)
    except DigestMismatch:
        return ReadOutcome.CORRUPT
    return outcome


class LedgerChecker:
    def __init__(self, bookies: BookieClient, read_batch_entries: int) -> None:
        self._bookies = bookies
        self._batch = read_batch_entries

    async def check(
        self, metadata: LedgerMetadata, plan: list[FragmentCheck], alive: set[str]
    ) -> LedgerCheckResult:
        """Read the plan's entries, a batch at a time; a bookie found bad for a fragment is
        not asked for the rest of it (one bad answer is enough to name it). A bookie not
        registered alive is not asked: it counts as unreachable (the lost-bookie audit
        names it)."""
        digest = digest_manager(metadata)
        result = LedgerCheckResult(metadata.ledger_id, digest_verified=digest is not None)
        for check in plan:
            bookie_id = check.fragment.bookie_id
            if bookie_id not in alive:
                result.outcomes.append((bookie_id, ReadOutcome.UNREACHABLE))
                continue
            for start in range(0, len(check.entry_ids), self._batch):
                outcome = await self._read_batch(
                    metadata.ledger_id,
                    bookie_id,
                    check.entry_ids[start : start + self._batch],
                    digest,
                    result,
                )
                if outcome is not ReadOutcome.OK:
                    result.outcomes.append((bookie_id, outcome))
                    break
            else:
                result.outcomes.append((bookie_id, ReadOutcome.OK))
        return result

    async def _read_batch(
        self,
        ledger_id: int,
        bookie_id: str,
        entry_ids: tuple[int, ...],
        digest: DigestManager | None,
        result: LedgerCheckResult,
    ) -> ReadOutcome:
        """The worst outcome of one read request (OK if every entry was good)."""
        items = [wire.ReadItem(ledger_id, entry_id) for entry_id in entry_ids]
        try:
            status, answers = await self._bookies.read(bookie_id, items)
        except BookieUnreachable:
            return ReadOutcome.UNREACHABLE
        result.entries_read += len(answers)
        if status is not BookieStatus.OK and not answers:
            return read_outcome(status)
        outcomes = Counter(frame_outcome(answer, digest, ledger_id) for answer in answers)
        if len(answers) < len(items):
            outcomes[ReadOutcome.UNREACHABLE] += 1  # a short answer: the rest unknown
        for worst in (ReadOutcome.LIMBO, ReadOutcome.CORRUPT, ReadOutcome.MISSING):
            if outcomes[worst]:
                return worst
        return ReadOutcome.UNREACHABLE if outcomes[ReadOutcome.UNREACHABLE] else ReadOutcome.OK
