"""`quire ledger ...`: the ledger operations of the HTTP API, from the command line."""

from __future__ import annotations

import base64
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import MofNCompleteColumn, Progress

from quire.client import Entry, HttpClient, Ledger
from quire.commands.common import (
    DEFAULT_DATA_DIR,
    DataDirOption,
    GatewayOption,
    Output,
    OutputOption,
    PasswordOption,
    console,
    emit,
    err_console,
    fail,
    run,
)

app = typer.Typer(help="Create, write, read and close ledgers.", no_args_is_help=True)

LEDGER_COLUMNS = [
    "ledger_id",
    "state",
    "ensemble_size",
    "write_quorum",
    "ack_quorum",
    "digest",
    "last_entry_id",
    "length",
    "version",
]
# A read shorter than this shows no progress bar.
READ_PROGRESS_MIN_ENTRIES = 1000

LedgerId = Annotated[int, typer.Argument(min=0, help="The ledger id.")]


def ledger_row(ledger: Ledger) -> dict:
    return asdict(ledger)


def entry_row(entry: Entry, output: Output) -> dict:
    if output is Output.JSON:
        return {"entry_id": entry.entry_id, "data": base64.b64encode(entry.data).decode()}
    try:
        shown = entry.data.decode()
    except UnicodeDecodeError:
        shown = "base64:" + base64.b64encode(entry.data).decode()
    return {"entry_id": entry.entry_id, "size": len(entry.data), "data": shown}


def parse_metadata(pairs: list[str]) -> dict[str, str]:
    metadata = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"--metadata takes key=value, not {pair!r}")
        metadata[key] = value
    return metadata


