"""`quire trace show|list` over a span store written by the real exporter."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from quire.cli import app
from tests.support.tracing import append_traces

runner = CliRunner()


def _store(tmp_path: Path) -> tuple[str, str, str]:
    return append_traces(tmp_path / "traces")


def test_show_prints_the_tree_with_the_linked_commit_under_its_add(tmp_path: Path) -> None:
    first, _, _ = _store(tmp_path)
    result = runner.invoke(app, ["trace", "show", first, "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"trace {first}: 2 spans, 2 spans of linked traces"
    assert lines[1].startswith("ledger.add first  [gateway]  +0.000 ms  ")
    assert lines[2].startswith("  process add first  [bookie-1.journal]  +")
    assert (
        lines[3].startswith("    linked (trace ")
        and "journal.commit  [bookie-1.journal]" in lines[3]
    )
    assert lines[4].startswith("      journal.fdatasync  [bookie-1.journal]  +")
    assert all(line.endswith("UNSET") for line in lines[1:])
    assert len(lines) == 5


def test_show_json_gives_every_span_with_its_ids_and_links(tmp_path: Path) -> None:
    first, second, _ = _store(tmp_path)
    result = runner.invoke(
        app, ["trace", "show", second, "--data-dir", str(tmp_path), "--output", "json"]
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["trace_id"] == second
    spans = {span["name"]: span for span in shown["spans"]}
    assert set(spans) == {
        "ledger.add second",
        "process add second",
        "journal.commit",
        "journal.fdatasync",
    }
    server, commit = spans["process add second"], spans["journal.commit"]
    assert server["parent_span_id"] == spans["ledger.add second"]["span_id"]
    assert server["links"] == [commit["span_id"]]
    assert server["span_id"] in commit["links"] and len(commit["links"]) == 2
    assert spans["journal.fdatasync"]["parent_span_id"] == commit["span_id"]
    for span in shown["spans"]:
        assert {"trace_id", "span_id", "parent_span_id", "links", "service", "name"} <= set(span)
        assert {"start_ns", "end_ns", "status", "attributes"} <= set(span)
    assert first not in {span["trace_id"] for span in shown["spans"]}


def test_list_gives_the_recent_traces_newest_first(tmp_path: Path) -> None:
    first, second, unrelated = _store(tmp_path)
    result = runner.invoke(
        app, ["trace", "list", "--data-dir", str(tmp_path), "--limit", "3", "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == 3 and rows[0]["trace_id"] == unrelated
    assert rows[0]["root"] == "ledger.add unrelated" and rows[0]["service"] == "quire-gateway"
    assert {first, second} & {row["trace_id"] for row in rows}
    text = runner.invoke(app, ["trace", "list", "--data-dir", str(tmp_path)])
    assert text.exit_code == 0 and text.output.startswith(unrelated)


def test_an_unknown_trace_or_no_store_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["trace", "show", "0" * 32, "--data-dir", str(tmp_path)])
    assert result.exit_code == 1 and "no spans stored in" in result.output
    _store(tmp_path)
    result = runner.invoke(app, ["trace", "show", "f" * 32, "--data-dir", str(tmp_path)])
    assert result.exit_code == 1 and f"trace {'f' * 32} is not in" in result.output
    result = runner.invoke(app, ["trace", "show", "not-a-trace", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1 and "is not a trace id" in result.output
