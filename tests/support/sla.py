"""Helpers of the SLA table tests: events written as dicts (the published JSON), the same
events as Spark's table input, and a comparison of Spark's rows with the oracles' rows."""

from __future__ import annotations

import itertools
import json
import math
import uuid
from datetime import UTC, datetime
from typing import Any

from analytics.jetstream import SCHEMA, to_row
from analytics.sla.job import table_input
from analytics.sla.sources import deduplicate

T0_MS = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000  # an hour's start
_seqs: dict[tuple[str, str | None], itertools.count] = {}


def event(
    kind: str,
    ts_ms: int,
    source: str = "gateway",
    *,
    ledger_id: int | None = None,
    bookie_id: str | None = None,
    boot_id: str | None = "boot-1",
    seq: int | None = None,
    event_id: str | None = None,
    **data: Any,
) -> dict:
    """One event as published. Events of a source with a boot_id get the next seq of that
    (source, boot_id) unless `seq` is given; boot_id=None makes an outbox event (no seq)."""
    if boot_id is not None and seq is None:
        seq = next(_seqs.setdefault((source, boot_id), itertools.count(1)))
    return {
        "schema_version": 1,
        "event_id": event_id or uuid.uuid4().hex,
        "kind": kind,
        "ts_ms": ts_ms,
        "source": source,
        "ledger_id": ledger_id,
        "bookie_id": bookie_id,
        "data": data,
        "seq": seq,
        "boot_id": boot_id,
    }


def spark_input(spark, events: list[dict | bytes], until_ms: int | None = None):
    """`events` (dicts, or raw payloads) read the way the job reads them: the jetstream rows,
    deduplicated, cut to the table input."""
    published = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        to_row(i + 1, "test", published, e if isinstance(e, bytes) else json.dumps(e).encode())
        for i, e in enumerate(events)
    ]
    return table_input(deduplicate(spark.createDataFrame(rows, SCHEMA)), until_ms)


def oracle_input(events: list[dict], until_ms: int | None = None) -> list[dict]:
    """The oracles' input: the events deduplicated on event_id (the first kept), before
    `until_ms`."""
    seen: set[str] = set()
    kept = []
    for e in events:
        if e["event_id"] in seen or (until_ms is not None and e["ts_ms"] >= until_ms):
            continue
        seen.add(e["event_id"])
        kept.append(e)
    return kept


def rows(df) -> list[dict]:
    """A DataFrame's rows as dicts, timestamps as milliseconds since the epoch."""
    out = []
    for row in df.collect():
        record = row.asDict()
        for name, value in record.items():
            if isinstance(value, datetime):
                # Spark gives naive datetimes in this process's time zone: timestamp() inverts it.
                record[name] = round(value.timestamp() * 1000)
        out.append(record)
    return out


def _sort_key(row: dict) -> tuple:
    return tuple(
        (0,) if v is None else (1, round(v, 6) if isinstance(v, float) else v)
        for _, v in sorted(row.items())
    )


def assert_same_rows(actual: list[dict], expected: list[dict], rel: float = 1e-9) -> None:
    """The same rows in any order; floats equal within `rel`."""
    assert len(actual) == len(expected), f"{len(actual)} rows, expected {len(expected)}:\n" + (
        "\n".join(map(str, sorted(actual, key=_sort_key)))
    )
    for got, want in zip(
        sorted(actual, key=_sort_key), sorted(expected, key=_sort_key), strict=True
    ):
        assert set(got) == set(want), f"columns {sorted(got)} != {sorted(want)}"
        for name, value in want.items():
            if isinstance(value, float) and got[name] is not None:
                assert math.isclose(got[name], value, rel_tol=rel, abs_tol=1e-9), (name, got, want)
            else:
                assert got[name] == value, (name, got, want)
