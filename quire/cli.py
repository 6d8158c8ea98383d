"""The `quire` command line."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from quire.bench import command as bench_commands
from quire.commands import analytics as analytics_commands
from quire.commands import autorecovery as autorecovery_commands
from quire.commands import bookie as bookie_commands
from quire.commands import ledger as ledger_commands
from quire.commands import shell as shell_commands
from quire.commands import trace as trace_commands


class Placement(StrEnum):
    """QUIRE_PLACEMENT__POLICY's values (shared/protocol/placement.py POLICIES)."""

    RANDOM = "random"
    RACKAWARE = "rackaware"
    ZONEAWARE = "zoneaware"


app = typer.Typer(
    name="quire",
    help="Quire: a replicated, append-only ledger store in the shape of Apache BookKeeper.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def up(
    data_dir: Annotated[Path, typer.Option(help="Where every process keeps its files.")] = Path(
        "./quire-data"
    ),
    bookies: Annotated[int, typer.Option(min=1, max=64, help="How many bookies to run.")] = 4,
    gateways: Annotated[
        int,
        typer.Option(
            min=1,
            max=16,
            help="How many gateways to run: the first on --http-port/--grpc-port, the "
            "others on free ports (cluster.json lists them all).",
        ),
    ] = 1,
    http_port: Annotated[int, typer.Option(min=1, max=65535, help="Gateway HTTP port.")] = 7480,
    grpc_port: Annotated[int, typer.Option(min=1, max=65535, help="Gateway gRPC port.")] = 7481,
    no_restart: Annotated[
        bool,
        typer.Option(
            "--no-restart",
            help="Leave a process that dies down (reported only), e.g. for a test that "
            "needs a bookie to stay lost.",
        ),
    ] = False,
    bookie_location: Annotated[
        list[str] | None,
        typer.Option(
            "--bookie-location",
            help="A bookie's network location, BOOKIE=/zone/rack (repeatable), e.g. "
            "bookie-1=/zone-a/rack-1; the others are at /default-zone/default-rack.",
        ),
    ] = None,
    placement_policy: Annotated[
        Placement | None,
        typer.Option(
            help="Ensemble placement of every process (QUIRE_PLACEMENT__POLICY); default: "
            "the environment's, else random.",
        ),
    ] = None,
    bookie_process: Annotated[
        str | None,
        typer.Option(
            help="How each bookie runs: 'cohosted' (journal and ledgerstore in one "
            "process, `python -m services.bookie`, the journal handing its durable records "
            "over in process) or 'separate' (a process each); default: "
            "$QUIRE_BOOKIE_PROCESS, else the cluster's default.",
        ),
    ] = None,
    postgres_standby: Annotated[
        bool,
        typer.Option(
            "--postgres-standby",
            help="Run our PostgreSQL with a synchronous streaming standby (in "
            "DATA_DIR/postgres-standby), also supervised; the metadata service is given "
            "both and uses whichever is the primary (deploy/postgres/README.md).",
        ),
    ] = False,
) -> None:
    """Start a whole cluster on this machine and stay in the foreground.

    NATS and PostgreSQL are started too, unless QUIRE_NATS_URL / QUIRE_DATABASE_URL name
    existing ones. A process that dies is reported and restarted on the same ports and
    data, after a backoff (0.5 s, doubling to 30 s while it keeps dying). Ctrl-C (or
    SIGTERM) stops everything cleanly; running it again on the same data dir brings back
    every ledger and every acknowledged entry.
    """
    from quire.cluster import ClusterConfig, run_up

    database_url = os.environ.get("QUIRE_DATABASE_URL") or None
    if postgres_standby and database_url:
        raise typer.BadParameter(
            "a standby of our own PostgreSQL; QUIRE_DATABASE_URL names another database",
            param_hint="--postgres-standby",
        )
    locations = {}
    for pair in bookie_location or []:
        bookie_id, sep, location = pair.partition("=")
        if not sep:
            raise typer.BadParameter(
                f"{pair!r}: want BOOKIE=/zone/rack", param_hint="--bookie-location"
            )
        locations[bookie_id] = location
    try:
        config = ClusterConfig(
            data_dir=data_dir,
            bookies=bookies,
            gateways=gateways,
            http_port=http_port,
            grpc_port=grpc_port,
            nats_url=os.environ.get("QUIRE_NATS_URL") or None,
            database_url=database_url,
            restart=not no_restart,
            postgres_standby=postgres_standby,
            bookie_locations=locations,
            placement_policy=placement_policy.value if placement_policy else None,
            **(
                {"bookie_process": process}
                if (process := bookie_process or os.environ.get("QUIRE_BOOKIE_PROCESS"))
                else {}
            ),
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    raise typer.Exit(run_up(config))


@app.callback()
def _main() -> None:
    """Quire's command line: `quire up` starts a local cluster; the other commands talk to
    a running one (found from --gateway, $QUIRE_GATEWAY, or cluster.json in --data-dir)."""


app.add_typer(ledger_commands.app, name="ledger")
app.add_typer(bookie_commands.app, name="bookie")
app.add_typer(autorecovery_commands.app, name="autorecovery")
app.add_typer(shell_commands.app, name="shell")
app.add_typer(bench_commands.app, name="bench")
app.add_typer(trace_commands.app, name="trace")
app.add_typer(analytics_commands.app, name="analytics")


def main() -> None:
    app()
