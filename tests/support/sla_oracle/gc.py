"""The `gc_reclaim` table computed the plain way, event by event, from the definitions in
analytics/README.md (independently of the Spark code)."""

from __future__ import annotations

from analytics.sla.options import SlaOptions


def gc_reclaim(events: list[dict], options: SlaOptions) -> list[dict]:
    rows = {}
    for e in sorted(events, key=lambda e: e["ts_ms"]):
        if e["kind"] == "gc.ledger_deleted":
            rows.setdefault((e["ledger_id"], e["bookie_id"]), e["ts_ms"])
    result = []
    for (ledger_id, bookie_id), gc_ms in sorted(rows.items()):
        if not options.in_period(gc_ms):
            continue
        deletes = [
            e["ts_ms"]
            for e in events
            if e["kind"] == "ledger.deleted" and e["ledger_id"] == ledger_id
        ]
        deleted_ms = min(deletes) if deletes else None
        reclaims = [
            (e["ts_ms"], e["data"]["ledgers"][str(ledger_id)])
            for e in events
            if e["kind"] in ("gc.entrylog_deleted", "gc.compacted")
            and e["bookie_id"] == bookie_id
            and str(ledger_id) in e["data"].get("ledgers", {})
        ]
        reclaimed_ms = max(ts for ts, _ in reclaims) if reclaims else None
        result.append(
            {
                "ledger_id": ledger_id,
                "bookie_id": bookie_id,
                "deleted_at": deleted_ms,
                "gc_deleted_at": gc_ms,
                "reclaimed_at": reclaimed_ms,
                "bytes_reclaimed": sum(b for _, b in reclaims),
                "delete_to_gc_s": None if deleted_ms is None else (gc_ms - deleted_ms) / 1000,
                "delete_to_reclaim_s": (
                    None
                    if deleted_ms is None or reclaimed_ms is None
                    else (reclaimed_ms - deleted_ms) / 1000
                ),
            }
        )
    return result
