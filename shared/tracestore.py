"""The local span store: every process's finished spans as JSON lines on disk, so that a
`quire up` cluster keeps its traces without any tracing server (`quire trace show`).

Layout: `<directory>/<instance>.jsonl`, one file per process instance, appended by that
process alone. When a file would pass `max_file_bytes` (16 MiB by default) it becomes
`<instance>.jsonl.1` (replacing the previous older file) and a new one starts: a process
keeps at most twice the bound on disk, and the oldest spans go first.

A span is one line (API.md section 6): `trace_id`, `span_id`, `parent_span_id` (null for
a root), `links` (span ids), `service`, `instance`, `bookie_id`, `name`, `kind`,
`start_ns`, `end_ns`, `status`, `attributes`, `events`. A process that dies mid-write
leaves a torn last line: the reader skips any line that is not a whole JSON object, and
the writer starts a fresh line after one.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

MAX_FILE_BYTES = 16 * 1024 * 1024
SUFFIX = ".jsonl"
OLDER_SUFFIX = ".jsonl.1"


def _file_name(instance: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", instance) or "quire"


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """One finished span as the store (and `quire trace show --output json`) writes it."""
    context = span.get_span_context()
    resource = span.resource.attributes if span.resource is not None else {}
    return {
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "service": resource.get("service.name", ""),
        "instance": resource.get("service.instance.id"),
        "bookie_id": resource.get("quire.bookie_id"),
        "name": span.name,
        "kind": span.kind.name,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "status_message": span.status.description,
        "attributes": dict(span.attributes or {}),
        "events": [
            {"name": event.name, "time_ns": event.timestamp, "attributes": dict(event.attributes)}
            for event in span.events
        ],
    }


class SpanStoreExporter(SpanExporter):
    """Writes finished spans to `<directory>/<instance>.jsonl`, rotating at the bound.
    Called from the batch processor's worker thread, one batch at a time: one write per
    batch, never per span on the request path."""

    def __init__(
        self, directory: Path, instance: str, *, max_file_bytes: int = MAX_FILE_BYTES
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._path = directory / (_file_name(instance) + SUFFIX)
        self._older = directory / (_file_name(instance) + OLDER_SUFFIX)
        self._max_file_bytes = max_file_bytes
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self._size = 0

    def _open(self) -> IO[bytes]:
        file = self._path.open("ab")
        self._size = file.tell()
        if self._size and not _ends_with_newline(self._path):
            file.write(b"\n")  # after a torn line left by a crash
            self._size += 1
        return file

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = b"".join(
            json.dumps(span_record(span), default=str).encode() + b"\n" for span in spans
        )
        with self._lock:
            if self._file is None:
                self._file = self._open()
            if self._size and self._size + len(data) > self._max_file_bytes:
                self._file.close()
                self._path.replace(self._older)
                self._file = self._open()
            self._file.write(data)
            self._file.flush()
            self._size += len(data)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as file:
        file.seek(-1, 2)
        return file.read(1) == b"\n"


# -- reading --------------------------------------------------------------------------------


def store_files(directory: Path) -> list[Path]:
    """The store's files, older ones first."""
    return sorted(directory.glob("*" + OLDER_SUFFIX)) + sorted(directory.glob("*" + SUFFIX))


def _lines(directory: Path) -> Iterator[str]:
    for path in store_files(directory):
        with path.open(encoding="utf-8", errors="replace") as file:
            yield from file


