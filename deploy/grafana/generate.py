"""Quire's Grafana dashboards as code: `python deploy/grafana/generate.py` (or `make
dashboards`) writes deploy/grafana/dashboards/*.json, which Grafana loads through
provisioning/dashboards/quire.yaml. Edit this file, never the JSON: a unit test
(tests/unit/test_dashboards.py) regenerates the JSON and fails when it differs from what is
committed, parses every query with promql-parser and checks each metric name against
docs/metrics.md.

Every metric comes from a target of `quire up`'s DIR/prometheus/targets.json, whose labels
(`service`, `bookie_id`, `instance`) the variables and the selectors use. Histograms are in
base units and read with histogram_quantile over `_bucket`; BookKeeper's summaries by their
`quantile` label.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, tempo, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueGraphMode,
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    StackingMode,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableRefresh,
    VariableSort,
)

DASHBOARDS_DIR = Path(__file__).resolve().parent / "dashboards"

# The datasource uids that provisioning/datasources/quire.yaml gives them.
PROMETHEUS = DataSourceRef(type_val="prometheus", uid="prometheus")
TEMPO = DataSourceRef(type_val="tempo", uid="tempo")

# Grid: 24 columns; a stat is a sixth of a row, a graph half of one.
STAT_WIDTH, STAT_HEIGHT = 4, 4
GRAPH_WIDTH, GRAPH_HEIGHT = 12, 8

RATE = "$__rate_interval"
# Selectors by the dashboards' variables: $instance (every dashboard but the overview and
# the traces) and $bookie_id (the bookie's), multi-valued regexes ("All" is ".*").
BOOKIE = 'bookie_id=~"$bookie_id", instance=~"$instance"'
INSTANCE = 'instance=~"$instance"'


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel, with the legend of its series."""

    expr: str
    legend: str = ""


def _targets(queries: Iterable[Query]) -> list[prometheus.Dataquery]:
    return [
        prometheus.Dataquery()
        .datasource(PROMETHEUS)
        .ref_id(chr(ord("A") + i))
        .expr(q.expr)
        .legend_format(q.legend or "__auto")
        for i, q in enumerate(queries)
    ]


def graph(
    title: str, description: str, unit: str, *queries: Query, stacked: bool = False
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .unit(unit)
        .span(GRAPH_WIDTH)
        .height(GRAPH_HEIGHT)
        .fill_opacity(10)
        .legend(
            common.VizLegendOptions()
            .display_mode(LegendDisplayMode.LIST)
            .placement(LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)
        )
        .targets(_targets(queries))
    )
    if stacked:
        panel = panel.stacking(common.StackingConfig().mode(StackingMode.NORMAL))
    return panel


def single(title: str, description: str, unit: str, query: Query) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .unit(unit)
        .span(STAT_WIDTH)
        .height(STAT_HEIGHT)
        .graph_mode(BigValueGraphMode.AREA)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
        .targets(_targets([query]))
    )


def rate_sum(metric: str, selector: str, by: str = "") -> str:
    """Per-second rate of a counter over the selected targets, summed (by `by` when given)."""
    grouping = f" by ({by})" if by else ""
    matchers = f"{{{selector}}}" if selector else ""
    return f"sum{grouping} (rate({metric}{matchers}[{RATE}]))"


def mean(metric: str, selector: str, by: str = "bookie_id") -> str:
    """The mean value over the rate interval of a summary or histogram (`metric` without
    `_sum`/`_count`), per `by`."""
    return (
        f"{rate_sum(metric + '_sum', selector, by)} / {rate_sum(metric + '_count', selector, by)}"
    )


def histogram_quantiles(
    metric: str, selector: str, by: str = "", quantiles: Iterable[float] = (0.5, 0.99)
) -> list[Query]:
    """Quantiles of a prometheus_client histogram (`metric` without `_bucket`), summed over
    the selected targets, one series per `by` label when given."""
    group = f"le, {by}" if by else "le"
    legend_by = f"{{{{{by}}}}} " if by else ""
    matchers = f"{{{selector}}}" if selector else ""
    return [
        Query(
            f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{matchers}[{RATE}])))",
            f"{legend_by}p{q * 100:g}",
        )
        for q in quantiles
    ]


def summary_quantiles(
    metric: str, selector: str, quantiles: Iterable[str] = ("0.5", "0.99")
) -> list[Query]:
    """Quantiles of one of BookKeeper's OpStats summaries (successful operations), one series
    per target: a summary's quantiles cannot be summed."""
    return [
        Query(
            f'{metric}{{{selector}, success="true", quantile="{q}"}}',
            f"{{{{instance}}}} p{float(q) * 100:g}",
        )
        for q in quantiles
    ]


