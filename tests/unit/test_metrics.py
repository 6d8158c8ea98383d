"""shared/metrics.py: plain counters turned into Prometheus text at scrape time, read back
with prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shared.events import EventStats
from shared.metrics import (
    FAST_BOUNDS_MS,
    QUANTILES,
    WINDOW_S,
    Exposition,
    MetricsRegistry,
    OpStats,
    estimate_quantile,
    scrape,
    serve_metrics,
)


def families(registry: MetricsRegistry) -> dict:
    text = generate_latest(registry.registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(family) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}


def test_op_stats_are_a_bookkeeper_summary_in_ms_and_a_quire_histogram_in_seconds() -> None:
    stats = OpStats()
    for _ in range(9):
        stats.record(0.3)  # the (0.25, 0.5] ms bucket
    stats.record(3.0, n=1)  # (2, 5]
    stats.record(40.0, success=False, n=2)  # one request of two refused entries
    registry = MetricsRegistry()
    registry.add(
        lambda e: e.op_stats(
            stats, bk_name="bookie_journal_JOURNAL_SYNC", quire_name="quire_x_seconds", doc="d"
        )
    )
    found = families(registry)

    summary = found["bookie_journal_JOURNAL_SYNC"]
    assert summary.type == "summary"
    values = samples(summary)
    count = ("bookie_journal_JOURNAL_SYNC_count", (("success", "true"),))
    total = ("bookie_journal_JOURNAL_SYNC_sum", (("success", "true"),))
    assert values[count] == 10 and values[total] == pytest.approx(5.7)
    assert values[("bookie_journal_JOURNAL_SYNC_count", (("success", "false"),))] == 2
    assert values[("bookie_journal_JOURNAL_SYNC_sum", (("success", "false"),))] == 80

    def quantile(q: float, success: str = "true") -> float:
        return values[("bookie_journal_JOURNAL_SYNC", (("quantile", str(q)), ("success", success)))]

    assert {
        q for (name, labels) in values if name == summary.name for k, q in labels if k == "quantile"
    } == {str(q) for q in QUANTILES}
    assert 0.25 < quantile(0.5) <= 0.5  # in the bucket of 9 of the 10
    assert 2 < quantile(0.99) <= 3.0  # the last bucket's top is the largest seen
    assert quantile(1.0) == 3.0
    assert 25 < quantile(0.5, "false") <= 40

    histogram = found["quire_x_seconds"]
    assert histogram.type == "histogram"
    buckets = samples(histogram)
    assert buckets[("quire_x_seconds_bucket", (("le", "0.0005"), ("success", "true")))] == 9
    assert buckets[("quire_x_seconds_bucket", (("le", "0.005"), ("success", "true")))] == 10
    assert buckets[("quire_x_seconds_bucket", (("le", "+Inf"), ("success", "false")))] == 2
    assert buckets[("quire_x_seconds_count", (("success", "true"),))] == 10
    assert buckets[("quire_x_seconds_sum", (("success", "true"),))] == pytest.approx(0.0057)


def test_counters_gauges_and_bookkeeper_counters_keep_their_names() -> None:
    registry = MetricsRegistry()

    def build(e: Exposition) -> None:
        e.counter("quire_y_entries", "entries", 3, status="OK")
        e.counter("quire_y_entries", "entries", 4, status="FENCED")
        e.declare_counter("quire_y_conflicts", "none yet", "op")
        e.gauge("quire_y_queue_entries", "queued", 7)
        e.bk_counter("bookie_read_cache_hits", "hits", 12)
        e.bk_summary_totals("bookie_flush_size", "bytes per flush", 2, 100)

    registry.add(build)
    found = families(registry)
    assert found["quire_y_entries"].type == "counter"
    assert samples(found["quire_y_entries"]) == {
        ("quire_y_entries_total", (("status", "OK"),)): 3,
        ("quire_y_entries_total", (("status", "FENCED"),)): 4,
    }
    assert found["quire_y_conflicts"].type == "counter" and found["quire_y_conflicts"].samples == []
    assert samples(found["quire_y_queue_entries"]) == {("quire_y_queue_entries", ()): 7}
    # BookKeeper's counter: its own sample name, no _total.
    assert samples(found["bookie_read_cache_hits"]) == {("bookie_read_cache_hits", ()): 12}
    assert samples(found["bookie_flush_size"]) == {
        ("bookie_flush_size_count", (("success", "true"),)): 2,
        ("bookie_flush_size_sum", (("success", "true"),)): 100,
    }
    # The process's own collectors come with every registry.
    assert "process_cpu_seconds" in found and "python_info" in found
    scraped = registry.scrape()
    assert scraped.value("quire_y_entries_total") == 7
    assert scraped.value("quire_y_entries_total", status="OK") == 3
    assert scraped.value("bookie_read_cache_hits") == 12


def test_scrapes_read_the_counters_as_they_are_then() -> None:
    stats = SimpleNamespace(adds=0)
    registry = MetricsRegistry()
    registry.add(lambda e: e.counter("quire_z_adds", "adds", stats.adds))
    assert registry.scrape().value("quire_z_adds_total") == 0
    stats.adds += 5
    assert registry.scrape().value("quire_z_adds_total") == 5


def test_quantile_estimates() -> None:
    bounds = (1.0, 2.0, 4.0)
    assert math.isnan(estimate_quantile(bounds, [0, 0, 0, 0], 0.5, 0.0))
    # Linear in (1, 2], its top capped at the largest value seen: (1, 1.9].
    assert estimate_quantile(bounds, [0, 10, 0, 0], 0.5, 1.9) == pytest.approx(1.45)
    assert estimate_quantile(bounds, [0, 10, 0, 0], 0.5, 3.0) == pytest.approx(1.5)
    assert estimate_quantile(bounds, [10, 0, 0, 0], 1.0, 0.7) == pytest.approx(0.7)
    # Above the last bound: up to the largest value seen.
    assert estimate_quantile(bounds, [0, 0, 0, 4], 1.0, 9.0) == 9.0
    assert estimate_quantile(bounds, [0, 0, 0, 4], 0.5, 9.0) == pytest.approx(6.5)


def test_summary_quantiles_cover_a_sliding_window_and_totals_do_not() -> None:
    stats = OpStats()
    windows: dict = {}

    def quantiles_at(now: float) -> dict:
        e = Exposition(now=now, windows=windows)
        e.op_stats(stats, bk_name="bk", quire_name="quire_w_seconds", doc="d")
        return {
            (s.name, s.labels.get("quantile")): s.value
            for s in e.families["bk"].samples
            if s.labels["success"] == "true"
        }

    for _ in range(100):
        stats.record(500.0)  # slow, at first
    assert quantiles_at(0.0)[("bk", "0.5")] > 250
    assert quantiles_at(WINDOW_S)[("bk", "0.5")] > 250  # rotated: still the first samples
    for _ in range(100):
        stats.record(0.3)  # fast from then on
    assert quantiles_at(2 * WINDOW_S)[("bk", "0.5")] <= 0.5  # the slow ones left the window
    last = quantiles_at(2 * WINDOW_S + 1)
    assert last[("bk_count", None)] == 200  # totals since the start


def test_record_is_one_bucket_per_call() -> None:
    stats = OpStats()
    stats.record(FAST_BOUNDS_MS[-1] * 10, n=3)
    assert stats.buckets[1][-1] == 3 and sum(stats.buckets[1]) == 3
    assert stats.max_ms[1] == FAST_BOUNDS_MS[-1] * 10


async def test_the_server_serves_the_registry_on_a_free_port_until_shutdown() -> None:
    steps = []
    rt = SimpleNamespace(
        settings=SimpleNamespace(metrics_port=0, metrics_host="127.0.0.1"),
        on_shutdown=steps.append,
        events=SimpleNamespace(stats=EventStats(published=5)),
        health=lambda: (True, "ok"),
        readiness=lambda: (False, "starting"),
    )
    metrics = serve_metrics(rt, lambda e: e.counter("quire_s_requests", "requests", 2))  # type: ignore[arg-type]
    assert rt.metrics is metrics and rt.metrics_url.startswith("http://127.0.0.1:")
    scraped = await scrape(rt.metrics_url)
    assert scraped.value("quire_s_requests_total") == 2
    assert scraped.types["quire_s_requests"] == "counter"
    # Every service's registry has the event publisher's metrics.
    assert scraped.value("quire_events_published_total") == 5
    # The probes beside it (Kubernetes' httpGet): the runtime's answers, as 200 or 503.
    base = rt.metrics_url.removesuffix("/metrics")
    async with httpx.AsyncClient() as http:
        healthz, readyz = await http.get(f"{base}/healthz"), await http.get(f"{base}/readyz")
    assert (healthz.status_code, healthz.text) == (200, "ok\n")
    assert (readyz.status_code, readyz.text) == (503, "starting\n")
    [stop] = steps
    await stop()
    with pytest.raises(OSError):
        await asyncio.wait_for(scrape(rt.metrics_url, timeout_s=2), 5)


def test_no_server_without_a_port() -> None:
    steps = []
    rt = SimpleNamespace(
        settings=SimpleNamespace(metrics_port=None, metrics_host="127.0.0.1"),
        on_shutdown=steps.append,
        events=SimpleNamespace(stats=EventStats()),
    )
    serve_metrics(rt)  # type: ignore[arg-type]
    assert rt.metrics_url is None and steps == []
