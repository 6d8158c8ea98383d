"""The SLA report (analytics/sla/report.py) over Parquet tables of the contract's columns and
types written here with pyarrow, as Spark writes them (a directory of part files): no Spark.
The HTML is read back with html.parser, section by section, table by table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from analytics.sla import report

TS = pa.timestamp("us", tz="UTC")
T0 = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)
SCHEMAS = {
    "ack_latency": [
        ("window_start", TS),
        ("window_s", pa.int32()),
        ("group", pa.string()),
        ("ensemble_size", pa.int32()),
        ("write_quorum", pa.int32()),
        ("ack_quorum", pa.int32()),
        ("bookie_id", pa.string()),
        ("count", pa.int64()),
        ("p50_ms", pa.float64()),
        ("p99_ms", pa.float64()),
        ("p999_ms", pa.float64()),
        ("target_ms", pa.float64()),
        ("within_target", pa.int64()),
        ("attainment", pa.float64()),
        ("bytes", pa.int64()),
    ],
    "recoveries": [
        ("ledger_id", pa.int64()),
        ("fenced_at", TS),
        ("bookies_fenced", pa.int32()),
        ("recovery_started_at", TS),
        ("closed_at", TS),
        ("fence_to_close_s", pa.float64()),
        ("recovered_entries", pa.int64()),
        ("last_entry_id", pa.int64()),
    ],
    "ensemble_changes": [
        ("window_start", TS),
        ("window_s", pa.int32()),
        ("bookie_id", pa.string()),
        ("replaced_out", pa.int64()),
        ("replaced_in", pa.int64()),
        ("ledgers", pa.int64()),
    ],
    "bookie_availability": [
        ("bookie_id", pa.string()),
        ("state", pa.string()),
        ("start", TS),
        ("end", TS),
        ("open", pa.bool_()),
        ("duration_s", pa.float64()),
    ],
    "completeness": [
        ("source", pa.string()),
        ("boot_id", pa.string()),
        ("events", pa.int64()),
        ("first_seq", pa.int64()),
        ("last_seq", pa.int64()),
        ("missing", pa.int64()),
        ("dropped_reported", pa.int64()),
        ("completeness", pa.float64()),
    ],
    "exposure": [
        ("bookie_id", pa.string()),
        ("lost_at", TS),
        ("ledgers_exposed", pa.int64()),
        ("entries_exposed", pa.int64()),
        ("bytes_exposed", pa.int64()),
        ("entry_seconds", pa.float64()),
        ("byte_seconds", pa.float64()),
        ("worst_ledger_id", pa.int64()),
        ("worst_first_entry_id", pa.int64()),
        ("worst_last_entry_id", pa.int64()),
        ("worst_exposed_s", pa.float64()),
        ("repaired_at", TS),
        ("time_to_full_rereplication_s", pa.float64()),
        ("still_exposed_entries", pa.int64()),
    ],
    "exposure_timeline": [
        ("bookie_id", pa.string()),
        ("lost_at", TS),
        ("ts", TS),
        ("entries_exposed", pa.int64()),
        ("bytes_exposed", pa.int64()),
    ],
    "gc_reclaim": [
        ("ledger_id", pa.int64()),
        ("bookie_id", pa.string()),
        ("deleted_at", TS),
        ("gc_deleted_at", TS),
        ("reclaimed_at", TS),
        ("bytes_reclaimed", pa.int64()),
        ("delete_to_gc_s", pa.float64()),
        ("delete_to_reclaim_s", pa.float64()),
    ],
}


def write(out: Path, name: str, rows: list[dict], int96: bool = False) -> None:
    """One table as Spark leaves it: OUT/<name>/part-*.parquet and a _SUCCESS marker."""
    schema = pa.schema(SCHEMAS[name])
    table = pa.Table.from_pylist(rows, schema=schema)
    (out / name).mkdir(parents=True)
    pq.write_table(
        table,
        out / name / "part-00000-x.snappy.parquet",
        use_deprecated_int96_timestamps=int96,
    )
    (out / name / "_SUCCESS").write_text("")


def latency_row(hour: int, group: str, count: int, within: int, p99: float, **extra) -> dict:
    return {
        "window_start": T0 + timedelta(hours=hour),
        "window_s": 3600,
        "group": group,
        "ensemble_size": None,
        "write_quorum": None,
        "ack_quorum": None,
        "bookie_id": None,
        "count": count,
        "p50_ms": 1.5,
        "p99_ms": p99,
        "p999_ms": p99 * 2,
        "target_ms": 10.0,
        "within_target": within,
        "attainment": within / count,
        "bytes": count * 100,
        **extra,
    }


def shape(e: int, qw: int, qa: int) -> dict:
    return {"ensemble_size": e, "write_quorum": qw, "ack_quorum": qa}


def story_tables(out: Path) -> None:
    """One period of two hours: two quorum shapes, bookie-2 lost and repaired, bookie-3 lost
    and still exposed, a recovery, GC, an incomplete publisher."""
    write(
        out,
        "ack_latency",
        [
            latency_row(0, "all", 1000, 990, 8.0),
            latency_row(1, "all", 3000, 2990, 12.5),
            latency_row(0, "shape", 1000, 990, 8.0, **shape(3, 3, 2)),
            latency_row(1, "shape", 2000, 1995, 12.5, **shape(3, 3, 2)),
            latency_row(1, "shape", 1000, 995, 9.0, **shape(5, 3, 2)),
            latency_row(0, "bookie", 1000, 990, 8.0, bookie_id="bookie-1"),
            latency_row(1, "bookie", 3000, 2990, 12.5, bookie_id="bookie-1"),
            latency_row(1, "bookie", 500, 400, 20.0, bookie_id="<b>bookie-9</b>"),
        ],
    )
    write(
        out,
        "completeness",
        [
            {
                "source": "metadata",
                "boot_id": None,
                "events": 40,
                "first_seq": None,
                "last_seq": None,
                "missing": None,
                "dropped_reported": 0,
                "completeness": None,
            },
            {
                "source": "gateway",
                "boot_id": "b1",
                "events": 95,
                "first_seq": 1,
                "last_seq": 100,
                "missing": 5,
                "dropped_reported": 5,
                "completeness": 0.95,
            },
        ],
    )
    lost_2, lost_3 = T0 + timedelta(minutes=30), T0 + timedelta(minutes=90)
    write(
        out,
        "exposure",
        [
            {
                "bookie_id": "bookie-2",
                "lost_at": lost_2,
                "ledgers_exposed": 3,
                "entries_exposed": 1234,
                "bytes_exposed": 123400,
                "entry_seconds": 5000.0,
                "byte_seconds": 500000.0,
                "worst_ledger_id": 7,
                "worst_first_entry_id": 10,
                "worst_last_entry_id": 99,
                "worst_exposed_s": 42.5,
                "repaired_at": lost_2 + timedelta(seconds=42.5),
                "time_to_full_rereplication_s": 42.5,
                "still_exposed_entries": 0,
            },
            {
                "bookie_id": "bookie-3",
                "lost_at": lost_3,
                "ledgers_exposed": 1,
                "entries_exposed": 10,
                "bytes_exposed": 1000,
                "entry_seconds": 300.0,
                "byte_seconds": 30000.0,
                "worst_ledger_id": 8,
                "worst_first_entry_id": 0,
                "worst_last_entry_id": 9,
                "worst_exposed_s": 30.0,
                "repaired_at": None,
                "time_to_full_rereplication_s": None,
                "still_exposed_entries": 10,
            },
        ],
    )
    write(
        out,
        "exposure_timeline",
        [
            {"bookie_id": "bookie-2", "lost_at": lost_2, "ts": lost_2, **counts(1234)},
            {
                "bookie_id": "bookie-2",
                "lost_at": lost_2,
                "ts": lost_2 + timedelta(seconds=20),
                **counts(600),
            },  # fmt: skip
            {
                "bookie_id": "bookie-2",
                "lost_at": lost_2,
                "ts": lost_2 + timedelta(seconds=42.5),
                **counts(0),
            },  # fmt: skip
            {"bookie_id": "bookie-3", "lost_at": lost_3, "ts": lost_3, **counts(10)},
        ],
        int96=True,  # Spark's default timestamp encoding, read back without a time zone
    )
    write(
        out,
        "recoveries",
        [
            {
                "ledger_id": 11,
                "fenced_at": T0 + timedelta(minutes=5),
                "bookies_fenced": 3,
                "recovery_started_at": T0 + timedelta(minutes=5),
                "closed_at": T0 + timedelta(minutes=5, seconds=2),
                "fence_to_close_s": 2.0,
                "recovered_entries": 4,
                "last_entry_id": 57,
            }
        ],
    )
    write(
        out,
        "bookie_availability",
        [
            avail("bookie-2", "up", T0, lost_2, False),
            avail("bookie-2", "lost", lost_2, T0 + timedelta(hours=2), True),
            avail("bookie-1", "up", T0, T0 + timedelta(hours=2), True),
        ],
    )
    write(
        out,
        "ensemble_changes",
        [
            {
                "window_start": T0,
                "window_s": 3600,
                "bookie_id": "bookie-2",
                "replaced_out": 3,
                "replaced_in": 0,
                "ledgers": 3,
            }
        ],
    )
    write(
        out,
        "gc_reclaim",
        [
            {
                "ledger_id": 21,
                "bookie_id": "bookie-1",
                "deleted_at": T0 + timedelta(minutes=100),
                "gc_deleted_at": T0 + timedelta(minutes=101),
                "reclaimed_at": T0 + timedelta(minutes=103),
                "bytes_reclaimed": 2048,
                "delete_to_gc_s": 60.0,
                "delete_to_reclaim_s": 180.0,
            },
            {
                "ledger_id": 22,
                "bookie_id": "bookie-1",
                "deleted_at": None,
                "gc_deleted_at": T0 + timedelta(minutes=101),
                "reclaimed_at": None,
                "bytes_reclaimed": 0,
                "delete_to_gc_s": None,
                "delete_to_reclaim_s": None,
            },
        ],
    )


def counts(entries: int) -> dict:
    return {"entries_exposed": entries, "bytes_exposed": entries * 100}


def avail(bookie: str, state: str, start: datetime, end: datetime, open_: bool) -> dict:
    return {
        "bookie_id": bookie,
        "state": state,
        "start": start,
        "end": end,
        "open": open_,
        "duration_s": (end - start).total_seconds(),
    }


class Page(HTMLParser):
    """The report as sections (by h2): their text, tables (rows of cell texts) and images."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, dict] = {}
        self.current: dict | None = None
        self.heading: list[str] | None = None
        self.cell: list[str] | None = None
        self.links: list[str] = []
        self.images: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attrs = dict(attrs)
        for key in ("src", "href"):
            if key in attrs:
                self.links.append(attrs[key])
        if tag == "h2":
            self.heading = []
        elif tag == "table" and self.current is not None:
            self.current["tables"].append([])
        elif tag == "tr" and self.current is not None:
            self.current["tables"][-1].append([])
        elif tag in ("td", "th"):
            self.cell = []
        elif tag == "img" and self.current is not None:
            self.current["images"].append(attrs["src"])
            self.images.append(attrs["src"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2" and self.heading is not None:
            title = "".join(self.heading)
            self.current = self.sections[title] = {"text": "", "tables": [], "images": []}
            self.heading = None
        elif tag in ("td", "th") and self.cell is not None and self.current is not None:
            self.current["tables"][-1][-1].append("".join(self.cell))
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.heading is not None:
            self.heading.append(data)
            return
        if self.cell is not None:
            self.cell.append(data)
        if self.current is not None:
            self.current["text"] += data


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def rows_by_first_cell(table: list[list[str]]) -> dict[str, list[str]]:
    header, *rows = table
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows}


def test_the_report_shows_the_headline_figures_and_every_incident(tmp_path: Path) -> None:
    story_tables(tmp_path)
    path = report.write_report(tmp_path)
    assert path == tmp_path / "report.html"
    page = parse(path)

    slo = page.sections["Add latency SLO"]
    headline = rows_by_first_cell(slo["tables"][0])
    # Over the whole period: (990 + 2990) / 4000 within the 10 ms target.
    assert headline["all ledgers"]["attainment"] == "99.500 %"
    assert headline["all ledgers"]["entries"] == "4,000"
    assert headline["all ledgers"]["p99 ms"] == "12.500"  # the worst hour's
    assert headline["all ledgers"]["p999 ms"] == "25.000"
    assert headline["E3 Qw3 Qa2"]["attainment"] == "99.500 %"  # 2985 / 3000
    assert headline["E3 Qw3 Qa2"]["entries"] == "3,000"
    assert headline["E5 Qw3 Qa2"]["attainment"] == "99.500 %"
    assert headline["E5 Qw3 Qa2"]["p50 ms"] == "1.500"
    per_bookie = rows_by_first_cell(slo["tables"][1])
    assert per_bookie["bookie-1"]["entries"] == "4,000"
    # Names are data, escaped: the tag reaches the reader as text, not markup.
    assert per_bookie["<b>bookie-9</b>"]["attainment"] == "80.000 %"
    assert "10 ms" in page.sections["Period and input"]["text"]
    assert "135 events from 2 publisher instances" in page.sections["Period and input"]["text"]

    completeness = page.sections["Completeness of the input"]
    assert "1 of 2 publisher instances lost events" in completeness["text"]
    by_source = rows_by_first_cell(completeness["tables"][0])
    assert by_source["gateway"]["missing"] == "5"
    assert by_source["gateway"]["complete"] == "95.000 %"
    assert by_source["metadata"]["complete"] == "transactional outbox"

    exposure = page.sections["Exposure per bookie loss"]
    incidents = rows_by_first_cell(exposure["tables"][0])
    assert incidents["bookie-2"]["lost at"] == "2026-11-24 10:30:00.000 UTC"
    assert incidents["bookie-2"]["entries exposed"] == "1,234"
    assert incidents["bookie-2"]["ledgers exposed"] == "3"
    assert incidents["bookie-2"]["worst run"] == "ledger 7 entries 10..99: 42.500 s"
    assert incidents["bookie-2"]["repaired at"] == "2026-11-24 10:30:42.500 UTC"
    assert incidents["bookie-3"]["repaired at"] == "still exposed: 10 entries"
    assert len(exposure["images"]) == 2  # a timeline per incident

    recoveries = rows_by_first_cell(page.sections["Recoveries (fence to close)"]["tables"][0])
    assert recoveries["11"]["closed at"] == "2026-11-24 10:05:02.000 UTC"
    assert recoveries["11"]["fence to close"] == "2.000 s"

    availability = page.sections["Bookie availability"]
    summary = rows_by_first_cell(availability["tables"][0])
    assert summary["bookie-2"]["lost"] == "90.0 min"
    assert summary["bookie-2"]["time up"] == "25.000 %"
    intervals = availability["tables"][1]
    assert ["bookie-2", "lost", "2026-11-24 10:30:00.000 UTC"] in [r[:3] for r in intervals]
    assert len(availability["images"]) == 1

    changes = rows_by_first_cell(page.sections["Ensemble changes per bookie"]["tables"][0])
    assert changes["bookie-2"]["replaced out"] == "3"
    gc = page.sections["GC: delete to space reclaimed"]
    assert "1 with their space reclaimed (2.0 KiB), 1 not yet" in gc["text"]
    gc_rows = rows_by_first_cell(gc["tables"][0])
    assert gc_rows["22"]["reclaimed at"] == "not yet"
    assert len(page.sections["Add latency over time"]["images"]) == 1

    # Self-contained: every image is embedded, nothing is fetched.
    assert page.images and all(src.startswith("data:image/png;base64,") for src in page.images)
    assert not [link for link in page.links if link.startswith(("http://", "https://", "//"))]


def test_missing_and_empty_tables_are_reported_not_errors(tmp_path: Path) -> None:
    # Every table but exposure is missing; exposure was written with no rows.
    write(tmp_path, "exposure", [])
    page = parse(report.write_report(tmp_path))

    exposure = page.sections["Exposure per bookie loss"]["text"]
    assert "Table exposure is empty: no bookie was lost in the period." in exposure
    for section, table in (
        ("Add latency SLO", "ack_latency"),
        ("Completeness of the input", "completeness"),
        ("Bookie availability", "bookie_availability"),
        ("Recoveries (fence to close)", "recoveries"),
        ("Ensemble changes per bookie", "ensemble_changes"),
        ("GC: delete to space reclaimed", "gc_reclaim"),
    ):
        text = page.sections[section]["text"]
        assert f"Table {table} is missing: the job did not write it." in text
    assert not page.images


def test_the_module_regenerates_the_report(tmp_path: Path, capsys) -> None:
    story_tables(tmp_path)
    assert report.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "report.html")
    assert (
        "bookie-2" in parse(tmp_path / "report.html").sections["Exposure per bookie loss"]["text"]
    )


def test_the_report_is_written_only_to_a_local_output() -> None:
    assert report.local_output("out/sla") == Path("out/sla")
    assert report.local_output("file:///tmp/sla") == Path("/tmp/sla")
    assert report.local_output("hdfs://namenode/sla") is None
    assert report.local_output("s3a://bucket/sla") is None
