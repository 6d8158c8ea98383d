"""`quire bench` (and `quire bench recovery`): the command line around the load runner.

Without --gateway/--data-dir it starts its own cluster (the `quire up` Cluster class) in a
temporary data dir and removes it afterwards (`autorecovery` keeps it when it fails); with
them it uses the running one."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from quire.bench.autorecovery import AutorecoverySpec, run_autorecovery
from quire.bench.load import LoadResult, LoadSpec, run_load
from quire.bench.population import IdleSpec, RoundsSpec, measure_idle, run_rounds
from quire.bench.procstat import CpuMeter, Process
from quire.bench.report import (
    ROUND_COLUMNS,
    load_average,
    machine_info,
    median_run,
    print_idle,
    print_reads,
    print_summary,
    report_json,
    rounds_row,
    rounds_table,
    write_json,
    write_plot,
)
from quire.bench.targets import (
    ClientTarget,
    InProcessTarget,
    JetStreamTarget,
    Quorum,
    Target,
)
from shared import telemetry
from shared.config import QuireSettings
from shared.gc_tuning import tune_gc
from shared.status import ApiCodes
from shared.tracestore import SpanStoreExporter

console = Console()
err_console = Console(stderr=True)

RunningClusterOption = Annotated[
    Path | None,
    typer.Option(help="Use the running `quire up` of this data dir.", show_default=False),
]
GrpcAddressOption = Annotated[
    str | None, typer.Option(help="The gateway's gRPC host:port.", show_default=False)
]

app = typer.Typer(
    help="Measure Quire's write path (and JetStream's, with --compare jetstream).",
    no_args_is_help=False,
)


class Via(StrEnum):
    INPROCESS = "inprocess"
    HTTP = "http"
    GRPC = "grpc"


class Compare(StrEnum):
    NONE = "none"
    JETSTREAM = "jetstream"
    ONE_LEDGER = "one-ledger"  # the same total rate from one writer on one ledger
    TRACING_OFF = "tracing-off"  # the same load on a second fresh cluster, tracing off


class ReadCompare(StrEnum):
    NONE = "none"
    JETSTREAM = "jetstream"


@dataclass
class ClusterAccess:
    """Where the cluster under test answers."""

    http: str
    grpc: str
    settings: QuireSettings  # NATS url and credentials for the in-process core
    fsync: str
    description: str
    processes: list[Process] = field(default_factory=list)  # empty: not known (--gateway)
    gateway_pid: int | None = None
    data_dir: Path | None = None  # the `quire up` data dir, when known (not with --gateway)
    bookie_ids: list[str] = field(default_factory=list)  # from cluster.json, when known
    # bookie id -> its ledgerstore's metrics URL, from cluster.json, when known
    ledgerstore_metrics: dict[str, str] = field(default_factory=dict)
    # every journal's metrics URL, from cluster.json, when known
    journal_metrics: list[str] = field(default_factory=list)


def _processes(rows: list[dict[str, Any]]) -> list[Process]:
    """The processes cluster.json lists (its `services` rows) that are up: a row's pid is
    null while its process waits for its restart. A co-hosted bookie's two rows (its
    halves, one `process`) are one process, kind "bookie": its CPU is counted once."""
    processes: dict[int, Process] = {}
    for row in rows:
        if row["pid"] is None:
            continue
        pid = int(row["pid"])
        if "process" in row:
            processes[pid] = Process(row["process"], "bookie", pid)
        else:
            processes[pid] = Process(row["name"], row["kind"], pid)
    return list(processes.values())


def _bookie_ids(rows: list[dict[str, Any]]) -> list[str]:
    """The bookies cluster.json lists (one ledgerstore each)."""
    return [row["bookie_id"] for row in rows if row["kind"] == "ledgerstore"]


def _ledgerstore_metrics(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Each bookie's ledgerstore metrics URL, as cluster.json lists them."""
    return {row["bookie_id"]: row["metrics"] for row in rows if row["kind"] == "ledgerstore"}


def _known(access: ClusterAccess) -> list[Process] | None:
    """The cluster's processes, for its CPU; None when cluster.json was not read."""
    return access.processes or None


def _journal_metrics(rows: list[dict[str, Any]]) -> list[str]:
    return [row["metrics"] for row in rows if row["kind"] == "journal" and row.get("metrics")]


def _fail(message: str) -> None:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(1)


def _fsync_mode(env: dict[str, str]) -> str:
    value = env.get("QUIRE_JOURNAL__SYNC_DATA", "true").strip().lower()
    if value in ("0", "false", "no", "off"):
        return "off (journal.sync_data=false: acknowledged before fdatasync)"
    return "on (fdatasync per journal group commit before any ack)"


@contextlib.contextmanager
def cluster_access(
    gateway: str | None,
    data_dir: Path | None,
    bookies: int,
    grpc_address: str | None,
    extra_env: dict[str, str] | None = None,
    restart: bool = True,
    keep_on_error: bool = False,
) -> Iterator[ClusterAccess]:
    """The running cluster that --gateway/--data-dir name, else one started here (with
    `extra_env` on top of this process's environment; `restart=False`: a process that
    exits stays down, as `quire up --no-restart`). With `keep_on_error`, a cluster
    started here keeps its data dir (its services' logs) when the body raises."""
    if gateway or data_dir:
        yield _existing(gateway, data_dir, grpc_address)
        return
    from quire.cluster import Cluster, ClusterConfig
    from quire.infra import free_port

    parent = Path(tempfile.mkdtemp(prefix="quire-bench-"))
    parent.chmod(0o711)  # PostgreSQL runs as another user when we are root
    config = ClusterConfig(
        data_dir=parent / "quire-data",
        bookies=bookies,
        http_port=free_port(),
        grpc_port=free_port(),
        extra_env=extra_env or {},
        restart=restart,
    )
    cluster = Cluster(config, out=io.StringIO(), err=io.StringIO())
    err_console.print(f"starting a {bookies}-bookie cluster in {config.data_dir} ...")
    failed = False
    try:
        cluster.start()
        user, password = cluster.nats_credentials or ("", "")
        settings = QuireSettings(nats_url=cluster.nats_url, nats_user=user, nats_password=password)
        info = cluster.cluster_info()
        yield ClusterAccess(
            cluster.http_url,
            cluster.grpc_address,
            settings,
            _fsync_mode(dict(os.environ)),
            f"started by quire bench ({bookies} bookies)",
            _processes(info["services"]),
            info["gateway"]["pid"],
            config.data_dir,
            _bookie_ids(info["services"]),
            _ledgerstore_metrics(info["services"]),
            _journal_metrics(info["services"]),
        )
    except BaseException:
        failed = True
        raise
    finally:
        cluster.stop()
        if failed and keep_on_error:
            err_console.print(f"kept the cluster's data dir: {config.data_dir} (logs in logs/)")
        else:
            shutil.rmtree(parent, ignore_errors=True)


