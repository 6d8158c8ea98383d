"""The metadata service's Prometheus metrics (docs/metrics.md, metadata): requests by
operation and outcome, their latency, compare-and-set conflicts and the outbox publisher's
counts, kept as plain numbers and read at scrape time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.metrics import Builder, Exposition, OpStats
from shared.models import MetaErrorCode

if TYPE_CHECKING:
    from services.metadata.batch import BatchStats
    from services.metadata.outbox import OutboxPublisher


@dataclass
class MetadataStats:
    # (op, "OK" or the MetaErrorCode) -> requests answered
    requests: dict[tuple[str, str], int] = field(default_factory=dict)
    latency: dict[str, OpStats] = field(default_factory=dict)

    def record(self, op: str, code: str, latency_ms: float) -> None:
        key = (op, code)
        self.requests[key] = self.requests.get(key, 0) + 1
        stats = self.latency.get(op)
        if stats is None:
            stats = self.latency[op] = OpStats()
        stats.record(latency_ms, success=code == "OK")


def metadata_metrics(
    stats: MetadataStats, outbox: OutboxPublisher, batches: dict[str, BatchStats] | None = None
) -> Builder:
    """`batches`: the store's group commits by operation (PostgreSQL only)."""

    def build(e: Exposition) -> None:
        e.declare_counter("quire_metadata_requests", "Requests answered", "op", "code")
        e.declare_counter(
            "quire_metadata_cas_conflicts", "Compare-and-set refusals (BAD_VERSION)", "op"
        )
        for (op, code), n in list(stats.requests.items()):
            e.counter("quire_metadata_requests", "Requests answered", n, op=op, code=code)
            if code == MetaErrorCode.BAD_VERSION:
                e.counter(
                    "quire_metadata_cas_conflicts",
                    "Compare-and-set refusals (BAD_VERSION)",
                    n,
                    op=op,
                )
        for op, latency in list(stats.latency.items()):
            e.op_stats(
                latency,
                bk_name=None,
                quire_name="quire_metadata_request_latency_seconds",
                doc="From decoding a request to its reply",
                op=op,
            )
        for op, batch in (batches or {}).items():
            e.counter(
                "quire_metadata_db_batches", "Group-commit statements written", batch.batches, op=op
            )
            e.counter(
                "quire_metadata_db_batched_changes",
                "Changes those statements carried",
                batch.items,
                op=op,
            )
            e.gauge(
                "quire_metadata_db_batch_queue",
                "Changes waiting for a group commit",
                batch.pending,
                op=op,
            )
        e.counter(
            "quire_metadata_outbox_published",
            "Outbox records published as events",
            outbox.published,
        )
        e.counter(
            "quire_metadata_outbox_failures",
            "Outbox publishing rounds that failed",
            outbox.failures,
        )

    return build