def label_variable(name: str, label: str, selector: str) -> dashboard.QueryVariable:
    """A multi-value variable over the values of a target label (from targets.json), "All"
    meaning any."""
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(PROMETHEUS)
        .query(f"label_values({selector}, {name})")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def new_dashboard(uid: str, title: str, description: str) -> dashboard.Dashboard:
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["quire"])
        .time("now-30m", "now")
        .refresh("10s")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .readonly()
        .link(
            dashboard.DashboardLink("Quire")
            .type("dashboards")
            .tags(["quire"])
            .as_dropdown(True)
            .include_vars(False)
            .keep_time(True)
        )
    )


def overview() -> dashboard.Dashboard:
    # The elected auditor's view (a standby auditor keeps its last one).
    leader = "and on (instance) quire_auditor_leader == 1"
    return (
        new_dashboard(
            "quire-overview",
            "Quire: cluster overview",
            "The whole cluster at a glance: what is up, what the gateways append and read and "
            "how fast, how long the bookies take to make an entry durable, what the auditor "
            "sees lost or marks under-replicated, and what garbage collection reclaims.",
        )
        # The gateways' side, then the bookies' and the auditor's.
        .with_panel(
            single(
                "Processes up",
                "Targets of targets.json that answered their last scrape.",
                "none",
                Query("sum(up)"),
            )
        )
        .with_panel(
            single(
                "Appends/s",
                "Entries acknowledged per second, every gateway.",
                "ops",
                Query(rate_sum("quire_gateway_add_entries_total", 'result="ok"')),
            )
        )
        .with_panel(
            single(
                "Reads/s",
                "Entries read per second, every gateway.",
                "ops",
                Query(rate_sum("quire_gateway_read_entries_total", 'result="ok"')),
            )
        )
        .with_panel(
            single(
                "Append p99",
                "99th percentile of the time from an append request to its acknowledgement.",
                "s",
                *histogram_quantiles("quire_gateway_add_latency_seconds", "", quantiles=[0.99]),
            )
        )
        .with_panel(
            single(
                "Pending adds",
                "Adds sent to bookies and not yet acknowledged, every gateway.",
                "none",
                Query("sum(quire_gateway_pending_adds)"),
            )
        )
        .with_panel(
            single(
                "HTTP 5xx/s",
                "Requests per second the gateways answered with a server error.",
                "reqps",
                Query(rate_sum("quire_gateway_http_requests_total", 'status=~"5.."')),
            )
        )
        .with_panel(
            single(
                "Lost bookies",
                "Bookies the elected auditor sees lost.",
                "none",
                Query(f'max(quire_auditor_bookies{{state="lost"}} {leader})'),
            )
        )
        .with_panel(
            single(
                "Read-only bookies",
                "Bookies refusing adds because their disk is past its usage threshold.",
                "none",
                Query("sum(quire_journal_read_only)"),
            )
        )
        .with_panel(
            single(
                "Damaged ledger stores",
                "Ledger stores that found journal records they need gone or bad: they stop "
                "applying the journal and answer UNKNOWN_LEDGER_STATE for what they lack.",
                "none",
                Query("sum(quire_ledgerstore_damaged)"),
            )
        )
        .with_panel(
            single(
                "Unsure ledger stores",
                "Ledger stores that skipped journal records (the operator allowed it): they "
                "never claim an entry absent again.",
                "none",
                Query("sum(quire_ledgerstore_unsure)"),
            )
        )
        .with_panel(
            single(
                "Marked under-replicated (1h)",
                "Ledgers the auditor marked under-replicated in the last hour.",
                "none",
                Query("sum(increase(quire_auditor_ledgers_marked_total[1h]))"),
            )
        )
        .with_panel(
            single(
                "Elected auditors",
                "Auditors holding the lease now: 1 when autorecovery is running.",
                "none",
                Query("sum(quire_auditor_leader)"),
            )
        )
        .with_panel(
            graph(
                "Entries appended and read",
                "Entries per second by outcome, every gateway.",
                "ops",
                Query(
                    rate_sum("quire_gateway_add_entries_total", "", by="result"),
                    "append {{result}}",
                ),
                Query(
                    rate_sum("quire_gateway_read_entries_total", "", by="result"),
                    "read {{result}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Append latency",
                "From the append request to its acknowledgement (ack quorum, in order).",
                "s",
                *histogram_quantiles(
                    "quire_gateway_add_latency_seconds", "", quantiles=[0.5, 0.99, 0.999]
                ),
            )
        )
        .with_panel(
            graph(
                "Journal group commit p99",
                "Per bookie: writing a group commit and its fdatasync, 99th percentile.",
                "s",
                *histogram_quantiles(
                    "quire_journal_sync_latency_seconds",
                    'service="journal"',
                    by="bookie_id",
                    quantiles=[0.99],
                ),
            )
        )
        .with_panel(
            graph(
                "Bookie read request p99",
                "Per bookie: from a read request's arrival to its reply, 99th percentile.",
                "s",
                *histogram_quantiles(
                    "quire_ledgerstore_read_request_latency_seconds",
                    'service="ledgerstore"',
                    by="bookie_id",
                    quantiles=[0.99],
                ),
            )
        )
        .with_panel(
            graph(
                "Bookies by state",
                "Writable, read-only and lost bookies, as the elected auditor last saw them.",
                "none",
                Query(f"max by (state) (quire_auditor_bookies {leader})", "{{state}}"),
            )
        )
        .with_panel(
            graph(
                "Ensemble changes and recoveries",
                "Segments added because a bookie failed, and ledger recoveries by outcome.",
                "ops",
                Query(rate_sum("quire_gateway_ensemble_changes_total", ""), "ensemble changes"),
                Query(
                    rate_sum("quire_gateway_ledger_recoveries_total", "", by="result"),
                    "recoveries {{result}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Processes up",
                "1 when the target answered its last scrape: one series per process of "
                "targets.json.",
                "none",
                Query("up", "{{instance}}"),
            )
        )
        .with_panel(
            graph(
                "Space reclaimed by garbage collection",
                "Bytes per second freed on every bookie, by deleting whole entry logs and by "
                "compacting them.",
                "Bps",
                Query(
                    rate_sum("quire_ledgerstore_gc_reclaimed_bytes_total", "", by="by"),
                    "{{by}}",
                ),
            )
        )
        .with_row(dashboard.Row("Metadata (PostgreSQL)"))
        .with_panel(
            graph(
                "Metadata requests",
                "Requests the metadata service answered per second, by operation and outcome "
                "(OK or the error code).",
                "reqps",
                Query(
                    rate_sum("quire_metadata_requests_total", "", by="op, code"),
                    "{{op}} {{code}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Metadata request latency p99",
                "From decoding a request to its reply, by operation, 99th percentile.",
                "s",
                *histogram_quantiles(
                    "quire_metadata_request_latency_seconds", "", by="op", quantiles=[0.99]
                ),
            )
        )
        .with_panel(
            graph(
                "Compare-and-set conflicts",
                "Metadata updates refused per second because the ledger or cookie changed "
                "under the writer (BAD_VERSION).",
                "ops",
                Query(rate_sum("quire_metadata_cas_conflicts_total", "", by="op"), "{{op}}"),
            )
        )
        .with_row(dashboard.Row("Processes"))
        .with_panel(
            graph(
                "CPU",
                "CPU seconds per second of each process.",
                "percentunit",
                Query(f"rate(process_cpu_seconds_total[{RATE}])", "{{instance}}"),
            )
        )
        .with_panel(
            graph(
                "Resident memory",
                "Resident set size of each process.",
                "bytes",
                Query("process_resident_memory_bytes", "{{instance}}"),
            )
        )
    )


def gateway() -> dashboard.Dashboard:
    return (
        new_dashboard(
            "quire-gateway",
            "Quire: gateway",
            "The gateway: HTTP requests, appends and reads, their latency and errors, the "
            "writer's ensemble changes and recoveries, what it has in flight to the bookies.",
        )
        .with_variable(label_variable("instance", "Gateway", 'up{service="gateway"}'))
        .with_row(dashboard.Row("Requests"))
        .with_panel(
            graph(
                "HTTP requests",
                "Requests per second by route and status.",
                "reqps",
                Query(
                    rate_sum("quire_gateway_http_requests_total", INSTANCE, by="route, status"),
                    "{{route}} {{status}}",
                ),
            )
        )
        .with_panel(
            graph(
                "HTTP errors",
                "Requests per second answered 4xx (the caller's error) and 5xx (ours).",
                "reqps",
                Query(
                    rate_sum(
                        "quire_gateway_http_requests_total",
                        f'{INSTANCE}, status=~"[45].."',
                        by="route, status",
                    ),
                    "{{route}} {{status}}",
                ),
            )
        )
        .with_row(dashboard.Row("Appends"))
        .with_panel(
            graph(
                "Entries appended",
                "Entries per second by outcome.",
                "ops",
                Query(
                    rate_sum("quire_gateway_add_entries_total", INSTANCE, by="result"),
                    "{{result}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Append latency",
                "From the append request to its acknowledgement (ack quorum, in order).",
                "s",
                *histogram_quantiles(
                    "quire_gateway_add_latency_seconds", INSTANCE, quantiles=[0.5, 0.9, 0.99, 0.999]
                ),
            )
        )
        .with_panel(
            graph(
                "Pending adds and writer handles",
                "Adds sent and not yet acknowledged; ledgers this gateway writes.",
                "none",
                Query(f"sum(quire_gateway_pending_adds{{{INSTANCE}}})", "pending adds"),
                Query(f"sum(quire_gateway_writer_handles{{{INSTANCE}}})", "writer handles"),
            )
        )
        .with_panel(
            graph(
                "Add requests to bookies",
                "Add requests sent, the sends of one ledger to one bookie merged into them, "
                "and sends held back while a bookie had max_add_requests_per_bookie unanswered.",
                "ops",
                Query(
                    rate_sum("quire_gateway_add_requests_total", INSTANCE),
                    "requests",
                ),
                Query(rate_sum("quire_gateway_add_sends_total", INSTANCE), "sends"),
                Query(
                    rate_sum("quire_gateway_add_sends_held_total", INSTANCE),
                    "sends held",
                ),
            )
        )
        .with_panel(
            graph(
                "Ensemble changes",
                "Segments added per second because a bookie of the ensemble failed.",
                "ops",
                Query(
                    rate_sum("quire_gateway_ensemble_changes_total", INSTANCE),
                    "ensemble changes",
                ),
            )
        )
        .with_panel(
            graph(
                "Recoveries",
                "Ledger recoveries (fence and close) per second by outcome.",
                "ops",
                Query(
                    rate_sum("quire_gateway_ledger_recoveries_total", INSTANCE, by="result"),
                    "{{result}}",
                ),
            )
        )
        .with_row(dashboard.Row("Reads"))
        .with_panel(
            graph(
                "Entries read",
                "Entries per second by outcome.",
                "ops",
                Query(
                    rate_sum("quire_gateway_read_entries_total", INSTANCE, by="result"),
                    "{{result}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Read retries and corrupt replicas",
                "Speculative reads, retries the budget refused, back-offs from a slow or "
                "overloaded bookie, and replicas whose frame failed its digest.",
                "ops",
                Query(
                    rate_sum("quire_gateway_speculative_reads_total", INSTANCE),
                    "speculative",
                ),
                Query(
                    rate_sum("quire_gateway_read_retries_refused_total", INSTANCE),
                    "retries refused",
                ),
                Query(
                    rate_sum("quire_gateway_read_backoffs_total", INSTANCE),
                    "back-offs",
                ),
                Query(
                    rate_sum("quire_gateway_corrupt_replicas_total", INSTANCE),
                    "corrupt replicas",
                ),
            )
        )
    )


def bookie() -> dashboard.Dashboard:
    read_cache_hits = rate_sum("bookie_read_cache_hits", BOOKIE, by="bookie_id")
    read_cache_misses = rate_sum("bookie_read_cache_misses", BOOKIE, by="bookie_id")
    return (
        new_dashboard(
            "quire-bookie",
            "Quire: bookie",
            "The bookies under BookKeeper's metric names: the journal (adds, group commits "
            "and their fdatasync, its queue), the ledger storage (caches, flushes, reads) and "
            "garbage collection. Summaries are per process (a quantile cannot be summed).",
        )
        .with_variable(label_variable("bookie_id", "Bookie", 'up{service=~"journal|ledgerstore"}'))
        .with_variable(label_variable("instance", "Process", 'up{bookie_id=~"$bookie_id"}'))
        .with_row(dashboard.Row("Journal"))
        .with_panel(
            graph(
                "Journal adds",
                "Journal records made durable per second (entries, and the rare fence and "
                "LAC records), and entries refused by status.",
                "ops",
                Query(
                    rate_sum(
                        "bookie_journal_JOURNAL_ADD_ENTRY_count",
                        f'{BOOKIE}, success="true"',
                        by="bookie_id",
                    ),
                    "{{bookie_id}}",
                ),
                Query(
                    rate_sum("quire_journal_add_rejected_total", BOOKIE, by="bookie_id, status"),
                    "{{bookie_id}} refused {{status}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Journal add latency (JOURNAL_ADD_ENTRY)",
                "Per entry, from queueing in the journal to its group commit's fdatasync.",
                "ms",
                *summary_quantiles("bookie_journal_JOURNAL_ADD_ENTRY", BOOKIE),
            )
        )
        .with_panel(
            graph(
                "Group commit latency (JOURNAL_SYNC)",
                "Per group commit: writing it and its fdatasync.",
                "ms",
                *summary_quantiles("bookie_journal_JOURNAL_SYNC", BOOKIE),
            )
        )
        .with_panel(
            graph(
                "Add request latency (ADD_ENTRY_REQUEST)",
                "Per entry of an add request, from its arrival at the journal to the reply.",
                "ms",
                *summary_quantiles("bookkeeper_server_ADD_ENTRY_REQUEST", BOOKIE),
            )
        )
        .with_panel(
            graph(
                "Group commits",
                "Group commits (one fdatasync each) per second.",
                "ops",
                Query(
                    rate_sum(
                        "bookie_journal_JOURNAL_SYNC_count",
                        f'{BOOKIE}, success="true"',
                        by="bookie_id",
                    ),
                    "{{bookie_id}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Group commit batch size (records)",
                "Mean records per group commit: how many adds one fdatasync made durable.",
                "none",
                Query(
                    mean("bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES", BOOKIE),
                    "{{bookie_id}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Group commit batch size (bytes)",
                "Mean bytes per group commit.",
                "bytes",
                Query(
                    mean("bookie_journal_JOURNAL_FORCE_WRITE_BATCH_BYTES", BOOKIE), "{{bookie_id}}"
                ),
            )
        )
        .with_panel(
            graph(
                "Journal queue",
                "Entries queued in the journal and not yet committed.",
                "none",
                Query(f"bookie_journal_JOURNAL_QUEUE_SIZE{{{BOOKIE}}}", "{{bookie_id}}"),
            )
        )
        .with_panel(
            graph(
                "Journal bytes written",
                "Bytes written to the journal per second.",
                "Bps",
                Query(
                    rate_sum("bookie_journal_JOURNAL_WRITE_BYTES", BOOKIE, by="bookie_id"),
                    "{{bookie_id}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Disk usage and read-only",
                "Used fraction of the fullest bookie disk; a bookie turns read-only past "
                "its threshold.",
                "percentunit",
                Query(f"quire_journal_disk_usage_ratio{{{BOOKIE}}}", "{{bookie_id}} used"),
                Query(f"quire_journal_read_only{{{BOOKIE}}}", "{{bookie_id}} read-only"),
            )
        )
        .with_panel(
            graph(
                "Ledgers",
                "Ledgers the journal holds durable state of (fenced flag, LAC, master key), "
                "and ledgers the ledger storage holds entries of.",
                "none",
                Query(f"quire_journal_ledgers{{{BOOKIE}}}", "{{bookie_id}} journal"),
                Query(f"quire_ledgerstore_ledgers{{{BOOKIE}}}", "{{bookie_id}} storage"),
            )
        )
        .with_row(dashboard.Row("Ledger storage"))
        .with_panel(
            graph(
                "Read cache hit ratio",
                "Of the entries read that the write cache did not hold, the share the read "
                "cache served (the rest came from the entry logs).",
                "percentunit",
                Query(
                    f"{read_cache_hits} / ({read_cache_hits} + {read_cache_misses})",
                    "{{bookie_id}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Cache sizes",
                "Bytes in the write cache (entries from the journal not yet flushed) and in "
                "the read cache.",
                "bytes",
                Query(f"bookie_write_cache_size{{{BOOKIE}}}", "{{bookie_id}} write"),
                Query(f"bookie_read_cache_size{{{BOOKIE}}}", "{{bookie_id}} read"),
            )
        )
        .with_panel(
            graph(
                "Flush latency",
                "Per flush of the write cache to the entry logs and the index.",
                "ms",
                *summary_quantiles("bookie_flush", BOOKIE),
            )
        )
        .with_panel(
            graph(
                "Entries read",
                "Entries asked for by reads, and those not stored here or failing their check.",
                "ops",
                Query(
                    rate_sum("quire_ledgerstore_read_entries_total", BOOKIE, by="bookie_id"),
                    "{{bookie_id}}",
                ),
                Query(
                    rate_sum("quire_ledgerstore_read_entries_absent_total", BOOKIE, by="bookie_id"),
                    "{{bookie_id}} absent",
                ),
                Query(
                    rate_sum(
                        "quire_ledgerstore_read_entries_corrupt_total", BOOKIE, by="bookie_id"
                    ),
                    "{{bookie_id}} corrupt",
                ),
            )
        )
        .with_panel(
            graph(
                "Read request latency (READ_ENTRY_REQUEST)",
                "Per read request, from its arrival to its reply.",
                "ms",
                *summary_quantiles("bookkeeper_server_READ_ENTRY_REQUEST", BOOKIE),
            )
        )
        .with_panel(
            graph(
                "Read scheduling delay (READ_ENTRY_SCHEDULING_DELAY)",
                "Time a served read request waited in the read queue for a worker.",
                "ms",
                *summary_quantiles("bookkeeper_server_READ_ENTRY_SCHEDULING_DELAY", BOOKIE),
            )
        )
        .with_panel(
            graph(
                "Read queue",
                "Read requests waiting for a worker and being served; requests refused at "
                "once (queue full) and dropped unread (past their sender's timeout) per "
                "second.",
                "none",
                Query(f"quire_ledgerstore_read_queue_requests{{{BOOKIE}}}", "{{bookie_id}} queued"),
                Query(
                    f"bookkeeper_server_READ_ENTRY_IN_PROGRESS{{{BOOKIE}}}",
                    "{{bookie_id}} in progress",
                ),
                Query(
                    rate_sum(
                        "quire_ledgerstore_read_requests_rejected_total", BOOKIE, by="bookie_id"
                    ),
                    "{{bookie_id}} refused/s",
                ),
                Query(
                    rate_sum(
                        "quire_ledgerstore_read_requests_expired_total", BOOKIE, by="bookie_id"
                    ),
                    "{{bookie_id}} expired/s",
                ),
            )
        )
        .with_panel(
            graph(
                "Damaged and unsure",
                "1 once the ledger storage found journal records it needs gone or bad "
                "(damaged: it stops applying the journal), or skipped some (unsure: it never "
                "claims an entry absent again).",
                "none",
                Query(f"quire_ledgerstore_damaged{{{BOOKIE}}}", "{{bookie_id}} damaged"),
                Query(f"quire_ledgerstore_unsure{{{BOOKIE}}}", "{{bookie_id}} unsure"),
            )
        )
        .with_row(dashboard.Row("Garbage collection"))
        .with_panel(
            graph(
                "Reclaimed space",
                "Bytes per second freed by deleting whole entry logs and by compacting them.",
                "Bps",
                Query(
                    rate_sum("bookie_RECLAIMED_DELETION_SPACE_BYTES", BOOKIE, by="bookie_id"),
                    "{{bookie_id}} deletion",
                ),
                Query(
                    rate_sum("bookie_RECLAIMED_COMPACTION_SPACE_BYTES", BOOKIE, by="bookie_id"),
                    "{{bookie_id}} compaction",
                ),
            )
        )
        .with_panel(
            graph(
                "Compactions and GC runs",
                "Major and minor compactions, garbage-collection runs and failed runs, per second.",
                "ops",
                Query(
                    rate_sum("bookie_MAJOR_COMPACTION_TOTAL", BOOKIE, by="bookie_id"),
                    "{{bookie_id}} major",
                ),
                Query(
                    rate_sum("bookie_MINOR_COMPACTION_TOTAL", BOOKIE, by="bookie_id"),
                    "{{bookie_id}} minor",
                ),
                Query(
                    rate_sum("quire_ledgerstore_gc_runs_total", BOOKIE, by="bookie_id"),
                    "{{bookie_id}} runs",
                ),
                Query(
                    rate_sum("quire_ledgerstore_gc_failures_total", BOOKIE, by="bookie_id"),
                    "{{bookie_id}} failed runs",
                ),
            )
        )
        .with_panel(
            graph(
                "Entry logs",
                "Sealed entry logs, as of each bookie's last GC run.",
                "none",
                Query(f"bookie_ACTIVE_ENTRY_LOG_TOTAL{{{BOOKIE}}}", "{{bookie_id}}"),
            )
        )
        .with_panel(
            graph(
                "Entry log live bytes",
                "Live bytes in the sealed entry logs, as of each bookie's last GC run.",
                "bytes",
                Query(f"bookie_ACTIVE_ENTRY_LOG_SPACE_BYTES{{{BOOKIE}}}", "{{bookie_id}}"),
            )
        )
        .with_panel(
            graph(
                "Entry logs by usage",
                "Sealed logs in each tenth of live usage, all selected bookies: what a "
                "compaction at each threshold would take on.",
                "none",
                Query(
                    f"sum by (usage_le) (quire_ledgerstore_gc_entry_logs_by_usage{{{BOOKIE}}})",
                    "usage <= {{usage_le}}",
                ),
                stacked=True,
            )
        )
        .with_panel(
            graph(
                "Compaction time per entry log",
                "BookKeeper's COMPACT_RUNTIME: per entry log compacted.",
                "ms",
                *summary_quantiles("bookie_COMPACT_RUNTIME", BOOKIE),
            )
        )
    )


def autorecovery() -> dashboard.Dashboard:
    return (
        new_dashboard(
            "quire-autorecovery",
            "Quire: autorecovery",
            "The auditor (bookies it sees lost, ledgers it marks under-replicated, its "
            "checks) and the replication workers (ledgers, entries and bytes re-replicated, "
            "failures).",
        )
        .with_variable(label_variable("instance", "Process", 'up{service=~"auditor|replicator"}'))
        .with_panel(
            single(
                "Elected auditors",
                "Auditors holding the lease now: 1 when autorecovery is running.",
                "none",
                Query(f"sum(quire_auditor_leader{{{INSTANCE}}})"),
            )
        )
        .with_panel(
            single(
                "Lost bookies",
                "Bookies the elected auditor sees lost.",
                "none",
                Query(
                    f'max(quire_auditor_bookies{{{INSTANCE}, state="lost"}} '
                    f"and on (instance) quire_auditor_leader == 1)"
                ),
            )
        )
        .with_panel(
            single(
                "Lost bookies waiting",
                "Lost bookies within lostBookieRecoveryDelay: not yet audited.",
                "none",
                Query(
                    f"max(quire_auditor_lost_bookies_waiting{{{INSTANCE}}} "
                    f"and on (instance) quire_auditor_leader == 1)"
                ),
            )
        )
        .with_panel(
            single(
                "Cookie removals pending",
                "Decommissioned bookies whose cookie goes once their ledgers are repaired.",
                "none",
                Query(
                    f"max(quire_auditor_pending_cookie_removals{{{INSTANCE}}} "
                    f"and on (instance) quire_auditor_leader == 1)"
                ),
            )
        )
        .with_panel(
            single(
                "Re-replicated (1h)",
                "Ledgers the replication workers made whole again in the last hour.",
                "none",
                Query(
                    "sum(increase(quire_replicator_claims_ended_total"
                    f'{{{INSTANCE}, outcome="replicated"}}[1h]))'
                ),
            )
        )
        .with_panel(
            single(
                "Workers busy",
                "Replication workers holding a claim now.",
                "none",
                Query(f"sum(quire_replicator_workers_busy{{{INSTANCE}}})"),
            )
        )
        .with_row(dashboard.Row("Auditor"))
        .with_panel(
            graph(
                "Bookies by state",
                "Writable, read-only and lost bookies, as the elected auditor last saw them.",
                "none",
                Query(
                    f"max by (state) (quire_auditor_bookies{{{INSTANCE}}} "
                    f"and on (instance) quire_auditor_leader == 1)",
                    "{{state}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Ledgers marked under-replicated",
                "Ledgers the auditor marked under-replicated per second, by reason.",
                "ops",
                Query(
                    rate_sum("quire_auditor_ledgers_marked_total", INSTANCE, by="reason"),
                    "{{reason}}",
                ),
            )
        )
        .with_panel(
            graph(
                "Auditor checks",
                "Duration of the periodic checks, by check.",
                "s",
                *histogram_quantiles(
                    "quire_auditor_check_duration_seconds",
                    f'{INSTANCE}, success="true"',
                    by="check",
                    quantiles=[0.5, 1],
                ),
            )
        )
        .with_panel(
            graph(
                "Ledgers checked",
                "Ledgers read per second by the check-all-ledgers and replicas checks.",
                "ops",
                Query(rate_sum("auditor_NUM_LEDGERS_CHECKED", INSTANCE), "ledgers"),
            )
        )
        .with_row(dashboard.Row("Replication workers"))
        .with_panel(
            graph(
                "Ledgers re-replicated",
                "Claims per second by how they ended: replicated (the ledger whole again), "
                "failed, deferred or released.",
                "ops",
                Query(
                    rate_sum("quire_replicator_claims_ended_total", INSTANCE, by="outcome"),
                    "{{outcome}}",
                ),
                Query(
                    rate_sum("replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED", INSTANCE),
                    "ledgers whole (BookKeeper)",
                ),
            )
        )
        .with_panel(
            graph(
                "Entries re-replicated",
                "Entries copied to new bookies per second.",
                "ops",
                Query(
                    rate_sum("replication_worker_NUM_ENTRIES_WRITTEN", INSTANCE),
                    "entries",
                ),
            )
        )
        .with_panel(
            graph(
                "Bytes re-replicated",
                "Entry bytes copied to new bookies per second.",
                "Bps",
                Query(
                    rate_sum("replication_worker_NUM_BYTES_WRITTEN", INSTANCE),
                    "bytes",
                ),
            )
        )
        .with_panel(
            graph(
                "Re-replication failures",
                "Claims that ended in a failure back-off, and claims the queue failed to "
                "hand out, per second.",
                "ops",
                Query(
                    rate_sum(
                        "replication_worker_NUM_DEFER_LEDGER_LOCK_RELEASE_OF_FAILED_LEDGER",
                        INSTANCE,
                    ),
                    "failed claims",
                ),
                Query(
                    rate_sum("quire_replicator_claim_errors_total", INSTANCE),
                    "claim errors",
                ),
            )
        )
        .with_panel(
            graph(
                "Re-replication time",
                "Per claim, from claiming the ledger to the end of its copy.",
                "ms",
                *summary_quantiles("replication_worker_rereplicate", INSTANCE),
            )
        )
        .with_panel(
            graph(
                "Workers busy",
                "Replication workers holding a claim now, per replicator.",
                "none",
                Query(f"quire_replicator_workers_busy{{{INSTANCE}}}", "{{instance}}"),
            )
        )
    )


def tempo_query(traceql: str) -> tempo.TempoQuery:
    return tempo.TempoQuery().datasource(TEMPO).ref_id("A").query_type("traceql").query(traceql)


def trace_search(title: str, description: str, traceql: str) -> dashboard.Panel:
    """A table of the most recent traces a TraceQL query finds (each links to its trace)."""
    return (
        dashboard.Panel()
        .type("table")
        .title(title)
        .description(description)
        .datasource(TEMPO)
        .span(8)
        .height(GRAPH_HEIGHT)
        .with_target(tempo_query(traceql).limit(20))
    )


def traces() -> dashboard.Dashboard:
    return (
        new_dashboard(
            "quire-traces",
            "Quire: traces",
            "Sampled appends, slow fsyncs and background operations from Tempo, and one "
            "trace by id (the id of any HTTP or gRPC answer's traceresponse).",
        )
        .with_variable(
            dashboard.TextBoxVariable("trace_id")
            .label("Trace id")
            .description("A trace id, e.g. from a traceresponse header")
        )
        .with_panel(
            trace_search(
                "Recent appends",
                "Traces with a gateway ledger.add span (sampled requests only).",
                '{resource.service.name = "quire-gateway" && name = "ledger.add"}',
            )
        )
        .with_panel(
            trace_search(
                "Slow fsyncs",
                "Journal fdatasyncs over 10 ms, each in its group commit's trace (linked to "
                "the traced adds it served).",
                '{resource.service.name = "quire-journal" && name = "journal.fdatasync"'
                " && duration > 10ms}",
            )
        )
        .with_panel(
            trace_search(
                "Background operations",
                "Garbage-collection runs and re-replications, always traced unless tracing is off.",
                '{name = "gc.run" || name = "replicator.rereplicate"}',
            )
        )
        .with_panel(
            dashboard.Panel()
            .type("traces")
            .title("Trace $trace_id")
            .description("The span tree of the trace in the Trace id box.")
            .datasource(TEMPO)
            .span(24)
            .height(16)
            .with_target(tempo_query("$trace_id"))
        )
    )


# File name (without .json) -> builder: one provisioned dashboard each.
DASHBOARDS: dict[str, Callable[[], dashboard.Dashboard]] = {
    "quire-overview": overview,
    "quire-gateway": gateway,
    "quire-bookie": bookie,
    "quire-autorecovery": autorecovery,
    "quire-traces": traces,
}


def _numbered(model: dict) -> dict:
    """Panel ids 1, 2, ... in order (Grafana's links to one panel use them)."""
    for number, panel in enumerate(model["panels"], start=1):
        panel["id"] = number
    return model


def render(build: Callable[[], dashboard.Dashboard]) -> str:
    model = json.loads(json.dumps(build().build(), cls=JSONEncoder))
    return json.dumps(_numbered(model), indent=2, sort_keys=True) + "\n"


def rendered() -> dict[str, str]:
    """Every dashboard's JSON text by file name."""
    return {f"{name}.json": render(build) for name, build in DASHBOARDS.items()}


def main() -> int:
    DASHBOARDS_DIR.mkdir(exist_ok=True)
    texts = rendered()
    for stale in DASHBOARDS_DIR.glob("*.json"):
        if stale.name not in texts:
            stale.unlink()
    for name, text in texts.items():
        (DASHBOARDS_DIR / name).write_text(text)
    print(f"wrote {len(texts)} dashboards to {DASHBOARDS_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
