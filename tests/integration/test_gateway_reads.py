"""Range reads through the gateway's `Ledgers.read_stream` (in this process, over the
protocol library's driver) against a real stack: a range far longer than any request is
read in one stream, in order, each entry asked of one bookie, the bookies asked in runs of
contiguous entries; the gateway's metrics count what was read."""

from __future__ import annotations

from contextlib import aclosing

from shared.subjects import Subjects
from tests.support.gateway import PASSWORD, create_ledgers, in_process_ledgers
from tests.support.stack import gateway_settings, running_stack

ENTRIES = 20_000
BATCH = 2_000


async def test_a_long_range_streams_in_order_from_every_bookie(
    settings, fresh_database_url, nc
) -> None:
    async with running_stack(settings, fresh_database_url) as stack:
        client_settings = gateway_settings(
            stack.settings, max_batch_entries=BATCH, read_entry_timeout_ms=5_000
        )
        subjects = Subjects(client_settings.subject_prefix)
        ledgers = in_process_ledgers(nc, client_settings)
        requests: dict[str, int] = {}

        def counter(bookie_id: str):
            async def count(msg) -> None:
                requests[bookie_id] = requests.get(bookie_id, 0) + 1

            return count

        try:
            (created,) = await create_ledgers(ledgers, 1)
            lid = created.ledger_id
            handle = ledgers.writers[lid]
            for first in range(0, ENTRIES, BATCH):
                await handle.append([b"entry %d" % e for e in range(first, first + BATCH)])
            subs = [
                await nc.subscribe(subjects.bookie(b, "read"), cb=counter(b))
                for b in created.segments[0].bookies
            ]
            await nc.flush()
            following = 0
            pages = ledgers.read_stream(lid, PASSWORD, 0, None)
            async with aclosing(pages):
                async for page in pages:
                    assert page.lac == ENTRIES - 1
                    for entry_id, payload in page.entries:
                        assert (entry_id, payload) == (following, b"entry %d" % following)
                        following += 1
                    assert page.final == (following == ENTRIES)
            await nc.flush()
            for sub in subs:
                await sub.unsubscribe()
            registry = ledgers.metrics.registry
            read_ok = registry.get_sample_value(
                "quire_gateway_read_entries_total", {"result": "ok"}
            )
            speculative = registry.get_sample_value("quire_gateway_speculative_reads_total")
        finally:
            await ledgers.stop()
    assert following == ENTRIES and read_ok == ENTRIES
    gateway = client_settings.gateway
    # Each bookie is asked about a third of the range (sticky blocks rotate over the
    # ensemble), in requests of at most read_batch_entries: no entry of the three write
    # set replicas is asked of all three, as reading each entry's first replica did.
    third = ENTRIES // 3 + gateway.sticky_read_block_entries
    for bookie_id, count in requests.items():
        assert ENTRIES // 3 // gateway.read_batch_entries <= count, (bookie_id, count)
        assert count <= 2 * third // gateway.read_batch_entries + 50, (bookie_id, count)
    assert speculative is None or speculative < ENTRIES // 100