def _existing(gateway: str | None, data_dir: Path | None, grpc_address: str | None):
    from quire.cluster import nats_credentials

    info: dict[str, Any] = {}
    if data_dir is not None:
        path = data_dir / "cluster.json"
        try:
            info = json.loads(path.read_text())
        except FileNotFoundError:
            _fail(f"no {path}: is `quire up --data-dir {data_dir}` running?")
    settings = QuireSettings()  # QUIRE_NATS_URL etc. when the data dir does not say
    if info:
        credentials = nats_credentials(data_dir) if data_dir is not None else None
        user, password = credentials or (
            settings.nats_user,
            settings.nats_password.get_secret_value(),
        )
        settings = QuireSettings(nats_url=info["nats_url"], nats_user=user, nats_password=password)
    http = gateway or info.get("gateway", {}).get("http", "")
    grpc = grpc_address or info.get("gateway", {}).get("grpc", "")
    return ClusterAccess(
        http.rstrip("/"),
        grpc,
        settings,
        _fsync_mode(dict(os.environ)) + ", as the running cluster was configured",
        f"running cluster ({data_dir or gateway})",
        _processes(info.get("services", [])),
        info.get("gateway", {}).get("pid"),
        data_dir,
        _bookie_ids(info.get("services", [])),
        _ledgerstore_metrics(info.get("services", [])),
        _journal_metrics(info.get("services", [])),
    )


def make_target(via: Via, access: ClusterAccess, quorum: Quorum, edge_ratio: float = 0.0) -> Target:
    """`edge_ratio`: the share of in-process appends traced (the bench as the edge)."""
    if via is Via.INPROCESS:
        return InProcessTarget(access.settings, quorum, edge_ratio)
    if via is Via.HTTP:
        if not access.http:
            _fail("--via http needs the gateway: --gateway URL or --data-dir")
        return ClientTarget("http", access.http, quorum)
    if not access.grpc:
        _fail("--via grpc needs the gateway's gRPC address: --grpc-address or --data-dir")
    return ClientTarget("grpc", access.grpc, quorum)


@dataclass
class Side:
    """One system the bench loads: its target, and the processes whose CPU is its cost
    (None: the target's own, as JetStream's servers, or not known)."""

    target: Target
    label: str
    processes: list[Process] | None = None
    spec: LoadSpec | None = None  # None: the command's


async def _measure(sides: list[Side], spec: LoadSpec, repeat: int = 1) -> list[list[LoadResult]]:
    """Every side opened, then `repeat` rounds of one run of each side in turn (the
    systems alternate, so a change of the machine's load falls on both), on the same
    cluster or servers; each run writes ledgers (JetStream: subjects) of its own.
    The runs of each side, in order."""
    results: list[list[LoadResult]] = [[] for _ in sides]
    opened: list[Side] = []
    try:
        for side in sides:
            await side.target.open()
            opened.append(side)
        for run in range(repeat):
            for index, side in enumerate(sides):
                label = side.label + (f", run {run + 1} of {repeat}" if repeat > 1 else "")
                processes = side.processes or side.target.processes()
                meter = CpuMeter(processes)
                results[index].append(
                    await _measure_one(side.target, side.spec or spec, label, meter)
                )
    finally:
        for side in reversed(opened):
            await side.target.aclose()
            target = side.target
            if isinstance(target, ClientTarget) and target.close_errors:
                err_console.print(
                    f"[red]{side.label}: {target.close_errors} of its ledgers failed to close[/red]"
                )
    return results


async def _measure_one(target: Target, spec: LoadSpec, label: str, meter: CpuMeter) -> LoadResult:
    total_s = spec.warmup_s + spec.duration_s
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    ) as progress:
        task = progress.add_task(label, total=total_s, rate="")
        last = [0.0, 0]

        def update(elapsed_s: float, done: int, errors: int) -> None:
            if elapsed_s - last[0] >= 0.5:
                rate = (done - last[1]) / (elapsed_s - last[0])
                last[0], last[1] = elapsed_s, done
                phase = "warm-up" if elapsed_s < spec.warmup_s else "measuring"
                suffix = f", {errors} errors" if errors else ""
                progress.update(task, rate=f"{rate:,.0f} entries/s ({phase}{suffix})")
            progress.update(task, completed=min(elapsed_s, total_s))

        if spec.ledgers > 1:
            err_console.print(f"{label}: creating {spec.ledgers:,} ledgers ...")
        return await run_load(target, spec, update, meter)


