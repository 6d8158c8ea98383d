"""Range reads through the gateway's `Ledgers.read_stream` (in this process, over the
protocol library's driver) against a real stack: a range far longer than any request is
read in one stream, in order, each entry asked of one bookie, the bookies asked in runs of
contiguous entries; the gateway's metrics count what was read."""

from __future__ import annotations

from contextlib import aclosing

import pytest

from services.gateway.ledgers import Page
from shared.status import ApiCodes, QuireError
from shared.subjects import Subjects
from shared.wire import decode_read_request
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
        asked: dict[str, list[int]] = {}

        def counter(bookie_id: str):
            async def count(msg) -> None:
                entries = [item.entry_id for item in decode_read_request(msg.data).items]
                assert len(entries) <= client_settings.gateway.read_batch_entries
                asked.setdefault(bookie_id, []).extend(entries)

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
    # Each entry asked about once in all (a few speculative reads aside), each bookie a
    # share of the range (sticky blocks rotate over the ensemble): not every entry of every
    # write set asked of all three bookies, as falling back after timeouts did.
    total = sum(len(entries) for entries in asked.values())
    assert ENTRIES <= total <= ENTRIES + (speculative or 0) + ENTRIES // 50, total
    assert sorted(asked) == sorted(created.segments[0].bookies)
    assert all(len(entries) >= ENTRIES // 6 for entries in asked.values())
    assert (speculative or 0) < ENTRIES // 100


async def test_the_facade_checks_before_the_first_page_and_caps_at_the_lac(
    settings, fresh_database_url, nc
) -> None:
    async with running_stack(settings, fresh_database_url) as stack:
        ledgers = in_process_ledgers(nc, stack.settings)

        async def pages(*args, **kwargs) -> list[Page]:
            stream = ledgers.read_stream(*args, **kwargs)
            async with aclosing(stream):
                return [page async for page in stream]

        try:
            (created,) = await create_ledgers(ledgers, 1)
            lid = created.ledger_id
            await ledgers.writers[lid].append([b"a", b"b", b"c"])
            for args, kwargs, api in [
                ((lid, b"wrong", 0, 2), {}, ApiCodes.UNAUTHORIZED),
                ((lid, PASSWORD, 0, None), {"unconfirmed": True}, ApiCodes.INVALID_ARGUMENT),
                ((lid, PASSWORD, 5, 2), {}, ApiCodes.INVALID_ARGUMENT),
            ]:
                with pytest.raises(QuireError) as info:
                    await anext(ledgers.read_stream(*args, **kwargs))
                assert info.value.api == api
            assert await pages(lid, PASSWORD, 3, None) == [Page([], 2, final=True)]
            [*_, last] = await pages(lid, PASSWORD, 1, 100)
            assert last.final and last.entries[-1] == (2, b"c")
            # Unconfirmed: past the LAC the range ends quietly where no replica has more.
            unconfirmed = await pages(lid, PASSWORD, 0, 10, unconfirmed=True)
            assert [e for page in unconfirmed for e in page.entries] == [
                (0, b"a"),
                (1, b"b"),
                (2, b"c"),
            ]
            assert [page.final for page in unconfirmed][-1] and unconfirmed[0].lac == 2
        finally:
            await ledgers.stop()
