"""Prometheus metrics for a Quire process, read at scrape time (docs/metrics.md is the catalog).

The services keep plain counters (dataclasses of ints, `OpStats` below) that their hot
paths bump without a lock; a process's `MetricsRegistry` holds builders (one per service
part) that turn those counters into Prometheus families when a scrape comes, in the metrics
server's thread. A scrape may see one counter bumped and its neighbour not yet: the next
scrape sees both, which is all a rate needs; no request ever waits for a scrape.

Two families of names (docs/metrics.md): Quire's `quire_<service>_<what>_<unit>` in base
units, and BookKeeper's (its Prometheus provider's spelling: an OpStatsLogger is a summary
in milliseconds with `success` and `quantile` labels, a counter keeps its name without
`_total`). One `OpStats` gives both: BookKeeper's summary and Quire's histogram in seconds.

The server is prometheus_client's own (`start_http_server`), on `settings.metrics_port`
(None: none; 0: an ephemeral port) and `settings.metrics_host`.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from shared.natsfast import LeanStats, lean_stats

if TYPE_CHECKING:
    from shared.events import EventStats
    from shared.service import ServiceRuntime

log = logging.getLogger(__name__)

# Latency bucket bounds in milliseconds: a request or a commit ("fast"), a check or a
# re-replication that may take minutes ("slow").
FAST_BOUNDS_MS: tuple[float, ...] = (0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000)
SLOW_BOUNDS_MS: tuple[float, ...] = (10, 100, 500, 1_000, 5_000, 10_000, 30_000, 60_000, 300_000,
                                     1_800_000)  # fmt: skip
# BookKeeper's Prometheus provider writes these quantiles of every OpStatsLogger.
QUANTILES = (0.5, 0.75, 0.95, 0.99, 0.999, 0.9999, 1.0)
# The summaries' quantiles cover the samples of the last WINDOW_S to 2 * WINDOW_S seconds
# (BookKeeper's cover the last minute: its provider rotates its sketches every minute).
WINDOW_S = 60.0


class OpStats:
    """One BookKeeper OpStatsLogger as plain numbers: per outcome (success or not) a count,
    a sum and a maximum in milliseconds and counts per latency bucket. `record` is a few
    additions and one bisect, safe to call on a hot path from any one thread."""

    __slots__ = ("bounds_ms", "count", "sum_ms", "max_ms", "buckets")

    def __init__(self, bounds_ms: Sequence[float] = FAST_BOUNDS_MS) -> None:
        self.bounds_ms = tuple(bounds_ms)
        # Index 0: failed, 1: succeeded (BookKeeper's success="false|true").
        self.count = [0, 0]
        self.sum_ms = [0.0, 0.0]
        self.max_ms = [0.0, 0.0]
        self.buckets = [[0] * (len(self.bounds_ms) + 1) for _ in range(2)]

    def record(self, latency_ms: float, success: bool = True, n: int = 1) -> None:
        """`n` events of `latency_ms` each (the entries of one request share its latency)."""
        i = 1 if success else 0
        self.count[i] += n
        self.sum_ms[i] += latency_ms * n
        if latency_ms > self.max_ms[i]:
            self.max_ms[i] = latency_ms
        self.buckets[i][bisect.bisect_left(self.bounds_ms, latency_ms)] += n


def estimate_quantile(
    bounds: Sequence[float], counts: Sequence[int], q: float, largest: float
) -> float:
    """The q-quantile of the values counted in `counts` (bucket i holds values in
    (bounds[i-1], bounds[i]], the last one above bounds[-1]), linear within a bucket; the
    last non-empty bucket's top is capped at `largest`, the largest value seen. NaN if
    nothing was counted."""
    total = sum(counts)
    if total == 0:
        return math.nan
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n == 0:
            continue
        if seen + n >= rank:
            low = bounds[i - 1] if i > 0 else 0.0
            high = bounds[i] if i < len(bounds) else max(largest, low)
            high = min(high, max(largest, low))
            return low + (high - low) * max(0.0, rank - seen) / n
        seen += n
    return largest


@dataclass
class _Window:
    """Bucket counts at the start of the current quantile window (and the one before)."""

    started: float
    previous: list[list[int]]
    current: list[list[int]]


M = TypeVar("M", bound=Metric)


@dataclass
class Exposition:
    """The families of one scrape, built by the registry's builders. A name added twice
    (several OpStats under one histogram, a labelled counter) gets one family."""

    now: float = field(default_factory=time.monotonic)
    windows: dict[int, _Window] = field(default_factory=dict)
    families: dict[str, Metric] = field(default_factory=dict)

    def _family(self, name: str, make: Callable[[], M]) -> M:
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = make()
        return family  # type: ignore[return-value]  # made by `make` under this name

    def counter(self, name: str, doc: str, value: float, **labels: str) -> None:
        """A Quire counter: `name` without `_total` (the exposition adds it)."""
        family = self._family(name, lambda: CounterMetricFamily(name, doc, labels=list(labels)))
        family.add_metric(list(labels.values()), value)

    def declare_counter(self, name: str, doc: str, *labelnames: str) -> None:
        """A labelled counter's family even before its first sample (a name the catalog
        promises is always in the exposition)."""
        self._family(name, lambda: CounterMetricFamily(name, doc, labels=list(labelnames)))

    def gauge(self, name: str, doc: str, value: float, **labels: str) -> None:
        family = self._family(name, lambda: GaugeMetricFamily(name, doc, labels=list(labels)))
        family.add_metric(list(labels.values()), value)

    def bk_counter(self, name: str, doc: str, value: float) -> None:
        """A BookKeeper counter under its exact sample name (no `_total`): untyped, the only
        way prometheus_client writes a counter's sample without the suffix."""
        family = self._family(name, lambda: Metric(name, doc, "unknown"))
        family.add_sample(name, {}, value)

    def bk_summary_totals(self, name: str, doc: str, count: float, total: float) -> None:
        """A BookKeeper value distribution of which only totals are kept: `_count` and
        `_sum` of success="true", no quantiles."""
        family = self._family(name, lambda: Metric(name, doc, "summary"))
        family.add_sample(name + "_count", {"success": "true"}, count)
        family.add_sample(name + "_sum", {"success": "true"}, total)

    def op_stats(
        self,
        stats: OpStats,
        *,
        bk_name: str | None,
        quire_name: str,
        doc: str,
        **labels: str,
    ) -> None:
        """BookKeeper's summary (ms, windowed quantiles; None: no BookKeeper name) and
        Quire's histogram (seconds, cumulative, with `labels` and `success`) of `stats`."""
        # Copies first: the hot path may bump them while we read.
        buckets = [list(b) for b in stats.buckets]
        counts, sums, maxes = list(stats.count), list(stats.sum_ms), list(stats.max_ms)
        if bk_name is not None:
            window = self._window(stats, buckets)
            family = self._family(bk_name, lambda: Metric(bk_name, doc, "summary"))
            for i, success in ((0, "false"), (1, "true")):
                recent = [n - old for n, old in zip(buckets[i], window.previous[i], strict=True)]
                for q in QUANTILES:
                    family.add_sample(
                        bk_name,
                        {"success": success, "quantile": str(q)},
                        estimate_quantile(stats.bounds_ms, recent, q, maxes[i]),
                    )
                family.add_sample(bk_name + "_count", {"success": success}, counts[i])
                family.add_sample(bk_name + "_sum", {"success": success}, sums[i])
        names = [*labels, "success"]
        histogram = self._family(
            quire_name, lambda: HistogramMetricFamily(quire_name, doc, labels=names)
        )
        for i, success in ((0, "false"), (1, "true")):
            cumulative, running = [], 0
            for bound, n in zip((*stats.bounds_ms, math.inf), buckets[i], strict=True):
                running += n
                cumulative.append((_le(bound / 1000), running))
            histogram.add_metric([*labels.values(), success], cumulative, sums[i] / 1000)

    def _window(self, stats: OpStats, buckets: list[list[int]]) -> _Window:
        window = self.windows.get(id(stats))
        if window is None:
            zero = [[0] * len(b) for b in buckets]
            window = self.windows[id(stats)] = _Window(self.now, zero, zero)
        elif self.now - window.started >= WINDOW_S:
            window.previous, window.current, window.started = window.current, buckets, self.now
        return window


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


