"""Add flow control per bookie (gateway.max_add_requests_per_bookie), through the gateway's
Ledgers (in this process, over the protocol library's driver) against a real stack: while a
bookie has its limit of add requests unanswered, the adds for it are held and then go out
merged, so a trickle of appends becomes batches, within one ledger and across ledgers; the
gateway's metrics count both."""

from __future__ import annotations

import asyncio

import pytest

from shared import wire
from shared.subjects import Subjects
from tests.support.gateway import PASSWORD, bookie_client, create_ledgers, in_process_ledgers
from tests.support.stack import gateway_settings, running_stack

TRICKLE = 50


@pytest.mark.parametrize(("limit", "merged"), [(1, True), (1024, False)])
async def test_a_trickle_of_appends_is_merged_while_a_request_is_unanswered(
    settings, fresh_database_url, nc, limit: int, merged: bool
) -> None:
    async with running_stack(settings, fresh_database_url) as stack:
        client_settings = gateway_settings(stack.settings, max_add_requests_per_bookie=limit)
        ledgers = in_process_ledgers(nc, client_settings)
        try:
            (created,) = await create_ledgers(ledgers, 1)
            handle = ledgers.writers[created.ledger_id]
            requests: list[bytes] = []

            async def count(msg) -> None:
                requests.append(msg.data)

            subject = Subjects(stack.settings.subject_prefix).bookie("bookie-1", "add")
            sub = await nc.subscribe(subject, cb=count)
            await nc.flush()
            # One append per event-loop turn: without flow control, one request each.
            appends = []
            for i in range(TRICKLE + 1):
                appends.append(asyncio.create_task(handle.append([b"entry-%d" % i])))
                await asyncio.sleep(0)
            results = await asyncio.wait_for(asyncio.gather(*appends), 30)
            await nc.flush()
            await sub.unsubscribe()
            registry = ledgers.metrics.registry
            held = registry.get_sample_value("quire_gateway_add_sends_held_total")
            sent = registry.get_sample_value("quire_gateway_add_requests_total")
        finally:
            await ledgers.stop()
    # Every append is acknowledged, in order, whatever was held and merged.
    assert [(first, last) for first, last, _ in results] == [(i, i) for i in range(TRICKLE + 1)]
    # The metric counts every request sent, to the three bookies (bookie-1 is one of them).
    assert sent >= len(requests) and sent <= 3 * len(requests) + 3
    if merged:
        # The first append's request was unanswered through the whole trickle (a bookie
        # round trip is far longer than these loop turns): the rest went out together.
        assert len(requests) <= 5, len(requests)
        assert held >= TRICKLE
    else:
        assert len(requests) > TRICKLE // 2, len(requests)
        assert held == 0


LEDGERS = 60


async def test_the_sends_of_many_ledgers_to_a_bookie_go_out_merged(
    settings, fresh_database_url, nc
) -> None:
    """One append to each of many ledgers at once: each ledger's writer sends its own add to
    each bookie, and the gateway merges them into a few requests per bookie (at most
    max_add_requests_per_bookie unanswered), each writer still getting its own answer."""
    async with running_stack(settings, fresh_database_url) as stack:
        client_settings = gateway_settings(stack.settings, max_add_requests_per_bookie=2)
        subjects = Subjects(client_settings.subject_prefix)
        ledgers = in_process_ledgers(nc, client_settings)
        try:
            created = await create_ledgers(ledgers, LEDGERS, ack_quorum=3)
            requests: list[bytes] = []

            async def count(msg) -> None:
                requests.append(msg.data)

            sub = await nc.subscribe(subjects.bookie("bookie-1", "add"), cb=count)
            await nc.flush()
            appends = [
                ledgers.writers[c.ledger_id].append([b"to %d" % c.ledger_id]) for c in created
            ]
            results = await asyncio.wait_for(asyncio.gather(*appends), 30)
            await nc.flush()
            await sub.unsubscribe()
            registry = ledgers.metrics.registry
            sends = registry.get_sample_value("quire_gateway_add_sends_total")
            sent = registry.get_sample_value("quire_gateway_add_requests_total")
            read_back = [await ledgers.read_entry(c.ledger_id, PASSWORD, 0) for c in created]
        finally:
            await ledgers.stop()
    assert [first for first, _, _ in results] == [0] * LEDGERS
    assert [payload for payload, _ in read_back] == [b"to %d" % c.ledger_id for c in created]
    # Every ledger of 3 bookies sent one add to each: 3 x LEDGERS sends, in a few requests.
    assert sends == 3 * LEDGERS
    assert len(requests) <= 6, len(requests)
    assert sent <= 3 * 6


async def test_the_explicit_lacs_of_many_idle_ledgers_go_out_merged(
    settings, fresh_database_url, nc
) -> None:
    """Ledgers that went idle at the same time each owe their bookies an explicit LAC: the
    gateway sends them as one write_lac request per bookie, not one per ledger."""
    async with running_stack(settings, fresh_database_url) as stack:
        client_settings = gateway_settings(stack.settings, explicit_lac_interval_ms=200)
        subjects = Subjects(client_settings.subject_prefix)
        bookies = bookie_client(nc, client_settings)
        ledgers = in_process_ledgers(nc, client_settings)
        requests: list[bytes] = []

        async def count(msg) -> None:
            requests.append(msg.data)

        try:
            created = await create_ledgers(ledgers, LEDGERS, ack_quorum=3)
            sub = await nc.subscribe(subjects.bookie("bookie-1", "write_lac"), cb=count)
            await nc.flush()
            # Two entries each: the second carries LAC 0, only an explicit LAC gives LAC 1.
            await asyncio.gather(
                *(ledgers.writers[c.ledger_id].append([b"a", b"b"]) for c in created)
            )
            deadline = asyncio.get_running_loop().time() + 10
            while True:
                lacs = [(await bookies.read_lac("bookie-1", c.ledger_id)).lac for c in created]
                if lacs == [1] * LEDGERS or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
            await nc.flush()
            await sub.unsubscribe()
        finally:
            await ledgers.stop()
    assert lacs == [1] * LEDGERS  # every ledger's LAC reached the bookie
    items = sum(len(wire.decode_write_lac_request(data)) for data in requests)
    assert items >= LEDGERS
    assert len(requests) <= 6, len(requests)
