"""The co-hosted bookie's in-process handoff (shared/bookie/handoff.py, services.bookie):
which handed group commits the ledgerstore applies, skips or tails the file across (pure),
and, with a real journal writing real files, that a ledgerstore fed by the handoff ends
in the state a ledgerstore tailing the same files reaches, whether every commit was
handed, some were dropped from a full queue, or the journal rolled files meanwhile."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.journal.journal import Journal
from services.ledgerstore.store import LedgerStore
from shared import wire
from shared.bookie.handoff import Decision, DurableBatch, HandoffQueue, continues, decide
from shared.bookie.journal_format import (
    FILE_HEADER_SIZE,
    EntryRecord,
    JournalPosition,
    LacRecord,
    MasterKeyRecord,
)
from shared.config import JournalSettings, LedgerstoreSettings
from shared.digest import DigestManager
from shared.status import BookieStatus

KEY = b"k" * 20
DIGEST = DigestManager("crc32c")
CRC32C = wire.DIGEST_CODES[DIGEST.digest_type]
H = FILE_HEADER_SIZE


def pos(file_id: int, offset: int) -> JournalPosition:
    return JournalPosition(file_id, offset)


def batch(previous: JournalPosition, start: JournalPosition, end: JournalPosition):
    return DurableBatch(0, previous, start, end, [LacRecord(1, 0)])


# -- the decision (pure) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("applied", "handed", "expected"),
    [
        # The next commit in the same file, from where the last one ended.
        (pos(1, 500), batch(pos(1, 500), pos(1, 500), pos(1, 900)), Decision.APPLY),
        # The first commit of a fresh journal: applied is the very start (before the header).
        (pos(1, 0), batch(pos(1, 0), pos(1, H), pos(1, 300)), Decision.APPLY),
        # The first commit of a new file (a roll, or a restart): applied is where the
        # journal's durable records ended in the earlier file.
        (pos(1, 900), batch(pos(1, 900), pos(2, H), pos(2, 400)), Decision.APPLY),
        # ... or the tailer already moved to the new file (it saw it exist).
        (pos(2, 0), batch(pos(1, 900), pos(2, H), pos(2, 400)), Decision.APPLY),
        (pos(2, H), batch(pos(1, 900), pos(2, H), pos(2, 400)), Decision.APPLY),
        # Already applied from the file: dropped.
        (pos(1, 900), batch(pos(1, 500), pos(1, 500), pos(1, 900)), Decision.SKIP),
        (pos(2, 100), batch(pos(1, 500), pos(1, 500), pos(1, 900)), Decision.SKIP),
        # A commit before it was dropped: the file covers the hole.
        (pos(1, 500), batch(pos(1, 900), pos(1, 900), pos(1, 1300)), Decision.GAP),
        # The earlier file has durable records not applied yet.
        (pos(1, 700), batch(pos(1, 900), pos(2, H), pos(2, 400)), Decision.GAP),
        # The file tailer read part of it (a write it saw before the fsync ended).
        (pos(1, 700), batch(pos(1, 500), pos(1, 500), pos(1, 900)), Decision.GAP),
    ],
)
def test_a_handed_commit_is_applied_only_where_it_continues_the_applied_position(
    applied: JournalPosition, handed: DurableBatch, expected: Decision
) -> None:
    assert decide(applied, handed) is expected
    assert continues(applied, handed) is (expected is Decision.APPLY)


def test_the_queue_is_bounded_and_counts_what_it_dropped() -> None:
    queue = HandoffQueue(max_batches=2)
    handed = [batch(pos(1, n), pos(1, n), pos(1, n + 1)) for n in range(100, 104)]
    assert [queue.offer(b) for b in handed] == [True, True, False, False]
    assert (queue.offered, queue.dropped, len(queue)) == (4, 2, 2)
    assert queue.take() == handed[:2]
    assert len(queue) == 0 and queue.offer(handed[3])


# -- with a real journal and real files --------------------------------------------------


def frame(ledger_id: int, entry_id: int) -> bytes:
    payload = f"entry {ledger_id}:{entry_id}".encode() * 40
    return DIGEST.sign(ledger_id, entry_id, entry_id - 1, len(payload), payload)


def entry(ledger_id: int, entry_id: int) -> EntryRecord:
    return EntryRecord.of(KEY, frame(ledger_id, entry_id), CRC32C)


async def write(journal: Journal, ledgers: range, entries: range) -> None:
    """One submit per entry of each ledger, the ledgers' at once: many group commits."""
    for entry_id in entries:
        await asyncio.gather(
            *(journal.submit([entry(ledger_id, entry_id)], now_ms=0) for ledger_id in ledgers)
        )


