"""`quire trace show|list`: the traces a local `quire up` cluster kept in its span store
(DIR/traces, shared/tracestore.py), without any tracing server.

`show` prints one trace as a tree (service, name, start offset from the trace's first span,
duration, status), with the spans of other traces that link to it or that it links to (a
journal's group commit, shared by every add it served) under a "linked" marker, where they
link, followed by their own children (the commit's fdatasync)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from quire.commands.common import DEFAULT_DATA_DIR, DataDirOption, fail
from shared.tracestore import load_trace, recent_traces, store_files

app = typer.Typer(help="Traces kept by a local `quire up` cluster.", no_args_is_help=True)

TRACE_ID = re.compile(r"^[0-9a-f]{32}$")


class TraceOutput(StrEnum):
    TEXT = "text"
    JSON = "json"


TraceOutputOption = Annotated[
    TraceOutput, typer.Option("--output", "-o", help="text for people, json for scripts.")
]


def _store(data_dir: Path) -> Path:
    directory = data_dir / "traces"
    if not store_files(directory):
        fail(f"no spans stored in {directory}: is this the data dir of a `quire up` cluster?")
    return directory


@app.command("show")
def show(
    trace_id: Annotated[str, typer.Argument(help="32 hex digits, as in `traceresponse`.")],
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: TraceOutputOption = TraceOutput.TEXT,
) -> None:
    """One trace's spans, and the spans of other traces linked to them."""
    trace_id = trace_id.strip().lower()
    if not TRACE_ID.match(trace_id):
        fail(f"{trace_id!r} is not a trace id (32 hex digits)")
    directory = _store(data_dir)
    spans = sorted(load_trace(directory, trace_id), key=lambda span: span["start_ns"])
    if not spans:
        fail(f"trace {trace_id} is not in {directory} (not sampled, or not exported yet)")
    if output is TraceOutput.JSON:
        typer.echo(json.dumps({"trace_id": trace_id, "spans": spans}, default=str))
        return
    for line in render_tree(trace_id, spans):
        typer.echo(line)


@app.command("list")
def list_traces(
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    limit: Annotated[int, typer.Option(min=1, help="How many traces, newest first.")] = 20,
    output: TraceOutputOption = TraceOutput.TEXT,
) -> None:
    """The traces that started last, newest first."""
    summaries = recent_traces(_store(data_dir), limit)
    rows = [
        {
            "trace_id": summary.trace_id,
            "root": summary.root_name,
            "service": summary.root_service,
            "start": datetime.fromtimestamp(summary.start_ns / 1e9, UTC).isoformat(),
            "duration_ms": round(summary.duration_ns / 1e6, 3),
            "spans": summary.spans,
            "error": summary.error,
        }
        for summary in summaries
    ]
    if output is TraceOutput.JSON:
        typer.echo(json.dumps(rows))
        return
    # Plain lines, not a table: a trace id must never be cut, it is what one copies.
    for row in rows:
        typer.echo(
            f"{row['trace_id']}  {row['start']}  {row['duration_ms']:>10.3f} ms"
            f"  {row['spans']:>4} spans  {'ERROR' if row['error'] else 'ok   '}"
            f"  {row['root']} [{row['service']}]"
        )


def _label(span: dict[str, Any], base_ns: int) -> str:
    who = span.get("instance") or span["service"]
    offset_ms = (span["start_ns"] - base_ns) / 1e6
    duration_ms = ((span["end_ns"] or span["start_ns"]) - span["start_ns"]) / 1e6
    status = span["status"]
    if span.get("status_message"):
        status += f": {span['status_message']}"
    return f"{span['name']}  [{who}]  +{offset_ms:.3f} ms  {duration_ms:.3f} ms  {status}"


def render_tree(trace_id: str, spans: list[dict[str, Any]]) -> list[str]:
    """The lines of `quire trace show`: each span under its parent, in start order; a
    span of another trace under every span of ours it links to or from, marked "linked",
    its subtree printed the first time only."""
    ours = [span for span in spans if span["trace_id"] == trace_id]
    others = [span for span in spans if span["trace_id"] != trace_id]
    our_ids = {span["span_id"] for span in ours}
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        children[span["parent_span_id"]].append(span)
    linked: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for other in others:
        for span in ours:
            if span["span_id"] in other["links"] or other["span_id"] in span["links"]:
                linked[span["span_id"]].append(other)
    base_ns = min(span["start_ns"] for span in ours)
    lines = [f"trace {trace_id}: {len(ours)} spans, {len(others)} spans of linked traces"]
    shown: set[str] = set()

    def walk(span: dict[str, Any], depth: int, marker: str = "") -> None:
        indent = "  " * depth
        if span["span_id"] in shown:
            lines.append(f"{indent}{marker}{span['name']} (above)")
            return
        shown.add(span["span_id"])
        lines.append(f"{indent}{marker}{_label(span, base_ns)}")
        for child in sorted(children[span["span_id"]], key=lambda s: s["start_ns"]):
            walk(child, depth + 1)
        for other in sorted(linked[span["span_id"]], key=lambda s: s["start_ns"]):
            walk(other, depth + 1, marker=f"linked (trace {other['trace_id']}): ")

    roots = [span for span in ours if span["parent_span_id"] not in our_ids]
    for root in sorted(roots, key=lambda s: s["start_ns"]):
        walk(root, 0)
    return lines