Builder = Callable[[Exposition], None]


def events_metrics(stats: EventStats) -> Builder:
    """The event publisher's (shared/events.py), in every process."""

    def build(e: Exposition) -> None:
        e.counter("quire_events_published", "Events JetStream acknowledged", stats.published)
        e.declare_counter(
            "quire_events_dropped", "Events dropped because the buffer was full, by kind", "kind"
        )
        for kind, n in list(stats.dropped_by_kind.items()):
            e.counter("quire_events_dropped", "", n, kind=kind)
        e.counter(
            "quire_events_publish_retries",
            "Failed event publishes (each retried after a backoff)",
            stats.retries,
        )
        e.gauge("quire_events_buffered", "Events waiting to be published", stats.buffered)

    return build


def natsfast_metrics(stats: LeanStats = lean_stats) -> Builder:
    """The lean NATS paths' (shared/natsfast.py), in every process."""

    def build(e: Exposition) -> None:
        e.counter("quire_natsfast_requests", "Requests sent by the lean path", stats.requests)
        e.counter(
            "quire_natsfast_request_fallbacks",
            "Requests sent by nats-py's request instead (with headers: traced)",
            stats.request_fallbacks,
        )
        e.gauge(
            "quire_natsfast_requests_waiting",
            "Lean requests sent and not answered, timed out or cancelled",
            stats.waiting,
        )
        e.counter("quire_natsfast_replies", "Replies queued without a coroutine", stats.replies)
        e.counter(
            "quire_natsfast_reply_fallbacks",
            "Of those, published by nats-py (the connection was not up)",
            stats.reply_fallbacks,
        )
        e.counter(
            "quire_natsfast_writes",
            "End-of-turn socket writes of the queued requests and replies",
            stats.writes,
        )
        e.counter(
            "quire_natsfast_delivered",
            "Messages handed to a lean subscription's handler",
            stats.delivered,
        )
        e.counter(
            "quire_natsfast_delivered_with_headers",
            "Of those, with headers (traced requests)",
            stats.delivered_with_headers,
        )
        e.counter(
            "quire_natsfast_handler_errors",
            "Lean subscription handlers that raised",
            stats.handler_errors,
        )

    return build