def edge_ratio() -> float:
    """The share of appends the bench traces as the edge: OTEL_TRACES_SAMPLER_ARG, as a
    gateway's default sampler reads it, else its default."""
    arg = os.environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    try:
        ratio = float(arg) if arg else telemetry.DEFAULT_SAMPLE_RATIO
    except ValueError:
        _fail(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a ratio")
    if not 0.0 <= ratio <= 1.0:
        _fail(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a ratio in [0, 1]")
    return ratio


@contextlib.contextmanager
def _bench_edge(access: ClusterAccess | None) -> Iterator[None]:
    """With `access` (tracing on, in-process): this process traces the appends it samples
    (`InProcessTarget`: the decision is its own, so its provider records every span it
    is given) into the cluster's span store, until the measurement is over."""
    if access is None or access.data_dir is None or telemetry.tracing_disabled():
        yield
        return
    always = {"OTEL_TRACES_SAMPLER": "parentbased_always_on"}
    provider = telemetry.build_provider("bench", instance="bench", environ=always)
    exporter = SpanStoreExporter(access.data_dir / "traces", "bench")
    provider.add_span_processor(BatchSpanProcessor(exporter))
    telemetry.install_provider(provider)
    try:
        yield
    finally:
        telemetry.install_provider(None)
        provider.shutdown()


def _run(coro):
    tune_gc()  # the in-process client holds every ledger's writer (shared/gc_tuning.py)
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover (a dependency; plain asyncio works too)
        return asyncio.run(coro)


@app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    entry_size: Annotated[int, typer.Option(min=1, help="Bytes per entry.")] = 1024,
    ledgers: Annotated[
        int, typer.Option(min=1, help="Ledgers written at once, created before measuring.")
    ] = 1,
    writers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Writers, writer i on ledger i % ledgers: at least --ledgers, and one per "
            "ledger unless given.",
            show_default=False,
        ),
    ] = None,
    in_flight: Annotated[
        int, typer.Option(min=1, help="Appends each writer keeps outstanding (its window).")
    ] = 64,
    batch: Annotated[int, typer.Option(min=1, help="Entries per append call.")] = 1,
    ensemble: Annotated[int, typer.Option(min=1, help="Ensemble size E.")] = 3,
    write_quorum: Annotated[int, typer.Option(min=1, help="Write quorum Qw.")] = 3,
    ack_quorum: Annotated[int, typer.Option(min=1, help="Ack quorum Qa.")] = 2,
    rate: Annotated[
        str, typer.Option(help="Target entries/s over all writers (each its share), or `max`.")
    ] = "max",
    duration: Annotated[float, typer.Option(min=0.1, help="Measured seconds.")] = 30.0,
    warmup: Annotated[float, typer.Option(min=0.0, help="Seconds run before measuring.")] = 5.0,
    via: Annotated[Via, typer.Option(help="Client path.")] = Via.INPROCESS,
    compare: Annotated[
        Compare,
        typer.Option(
            help="Also measure a 3-node JetStream cluster, same load; or one writer on one "
            "ledger at the same total rate (one-ledger); or (tracing-off) run the load on two "
            "fresh clusters, tracing at the default sampling, then OTEL_SDK_DISABLED=true."
        ),
    ] = Compare.NONE,
    create_concurrency: Annotated[
        int, typer.Option(min=1, help="Ledgers created at once before the measurement.")
    ] = 32,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the results as JSON here.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write latency over time and its distribution (PNG).")
    ] = None,
    bookies: Annotated[
        int, typer.Option(min=1, max=64, help="Bookies of the cluster bench starts.")
    ] = 4,
    gateway: Annotated[
        str | None, typer.Option(help="Use this running gateway (HTTP URL).", show_default=False)
    ] = None,
    data_dir: RunningClusterOption = None,
    grpc_address: GrpcAddressOption = None,
    repeat: Annotated[
        int,
        typer.Option(
            min=1,
            max=25,
            help="Runs of each system, alternating, on the same cluster (and JetStream "
            "servers): each run and the medians are reported, the ratios of the medians.",
        ),
    ] = 1,
) -> None:
    """Run the load for warm-up + duration seconds; print entries/s, MB/s, add latency
    percentiles and CPU per acknowledged entry (and JetStream's beside them with --compare
    jetstream)."""
    if ctx.invoked_subcommand is not None:
        return
    if not 1 <= ack_quorum <= write_quorum <= ensemble:
        _fail("need 1 <= ack-quorum <= write-quorum <= ensemble")
    writers = ledgers if writers is None else writers
    if writers < ledgers:
        _fail("--writers must be at least --ledgers: every ledger has its own writer")
    target_rate: float | None = None
    if rate != "max":
        try:
            target_rate = float(rate)
        except ValueError:
            _fail(f"--rate takes a number of entries/s or `max`, not {rate!r}")
        if target_rate is None or target_rate <= 0:
            _fail("--rate must be positive")
    spec = LoadSpec(
        entry_size=entry_size,
        ledgers=ledgers,
        writers=writers,
        in_flight=in_flight,
        batch=batch,
        rate=target_rate,
        duration_s=duration,
        warmup_s=warmup,
        create_concurrency=create_concurrency,
    )
    quorum = Quorum(ensemble, write_quorum, ack_quorum)
    if compare is Compare.TRACING_OFF and (gateway or data_dir):
        _fail("--compare tracing-off starts two clusters of its own: no --gateway/--data-dir")
    tracing_on = compare is Compare.TRACING_OFF
    tracing_off_runs = None
    if tracing_on:
        # First, before this process holds a tracer provider: a fork with a preexec function
        # (starting the cluster's servers) runs the provider's at-fork hook in the child.
        off = {"OTEL_SDK_DISABLED": "true"}
        with cluster_access(None, None, bookies, None, extra_env=off) as access:
            side = Side(make_target(via, access, quorum), "quire, tracing off", _known(access))
            (tracing_off_runs,) = _run(_measure([side], spec, repeat))
    with (
        cluster_access(gateway, data_dir, bookies, grpc_address) as access,
        _bench_edge(access if tracing_on and via is Via.INPROCESS else None),
        contextlib.ExitStack() as stack,
    ):
        settings = {
            "entry_size": entry_size,
            "ledgers": ledgers,
            "writers": writers,
            "in_flight": in_flight,
            "batch": batch,
            "ensemble": ensemble,
            "write_quorum": write_quorum,
            "ack_quorum": ack_quorum,
            "rate": rate,
            "duration_s": duration,
            "warmup_s": warmup,
            "via": via.value,
            "compare": compare.value,
            "repeat": repeat,
            "cluster": access.description,
        }
        machine = machine_info(access.fsync)
        target = make_target(via, access, quorum, edge_ratio() if tracing_on else 0.0)
        sides = [Side(target, f"quire ({via.value})", _known(access))]
        if compare is Compare.JETSTREAM:
            js_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="quire-bench-js-"))
            sides.append(Side(JetStreamTarget(Path(js_dir)), "jetstream (R3, sync always)"))
            settings["jetstream"] = "3 nats-servers, file stream, replicas 3, sync_interval always"
        elif compare is Compare.ONE_LEDGER:
            # The Pulsar shape's reference: the same total rate from one fast writer, with
            # the window of all the writers together (so only the ledger count differs).
            one = replace(spec, ledgers=1, writers=1, in_flight=in_flight * writers)
            one_target = make_target(via, access, quorum)
            sides.append(Side(one_target, "quire, 1 ledger", _known(access), one))
        elif tracing_on:
            settings["tracing"] = (
                f"on: {edge_ratio():g} of the requests traced (the gateway's parent-based "
                "trace-id ratio; in-process, the bench draws them), spans stored under the "
                "data dir; off: OTEL_SDK_DISABLED=true; each on a fresh cluster, off first"
            )
        measured = _run(_measure(sides, spec, repeat))
    quire_runs, compared_runs = measured[0], (measured[1] if len(measured) > 1 else None)
    if compare is Compare.ONE_LEDGER:
        for result in quire_runs:
            result.target = f"{ledgers:,} ledgers"
        for result in compared_runs or []:
            result.target = "1 ledger"
    if tracing_off_runs is not None:
        compared_runs = tracing_off_runs
        for result in quire_runs:
            result.target = "tracing on"
        for result in compared_runs:
            result.target = "tracing off"
    machine["load_average_at_end"] = load_average()
    compared_as = {Compare.ONE_LEDGER: "one_ledger", Compare.TRACING_OFF: "tracing_off"}.get(
        compare, "jetstream"
    )
    report = report_json(settings, machine, quire_runs, compared_runs, compared_as)
    print_summary(console, report)
    if json_path is not None:
        write_json(json_path, report)
        console.print(f"JSON written to {json_path}")
    if plot is not None:
        results = [median_run(quire_runs)] + ([median_run(compared_runs)] if compared_runs else [])
        write_plot(plot, results, f"quire bench: {entry_size} B entries, {via.value}")
        console.print(f"plot written to {plot}")
    if any(result.entries == 0 for result in quire_runs):
        raise typer.Exit(1)


