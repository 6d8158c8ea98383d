"""`quire bookie ...`: the bookies as the registry and the bookies themselves see them, and
their garbage collection (`gc`, `gc-details`, `gc-explain`, `gc-suspend`, `gc-resume`: in
quire/commands/bookie_gc.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from quire.commands import bookie_gc
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
    help="List bookies, inspect one, and run or inspect their garbage collection.",
    no_args_is_help=True,
)

BookieId = Annotated[str, typer.Argument(help="The bookie id, e.g. bookie-1.")]


@app.command("list")
def list_(
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Every registered bookie: writable, readonly, or lost (its lease lapsed), and its
    network location (/zone/rack, for placement)."""
    body = run(gateway, data_dir, lambda c: c.get_json("/v1/bookies"))
    columns = ["bookie_id", "state", "location", "last_seen", "lease_expires_at"]
    emit(output, body["bookies"], None if output is Output.JSON else columns, title="bookies")


@app.command()
def info(
    bookie_id: BookieId,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """What the bookie says of itself: space, state, last log mark, files."""
    emit(output, run(gateway, data_dir, lambda c: c.get_json(f"/v1/bookies/{bookie_id}")))


@app.command()
def state(
    bookie_id: BookieId,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """The bookie's state in the registry: writable, readonly or lost."""
    body = run(gateway, data_dir, lambda c: c.get_json("/v1/bookies"))
    row = next((b for b in body["bookies"] if b["bookie_id"] == bookie_id), None)
    if row is None:
        fail(f"no bookie {bookie_id} is registered")
    emit(output, {"bookie_id": bookie_id, "state": row["state"]})


bookie_gc.register(app)