class BuilderCollector(Collector):
    """Builders as a prometheus_client collector (a MetricsRegistry's, or one added to
    another registry: the gateway's)."""

    def __init__(self, *builders: Builder) -> None:
        self.builders: list[Builder] = list(builders)
        # Quantile windows outlive a scrape (keyed by OpStats identity).
        self.windows: dict[int, _Window] = {}

    def collect(self) -> Iterable[Metric]:
        exposition = Exposition(windows=self.windows)
        for build in self.builders:
            build(exposition)
        return list(exposition.families.values())


class MetricsRegistry:
    """A process's metrics: prometheus_client's process and Python collectors plus the
    service's builders, each called at every scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        self._builders = BuilderCollector()
        self.registry.register(self._builders)

    def add(self, build: Builder) -> None:
        self._builders.builders.append(build)

    def scrape(self) -> Scrape:
        """What a scrape would read now (in-process tests)."""
        return parse(generate_latest(self.registry).decode())


Probe = Callable[[], tuple[bool, str]]


def probes_app(metrics_app: Callable, probes: dict[str, Probe]) -> Callable:
    """A WSGI app: each probe's path answers 200 or 503 with the probe's reason as text
    (Kubernetes' httpGet probes); every other path goes to `metrics_app`."""

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        probe = probes.get(environ.get("PATH_INFO", ""))
        if probe is None:
            return metrics_app(environ, start_response)
        try:
            ok, why = probe()
        except Exception as exc:  # a probe that fails says so; the server goes on
            ok, why = False, f"probe failed: {exc!r}"
        status = "200 OK" if ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [f"{why}\n".encode()]

    return app


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base's name)
        pass  # a scrape or probe every few seconds is not worth a log line


def serve_metrics(rt: ServiceRuntime, *builders: Builder) -> MetricsRegistry:
    """The service's registry, served on settings.metrics_port unless that is None, with
    the probes `/healthz` (liveness: rt.health) and `/readyz` (rt.readiness) beside
    `/metrics`; the server stops at shutdown. `rt.metrics_url` is the URL it serves (None
    without one)."""
    metrics = MetricsRegistry()
    for build in (events_metrics(rt.events.stats), natsfast_metrics(), *builders):
        metrics.add(build)
    rt.metrics = metrics  # type: ignore[attr-defined]
    rt.metrics_url = None  # type: ignore[attr-defined]
    settings = rt.settings
    if settings.metrics_port is None:
        return metrics
    app = probes_app(
        make_wsgi_app(metrics.registry), {"/healthz": rt.health, "/readyz": rt.readiness}
    )
    server = make_server(
        settings.metrics_host,
        settings.metrics_port,
        app,
        server_class=_ThreadingWSGIServer,
        handler_class=_QuietHandler,
    )
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    port = server.server_address[1]
    url = f"http://{settings.metrics_host}:{port}/metrics"
    rt.metrics_url = url  # type: ignore[attr-defined]
    log.info("metrics served", extra={"url": url})

    async def stop() -> None:
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        thread.join()

    rt.on_shutdown(stop)
    return metrics


@dataclass(frozen=True)
class Scrape:
    """One target's metrics, parsed: `value(name, **labels)` of a sample."""

    samples: dict[str, list[tuple[dict[str, str], float]]]
    types: dict[str, str]

    def value(self, name: str, **labels: str) -> float:
        """The sample `name` whose labels include `labels`, summed over the others
        (0 when there is none)."""
        return sum(
            v
            for have, v in self.samples.get(name, [])
            if all(have.get(k) == want for k, want in labels.items())
        )

    def __contains__(self, name: str) -> bool:
        return name in self.samples

    def names(self) -> Iterator[str]:
        return iter(self.samples)


def parse(text: str) -> Scrape:
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return Scrape(samples, types)


def scrape_sync(url: str, timeout_s: float = 5.0) -> Scrape:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (our own URL)
        return parse(response.read().decode())


async def scrape(url: str, timeout_s: float = 5.0) -> Scrape:
    """Scrape a metrics URL (for benches and tests), off the event loop."""
    return await asyncio.to_thread(scrape_sync, url, timeout_s)