@app.command()
def recovery(
    entries: Annotated[int, typer.Option(min=1, help="Entries in the ledger to recover.")] = 10_000,
    entry_size: Annotated[int, typer.Option(min=1, help="Bytes per entry.")] = 1024,
    runs: Annotated[int, typer.Option(min=1, max=100, help="Ledgers recovered, one by one.")] = 3,
    ensemble: Annotated[int, typer.Option(min=1)] = 3,
    write_quorum: Annotated[int, typer.Option(min=1)] = 3,
    ack_quorum: Annotated[int, typer.Option(min=1)] = 2,
    json_path: Annotated[Path | None, typer.Option("--json")] = None,
    bookies: Annotated[int, typer.Option(min=1, max=64)] = 4,
    data_dir: Annotated[Path | None, typer.Option(show_default=False)] = None,
) -> None:
    """Time to recover (fence, read forward, close) an open ledger of N entries, through the
    in-process protocol driver: the writer stops without closing, another client recovers."""
    quorum = Quorum(ensemble, write_quorum, ack_quorum)
    with cluster_access(None, data_dir, bookies, None) as access:
        machine = machine_info(access.fsync)
        timings_ms = _run(_recoveries(access.settings, quorum, entries, entry_size, runs))
    machine["load_average_at_end"] = load_average()
    report = {
        "settings": {
            "entries": entries,
            "entry_size": entry_size,
            "ensemble": ensemble,
            "write_quorum": write_quorum,
            "ack_quorum": ack_quorum,
            "runs": runs,
            "cluster": access.description,
        },
        "machine": machine,
        "recovery": {
            "runs_ms": [round(t, 1) for t in timings_ms],
            "median_ms": round(statistics.median(timings_ms), 1),
            "max_ms": round(max(timings_ms), 1),
        },
    }
    console.print(
        f"recovery of a {entries:,}-entry ledger ({entry_size} B entries, "
        f"E{ensemble}/Qw{write_quorum}/Qa{ack_quorum}): median "
        f"{report['recovery']['median_ms']} ms, runs {report['recovery']['runs_ms']} ms"
    )
    if json_path is not None:
        write_json(json_path, report)


async def _recoveries(
    settings: QuireSettings, quorum: Quorum, entries: int, entry_size: int, runs: int
) -> list[float]:
    writer = InProcessTarget(settings, quorum)
    recoverer = InProcessTarget(settings, quorum)  # "another gateway": holds no writer handle
    await writer.open()
    await recoverer.open()
    timings_ms = []
    try:
        payloads = [os.urandom(entry_size)] * 100
        for _ in range(runs):
            ledger_id = await writer.create()
            handle = writer.writers[ledger_id]
            window = asyncio.Semaphore(16)

            async def append(count: int, handle=handle, window=window) -> None:
                async with window:
                    await handle.append(payloads[:count])

            await asyncio.gather(
                *(append(min(100, entries - start)) for start in range(0, entries, 100))
            )
            started = time.perf_counter()
            recovered = await recoverer.recover(ledger_id)
            timings_ms.append((time.perf_counter() - started) * 1000)
            if recovered.last_entry_id != entries - 1:
                raise RuntimeError(
                    f"recovery of ledger {ledger_id} found last entry "
                    f"{recovered.last_entry_id}, expected {entries - 1}"
                )
            # Fenced now: the writer is done (an abort also stops its deadline timer).
            writer.writers.pop(ledger_id).abort(ApiCodes.LEDGER_FENCED, "recovered")
    finally:
        await writer.aclose()
        await recoverer.aclose()
    return timings_ms


GATEWAY_VIA_HELP = "Client path to the gateway, which then holds the ledgers."


