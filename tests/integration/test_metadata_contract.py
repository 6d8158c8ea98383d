"""One contract, two stores: every test here runs against PostgresMetadataStore (real
PostgreSQL) and InMemoryMetadataStore, so the in-memory store provably behaves like the
real one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from services.metadata import core
from services.metadata.memory import InMemoryMetadataStore
from services.metadata.postgres import PostgresMetadataStore
from services.metadata.store import (
    BadVersion,
    BookieAlive,
    CookieBadVersion,
    LedgerClosedError,
    LedgerExists,
    MetadataStore,
    NoSuchCookie,
    NoSuchLedger,
)
from shared.digest import mac_key, master_key
from shared.models import (
    NO_VERSION,
    PRIVATE_LEDGER_FIELDS,
    BookieState,
    CreateLedgerRequest,
    DeleteCookieRequest,
    LedgerState,
    MarkUnderreplicatedRequest,
    MetaErrorCode,
    PutCookieRequest,
    RegisterBookieRequest,
    Segment,
    SetClusterSettingsRequest,
    UpdateLedgerRequest,
)
from tests.support.metadata import ENSEMBLE
from tests.support.metadata import create_request as base_request


def create_request(ledger_id: int | None = None, **extra) -> CreateLedgerRequest:
    return base_request(ledger_id, password_salt="salt", password_hash="hash", **extra)


@pytest.fixture(params=["postgres", "memory"])
async def store(request, fresh_database_url: str) -> AsyncIterator[MetadataStore]:
    if request.param == "memory":
        yield InMemoryMetadataStore()
        return
    opened = await PostgresMetadataStore.open(fresh_database_url, pool_size=8, timeout_s=5.0)
    yield opened
    await opened.close()


async def drain_outbox(store: MetadataStore) -> list[tuple[str, object, dict]]:
    """Everything in the outbox as (event kind, ledger or bookie id, data), marked published."""
    out = []
    async with store.outbox() as reader:
        assert reader is not None
        while records := await reader.fetch(100):
            for record in records:
                events, _ = core.outbox_events(record)
                for event in events:
                    who = record.ledger_id if record.ledger_id is not None else record.bookie_id
                    out.append((event.kind, who, event.data))
            await reader.mark_published(records)
    return out


# -- ledgers ------------------------------------------------------------------------------


async def test_create_and_get(store: MetadataStore) -> None:
    created = await store.create_ledger(create_request(metadata={"k": "v"}), ctime_ms=1234)
    assert created.ledger_id == 0
    assert created.state is LedgerState.OPEN
    assert (created.version, created.ctime, created.format_version) == (0, 1234, 3)
    assert created.segments == [Segment(first_entry_id=0, bookies=ENSEMBLE)]
    assert created.last_entry_id is None and created.length == 0
    assert (created.password_salt, created.password_hash) == ("salt", "hash")
    assert await store.get_ledger(0) == created
    second = await store.create_ledger(create_request(), ctime_ms=1)
    assert second.ledger_id == 1
    with pytest.raises(NoSuchLedger):
        await store.get_ledger(99)


async def test_ledger_keys_are_stored_kept_by_updates_and_never_public(
    store: MetadataStore,
) -> None:
    keys = {"master_key": master_key(b"pw").hex(), "mac_key": mac_key(b"pw").hex()}
    ledger = await store.create_ledger(create_request(**keys), 1)
    assert (ledger.master_key, ledger.mac_key) == (keys["master_key"], keys["mac_key"])
    change = await store.update_ledger(
        UpdateLedgerRequest(ledger_id=ledger.ledger_id, expected_version=0, length=10), 2
    )
    assert (change.metadata.master_key, change.metadata.mac_key) == tuple(keys.values())
    assert await store.get_ledger(ledger.ledger_id) == change.metadata
    page = await store.list_ledgers(None, 10)
    assert page.ledgers[0].master_key == keys["master_key"]
    public = change.metadata.public()
    assert not PRIVATE_LEDGER_FIELDS & public.keys()
    assert not {keys["master_key"], keys["mac_key"]} & {str(v) for v in public.values()}
    # A ledger created without them (before format 3) reads back as "": not re-replicable.
    legacy = await store.create_ledger(create_request(), 3)
    assert (legacy.master_key, legacy.mac_key) == ("", "")
    # The events say nothing of the keys.
    for _, _, data in await drain_outbox(store):
        assert keys["master_key"] not in repr(data) and keys["mac_key"] not in repr(data)


async def test_creator_token_makes_a_retried_create_idempotent(store: MetadataStore) -> None:
    first = await store.create_ledger(create_request(7, creator_token=42), 1)
    assert first.creator_token == 42
    assert await store.create_ledger(create_request(7, creator_token=42), 2) == first
    with pytest.raises(LedgerExists):
        await store.create_ledger(create_request(7, creator_token=43), 3)
    with pytest.raises(LedgerExists):
        await store.create_ledger(create_request(7), 3)
    assert [e[0] for e in await drain_outbox(store)] == ["ledger.created"]


async def test_user_chosen_ids_and_sequence_skips_them(store: MetadataStore) -> None:
    for chosen in (0, 1, 2, 5):
        assert (await store.create_ledger(create_request(chosen), 0)).ledger_id == chosen
    with pytest.raises(LedgerExists):
        await store.create_ledger(create_request(5), 0)
    allocated = [(await store.create_ledger(create_request(), 0)).ledger_id for _ in range(3)]
    assert allocated == [3, 4, 6]


async def test_list_pages_in_id_order(store: MetadataStore) -> None:
    for chosen in (7, 3, 11, 5, 9):
        await store.create_ledger(create_request(chosen), 0)
    first = await store.list_ledgers(after=None, limit=2)
    assert [m.ledger_id for m in first.ledgers] == [3, 5]
    assert first.next_after == 5
    second = await store.list_ledgers(after=5, limit=2)
    assert [m.ledger_id for m in second.ledgers] == [7, 9]
    last = await store.list_ledgers(after=second.next_after, limit=2)
    assert [m.ledger_id for m in last.ledgers] == [11]
    assert last.next_after is None
    exact = await store.list_ledgers(after=None, limit=5)
    assert len(exact.ledgers) == 5 and exact.next_after is None


async def test_ledger_ranges(store: MetadataStore) -> None:
    for chosen in (1, 2, 3, 7, 9, 10, 20):
        await store.create_ledger(create_request(chosen), 0)
    page = await store.ledger_ranges(after=None, limit=5)
    assert page.ranges == [(1, 3), (7, 7), (9, 9)] and page.next_after == 9
    rest = await store.ledger_ranges(after=page.next_after, limit=5)
    assert rest.ranges == [(10, 10), (20, 20)] and rest.next_after is None


async def test_update_is_compare_and_set(store: MetadataStore) -> None:
    ledger = await store.create_ledger(create_request(), 0)
    new_segments = [
        Segment(first_entry_id=0, bookies=ENSEMBLE),
        Segment(first_entry_id=10, bookies=["bookie-1", "bookie-4", "bookie-3"]),
    ]
    change = await store.update_ledger(
        UpdateLedgerRequest(ledger_id=ledger.ledger_id, expected_version=0, segments=new_segments),
        1,
    )
    assert change.metadata.version == 1
    assert change.metadata.segments == new_segments
    assert change.segments_changed and change.previous_state is LedgerState.OPEN

    with pytest.raises(BadVersion) as lost:
        await store.update_ledger(
            UpdateLedgerRequest(
                ledger_id=ledger.ledger_id, expected_version=0, state=LedgerState.CLOSED
            ),
            2,
        )
    assert lost.value.current == change.metadata

    closed = await store.update_ledger(
        UpdateLedgerRequest(
            ledger_id=ledger.ledger_id,
            expected_version=1,
            state=LedgerState.CLOSED,
            last_entry_id=41,
            length=4200,
        ),
        3,
    )
    assert closed.metadata.version == 2
    assert (closed.metadata.state, closed.metadata.last_entry_id, closed.metadata.length) == (
        LedgerState.CLOSED,
        41,
        4200,
    )
    assert closed.metadata.segments == new_segments  # untouched fields stay
    assert not closed.segments_changed and closed.previous_state is LedgerState.OPEN
    assert await store.get_ledger(ledger.ledger_id) == closed.metadata
    with pytest.raises(NoSuchLedger):
        await store.update_ledger(
            UpdateLedgerRequest(ledger_id=999, expected_version=0, length=1), 4
        )
    events = await drain_outbox(store)
    assert [(kind, who) for kind, who, _ in events] == [
        ("ledger.created", 0),
        ("ledger.updated", 0),
        ("ledger.closed", 0),
    ]
    assert events[1][2]["ensemble_changed"] is True and len(events[1][2]["segments"]) == 2
    assert (events[2][2]["last_entry_id"], events[2][2]["length"]) == (41, 4200)


async def test_concurrent_cas_has_exactly_one_winner_per_version(store: MetadataStore) -> None:
    ledger = await store.create_ledger(create_request(), 0)
    for version in range(5):

        async def attempt(length: int, expected: int = version):
            return await store.update_ledger(
                UpdateLedgerRequest(
                    ledger_id=ledger.ledger_id, expected_version=expected, length=length
                ),
                0,
            )

        outcomes = await asyncio.gather(*(attempt(i) for i in range(30)), return_exceptions=True)
        winners = [o for o in outcomes if not isinstance(o, BaseException)]
        losers = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(winners) == 1
        assert all(isinstance(o, BadVersion) for o in losers), losers
        stored = await store.get_ledger(ledger.ledger_id)
        assert stored.version == version + 1
        assert stored.length == winners[0].metadata.length
        assert all(o.current.version >= version + 1 for o in losers)
    changes = [e for e in await drain_outbox(store) if e[0] == "ledger.updated"]
    assert [e[2]["version"] for e in changes] == [1, 2, 3, 4, 5]


async def test_parallel_creates_are_unique_and_listed_once(store: MetadataStore) -> None:
    created = await asyncio.gather(*(store.create_ledger(create_request(), 0) for _ in range(60)))
    ids = [m.ledger_id for m in created]
    assert len(set(ids)) == 60
    listed, after = [], None
    while True:
        page = await store.list_ledgers(after=after, limit=7)
        listed += [m.ledger_id for m in page.ledgers]
        if page.next_after is None:
            break
        after = page.next_after
    assert listed == sorted(ids)


async def test_listing_under_concurrent_creates_and_deletes(store: MetadataStore) -> None:
    """Keyset pages: a ledger that exists throughout the listing is listed exactly once,
    whatever is created or deleted meanwhile; nothing is listed twice."""
    stable = [(await store.create_ledger(create_request(i * 10), 0)).ledger_id for i in range(20)]
    churn_ids = [i * 10 + 5 for i in range(20)]

    async def churn() -> None:
        for lid in churn_ids:
            await store.create_ledger(create_request(lid), 0)
        for lid in churn_ids[::2]:
            await store.delete_ledger(lid, 0)

    async def list_all() -> list[int]:
        seen, after = [], None
        while True:
            page = await store.list_ledgers(after=after, limit=3)
            seen += [m.ledger_id for m in page.ledgers]
            if page.next_after is None:
                return seen
            after = page.next_after

    seen, _ = await asyncio.gather(list_all(), churn())
    assert len(seen) == len(set(seen)) and seen == sorted(seen)
    assert set(stable) <= set(seen)


async def test_delete(store: MetadataStore) -> None:
    ledger = await store.create_ledger(create_request(), 0)
    await store.delete_ledger(ledger.ledger_id, 5)
    with pytest.raises(NoSuchLedger):
        await store.get_ledger(ledger.ledger_id)
    with pytest.raises(NoSuchLedger):
        await store.delete_ledger(ledger.ledger_id, 6)
    # A deleted id is not handed out again.
    assert (await store.create_ledger(create_request(), 0)).ledger_id == ledger.ledger_id + 1
    assert [(k, who) for k, who, _ in await drain_outbox(store)] == [
        ("ledger.created", 0),
        ("ledger.deleted", 0),
        ("ledger.created", 1),
    ]


# -- bookies, cookies, cluster ------------------------------------------------------------


async def test_bookie_leases(store: MetadataStore) -> None:
    lease_ms = 100
    first = await store.register_bookie(
        RegisterBookieRequest(bookie_id="bookie-1", info={"host": "a"}), 1_000, lease_ms
    )
    assert first.previous_state is None
    assert first.info.state is BookieState.WRITABLE
    assert (first.info.last_seen, first.info.lease_expires_at) == (1_000, 1_100)
    await store.register_bookie(
        RegisterBookieRequest(bookie_id="bookie-2", state=BookieState.READONLY), 1_000, 500
    )
    assert [(b.bookie_id, b.state) for b in await store.list_bookies(1_099)] == [
        ("bookie-1", BookieState.WRITABLE),
        ("bookie-2", BookieState.READONLY),
    ]
    assert [b.state for b in await store.list_bookies(1_100)] == [
        BookieState.LOST,
        BookieState.READONLY,
    ]
    back = await store.register_bookie(
        RegisterBookieRequest(bookie_id="bookie-1", info={"host": "b"}), 1_200, lease_ms
    )
    assert back.previous_state is BookieState.LOST
    assert back.info.state is BookieState.WRITABLE and back.info.info == {"host": "b"}
    renewed = await store.register_bookie(
        RegisterBookieRequest(bookie_id="bookie-1"), 1_250, lease_ms
    )
    assert renewed.previous_state is BookieState.WRITABLE
    gone = await store.unregister_bookie("bookie-2", 1_300)
    assert gone is not None and gone.state is BookieState.LOST
    assert await store.unregister_bookie("bookie-9", 1_300) is None
    assert [(k, who, d.get("previous_state")) for k, who, d in await drain_outbox(store)] == [
        ("bookie.registered", "bookie-1", None),
        ("bookie.registered", "bookie-2", None),
        ("bookie.registered", "bookie-1", "lost"),  # the renewal at 1_250 is no news
        ("bookie.unregistered", "bookie-2", None),
    ]


async def test_only_a_lapsed_bookie_is_removed_and_a_later_one_registers_anew(
    store: MetadataStore,
) -> None:
    await store.register_bookie(RegisterBookieRequest(bookie_id="bookie-1"), 1_000, 100)
    await store.register_bookie(RegisterBookieRequest(bookie_id="bookie-2"), 1_000, 100)
    with pytest.raises(BookieAlive) as alive:
        await store.remove_bookie("bookie-1", 1_099)
    assert alive.value.code is MetaErrorCode.BOOKIE_ALIVE
    await store.remove_bookie("bookie-1", 1_100)  # the lease expires at 1_100
    assert [b.bookie_id for b in await store.list_bookies(1_100)] == ["bookie-2"]
    await store.remove_bookie("bookie-1", 1_200)  # already gone: nothing to do
    await store.remove_bookie("bookie-9", 1_200)  # never registered: nothing to do
    await store.unregister_bookie("bookie-2", 1_300)
    await store.remove_bookie("bookie-2", 1_300)
    assert await store.list_bookies(1_300) == []
    again = await store.register_bookie(RegisterBookieRequest(bookie_id="bookie-1"), 1_400, 100)
    assert again.previous_state is None
    assert [(k, who, d) for k, who, d in await drain_outbox(store)] == [
        (
            "bookie.registered",
            "bookie-1",
            {"state": "writable", "previous_state": None, "lease_expires_at": 1_100},
        ),
        (
            "bookie.registered",
            "bookie-2",
            {"state": "writable", "previous_state": None, "lease_expires_at": 1_100},
        ),
        ("bookie.removed", "bookie-1", {"last_seen": 1_000, "lease_expires_at": 1_100}),
        ("bookie.unregistered", "bookie-2", {}),
        ("bookie.removed", "bookie-2", {"last_seen": 1_000, "lease_expires_at": 1_100}),
        (
            "bookie.registered",
            "bookie-1",
            {"state": "writable", "previous_state": None, "lease_expires_at": 1_500},
        ),
    ]


async def test_cookies_compare_and_set(store: MetadataStore) -> None:
    assert (await store.get_cookie("bookie-1")).version == NO_VERSION
    made = await store.put_cookie(
        PutCookieRequest(bookie_id="bookie-1", data="v1", expected_version=NO_VERSION), 0
    )
    assert (made.data, made.version) == ("v1", 0)
    with pytest.raises(CookieBadVersion) as lost:
        await store.put_cookie(
            PutCookieRequest(bookie_id="bookie-1", data="v2", expected_version=NO_VERSION), 0
        )
    assert lost.value.current == made
    changed = await store.put_cookie(
        PutCookieRequest(bookie_id="bookie-1", data="v2", expected_version=0), 0
    )
    assert (changed.data, changed.version) == ("v2", 1)
    assert await store.get_cookie("bookie-1") == changed
    with pytest.raises(CookieBadVersion):
        await store.delete_cookie(DeleteCookieRequest(bookie_id="bookie-1", expected_version=0), 0)
    await store.delete_cookie(DeleteCookieRequest(bookie_id="bookie-1", expected_version=1), 0)
    with pytest.raises(NoSuchCookie):
        await store.delete_cookie(DeleteCookieRequest(bookie_id="bookie-1", expected_version=1), 0)
    assert (await store.get_cookie("bookie-1")).data is None


async def test_racing_cookie_creates_have_one_winner(store: MetadataStore) -> None:
    outcomes = await asyncio.gather(
        *(
            store.put_cookie(
                PutCookieRequest(bookie_id="b", data=str(i), expected_version=NO_VERSION), 0
            )
            for i in range(10)
        ),
        return_exceptions=True,
    )
    assert sum(not isinstance(o, BaseException) for o in outcomes) == 1


async def test_instance_id_and_settings(store: MetadataStore) -> None:
    instance = await store.instance_id()
    assert len(instance) >= 16 and await store.instance_id() == instance
    settings = await store.get_cluster_settings()
    assert settings.autorecovery_enabled and settings.lost_bookie_recovery_delay_s == 0
    changed = await store.set_cluster_settings(
        SetClusterSettingsRequest(lost_bookie_recovery_delay_s=30), 0
    )
    assert changed.lost_bookie_recovery_delay_s == 30 and changed.autorecovery_enabled
    off = await store.set_cluster_settings(SetClusterSettingsRequest(autorecovery_enabled=False), 0)
    assert (off.autorecovery_enabled, off.lost_bookie_recovery_delay_s) == (False, 30)
    assert await store.get_cluster_settings() == off


# -- under-replication --------------------------------------------------------------------


async def test_marks_add_up_and_replicated_removes_only_the_claimed_mark(
    store: MetadataStore,
) -> None:
    await store.create_ledger(create_request(1), 0)
    with pytest.raises(NoSuchLedger):
        await store.mark_underreplicated(
            MarkUnderreplicatedRequest(ledger_id=9, missing_bookies=["b"]), 0
        )
    first = await store.mark_underreplicated(
        MarkUnderreplicatedRequest(ledger_id=1, missing_bookies=["bookie-2", "bookie-2"]), 10
    )
    assert (first.missing_bookies, first.mark_version, first.marked_at) == (["bookie-2"], 1, 10)
    same = await store.mark_underreplicated(
        MarkUnderreplicatedRequest(ledger_id=1, missing_bookies=["bookie-2"]), 11
    )
    assert same.mark_version == 1
    claimed = await store.claim_underreplicated("w1", 1_000, 20)
    assert claimed is not None and claimed.claimed_by == "w1" and claimed.mark_version == 1
    assert await store.claim_underreplicated("w2", 1_000, 21) is None
    more = await store.mark_underreplicated(
        MarkUnderreplicatedRequest(ledger_id=1, missing_bookies=["bookie-1"]), 30
    )
    assert (more.missing_bookies, more.mark_version) == (["bookie-1", "bookie-2"], 2)
    assert more.claimed_by == "w1" and more.marked_at == 10
    # The worker replicated what it saw at version 1: the newer mark stays, released.
    assert not await store.mark_replicated(1, "w1", 1, 40)
    again = await store.claim_underreplicated("w2", 1_000, 41)
    assert again is not None and again.mark_version == 2
    assert not await store.mark_replicated(1, "w1", 2, 42)  # not w1's any more
    assert await store.mark_replicated(1, "w2", 2, 43)
    assert (await store.list_underreplicated(None, 10)).ledgers == []
    assert [(k, d) for k, _, d in await drain_outbox(store) if k.startswith("ledger.")][1:] == [
        ("ledger.underreplicated", {"missing_bookies": ["bookie-2"], "mark_version": 1}),
        (
            "ledger.underreplicated",
            {"missing_bookies": ["bookie-1", "bookie-2"], "mark_version": 2},
        ),
        ("ledger.replicated", {"mark_version": 2}),
    ]


async def test_claims_lapse_release_renew_and_follow_the_switch(store: MetadataStore) -> None:
    for lid in (1, 2):
        await store.create_ledger(create_request(lid), 0)
        await store.mark_underreplicated(
            MarkUnderreplicatedRequest(ledger_id=lid, missing_bookies=["b"]), lid
        )
    a = await store.claim_underreplicated("w1", 100, 1_000)
    b = await store.claim_underreplicated("w2", 100, 1_000)
    assert a is not None and b is not None and (a.ledger_id, b.ledger_id) == (1, 2)
    assert await store.claim_underreplicated("w3", 100, 1_050) is None
    assert await store.renew_underreplicated(1, "w1", 100, 1_090)  # now until 1_190
    assert not await store.renew_underreplicated(1, "w2", 100, 1_090)
    # w2 died: its claim lapses at 1_100 and w3 takes it; w1's renewed claim holds.
    taken = await store.claim_underreplicated("w3", 100, 1_100)
    assert taken is not None and taken.ledger_id == 2 and taken.claimed_by == "w3"
    assert await store.claim_underreplicated("w4", 100, 1_150) is None
    assert not await store.release_underreplicated(2, "w2")
    assert await store.release_underreplicated(2, "w3")
    await store.set_cluster_settings(SetClusterSettingsRequest(autorecovery_enabled=False), 0)
    assert await store.claim_underreplicated("w4", 100, 1_150) is None
    await store.set_cluster_settings(SetClusterSettingsRequest(autorecovery_enabled=True), 0)
    resumed = await store.claim_underreplicated("w4", 100, 1_150)
    assert resumed is not None and resumed.ledger_id == 2
    listed = await store.list_underreplicated(None, 1)
    assert [u.ledger_id for u in listed.ledgers] == [1] and listed.next_after == 1
    # Deleting the ledger drops its mark.
    await store.delete_ledger(1, 0)
    assert [u.ledger_id for u in (await store.list_underreplicated(None, 10)).ledgers] == [2]


async def test_two_workers_never_hold_the_same_ledger(store: MetadataStore) -> None:
    for lid in range(12):
        await store.create_ledger(create_request(lid), 0)
        await store.mark_underreplicated(
            MarkUnderreplicatedRequest(ledger_id=lid, missing_bookies=["b"]), 0
        )
    claims = await asyncio.gather(
        *(store.claim_underreplicated(f"w{i}", 10_000, 100) for i in range(30))
    )
    held = [c.ledger_id for c in claims if c is not None]
    assert sorted(held) == list(range(12))  # every ledger claimed once, nobody twice


# -- auditor election ---------------------------------------------------------------------


async def test_election_has_one_leader_with_a_lease(store: MetadataStore) -> None:
    assert (await store.who_is_auditor(0)).leader_id is None
    won = await store.elect_auditor("a", 1_000, 0)
    assert won.is_leader and won.leader_id == "a" and won.term == 1
    lost = await store.elect_auditor("b", 1_000, 500)
    assert not lost.is_leader and lost.leader_id == "a"
    renewed = await store.renew_auditor("a", 1_000, 900)
    assert renewed.is_leader and renewed.lease_expires_at == 1_900 and renewed.term == 1
    assert not (await store.renew_auditor("b", 1_000, 900)).is_leader
    again = await store.elect_auditor("a", 1_000, 950)  # re-electing oneself: same term
    assert again.is_leader and again.term == 1
    # a dies (no renewal): after its lease b wins, in a new term; a cannot renew.
    assert (await store.who_is_auditor(1_950)).leader_id is None
    taken = await store.elect_auditor("b", 1_000, 1_950)
    assert taken.is_leader and taken.term == 2
    assert not (await store.renew_auditor("a", 1_000, 1_960)).is_leader
    resigned = await store.resign_auditor("b", 2_000)
    assert not resigned.is_leader and resigned.leader_id is None
    assert (await store.elect_auditor("a", 1_000, 2_000)).term == 3
    elected = [d for k, _, d in await drain_outbox(store) if k == "auditor.elected"]
    assert elected == [
        {"leader_id": "a", "term": 1},
        {"leader_id": "b", "term": 2},
        {"leader_id": "a", "term": 3},
    ]


async def test_racing_candidates_elect_exactly_one(store: MetadataStore) -> None:
    for now in (0, 10_000, 20_000):
        outcomes = await asyncio.gather(
            *(store.elect_auditor(f"c{i}", 5_000, now) for i in range(12))
        )
        leaders = {o.leader_id for o in outcomes if o.is_leader}
        assert len(leaders) == 1
        assert all(o.leader_id in leaders for o in outcomes)


async def test_one_outbox_reader_at_a_time(store: MetadataStore) -> None:
    async with store.outbox() as first:
        assert first is not None
        async with store.outbox() as second:
            assert second is None
    async with store.outbox() as third:
        assert third is not None


async def test_a_closed_ledger_never_reopens_nor_changes_its_end(store: MetadataStore) -> None:
    ledger = await store.create_ledger(create_request(), 0)
    closed = (
        await store.update_ledger(
            UpdateLedgerRequest(
                ledger_id=ledger.ledger_id,
                expected_version=ledger.version,
                state=LedgerState.CLOSED,
                last_entry_id=9,
                length=100,
            ),
            1,
        )
    ).metadata
    refused = [
        {"state": LedgerState.OPEN},
        {"state": LedgerState.IN_RECOVERY},
        {"last_entry_id": 10},
        {"length": 101},
        {"state": LedgerState.CLOSED, "last_entry_id": 8},
    ]
    for changes in refused:
        request = UpdateLedgerRequest(
            ledger_id=closed.ledger_id, expected_version=closed.version, **changes
        )
        with pytest.raises(LedgerClosedError):
            await store.update_ledger(request, 2)
    assert await store.get_ledger(closed.ledger_id) == closed
    # Re-replication may still move its replicas; closing again with the same end is a no-op.
    moved = [Segment(first_entry_id=0, bookies=["bookie-4", "bookie-2", "bookie-3"])]
    again = await store.update_ledger(
        UpdateLedgerRequest(
            ledger_id=closed.ledger_id,
            expected_version=closed.version,
            state=LedgerState.CLOSED,
            last_entry_id=9,
            segments=moved,
        ),
        3,
    )
    assert again.metadata.segments == moved and again.metadata.last_entry_id == 9
    # A stale version still answers BadVersion, not LedgerClosed.
    with pytest.raises(BadVersion):
        await store.update_ledger(
            UpdateLedgerRequest(
                ledger_id=closed.ledger_id, expected_version=closed.version, length=5
            ),
            4,
        )


async def test_outbox_fetch_marks_the_previous_batch_published(store: MetadataStore) -> None:
    for _ in range(5):
        await store.create_ledger(create_request(), ctime_ms=1)
    async with store.outbox() as reader:
        assert reader is not None
        first = await reader.fetch(2)
        second = await reader.fetch(2, first)
        assert [r.ledger_id for r in first + second] == [0, 1, 2, 3]
        third = await reader.fetch(10, second)
        assert [r.ledger_id for r in third] == [4]
        assert await reader.fetch(10, third) == []
    async with store.outbox() as reader:  # the marks stayed: a new leader finds nothing
        assert reader is not None and await reader.fetch(10) == []
