"""The replicator's Prometheus metrics (docs/metrics.md, replicator): `ReplicatorStats`
under Quire's names and BookKeeper's (the `replication_worker_` scope), read at scrape
time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.metrics import Builder, Exposition

if TYPE_CHECKING:
    from services.replicator.service import ReplicatorStats


def replicator_metrics(stats: ReplicatorStats) -> Builder:
    def build(e: Exposition) -> None:
        e.bk_counter(
            "replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED",
            "Ledgers found whole at the end of a claim",
            stats.replicated,
        )
        e.bk_counter("replication_worker_NUM_ENTRIES_WRITTEN", "Entries copied", stats.entries)
        e.bk_counter("replication_worker_NUM_BYTES_WRITTEN", "Entry bytes copied", stats.bytes)
        e.bk_counter(
            "replication_worker_NUM_DEFER_LEDGER_LOCK_RELEASE_OF_FAILED_LEDGER",
            "Claims that ended in a failure backoff",
            stats.failed,
        )
        e.op_stats(
            stats.rereplicate,
            bk_name="replication_worker_rereplicate",
            quire_name="quire_replicator_rereplicate_duration_seconds",
            doc="Per claim, from claiming to its end (success=false: failed, deferred or released)",
        )
        e.counter("quire_replicator_claims", "Claims obtained", stats.claimed)
        ended = "How claims ended"
        for outcome, n in (
            ("replicated", stats.replicated),
            ("failed", stats.failed),
            ("deferred", stats.deferred),
            ("released", stats.released),
        ):
            e.counter("quire_replicator_claims_ended", ended, n, outcome=outcome)
        e.counter(
            "quire_replicator_ledgers_recovered",
            "Open ledgers fenced and recovered",
            stats.recovered,
        )
        e.counter("quire_replicator_fragments_copied", "Fragments copied", stats.fragments)
        e.counter("quire_replicator_entries_copied", "Entries copied", stats.entries)
        e.counter("quire_replicator_copied_bytes", "Entry bytes copied", stats.bytes)
        e.counter(
            "quire_replicator_claim_errors",
            "Claims the queue failed to hand out",
            stats.claim_errors,
        )
        e.counter(
            "quire_replicator_placement_fallbacks",
            "Fragments copied to a bookie that breaks the placement policy (not enforced)",
            stats.placement_fallbacks,
        )
        e.counter(
            "quire_replicator_idle_polls",
            "Claims answered with nothing to do",
            stats.idle_polls,
        )
        e.gauge("quire_replicator_workers_busy", "Workers holding a claim", len(stats.in_progress))

    return build