@app.command()
def idle(
    ledgers: Annotated[int, typer.Option(min=1, help="Open idle ledgers to measure.")] = 1_000,
    seconds: Annotated[float, typer.Option(min=0.5, help="Each CPU measurement window.")] = 10.0,
    settle: Annotated[
        float, typer.Option(min=0.0, help="Seconds after the appends before measuring.")
    ] = 2.0,
    concurrency: Annotated[
        int, typer.Option(min=1, help="Ledgers created (and appended to) at once.")
    ] = 32,
    via: Annotated[Via, typer.Option(help=GATEWAY_VIA_HELP)] = Via.HTTP,
    json_path: Annotated[Path | None, typer.Option("--json")] = None,
    bookies: Annotated[int, typer.Option(min=1, max=64)] = 4,
    data_dir: RunningClusterOption = None,
) -> None:
    """Idle CPU of every process of the cluster (from /proc, % of one core, with children)
    for SECONDS with no ledgers of ours, then with N open ledgers of one entry each
    (through the gateway); and the gateway's RSS before and after, so its memory per open
    ledger. The ledgers are closed at the end."""
    if via is Via.INPROCESS:
        _fail("quire bench idle measures ledgers the gateway holds: --via http or grpc")
    spec = IdleSpec(ledgers, seconds, settle, concurrency=concurrency)
    with cluster_access(None, data_dir, bookies, None) as access:
        if not access.processes or access.gateway_pid is None:
            _fail(f"{data_dir}/cluster.json lists no processes to measure")
        assert access.gateway_pid is not None
        target = make_target(via, access, Quorum(3, 3, 2))
        machine = machine_info(access.fsync)

        async def measure() -> dict[str, Any]:
            await target.open()
            try:
                return await measure_idle(
                    target, access.processes, access.gateway_pid, spec, err_console.print
                )
            finally:
                await target.aclose()

        figures = _run(measure())
    machine["load_average_at_end"] = load_average()
    report = {"settings": {"via": via.value, "cluster": access.description}, "machine": machine}
    report |= figures
    print_idle(console, report)
    if json_path is not None:
        write_json(json_path, report)
    if figures["append_errors"]:
        raise typer.Exit(1)


@app.command("open-ledgers")
def open_ledgers(
    total: Annotated[int, typer.Option(min=1, help="Stop once this many ledgers are open.")] = (
        10_000
    ),
    per_round: Annotated[int, typer.Option(min=1, help="New ledgers per round.")] = 200,
    clients: Annotated[
        int, typer.Option(min=1, help="Concurrent clients, each creating then writing.")
    ] = 16,
    batch: Annotated[int, typer.Option(min=1, help="Entries in each new ledger's append.")] = 4,
    entry_size: Annotated[int, typer.Option(min=1, help="Bytes per entry.")] = 1024,
    max_round_time: Annotated[
        float | None,
        typer.Option(min=0.1, help="Stop after a round slower than this (s).", show_default=False),
    ] = None,
    via: Annotated[
        Via,
        typer.Option(
            help="Client path (inprocess: the ledgers are held here, not in the gateway)."
        ),
    ] = Via.HTTP,
    json_path: Annotated[Path | None, typer.Option("--json")] = None,
    bookies: Annotated[int, typer.Option(min=1, max=64)] = 4,
    data_dir: RunningClusterOption = None,
) -> None:
    """Rounds of new ledgers, each created and written with one batch, until TOTAL are open:
    per round the open ledgers before it, its time, create and append p50/p99. Is a new
    ledger as fast with 10,000 open as with 10? The ledgers are closed at the end."""
    spec = RoundsSpec(total, per_round, clients, batch, entry_size, max_round_time)
    with cluster_access(None, data_dir, bookies, None) as access:
        target = make_target(via, access, Quorum(3, 3, 2))
        machine = machine_info(access.fsync)
        table = rounds_table()
        err_console.print(" | ".join(ROUND_COLUMNS), highlight=False)

        def on_round(row: dict[str, Any]) -> None:
            cells = rounds_row(row)
            err_console.print(" | ".join(cells), highlight=False)  # progress, as it goes
            table.add_row(*cells)

        async def measure() -> dict[str, Any]:
            await target.open()
            try:
                return await run_rounds(target, spec, on_round)
            finally:
                await target.aclose()

        figures = _run(measure())
    machine["load_average_at_end"] = load_average()
    settings = {
        "per_round": per_round,
        "clients": clients,
        "batch": batch,
        "entry_size": entry_size,
        "via": via.value,
        "cluster": access.description,
    }
    report = {"settings": settings, "machine": machine} | figures
    console.print(table)
    console.print(f"{figures['open_ledgers']:,} ledgers open; stopped: {figures['stopped']}")
    if json_path is not None:
        write_json(json_path, report)
    if any(row["errors"] for row in figures["rounds"]):
        first = next(row["first_error"] for row in figures["rounds"] if row["errors"])
        err_console.print(f"[red]errors in the rounds; first: {first}[/red]")
        raise typer.Exit(1)


