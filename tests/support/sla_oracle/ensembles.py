"""The oracle of `ensemble_changes` (analytics/sla/ensembles.py)."""

from __future__ import annotations

from collections import defaultdict

from analytics.sla.options import SlaOptions


def ensemble_changes(events: list[dict], options: SlaOptions) -> list[dict]:
    width_ms = options.window_s * 1000
    out: dict[tuple, int] = defaultdict(int)
    came_in: dict[tuple, int] = defaultdict(int)
    ledgers: dict[tuple, set] = defaultdict(set)
    for event in events:
        if event["kind"] != "ledger.ensemble_changed" or not options.in_period(event["ts_ms"]):
            continue
        window = event["ts_ms"] // width_ms * width_ms
        for replacement in event["data"].get("replaced") or []:
            for bookie_id, counter in (
                (replacement.get("old"), out),
                (replacement.get("new"), came_in),
            ):
                if bookie_id is None:
                    continue
                counter[(window, bookie_id)] += 1
                if event.get("ledger_id") is not None:
                    ledgers[(window, bookie_id)].add(event["ledger_id"])
    return [
        {
            "window_start": window,
            "window_s": options.window_s,
            "bookie_id": bookie_id,
            "replaced_out": out[(window, bookie_id)],
            "replaced_in": came_in[(window, bookie_id)],
            "ledgers": len(ledgers[(window, bookie_id)]),
        }
        for window, bookie_id in sorted(set(out) | set(came_in))
    ]
