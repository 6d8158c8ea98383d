"""The `jetstream` source's pure parts: messages to rows and sequence ranges to partitions
(Spark and JetStream themselves in tests/analytics/test_jetstream_source.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from analytics.jetstream import SCHEMA, Options, SequenceRange, split, to_row

PUBLISHED = datetime(2026, 1, 1, tzinfo=UTC)


def row(payload: bytes) -> dict:
    return dict(zip(SCHEMA.names, to_row(5, "quire.events.x", PUBLISHED, payload), strict=True))


def test_an_event_becomes_a_row_of_the_schema():
    event = {
        "schema_version": 1,
        "event_id": "e",
        "kind": "ledger.created",
        "ts_ms": 1500,
        "source": "s",
        "ledger_id": 3,
        "bookie_id": None,
        "data": {"a": [1]},
    }
    got = row(json.dumps(event).encode())
    assert got["ts"] == datetime(1970, 1, 1, 0, 0, 1, 500_000, tzinfo=UTC)
    assert json.loads(got["data"]) == {"a": [1]}
    assert (got["stream_seq"], got["subject"], got["published"]) == (5, "quire.events.x", PUBLISHED)
    assert got["schema_known"] and got["error"] is None and got["raw"] is None
    assert got["seq"] is None and got["boot_id"] is None


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff",
        b"[1]",
        b'{"kind": "x"}',
        b'{"schema_version": true}',
        b'{"schema_version": 1, "ledger_id": "seven"}',
        b'{"schema_version": 1, "ts_ms": 100000000000000000000}',
    ],
)
def test_what_is_not_an_event_is_kept_with_an_error(payload):
    got = row(payload)
    assert got["error"].startswith("malformed") and got["raw"] is not None
    assert got["stream_seq"] == 5 and not got["schema_known"] and got["kind"] is None


def test_an_unknown_schema_version_is_kept_and_flagged():
    got = row(b'{"schema_version": 9, "kind": "a.b", "new": 1}')
    assert (got["schema_version"], got["kind"], got["schema_known"]) == (9, "a.b", False)
    assert got["error"] is None


def test_split_covers_the_range_once():
    assert split(1, 11, 4, None) == [SequenceRange(1, 5), SequenceRange(5, 9), SequenceRange(9, 11)]
    assert split(1, 11, None, 3) == [SequenceRange(1, 4), SequenceRange(4, 7), SequenceRange(7, 11)]
    assert split(1, 3, None, 5) == [SequenceRange(1, 2), SequenceRange(2, 3)]
    assert split(7, 7, None, None) == []


def test_options():
    options = Options.parse({"url": "nats://h:1", "failondataloss": "False"})
    assert options.stream == "QUIRE_EVENTS" and not options.fail_on_data_loss
    with pytest.raises(ValueError, match="not both"):
        Options.parse({"url": "u", "partitionsize": "1", "numpartitions": "2"})
    with pytest.raises(ValueError, match="url"):
        Options.parse({})
