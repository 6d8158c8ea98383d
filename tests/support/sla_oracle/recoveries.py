"""The oracle of `recoveries` (analytics/sla/recoveries.py)."""

from __future__ import annotations

from collections import defaultdict

from analytics.sla.options import SlaOptions


def _first(events: list[dict]) -> dict | None:
    return min(events, key=lambda e: (e["ts_ms"], e["event_id"]), default=None)


def recoveries(events: list[dict], options: SlaOptions) -> list[dict]:
    fences: dict[int, list[dict]] = defaultdict(list)
    recovered: dict[int, list[dict]] = defaultdict(list)
    closed: dict[int, list[dict]] = defaultdict(list)
    for event in events:
        ledger_id = event.get("ledger_id")
        if ledger_id is None:
            continue
        if event["kind"] == "ledger.fenced":
            fences[ledger_id].append(event)
        elif event["kind"] == "ledger.recovered":
            recovered[ledger_id].append(event)
        elif event["kind"] == "ledger.closed":
            if str(event["data"].get("previous_state")).lower() == "in_recovery":
                closed[ledger_id].append(event)
    rows = []
    for ledger_id, fenced in fences.items():
        fenced_ms = min(e["ts_ms"] for e in fenced)
        if not options.in_period(fenced_ms):
            continue
        recovery = _first(recovered[ledger_id])
        recovery_data = recovery["data"] if recovery else {}
        close = _first(closed[ledger_id])
        closed_ms = close["ts_ms"] if close else None
        last_entry_id = close["data"].get("last_entry_id") if close else None
        if last_entry_id is None:
            last_entry_id = recovery_data.get("last_entry_id")
        rows.append(
            {
                "ledger_id": ledger_id,
                "fenced_at": fenced_ms,
                "bookies_fenced": len({e["bookie_id"] for e in fenced if e.get("bookie_id")}),
                "recovery_started_at": recovery_data.get("started_ts_ms"),
                "closed_at": closed_ms,
                "fence_to_close_s": None if close is None else (closed_ms - fenced_ms) / 1000,
                "recovered_entries": recovery_data.get("recovered_entries"),
                "last_entry_id": last_entry_id,
            }
        )
    return rows
