"""`quire shell readjournal|readlog|ledger|lastmark|bookiesanity` against a real bookie's
files and a real bookie over NATS, run as the operator runs them (the `quire` command)."""

from __future__ import annotations

import asyncio
import json

from shared import wire
from shared.config import QuireSettings
from shared.status import BookieStatus
from tests.integration.test_bookie import Bookie, bookie, frame, quick_flush
from tests.support.shell import shell


async def test_storage_shell_commands(nc, settings: QuireSettings) -> None:
    settings = quick_flush(settings)
    client = Bookie(nc, settings)
    (settings.data_dir / "cluster.json").write_text(json.dumps({"nats_url": settings.nats_url}))
    frames = [frame(60, e, e - 1, f"payload-{e}".encode()) for e in range(5)]
    async with bookie(settings):
        assert await client.add(frames, flags=wire.add_flags("crc32c")) == [BookieStatus.OK] * 5
        assert (await client.fence(60)).status is BookieStatus.OK
        for _ in range(200):
            index = await shell(settings, "ledger", "60")
            mark = await shell(settings, "lastmark")
            if len(index["entries"]) == 5 and mark["last_log_mark"]:
                break
            await asyncio.sleep(0.05)
        assert [e["entry_id"] for e in index["entries"]] == list(range(5))
        assert index["last_entry_id"] == 4 and index["lac"] == 3
        assert mark["journal_files"] == [1] and mark["last_log_mark"]["file"] == 1

        journal = await shell(settings, "readjournal", "--msg")
        kinds = [r["kind"] for r in journal]
        assert kinds.count("ENTRY") == 5 and "FENCE" in kinds and "BATCH" in kinds
        assert next(r for r in journal if r["kind"] == "ENTRY")["payload"] == "payload-0"

        log = await shell(settings, "readlog", str(index["entries"][0]["entry_log"]))
        assert [(r["ledger_id"], r["entry_id"]) for r in log] == [(60, e) for e in range(5)]

        sanity = await shell(settings, "bookiesanity", "--entries", "3")
        assert sanity["result"] == "OK" and sanity["ledger_id"] >= 2**63
