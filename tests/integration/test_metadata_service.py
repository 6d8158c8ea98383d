"""The metadata service in-process over real NATS and PostgreSQL, driven by MetadataClient."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from services.metadata.service import wall_clock_ms
from shared.config import QuireSettings
from shared.metaclient import METADATA_OPS, MetadataClient, MetadataError
from shared.models import (
    BookieState,
    LedgerState,
    MetaErrorCode,
    MetaReply,
    Segment,
    UpdateLedgerRequest,
)
from shared.subjects import Subjects
from tests.support.inprocess import running_service, wait_until_serving
from tests.support.metadata import ENSEMBLE, create_request

LEASE_MS = 300


@pytest.fixture
def meta_settings(settings: QuireSettings, fresh_database_url: str) -> QuireSettings:
    return settings.model_copy(
        update={
            "database_url": fresh_database_url,
            "metadata": settings.metadata.model_copy(update={"bookie_lease_ms": LEASE_MS}),
        }
    )


@pytest.fixture
async def client(meta_settings: QuireSettings, nc) -> AsyncIterator[MetadataClient]:
    async with running_service("metadata", meta_settings):
        client = MetadataClient(nc, Subjects(meta_settings.subject_prefix))
        await wait_until_serving(client)
        yield client


@pytest.fixture
async def events(meta_settings: QuireSettings, nc) -> AsyncIterator[list[dict]]:
    received: list[dict] = []

    async def collect(msg) -> None:
        received.append(json.loads(msg.data))

    sub = await nc.subscribe(Subjects(meta_settings.subject_prefix).events_wildcard, cb=collect)
    yield received
    await sub.unsubscribe()


async def wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_every_operation(client: MetadataClient, events: list[dict]) -> None:
    before_ms = wall_clock_ms()
    for bookie_id in ENSEMBLE:
        info = await client.register_bookie(bookie_id, info={"addr": bookie_id})
        assert info.state is BookieState.WRITABLE
        assert info.lease_expires_at == info.last_seen + LEASE_MS >= before_ms + LEASE_MS
    assert [b.bookie_id for b in await client.list_bookies()] == ENSEMBLE

    ledger = await client.create_ledger(create_request(metadata={"app": "test"}))
    assert (ledger.state, ledger.version, ledger.metadata) == (LedgerState.OPEN, 0, {"app": "test"})
    assert ledger.segments == [Segment(first_entry_id=0, bookies=ENSEMBLE)]
    assert ledger.ctime >= before_ms
    assert await client.get_ledger(ledger.ledger_id) == ledger
    chosen = await client.create_ledger(create_request(ledger_id=1000))
    assert chosen.ledger_id == 1000

    changed = await client.update_ledger(
        UpdateLedgerRequest(
            ledger_id=ledger.ledger_id,
            expected_version=0,
            segments=[
                Segment(first_entry_id=0, bookies=ENSEMBLE),
                Segment(first_entry_id=5, bookies=["bookie-1", "bookie-2", "bookie-4"]),
            ],
        )
    )
    assert changed.version == 1 and len(changed.segments) == 2
    closed = await client.update_ledger(
        UpdateLedgerRequest(
            ledger_id=ledger.ledger_id,
            expected_version=1,
            state=LedgerState.CLOSED,
            last_entry_id=9,
            length=90,
        )
    )
    assert (closed.state, closed.last_entry_id, closed.length, closed.version) == (
        LedgerState.CLOSED,
        9,
        90,
        2,
    )

    listed = await client.list_ledgers(limit=1)
    assert [m.ledger_id for m in listed.ledgers] == [ledger.ledger_id]
    assert listed.next_after == ledger.ledger_id
    rest = await client.list_ledgers(after=listed.next_after, limit=1)
    assert [m.ledger_id for m in rest.ledgers] == [1000] and rest.next_after is None

    await client.delete_ledger(ledger.ledger_id)
    with pytest.raises(MetadataError) as missing:
        await client.get_ledger(ledger.ledger_id)
    assert missing.value.code is MetaErrorCode.NO_SUCH_LEDGER
    with pytest.raises(MetadataError) as missing_delete:
        await client.delete_ledger(ledger.ledger_id)
    assert missing_delete.value.code is MetaErrorCode.NO_SUCH_LEDGER

    await client.unregister_bookie("bookie-2")
    states = {b.bookie_id: b.state for b in await client.list_bookies()}
    assert states == {
        "bookie-1": BookieState.WRITABLE,
        "bookie-2": BookieState.LOST,
        "bookie-3": BookieState.WRITABLE,
    }
    with pytest.raises(MetadataError) as alive:
        await client.remove_bookie("bookie-1")
    assert alive.value.code is MetaErrorCode.BOOKIE_ALIVE
    await client.remove_bookie("bookie-2")
    await client.remove_bookie("bookie-2")  # gone already: nothing to do
    assert [b.bookie_id for b in await client.list_bookies()] == ["bookie-1", "bookie-3"]

    def kinds() -> list[tuple[str, object]]:
        return [
            (e["kind"], e["bookie_id"] if e["ledger_id"] is None else e["ledger_id"])
            for e in events
        ]

    expected = [("bookie.registered", b) for b in ENSEMBLE] + [
        ("ledger.created", ledger.ledger_id),
        ("ledger.created", 1000),
        ("ledger.updated", ledger.ledger_id),
        ("ledger.closed", ledger.ledger_id),
        ("ledger.deleted", ledger.ledger_id),
        ("bookie.unregistered", "bookie-2"),
        ("bookie.removed", "bookie-2"),
    ]
    await wait_for(lambda: len(events) >= len(expected))
    assert kinds() == expected
    updated, closed_event = events[5]["data"], events[6]["data"]
    assert updated["ensemble_changed"] is True and len(updated["segments"]) == 2
    assert (closed_event["last_entry_id"], closed_event["length"]) == (9, 90)


async def test_bookie_lease_runs_out_and_heartbeats_renew_it(
    client: MetadataClient, events: list[dict]
) -> None:
    await client.register_bookie("bookie-1")
    await client.register_bookie("bookie-1")  # a heartbeat: no news
    await asyncio.sleep(LEASE_MS / 1000 + 0.05)
    assert [b.state for b in await client.list_bookies()] == [BookieState.LOST]
    back = await client.register_bookie("bookie-1", state=BookieState.READONLY)
    assert back.state is BookieState.READONLY
    await wait_for(lambda: len(events) >= 2)
    await asyncio.sleep(0.1)
    assert [(e["kind"], e["data"]["previous_state"]) for e in events] == [
        ("bookie.registered", None),
        ("bookie.registered", "lost"),
    ]


async def test_bad_version_carries_current(client: MetadataClient) -> None:
    ledger = await client.create_ledger(create_request())
    won = await client.update_ledger(
        UpdateLedgerRequest(
            ledger_id=ledger.ledger_id, expected_version=0, state=LedgerState.IN_RECOVERY
        )
    )
    with pytest.raises(MetadataError) as lost:
        await client.update_ledger(
            UpdateLedgerRequest(
                ledger_id=ledger.ledger_id,
                expected_version=0,
                state=LedgerState.CLOSED,
                last_entry_id=-1,
                length=0,
            )
        )
    assert lost.value.code is MetaErrorCode.BAD_VERSION
    assert lost.value.current == won
    with pytest.raises(MetadataError) as exists:
        await client.create_ledger(create_request(ledger_id=ledger.ledger_id))
    assert exists.value.code is MetaErrorCode.LEDGER_EXISTS


@pytest.mark.parametrize(
    ("op", "body", "mentions"),
    [
        ("ledger.create", b"{not json", "Invalid JSON"),
        ("ledger.get", b'{"ledger_id": 1, "color": "red"}', "color"),
        ("ledger.get", b'{"ledger_id": "one"}', "ledger_id"),
        ("ledger.get", b"[1, 2]", "body"),
        ("ledger.list", b'{"limit": 0}', "limit"),
        (
            "ledger.create",
            json.dumps(
                {
                    "ensemble_size": 3,
                    "write_quorum": 4,
                    "ack_quorum": 2,
                    "digest": "crc32c",
                    "ensemble": ENSEMBLE,
                }
            ).encode(),
            "quorum",
        ),
        (
            "ledger.update",
            json.dumps({"ledger_id": 0, "expected_version": 0, "segments": []}).encode(),
            "segments",
        ),
        (
            "ledger.update",
            json.dumps(
                {
                    "ledger_id": 0,
                    "expected_version": 0,
                    "segments": [
                        {"first_entry_id": 0, "bookies": ["a"]},
                        {"first_entry_id": 0, "bookies": ["b"]},
                    ],
                }
            ).encode(),
            "increasing",
        ),
        ("bookie.register", b'{"bookie_id": "b1", "state": "lost"}', "lost"),
        ("bookie.register", b'{"bookie_id": "no.dots"}', "bookie_id"),
    ],
)
async def test_bad_requests_are_answered_and_service_keeps_serving(
    client: MetadataClient, meta_settings: QuireSettings, nc, op: str, body: bytes, mentions: str
) -> None:
    msg = await nc.request(Subjects(meta_settings.subject_prefix).meta(op), body, timeout=5)
    reply = MetaReply.model_validate_json(msg.data)
    assert not reply.ok and reply.error is not None
    assert reply.error.code is MetaErrorCode.BAD_REQUEST
    assert mentions.lower() in reply.error.message.lower(), reply.error.message
    assert "\n" not in reply.error.message
    ledger = await client.create_ledger(create_request())
    assert (await client.get_ledger(ledger.ledger_id)).version == 0


async def test_empty_body_is_an_empty_request(
    client: MetadataClient, meta_settings: QuireSettings, nc
) -> None:
    msg = await nc.request(
        Subjects(meta_settings.subject_prefix).meta("bookie.list"), b"", timeout=5
    )
    assert MetaReply.model_validate_json(msg.data) == MetaReply(ok=True, result={"bookies": []})


async def test_two_instances_in_one_queue_group_both_serve(
    meta_settings: QuireSettings, nc
) -> None:
    client = MetadataClient(nc, Subjects(meta_settings.subject_prefix))
    async with (
        running_service("metadata", meta_settings, "metadata-1") as one,
        running_service("metadata", meta_settings, "metadata-2") as two,
    ):
        await wait_until_serving(client)
        created = await asyncio.gather(*(client.create_ledger(create_request()) for _ in range(40)))
        assert sorted(m.ledger_id for m in created) == list(range(40))
        for rt in (one, two):
            served = {e.name: e.num_requests for e in rt.micro.stats().endpoints}
            assert served.keys() == {op.replace(".", "_") for op in METADATA_OPS}
            assert served["ledger_create"] > 0, (rt.instance, served)


async def test_cluster_state_operations_over_nats(client: MetadataClient) -> None:
    instance = await client.instance_id()
    assert instance and await client.instance_id() == instance
    assert (await client.get_cookie("bookie-1")).data is None
    cookie = await client.put_cookie("bookie-1", "cookie-v1", -1)
    with pytest.raises(MetadataError) as lost:
        await client.put_cookie("bookie-1", "other", -1)
    assert lost.value.code is MetaErrorCode.BAD_VERSION
    assert (await client.get_cookie("bookie-1")) == cookie
    settings = await client.set_cluster_settings(lost_bookie_recovery_delay_s=5)
    assert settings.lost_bookie_recovery_delay_s == 5
    assert await client.get_cluster_settings() == settings

    for _ in range(6):
        await client.create_ledger(create_request())
    assert (await client.ledger_ranges()).ranges == [(0, 5)]
    for lid in range(6):
        await client.mark_underreplicated(lid, ["bookie-2"])

    async def worker(name: str) -> list[int]:
        held = []
        while (ledger := await client.claim_underreplicated(name, 30_000)) is not None:
            held.append(ledger.ledger_id)
        return held

    claims = await asyncio.gather(*(worker(f"w{i}") for i in range(4)))
    assert sorted(sum(claims, [])) == list(range(6))  # each ledger held by one worker
    owner = next(f"w{i}" for i, held in enumerate(claims) if 0 in held)
    assert await client.renew_underreplicated(0, owner, 30_000)
    assert await client.mark_replicated(0, owner, 1)
    listed = await client.list_underreplicated()
    assert [u.ledger_id for u in listed.ledgers] == [1, 2, 3, 4, 5]
    leadership = await client.elect_auditor("auditor-a", 5_000)
    assert leadership.is_leader and (await client.who_is_auditor()).leader_id == "auditor-a"
