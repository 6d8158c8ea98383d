"""`ProtocolClient.replicate` over a real in-process stack (NATS, PostgreSQL, journals and
ledgerstores): a closed ledger written on 3 of 4 bookies, one of them stopped for good;
the replication names the 4th bookie in its place, and every entry reads back from the
4th bookie alone."""

from __future__ import annotations

import os

import pytest

from shared.bookie_client import BookieClient
from shared.digest import LedgerKeys
from shared.metaclient import MetadataClient
from shared.models import Segment
from shared.protocol.driver import ProtocolClient
from shared.service import connect_nats
from shared.status import ApiCodes, QuireError
from shared.subjects import Subjects
from tests.integration.test_gateway_http import PW, append_batch, create, running_stack

PASSWORD = PW["Quire-Ledger-Password"].encode()


async def test_a_stopped_bookies_ledger_is_replicated_to_the_fourth_bookie(
    settings, fresh_database_url
) -> None:
    async with running_stack(settings, fresh_database_url, bookies=4) as stack:
        http = stack.http
        ledger = await create(http, ensemble_size=3, write_quorum=3, ack_quorum=2)
        lid = ledger["ledger_id"]
        ensemble = ledger["segments"][0]["bookies"]
        [spare] = {f"bookie-{i}" for i in range(1, 5)} - set(ensemble)
        payloads = [os.urandom(100 + i) for i in range(300)]
        for start in range(0, len(payloads), 50):
            response = await append_batch(http, lid, payloads[start : start + 50])
            assert response.status_code == 200, response.text
        assert (await http.post(f"/v1/ledgers/{lid}/close", headers=PW)).status_code == 200
        lost = ensemble[1]
        await stack.stop(f"{lost}.journal")
        await stack.stop(f"{lost}.ledgerstore")

        config = stack.settings
        nc = await connect_nats(config, name="replication-test")
        try:
            subjects = Subjects(config.subject_prefix)
            meta = MetadataClient(nc, subjects)
            bookies = BookieClient(
                nc,
                subjects,
                add_timeout_ms=config.gateway.add_bookie_timeout_ms,
                read_timeout_ms=config.gateway.read_entry_timeout_ms,
            )
            client = ProtocolClient(bookies, meta, config.gateway)
            metadata = await meta.get_ledger(lid)
            if not metadata.master_key:
                # Until the metadata store keeps the keys (contract 1), the test gives them.
                keys = LedgerKeys.from_password(PASSWORD)
                metadata = metadata.model_copy(
                    update={"master_key": keys.master_key.hex(), "mac_key": keys.mac_key.hex()}
                )
            result = await client.replicate(metadata, [lost])
            stored = await meta.get_ledger(lid)
            assert [s.bookies for s in stored.segments] == [
                [spare if b == lost else b for b in ensemble]
            ]
            assert result.metadata.segments == stored.segments
            assert result.entries == 300 and len(result.fragments) == 1
            assert result.fragments[0].new_bookie_id == spare
            # Every entry from the spare alone.
            alone = stored.model_copy(
                update={
                    "segments": [Segment(first_entry_id=0, bookies=[spare])],
                    "ensemble_size": 1,
                    "write_quorum": 1,
                    "ack_quorum": 1,
                }
            )
            got = []
            async for batch in client.read_stream(alone, PASSWORD, 0, 299):
                got.extend(entry.payload for entry in batch)
            assert got == payloads

            # New ensembles leave out the bookies asked to be excluded (the autorecovery
            # bench's foreground ledger keeps clear of its victim that way).
            others = sorted(set(ensemble) - {lost})
            for _ in range(5):
                handle = await client.create_ledger(
                    ensemble_size=2, write_quorum=2, ack_quorum=2, digest="crc32c",
                    password=PASSWORD, metadata={}, excluding={spare},
                )  # fmt: skip
                created = await meta.get_ledger(handle.ledger_id)
                assert sorted(created.segments[0].bookies) == others
                await handle.close(30.0)
            with pytest.raises(QuireError) as caught:
                await client.create_ledger(
                    ensemble_size=3, write_quorum=2, ack_quorum=2, digest="crc32c",
                    password=PASSWORD, metadata={}, excluding={spare},
                )  # fmt: skip
            assert caught.value.api is ApiCodes.NOT_ENOUGH_BOOKIES
            client.close()
        finally:
            await nc.drain()
