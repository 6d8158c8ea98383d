"""`quire analytics sla`: the durability SLA tables and report (analytics/sla/job.py), run in
this process on a local Spark (or the --master given). The options are the job's own, and
mistakes in them are reported before Spark starts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from analytics.sla.options import DEFAULT_TARGET_MS, DEFAULT_WINDOW_S
from quire.commands.common import DEFAULT_DATA_DIR

app = typer.Typer(help="Spark analytics over the cluster's event stream.", no_args_is_help=True)


@app.command("sla")
def sla(
    output: Annotated[
        str, typer.Option("--output", help="Directory of the Parquet tables and report.html.")
    ],
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help=f"A `quire up` data dir: read its event stream (default {DEFAULT_DATA_DIR}).",
            show_default=False,
        ),
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="The period's start, ISO 8601 (UTC without a zone).")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="The period's end, ISO 8601: later events are ignored.")
    ] = None,
    master: Annotated[
        str | None, typer.Option(help="Spark master URL (default local[*]).", show_default=False)
    ] = None,
    input_: Annotated[
        str | None,
        typer.Option("--input", help="JSON-lines files of events (a file, directory or glob)."),
    ] = None,
    url: Annotated[str | None, typer.Option(help="NATS URL of the event stream.")] = None,
    user: Annotated[str | None, typer.Option(help="NATS user (with --url).")] = None,
    password: Annotated[str | None, typer.Option(help="NATS password (with --url).")] = None,
    creds: Annotated[str | None, typer.Option(help="NATS .creds file (with --url).")] = None,
    stream: Annotated[
        str | None,
        typer.Option(help="The event stream (default QUIRE_EVENTS).", show_default=False),
    ] = None,
    target_ms: Annotated[
        float, typer.Option("--target-ms", help="The add latency target, ms.")
    ] = DEFAULT_TARGET_MS,
    window: Annotated[
        int, typer.Option(help="ack_latency's and ensemble_changes' window, seconds.")
    ] = DEFAULT_WINDOW_S,
    follow: Annotated[
        bool, typer.Option("--follow", help="Keep the tables current from the stream.")
    ] = False,
    checkpoint: Annotated[
        str | None,
        typer.Option(
            help="--follow's checkpoint dir (default OUTPUT/_checkpoint).", show_default=False
        ),
    ] = None,
    refresh: Annotated[
        float | None,
        typer.Option(
            help="--follow: seconds between rebuilds of the tables (default 60).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Durability SLA tables (Parquet, OUTPUT/<table>/) and OUTPUT/report.html from the
    cluster's events: add latency SLO, exposure after bookie losses, recoveries, ensemble
    changes, bookie availability, GC reclaim lag, the input's completeness. The tables are
    documented in analytics/README.md."""
    argv = ["--output", output, "--target-ms", repr(target_ms), "--window", str(window)]
    given = {
        "--stream": stream,
        "--refresh": None if refresh is None else repr(refresh),
        "--since": since,
        "--until": until,
        "--master": master,
        "--input": input_,
        "--url": url,
        "--user": user,
        "--password": password,
        "--creds": creds,
        "--checkpoint": checkpoint,
        "--data-dir": None if data_dir is None else str(data_dir),
    }
    for option, value in given.items():
        if value is not None:
            argv += [option, value]
    if follow:
        argv.append("--follow")
    # Imported here: PySpark is slow to import, and only this command needs it.
    from analytics.sla.job import main

    raise typer.Exit(main(argv))
