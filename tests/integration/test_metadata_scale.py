"""The metadata service with many ledgers: a page of the list costs the same wherever it is
(counted in index rows and buffers by PostgreSQL's EXPLAIN ANALYZE, at 100,000 ledgers),
and a change notification costs one message per change, delivered to the changed ledger's
watchers only (counted in messages, at 1,000 and at 100,000 ledgers)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from services.metadata.bench import fill_ledgers
from services.metadata.postgres import PostgresMetadataStore, connect, conninfo_from_url
from services.metadata.sql import SQL_LEDGER_IDS, SQL_LIST_LEDGERS
from shared.config import QuireSettings
from shared.metaclient import MetadataClient
from shared.models import LedgerMetadata, UpdateLedgerRequest
from shared.subjects import Subjects
from tests.support.inprocess import running_service, wait_until_serving

LEDGERS = 100_000
PAGE = 1000


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def buffers(node: dict[str, Any]) -> int:
    return node["Shared Hit Blocks"] + node["Shared Read Blocks"]


async def explain_page(conn, statement: str, after: int) -> dict[str, Any]:
    """The executed plan of the prepared listing statement for the page after `after`."""
    row = await (
        await conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {statement}({after}, {PAGE + 1})"
        )
    ).fetchone()
    return row["QUERY PLAN"][0]["Plan"]


async def test_every_page_of_100000_ledgers_reads_as_much_as_the_first(
    fresh_database_url: str,
) -> None:
    store = await PostgresMetadataStore.open(fresh_database_url, pool_size=1, timeout_s=5.0)
    try:
        await fill_ledgers(fresh_database_url, LEDGERS)
        conn = await connect(conninfo_from_url(fresh_database_url), 5.0)
        try:
            for name, sql in (("list", SQL_LIST_LEDGERS), ("ids", SQL_LEDGER_IDS)):
                params = sql.replace("%(after)s", "$1").replace("%(fetch_limit)s", "$2")
                await conn.execute(f"PREPARE {name}(bigint, bigint) AS {params}")
                # psycopg prepares the store's statements after a few uses; PostgreSQL may
                # then plan once for any parameters (generic) or per call (custom): both.
                for mode in ("force_custom_plan", "force_generic_plan"):
                    await conn.execute(f"SET plan_cache_mode = {mode}")
                    first, middle, last = [
                        await explain_page(conn, name, after)
                        for after in (-1, LEDGERS // 2, LEDGERS - PAGE - 2)
                    ]
                    for plan in (first, middle, last):
                        nodes = list(plan_nodes(plan))
                        kinds = {n["Node Type"] for n in nodes}
                        assert "Seq Scan" not in kinds and "Sort" not in kinds, (name, mode)
                        scan = next(n for n in nodes if n["Node Type"].startswith("Index"))
                        assert scan["Index Name"] == "ledgers_pkey"
                        # The page and one more row, never the rows before it.
                        assert scan["Actual Rows"] == PAGE + 1, (name, mode)
                    costs = [buffers(first), buffers(middle), buffers(last)]
                    assert max(costs) <= min(costs) + 5, (name, mode, costs)
        finally:
            await conn.close()
        # And the store answers those pages, each with its cursor.
        page = await store.list_ledgers(LEDGERS - PAGE - 1, PAGE)
        assert [m.ledger_id for m in page.ledgers] == list(range(LEDGERS - PAGE, LEDGERS))
        assert page.next_after is None
        page = await store.list_ledgers(LEDGERS // 2, PAGE)
        assert len(page.ledgers) == PAGE and page.next_after == LEDGERS // 2 + PAGE
    finally:
        await store.close()


async def test_a_change_notifies_only_the_watchers_of_its_ledger_one_message_a_change(
    settings: QuireSettings, fresh_database_url: str, nc
) -> None:
    meta_settings = settings.model_copy(update={"database_url": fresh_database_url})
    subjects = Subjects(meta_settings.subject_prefix)
    client = MetadataClient(nc, subjects)
    watch_messages: list[str] = []
    events: list[str] = []

    async def on_watch(msg) -> None:
        watch_messages.append(msg.subject)

    async def on_event(msg) -> None:
        events.append(msg.subject)

    async with running_service("metadata", meta_settings) as rt:
        await wait_until_serving(client)
        await fill_ledgers(fresh_database_url, 1000)
        # Everything the publisher sends: every watch notification and every event.
        await nc.subscribe(subjects.ledger_watches, cb=on_watch)
        await nc.subscribe(subjects.events_wildcard, cb=on_event)
        await nc.flush()
        publisher = rt.outbox_publisher
        watched = {10: [], 500: []}

        async def watch(ledger_id: int, seen: list[LedgerMetadata | None]) -> None:
            async for metadata in client.watch_ledger(ledger_id):
                seen.append(metadata)

        watchers = [asyncio.create_task(watch(i, seen)) for i, seen in watched.items()]
        try:
            await wait_for(lambda: all(len(seen) == 1 for seen in watched.values()))

            async def change(ledger_id: int, version: int) -> None:
                await client.update_ledger(
                    UpdateLedgerRequest(
                        ledger_id=ledger_id, expected_version=version, length=version + 1
                    )
                )

            # An unwatched ledger's change: one notification on its own subject, one event.
            await change(700, 0)
            await wait_for(lambda: len(watch_messages) == 1 and len(events) == 1)
            assert watch_messages == [subjects.ledger_watch(700)]
            # A watched ledger's change reaches its watcher only. Notifications reach a
            # connection in the order they were published, so once this one has arrived
            # the earlier one would have too: nothing of ledger 700 came to the watchers.
            await change(10, 0)
            await wait_for(lambda: len(watched[10]) == 2)
            assert [m.version for m in watched[10]] == [0, 1]
            assert [m.version for m in watched[500]] == [0]
            await wait_for(lambda: len(watch_messages) == 2 and len(events) == 2)
            published = publisher.published

            # 100 times the ledgers: still one notification and one event a change.
            await fill_ledgers(fresh_database_url, 99_000)
            await change(99_999, 0)
            await change(500, 0)
            await wait_for(lambda: len(watched[500]) == 2)
            await wait_for(lambda: len(watch_messages) == 4 and len(events) == 4)
            assert watch_messages[2:] == [subjects.ledger_watch(99_999), subjects.ledger_watch(500)]
            assert [m.version for m in watched[10]] == [0, 1]
            assert publisher.published == published + 2  # events JetStream acknowledged
        finally:
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)


async def wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
