"""The oracle of `bookie_availability` (analytics/sla/availability.py)."""

from __future__ import annotations

from collections import defaultdict

from analytics.sla.options import SlaOptions

STATES = {"writable": "up", "readonly": "read_only", "lost": "lost"}
AUDITOR_KINDS = ("bookie.lost", "bookie.readonly", "bookie.available")


def _state(event: dict) -> str | None:
    if event["kind"] == "bookie.registered":
        return STATES.get(event["data"].get("state"))
    if event["kind"] == "bookie.unregistered":
        return "unregistered"
    if event["kind"] in AUDITOR_KINDS:
        return STATES.get(event["data"].get("after"))
    return None


def bookie_availability(events: list[dict], options: SlaOptions) -> list[dict]:
    timelines: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    for event in events:
        state = _state(event)
        if state is not None and event.get("bookie_id") is not None:
            timelines[event["bookie_id"]].append((event["ts_ms"], event["event_id"], state))
    rows = []
    for bookie_id, timeline in timelines.items():
        starts: list[tuple[int, str]] = []
        for ts_ms, _, state in sorted(timeline):
            if not starts or starts[-1][1] != state:
                starts.append((ts_ms, state))
        for i, (start_ms, state) in enumerate(starts):
            is_open = i == len(starts) - 1
            end_ms = options.end_ms if is_open else starts[i + 1][0]
            if options.since_ms is not None:
                if end_ms <= options.since_ms and start_ms < options.since_ms:
                    continue
                start_ms = max(start_ms, options.since_ms)
            rows.append(
                {
                    "bookie_id": bookie_id,
                    "state": state,
                    "start": start_ms,
                    "end": end_ms,
                    "open": is_open,
                    "duration_s": (end_ms - start_ms) / 1000,
                }
            )
    return rows
