"""The SLA report: OUT/report.html, one self-contained page a person reads, from the Parquet
tables the SLA job wrote under OUT/<table>/ (analytics/README.md documents their columns).

Read with pyarrow, drawn with matplotlib (Agg, analytics/sla/plots.py) and embedded as base64
PNG, styled inline: the page links to nothing, so it can be mailed or archived as one file. No
Spark: the report is rewritten after every refresh of `--follow` and can be regenerated from
the tables alone, `python -m analytics.sla.report OUT`. A table that is missing or has no rows
is said so in its section; it is not an error (a period without a bookie loss has no exposure).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from analytics.sla.plots import STATE_COLOURS, availability_plot, exposure_plot, latency_plot

TABLES = (
    "ack_latency",
    "completeness",
    "exposure",
    "exposure_timeline",
    "recoveries",
    "ensemble_changes",
    "bookie_availability",
    "gc_reclaim",
)
MAX_ROWS = 200  # rows of one HTML table; the Parquet table holds them all
CSS = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1200px; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f0f0f0; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: #555; } .bad { color: #b71c1c; font-weight: bold; }
.absent { color: #555; font-style: italic; }
img { max-width: 100%; }
"""

Row = dict[str, Any]


def read_table(output: Path, name: str) -> list[Row] | None:
    """The table's rows (timestamps as UTC datetimes), or None when the job wrote none."""
    path = output / name
    if not path.exists():
        return None
    # A directory as Spark writes it (part files; _SUCCESS and .crc files are skipped).
    table = pq.read_table(path)
    columns = []
    for field in table.schema:
        column = table.column(field.name)
        if pa.types.is_timestamp(field.type):
            # Spark writes INT96 (read back naive, UTC) or UTC-adjusted micros.
            if field.type.tz is None:
                column = column.cast(pa.timestamp("us"), safe=False)
                column = pc.assume_timezone(column, "UTC")
            column = column.cast(pa.timestamp("us", tz="UTC"), safe=False)
        columns.append(column)
    return pa.table(columns, names=table.column_names).to_pylist()


# -- formatting ------------------------------------------------------------------------------


def fmt_ts(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def fmt_int(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def fmt_float(value: float | None, digits: int = 3) -> str:
    if value is None or math.isnan(value):
        return "—"
    return f"{value:,.{digits}f}"


def fmt_pct(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value * 100:.3f} %"


def fmt_bytes(value: int | None) -> str:
    if value is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,} B" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "—"
    if seconds < 120:
        return f"{seconds:,.3f} s"
    if seconds < 7200:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds / 3600:,.1f} h"


# -- HTML pieces -----------------------------------------------------------------------------

Column = tuple[str, Callable[[Row], str], bool]  # header, cell text, right-aligned


def html_table(rows: Sequence[Row], columns: Sequence[Column]) -> str:
    head = "".join(f"<th>{escape(header)}</th>" for header, _, _ in columns)
    body = []
    for row in rows[:MAX_ROWS]:
        cells = "".join(
            f'<td class="n">{escape(cell(row))}</td>'
            if numeric
            else f"<td>{escape(cell(row))}</td>"
            for _, cell, numeric in columns
        )
        body.append(f"<tr>{cells}</tr>")
    more = ""
    if len(rows) > MAX_ROWS:
        more = f'<p class="note">{len(rows) - MAX_ROWS:,} more rows not shown (in the table).</p>'
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"


def absent(name: str, rows: list[Row] | None, why_empty: str) -> str | None:
    """The section's text when its table has nothing to show, else None."""
    if rows is None:
        return f'<p class="absent">Table {escape(name)} is missing: the job did not write it.</p>'
    if not rows:
        return f'<p class="absent">Table {escape(name)} is empty: {escape(why_empty)}.</p>'
    return None


HEADERS = {  # where a column's name does not read well as a header
    "count": "entries",
    "dropped_reported": "dropped (reported)",
    "entry_seconds": "entry-seconds",
    "byte_seconds": "byte-seconds",
    "time_to_full_rereplication_s": "to full re-replication",
    "up_share": "time up",
}


