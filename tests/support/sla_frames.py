"""Events for the SLA table tests: hand-written stories as the dicts that are published, the
same as a DataFrame of the `jetstream` source's schema, and a table's rows compared with an
oracle's (timestamps as epoch milliseconds, floats with a tolerance)."""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime
from typing import Any

from analytics.jetstream import SCHEMA

T0_MS = 1_700_000_000_000


def event(kind: str, ts_ms: int, source: str, data: dict | None = None, **fields: Any) -> dict:
    return {
        "schema_version": 1,
        "event_id": uuid.uuid4().hex,
        "kind": kind,
        "ts_ms": ts_ms,
        "source": source,
        "ledger_id": fields.get("ledger_id"),
        "bookie_id": fields.get("bookie_id"),
        "data": data or {},
    }


def events_frame(spark, events: list[dict]):
    """The events as the `jetstream` source reads them (one stream sequence each)."""

    def at(ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, UTC)

    rows = [
        (
            e["schema_version"],
            e["event_id"],
            e["kind"],
            at(e["ts_ms"]),
            e["ts_ms"],
            e["source"],
            e.get("ledger_id"),
            e.get("bookie_id"),
            json.dumps(e["data"]),
            e.get("seq"),
            e.get("boot_id"),
            stream_seq,
            f"quire.events.{e['kind']}",
            at(e["ts_ms"]),
            True,
            None,
            None,
        )
        for stream_seq, e in enumerate(events, start=1)
    ]
    return spark.createDataFrame(rows, SCHEMA)


def collect(frame) -> list[dict]:
    """A table's rows as dicts, its timestamps as epoch milliseconds."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    columns = [
        F.unix_millis(field.name).alias(field.name)
        if isinstance(field.dataType, TimestampType)
        else F.col(field.name)
        for field in frame.schema.fields
    ]
    return [row.asDict() for row in frame.select(*columns).collect()]


def assert_same_rows(actual: list[dict], expected: list[dict], key: list[str]) -> None:
    """The same rows (in any order), floats within 1e-6 relative, longs named bytes* within 1
    (pro-rata bytes are summed as floats and rounded: the order of the sum may differ)."""

    def order(row: dict) -> tuple:
        return tuple((row[k] is None, row[k]) for k in key)

    actual, expected = sorted(actual, key=order), sorted(expected, key=order)
    assert [order(r) for r in actual] == [order(r) for r in expected]
    for got, want in zip(actual, expected, strict=True):
        assert set(got) == set(want), (got, want)
        for column, value in want.items():
            if isinstance(value, float) and got[column] is not None:
                assert math.isclose(got[column], value, rel_tol=1e-6, abs_tol=1e-6), (
                    column,
                    got,
                    want,
                )
            elif column.startswith("bytes") and value is not None and got[column] is not None:
                assert abs(got[column] - value) <= 1, (column, got, want)
            else:
                assert got[column] == value, (column, got, want)
