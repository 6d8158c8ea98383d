"""The `exposure` and `exposure_timeline` tables computed the plain way: every acknowledged
entry, one by one, against every repair of its ledger. Written from the definitions in
analytics/README.md, independently of the Spark code (which never looks at one entry)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from analytics.sla.options import SlaOptions


@dataclass(frozen=True)
class Exposed:
    ledger_id: int
    entry_id: int
    start_ms: int
    stop_ms: int  # when it stopped being exposed, or end_ms if it still is
    still: bool
    bytes: float  # its ack event's bytes / count


def exposure(events: list[dict], options: SlaOptions) -> list[dict]:
    rows = []
    for bookie_id, lost_ms in losses(events, options):
        exposed = exposed_entries(events, options, bookie_id, lost_ms)
        still = sum(1 for x in exposed if x.still)
        repaired_ms = None
        if still == 0:
            repaired_ms = max((x.stop_ms for x in exposed), default=lost_ms)
        worst = _worst_run(exposed)
        rows.append(
            {
                "bookie_id": bookie_id,
                "lost_at": lost_ms,
                "ledgers_exposed": len({x.ledger_id for x in exposed}),
                "entries_exposed": len(exposed),
                "bytes_exposed": _round(sum(x.bytes for x in exposed)),
                "entry_seconds": sum((x.stop_ms - x.start_ms) / 1000 for x in exposed),
                "byte_seconds": sum(x.bytes * (x.stop_ms - x.start_ms) / 1000 for x in exposed),
                "worst_ledger_id": worst[0] if worst else None,
                "worst_first_entry_id": worst[1] if worst else None,
                "worst_last_entry_id": worst[2] if worst else None,
                "worst_exposed_s": worst[3] if worst else None,
                "repaired_at": repaired_ms,
                "time_to_full_rereplication_s": (
                    None if repaired_ms is None else (repaired_ms - lost_ms) / 1000
                ),
                "still_exposed_entries": still,
            }
        )
    return rows


def exposure_timeline(events: list[dict], options: SlaOptions) -> list[dict]:
    rows = []
    for bookie_id, lost_ms in losses(events, options):
        changes: dict[int, list[float]] = defaultdict(lambda: [0, 0.0])
        changes[lost_ms]
        for x in exposed_entries(events, options, bookie_id, lost_ms):
            if x.stop_ms == x.start_ms:
                continue  # never exposed for any time: no step
            changes[x.start_ms][0] += 1
            changes[x.start_ms][1] += x.bytes
            if not x.still:
                changes[x.stop_ms][0] -= 1
                changes[x.stop_ms][1] -= x.bytes
        entries, exposed_bytes = 0, 0.0
        for ts_ms in sorted(changes):
            entries += changes[ts_ms][0]
            exposed_bytes += changes[ts_ms][1]
            rows.append(
                {
                    "bookie_id": bookie_id,
                    "lost_at": lost_ms,
                    "ts": ts_ms,
                    "entries_exposed": entries,
                    "bytes_exposed": _round(exposed_bytes),
                }
            )
    return rows


def losses(events: list[dict], options: SlaOptions) -> list[tuple[str, int]]:
    """(bookie, lost_ms) of the auditor's bookie.lost events in the period that are not a
    repeat of its previous report on that bookie."""
    reports = sorted(
        (
            e
            for e in events
            if e["kind"] in ("bookie.lost", "bookie.readonly", "bookie.available")
            and e.get("bookie_id")
            and e["data"].get("after") is not None
        ),
        key=lambda e: (e["ts_ms"], e["event_id"]),
    )
    last_reported: dict[str, str] = {}
    found = set()
    for e in reports:
        before = last_reported.get(e["bookie_id"])
        last_reported[e["bookie_id"]] = e["data"]["after"]
        if e["data"]["after"] == "lost" and before != "lost" and options.in_period(e["ts_ms"]):
            found.add((e["bookie_id"], e["ts_ms"]))
    return sorted(found)


def exposed_entries(
    events: list[dict], options: SlaOptions, bookie_id: str, lost_ms: int
) -> list[Exposed]:
    deleted_ms: dict[int, int] = {}
    for e in events:
        if e["kind"] == "ledger.deleted":
            ledger_id = e["ledger_id"]
            deleted_ms[ledger_id] = min(e["ts_ms"], deleted_ms.get(ledger_id, e["ts_ms"]))
    repairs: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for e in events:
        if (
            e["kind"] == "autorecovery.fragment_replicated"
            and e["data"]["bookie_src"] == bookie_id
            and e["ts_ms"] >= lost_ms
        ):
            d = e["data"]
            repairs[e["ledger_id"]].append((d["first_entry_id"], d["last_entry_id"], e["ts_ms"]))
    exposed = []
    for e in events:
        if e["kind"] != "entries.acknowledged" or bookie_id not in e["data"].get("ensemble", []):
            continue
        ledger_id, d = e["ledger_id"], e["data"]
        deleted = deleted_ms.get(ledger_id)
        if deleted is not None and deleted < lost_ms:
            continue
        ensemble = d["ensemble"]
        write_quorum = min(d["write_quorum"], len(ensemble))
        entry_bytes = d.get("bytes", 0) / d["count"] if d["count"] > 0 else 0.0
        for entry_id in range(d["first_entry_id"], d["last_entry_id"] + 1):
            write_set = [ensemble[(entry_id + i) % len(ensemble)] for i in range(write_quorum)]
            if bookie_id not in write_set:
                continue
            start_ms = max(e["ts_ms"], lost_ms)
            stops = [ts for first, last, ts in repairs[ledger_id] if first <= entry_id <= last]
            if deleted is not None:
                stops.append(deleted)
            still = not stops or min(stops) > options.end_ms
            stop_ms = max(start_ms, options.end_ms if still else min(stops))
            exposed.append(Exposed(ledger_id, entry_id, start_ms, stop_ms, still, entry_bytes))
    return exposed


def _worst_run(exposed: list[Exposed]) -> tuple[int, int, int, float] | None:
    runs: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for x in exposed:
        runs[(x.ledger_id, x.start_ms, x.stop_ms)].append(x.entry_id)
    best = None
    for (ledger_id, start_ms, stop_ms), entry_ids in runs.items():
        key = ((stop_ms - start_ms) / 1000, len(entry_ids), -ledger_id, -min(entry_ids))
        if best is None or key > best[0]:
            best = (key, (ledger_id, min(entry_ids), max(entry_ids), key[0]))
    return best[1] if best else None


def _round(x: float) -> int:
    return math.floor(x + 0.5)