def header(key: str) -> str:
    """A table column's name as a header: units are in the cells (a duration says "s",
    "min" or "h"), except milliseconds; an id is named by what it identifies."""
    if key in HEADERS:
        return HEADERS[key]
    for suffix, unit in (("_ms", " ms"), ("_s", ""), ("_id", "")):
        if key.endswith(suffix):
            key = key.removesuffix(suffix) + unit
            break
    return key.replace("_", " ")


def col(key: str, fmt: Callable[[Any], str] = str, numeric: bool = True) -> Column:
    return header(key), lambda row: fmt(row[key]) if row.get(key) is not None else "—", numeric


# -- sections --------------------------------------------------------------------------------


def period_section(tables: dict[str, list[Row] | None]) -> str:
    """The period the tables cover (their earliest and latest times) and what was read."""
    times: list[datetime] = []
    for rows in tables.values():
        for row in rows or ():
            times.extend(v for v in row.values() if isinstance(v, datetime))
    parts = []
    if times:
        parts.append(
            f"<p>Period: {escape(fmt_ts(min(times)))} to {escape(fmt_ts(max(times)))} "
            '<span class="note">(the earliest and latest times in the tables).</span></p>'
        )
    else:
        parts.append('<p class="absent">No times in any table: the input held no events.</p>')
    completeness = tables["completeness"] or []
    if completeness:
        events = sum(row["events"] or 0 for row in completeness)
        parts.append(
            f"<p>Input: {events:,} events from {len(completeness):,} publisher instances "
            "(see Completeness of the input).</p>"
        )
    ack = tables["ack_latency"] or []
    targets = sorted({row["target_ms"] for row in ack if row.get("target_ms") is not None})
    windows = sorted({row["window_s"] for row in ack if row.get("window_s") is not None})
    if targets:
        parts.append(
            f"<p>Add latency target: {escape(', '.join(f'{t:g} ms' for t in targets))}; "
            f"window: {escape(', '.join(fmt_duration(float(w)) for w in windows))}.</p>"
        )
    return "".join(parts)


def summarise_latency(rows: Iterable[Row]) -> Row:
    """One row over every window of a group: counts add up exactly; the percentiles of a
    period cannot be read off its windows' percentiles, so the worst window's are shown."""
    rows = list(rows)
    count = sum(row["count"] or 0 for row in rows)
    within = sum(row["within_target"] or 0 for row in rows)

    def worst(key: str) -> float | None:
        values = [row[key] for row in rows if row.get(key) is not None]
        return max(values) if values else None

    return {
        "count": count,
        "within_target": within,
        "attainment": within / count if count else None,
        "p50_ms": worst("p50_ms"),
        "p99_ms": worst("p99_ms"),
        "p999_ms": worst("p999_ms"),
        "bytes": sum(row["bytes"] or 0 for row in rows),
        "windows": len(rows),
    }


LATENCY_COLUMNS: list[Column] = [
    col("attainment", fmt_pct),
    col("count", fmt_int),
    col("within_target", fmt_int),
    col("p50_ms", fmt_float),
    col("p99_ms", fmt_float),
    col("p999_ms", fmt_float),
    col("bytes", fmt_bytes),
    col("windows", fmt_int),
]


def slo_section(rows: list[Row] | None) -> str:
    empty = absent("ack_latency", rows, "no entry was acknowledged in the period")
    if empty:
        return empty
    assert rows is not None
    overall = summarise_latency(r for r in rows if r["group"] == "all")
    overall["what"] = "all ledgers"
    shapes: dict[tuple[int, int, int], list[Row]] = {}
    bookies: dict[str, list[Row]] = {}
    for row in rows:
        if row["group"] == "shape":
            key = (row["ensemble_size"], row["write_quorum"], row["ack_quorum"])
            shapes.setdefault(key, []).append(row)
        elif row["group"] == "bookie":
            bookies.setdefault(row["bookie_id"], []).append(row)
    headline = [overall]
    for (e, qw, qa), group in sorted(shapes.items()):
        headline.append({**summarise_latency(group), "what": f"E{e} Qw{qw} Qa{qa}"})
    per_bookie = [
        {**summarise_latency(group), "what": bookie} for bookie, group in sorted(bookies.items())
    ]
    note = (
        '<p class="note">Attainment: the share of acknowledged entries whose add latency '
        "(start to ack quorum) is within the target, over the whole period. p50/p99/p999: "
        "the worst window's (nearest rank on the window's merged histogram).</p>"
    )
    shape_columns = [("quorum shape", lambda r: r["what"], False), *LATENCY_COLUMNS]
    bookie_columns = [("bookie", lambda r: r["what"], False), *LATENCY_COLUMNS]
    return (
        note
        + html_table(headline, shape_columns)
        + "<h3>Per bookie</h3>"
        + '<p class="note">Entries of ledgers whose ensemble held the bookie.</p>'
        + html_table(per_bookie, bookie_columns)
    )


