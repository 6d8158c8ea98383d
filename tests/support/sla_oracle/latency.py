"""The oracle of `ack_latency` (analytics/sla/latency.py)."""

from __future__ import annotations

from collections import defaultdict

from analytics.sla.options import SlaOptions
from shared.latency import from_event, merge, percentile, within

QUANTILES = {"p50_ms": 0.5, "p99_ms": 0.99, "p999_ms": 0.999}


def ack_latency(events: list[dict], options: SlaOptions) -> list[dict]:
    width_ms = options.window_s * 1000
    histograms: dict[tuple, dict[int, int]] = defaultdict(dict)
    byte_sums: dict[tuple, int] = defaultdict(int)
    for event in events:
        if event["kind"] != "entries.acknowledged" or not options.in_period(event["ts_ms"]):
            continue
        data = event["data"]
        histogram = from_event(data.get("latency_us") or {})
        if not histogram:
            continue
        window = event["ts_ms"] // width_ms * width_ms
        shape = (data.get("ensemble_size"), data.get("write_quorum"), data.get("ack_quorum"))
        keys = [(window, "all", None, None, None, None), (window, "shape", *shape, None)]
        keys += [(window, "bookie", None, None, None, b) for b in set(data.get("ensemble") or [])]
        for key in keys:
            histograms[key] = merge([histograms[key], histogram])
            byte_sums[key] += data.get("bytes") or 0
    rows = []
    for key, histogram in histograms.items():
        window, group, ensemble_size, write_quorum, ack_quorum, bookie_id = key
        count = sum(histogram.values())
        within_target = within(histogram, options.target_ms * 1000)
        row = {
            "window_start": window,
            "window_s": options.window_s,
            "group": group,
            "ensemble_size": ensemble_size,
            "write_quorum": write_quorum,
            "ack_quorum": ack_quorum,
            "bookie_id": bookie_id,
            "count": count,
        }
        for name, q in QUANTILES.items():
            bucket = percentile(histogram, q)
            row[name] = None if bucket is None else bucket / 1000
        row.update(
            target_ms=float(options.target_ms),
            within_target=within_target,
            attainment=within_target / count if count else None,
            bytes=byte_sums[key],
        )
        rows.append(row)
    return rows
