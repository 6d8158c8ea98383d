"""End to end, issue 13's third point: a burst of huge range reads must not leave an
overload behind it. Several readers stream a whole 20,000-entry ledger over HTTP, again and
again, cold (the bookies' files evicted from the page cache), and are cut off; from then on
a small read (entries 0-9) must answer within a second, and the bookies must stop serving
the burst's reads once their clients' deadlines have passed: their ledgerstores' metrics
show empty read queues (`quire_ledgerstore_read_queue_requests`,
`bookkeeper_server_READ_ENTRY_IN_PROGRESS`: the bookie side of issue 13) and no more
entries read.

Before issue 13 every read answered 504 for about a minute after such a burst: the reads
already sent kept being served after the gateway gave up on them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from quire.bench import pagecache
from quire.client import HttpClient
from shared.config import GatewaySettings
from shared.metrics import Scrape, scrape
from tests.support.cluster import QuireUp

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PASSWORD = "overload"
AUTH = {"Quire-Ledger-Password": PASSWORD}
ENTRIES = 20_000
ENTRY_SIZE = 1024
READERS = 6
BURST_S = 4.0
SMALL_READ_WITHIN_S = 1.0
# A bookie drops, unread, a request that waited past the client's timeout budget (the wire
# carries it), so nothing of the burst is served later than this after it ends (+ a margin).
DRAINED_WITHIN_S = GatewaySettings().read_entry_timeout_ms / 1000 + 1.0


@pytest.fixture(scope="module")
def cluster(cluster_dir) -> Iterator[QuireUp]:
    up = QuireUp(cluster_dir("read-overload") / "quire-data", bookies=4)
    with up.running():
        yield up


def bookie_ids(up: QuireUp) -> list[str]:
    return [r["bookie_id"] for r in up.cluster_json()["services"] if r["kind"] == "ledgerstore"]


async def ledgerstore_stats(up: QuireUp) -> dict[str, Scrape]:
    """Each bookie's ledgerstore metrics, scraped from the URL cluster.json gives."""
    rows = [r for r in up.cluster_json()["services"] if r["kind"] == "ledgerstore"]
    scrapes = await asyncio.gather(*(scrape(r["metrics"]) for r in rows))
    return {r["bookie_id"]: s for r, s in zip(rows, scrapes, strict=True)}


async def write_cold_ledger(up: QuireUp) -> int:
    """A closed ledger of ENTRIES, flushed by every bookie, its files out of the page cache."""
    async with HttpClient(up.url) as client:
        created = await client.create(password=PASSWORD, ensemble_size=3, write_quorum=3)
        payloads = [bytes([i % 256]) * ENTRY_SIZE for i in range(ENTRIES)]
        await client.append_many(created.ledger_id, PASSWORD, payloads, batch=500)
        assert await client.close(created.ledger_id, PASSWORD) == ENTRIES - 1
    deadline = time.monotonic() + 30
    while any(s.value("bookie_write_cache_count") for s in (await ledgerstore_stats(up)).values()):
        assert time.monotonic() < deadline, "the bookies did not flush their write caches"
        await asyncio.sleep(0.1)
    pagecache.drop(pagecache.files_under([up.data_dir / b for b in bookie_ids(up)]))
    return created.ledger_id


async def reader(http: httpx.AsyncClient, ledger_id: int, received: list[int]) -> None:
    """The whole ledger, streamed, again and again until cancelled; a failed or broken-off
    stream is part of the burst, not an error of the test."""
    params = {"from": 0, "to": ENTRIES - 1}
    while True:
        try:
            url = f"/v1/ledgers/{ledger_id}/entries"
            async with http.stream("GET", url, params=params, headers=AUTH) as response:
                async for chunk in response.aiter_bytes():
                    received[0] += len(chunk)
        except httpx.HTTPError:
            pass


async def small_read(http: httpx.AsyncClient, ledger_id: int) -> str | None:
    """None once entries 0-9 came back, else what came instead."""
    try:
        response = await http.get(
            f"/v1/ledgers/{ledger_id}/entries", params={"from": 0, "to": 9}, headers=AUTH
        )
    except httpx.HTTPError as exc:
        return repr(exc)
    if response.status_code == 200 and len(response.json()["entries"]) == 10:
        return None
    return f"{response.status_code}: {response.text[:300]}"


def read_counts(stats: dict[str, Scrape]) -> dict[str, float]:
    return {bookie: s.value("quire_ledgerstore_read_entries_total") for bookie, s in stats.items()}


async def burst_then_small_reads(up: QuireUp) -> None:
    ledger_id = await write_cold_ledger(up)
    received = [0]
    async with httpx.AsyncClient(base_url=up.url, timeout=60) as http:
        readers = [asyncio.create_task(reader(http, ledger_id, received)) for _ in range(READERS)]
        await asyncio.wait(readers, timeout=BURST_S)  # they never end by themselves
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    burst_end = time.monotonic()
    assert received[0] > 0, "the burst read nothing: no load was made"
    at_burst_end = read_counts(await ledgerstore_stats(up))

    # A small read, asked again and again (each with 1 s to answer) until it answers.
    async with httpx.AsyncClient(base_url=up.url, timeout=SMALL_READ_WITHIN_S) as http:
        deadline = burst_end + 30
        while (problem := await small_read(http, ledger_id)) is not None:
            assert time.monotonic() < deadline, f"no small read answered in 30 s: {problem}"
            await asyncio.sleep(0.05)
    answered_after_s = time.monotonic() - burst_end
    assert answered_after_s <= SMALL_READ_WITHIN_S, (
        f"entries 0-9 answered {answered_after_s:.2f} s after the burst ended"
    )

    # Drained: every bookie's read queue empty, nothing in progress, and its read counter
    # unchanged since the previous reading (a poll apart).
    deadline = burst_end + 30
    before = read_counts(await ledgerstore_stats(up))
    while True:
        await asyncio.sleep(0.25)
        stats = await ledgerstore_stats(up)
        now = read_counts(stats)
        load = {
            bookie: (
                s.value("quire_ledgerstore_read_queue_requests"),
                s.value("bookkeeper_server_READ_ENTRY_IN_PROGRESS"),
            )
            for bookie, s in stats.items()
        }
        busy = {bookie: counts for bookie, counts in load.items() if any(counts)}
        if now == before and not busy:
            break
        assert time.monotonic() < deadline, f"the bookies still serve reads 30 s on: {busy}"
        before = now
    drained_after_s = time.monotonic() - burst_end
    served_after = {b: now[b] - at_burst_end[b] for b in now}
    assert drained_after_s <= DRAINED_WITHIN_S, (
        f"the bookies served reads until {drained_after_s:.2f} s after the burst "
        f"({served_after} entries after its end)"
    )


def test_a_burst_of_huge_reads_leaves_small_reads_answered_within_a_second(cluster) -> None:
    asyncio.run(burst_then_small_reads(cluster))