def latency_over_time_section(rows: list[Row] | None) -> str:
    empty = absent("ack_latency", rows, "no entry was acknowledged in the period")
    if empty:
        return empty
    assert rows is not None
    windows = sorted((r for r in rows if r["group"] == "all"), key=lambda r: r["window_start"])
    return latency_plot(windows)


def completeness_section(rows: list[Row] | None) -> str:
    empty = absent("completeness", rows, "the input held no events")
    if empty:
        return empty
    assert rows is not None
    incomplete = [
        r for r in rows if (r.get("missing") or 0) > 0 or (r.get("dropped_reported") or 0) > 0
    ]
    summary = (
        f'<p class="bad">{len(incomplete):,} of {len(rows):,} publisher instances lost events: '
        "the tables under-count what they describe.</p>"
        if incomplete
        else f"<p>All {len(rows):,} publisher instances complete: no sequence gaps, no drops "
        "reported.</p>"
    )

    def completeness_text(row: Row) -> str:
        if row.get("completeness") is None:
            # No seq: the metadata service writes each event in the transaction of its change
            # and publishes it until acknowledged, so nothing is missing to count.
            return "transactional outbox"
        return fmt_pct(row["completeness"])

    columns: list[Column] = [
        col("source", numeric=False),
        col("boot_id", numeric=False),
        col("events", fmt_int),
        col("first_seq", fmt_int),
        col("last_seq", fmt_int),
        col("missing", fmt_int),
        col("dropped_reported", fmt_int),
        ("complete", completeness_text, True),
    ]
    ordered = sorted(rows, key=lambda r: (r["source"] or "", r.get("boot_id") or ""))
    note = (
        '<p class="note">One row per publisher instance (source, boot). Missing: gaps in its '
        "seq; dropped: what it reported dropping (events.dropped). The metadata outbox has no "
        "seq: its events are written in the same transaction as the change they describe and "
        "published until acknowledged.</p>"
    )
    return summary + note + html_table(ordered, columns)


def exposure_section(incidents: list[Row] | None, timeline: list[Row] | None) -> str:
    empty = absent("exposure", incidents, "no bookie was lost in the period")
    if empty:
        return empty
    assert incidents is not None
    ordered = sorted(incidents, key=lambda r: (r["lost_at"], r["bookie_id"]))

    def worst(row: Row) -> str:
        if row.get("worst_ledger_id") is None:
            return "—"
        return (
            f"ledger {row['worst_ledger_id']} entries {row['worst_first_entry_id']}.."
            f"{row['worst_last_entry_id']}: {fmt_duration(row['worst_exposed_s'])}"
        )

    def repaired(row: Row) -> str:
        if row.get("repaired_at") is None:
            return f"still exposed: {fmt_int(row.get('still_exposed_entries'))} entries"
        return fmt_ts(row["repaired_at"])

    columns: list[Column] = [
        col("bookie_id", numeric=False),
        col("lost_at", fmt_ts, False),
        col("ledgers_exposed", fmt_int),
        col("entries_exposed", fmt_int),
        col("bytes_exposed", fmt_bytes),
        col("entry_seconds", fmt_float),
        col("byte_seconds", fmt_float),
        ("worst run", worst, False),
        ("repaired at", repaired, False),
        col("time_to_full_rereplication_s", fmt_duration),
    ]
    note = (
        '<p class="note">One row per bookie loss. Exposed: acknowledged entries whose write '
        "set held the lost bookie, until re-replicated or deleted.</p>"
    )
    parts = [note, html_table(ordered, columns)]
    if timeline is None:
        parts.append('<p class="absent">Table exposure_timeline is missing: no timelines.</p>')
        return "".join(parts)
    for incident in ordered[:MAX_ROWS]:
        steps = sorted(
            (
                r
                for r in timeline
                if r["bookie_id"] == incident["bookie_id"] and r["lost_at"] == incident["lost_at"]
            ),
            key=lambda r: r["ts"],
        )
        title = f"{incident['bookie_id']} lost at {fmt_ts(incident['lost_at'])}"
        parts.append(f"<h3>{escape(title)}</h3>")
        if not steps:
            parts.append('<p class="absent">No timeline rows for this incident.</p>')
            continue
        parts.append(exposure_plot(steps, title))
    return "".join(parts)


