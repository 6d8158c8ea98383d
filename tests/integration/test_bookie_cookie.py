"""The bookie's identity cookie, on its disk and in metadata: a disk that does not match
refuses to start and says why; a wiped disk starts but never answers "no such entry" for
what it may have held."""

from __future__ import annotations

import asyncio
import json
import shutil
from contextlib import AsyncExitStack
from dataclasses import replace

import pytest

from shared.bookie.cookie import (
    COOKIE_FILE,
    Cookie,
    CookieMismatch,
    check_journal_copy,
    keeps_cookie_copy,
    mismatch,
    read_disk_cookie,
    reconcile,
    write_disk_cookie,
)
from shared.bookie.journal_dir import journal_files
from shared.config import JournalSettings, QuireSettings
from shared.metaclient import MetadataClient
from shared.status import BookieStatus
from shared.subjects import Subjects
from tests.integration.test_bookie import Bookie, bookie, frame
from tests.support.inprocess import running_service


async def test_cookie_mismatch_refuses_and_a_wiped_disk_answers_unknown(
    nc, settings: QuireSettings, fresh_database_url: str
) -> None:
    settings = settings.model_copy(update={"database_url": fresh_database_url})
    client = Bookie(nc, settings)
    meta = MetadataClient(nc, Subjects(settings.subject_prefix))
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(running_service("metadata", settings))
        async with bookie(settings):
            assert (
                await client.add([frame(70, e, e - 1) for e in range(3)]) == [BookieStatus.OK] * 3
            )
        stored = await meta.get_cookie(settings.bookie_id)
        on_disk = json.loads((settings.bookie_dir / COOKIE_FILE).read_text())
        assert json.loads(stored.data)["instance_id"] == on_disk["instance_id"] != ""
        assert on_disk["bookie_id"] == settings.bookie_id

        # Other directories than the cookie records: refuse, naming what differs.
        moved = settings.model_copy(
            update={
                "ledgerstore": settings.ledgerstore.model_copy(
                    update={"ledger_directories": ["ledgers", "more-ledgers"]}
                )
            }
        )
        with pytest.raises(CookieMismatch, match="ledger_dirs"):
            async with running_service("journal", moved):
                pass

        # The disk wiped: it starts, and answers UNKNOWN for what it may have held.
        shutil.rmtree(settings.bookie_dir)
        async with bookie(settings):
            assert json.loads((settings.bookie_dir / COOKIE_FILE).read_text())["limbo"]
            results = await client.read([(70, 0), (70, 2)])
            assert {r.status for r in results} == {BookieStatus.UNKNOWN_LEDGER_STATE}
            assert (await client.read_lac(70)).status is BookieStatus.UNKNOWN_LEDGER_STATE
            # A ledger written since the wipe is answered as usual.
            assert (
                await client.add([frame(71, e, e - 1) for e in range(2)]) == [BookieStatus.OK] * 2
            )
            results = await client.read([(71, 1), (71, 5)])
            assert [r.status for r in results] == [BookieStatus.OK, BookieStatus.NO_ENTRY]


async def test_a_journal_on_its_own_disk_is_served_and_recorded_in_the_cookie(
    nc, settings: QuireSettings, fresh_database_url: str, tmp_path
) -> None:
    journal_disk = tmp_path / "journal-disk"  # outside the bookie's dir, as a mount is
    settings = settings.model_copy(
        update={
            "database_url": fresh_database_url,
            "journal": settings.journal.model_copy(
                update={"journal_directories": [str(journal_disk)]}
            ),
        }
    )
    journal_dir = journal_disk / settings.bookie_id
    client = Bookie(nc, settings)
    frames = [frame(90, e, e - 1) for e in range(5)]
    async with running_service("metadata", settings):
        async with bookie(settings):
            assert await client.add(frames) == [BookieStatus.OK] * 5
            # The ledgerstore found them by following the journal there.
            assert [r.frame for r in await client.read([(90, e) for e in range(5)])] == frames
        assert journal_files(journal_dir) and not (settings.bookie_dir / "journal").exists()
        on_disk = json.loads((settings.bookie_dir / COOKIE_FILE).read_text())
        assert on_disk["journal_dir"] == str(journal_dir.resolve())
        # BookKeeper's cookie in every directory: the journal's disk keeps a copy.
        assert json.loads((journal_dir / COOKIE_FILE).read_text()) == on_disk

        # The journal's disk not mounted (an empty directory where it was): refuse, or
        # the bookie would come up without the fences and keys that journal holds.
        journal_disk.rename(tmp_path / "unmounted")
        journal_disk.mkdir()  # the bare mount point
        with pytest.raises(CookieMismatch, match="has none: the journal's disk is not mounted"):
            async with running_service("journal", settings):
                pass
        assert list(journal_disk.iterdir()) == []  # refused before writing anything there
        journal_disk.rmdir()
        (tmp_path / "unmounted").rename(journal_disk)
        async with bookie(settings):
            assert [r.frame for r in await client.read([(90, e) for e in range(5)])] == frames
            assert await client.add([frame(90, 5, 4)]) == [BookieStatus.OK]

        # Back to the default journal directory: not the disk the cookie names.
        default = settings.model_copy(update={"journal": JournalSettings()})
        with pytest.raises(CookieMismatch, match="journal_dir"):
            async with running_service("journal", default):
                pass


