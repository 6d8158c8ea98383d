"""The synthetic events (analytics/synth.py) tell a consistent story of the real schema: a
small run replayed event by event against what each event claims (the ledgers' segments,
entries, states; the losses, marks and fragments; deletions and GC; the publishers' seq)."""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from analytics.synth import SILENT_GAPS, generate
from shared.events import Event
from shared.latency import latency_bucket, percentile
from tests.unit.test_events_catalogue import catalogued

EVENTS = 20_000


@pytest.fixture(scope="module")
def story(tmp_path_factory) -> list[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("synth")
    written = generate(EVENTS, directory, seed=7, bookies=6, ledgers=20, files=3)
    lines = [
        line
        for path in sorted(directory.glob("events-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert len(lines) == written >= EVENTS
    events = []
    for line in lines:
        event = Event.model_validate_json(line)
        # Exactly what a service publishes: the model's own JSON, fields in its order.
        assert event.model_dump_json() == line
        events.append(event.model_dump())
    return events


def test_the_events_are_of_the_catalogue_and_mostly_acknowledgements(story) -> None:
    kinds = Counter(e["kind"] for e in story)
    assert set(kinds) <= catalogued()
    assert kinds["entries.acknowledged"] > 0.9 * len(story)
    assert len({e["event_id"] for e in story}) == len(story)
    # Every incident is in a small run too.
    for kind in (
        "bookie.lost",
        "bookie.unregistered",
        "bookie.available",
        "bookie.readonly",
        "bookie.writable",
        "ledger.ensemble_changed",
        "autorecovery.fragment_replicated",
        "ledger.fenced",
        "ledger.recovered",
        "ledger.deleted",
        "gc.ledger_deleted",
        "gc.compacted",
        "gc.entrylog_deleted",
        "events.dropped",
    ):
        assert kinds[kind] > 0, kind


def segment_for(segments: list[dict], entry_id: int) -> dict:
    return [s for s in segments if s["first_entry_id"] <= entry_id][-1]


def test_the_ledgers_story_holds_together(story) -> None:
    ledgers: dict[int, dict[str, Any]] = {}
    lost: set[str] = set()
    marked: set[tuple[int, str]] = set()
    gc_dropped: set[tuple[str, int]] = set()
    skipped_entries = 0
    for event in story:
        kind, data, lid = event["kind"], event["data"], event["ledger_id"]
        ledger = ledgers.get(lid) if lid is not None else None
        if kind == "ledger.created":
            assert lid not in ledgers
            ledgers[lid] = {
                "shape": (data["ensemble_size"], data["write_quorum"], data["ack_quorum"]),
                "segments": [{"first_entry_id": 0, "bookies": data["ensemble"]}],
                "next": 0,
                "state": "OPEN",
                "version": 0,
                "deleted": False,
                "held": set(data["ensemble"]),
            }
            assert not set(data["ensemble"]) & lost
        elif kind == "entries.acknowledged":
            assert ledger is not None and ledger["state"] == "OPEN", event
            assert data["first_entry_id"] >= ledger["next"]
            skipped_entries += data["first_entry_id"] > ledger["next"]
            assert data["last_entry_id"] - data["first_entry_id"] + 1 == data["count"]
            ledger["next"] = data["last_entry_id"] + 1
            # One ensemble: the segment of the first entry and of the last.
            segment = segment_for(ledger["segments"], data["first_entry_id"])
            assert segment is segment_for(ledger["segments"], data["last_entry_id"])
            assert data["ensemble"] == segment["bookies"]
            shape = (data["ensemble_size"], data["write_quorum"], data["ack_quorum"])
            assert shape == ledger["shape"]
            histogram = {int(b): c for b, c in data["latency_us"].items()}
            assert sum(histogram.values()) == data["count"]
            assert all(latency_bucket(b) == b for b in histogram)
            assert data["latency_ms_p99"] == percentile(histogram, 0.99) / 1000
            assert data["bytes"] > 0
        elif kind == "ledger.updated":
            assert data["version"] == ledger["version"] + 1
            assert data["previous_state"] == ledger["state"]
            ledger["version"], ledger["state"] = data["version"], data["state"]
            if data["ensemble_changed"]:
                segments = data["segments"]
                assert segments[0]["first_entry_id"] == 0
                ledger["segments"] = segments
                ledger["held"] |= {b for s in segments for b in s["bookies"]}
        elif kind == "ledger.ensemble_changed":
            assert data["version"] == ledger["version"]
            [replaced] = data["replaced"]
            segment = ledger["segments"][-1]
            assert segment["first_entry_id"] == data["first_entry_id"] == ledger["next"]
            assert segment["bookies"][replaced["index"]] == replaced["new"]
        elif kind == "ledger.closed":
            assert data["previous_state"] == ledger["state"] in ("OPEN", "IN_RECOVERY")
            assert data["last_entry_id"] >= ledger["next"] - 1
            ledger["state"], ledger["version"] = "CLOSED", data["version"]
            ledger["next"] = data["last_entry_id"] + 1  # a recovery's entries too
        elif kind == "ledger.deleted":
            assert ledger["state"] == "CLOSED" and not ledger["deleted"]
            ledger["deleted"] = True
        elif kind == "ledger.fenced":
            assert ledger["state"] == "IN_RECOVERY"
            assert event["bookie_id"] in ledger["segments"][-1]["bookies"]
        elif kind == "ledger.recovered":
            assert ledger["state"] == "CLOSED"
            assert data["duration_ms"] == event["ts_ms"] - data["started_ts_ms"]
        elif kind == "bookie.lost":
            assert event["source"] == "auditor" and data["after"] == "lost"
            lost.add(event["bookie_id"])
        elif kind == "bookie.registered":
            # A lost bookie stays lost (a new one joins): the exposure tables count on it.
            assert event["bookie_id"] not in lost
        elif kind == "autorecovery.marked":
            [bookie] = data["bookie_ids"]
            assert bookie in lost and not ledger["deleted"]
            assert any(bookie in s["bookies"] for s in ledger["segments"])
            marked.add((lid, bookie))
        elif kind == "autorecovery.fragment_replicated":
            # Fragments only of the lost bookies' marked ledgers, each a segment on it.
            assert (lid, data["bookie_src"]) in marked
            segment = segment_for(ledger["segments"], data["first_entry_id"])
            assert segment["first_entry_id"] == data["first_entry_id"]
            assert data["last_entry_id"] < ledger["next"]
            assert data["bookie_dest"] in segment["bookies"]  # the update came just before
            assert segment["bookies"][data["ensemble_index"]] == data["bookie_dest"]
        elif kind == "gc.ledger_deleted":
            assert ledger["deleted"] and event["bookie_id"] in ledger["held"]
            gc_dropped.add((event["bookie_id"], lid))
        elif kind in ("gc.entrylog_deleted", "gc.compacted"):
            listed = data["ledgers"]
            if data.get("reason") == "compacted":
                assert listed == {}
            for ledger_id, size in listed.items():
                assert (event["bookie_id"], int(ledger_id)) in gc_dropped and size > 0
            sizes = list(listed.values())
            assert sizes == sorted(sizes, reverse=True)
    dropped = sum(e["data"]["dropped"] for e in story if e["kind"] == "events.dropped")
    assert 0 < skipped_entries <= dropped + SILENT_GAPS


def test_seq_is_dense_per_publisher_but_for_the_drops_it_reports_and_the_silent_gaps(
    story,
) -> None:
    seqs: dict[tuple[str, str], list[int]] = defaultdict(list)
    reported: dict[tuple[str, str], set[int]] = defaultdict(set)
    for event in story:
        if event["source"] == "metadata":
            assert event["seq"] is None and event["boot_id"] is None
            continue
        key = (event["source"], event["boot_id"])
        seqs[key].append(event["seq"])
        if event["kind"] == "events.dropped":
            data = event["data"]
            reported[key].update(range(data["first_seq"], data["last_seq"] + 1))
    silent = 0
    for key, seen in seqs.items():
        assert seen == sorted(seen) and len(set(seen)) == len(seen), key
        missing = set(range(1, seen[-1] + 1)) - set(seen)
        assert reported[key] <= missing
        silent += len(missing - reported[key])
    assert silent == SILENT_GAPS
    # A bookie that restarted is a new process: a second boot id for its journal.
    sources = Counter(source for source, _ in seqs)
    assert any(n > 1 for source, n in sources.items() if source.endswith(".journal"))


def digest(directory: Path) -> str:
    hashed = hashlib.sha256()
    for path in sorted(directory.glob("*.jsonl")):
        hashed.update(path.read_bytes())
    return hashed.hexdigest()


def test_a_seed_tells_the_same_story(tmp_path: Path) -> None:
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        generate(2_000, tmp_path / name, seed=seed, ledgers=10, files=2)
    assert digest(tmp_path / "a") == digest(tmp_path / "b") != digest(tmp_path / "c")
