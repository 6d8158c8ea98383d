"""`quire bench` (and `quire bench recovery`): the command line around the load runner.

Without --gateway/--data-dir it starts its own cluster (the `quire up` Cluster class) in a
temporary data dir and removes it afterwards; with them it uses the running one."""

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
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from quire.bench.load import LoadResult, LoadSpec, run_load
from quire.bench.report import (
    load_average,
    machine_info,
    print_summary,
    report_json,
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
from shared.config import QuireSettings

console = Console()
err_console = Console(stderr=True)

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


@dataclass
class ClusterAccess:
    """Where the cluster under test answers."""

    http: str
    grpc: str
    settings: QuireSettings  # NATS url and credentials for the in-process core
    fsync: str
    description: str


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
    gateway: str | None, data_dir: Path | None, bookies: int, grpc_address: str | None
) -> Iterator[ClusterAccess]:
    """The running cluster that --gateway/--data-dir name, else one started here."""
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
    )
    cluster = Cluster(config, out=io.StringIO(), err=io.StringIO())
    err_console.print(f"starting a {bookies}-bookie cluster in {config.data_dir} ...")
    try:
        cluster.start()
        user, password = cluster.nats_credentials or ("", "")
        settings = QuireSettings(nats_url=cluster.nats_url, nats_user=user, nats_password=password)
        yield ClusterAccess(
            cluster.http_url,
            cluster.grpc_address,
            settings,
            _fsync_mode(dict(os.environ)),
            f"started by quire bench ({bookies} bookies)",
        )
    finally:
        cluster.stop()
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
    )


def make_target(via: Via, access: ClusterAccess, quorum: Quorum) -> Target:
    if via is Via.INPROCESS:
        return InProcessTarget(access.settings, quorum)
    if via is Via.HTTP:
        if not access.http:
            _fail("--via http needs the gateway: --gateway URL or --data-dir")
        return ClientTarget("http", access.http, quorum)
    if not access.grpc:
        _fail("--via grpc needs the gateway's gRPC address: --grpc-address or --data-dir")
    return ClientTarget("grpc", access.grpc, quorum)


async def _measure(target: Target, spec: LoadSpec, label: str) -> LoadResult:
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

        await target.open()
        try:
            return await run_load(target, spec, update)
        finally:
            await target.aclose()


def _run(coro):
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover (a dependency; plain asyncio works too)
        return asyncio.run(coro)


@app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    entry_size: Annotated[int, typer.Option(min=1, help="Bytes per entry.")] = 1024,
    ledgers: Annotated[int, typer.Option(min=1, help="Ledgers written at once.")] = 1,
    writers: Annotated[
        int, typer.Option(min=1, help="Concurrent writers (spread over the ledgers).")
    ] = 1,
    in_flight: Annotated[
        int, typer.Option(min=1, help="Appends each writer keeps outstanding (its window).")
    ] = 64,
    batch: Annotated[int, typer.Option(min=1, help="Entries per append call.")] = 1,
    ensemble: Annotated[int, typer.Option(min=1, help="Ensemble size E.")] = 3,
    write_quorum: Annotated[int, typer.Option(min=1, help="Write quorum Qw.")] = 3,
    ack_quorum: Annotated[int, typer.Option(min=1, help="Ack quorum Qa.")] = 2,
    rate: Annotated[str, typer.Option(help="Target entries/s over all writers, or `max`.")] = "max",
    duration: Annotated[float, typer.Option(min=0.1, help="Measured seconds.")] = 30.0,
    warmup: Annotated[float, typer.Option(min=0.0, help="Seconds run before measuring.")] = 5.0,
    via: Annotated[Via, typer.Option(help="Client path.")] = Via.INPROCESS,
    compare: Annotated[
        Compare, typer.Option(help="Also measure a 3-node JetStream cluster, same load.")
    ] = Compare.NONE,
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
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Use the running `quire up` of this data dir.", show_default=False),
    ] = None,
    grpc_address: Annotated[
        str | None, typer.Option(help="The gateway's gRPC host:port.", show_default=False)
    ] = None,
) -> None:
    """Run the load for warm-up + duration seconds; print entries/s, MB/s and add latency
    percentiles (and JetStream's beside them with --compare jetstream)."""
    if ctx.invoked_subcommand is not None:
        return
    if not 1 <= ack_quorum <= write_quorum <= ensemble:
        _fail("need 1 <= ack-quorum <= write-quorum <= ensemble")
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
    )
    quorum = Quorum(ensemble, write_quorum, ack_quorum)
    with cluster_access(gateway, data_dir, bookies, grpc_address) as access:
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
            "cluster": access.description,
        }
        machine = machine_info(access.fsync)
        target = make_target(via, access, quorum)
        quire_result = _run(_measure(target, spec, f"quire ({via.value})"))
        jetstream_result = None
        if compare is Compare.JETSTREAM:
            with tempfile.TemporaryDirectory(prefix="quire-bench-js-") as js_dir:
                js = JetStreamTarget(Path(js_dir))
                jetstream_result = _run(_measure(js, spec, "jetstream (R3, sync always)"))
            settings["jetstream"] = "3 nats-servers, file stream, replicas 3, sync_interval always"
    machine["load_average_at_end"] = load_average()
    report = report_json(settings, machine, quire_result, jetstream_result)
    print_summary(console, report)
    if json_path is not None:
        write_json(json_path, report)
        console.print(f"JSON written to {json_path}")
    if plot is not None:
        results = [quire_result] + ([jetstream_result] if jetstream_result else [])
        write_plot(plot, results, f"quire bench: {entry_size} B entries, {via.value}")
        console.print(f"plot written to {plot}")
    if quire_result.entries == 0:
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
            writer.writers.pop(ledger_id, None)  # fenced now: the writer is done
    finally:
        await writer.aclose()
        await recoverer.aclose()
    return timings_ms
