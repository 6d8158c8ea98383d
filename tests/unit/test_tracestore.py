"""The local span store: what a span looks like on disk, the bound on its files, a torn
last line, and the assembly of a trace with the group commits linked to it."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.trace import SpanKind, Status, StatusCode

from shared.tracestore import (
    load_trace,
    read_spans,
    recent_traces,
    store_files,
)
from tests.support.tracing import append_traces, store_provider


def test_a_span_round_trips_with_every_field(tmp_path: Path) -> None:
    tracer = store_provider(tmp_path, "bookie-1.journal").get_tracer("test")
    with tracer.start_as_current_span("ledger.add") as parent:
        with tracer.start_as_current_span(
            "send quire.bookie.b1.add", kind=SpanKind.CLIENT, attributes={"quire.ledger_id": 7}
        ) as child:
            child.add_event("ack quorum reached", {"quire.entry_id": 3})
            child.set_status(Status(StatusCode.ERROR, "timed out"))
    assert [path.name for path in store_files(tmp_path)] == ["bookie-1.journal.jsonl"]
    records = {record["name"]: record for record in read_spans(tmp_path)}
    root, client = records["ledger.add"], records["send quire.bookie.b1.add"]
    trace_id = f"{parent.get_span_context().trace_id:032x}"
    assert root["trace_id"] == client["trace_id"] == trace_id
    assert root["parent_span_id"] is None and client["parent_span_id"] == root["span_id"]
    assert client["span_id"] == f"{child.get_span_context().span_id:016x}"
    assert client["service"] == "quire-journal" and client["instance"] == "bookie-1.journal"
    assert client["bookie_id"] == "b1" and client["kind"] == "CLIENT"
    assert client["status"] == "ERROR" and client["status_message"] == "timed out"
    assert client["attributes"] == {"quire.ledger_id": 7}
    assert [event["name"] for event in client["events"]] == ["ack quorum reached"]
    assert client["events"][0]["attributes"] == {"quire.entry_id": 3}
    assert 0 < client["start_ns"] <= client["end_ns"] and client["links"] == []


def test_the_store_keeps_at_most_two_files_of_the_bound(tmp_path: Path) -> None:
    bound = 4096
    tracer = store_provider(tmp_path, "gateway", max_file_bytes=bound).get_tracer("test")
    for entry_id in range(200):
        with tracer.start_as_current_span("ledger.add", attributes={"quire.entry_id": entry_id}):
            pass
    files = store_files(tmp_path)
    assert [path.name for path in files] == ["gateway.jsonl.1", "gateway.jsonl"]
    assert all(path.stat().st_size <= bound for path in files)
    kept = [record["attributes"]["quire.entry_id"] for record in read_spans(tmp_path)]
    assert kept == list(range(200 - len(kept), 200)), "the newest spans, the oldest gone"


def test_a_torn_last_line_is_skipped_and_writing_goes_on_after_it(tmp_path: Path) -> None:
    tracer = store_provider(tmp_path, "metadata").get_tracer("test")
    with tracer.start_as_current_span("before the crash"):
        pass
    with (tmp_path / "metadata.jsonl").open("ab") as file:
        file.write(b'{"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7a')
    assert [record["name"] for record in read_spans(tmp_path)] == ["before the crash"]
    restarted = store_provider(tmp_path, "metadata").get_tracer("test")
    with restarted.start_as_current_span("after the restart"):
        pass
    names = [record["name"] for record in read_spans(tmp_path)]
    assert names == ["before the crash", "after the restart"]


def test_a_shared_group_commit_shows_in_the_trace_of_every_add_it_served(tmp_path: Path) -> None:
    first, second, unrelated = append_traces(tmp_path)
    for trace_id, own in ((first, "first"), (second, "second")):
        names = sorted(record["name"] for record in load_trace(tmp_path, trace_id))
        assert names == sorted(
            [f"ledger.add {own}", f"process add {own}", "journal.commit", "journal.fdatasync"]
        )
    assert [record["name"] for record in load_trace(tmp_path, unrelated)] == [
        "ledger.add unrelated"
    ]
    assert load_trace(tmp_path, "0" * 32) == []


def test_recent_traces_newest_first_with_their_root_and_size(tmp_path: Path) -> None:
    first, second, unrelated = append_traces(tmp_path)
    summaries = recent_traces(tmp_path, limit=10)
    by_id = {summary.trace_id: summary for summary in summaries}
    assert set(by_id) >= {first, second, unrelated}
    assert by_id[first].root_name == "ledger.add first"
    assert by_id[first].spans == 2 and not by_id[first].error
    assert summaries[0].trace_id == unrelated
    assert recent_traces(tmp_path, limit=1) == summaries[:1]
