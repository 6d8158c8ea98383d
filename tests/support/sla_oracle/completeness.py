"""The oracle of `completeness` (analytics/sla/completeness.py)."""

from __future__ import annotations

from collections import defaultdict

from analytics.sla.options import SlaOptions


def completeness(events: list[dict], options: SlaOptions) -> list[dict]:
    ids: dict[tuple, set] = defaultdict(set)
    seqs: dict[tuple, set] = defaultdict(set)
    dropped: dict[tuple, int] = defaultdict(int)
    for event in events:
        key = (event.get("source"), event.get("boot_id"))
        ids[key].add(event["event_id"])
        if event.get("seq") is not None:
            seqs[key].add(event["seq"])
        if event["kind"] == "events.dropped":
            dropped[key] += event["data"].get("dropped") or 0
    rows = []
    for key, event_ids in ids.items():
        source, boot_id = key
        first = min(seqs[key], default=None)
        last = max(seqs[key], default=None)
        expected = None if first is None else last - first + 1
        rows.append(
            {
                "source": source,
                "boot_id": boot_id,
                "events": len(event_ids),
                "first_seq": first,
                "last_seq": last,
                "missing": None if expected is None else expected - len(seqs[key]),
                "dropped_reported": dropped[key],
                "completeness": None if expected is None else len(event_ids) / expected,
            }
        )
    return rows