def _parse(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None  # a torn line
    return record if isinstance(record, dict) and "span_id" in record else None


def read_spans(directory: Path) -> Iterator[dict[str, Any]]:
    """Every whole span in the store."""
    for line in _lines(directory):
        record = _parse(line)
        if record is not None:
            yield record


def load_trace(directory: Path, trace_id: str) -> list[dict[str, Any]]:
    """The spans of `trace_id`, and every span of another trace that links to one of them
    or is linked from one (a group commit shared by several appends), with its
    descendants (the commit's fdatasync). A span ours links to that has no links of its
    own (a producer, seen from its consumer's trace) comes alone, without descendants.
    Empty when the store has no such trace.

    Two reads of the store, each parsing only the lines that may matter (a substring test
    first), so that a large store costs reading, not parsing."""
    trace_id = trace_id.lower()
    spans: dict[str, dict[str, Any]] = {}
    with_links: list[dict[str, Any]] = []
    for line in _lines(directory):
        if trace_id in line or '"links": []' not in line:
            record = _parse(line)
            if record is None:
                continue
            if record["trace_id"] == trace_id:
                spans[record["span_id"]] = record
            elif record["links"]:
                with_links.append(record)
    if not spans:
        return []
    ours = set(spans)
    linked_to = {link for record in spans.values() for link in record["links"]} - ours
    linked = {
        record["span_id"]: record
        for record in with_links
        if ours.intersection(record["links"]) or record["span_id"] in linked_to
    }
    wanted_traces = {record["trace_id"] for record in linked.values()}
    missing = linked_to - set(linked)  # linked from ours but without links of its own
    if not wanted_traces and not missing:
        return list(spans.values())
    others: list[dict[str, Any]] = []
    for line in _lines(directory):
        if any(t in line for t in wanted_traces) or any(s in line for s in missing):
            record = _parse(line)
            if record is not None and (
                record["trace_id"] in wanted_traces or record["span_id"] in missing
            ):
                others.append(record)
    linked.update({r["span_id"]: r for r in others if r["span_id"] in missing})
    for record in _descendants(linked, others):
        spans.setdefault(record["span_id"], record)
    return list(spans.values())


def _descendants(
    roots: dict[str, dict[str, Any]], candidates: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`roots` and every span of `candidates` below one of them."""
    children: dict[str, list[dict[str, Any]]] = {}
    for record in candidates:
        if record["parent_span_id"] is not None:
            children.setdefault(record["parent_span_id"], []).append(record)
    found: list[dict[str, Any]] = []
    stack = list(roots.values())
    seen: set[str] = set()
    while stack:
        record = stack.pop()
        if record["span_id"] in seen:
            continue
        seen.add(record["span_id"])
        found.append(record)
        stack.extend(children.get(record["span_id"], []))
    return found


@dataclass(frozen=True)
class TraceSummary:
    trace_id: str
    root_name: str
    root_service: str
    start_ns: int
    duration_ns: int
    spans: int
    error: bool


def recent_traces(directory: Path, limit: int = 20) -> list[TraceSummary]:
    """The `limit` traces that started last, newest first. A trace whose root span is
    not in the store (it began in a caller that keeps no store) is named after its
    earliest span."""
    first: dict[str, dict[str, Any]] = {}
    root: dict[str, dict[str, Any]] = {}
    end_ns: dict[str, int] = {}
    count: dict[str, int] = {}
    error: set[str] = set()
    for record in read_spans(directory):
        trace_id = record["trace_id"]
        count[trace_id] = count.get(trace_id, 0) + 1
        if trace_id not in first or record["start_ns"] < first[trace_id]["start_ns"]:
            first[trace_id] = record
        if record["parent_span_id"] is None:
            root[trace_id] = record
        end_ns[trace_id] = max(end_ns.get(trace_id, 0), record["end_ns"] or 0)
        if record["status"] == "ERROR":
            error.add(trace_id)
    summaries = []
    for trace_id, earliest in first.items():
        named = root.get(trace_id, earliest)
        summaries.append(
            TraceSummary(
                trace_id=trace_id,
                root_name=named["name"],
                root_service=named["service"],
                start_ns=earliest["start_ns"],
                duration_ns=max(0, end_ns[trace_id] - earliest["start_ns"]),
                spans=count[trace_id],
                error=trace_id in error,
            )
        )
    summaries.sort(key=lambda summary: summary.start_ns, reverse=True)
    return summaries[:limit]
