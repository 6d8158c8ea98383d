"""`quire autorecovery ...`: the under-replication queue, the auditor, the stored switch.

`status` prints what the gateway answers: the switch as stored, and whether ledgers are
re-replicated (`ledger_replication_active`, with the gateway's reason); the CLI adds no
claim of its own."""

from __future__ import annotations

from typing import Annotated

import typer

from quire.commands.common import (
    DEFAULT_DATA_DIR,
    DataDirOption,
    GatewayOption,
    Output,
    OutputOption,
    emit,
    run,
)

app = typer.Typer(
    help="Auto-recovery: the stored switch, the auditor, under-replicated ledgers.",
    no_args_is_help=True,
)


@app.command()
def status(
    enable: Annotated[
        bool, typer.Option("--enable", help="Store the auto-recovery switch as on.")
    ] = False,
    disable: Annotated[bool, typer.Option("--disable", help="Store it as off.")] = False,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """The stored auto-recovery switch (set it with --enable / --disable), whether ledgers
    are re-replicated and why, and the stored lost-bookie delay."""

    async def work(client) -> dict:
        if enable or disable:
            await client.request_json(
                "PUT", "/api/v1/autorecovery/status", params={"enabled": str(enable).lower()}
            )
        state = await client.get_json("/api/v1/autorecovery/status")
        delay = await client.get_json("/api/v1/autorecovery/lost_bookie_recovery_delay")
        return {
            "enabled": state["enabled"],
            "ledger_replication_active": state["ledgerReplicationActive"],
            "detail": state["detail"],
            "lost_bookie_recovery_delay_s": delay["lostBookieRecoveryDelay"],
        }

    if enable and disable:
        typer.echo("error: --enable or --disable, not both", err=True)
        raise typer.Exit(2)
    emit(output, run(gateway, data_dir, work))


@app.command("who-is-auditor")
def who_is_auditor(
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """The elected auditor, if any."""
    body = run(gateway, data_dir, lambda c: c.get_json("/api/v1/autorecovery/who_is_auditor"))
    emit(output, {"auditor": body["Auditor"]})


@app.command("list-under-replicated")
def list_under_replicated(
    missing_replica: Annotated[
        str | None, typer.Option(help="Only ledgers missing this bookie.")
    ] = None,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Ledgers marked under-replicated and their missing bookies."""
    params = {"missingreplica": missing_replica} if missing_replica else {}
    body = run(
        gateway,
        data_dir,
        lambda c: c.get_json("/api/v1/autorecovery/list_under_replicated_ledger", **params),
    )
    rows = [{"ledger_id": int(k), "missing_bookies": v} for k, v in body.items()]
    emit(output, rows, None if output is Output.JSON else ["ledger_id", "missing_bookies"])
