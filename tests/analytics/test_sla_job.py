"""The SLA job's input and its whole run: JSON-lines files read into the same rows as the
stream's, and `python -m analytics.sla` (main, in this process, on the session's Spark) writing
every table."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from analytics.jetstream import SCHEMA, to_row
from analytics.sla.job import stage
from analytics.sla.sources import FileSource, load_events, read_files
from tests.support.sla import T0_MS, event

pytestmark = pytest.mark.slow

# Every field but the message's place (stream_seq, subject, published) and `ts` (a naive
# datetime once collected; checked against ts_ms).
EVENT_FIELDS = [
    "schema_version", "event_id", "kind", "ts_ms", "source", "ledger_id", "bookie_id",
    "data", "seq", "boot_id", "schema_known", "error", "raw",
]  # fmt: skip


def test_files_give_the_stream_rows_and_duplicates_count_once(spark, tmp_path):
    created = event("ledger.created", T0_MS, "metadata", boot_id=None, ledger_id=1, ensemble_size=3)
    fenced = event("ledger.fenced", T0_MS + 5, "bookie-1.journal", ledger_id=1, bookie_id="b1")
    unknown = event("someday.new", T0_MS + 6, ledger_id=1, what="kept")
    newer = {**event("ledger.created", T0_MS + 7), "schema_version": 2}
    created_, fenced_, unknown_, newer_ = (json.dumps(e) for e in (created, fenced, unknown, newer))
    (tmp_path / "a.jsonl").write_text("\n".join([created_, "", fenced_, "   ", unknown_]) + "\n")
    # The second file repeats an event and ends without a newline.
    (tmp_path / "b.jsonl").write_text("\n".join([newer_, "not json", fenced_, "[1, 2]"]))

    rows = read_files(spark, str(tmp_path)).collect()
    payloads = [created_, fenced_, unknown_, newer_, "not json", fenced_, "[1, 2]"]
    assert len(rows) == len(payloads)  # blank lines skipped
    # Field for field what the stream's reader makes of the same payloads.
    stream_rows = [to_row(1, "s", datetime.now(UTC), p.encode()) for p in payloads]
    index = {name: i for i, name in enumerate(SCHEMA.names)}
    assert sorted((tuple(r[name] for name in EVENT_FIELDS) for r in rows), key=repr) == sorted(
        (tuple(r[index[name]] for name in EVENT_FIELDS) for r in stream_rows), key=repr
    )
    assert all(r.ts is None or round(r.ts.timestamp() * 1000) == r.ts_ms for r in rows)
    assert len({r.stream_seq for r in rows}) == len(rows)
    assert {r.subject.rsplit("/", 1)[-1] for r in rows} == {"a.jsonl", "b.jsonl"}

    loaded = load_events(spark, FileSource(str(tmp_path))).collect()
    # The repeated event counts once; the two error rows (no event_id) both stay.
    assert sorted(r.event_id or "" for r in loaded) == sorted(
        ["", "", created["event_id"], fenced["event_id"], unknown["event_id"], newer["event_id"]]
    )


def test_stage_writes_the_table_input_once_and_deduplicates_only_when_ids_repeat(spark, tmp_path):
    first = event("ledger.created", T0_MS, ledger_id=1)
    late = event("ledger.created", T0_MS + 10, ledger_id=2)
    payloads = [json.dumps(e).encode() for e in (first, late)] + [b"not json"]
    published = datetime.now(UTC)

    def staged(payloads: list[bytes], directory: str):
        rows = spark.createDataFrame(
            [to_row(i, "s", published, p) for i, p in enumerate(payloads)], SCHEMA
        )
        return stage(spark, rows, T0_MS + 10, str(tmp_path / directory))

    once = staged(payloads, "once")
    # No event_id repeats: the rows as written, without a second copy.
    assert [r.event_id for r in once.collect()] == [first["event_id"]]  # `late` is past until
    assert not (tmp_path / "once" / "deduplicated").exists()
    twice = staged(payloads + payloads[:1], "twice")
    assert [r.event_id for r in twice.collect()] == [first["event_id"]]
    assert (tmp_path / "twice" / "deduplicated").exists()