@app.command()
def read(
    entries: Annotated[int, typer.Option(min=1, help="Entries in the ledger read back.")] = (
        100_000
    ),
    size: Annotated[int, typer.Option("--size", "--entry-size", min=1, help="Bytes per entry.")] = (
        1024
    ),
    batch: Annotated[
        int, typer.Option(min=1, help="Entries per append when writing; per JetStream fetch.")
    ] = 500,
    ensemble: Annotated[int, typer.Option(min=1, help="Ensemble size E.")] = 3,
    write_quorum: Annotated[int, typer.Option(min=1, help="Write quorum Qw.")] = 3,
    ack_quorum: Annotated[int, typer.Option(min=1, help="Ack quorum Qa.")] = 2,
    via: Annotated[Via, typer.Option(help="Client path.")] = Via.INPROCESS,
    tail: Annotated[
        bool, typer.Option("--tail", help="Tailing: one writer at --rate, --readers following.")
    ] = False,
    rate: Annotated[float, typer.Option(min=1, help="--tail: entries/s, one per append.")] = 1000,
    readers: Annotated[
        int,
        typer.Option(
            min=1, help="--tail: readers following the LAC; --beside-writes: catch-up readers."
        ),
    ] = 4,
    duration: Annotated[
        float,
        typer.Option(min=0.1, help="--tail: seconds of writing; --beside-writes: of each run."),
    ] = 10.0,
    beside_writes: Annotated[
        bool,
        typer.Option(
            "--beside-writes",
            help="Add latency at a write rate alone, then with --readers catch-up readers "
            "each reading a cold ledger of ENTRIES as fast as they can (issue 20's target 4).",
        ),
    ] = False,
    write_rate: Annotated[
        float | None,
        typer.Option(
            min=1,
            help="--beside-writes: the writer's entries/s (default: half the peak, measured "
            "first with its window).",
            show_default=False,
        ),
    ] = None,
    in_flight: Annotated[
        int, typer.Option(min=1, help="--beside-writes: the writer's window.")
    ] = 64,
    warmup: Annotated[
        float, typer.Option(min=0.0, help="--beside-writes: seconds before each measurement.")
    ] = 2.0,
    readers_nice: Annotated[
        int,
        typer.Option(
            min=0,
            max=19,
            help="--beside-writes: the readers' process's nice value (readers on other "
            "machines take no CPU from this one).",
        ),
    ] = 0,
    compare: Annotated[
        ReadCompare, typer.Option(help="Also write and read back a 3-node JetStream stream.")
    ] = ReadCompare.NONE,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the results as JSON here.")
    ] = None,
    bookies: Annotated[
        int, typer.Option(min=1, max=64, help="Bookies of the cluster bench starts.")
    ] = 4,
    data_dir: RunningClusterOption = None,
    grpc_address: GrpcAddressOption = None,
) -> None:
    """Catch-up reads: write one ledger of ENTRIES, close it, read it back whole, cold (not
    in the ledgerstores' caches nor in the page cache) then warm: entries/s, MB/s, the wait
    for each batch. With --tail: end-to-end lag (append acknowledged to entry read) of
    readers following a writer. Needs the cluster's files: its own cluster or --data-dir."""
    from quire.bench import reads

    if not 1 <= ack_quorum <= write_quorum <= ensemble:
        _fail("need 1 <= ack-quorum <= write-quorum <= ensemble")
    if tail and compare is not ReadCompare.NONE:
        _fail("--tail measures Quire alone: no --compare")
    if beside_writes and (tail or compare is not ReadCompare.NONE):
        _fail("--beside-writes measures Quire alone: no --tail, no --compare")
    quorum = Quorum(ensemble, write_quorum, ack_quorum)
    spec = reads.ReadSpec(entries=entries, entry_size=size, batch=batch)
    with cluster_access(None, data_dir, bookies, grpc_address) as access:
        if access.data_dir is None or not access.bookie_ids:
            _fail(f"{data_dir}/cluster.json lists no bookies")
        assert access.data_dir is not None
        settings: dict[str, Any] = {
            "ensemble": ensemble,
            "write_quorum": write_quorum,
            "ack_quorum": ack_quorum,
            "via": via.value,
            "cluster": access.description,
        }
        machine = machine_info(access.fsync)
        if beside_writes:
            from quire.bench import beside

            beside_spec = beside.BesideSpec(
                readers, entries, size, write_rate, in_flight, duration, warmup, batch, readers_nice
            )
            settings |= {
                "beside_writes": True,
                "readers": readers,
                "entries": entries,
                "size": size,
                "write_rate": write_rate or "half the peak",
                "in_flight": in_flight,
                "duration_s": duration,
                "warmup_s": warmup,
                "readers_nice": readers_nice,
            }
            directories = [access.data_dir / bookie_id for bookie_id in access.bookie_ids]
            figures = {
                "beside_writes": _run(
                    beside.beside_writes(
                        access.settings,
                        quorum,
                        make_target(via, access, quorum),
                        beside_spec,
                        directories,
                        reads.LedgerstoreStats(access.ledgerstore_metrics),
                        beside.JournalSyncs(access.journal_metrics),
                        _known(access),
                        lambda message: err_console.print(message, highlight=False),
                    )
                )
            }
        elif tail:
            settings |= {"rate": rate, "readers": readers, "duration_s": duration, "size": size}
            side: reads.Tail
            if via is Via.INPROCESS:
                side = reads.InProcessTail(access.settings, quorum)
            else:
                address = _gateway_address(via, access)
                side = reads.ClientTail(via.value, address, quorum)
            tail_spec = reads.TailSpec(rate, readers, duration, size)
            figures = {"tail": _run(_tailing(side, tail_spec))}
        else:
            settings |= {"entries": entries, "size": size, "batch": batch}
            figures = {"quire": _run(_catch_up(via, access, quorum, spec))}
            if compare is ReadCompare.JETSTREAM:
                with tempfile.TemporaryDirectory(prefix="quire-bench-js-") as js_dir:
                    js = reads.JetStreamReads(Path(js_dir), batch)
                    figures["jetstream"] = _run(
                        _reads(js, spec, [Path(js_dir)], js.forget, None, "jetstream")
                    )
                settings["jetstream"] = (
                    "3 nats-servers, file stream, replicas 3, one pull consumer, no acks"
                )
    machine["load_average_at_end"] = load_average()
    report = {"settings": settings, "machine": machine} | figures
    print_reads(console, report)
    if json_path is not None:
        write_json(json_path, report)
        console.print(f"JSON written to {json_path}")
    if _read_errors(report):
        raise typer.Exit(1)


def _gateway_address(via: Via, access: ClusterAccess) -> str:
    address = access.http if via is Via.HTTP else access.grpc
    if not address:
        _fail(f"--via {via.value} needs the gateway's address: --data-dir or --grpc-address")
    return address


async def _catch_up(via: Via, access: ClusterAccess, quorum: Quorum, spec) -> dict[str, Any]:
    """Quire's write, cold and warm reads, with its ledgerstores' counters."""
    from quire.bench import reads

    assert access.data_dir is not None
    side: reads.Reads
    if via is Via.INPROCESS:
        side = reads.InProcessReads(access.settings, quorum)
    else:
        side = reads.ClientReads(via.value, _gateway_address(via, access), quorum, spec.batch)
    # Each bookie's files (entry logs, index, journal) are in <data dir>/<bookie id>.
    directories = [access.data_dir / bookie_id for bookie_id in access.bookie_ids]
    stats = reads.LedgerstoreStats(access.ledgerstore_metrics)
    # Every entry goes to write_quorum bookies: applied by all of them, it is flushed once
    # their write caches are empty.
    expected = await stats.applied_entries() + spec.entries * quorum.write_quorum

    async def forget() -> None:
        await stats.wait_flushed(expected)

    label = f"quire ({via.value})"
    return await _reads(side, spec, directories, forget, stats, label)


