"""The gateway's Prometheus metrics, in a registry of its own (one per app, so that two
gateways in one process, as in tests, do not collide)."""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

from shared.events import EventStats
from shared.metrics import BuilderCollector, events_metrics, natsfast_metrics

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10)
BATCH_ENTRIES_BUCKETS = (1, 10, 50, 100, 500, 1_000, 5_000, 10_000, 100_000)


class GatewayMetrics:
    def __init__(self, events: EventStats | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # The process's CPU, memory and Python figures, as every other process serves them.
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        # The event publisher's, under the names every process serves (read at scrape time;
        # a gateway without a publisher, as in unit tests, shows zeros).
        self.registry.register(
            BuilderCollector(events_metrics(events or EventStats()), natsfast_metrics())
        )
        self.add_latency = Histogram(
            "quire_gateway_add_latency_seconds",
            "Time from an append request to its acknowledgement (ack quorum, in order)",
            registry=self.registry,
            buckets=LATENCY_BUCKETS_S,
        )
        self.adds = Counter(
            "quire_gateway_add_entries",
            "Entries appended, by outcome",
            ["result"],
            registry=self.registry,
        )
        self.reads = Counter(
            "quire_gateway_read_entries",
            "Entries read, by outcome",
            ["result"],
            registry=self.registry,
        )
        self.read_stream_batches = Histogram(
            "quire_gateway_read_stream_batch_entries",
            "Entries a range read (HTTP, gRPC Read and Tail) handed on to its client at once: "
            "what the gateway holds of a range, whatever its length",
            registry=self.registry,
            buckets=BATCH_ENTRIES_BUCKETS,
        )
        self.corrupt_replicas = Counter(
            "quire_gateway_corrupt_replicas",
            "Replicas that returned a frame failing its digest",
            registry=self.registry,
        )
        self.http_requests = Counter(
            "quire_gateway_http_requests",
            "HTTP requests served",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.writer_handles = Gauge(
            "quire_gateway_writer_handles",
            "Ledgers this gateway holds the writer handle of",
            registry=self.registry,
        )
        self.pending_adds = Gauge(
            "quire_gateway_pending_adds",
            "Adds sent and not yet acknowledged, all ledgers",
            registry=self.registry,
        )
        self.add_requests = Counter(
            "quire_gateway_add_requests",
            "Add requests sent to bookies, each carrying the sends of one or more ledgers "
            "(entries per request = adds x Qw / this)",
            registry=self.registry,
        )
        self.add_sends = Counter(
            "quire_gateway_add_sends",
            "Sends of one ledger's entries to one bookie (merged into add requests: "
            "sends per request = this / quire_gateway_add_requests)",
            registry=self.registry,
        )
        self.add_sends_held = Counter(
            "quire_gateway_add_sends_held",
            "Sends held back while their bookie had max_add_requests_per_bookie add "
            "requests unanswered (sent merged when one is answered)",
            registry=self.registry,
        )
        self.ensemble_changes = Counter(
            "quire_gateway_ensemble_changes",
            "Segments added because a bookie of the ensemble failed",
            registry=self.registry,
        )
        self.placement_fallbacks = Counter(
            "quire_gateway_placement_fallbacks",
            "Ensembles (op=create) and replacements (op=ensemble_change) placed at random "
            "because the placement policy could not be met and is not enforced",
            ["op"],
            registry=self.registry,
        )
        self.recoveries = Counter(
            "quire_gateway_ledger_recoveries",
            "Ledger recoveries (fence and close), by outcome",
            ["result"],
            registry=self.registry,
        )
        self.speculative_reads = Counter(
            "quire_gateway_speculative_reads",
            "Reads sent to a further replica because the first was slow",
            registry=self.registry,
        )
        self.read_retries_refused = Counter(
            "quire_gateway_read_retries_refused",
            "Speculative reads and retries on another replica that the retry budget refused "
            "(the entry waited for its busy bookie instead)",
            registry=self.registry,
        )
        self.read_backoffs = Counter(
            "quire_gateway_read_backoffs",
            "Times a bookie timed out or answered TOO_MANY_REQUESTS to a read, and the "
            "reader backed off from it",
            registry=self.registry,
        )