def availability_section(rows: list[Row] | None) -> str:
    empty = absent("bookie_availability", rows, "no bookie state was seen in the period")
    if empty:
        return empty
    assert rows is not None
    ordered = sorted(rows, key=lambda r: (r["bookie_id"], r["start"]))
    totals: dict[str, dict[str, float]] = {}
    for row in ordered:
        states = totals.setdefault(row["bookie_id"], {})
        states[row["state"]] = states.get(row["state"], 0.0) + (row["duration_s"] or 0.0)
    summary = []
    for bookie, states in totals.items():
        total = sum(states.values())
        summary.append(
            {
                "bookie_id": bookie,
                **{state: states.get(state, 0.0) for state in STATE_COLOURS},
                "up_share": states.get("up", 0.0) / total if total else None,
            }
        )
    summary_columns: list[Column] = [
        col("bookie_id", numeric=False),
        *(col(state, fmt_duration) for state in STATE_COLOURS),
        col("up_share", fmt_pct),
    ]
    interval_columns: list[Column] = [
        col("bookie_id", numeric=False),
        col("state", numeric=False),
        col("start", fmt_ts, False),
        col("end", fmt_ts, False),
        col("duration_s", fmt_duration),
        ("open", lambda r: "open" if r.get("open") else "", False),
    ]
    return (
        html_table(summary, summary_columns)
        + availability_plot(ordered, list(totals))
        + "<h3>Intervals</h3>"
        + html_table(ordered, interval_columns)
    )