async def test_a_disk_wiped_while_metadata_was_away_is_found_once_it_answers(
    nc, settings: QuireSettings, fresh_database_url: str
) -> None:
    settings = settings.model_copy(
        update={
            "database_url": fresh_database_url,
            "metadata": settings.metadata.model_copy(update={"bookie_heartbeat_ms": 100}),
        }
    )
    client = Bookie(nc, settings)
    async with running_service("metadata", settings), bookie(settings):
        assert await client.add([frame(80, 0)]) == [BookieStatus.OK]
    shutil.rmtree(settings.bookie_dir)
    async with bookie(settings):
        assert json.loads((settings.bookie_dir / COOKIE_FILE).read_text())["provisional"]
        async with running_service("metadata", settings):
            for _ in range(200):
                status = (await client.read([(80, 0)]))[0].status
                if status is BookieStatus.UNKNOWN_LEDGER_STATE:
                    break
                await asyncio.sleep(0.05)
            assert status is BookieStatus.UNKNOWN_LEDGER_STATE
            assert json.loads((settings.bookie_dir / COOKIE_FILE).read_text())["limbo"]


def cookie(**update) -> Cookie:
    base = Cookie("bookie-1", "/d/journal", ["/d/ledgers"], "inst-1")
    return Cookie(**{**base.__dict__, **update})


@pytest.mark.parametrize(
    ("disk", "meta", "has_data", "expected", "publish"),
    [
        (None, None, False, cookie(), True),  # a new bookie
        (cookie(), None, True, cookie(), True),  # metadata came later: register
        (cookie(), cookie(), True, cookie(), False),  # all agree
        (None, cookie(), False, cookie(limbo=True), False),  # wiped
        (cookie(instance_id=""), None, True, cookie(), True),  # learns the instance
        # Started on an empty disk while metadata was away; metadata knew it: wiped.
        (cookie(instance_id="", provisional=True), cookie(), False, cookie(limbo=True), False),
        (cookie(instance_id="", provisional=True), None, True, cookie(), True),  # new
    ],
)
def test_reconcile(disk, meta, has_data, expected, publish) -> None:
    assert reconcile(cookie(), disk, meta, has_data) == (expected, publish)


@pytest.mark.parametrize(
    ("disk", "meta", "field"),
    [
        (cookie(bookie_id="bookie-2"), None, "bookie_id"),
        (cookie(journal_dir="/x"), None, "journal_dir"),
        (None, cookie(instance_id="inst-2"), "instance"),
        (cookie(instance_id="inst-2"), cookie(), "instance"),
    ],
)
def test_reconcile_refuses_what_is_not_this_bookie(disk, meta, field: str) -> None:
    with pytest.raises(CookieMismatch, match=field):
        reconcile(cookie(), disk, meta, True)


def test_a_journal_outside_the_bookie_dir_keeps_a_copy_of_the_cookie(tmp_path) -> None:
    bookie_dir, outside = tmp_path / "data" / "b1", tmp_path / "jdisk" / "b1"
    assert not keeps_cookie_copy(bookie_dir, bookie_dir / "journal")
    assert keeps_cookie_copy(bookie_dir, outside)
    cookie = Cookie("b1", str(outside), [str(bookie_dir / "ledgers")], instance_id="i1")
    write_disk_cookie(bookie_dir, cookie, journal_copies=[outside])
    assert read_disk_cookie(outside) == cookie == read_disk_cookie(bookie_dir)
    check_journal_copy(cookie, cookie, outside)
    # Another bookie's journal disk mounted here: refused, naming what differs.
    with pytest.raises(CookieMismatch, match="bookie_id"):
        check_journal_copy(replace(cookie, bookie_id="b2", journal_dir="x"), None, outside)
    (outside / COOKIE_FILE).unlink()
    check_journal_copy(cookie, None, outside)  # a new bookie: nothing anywhere yet
    with pytest.raises(CookieMismatch, match="not mounted there, or was lost"):
        check_journal_copy(cookie, cookie, outside)


def test_a_one_journal_cookie_is_encoded_as_before_there_were_several() -> None:
    # What bookies wrote before journal_directories (a data dir of theirs must start).
    old = (
        '{"bookie_id": "b1", "instance_id": "i1", "journal_dir": "/d/b1/journal", '
        '"layout_version": 1, "ledger_dirs": ["/d/b1/ledgers"], "limbo": false, '
        '"provisional": false}'
    )
    cookie = Cookie("b1", "/d/b1/journal", ["/d/b1/ledgers"], instance_id="i1")
    assert cookie.encode() == old and Cookie.decode(old) == cookie
    several = replace(cookie, more_journal_dirs=["/j2/b1"])
    assert Cookie.decode(several.encode()) == several
    assert "more_journal_dirs" in (mismatch(cookie, several, "disk") or "")
