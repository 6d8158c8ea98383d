"""The journal's `journal.delete` (the garbage collector's request) on a real journal:
DELETED records fsynced before the answer, the ledger forgotten (a fence afterwards starts
it afresh), still forgotten after a restart (replay, and snapshot tombstones once the
journal file holding the record is gone), bad input refused with nothing changed."""

from __future__ import annotations

import json
import os

import pytest

from shared import wire
from shared.bookie.journal_dir import journal_files
from shared.bookie.journal_format import (
    FILE_HEADER_SIZE,
    JournalPosition,
    LedgerDeletedRecord,
    scan_records,
)
from shared.config import QuireSettings
from shared.service import ServiceRuntime
from shared.status import BookieStatus
from tests.integration.test_bookie import KEY, OTHER_KEY, Bookie, bookie, frame
from tests.support.inprocess import running_service
from tests.support.wait import until


def ledgers(rt: ServiceRuntime) -> float:
    """The ledgers the journal holds state of, from its metrics."""
    return rt.metrics.scrape().value("quire_journal_ledgers")  # type: ignore[attr-defined]


def written(rt: ServiceRuntime) -> tuple[float, float, float]:
    """(ledgers, records, bytes) the journal holds and has written: unchanged, nothing was
    journaled."""
    metrics = rt.metrics.scrape()  # type: ignore[attr-defined]
    return (
        metrics.value("quire_journal_ledgers"),
        metrics.value("quire_journal_records_total"),
        metrics.value("quire_journal_written_bytes_total"),
    )


async def delete(client: Bookie, body: object) -> dict:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return json.loads(await client.call("journal.delete", data))


def deleted_records(settings: QuireSettings) -> list[tuple[int, JournalPosition]]:
    """(ledger, position after its record) of every DELETED record in the journal files."""
    directory = settings.bookie_dir / "journal"
    found = []
    for file_id in journal_files(directory):
        data = (directory / f"journal-{file_id:06d}.log").read_bytes()
        for scanned in scan_records(memoryview(data)[FILE_HEADER_SIZE:]).records:
            if isinstance(scanned.record, LedgerDeletedRecord):
                end = FILE_HEADER_SIZE + scanned.end
                found.append((scanned.record.ledger_id, JournalPosition(file_id, end)))
    return found


async def test_delete_is_journaled_before_the_answer_and_the_ledger_is_forgotten(
    nc, settings
) -> None:
    client = Bookie(nc, settings)
    async with running_service("journal", settings) as rt:
        assert await client.add([frame(1, 0), frame(2, 0)]) == [BookieStatus.OK] * 2
        assert (await client.fence(2)).status is BookieStatus.OK
        # Control: another key on a ledger the bookie knows is refused.
        assert (await client.fence(1, OTHER_KEY)).status is BookieStatus.UNAUTHORIZED
        reply = await delete(client, {"ledgers": [1, 1, 7]})  # 7: never seen, harmless
        assert reply["ok"] is True, reply
        (position,) = [JournalPosition.from_json(p) for p in reply["positions"]]
        # Answered means written and fsynced: the records are in the file, before the
        # position the answer names.
        records = deleted_records(settings)
        assert [ledger for ledger, _ in records] == [1, 7]
        assert all(end <= position for _, end in records)
        assert ledgers(rt) == 1  # ledger 2 only
    async with running_service("journal", settings) as rt:  # replay meets the DELETED record
        assert ledgers(rt) == 1
        # Forgotten: the ledger starts afresh under whatever key comes first.
        fenced = await client.fence(1, OTHER_KEY)
        assert (fenced.status, fenced.lac, fenced.last_entry_id) == (BookieStatus.OK, -1, -1)
        # The fenced ledger that was not deleted is still fenced.
        assert await client.add([frame(2, 1)]) == [BookieStatus.FENCED]


async def test_a_deleted_ledger_stays_forgotten_once_its_journal_file_is_gone(nc, settings) -> None:
    # Small files and frequent checkpoints: the file with the DELETED record is deleted,
    # so the restart knows of the deletion only from the snapshot's tombstone.
    settings = settings.model_copy(
        update={
            "journal": settings.journal.model_copy(update={"max_size_mb": 1, "max_backups": 0}),
            "ledgerstore": settings.ledgerstore.model_copy(update={"flush_interval_ms": 50}),
        }
    )
    client = Bookie(nc, settings)
    payload = os.urandom(20_000)
    async with bookie(settings):
        assert await client.add([frame(30, 0, payload=payload)]) == [BookieStatus.OK]
        assert (await client.fence(30)).status is BookieStatus.OK
        assert await client.add([frame(31, 0, payload=payload)]) == [BookieStatus.OK]
        reply = await delete(client, {"ledgers": [30]})
        assert reply["ok"] is True, reply
        (position,) = [JournalPosition.from_json(p) for p in reply["positions"]]
        for e in range(1, 120):
            assert await client.add([frame(31, e, e - 1, payload)]) == [BookieStatus.OK]

        async def file_gone() -> bool:
            return min(journal_files(settings.bookie_dir / "journal")) > position.file_id

        await until(file_gone, "the journal file with the DELETED record to be deleted")
    assert deleted_records(settings) == []
    async with running_service("journal", settings):
        fenced = await client.fence(30, OTHER_KEY)
        assert (fenced.status, fenced.last_entry_id) == (BookieStatus.OK, -1)
        assert await client.add([frame(31, 120, 119, payload)], key=OTHER_KEY) == [
            BookieStatus.UNAUTHORIZED
        ]


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        {},
        {"ledgers": []},
        {"ledgers": 5},
        {"ledgers": [1, -1]},
        {"ledgers": [1, 2**64]},
        {"ledgers": [1, "2"]},
        {"ledgers": [1, True]},
        {"ledgers": [1.0]},
        {"ledgers": list(range(10_001))},
        {"ledgers": [1], "force": True},
    ],
)
async def test_bad_input_is_refused_and_changes_nothing(nc, settings, body) -> None:
    client = Bookie(nc, settings)
    async with running_service("journal", settings) as rt:
        assert await client.add([frame(1, 0)]) == [BookieStatus.OK]
        before = written(rt)
        reply = await delete(client, body)
        assert reply["ok"] is False and reply["error"] == "BAD_REQUEST", reply
        assert reply["message"]
        assert written(rt) == before
        assert deleted_records(settings) == []
        assert await client.add([frame(1, 1)], key=KEY) == [BookieStatus.OK]


async def test_a_read_only_bookie_still_deletes(nc, settings) -> None:
    client = Bookie(nc, settings)
    settings = settings.model_copy(
        update={
            "ledgerstore": settings.ledgerstore.model_copy(
                update={"disk_usage_threshold": 0.0001, "disk_usage_lwm_threshold": 0.0001}
            )
        }
    )
    async with running_service("journal", settings) as rt:
        assert await client.add([frame(1, 0)]) == [BookieStatus.READ_ONLY]
        assert await client.add([frame(1, 0)], flags=wire.FLAG_RECOVERY_ADD) == [BookieStatus.OK]
        reply = await delete(client, {"ledgers": [1]})
        assert reply["ok"] is True, reply
        assert ledgers(rt) == 0