@app.command()
def create(
    ensemble: Annotated[int, typer.Option("--ensemble", "-e", min=1, help="Ensemble size.")] = 3,
    write_quorum: Annotated[int, typer.Option("--write-quorum", "-w", min=1)] = 3,
    ack_quorum: Annotated[int, typer.Option("--ack-quorum", "-a", min=1)] = 2,
    password: PasswordOption = "",
    digest: Annotated[str, typer.Option(help="crc32, crc32c, hmac or dummy.")] = "crc32c",
    metadata: Annotated[list[str] | None, typer.Option(help="key=value, repeatable.")] = None,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Create a ledger; prints it (JSON: as GET /v1/ledgers/{id})."""
    custom = parse_metadata(metadata or [])

    async def work(client: HttpClient) -> Ledger:
        return await client.create(
            password=password,
            ensemble_size=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            digest=digest,
            metadata=custom,
        )

    emit(output, ledger_row(run(gateway, data_dir, work)))


@app.command()
def get(
    ledger_id: LedgerId,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Show a ledger's metadata."""
    emit(output, ledger_row(run(gateway, data_dir, lambda c: c.get(ledger_id))))


@app.command("list")
def list_(
    after: Annotated[int | None, typer.Option(help="Only ledgers with a larger id.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many.")] = 100,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """List ledgers by id (pages of up to 1000 until --limit)."""

    async def work(client: HttpClient) -> list[Ledger]:
        found: list[Ledger] = []
        cursor = after
        while len(found) < limit:
            page, cursor = await client.list(cursor, min(1000, limit - len(found)))
            found.extend(page)
            if cursor is None:
                break
        return found

    rows = [ledger_row(m) for m in run(gateway, data_dir, work)]
    emit(output, rows, None if output is Output.JSON else LEDGER_COLUMNS, title="ledgers")


@app.command()
def append(
    ledger_id: LedgerId,
    data: Annotated[
        list[str] | None, typer.Argument(help="Entries (UTF-8 text), in order.")
    ] = None,
    file: Annotated[
        list[Path] | None, typer.Option("--file", "-f", help="A file as one entry; repeatable.")
    ] = None,
    lines: Annotated[bool, typer.Option(help="Each line of standard input is an entry.")] = False,
    password: PasswordOption = "",
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Append entries; answers once they are durable on the ack quorum."""
    entries = [d.encode() for d in data or []]
    entries += [path.read_bytes() for path in file or []]
    if lines:
        entries += [line.rstrip(b"\n") for line in sys.stdin.buffer]
    if not entries:
        fail("nothing to append: give DATA, --file or --lines")

    async def work(client: HttpClient) -> tuple[int, int]:
        return await client.append_many(ledger_id, password, entries)

    first, last = run(gateway, data_dir, work)
    emit(output, {"ledger_id": ledger_id, "first_entry_id": first, "last_entry_id": last})


@app.command()
def read(
    ledger_id: LedgerId,
    first: Annotated[int, typer.Option("--from", min=0, help="First entry id.")] = 0,
    last: Annotated[
        int | None, typer.Option("--to", min=0, help="Last entry id (default: LAC).")
    ] = None,
    unconfirmed: Annotated[bool, typer.Option(help="Read past the LAC.")] = False,
    password: PasswordOption = "",
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Read entries (capped at the LAC unless --unconfirmed) in one streamed request, each
    printed as it comes (JSON: one array); a progress bar on standard error for a long read
    whose output goes to a file or a pipe."""
    if unconfirmed and last is None:
        fail("--unconfirmed needs --to")

    async def work(client: HttpClient) -> None:
        # On a terminal the rows themselves show the progress.
        show = err_console.is_terminal and not console.is_terminal
        total = None
        if show:
            end = last if last is not None else await client.read_lac(ledger_id, password)
            total = max(end - first + 1, 0)
            show = total >= READ_PROGRESS_MIN_ENTRIES
        with Progress(
            *Progress.get_default_columns(),
            MofNCompleteColumn(),
            console=err_console,
            transient=True,
            redirect_stdout=False,
            disable=not show,
        ) as progress:
            task = progress.add_task("reading", total=total)
            rows = RowWriter(output)
            async for entry in client.read_stream(ledger_id, password, first, last, unconfirmed):
                rows.write(entry_row(entry, output))
                progress.advance(task)
            rows.close()

    run(gateway, data_dir, work)


class RowWriter:
    """Entry rows to standard output as they come: for JSON one array (left open, so that it
    does not parse, when the read fails part way), else a tab-separated table."""

    COLUMNS = ("entry_id", "size", "data")

    def __init__(self, output: Output) -> None:
        self.json = output is Output.JSON
        self.count = 0
        sys.stdout.write("[" if self.json else "\t".join(self.COLUMNS) + "\n")

    def write(self, row: dict) -> None:
        if self.json:
            sys.stdout.write((", " if self.count else "") + json.dumps(row))
        else:
            sys.stdout.write("\t".join(str(row[name]) for name in self.COLUMNS) + "\n")
        self.count += 1

    def close(self) -> None:
        if self.json:
            sys.stdout.write("]\n")
        sys.stdout.flush()


@app.command()
def tail(
    ledger_id: LedgerId,
    first: Annotated[int, typer.Option("--from", min=0, help="First entry id.")] = 0,
    password: PasswordOption = "",
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Follow a ledger: print entries as they are confirmed, until it closes or Ctrl-C."""

    async def work(client: HttpClient) -> None:
        async for entry in client.tail(ledger_id, password, first):
            row = entry_row(entry, output)
            if output is Output.JSON:
                emit(output, row)
            else:
                typer.echo(f"{row['entry_id']}\t{row['data']}")

    run(gateway, data_dir, work)


def closed(output: Output, ledger_id: int, last_entry_id: int) -> None:
    emit(output, {"ledger_id": ledger_id, "state": "CLOSED", "last_entry_id": last_entry_id})


@app.command()
def close(
    ledger_id: LedgerId,
    password: PasswordOption = "",
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Close a ledger: no appends after it."""
    closed(output, ledger_id, run(gateway, data_dir, lambda c: c.close(ledger_id, password)))


@app.command()
def recover(
    ledger_id: LedgerId,
    password: PasswordOption = "",
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Fence the ledger on its bookies, recover its last entry, close it."""
    closed(output, ledger_id, run(gateway, data_dir, lambda c: c.recover(ledger_id, password)))


@app.command()
def delete(
    ledger_id: LedgerId,
    password: PasswordOption = "",
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Delete a ledger: its metadata goes at once; its entries stay on the bookies' disks
    (no garbage collection runs)."""
    run(gateway, data_dir, lambda c: c.delete(ledger_id, password))
    emit(output, {"ledger_id": ledger_id, "deleted": True})