async def _reads(side, spec, directories, forget, stats, label: str) -> dict[str, Any]:
    from quire.bench import reads

    def say(message: str) -> None:
        err_console.print(f"{label}: {message}", highlight=False)

    await side.open()
    try:
        figures = await reads.catch_up(side, spec, directories, forget, stats, say)
    finally:
        await side.aclose()
    return {"label": label} | figures


async def _tailing(side, spec) -> dict[str, Any]:
    from quire.bench import reads

    await side.open()
    try:
        return await reads.tailing(side, spec, err_console.print)
    finally:
        await side.aclose()


def _read_errors(report: dict[str, Any]) -> bool:
    if "beside_writes" in report:
        figures = report["beside_writes"]
        runs = (figures["write_only"], figures["with_readers"])
        return bool(figures["readers"]["errors"] or any(run["errors"] for run in runs))
    if "tail" in report:
        return bool(report["tail"]["errors"])
    passes = [report[s][p] for s in ("quire", "jetstream") if s in report for p in ("cold", "warm")]
    return any(figures["error"] for figures in passes)


@app.command()
def autorecovery(
    ledgers: Annotated[int, typer.Option(min=1, help="Ledgers written before the loss.")] = 200,
    entries: Annotated[int, typer.Option(min=1, help="Entries in each ledger.")] = 500,
    entry_size: Annotated[int, typer.Option(min=1, help="Bytes per entry.")] = 1024,
    open_ledgers: Annotated[
        int, typer.Option(min=0, help="Of the ledgers, how many are left open (writer quiet).")
    ] = 20,
    foreground_rate: Annotated[
        float,
        typer.Option(min=0.0, help="Entries/s of a writer running through it all (0: none)."),
    ] = 100.0,
    ensemble: Annotated[int, typer.Option(min=1)] = 3,
    write_quorum: Annotated[int, typer.Option(min=1)] = 3,
    ack_quorum: Annotated[int, typer.Option(min=1)] = 2,
    bookies: Annotated[int, typer.Option(min=2, max=64)] = 4,
    lease_ms: Annotated[
        int,
        typer.Option(min=100, help="The bookies' registration lease (metadata.bookie_lease_ms)."),
    ] = 3_000,
    grace_ms: Annotated[
        int,
        typer.Option(
            min=0,
            help="Before an open ledger is fenced and re-replicated "
            "(replicator.open_ledger_rereplication_grace_period_ms).",
        ),
    ] = 5_000,
    timeout: Annotated[
        float, typer.Option(min=1.0, help="Seconds allowed for the repair.")
    ] = 600.0,
    json_path: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    """Kill a bookie for good (SIGKILL, not restarted) after writing LEDGERS ledgers, and
    time its re-replication: to the bookie seen lost, to the auditor's first mark, to every
    ledger whole again (open ones fenced and closed); the copy rate; then every entry is
    read back and compared. Always on a cluster of its own (it kills one of its bookies):
    the lease and grace period are set short for it, other settings from QUIRE_* variables."""
    if open_ledgers > ledgers:
        _fail("--open-ledgers cannot exceed --ledgers")
    if bookies <= ensemble:
        _fail("the lost bookie needs a replacement: --bookies must exceed --ensemble")
    quorum = Quorum(ensemble, write_quorum, ack_quorum)
    spec = AutorecoverySpec(ledgers, entries, entry_size, open_ledgers, timeout, foreground_rate)
    env = {
        "QUIRE_METADATA__BOOKIE_LEASE_MS": str(lease_ms),
        "QUIRE_METADATA__BOOKIE_HEARTBEAT_MS": str(max(50, lease_ms // 5)),
        "QUIRE_REPLICATOR__OPEN_LEDGER_REREPLICATION_GRACE_PERIOD_MS": str(grace_ms),
    }
    # Its victim must stay lost: the cluster does not restart it (nor any other process).
    # A failed repair is diagnosed from the replicator's and auditor's logs: kept.
    with cluster_access(
        None, None, bookies, None, extra_env=env, restart=False, keep_on_error=True
    ) as access:
        machine = machine_info(access.fsync)
        assert access.data_dir is not None
        figures = _run(
            run_autorecovery(
                access.settings,
                quorum,
                spec,
                access.processes,
                err_console.print,
                access.data_dir,
            )
        )
    machine["load_average_at_end"] = load_average()
    report = {
        "settings": {
            "ledgers": ledgers,
            "entries": entries,
            "entry_size": entry_size,
            "open_ledgers": open_ledgers,
            "foreground_rate": foreground_rate,
            "ensemble": ensemble,
            "write_quorum": write_quorum,
            "ack_quorum": ack_quorum,
            "bookies": bookies,
            "bookie_lease_ms": lease_ms,
            "open_ledger_rereplication_grace_period_ms": grace_ms,
        },
        "machine": machine,
        "autorecovery": figures,
    }
    check, fg = figures["check"], figures["foreground"]
    console.print(
        f"lost {figures['victim']} holding {figures['entries_on_victim']:,} entries "
        f"({figures['mb_on_victim']} MB of payload) of {figures['ledgers_on_victim']} ledgers\n"
        f"  seen lost after {figures['lost_after_s']} s, first mark after "
        f"{figures['first_mark_after_s']} s, closed ledgers whole after "
        f"{figures['closed_repaired_after_s']} s, all whole after {figures['repaired_after_s']} s\n"
        f"  copy rate (closed ledgers, first mark to whole): {figures['copy_mb_per_s']} MB/s\n"
        f"  foreground adds at {foreground_rate}/s: before the loss {fg['before_kill']}, "
        f"during the copy {fg['during_copy']}\n"
        f"  read back: {check['entries_read']:,} entries, ledger states {check['states']}, "
        f"problems: {len(check['problems'])}"
    )
    for problem in check["problems"]:
        console.print(f"  [red]{problem}[/red]", highlight=False)
    if json_path is not None:
        write_json(json_path, report)
    if check["problems"]:
        raise typer.Exit(1)


@app.command()
def gc(
    ledgers: Annotated[int, typer.Option(min=1, help="Ledgers written interleaved.")] = 200,
    entries: Annotated[int, typer.Option(min=1, help="Entries in each ledger.")] = 500,
    entry_size: Annotated[int, typer.Option(min=1, help="Bytes per entry.")] = 1024,
    batch: Annotated[
        int, typer.Option(min=1, help="Entries appended to a ledger at its turn.")
    ] = 10,
    log_size_limit: Annotated[
        int,
        typer.Option(
            min=4096, help="The bookies' entry-log size limit (ledgerstore.log_size_limit_bytes)."
        ),
    ] = 4 * 1024 * 1024,
    compaction_rate: Annotated[
        int,
        typer.Option(
            min=1,
            help="Entries/s compaction copies (ledgerstore.compaction_rate_by_entries).",
        ),
    ] = 1_000,
    foreground_rate: Annotated[
        float,
        typer.Option(
            min=0.0, help="Entries/s of the foreground writer (0: no latency comparison)."
        ),
    ] = 2_000.0,
    duration: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Seconds of each foreground run (long enough for the compaction: "
            "the JSON's gc_outlasted_run says if it was not).",
        ),
    ] = 20.0,
    ensemble: Annotated[int, typer.Option(min=1)] = 3,
    write_quorum: Annotated[int, typer.Option(min=1)] = 3,
    ack_quorum: Annotated[int, typer.Option(min=1)] = 2,
    bookies: Annotated[int, typer.Option(min=1, max=64)] = 4,
    timeout: Annotated[
        float, typer.Option(min=1.0, help="Seconds allowed for one GC run on every bookie.")
    ] = 600.0,
    json_path: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    """Write LEDGERS ledgers interleaved over small entry logs, delete 9 in 10 through the
    HTTP API, force garbage collection with major compaction on every bookie: entry-log bytes
    before and after against the live data, per bookie and in all, and how long it took;
    every kept ledger is read back. Then a foreground writer's add latency at FOREGROUND_RATE
    without compaction and while a compaction of freshly fragmented data runs. Always on a
    cluster of its own (it sets the log size limit and the compaction rate; the periodic GC
    is set to once an hour, so only the forced runs happen), other settings from QUIRE_*."""
    from quire.bench.gc import GcSpec, run_gc

    if not 1 <= ack_quorum <= write_quorum <= ensemble <= bookies:
        _fail("need 1 <= ack-quorum <= write-quorum <= ensemble <= bookies")
    quorum = Quorum(ensemble, write_quorum, ack_quorum)
    spec = GcSpec(ledgers, entries, entry_size, batch, foreground_rate, duration, timeout)
    env = {
        "QUIRE_LEDGERSTORE__LOG_SIZE_LIMIT_BYTES": str(log_size_limit),
        "QUIRE_LEDGERSTORE__COMPACTION_RATE_BY_ENTRIES": str(compaction_rate),
        "QUIRE_LEDGERSTORE__GC_WAIT_TIME_MS": str(3_600_000),
    }
    with cluster_access(None, None, bookies, None, extra_env=env) as access:
        assert access.data_dir is not None
        machine = machine_info(access.fsync)
        bookie_dirs = {b: access.data_dir / b for b in access.bookie_ids}
        figures = _run(
            run_gc(
                access.settings,
                access.http,
                bookie_dirs,
                access.ledgerstore_metrics,
                quorum,
                spec,
                err_console.print,
            )
        )
    machine["load_average_at_end"] = load_average()
    report = {
        "settings": {
            "ledgers": ledgers,
            "entries": entries,
            "entry_size": entry_size,
            "batch": batch,
            "log_size_limit_bytes": log_size_limit,
            "compaction_rate_by_entries": compaction_rate,
            "foreground_rate": foreground_rate,
            "duration_s": duration,
            "ensemble": ensemble,
            "write_quorum": write_quorum,
            "ack_quorum": ack_quorum,
            "bookies": bookies,
        },
        "machine": machine,
        "gc": figures,
    }
    _print_gc(figures)
    if json_path is not None:
        write_json(json_path, report)
        console.print(f"JSON written to {json_path}")
    if figures["reclaim"]["check"]["problems"]:
        raise typer.Exit(1)


def _print_gc(figures: dict[str, Any]) -> None:
    from rich.table import Table

    reclaim, cost = figures["reclaim"], figures["cost"]
    table = Table(title="entry-log bytes (MB) around a forced GC with major compaction")
    for column in ("bookie", "before", "live", "after", "after/live", "logs", "GC s"):
        table.add_column(column, justify="right")
    mb = 1e6
    for bookie_id, row in reclaim["bookies"].items():
        table.add_row(
            bookie_id,
            f"{row['entry_log_bytes_before'] / mb:.2f}",
            f"{row['live_bytes'] / mb:.2f}",
            f"{row['entry_log_bytes_after'] / mb:.2f}",
            f"{row['after_over_live']}",
            f"{row['entry_logs_before']} -> {row['entry_logs_after']}",
            f"{row['ended_after_s']}",
        )
    table.add_row(
        "all",
        f"{reclaim['entry_log_bytes_before'] / mb:.2f}",
        f"{reclaim['live_bytes'] / mb:.2f}",
        f"{reclaim['entry_log_bytes_after'] / mb:.2f}",
        f"{reclaim['after_over_live']}",
        "",
        f"{reclaim['gc_s']}",
    )
    console.print(table)
    check = reclaim["check"]
    console.print(
        f"deleted {reclaim['ledgers_deleted']} ledgers, kept {reclaim['ledgers_kept']}; read back "
        f"{check['entries_read']:,} entries, problems: {len(check['problems'])}"
    )
    for problem in check["problems"]:
        console.print(f"  [red]{problem}[/red]", highlight=False)
    if cost:
        console.print(
            f"foreground adds at {cost['rate']:g}/s: without compaction "
            f"{cost['without_compaction']}; during compaction {cost['during_compaction']} "
            f"(whole run {cost['with_compaction_whole_run']}; GC took {cost['gc_s']} s)"
        )
