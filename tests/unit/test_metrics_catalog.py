"""docs/metrics.md against the code, without a cluster: every service's metrics builder,
fed fresh counters, exports every name its section lists and nothing it does not (the
dashboards' names come from the catalog). The e2e test in test_quire_up.py checks the same
against live processes, with counts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from services.auditor.metrics import CHECK_TIMES, auditor_metrics
from services.gateway.metrics import GatewayMetrics
from services.journal.journal import JournalStats
from services.journal.metrics import journal_metrics
from services.ledgerstore.gc import GcStats
from services.ledgerstore.metrics import ledgerstore_metrics
from services.ledgerstore.read_queue import ReadQueueStats
from services.ledgerstore.store import LedgerstoreStats
from services.metadata.batch import BatchStats
from services.metadata.metrics import MetadataStats, metadata_metrics
from services.replicator.metrics import replicator_metrics
from services.replicator.service import ReplicatorStats
from shared.events import EventStats
from shared.metrics import (
    SLOW_BOUNDS_MS,
    Builder,
    MetricsRegistry,
    OpStats,
    Scrape,
    events_metrics,
    natsfast_metrics,
    parse,
)
from tests.support.metrics_catalog import catalog, missing_and_unlisted


def builders() -> dict[str, Builder]:
    """Each service's builder over the objects it reads, as a service just started has them."""
    journal = SimpleNamespace(
        stats=JournalStats(),
        journals=[
            SimpleNamespace(
                directory="journal",
                durable={},
                syncs=0,
                sync_seconds=0.0,
                written_bytes=0,
                queued=0,
            )
        ],
        read_only=False,
        disk_usage_fraction=0.0,
        adds_waiting=0,
        adds_queued=0,
        adds_dropped=0,
    )
    ledgerstore = SimpleNamespace(
        store=SimpleNamespace(stats=LedgerstoreStats(), ledgers={}, damaged=None, unsure=None),
        reads=SimpleNamespace(stats=ReadQueueStats()),
        gc=SimpleNamespace(stats=GcStats()),
    )
    metadata = MetadataStats()
    metadata.record("ledger.create", "OK", 1.0)  # a metadata service answers at once
    auditor = SimpleNamespace(
        periodic=SimpleNamespace(
            durations={check: OpStats(SLOW_BOUNDS_MS) for check in CHECK_TIMES},
            ledgers_checked=0,
            ledgers_not_adhering=0,
            ledgers_softly_adhering=0,
        ),
        election_attempts=0,
        is_leader=False,
        audits=0,
        marks_by_reason={},
        commands=0,
        corrupt_events=0,
        malformed_events=0,
        lost=SimpleNamespace(waiting=set()),
        known={},
        pending_cookie_removals=set(),
    )
    return {
        "journal": journal_metrics(journal),  # type: ignore[arg-type]
        "ledgerstore": ledgerstore_metrics(ledgerstore),  # type: ignore[arg-type]
        "metadata": metadata_metrics(
            metadata,
            SimpleNamespace(published=0, failures=0),  # type: ignore[arg-type]
            {"ledger.update": BatchStats()},
        ),
        "auditor": auditor_metrics(auditor),  # type: ignore[arg-type]
        "replicator": replicator_metrics(ReplicatorStats()),
    }


def scraped(service: str) -> Scrape:
    if service == "gateway":  # prometheus_client's own instruments, in the gateway's registry
        return parse(generate_latest(GatewayMetrics().registry).decode())
    registry = MetricsRegistry()
    registry.add(events_metrics(EventStats()))  # serve_metrics adds these in every service
    registry.add(natsfast_metrics())
    registry.add(builders()[service])
    return registry.scrape()


def test_the_catalog_has_a_section_for_every_service() -> None:
    assert set(catalog()) == {*builders(), "gateway"}


@pytest.mark.parametrize("service", sorted(catalog()))
def test_every_name_in_the_catalog_is_exported_and_nothing_else(service: str) -> None:
    missing, unlisted = missing_and_unlisted(scraped(service), catalog()[service])
    assert not missing, f"{service} does not export {missing}"
    assert not unlisted, f"docs/metrics.md does not list {service}'s {unlisted}"
