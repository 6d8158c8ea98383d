"""The journal's Prometheus metrics (docs/metrics.md, journal), built at scrape time from
`JournalStats` and the service's state: the add path only bumps plain numbers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.metrics import Builder, Exposition

if TYPE_CHECKING:
    from services.journal.journal import JournalStats
    from services.journal.service import JournalService


def count_add_request(stats: JournalStats, ok: int, entries: int, ms: float) -> None:
    """ADD_ENTRY_REQUEST: every entry of an answered add request (`ok` of its `entries`
    admitted), with the request's time."""
    stats.add_requests += 1
    if ok:
        stats.add_entry_request.record(ms, True, ok)
    if entries > ok:
        stats.add_entry_request.record(ms, False, entries - ok)


def journal_metrics(service: JournalService) -> Builder:
    def build(e: Exposition) -> None:
        stats = service.stats  # the bookie's totals, over all its journals
        e.op_stats(
            stats.add_entry_latency,
            bk_name="bookie_journal_JOURNAL_ADD_ENTRY",
            quire_name="quire_journal_add_entry_latency_seconds",
            doc="Per entry, from queueing in the journal to its group commit's fdatasync",
        )
        e.op_stats(
            stats.add_entry_request,
            bk_name="bookkeeper_server_ADD_ENTRY_REQUEST",
            quire_name="quire_journal_add_request_latency_seconds",
            doc="Per entry of an add request, from its arrival to the reply (success=false: "
            "refused)",
        )
        e.op_stats(
            stats.sync_latency,
            bk_name="bookie_journal_JOURNAL_SYNC",
            quire_name="quire_journal_sync_latency_seconds",
            doc="Per group commit: its write and fdatasync",
        )
        e.bk_summary_totals(
            "bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES",
            "Records per group commit",
            stats.journal_sync,
            stats.journal_flush_batch_records_sum,
        )
        e.bk_summary_totals(
            "bookie_journal_JOURNAL_FORCE_WRITE_BATCH_BYTES",
            "Bytes per group commit",
            stats.journal_sync,
            stats.journal_flush_batch_bytes_sum,
        )
        e.gauge(
            "bookie_journal_JOURNAL_QUEUE_SIZE",
            "Entries queued, not yet committed",
            stats.journal_queue_size,
        )
        e.bk_counter(
            "bookie_journal_JOURNAL_WRITE_BYTES",
            "Bytes written to the journal",
            stats.journal_flush_batch_bytes_sum,
        )
        e.counter("quire_journal_add_entries", "Entries journaled", stats.journal_add_entry)
        e.counter("quire_journal_add_requests", "Add requests answered", stats.add_requests)
        e.gauge(
            "quire_journal_add_requests_waiting",
            "Add requests waiting for their group commit",
            service.adds_waiting,
        )
        e.declare_counter("quire_journal_add_rejected", "Entries refused", "status")
        for status, n in list(stats.journal_add_entry_rejected.items()):
            e.counter("quire_journal_add_rejected", "Entries refused", n, status=status)
        e.counter("quire_journal_records", "Records written", stats.journal_records)
        e.counter(
            "quire_journal_written_bytes", "Bytes written", stats.journal_flush_batch_bytes_sum
        )
        e.gauge(
            "quire_journal_queue_entries",
            "Entries queued, not yet committed",
            stats.journal_queue_size,
        )
        e.gauge(
            "quire_journal_queue_max_entries",
            "The most entries ever queued at once",
            stats.journal_queue_max_size,
        )
        e.counter("quire_journal_rolls", "New journal files started", stats.journal_rolls)
        e.counter("quire_journal_checkpoints", "LastLogMark checkpoints", stats.journal_checkpoints)
        e.counter(
            "quire_journal_files_deleted",
            "Journal files deleted after a checkpoint",
            stats.journal_files_deleted,
        )
        e.counter(
            "quire_journal_snapshot_rows",
            "Ledger-state rows written to the snapshot",
            stats.journal_snapshot_rows,
        )
        e.counter(
            "quire_journal_snapshot_bytes",
            "Bytes written to the snapshot",
            stats.journal_snapshot_bytes,
        )
        e.gauge(
            "quire_journal_ledgers",
            "Ledgers the journal holds durable state of",
            sum(len(journal.durable) for journal in service.journals),
        )
        # Per journal directory (one journal each): which disk is slow or busy.
        for journal in service.journals:
            where = {"journal_dir": str(journal.directory)}
            e.counter(
                "quire_journal_dir_syncs",
                "Group commits (write and fdatasync) of this journal directory",
                journal.syncs,
                **where,
            )
            e.counter(
                "quire_journal_dir_sync_seconds",
                "Time spent in the group commits of this journal directory",
                journal.sync_seconds,
                **where,
            )
            e.counter(
                "quire_journal_dir_written_bytes",
                "Bytes written to this journal directory",
                journal.written_bytes,
                **where,
            )
            e.gauge(
                "quire_journal_dir_queue_entries",
                "Records queued for this journal directory, not yet committed",
                journal.queued,
                **where,
            )
        e.gauge(
            "quire_journal_read_only",
            "1 while the bookie is read-only",
            int(service.read_only),
        )
        e.gauge(
            "quire_journal_disk_usage_ratio",
            "Used fraction of the fullest bookie disk, as last measured",
            service.disk_usage_fraction,
        )

    return build
