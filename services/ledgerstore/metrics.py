"""The ledgerstore's Prometheus metrics (docs/metrics.md, ledgerstore), built at scrape time
from the store's, the read queue's and the garbage collector's plain counters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.metrics import Builder, Exposition

if TYPE_CHECKING:
    from services.ledgerstore.service import LedgerstoreService


def ledgerstore_metrics(service: LedgerstoreService) -> Builder:
    def build(e: Exposition) -> None:
        _storage(e, service)
        _reads(e, service)
        _gc(e, service)

    return build


def _storage(e: Exposition, service: LedgerstoreService) -> None:
    s = service.store.stats
    e.gauge("bookie_write_cache_size", "Bytes in the write cache", s.write_cache_size_bytes)
    e.gauge("bookie_write_cache_count", "Entries in the write cache", s.write_cache_count)
    e.gauge("bookie_read_cache_size", "Bytes in the read cache", s.read_cache_size_bytes)
    e.gauge("bookie_read_cache_count", "Entries in the read cache", s.read_cache_count)
    e.bk_counter("bookie_write_cache_hits", "Reads served from the write cache", s.write_cache_hits)
    e.bk_counter("bookie_read_cache_hits", "Reads served from the read cache", s.read_cache_hits)
    e.bk_counter(
        "bookie_read_cache_misses", "Entries read from the entry logs", s.read_cache_misses
    )
    e.bk_summary_totals(
        "bookie_readahead_batch_count",
        "Entries read ahead, per read-ahead batch",
        s.readahead_batch_count,
        s.readahead_batch_size,
    )
    e.op_stats(
        s.flush_latency,
        bk_name="bookie_flush",
        quire_name="quire_ledgerstore_flush_latency_seconds",
        doc="Per flush of the write cache to the entry logs and index",
    )
    e.bk_summary_totals("bookie_flush_size", "Bytes per flush", s.flush, s.flush_size_bytes)
    e.bk_counter(
        "bookie_throttled_write_requests",
        "Catch-ups that had to flush first because the write cache was full",
        s.throttled_write_requests,
    )
    e.counter(
        "quire_ledgerstore_handoff_batches",
        "Group commits handed over in process by a co-hosted journal",
        s.handoff_batches,
    )
    e.counter(
        "quire_ledgerstore_handoff_records",
        "Journal records applied from the in-process handoff (not read from the file)",
        s.handoff_records,
    )
    e.counter(
        "quire_ledgerstore_handoff_dropped",
        "Handed group commits dropped (the queue was full): read from the journal file",
        s.handoff_dropped,
    )
    e.counter(
        "quire_ledgerstore_handoff_gaps",
        "Times the file tailer took over from the handoff (a gap in what was handed)",
        s.handoff_gaps,
    )
    e.gauge(
        "quire_ledgerstore_handoff_queue_size",
        "Handed group commits waiting to be applied",
        s.handoff_queue_size,
    )
    e.counter(
        "quire_ledgerstore_add_entries",
        "Entries taken in from the journal",
        s.ledgerstore_add_entry,
    )
    e.counter("quire_ledgerstore_read_entries", "Entries asked for", s.ledgerstore_read_entry)
    e.counter(
        "quire_ledgerstore_read_entries_absent",
        "Entries asked for and not stored here",
        s.ledgerstore_read_entry_absent,
    )
    e.counter(
        "quire_ledgerstore_read_entries_corrupt",
        "Entries asked for, stored but failing their check",
        s.ledgerstore_read_entry_corrupt,
    )
    e.counter("quire_ledgerstore_read_lac", "LAC reads served", s.ledgerstore_read_lac)
    e.counter("quire_ledgerstore_catch_ups", "Catch-ups of the journal", s.ledgerstore_catch_up)
    e.counter("quire_ledgerstore_checkpoints", "Checkpoints", s.ledgerstore_checkpoints)
    e.counter("quire_ledgerstore_index_lookups", "Index range queries", s.index_lookups)
    e.counter(
        "quire_ledgerstore_entry_log_reads", "preads of entry logs by reads", s.entry_log_reads
    )
    e.counter(
        "quire_ledgerstore_entry_log_read_bytes",
        "Bytes read from entry logs by reads",
        s.entry_log_read_bytes,
    )
    e.counter(
        "quire_ledgerstore_flushed_bytes", "Bytes flushed from the write cache", s.flush_size_bytes
    )
    e.counter(
        "quire_ledgerstore_flushed_entries",
        "Entries flushed from the write cache",
        s.flush_entries,
    )
    e.gauge(
        "quire_ledgerstore_write_cache_bytes", "Bytes in the write cache", s.write_cache_size_bytes
    )
    e.gauge(
        "quire_ledgerstore_write_cache_entries", "Entries in the write cache", s.write_cache_count
    )
    e.gauge(
        "quire_ledgerstore_read_cache_bytes", "Bytes in the read cache", s.read_cache_size_bytes
    )
    e.gauge("quire_ledgerstore_read_cache_entries", "Entries in the read cache", s.read_cache_count)
    hits = "Reads served from a cache"
    e.counter("quire_ledgerstore_cache_hits", hits, s.write_cache_hits, cache="write")
    e.counter("quire_ledgerstore_cache_hits", hits, s.read_cache_hits, cache="read")
    e.counter(
        "quire_ledgerstore_read_cache_misses",
        "Entries read from the entry logs",
        s.read_cache_misses,
    )
    e.gauge("quire_ledgerstore_ledgers", "Ledgers stored here", len(service.store.ledgers))
    e.gauge(
        "quire_ledgerstore_damaged",
        "1 once journal records it needs were found gone or bad (it stops applying)",
        int(service.store.damaged is not None),
    )
    e.gauge(
        "quire_ledgerstore_unsure",
        "1 once records were skipped: absence is never claimed again",
        int(service.store.unsure is not None),
    )


def _reads(e: Exposition, service: LedgerstoreService) -> None:
    r = service.reads.stats
    e.op_stats(
        r.request_latency,
        bk_name="bookkeeper_server_READ_ENTRY_REQUEST",
        quire_name="quire_ledgerstore_read_request_latency_seconds",
        doc="Per read request, from its arrival to its reply (success=false: refused, "
        "expired or failed)",
    )
    e.op_stats(
        r.scheduling_delay,
        bk_name="bookkeeper_server_READ_ENTRY_SCHEDULING_DELAY",
        quire_name="quire_ledgerstore_read_scheduling_delay_seconds",
        doc="Time a served read request waited in the read queue",
    )
    e.gauge(
        "bookkeeper_server_READ_ENTRY_IN_PROGRESS",
        "Read requests being served now",
        r.read_entry_in_progress,
    )
    e.counter("quire_ledgerstore_read_requests", "Read requests received", r.read_entry_requests)
    e.counter(
        "quire_ledgerstore_read_requests_rejected",
        "Read requests answered TOO_MANY_REQUESTS: the queue was full",
        r.read_entry_rejected,
    )
    e.counter(
        "quire_ledgerstore_read_requests_expired",
        "Read requests dropped unread past their sender's timeout",
        r.read_entry_expired,
    )
    e.counter(
        "quire_ledgerstore_read_paused_seconds",
        "Pauses of the read workers after requests served while the journal was writing "
        "(read_share_while_writing: writes first)",
        r.read_paused_s,
    )
    e.gauge(
        "quire_ledgerstore_read_queue_requests",
        "Read requests waiting for a worker",
        r.read_entry_queue_size,
    )
    e.gauge(
        "quire_ledgerstore_read_requests_in_progress",
        "Read requests being served now",
        r.read_entry_in_progress,
    )


def _gc(e: Exposition, service: LedgerstoreService) -> None:
    g = service.gc.stats
    e.bk_counter("bookie_MAJOR_COMPACTION_TOTAL", "Major compactions", g.major_compaction_count)
    e.bk_counter("bookie_MINOR_COMPACTION_TOTAL", "Minor compactions", g.minor_compaction_count)
    e.bk_counter(
        "bookie_DELETED_LEDGER_TOTAL",
        "Ledgers deleted by garbage collection",
        g.deleted_ledger_count,
    )
    e.bk_counter(
        "bookie_RECLAIMED_DELETION_SPACE_BYTES",
        "Bytes reclaimed by deleting entry logs",
        g.reclaimed_deletion_space_bytes,
    )
    e.bk_counter(
        "bookie_RECLAIMED_COMPACTION_SPACE_BYTES",
        "Bytes reclaimed by compacting entry logs",
        g.reclaimed_compaction_space_bytes,
    )
    e.gauge(
        "bookie_ACTIVE_ENTRY_LOG_TOTAL",
        "Sealed entry logs, as of the last GC run",
        g.active_entry_log_count,
    )
    e.gauge(
        "bookie_ACTIVE_ENTRY_LOG_SPACE_BYTES",
        "Live bytes of the sealed entry logs, as of the last GC run",
        g.active_entry_log_space_bytes,
    )
    e.op_stats(
        g.compact_runtime,
        bk_name="bookie_COMPACT_RUNTIME",
        quire_name="quire_ledgerstore_gc_compaction_duration_seconds",
        doc="Per entry log compacted",
    )
    e.counter("quire_ledgerstore_gc_runs", "Garbage-collection runs", g.gc_runs)
    e.counter("quire_ledgerstore_gc_failures", "GC runs that ended in an error", g.gc_failures)
    e.counter(
        "quire_ledgerstore_gc_deleted_ledgers",
        "Ledgers deleted by garbage collection",
        g.deleted_ledger_count,
    )
    e.counter(
        "quire_ledgerstore_gc_deleted_entry_logs",
        "Entry logs deleted whole",
        g.deleted_entry_log_count,
    )
    reclaimed = "Bytes reclaimed"
    e.counter(
        "quire_ledgerstore_gc_reclaimed_bytes",
        reclaimed,
        g.reclaimed_deletion_space_bytes,
        by="deletion",
    )
    e.counter(
        "quire_ledgerstore_gc_reclaimed_bytes",
        reclaimed,
        g.reclaimed_compaction_space_bytes,
        by="compaction",
    )
    compactions = "Compactions run"
    e.counter(
        "quire_ledgerstore_gc_compactions", compactions, g.major_compaction_count, kind="major"
    )
    e.counter(
        "quire_ledgerstore_gc_compactions", compactions, g.minor_compaction_count, kind="minor"
    )
    e.counter(
        "quire_ledgerstore_gc_compacted_entry_logs",
        "Entry logs compacted",
        g.compacted_entry_log_count,
    )
    e.gauge(
        "quire_ledgerstore_gc_active_entry_logs",
        "Sealed entry logs, as of the last GC run",
        g.active_entry_log_count,
    )
    e.gauge(
        "quire_ledgerstore_gc_active_entry_log_bytes",
        "Live bytes of the sealed entry logs, as of the last GC run",
        g.active_entry_log_space_bytes,
    )
    buckets = list(g.entry_log_usage_buckets)
    for tenth, n in enumerate(buckets, start=1):
        e.gauge(
            "quire_ledgerstore_gc_entry_logs_by_usage",
            "Sealed entry logs by usage in tenths (not cumulative), as of the last GC run",
            n,
            usage_le=f"{tenth / len(buckets):.1f}",
        )
