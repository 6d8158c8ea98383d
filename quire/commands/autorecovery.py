"""`quire autorecovery ...`: the switch, the auditor and its commands, under-replicated
ledgers.

`status` prints what the gateway answers: the switch as stored, the replicator workers
running, and whether ledgers are re-replicated (`ledger_replication_active`, with the
gateway's reason); the CLI adds no claim of its own. `trigger-audit`, `decommission` and
`recover` are BookKeeper's admin commands, carried out by the elected auditor (through the
gateway's `PUT /api/v1/autorecovery/...`); they print what it answered."""

from __future__ import annotations

from typing import Annotated

import typer

from quire.client import HttpClient
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
    help="Auto-recovery: the switch, the auditor and its commands, under-replicated ledgers.",
    no_args_is_help=True,
)

LIST_UNDER_REPLICATED = "/api/v1/autorecovery/list_under_replicated_ledger"


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
    """The auto-recovery switch (set it with --enable / --disable; off, no replicator worker
    claims an under-replicated ledger), the replicator workers running, whether ledgers are
    re-replicated and why, and the stored lost-bookie delay."""

    async def work(client) -> dict:
        if enable or disable:
            await client.request_json(
                "PUT", "/api/v1/autorecovery/status", params={"enabled": str(enable).lower()}
            )
        state = await client.get_json("/api/v1/autorecovery/status")
        delay = await client.get_json("/api/v1/autorecovery/lost_bookie_recovery_delay")
        return {
            "enabled": state["enabled"],
            "replicators": state["replicators"],
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
    excluding_missing_replica: Annotated[
        str | None, typer.Option(help="Only ledgers not missing this bookie.")
    ] = None,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Ledgers marked under-replicated and their missing bookies."""
    rows = run(
        gateway,
        data_dir,
        lambda c: under_replicated(c, missing_replica, excluding_missing_replica),
    )
    emit(output, rows, None if output is Output.JSON else ["ledger_id", "missing_bookies"])


async def under_replicated(
    client: HttpClient, missing_replica: str | None, excluding_missing_replica: str | None
) -> list[dict]:
    """Rows of {ledger_id, missing_bookies}, filtered as BookKeeper's listunderreplicated."""
    params = {"printmissingreplica": "true"}
    if missing_replica:
        params["missingreplica"] = missing_replica
    if excluding_missing_replica:
        params["excludingmissingreplica"] = excluding_missing_replica
    body = await client.get_json(LIST_UNDER_REPLICATED, **params)
    return [{"ledger_id": int(k), "missing_bookies": v} for k, v in body.items()]


@app.command("trigger-audit")
def trigger_audit(
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Run the elected auditor's audit now: every ledger with a fragment on a lost bookie is
    marked under-replicated. Prints what the auditor answered."""
    body = run(
        gateway, data_dir, lambda c: c.request_json("PUT", "/api/v1/autorecovery/trigger_audit")
    )
    emit(output, body)


@app.command()
def decommission(
    bookie_id: Annotated[str, typer.Argument(help="The bookie to decommission (it must be down).")],
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Decommission a bookie that is down: the auditor marks every ledger with a fragment on
    it under-replicated (the replicators copy them elsewhere) and removes its cookie once no
    ledger needs it. Follow the progress with `list-under-replicated --missing-replica ID`."""
    emit(output, run(gateway, data_dir, lambda c: decommission_bookie(c, bookie_id)))


async def decommission_bookie(client: HttpClient, bookie_id: str) -> dict:
    return await client.request_json(
        "PUT", "/api/v1/autorecovery/decommission", json={"bookie_src": bookie_id}
    )


@app.command()
def recover(
    bookie_ids: Annotated[list[str], typer.Argument(help="The bookies whose ledgers to recover.")],
    delete_cookie: Annotated[
        bool,
        typer.Option("--delete-cookie", help="Remove their cookies once no ledger needs them."),
    ] = False,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Recover the ledgers of bookies onto others (BookKeeper's recoverBookieData): the
    auditor marks every ledger with a fragment on them under-replicated, and the replicators
    copy those fragments to other bookies."""
    emit(output, run(gateway, data_dir, lambda c: recover_bookies(c, bookie_ids, delete_cookie)))


async def recover_bookies(client: HttpClient, bookie_ids: list[str], delete_cookie: bool) -> dict:
    return await client.request_json(
        "PUT",
        "/api/v1/autorecovery/bookie",
        json={"bookie_src": bookie_ids, "delete_cookie": delete_cookie},
    )