async def contents(store: LedgerStore, ledgers: range, entries: range) -> dict:
    """Everything a reader can see: each entry's status and frame, each ledger's LAC."""
    found = {}
    for ledger_id in ledgers:
        results = await store.read([wire.ReadItem(ledger_id, e) for e in entries])
        found[ledger_id] = ([(r.status, r.frame) for r in results], await store.read_lac(ledger_id))
    return found


@pytest.mark.parametrize(
    ("queue_batches", "max_file_mb", "entries", "wired_late"),
    [(1024, 256, 40, False), (3, 256, 40, False), (1024, 1, 800, False), (1024, 256, 60, True)],
    ids=[
        "all-handed",
        "full-queue-falls-back-to-the-file",
        "across-journal-files",
        "a-gap-before-the-first-handed-commit",
    ],
)
async def test_a_handed_ledgerstore_ends_where_tailing_the_files_does(
    tmp_path: Path, queue_batches: int, max_file_mb: int, entries: int, wired_late: bool
) -> None:
    journal_dir = tmp_path / "journal"
    settings = JournalSettings().model_copy(
        update={"max_backups": 0, "max_size_mb": max_file_mb, "remove_pages_from_cache": False}
    )
    journal = Journal(journal_dir, settings, fatal=pytest.fail)
    handed = LedgerStore(
        tmp_path / "handed", LedgerstoreSettings(), pytest.fail, journal_dirs=[journal_dir]
    )
    await handed.open()
    handed.accept_handoff(queue_batches)
    if not wired_late:
        journal.on_durable = handed.offer  # as services.bookie wires them
    await journal.open()
    writer = asyncio.create_task(journal.run_writer())
    tail_reads = 0
    read = handed.tailers[0].read

    def counted_read():
        nonlocal tail_reads
        tail_reads += 1
        return read()

    handed.tailers[0].read = counted_read
    ledgers = range(1, 4)
    await journal.submit([MasterKeyRecord(ledger_id, KEY) for ledger_id in ledgers], now_ms=0)
    # Applied every 20 entries (the service applies once per journal_apply_interval_ms):
    # a small queue overflows in between.
    for part in range(0, entries, 20):
        await write(journal, ledgers, range(part, min(part + 20, entries)))
        if wired_late:
            # The first commits were not handed: the next handed one leaves a gap.
            journal.on_durable = handed.offer
            wired_late = False
            continue
        assert await handed.catch_up()
    tailed = LedgerStore(
        tmp_path / "tailed", LedgerstoreSettings(), pytest.fail, journal_dirs=[journal_dir]
    )
    await tailed.open()
    assert await tailed.catch_up()

    assert handed.applied == tailed.applied == (journal.durable_position,)
    expected = await contents(tailed, ledgers, range(entries + 1))
    assert await contents(handed, ledgers, range(entries + 1)) == expected
    for statuses, _ in expected.values():  # every entry written, and one past the last
        assert [status for status, _ in statuses] == [BookieStatus.OK] * entries + [
            BookieStatus.NO_ENTRY
        ]
    stats = handed.stats
    assert stats.ledgerstore_add_entry == len(ledgers) * entries  # each applied once
    if queue_batches < 100:
        # The dropped commits were read from the file (no gap: the catch-up saw the
        # handed end past what it applied, and tailed).
        assert stats.handoff_dropped > 0 and tail_reads > 0
    elif journal.on_durable is not None and stats.handoff_gaps:
        # Wired late: the file tailer read across the gap, then the handoff took over.
        assert stats.handoff_gaps == 1 and tail_reads > 0
        # The gap's catch-up read the second part from the file; the third was handed.
        assert stats.handoff_records == len(ledgers) * 20
    else:
        # Every record came by the handoff: the journal files were never read.
        assert stats.handoff_dropped == 0 and stats.handoff_gaps == 0 and tail_reads == 0
        assert stats.handoff_records == len(ledgers) * (entries + 1)
    if max_file_mb == 1:
        assert journal.durable_position.file_id > 1
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)
    await journal.close()
    for store in (handed, tailed):
        await store.close()
