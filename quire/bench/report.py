"""What `quire bench` reports: the machine, the summary table, the JSON and the plot."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from quire.bench.load import LoadResult


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine_info(fsync_mode: str) -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "fsync": fsync_mode,
        "load_average_at_start": load_average(),
    }


def ratios(quire: LoadResult, jetstream: LoadResult | None) -> dict[str, float | None]:
    if jetstream is None:
        return {}
    q, j = quire.summary(), jetstream.summary()
    throughput = q["entries_per_s"] / j["entries_per_s"] if j["entries_per_s"] else None
    p99 = q["p99_ms"] / j["p99_ms"] if j["p99_ms"] else None
    return {
        "ratio_throughput": round(throughput, 3) if throughput is not None else None,
        "ratio_p99": round(p99, 3) if p99 is not None else None,
    }


def report_json(
    settings: dict[str, Any],
    machine: dict[str, Any],
    quire: LoadResult,
    jetstream: LoadResult | None,
) -> dict[str, Any]:
    report: dict[str, Any] = {"settings": settings, "machine": machine, "quire": quire.summary()}
    if quire.first_error:
        report["quire"]["first_error"] = quire.first_error
    if jetstream is not None:
        report["jetstream"] = jetstream.summary()
        if jetstream.first_error:
            report["jetstream"]["first_error"] = jetstream.first_error
        report.update(ratios(quire, jetstream))
    return report


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.write_text(json.dumps(report, indent=2) + "\n")


def print_summary(console: Console, report: dict[str, Any]) -> None:
    settings, machine = report["settings"], report["machine"]
    console.print(
        f"[bold]machine[/bold]: {machine['cpu_count']} cpus ({machine['cpu_model']}), "
        f"python {machine['python']}, fsync {machine['fsync']}, "
        f"load average {machine['load_average_at_start']} -> "
        f"{machine.get('load_average_at_end', [])}"
    )
    console.print("[bold]settings[/bold]: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    table = Table(title="quire bench")
    columns = ["entries/s", "MB/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "errors"]
    keys = ["entries_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms", "max_ms", "errors"]
    table.add_column("system")
    for column in columns:
        table.add_column(column, justify="right")
    for name in ("quire", "jetstream"):
        if name in report:
            row = report[name]
            table.add_row(name, *(_fmt(row[k]) for k in keys))
    console.print(table)
    if "ratio_throughput" in report:
        console.print(
            f"quire / jetstream: throughput x{report['ratio_throughput']}, "
            f"p99 x{report['ratio_p99']} (below 1 is better for p99)"
        )
    for name in ("quire", "jetstream"):
        if name in report and report[name].get("first_error"):
            console.print(
                f"[red]{name}: {report[name]['errors']} failed appends; first: "
                f"{report[name]['first_error']}[/red]"
            )


def _fmt(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer() and value >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}" if value >= 1 else f"{value:.3f}"


def write_plot(path: Path, results: list[LoadResult], title: str) -> None:
    """Latency over time (p50, p99, max per second) and the latency distribution (the
    share of appends at or under each latency, on a log axis), one line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (over_time, distribution) = plt.subplots(1, 2, figsize=(13, 5))
    for result in results:
        seconds = [p.second for p in result.timeline]
        for q, style in ((0.5, "-"), (0.99, "--")):
            values = [p.latency.percentile(q) / 1000 for p in result.timeline]
            over_time.plot(seconds, values, style, label=f"{result.target} p{q * 100:g}")
        maxima = [p.latency.max_us / 1000 for p in result.timeline]
        over_time.plot(seconds, maxima, ":", label=f"{result.target} max")
        xs, ys = [], []
        seen = 0
        for _, high, count in result.latency.buckets():
            seen += count
            xs.append(high / 1000)
            ys.append(seen / result.latency.count)
        distribution.step(xs, ys, where="post", label=result.target)
    over_time.set_xlabel("seconds since the warm-up ended")
    over_time.set_ylabel("append latency (ms)")
    over_time.set_yscale("log")
    over_time.set_title("latency over time")
    over_time.legend(fontsize="small")
    distribution.set_xscale("log")
    distribution.set_xlabel("append latency (ms)")
    distribution.set_ylabel("share of appends at or under")
    distribution.set_title("latency distribution")
    distribution.grid(True, which="both", alpha=0.3)
    distribution.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
