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

# Grid: 24 columns; a stat is a quarter of a row, a graph half of one.
STAT_WIDTH, STAT_HEIGHT = 6, 4
GRAPH_WIDTH, GRAPH_HEIGHT = 12, 8

RATE = "$__rate_interval"
# Selectors of the bookie dashboard's variables ($bookie_id, $instance are regexes: "All"
# is ".*").
BOOKIE = 'bookie_id=~"$bookie_id", instance=~"$instance"'
GATEWAY = 'instance=~"$instance"'


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
        panel = panel.stacking(common.StackingConfig().mode(common.StackingMode.NORMAL))
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
            f"histogram_quantile({q}, sum by ({group}) "
            f"(rate({metric}_bucket{matchers}[{RATE}])))",
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
        .query({"query": f"label_values({selector}, {name})", "refId": "PrometheusVariableQuery"})
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
    return (
        new_dashboard(
            "quire-overview",
            "Quire: cluster overview",
            "The whole cluster at a glance: what is up, what the gateway appends and reads, "
            "how long an append takes, and what the auditor finds under-replicated.",
        )
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
                Query(f'sum(rate(quire_gateway_add_entries_total{{result="ok"}}[{RATE}]))'),
            )
        )
        .with_panel(
            single(
                "Append p99",
                "99th percentile of the time from an append request to its acknowledgement.",
                "s",
                histogram_quantiles("quire_gateway_add_latency_seconds", "", quantiles=[0.99])[0],
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
            graph(
                "Entries appended and read",
                "Entries per second by outcome, every gateway.",
                "ops",
                Query(
                    f"sum by (result) (rate(quire_gateway_add_entries_total[{RATE}]))",
                    "append {{result}}",
                ),
                Query(
                    f"sum by (result) (rate(quire_gateway_read_entries_total[{RATE}]))",
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
                "Processes up",
                "1 when the target answered its last scrape: one series per process of "
                "targets.json.",
                "none",
                Query("up", "{{instance}}"),
            )
        )
        .with_panel(
            graph(
                "Ensemble changes and recoveries",
                "Segments added because a bookie failed, and ledger recoveries by outcome.",
                "ops",
                Query(
                    f"sum(rate(quire_gateway_ensemble_changes_total[{RATE}]))", "ensemble changes"
                ),
                Query(
                    f"sum by (result) (rate(quire_gateway_ledger_recoveries_total[{RATE}]))",
                    "recoveries {{result}}",
                ),
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
                    f"sum by (route, status) "
                    f"(rate(quire_gateway_http_requests_total{{{GATEWAY}}}[{RATE}]))",
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
                    f"sum by (route, status) (rate(quire_gateway_http_requests_total"
                    f'{{{GATEWAY}, status=~"[45].."}}[{RATE}]))',
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
                    f"sum by (result) (rate(quire_gateway_add_entries_total{{{GATEWAY}}}[{RATE}]))",
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
                    "quire_gateway_add_latency_seconds", GATEWAY, quantiles=[0.5, 0.9, 0.99, 0.999]
                ),
            )
        )
        .with_panel(
            graph(
                "Pending adds and writer handles",
                "Adds sent and not yet acknowledged; ledgers this gateway writes.",
                "none",
                Query(f"sum(quire_gateway_pending_adds{{{GATEWAY}}})", "pending adds"),
                Query(f"sum(quire_gateway_writer_handles{{{GATEWAY}}})", "writer handles"),
            )
        )
        .with_panel(
            graph(
                "Add requests to bookies",
                "Add requests sent, the sends of one ledger to one bookie merged into them, "
                "and sends held back while a bookie had max_add_requests_per_bookie unanswered.",
                "ops",
                Query(
                    f"sum(rate(quire_gateway_add_requests_total{{{GATEWAY}}}[{RATE}]))",
                    "requests",
                ),
                Query(f"sum(rate(quire_gateway_add_sends_total{{{GATEWAY}}}[{RATE}]))", "sends"),
                Query(
                    f"sum(rate(quire_gateway_add_sends_held_total{{{GATEWAY}}}[{RATE}]))",
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
                    f"sum(rate(quire_gateway_ensemble_changes_total{{{GATEWAY}}}[{RATE}]))",
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
                    f"sum by (result) "
                    f"(rate(quire_gateway_ledger_recoveries_total{{{GATEWAY}}}[{RATE}]))",
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
                    f"sum by (result) "
                    f"(rate(quire_gateway_read_entries_total{{{GATEWAY}}}[{RATE}]))",
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
                    f"sum(rate(quire_gateway_speculative_reads_total{{{GATEWAY}}}[{RATE}]))",
                    "speculative",
                ),
                Query(
                    f"sum(rate(quire_gateway_read_retries_refused_total{{{GATEWAY}}}[{RATE}]))",
                    "retries refused",
                ),
                Query(
                    f"sum(rate(quire_gateway_read_backoffs_total{{{GATEWAY}}}[{RATE}]))",
                    "back-offs",
                ),
                Query(
                    f"sum(rate(quire_gateway_corrupt_replicas_total{{{GATEWAY}}}[{RATE}]))",
                    "corrupt replicas",
                ),
            )
        )
    )


def traces() -> dashboard.Dashboard:
    search = (
        tempo.TempoQuery()
        .datasource(TEMPO)
        .ref_id("A")
        .query_type("traceql")
        .query('{resource.service.name = "quire-gateway" && name = "ledger.add"}')
        .limit(20)
    )
    slow = (
        tempo.TempoQuery()
        .datasource(TEMPO)
        .ref_id("A")
        .query_type("traceql")
        .query(
            '{resource.service.name = "quire-journal" && name = "journal.fdatasync"'
            " && duration > 10ms}"
        )
        .limit(20)
    )
    trace = (
        tempo.TempoQuery().datasource(TEMPO).ref_id("A").query_type("traceql").query("$trace_id")
    )
    return (
        new_dashboard(
            "quire-traces",
            "Quire: traces",
            "Sampled appends and slow fsyncs from Tempo, and one trace by id (the id of any "
            "HTTP or gRPC answer's traceresponse).",
        )
        .with_variable(
            dashboard.TextBoxVariable("trace_id")
            .label("Trace id")
            .description("A trace id, e.g. from a traceresponse header")
        )
        .with_panel(
            dashboard.Panel()
            .type("table")
            .title("Recent appends")
            .description("Traces with a gateway ledger.add span (sampled requests only).")
            .datasource(TEMPO)
            .span(GRAPH_WIDTH)
            .height(GRAPH_HEIGHT)
            .with_target(search)
        )
        .with_panel(
            dashboard.Panel()
            .type("table")
            .title("Slow fsyncs")
            .description("Journal fdatasyncs over 10 ms, and the group commits they served.")
            .datasource(TEMPO)
            .span(GRAPH_WIDTH)
            .height(GRAPH_HEIGHT)
            .with_target(slow)
        )
        .with_panel(
            dashboard.Panel()
            .type("traces")
            .title("Trace $trace_id")
            .description("The span tree of the trace in the Trace id box.")
            .datasource(TEMPO)
            .span(24)
            .height(16)
            .with_target(trace)
        )
    )


# File name (without .json) -> builder: one provisioned dashboard each.
DASHBOARDS: dict[str, Callable[[], dashboard.Dashboard]] = {
    "quire-overview": overview,
    "quire-gateway": gateway,
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
