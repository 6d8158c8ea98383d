"""What every client command shares: finding the gateway, options, output, errors."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Iterable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from quire.client import HttpClient, QuireClientError

T = TypeVar("T")

DEFAULT_DATA_DIR = Path("./quire-data")


class Output(StrEnum):
    TABLE = "table"
    JSON = "json"


GatewayOption = Annotated[
    str | None,
    typer.Option(
        "--gateway",
        help="Gateway URL; else $QUIRE_GATEWAY; else cluster.json under --data-dir.",
        show_default=False,
    ),
]
DataDirOption = Annotated[
    Path, typer.Option("--data-dir", help="Where `quire up` keeps cluster.json.")
]
OutputOption = Annotated[
    Output, typer.Option("--output", "-o", help="table for people, json for scripts.")
]
PasswordOption = Annotated[
    str, typer.Option("--password", "-p", help="The ledger password.", envvar="QUIRE_PASSWORD")
]

console = Console()
err_console = Console(stderr=True)


def gateway_url(gateway: str | None, data_dir: Path) -> str:
    """--gateway, else QUIRE_GATEWAY, else the running cluster's cluster.json."""
    if gateway:
        return gateway.rstrip("/")
    if os.environ.get("QUIRE_GATEWAY"):
        return os.environ["QUIRE_GATEWAY"].rstrip("/")
    cluster = data_dir / "cluster.json"
    try:
        return json.loads(cluster.read_text())["gateway"]["http"]
    except FileNotFoundError:
        fail(
            f"no gateway: pass --gateway URL, set QUIRE_GATEWAY, or start `quire up` (no {cluster})"
        )
    except (ValueError, KeyError) as exc:
        fail(f"{cluster} is not a cluster description: {exc}")
    raise AssertionError("unreachable")


def fail(message: str, code: int = 1) -> None:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


def run(gateway: str | None, data_dir: Path, work: Callable[[HttpClient], Awaitable[T]]) -> T:
    """Run `work` with a client of the gateway; API errors become a clear message and exit 1."""
    url = gateway_url(gateway, data_dir)

    async def go() -> T:
        async with HttpClient(url) as client:
            return await work(client)

    try:
        return asyncio.run(go())
    except QuireClientError as exc:
        fail(f"{exc.code}: {exc.detail}")
    except OSError as exc:
        fail(f"cannot reach the gateway at {url}: {exc}")
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise AssertionError("unreachable")


def emit(output: Output, data: Any, columns: Iterable[str] | None = None, title: str = "") -> None:
    """Print `data` (a dict or a list of dicts) as JSON or as a table."""
    if output is Output.JSON:
        typer.echo(json.dumps(data, default=str))
        return
    rows = data if isinstance(data, list) else [data]
    names = list(columns or (rows[0].keys() if rows else []))
    if not isinstance(data, list) and columns is None:
        table = Table(show_header=False, title=title or None)
        for key, value in data.items():
            table.add_row(key, _cell(value))
    else:
        table = Table(*names, title=title or None)
        for row in rows:
            table.add_row(*(_cell(row.get(name)) for name in names))
    console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)
