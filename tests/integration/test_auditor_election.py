"""Auditor election through the real services: one leader at a time, a new one within
seconds when it goes."""

from __future__ import annotations

import asyncio
import json

from shared.config import QuireSettings
from shared.metaclient import MetadataClient
from shared.subjects import Subjects
from tests.support.inprocess import running_service, wait_until_serving

LEASE_MS = 900


async def test_never_two_leaders_and_a_new_one_after_the_leader_goes(
    settings: QuireSettings, fresh_database_url: str, nc
) -> None:
    settings = settings.model_copy(
        update={
            "database_url": fresh_database_url,
            "metadata": settings.metadata.model_copy(update={"auditor_lease_ms": LEASE_MS}),
        }
    )
    client = MetadataClient(nc, Subjects(settings.subject_prefix))
    async with running_service("metadata", settings):
        await wait_until_serving(client)
        first = running_service("auditor", settings, "auditor-1")
        second = running_service("auditor", settings, "auditor-2")
        one = await first.__aenter__()
        two = await second.__aenter__()
        auditors = {"one": one, "two": two}
        stopped: set[str] = set()

        def leaders() -> list[str]:
            return [
                name
                for name, rt in auditors.items()
                if name not in stopped and rt.auditor.is_leader  # type: ignore[attr-defined]
            ]

        try:
            deadline = asyncio.get_running_loop().time() + 10
            while not leaders():
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.02)
            for _ in range(100):  # over three lease lengths: never two
                assert len(leaders()) <= 1
                await asyncio.sleep(0.03)
            (leader,) = leaders()
            who = await client.who_is_auditor()
            assert who.leader_id == auditors[leader].auditor.candidate_id  # type: ignore[attr-defined]
            status = json.loads(
                (
                    await nc.request(
                        Subjects(settings.subject_prefix).service("auditor", "status"), b"", 5
                    )
                ).data
            )
            assert set(status) >= {"leader", "leader_id", "term"}
            # The leader goes away; the other takes over within seconds.
            stopped.add(leader)
            await (first if leader == "one" else second).__aexit__(None, None, None)
            deadline = asyncio.get_running_loop().time() + 3 * LEASE_MS / 1000 + 2
            while leaders() == []:
                assert asyncio.get_running_loop().time() < deadline, "no new leader"
                await asyncio.sleep(0.02)
            assert leaders() == ["two" if leader == "one" else "one"]
            assert (await client.who_is_auditor()).term > who.term
        finally:
            for name, ctx in (("one", first), ("two", second)):
                if name not in stopped:
                    await ctx.__aexit__(None, None, None)
