"""The gateway's `Ledgers` in the test's own process, over the protocol library and real
NATS, bookies and metadata (a stack from `tests.support.stack`): for tests that count what
the gateway sends or does, as the gateway process builds it."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient

from services.gateway.ledgers import Ledgers
from services.gateway.metrics import GatewayMetrics
from shared.bookie_client import BookieClient
from shared.config import QuireSettings
from shared.metaclient import MetadataClient
from shared.models import LedgerMetadata
from shared.subjects import Subjects

PASSWORD = b"pw"


def bookie_client(nc: NatsClient, settings: QuireSettings) -> BookieClient:
    return BookieClient(
        nc,
        Subjects(settings.subject_prefix),
        add_timeout_ms=settings.gateway.add_bookie_timeout_ms,
        read_timeout_ms=settings.gateway.read_entry_timeout_ms,
        new_bookie_grace_ms=settings.gateway.new_bookie_grace_ms,
    )


def in_process_ledgers(nc: NatsClient, settings: QuireSettings) -> Ledgers:
    subjects = Subjects(settings.subject_prefix)
    meta = MetadataClient(nc, subjects)
    return Ledgers(nc, settings, meta, bookie_client(nc, settings), None, GatewayMetrics())


async def create_ledgers(
    ledgers: Ledgers, count: int, *, ack_quorum: int = 2
) -> list[LedgerMetadata]:
    """`count` E3/Qw3 ledgers, one after the other."""
    return [
        await ledgers.create(
            ensemble_size=3,
            write_quorum=3,
            ack_quorum=ack_quorum,
            digest="crc32c",
            password=PASSWORD,
            metadata={},
        )
        for _ in range(count)
    ]
