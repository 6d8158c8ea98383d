"""`quire shell <classic name>`: BookKeeper's shell commands under their own names, for
operators whose fingers know them (`bin/bookkeeper shell listledgers`, ...)."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Annotated

import typer
from rich.progress import Progress

from quire.client import HttpClient
from quire.commands import autorecovery as autorecovery_commands
from quire.commands import bookie as bookie_commands
from quire.commands import ledger as ledger_commands
from quire.commands import storage as storage_commands
from quire.commands.common import (
    DEFAULT_DATA_DIR,
    DataDirOption,
    GatewayOption,
    Output,
    OutputOption,
    emit,
    fail,
    run,
)

app = typer.Typer(
    help="BookKeeper's shell commands under their classic names.", no_args_is_help=True
)

LedgerIdOption = Annotated[int, typer.Option("--ledgerid", "-l", min=0, help="The ledger id.")]


@app.command()
def listledgers(
    meta: Annotated[
        bool, typer.Option("--meta", "-m", help="Print each ledger's metadata.")
    ] = False,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """List every ledger id (with --meta, their metadata)."""

    async def work(client: HttpClient) -> list[dict]:
        rows, cursor = [], None
        while True:
            page, cursor = await client.list(cursor, 1000)
            rows.extend(asdict(m) for m in page)
            if cursor is None:
                return rows

    rows = run(gateway, data_dir, work)
    if meta:
        emit(output, rows, None if output is Output.JSON else ledger_commands.LEDGER_COLUMNS)
    else:
        emit(output, [{"ledger_id": r["ledger_id"]} for r in rows], ["ledger_id"])


@app.command()
def ledgermetadata(
    ledgerid: LedgerIdOption,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Print one ledger's metadata."""
    ledger_commands.get(ledgerid, gateway, data_dir, output)


@app.command()
def readledger(
    ledgerid: LedgerIdOption,
    firstentryid: Annotated[int, typer.Option("--firstentryid", "-fe", min=0)] = 0,
    lastentryid: Annotated[int | None, typer.Option("--lastentryid", "-le", min=0)] = None,
    password: Annotated[str, typer.Option("--password", "-p", envvar="QUIRE_PASSWORD")] = "",
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Read a ledger's entries (up to its LAC)."""
    ledger_commands.read(
        ledgerid, firstentryid, lastentryid, False, password, gateway, data_dir, output
    )


@app.command()
def listbookies(
    readwrite: Annotated[bool, typer.Option("--readwrite", "-rw", help="Writable ones.")] = False,
    readonly: Annotated[bool, typer.Option("--readonly", "-ro", help="Read-only ones.")] = False,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """List the available bookies (-rw writable, -ro read-only; both by default)."""
    body = run(gateway, data_dir, lambda c: c.get_json("/v1/bookies"))
    wanted = {"writable"} if readwrite and not readonly else set()
    wanted |= {"readonly"} if readonly and not readwrite else set()
    wanted = wanted or {"writable", "readonly"}
    rows = [b for b in body["bookies"] if b["state"] in wanted]
    emit(output, rows, None if output is Output.JSON else ["bookie_id", "state"], title="bookies")


@app.command()
def simpletest(
    ensemble: Annotated[int, typer.Option("--ensemble", "-e", min=1)] = 3,
    write_quorum: Annotated[int, typer.Option("--writeQuorum", "-w", min=1)] = 3,
    ack_quorum: Annotated[int, typer.Option("--ackQuorum", "-a", min=1)] = 2,
    num_entries: Annotated[int, typer.Option("--numEntries", "-n", min=1)] = 100,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Write entries to a new ledger, read them back, check them, delete the ledger."""
    password = os.urandom(8).hex()

    async def work(client: HttpClient) -> dict:
        ledger = await client.create(
            password=password,
            ensemble_size=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            metadata={"created-by": "simpletest"},
        )
        payloads = [f"simpletest-{i}".encode() for i in range(num_entries)]
        started = time.monotonic()
        with Progress(transient=True) as progress:
            task = progress.add_task("writing", total=num_entries)
            for start in range(0, num_entries, 100):
                chunk = payloads[start : start + 100]
                await client.append(ledger.ledger_id, password, chunk)
                progress.advance(task, len(chunk))
        write_s = time.monotonic() - started
        await client.close(ledger.ledger_id, password)
        read_back = []
        for start in range(0, num_entries, 1000):
            end = min(num_entries, start + 1000) - 1
            read_back += await client.read(ledger.ledger_id, password, start, end)
        if [e.data for e in read_back] != payloads:
            fail(f"ledger {ledger.ledger_id}: entries read back differ from those written")
        await client.delete(ledger.ledger_id, password)
        return {
            "ledger_id": ledger.ledger_id,
            "entries": num_entries,
            "ensemble": ledger.segments[0]["bookies"],
            "write_s": round(write_s, 3),
            "result": "OK",
        }

    emit(output, run(gateway, data_dir, work))


@app.command()
def listunderreplicated(
    missingreplica: Annotated[
        str | None, typer.Option("--missingreplica", "-mr", help="Bookie id of a missing replica.")
    ] = None,
    excludingmissingreplica: Annotated[
        str | None,
        typer.Option(
            "--excludingmissingreplica", "-emr", help="Bookie id of a missing replica to ignore."
        ),
    ] = None,
    printmissingreplica: Annotated[
        bool,
        typer.Option("--printmissingreplica", "-pmr", help="Print each ledger's missing replicas."),
    ] = False,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """List the ledgers marked under-replicated (with -pmr, their missing replicas)."""
    under_replicated = autorecovery_commands.under_replicated
    rows = run(
        gateway, data_dir, lambda c: under_replicated(c, missingreplica, excludingmissingreplica)
    )
    if printmissingreplica:
        emit(output, rows, None if output is Output.JSON else ["ledger_id", "missing_bookies"])
    else:
        emit(output, [{"ledger_id": r["ledger_id"]} for r in rows], ["ledger_id"])


@app.command()
def recover(
    bookiesrc: Annotated[
        str, typer.Argument(help="The bookie(s) to recover, comma separated: b1[,b2,...].")
    ],
    deletecookie: Annotated[
        bool,
        typer.Option(
            "--deleteCookie", "-d", help="Remove their cookies once no ledger needs them."
        ),
    ] = False,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Recover the ledgers of bookies onto other bookies (the auditor marks them
    under-replicated; the replicators copy them)."""
    bookie_ids = [b for b in bookiesrc.split(",") if b]
    if not bookie_ids:
        fail("name at least one bookie to recover")
    body = run(
        gateway,
        data_dir,
        lambda c: autorecovery_commands.recover_bookies(c, bookie_ids, deletecookie),
    )
    emit(output, body)


@app.command()
def decommissionbookie(
    bookieid: Annotated[
        str, typer.Option("--bookieid", "-bookieid", help="The bookie to decommission (down).")
    ],
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Decommission a bookie that is down: its ledgers are re-replicated elsewhere, then its
    cookie is removed."""
    body = run(gateway, data_dir, lambda c: autorecovery_commands.decommission_bookie(c, bookieid))
    emit(output, body)


app.command("bookieinfo", help="What one bookie says of itself.")(bookie_commands.info)
app.command("whoisauditor", help="The elected auditor.")(autorecovery_commands.who_is_auditor)
app.command("triggeraudit", help="Run the auditor's audit now.")(
    autorecovery_commands.trigger_audit
)

# The bookie's storage commands (readjournal, readlog, ledger, lastmark, bookiesanity).
storage_commands.register(app)
