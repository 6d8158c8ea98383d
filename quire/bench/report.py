"""What `quire bench` reports: the machine, the summary table, the JSON and the plot."""

from __future__ import annotations

import json
import os
import platform
import statistics
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


# What a comparison run is reported as, and how its ratio line reads.
COMPARED_AS = {
    "jetstream": "quire / jetstream",
    "one_ledger": "many ledgers / one ledger (aim: throughput >= 0.8, p99 <= 1.5)",
    "tracing_off": "tracing on / tracing off (aim: throughput >= 0.95)",
}


def ratios(quire: LoadResult, compared: LoadResult | None) -> dict[str, float | None]:
    if compared is None:
        return {}
    q, c = quire.summary(), compared.summary()
    throughput = q["entries_per_s"] / c["entries_per_s"] if c["entries_per_s"] else None
    p99 = q["p99_ms"] / c["p99_ms"] if c["p99_ms"] else None
    return {
        "ratio_throughput": round(throughput, 3) if throughput is not None else None,
        "ratio_p99": round(p99, 3) if p99 is not None else None,
    }


# The figures of each system reported as medians over the runs of `--repeat`.
MEDIAN_KEYS = ("entries_per_s", "p50_ms", "p99_ms", "cpu_us_per_entry")


def median_run(results: list[LoadResult]) -> LoadResult:
    """The run whose throughput is the (low) median: a real run, so its figures agree."""
    ordered = sorted(results, key=lambda result: result.entries_per_s)
    return ordered[(len(ordered) - 1) // 2]


def _medians(results: list[LoadResult]) -> dict[str, float | None]:
    summaries = [result.summary() for result in results]
    medians: dict[str, float | None] = {}
    for key in MEDIAN_KEYS:
        values = [s[key] for s in summaries if s.get(key) is not None]
        medians[key] = statistics.median_low(values) if len(values) == len(summaries) else None
    return medians


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def report_json(
    settings: dict[str, Any],
    machine: dict[str, Any],
    quire: list[LoadResult],
    compared: list[LoadResult] | None,
    compared_as: str = "jetstream",
) -> dict[str, Any]:
    """`compared` (JetStream, or one writer on one ledger) goes under `compared_as`. Each
    is a list of runs (`--repeat`, the sides alternating): with one run, its figures; with
    more, `runs` holds each (and each pair's ratios), `median` the median of each figure
    over the runs and the ratios of those medians (the ones the top-level ratios are),
    and the systems' own entries are their median runs by throughput."""
    report: dict[str, Any] = {"settings": settings, "machine": machine}
    for key, results in (("quire", quire), (compared_as, compared)):
        if results:
            result = median_run(results)
            report[key] = result.summary() | {"label": result.target}
            if result.first_error:
                report[key]["first_error"] = result.first_error
    if len(quire) == 1:
        report.update(ratios(quire[0], compared[0] if compared else None))
        return report
    runs = []
    for index, result in enumerate(quire):
        row: dict[str, Any] = {"quire": result.summary() | {"label": result.target}}
        if compared:
            row[compared_as] = compared[index].summary() | {"label": compared[index].target}
            row |= ratios(result, compared[index])
        runs.append(row)
    median: dict[str, Any] = {"quire": _medians(quire)}
    if compared:
        median[compared_as] = _medians(compared)
        q, c = median["quire"], median[compared_as]
        median["ratio_throughput"] = _ratio(q["entries_per_s"], c["entries_per_s"])
        median["ratio_p99"] = _ratio(q["p99_ms"], c["p99_ms"])
        report["ratio_throughput"] = median["ratio_throughput"]
        report["ratio_p99"] = median["ratio_p99"]
    report["runs"] = runs
    report["median"] = median
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
    names = [name for name in ("quire", *COMPARED_AS) if name in report]
    for name in names:
        row = report[name]
        table.add_row(row["label"], *(_fmt(row[k]) for k in keys))
    console.print(table)
    for name in names:
        if report[name]["ledgers"] > 1:
            console.print(
                f"{report[name]['ledgers']:,} ledgers created before the measurement in "
                f"{report[name]['ledgers_create_s']} s"
            )
    for name in names:
        console.print(
            f"{report[name]['label']}: the bench process used "
            f"{report[name]['client_cpu_cores']} of a core, "
            f"{report[name]['client_cpu_ms_per_1k_entries']} ms of CPU per 1,000 entries"
        )
    for name in names:
        console.print(f"{report[name]['label']}: {_cpu_line(report[name])}")
    if "runs" in report:
        _print_runs(console, report, names)
    compared_as = names[-1]
    if "ratio_throughput" in report:
        of = " (medians of the runs)" if "runs" in report else ""
        console.print(
            f"{COMPARED_AS[compared_as]}{of}: throughput x{report['ratio_throughput']}, "
            f"p99 x{report['ratio_p99']} (below 1 is better for p99)"
        )
    for name in names:
        if report[name].get("first_error"):
            console.print(
                f"[red]{name}: {report[name]['errors']} failed appends; first: "
                f"{report[name]['first_error']}[/red]"
            )


def _cpu_line(figures: dict[str, Any]) -> str:
    if figures.get("cpu_us_per_entry") is None:
        return f"CPU per entry unknown: {figures['cpu_note']}"
    kinds = ", ".join(f"{k} {v:g}" for k, v in figures["cpu_us_per_entry_by_kind"].items())
    return (
        f"{figures['cpu_us_per_entry']:g} us of CPU per acknowledged entry, "
        f"{figures['cpu_cores']:g} cores ({kinds})"
    )


def _print_runs(console: Console, report: dict[str, Any], names: list[str]) -> None:
    table = Table(title=f"{len(report['runs'])} runs, the systems alternating")
    table.add_column("run", justify="right")
    table.add_column("system")
    for column in ("entries/s", "p50 ms", "p99 ms", "CPU us/entry"):
        table.add_column(column, justify="right")
    keys = ("entries_per_s", "p50_ms", "p99_ms", "cpu_us_per_entry")
    for index, run in enumerate(report["runs"], start=1):
        for name in names:
            row = run[name]
            table.add_row(str(index), row["label"], *(_fmt_or_unknown(row[k]) for k in keys))
    for name in names:
        median = report["median"][name]
        label = report[name]["label"]
        table.add_row("median", label, *(_fmt_or_unknown(median[k]) for k in keys))
    console.print(table)


def _fmt_or_unknown(value: float | None) -> str:
    return "unknown" if value is None else _fmt(value)


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


def print_idle(console: Console, report: dict[str, Any]) -> None:
    """`quire bench idle`: CPU per process without and with the open ledgers; the
    gateway's memory per open ledger."""
    ledgers, machine = report["ledgers"], report["machine"]
    console.print(
        f"[bold]machine[/bold]: {machine['cpu_count']} cpus ({machine['cpu_model']}), "
        f"load average {machine['load_average_at_start']} -> "
        f"{machine.get('load_average_at_end', [])}"
    )
    table = Table(title=f"idle CPU, % of one core ({report['settings']['via']})")
    for column in ("process", "pid", "no ledgers", f"{ledgers:,} open ledgers"):
        table.add_column(column, justify="left" if column == "process" else "right")
    for row in report["processes"]:
        table.add_row(
            row["name"],
            str(row["pid"]),
            f"{row['cpu_pct_no_ledgers']:.2f}",
            f"{row['cpu_pct_open_ledgers']:.2f}",
        )
    table.add_row(
        "all",
        "",
        f"{report['cpu_pct_total_no_ledgers']:.2f}",
        f"{report['cpu_pct_total_open_ledgers']:.2f}",
    )
    console.print(table)
    rss = report["gateway_rss_kib"]
    console.print(
        f"{ledgers:,} ledgers opened (one entry each) in {report['open_s']} s; gateway RSS "
        f"{rss['before']:,} KiB before, {rss['after_open']:,} after opening, "
        f"{rss['at_end']:,} at the end: {rss['per_open_ledger']} KiB per open ledger"
    )


ROUND_COLUMNS = (
    "open before",
    "round s",
    "ledgers/s",
    "create p50 ms",
    "create p99 ms",
    "append p50 ms",
    "append p99 ms",
    "errors",
)


def rounds_table() -> Table:
    """`quire bench open-ledgers`: one row per round."""
    table = Table(title="new ledgers as the open ledgers grow")
    for column in ROUND_COLUMNS:
        table.add_column(column, justify="right")
    return table


def rounds_row(row: dict[str, Any]) -> list[str]:
    keys = ("round_s", "ledgers_per_s", "create_p50_ms", "create_p99_ms")
    keys += ("append_p50_ms", "append_p99_ms")
    return [f"{row['open_before']:,}", *(f"{row[k]:,}" for k in keys), str(row["errors"])]


# The wait for each batch, in ms; "cached MB": the files' bytes in the page cache before
# the pass.
READ_COLUMNS = ("entries/s", "MB/s", "p50 ms", "p99 ms", "max ms", "cached MB")


def print_reads(console: Console, report: dict[str, Any]) -> None:
    """`quire bench read`: cold and warm passes of each system, or the tailing lag."""
    settings, machine = report["settings"], report["machine"]
    console.print(
        f"[bold]machine[/bold]: {machine['cpu_count']} cpus ({machine['cpu_model']}), "
        f"fsync {machine['fsync']}, load average {machine['load_average_at_start']} -> "
        f"{machine.get('load_average_at_end', [])}"
    )
    console.print("[bold]settings[/bold]: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    if "beside_writes" in report:
        _print_beside(console, report["beside_writes"])
        return
    if "tail" in report:
        tail = report["tail"]
        console.print(
            f"tailing: {tail['entries_written']:,} entries written at "
            f"{tail['write_entries_per_s']:,} entries/s, {tail['entries_read']:,} read by "
            f"{settings['readers']} readers; lag (append acknowledged to entry read) "
            f"p50 {tail['lag_p50_ms']} ms, p99 {tail['lag_p99_ms']} ms, "
            f"max {tail['lag_max_ms']} ms"
        )
        if tail["first_error"]:
            console.print(f"[red]{tail['errors']} errors; first: {tail['first_error']}[/red]")
        return
    table = Table(title="quire bench read: one closed ledger read back whole; wait per batch")
    table.add_column("system")
    table.add_column("pass")
    for column in READ_COLUMNS:
        table.add_column(column, justify="right")
    for system in ("quire", "jetstream"):
        if system not in report:
            continue
        for name in ("cold", "warm"):
            row = report[system][name]
            cells = [
                _fmt(row["entries_per_s"]),
                _fmt(row["mb_per_s"]),
                _fmt(row["batch_p50_ms"]),
                _fmt(row["batch_p99_ms"]),
                _fmt(row["batch_max_ms"]),
                _fmt(row["page_cache_before"]["resident_bytes"] / 1e6),
            ]
            table.add_row(system, name, *cells)
    console.print(table)
    for system in ("quire", "jetstream"):
        if system in report:
            write = report[system]["write"]
            console.print(
                f"{report[system]['label']}: written at {write['entries_per_s']:,} entries/s"
            )
            for name in ("cold", "warm"):
                cache = report[system][name].get("ledgerstore")
                if cache:
                    console.print(
                        f"  {name}: {report[system][name]['batches']:,} batches; ledgerstores: "
                        + ", ".join(f"{k} {v:,}" for k, v in cache.items())
                    )
                if report[system][name]["error"]:
                    console.print(f"[red]{system} {name}: {report[system][name]['error']}[/red]")


def _print_beside(console: Console, figures: dict[str, Any]) -> None:
    """`quire bench read --beside-writes`: the two write runs and the readers."""
    if "peak" in figures:
        console.print(
            f"peak: {figures['peak']['entries_per_s']:,} entries/s; written at half: "
            f"{figures['write_rate']:,} entries/s"
        )
    table = Table(title="add latency at one write rate, without and with catch-up readers")
    table.add_column("run")
    for column in ("entries/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "CPU us/entry", "errors"):
        table.add_column(column, justify="right")
    keys = ("entries_per_s", "p50_ms", "p99_ms", "p999_ms", "max_ms", "cpu_us_per_entry")
    for name in ("write_only", "with_readers"):
        row = figures[name]
        cells = [_fmt_or_unknown(row[k]) for k in keys]
        table.add_row(name.replace("_", " "), *cells, str(row["errors"]))
    console.print(table)
    cores = [
        f"{name} {figures[key]['cpu_cores']}"
        for name, key in (
            ("peak", "peak"),
            ("write only", "write_only"),
            ("with readers", "with_readers"),
        )
        if key in figures and figures[key].get("cpu_cores") is not None
    ]
    if cores:
        # How much of the machine the writes take before any reader: what is left is all
        # the readers' work (their process here included) can have without delaying adds.
        console.print(f"cores used by the cluster and the writer: {', '.join(cores)}")
    alone, beside = figures["journal_syncs_write_only"], figures["journal_syncs_with_readers"]
    console.print(
        f"journal group commits (write + fdatasync): write only {alone['group_commits']:,}, "
        f"mean {alone['mean_ms']} ms; with readers {beside['group_commits']:,}, "
        f"mean {beside['mean_ms']} ms"
    )
    read = figures["readers"]
    console.print(
        f"readers: {read['readers']} read {read['entries']:,} entries cold in "
        f"{read['elapsed_s']} s: {read['entries_per_s']:,} entries/s, {read['mb_per_s']} MB/s, "
        f"their process {read['client_cpu_cores']} of a core (nice {read['nice']}); "
        f"wait per batch p50 {read['batch_p50_ms']} ms, p99 {read['batch_p99_ms']} ms"
    )
    if read.get("client_cpu_us_per_entry") is not None:
        extra = read["cluster_cpu_us_per_entry_by_kind"] or {}
        by_kind = ", ".join(f"{kind} {us}" for kind, us in extra.items())
        console.print(
            f"CPU per entry read (us): the readers' process {read['client_cpu_us_per_entry']}; "
            f"the cluster's extra with readers: {by_kind or 'unknown'}"
        )
    if not read["covered_the_run"]:
        console.print(
            f"[yellow]{read['readers_finished']} readers reached their ledger's end, the first "
            f"after {read['first_finished_after_s']} s: more --entries to read cold for the "
            "whole run[/yellow]"
        )
    console.print(
        f"with readers / write only: p99 x{figures['ratio_p99']}, p50 x{figures['ratio_p50']} "
        "(issue 20's target: p99 at most x1.5)"
    )
    if read["first_error"]:
        console.print(f"[red]readers: {read['errors']} errors; first: {read['first_error']}[/red]")
