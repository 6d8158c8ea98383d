"""The SLA report's figures (matplotlib, Agg), each returned as an <img> with the PNG embedded
as a data URI: the page stays one self-contained file."""

from __future__ import annotations

import base64
import io
from datetime import UTC, timedelta
from typing import Any

Row = dict[str, Any]
STATE_COLOURS = {
    "up": "#2e7d32",
    "read_only": "#f9a825",
    "lost": "#c62828",
    "unregistered": "#9e9e9e",
}


def png(fig: Any, alt: str) -> str:
    """The figure as an embedded image (closed afterwards)."""
    from html import escape

    plt = pyplot()

    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{data}">'


def pyplot() -> Any:
    # The Agg backend, chosen before pyplot is first imported: the report is drawn where there
    # is no display.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def time_axis(ax: Any) -> None:
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator(tz=UTC)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))
    ax.set_xlabel("time (UTC)")


def latency_plot(windows: list[Row]) -> str:
    """p50/p99/p999 of each window (ack_latency's "all" rows) against the target."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 4))
    starts = [r["window_start"] for r in windows]
    # Each window's figure spans the window: hours without acknowledgements stay blank.
    ends = [r["window_start"] + timedelta(seconds=r["window_s"]) for r in windows]
    for key, label, colour in (
        ("p50_ms", "p50", "#2e7d32"),
        ("p99_ms", "p99", "#ef6c00"),
        ("p999_ms", "p999", "#6a1b9a"),
    ):
        ax.hlines([r[key] for r in windows], starts, ends, colors=colour, label=label, lw=2)
    targets = {r["target_ms"] for r in windows if r.get("target_ms") is not None}
    for target in sorted(targets):
        ax.axhline(target, color="#c62828", linestyle=":", label=f"target {target:g} ms")
    ax.set_ylabel("add latency (ms)")
    ax.set_title("add latency percentiles per window, all ledgers")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    time_axis(ax)
    return png(fig, "add latency percentiles per window, all ledgers")


def exposure_plot(steps: list[Row], title: str) -> str:
    plt = pyplot()
    fig, entries_ax = plt.subplots(figsize=(11, 3.2))
    times = [r["ts"] for r in steps]
    entries_ax.step(times, [r["entries_exposed"] for r in steps], where="post", color="#c62828")
    entries_ax.set_ylabel("entries exposed", color="#c62828")
    bytes_ax = entries_ax.twinx()
    # Dashed: bytes are pro rata of entries, so the two lines often coincide.
    bytes_ax.step(
        times, [r["bytes_exposed"] for r in steps], where="post", color="#1565c0", linestyle="--"
    )
    bytes_ax.set_ylabel("bytes exposed", color="#1565c0")
    entries_ax.set_title(f"exposure: {title}")
    entries_ax.grid(True, alpha=0.3)
    time_axis(entries_ax)
    return png(fig, f"entries and bytes exposed over time: {title}")


def availability_plot(rows: list[Row], bookies: list[str]) -> str:
    import matplotlib.dates as mdates
    from matplotlib.patches import Patch

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(bookies) + 1.5))
    for i, bookie in enumerate(bookies):
        for row in (r for r in rows if r["bookie_id"] == bookie):
            start = mdates.date2num(row["start"])
            width = mdates.date2num(row["end"]) - start
            colour = STATE_COLOURS.get(row["state"], "#000000")
            ax.broken_barh([(start, width)], (i - 0.4, 0.8), color=colour)
    ax.set_yticks(range(len(bookies)), labels=bookies)
    ax.xaxis_date()
    time_axis(ax)
    ax.set_title("bookie states")
    ax.legend(
        handles=[Patch(color=c, label=s) for s, c in STATE_COLOURS.items()],
        fontsize="small",
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )
    return png(fig, "bookie states over time")