def recoveries_section(rows: list[Row] | None) -> str:
    empty = absent("recoveries", rows, "no ledger was fenced in the period")
    if empty:
        return empty
    assert rows is not None
    closed = sorted(r["fence_to_close_s"] for r in rows if r.get("fence_to_close_s") is not None)
    summary = f"<p>{len(rows):,} ledgers fenced, {len(closed):,} closed by recovery"
    if closed:
        median = closed[(len(closed) - 1) // 2]
        summary += (
            f"; fence to close: median {escape(fmt_duration(median))}, "
            f"max {escape(fmt_duration(closed[-1]))}"
        )
    summary += ".</p>"
    columns: list[Column] = [
        col("ledger_id", fmt_int),
        col("fenced_at", fmt_ts, False),
        col("bookies_fenced", fmt_int),
        col("recovery_started_at", fmt_ts, False),
        (
            "closed at",
            lambda r: fmt_ts(r["closed_at"]) if r.get("closed_at") else "not closed",
            False,
        ),
        col("fence_to_close_s", fmt_duration),
        col("recovered_entries", fmt_int),
        col("last_entry_id", fmt_int),
    ]
    ordered = sorted(rows, key=lambda r: (r["fenced_at"], r["ledger_id"]))
    return summary + html_table(ordered, columns)


def ensemble_changes_section(rows: list[Row] | None) -> str:
    empty = absent("ensemble_changes", rows, "no writer changed its ensemble in the period")
    if empty:
        return empty
    assert rows is not None
    totals: dict[str, Row] = {}
    for row in rows:
        total = totals.setdefault(
            row["bookie_id"], {"bookie_id": row["bookie_id"], "replaced_out": 0, "replaced_in": 0}
        )
        total["replaced_out"] += row["replaced_out"] or 0
        total["replaced_in"] += row["replaced_in"] or 0
    total_columns: list[Column] = [
        col("bookie_id", numeric=False),
        col("replaced_out", fmt_int),
        col("replaced_in", fmt_int),
    ]
    window_columns: list[Column] = [
        col("window_start", fmt_ts, False),
        col("bookie_id", numeric=False),
        col("replaced_out", fmt_int),
        col("replaced_in", fmt_int),
        col("ledgers", fmt_int),
    ]
    ordered = sorted(rows, key=lambda r: (r["window_start"], r["bookie_id"]))
    return (
        '<p class="note">Times each bookie was replaced out of (or brought into) a writer\'s '
        "ensemble.</p>"
        + html_table(sorted(totals.values(), key=lambda r: r["bookie_id"]), total_columns)
        + "<h3>Per window</h3>"
        + html_table(ordered, window_columns)
    )


def gc_section(rows: list[Row] | None) -> str:
    empty = absent("gc_reclaim", rows, "no bookie garbage-collected a deleted ledger in the period")
    if empty:
        return empty
    assert rows is not None
    reclaimed = [r for r in rows if r.get("reclaimed_at") is not None]
    lags = sorted(
        r["delete_to_reclaim_s"] for r in rows if r.get("delete_to_reclaim_s") is not None
    )
    total_bytes = sum(r.get("bytes_reclaimed") or 0 for r in rows)
    summary = (
        f"<p>{len(rows):,} deleted ledger copies garbage-collected by their bookies; "
        f"{len(reclaimed):,} with their space reclaimed ({escape(fmt_bytes(total_bytes))}), "
        f"{len(rows) - len(reclaimed):,} not yet"
    )
    if lags:
        summary += (
            f"; delete to reclaim: median {escape(fmt_duration(lags[(len(lags) - 1) // 2]))}, "
            f"max {escape(fmt_duration(lags[-1]))}"
        )
    summary += ".</p>"
    columns: list[Column] = [
        col("ledger_id", fmt_int),
        col("bookie_id", numeric=False),
        col("deleted_at", fmt_ts, False),
        col("gc_deleted_at", fmt_ts, False),
        (
            "reclaimed at",
            lambda r: fmt_ts(r["reclaimed_at"]) if r.get("reclaimed_at") else "not yet",
            False,
        ),
        col("bytes_reclaimed", fmt_bytes),
        col("delete_to_gc_s", fmt_duration),
        col("delete_to_reclaim_s", fmt_duration),
    ]
    ordered = sorted(rows, key=lambda r: (r["gc_deleted_at"], r["ledger_id"], r["bookie_id"]))
    return summary + html_table(ordered, columns)


def render(tables: dict[str, list[Row] | None], generated_at: datetime) -> str:
    sections = [
        ("Period and input", period_section(tables)),
        ("Add latency SLO", slo_section(tables["ack_latency"])),
        ("Completeness of the input", completeness_section(tables["completeness"])),
        (
            "Exposure per bookie loss",
            exposure_section(tables["exposure"], tables["exposure_timeline"]),
        ),
        ("Add latency over time", latency_over_time_section(tables["ack_latency"])),
        ("Bookie availability", availability_section(tables["bookie_availability"])),
        ("Recoveries (fence to close)", recoveries_section(tables["recoveries"])),
        ("Ensemble changes per bookie", ensemble_changes_section(tables["ensemble_changes"])),
        ("GC: delete to space reclaimed", gc_section(tables["gc_reclaim"])),
    ]
    body = "".join(f"<h2>{escape(title)}</h2>{html}" for title, html in sections)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        "<title>Quire durability SLA report</title>"
        f"<style>{CSS}</style></head><body>"
        "<h1>Quire durability SLA report</h1>"
        f'<p class="note">Generated {escape(fmt_ts(generated_at))} from the SLA tables.</p>'
        f"{body}</body></html>\n"
    )


def local_output(output: str) -> Path | None:
    """OUTPUT as a local directory, where the report can be written; None when it is on another
    file system Spark writes to (hdfs://, s3a://...)."""
    if "://" in output and not output.startswith("file://"):
        return None
    return Path(output.removeprefix("file://"))


def write_report(output: Path) -> Path:
    """Write output/report.html from the tables under output/ and return its path."""
    output = Path(output)
    tables = {name: read_table(output, name) for name in TABLES}
    html = render(tables, datetime.now(UTC))
    path = output / "report.html"
    # Written aside then renamed: `--follow` rewrites it while someone may be reading it.
    partial = output / "report.html.partial"
    partial.write_text(html, encoding="utf-8")
    partial.replace(path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analytics.sla.report",
        description="Write OUT/report.html from the SLA tables under OUT/.",
    )
    parser.add_argument("output", type=Path, help="the SLA job's output directory")
    args = parser.parse_args(argv)
    if not args.output.is_dir():
        parser.error(f"{args.output} is not a directory")
    print(write_report(args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
