"""`quire bookie gc|gc-details|gc-explain|gc-suspend|gc-resume`: the bookies' garbage
collection, through the gateway's `/api/v1/bookie/gc...` paths (services/gateway/gc_admin.py).

Without `--bookie` a command acts on every registered bookie that is not lost; a bookie that
did not answer gets a row with its error, and the command exits 1 once it printed the others.
`gc-explain` adds to each bookie's answer what the metadata says of the ledgers pinning a
log: their state and age, from `GET /v1/ledgers/{id}` (one lookup per ledger shown; a ledger
the metadata no longer has is shown DELETED: its space comes back at the next GC)."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import typer
from rich.table import Table

from quire.client import HttpClient, QuireClientError
from quire.commands.common import (
    DEFAULT_DATA_DIR,
    DataDirOption,
    GatewayOption,
    Output,
    OutputOption,
    console,
    emit,
    err_console,
    run,
)

GC = "/api/v1/bookie/gc"
GC_DETAILS = "/api/v1/bookie/gc_details"
GC_EXPLAIN = "/api/v1/bookie/gc/explain"
SUSPEND = "/api/v1/bookie/gc/suspend_compaction"
RESUME = "/api/v1/bookie/gc/resume_compaction"
# Ledger lookups in flight at once for gc-explain.
LOOKUP_CONCURRENCY = 16
DELETED = "DELETED"

BookieOption = Annotated[
    str | None,
    typer.Option(
        "--bookie",
        help="One bookie (e.g. bookie-1); without it, every registered bookie not lost.",
        show_default=False,
    ),
]
ForceMajor = Annotated[
    bool, typer.Option("--major", help="Also compact logs under the major threshold.")
]
ForceMinor = Annotated[
    bool, typer.Option("--minor", help="Also compact logs under the minor threshold.")
]
Major = Annotated[bool, typer.Option("--major", help="Major compaction.")]
Minor = Annotated[bool, typer.Option("--minor", help="Minor compaction.")]

RUN_COLUMNS = [
    "bookie_id",
    "ledgers_deleted",
    "entry_logs_deleted",
    "entry_logs_compacted",
    "reclaimed_by_deletion_bytes",
    "reclaimed_by_compaction_bytes",
    "major",
    "minor",
    "duration_ms",
    "skipped",
    "error",
]
DETAILS_COLUMNS = [
    "bookie_id",
    "gcRunning",
    "gcRuns",
    "lastGcTime",
    "majorCompacting",
    "minorCompacting",
    "suspendMajor",
    "suspendMinor",
    "entryLogs",
    "entryLogBytes",
    "liveBytes",
    "reclaimedByDeletionBytes",
    "reclaimedByCompactionBytes",
    "lastSkipped",
    "error",
]


def per_bookie(answer: Any, bookie_id: str | None) -> dict[str, Any]:
    """The gateway's answer as {bookie_id: answer}: with --bookie it is that bookie's own."""
    return {bookie_id: answer} if bookie_id is not None else dict(answer)


def error_of(answer: Any) -> str | None:
    """A fan-out entry of a bookie that did not answer: "CODE: detail"."""
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return f"{answer['error'].get('code')}: {answer['error'].get('detail')}"
    return None


def rows(answers: dict[str, Any], pick) -> list[dict[str, Any]]:
    """One row per bookie, in id order: `pick(answer)` of those that answered, the error of
    those that did not."""
    out = []
    for bookie_id in sorted(answers):
        error = error_of(answers[bookie_id])
        if error is not None:
            out.append({"bookie_id": bookie_id, "error": error})
        else:
            out.append({"bookie_id": bookie_id, **pick(answers[bookie_id])})
    return out


def finish(output: Output, table_rows: list[dict[str, Any]], columns: list[str], title: str):
    emit(output, table_rows, None if output is Output.JSON else columns, title=title)
    failed = [r["bookie_id"] for r in table_rows if r.get("error")]
    if failed:
        err_console.print(f"[red]error:[/red] no answer from {', '.join(failed)}")
        raise typer.Exit(1)


def bookie_params(bookie_id: str | None, **params: Any) -> dict[str, Any]:
    return {**params, **({"bookie_id": bookie_id} if bookie_id is not None else {})}


def gc(
    bookie: BookieOption = None,
    major: ForceMajor = False,
    minor: ForceMinor = False,
    no_wait: Annotated[
        bool,
        typer.Option(
            "--no-wait", help="Only trigger the run; by default wait for it and print it."
        ),
    ] = False,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Run garbage collection now (BookKeeper's forceGC) and print what it did.

    Forgets ledgers gone from the metadata, deletes entry logs with no live ledger, and with
    --major / --minor compacts the logs under that usage threshold (even when that kind is
    suspended; on a full disk only with isForceGCAllowWhenNoSpace). Waits for each bookie's
    run, up to the gateway's request timeout (a bookie whose run takes longer shows
    TIMEOUT; its run goes on: see gc-details)."""
    params = bookie_params(bookie, wait=str(not no_wait).lower())
    body = {"forceMajor": major, "forceMinor": minor}
    answer = run(gateway, data_dir, lambda c: c.request_json("PUT", GC, params=params, json=body))
    if no_wait:
        finish(
            output,
            rows(per_bookie(answer, bookie), dict),
            ["bookie_id", "triggered", "error"],
            "gc",
        )
        return
    finish(output, rows(per_bookie(answer, bookie), lambda a: a["run"]), RUN_COLUMNS, "gc runs")


def gc_details(
    bookie: BookieOption = None,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Each bookie's garbage collector: runs, entry logs, bytes reclaimed.

    BookKeeper's GarbageCollectionStatus and Quire's figures: whether GC or compaction
    runs, the last runs, entry logs and bytes on disk, live bytes, bytes reclaimed by
    deletion and by compaction, suspended compactions. JSON has every field; times are ms
    since the epoch (0: never)."""
    answer = run(gateway, data_dir, lambda c: c.get_json(GC_DETAILS, **bookie_params(bookie)))
    found = rows(per_bookie(answer, bookie), lambda a: a[0])
    finish(output, found, DETAILS_COLUMNS, "gc details")


def suspend_or_resume(path: str, word: str, bookie, major, minor, gateway, data_dir, output):
    if not (major or minor):
        err_console.print(f"[red]error:[/red] --major, --minor or both: which compaction to {word}")
        raise typer.Exit(2)
    body = {f"{word}Major": major, f"{word}Minor": minor}
    answer = run(
        gateway,
        data_dir,
        lambda c: c.request_json("PUT", path, params=bookie_params(bookie), json=body),
    )
    columns = ["bookie_id", "isMajorGcSuspended", "isMinorGcSuspended", "error"]
    finish(output, rows(per_bookie(answer, bookie), dict), columns, f"gc {word}")


def gc_suspend(
    bookie: BookieOption = None,
    major: Major = False,
    minor: Minor = False,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Suspend major and/or minor compaction; prints the state after.

    BookKeeper's suspend_compaction: deleted ledgers and entry logs with no live ledger are
    still collected; only the copying of live entries out of sparse logs stops."""
    suspend_or_resume(SUSPEND, "suspend", bookie, major, minor, gateway, data_dir, output)


def gc_resume(
    bookie: BookieOption = None,
    major: Major = False,
    minor: Minor = False,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Resume major and/or minor compaction; prints the state after.

    BookKeeper's resume_compaction."""
    suspend_or_resume(RESUME, "resume", bookie, major, minor, gateway, data_dir, output)


# -- gc-explain -------------------------------------------------------------------------------


def shown_ledgers(answers: dict[str, Any], max_ledgers: int) -> list[int]:
    """The ledgers gc-explain shows (the largest `max_ledgers` of each log), each once."""
    seen: dict[int, None] = {}
    for answer in answers.values():
        if error_of(answer) is None:
            for log in answer["logs"]:
                for pin in log["ledgers"][:max_ledgers]:
                    seen[pin["ledger_id"]] = None
    return list(seen)


async def look_up(client: HttpClient, ledger_ids: list[int]) -> dict[int, dict[str, Any]]:
    """What the metadata says of each ledger: its state and ctime (ms), or DELETED."""
    gate = asyncio.Semaphore(LOOKUP_CONCURRENCY)

    async def one(ledger_id: int) -> dict[str, Any]:
        async with gate:
            try:
                ledger = await client.get_json(f"/v1/ledgers/{ledger_id}")
            except QuireClientError as exc:
                if exc.code != "NO_SUCH_LEDGER":
                    raise
                return {"state": DELETED, "ctime": None}
        return {"state": ledger["state"], "ctime": ledger["ctime"]}

    found = await asyncio.gather(*(one(lid) for lid in ledger_ids))
    return dict(zip(ledger_ids, found, strict=True))


def explained(
    answers: dict[str, Any], metadata: dict[int, dict[str, Any]], max_ledgers: int, now_ms: int
) -> dict[str, Any]:
    """Each bookie's explain answer with the shown ledgers' state, ctime and age_s, and how
    many ledgers of each log were left out (`ledgers_not_shown`)."""
    out: dict[str, Any] = {}
    for bookie_id in sorted(answers):
        answer = answers[bookie_id]
        if error_of(answer) is not None:
            out[bookie_id] = answer
            continue
        logs = []
        for log in answer["logs"]:
            pins = []
            for pin in log["ledgers"][:max_ledgers]:
                meta = metadata[pin["ledger_id"]]
                ctime = meta["ctime"]
                age_s = None if ctime is None else max(now_ms - ctime, 0) // 1000
                pins.append({**pin, "state": meta["state"], "ctime": ctime, "age_s": age_s})
            hidden = max(len(log["ledgers"]) - max_ledgers, 0)
            logs.append({**log, "ledgers": pins, "ledgers_not_shown": hidden})
        out[bookie_id] = {**answer, "logs": logs}
    return out


def human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def human_age(age_s: int | None) -> str:
    if age_s is None:
        return "-"
    for unit, seconds in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if age_s >= seconds:
            return f"{age_s // seconds}{unit}"
    return f"{age_s}s"


def pins_cell(log: dict[str, Any]) -> str:
    lines = [
        f"{p['ledger_id']}  {human_bytes(p['bytes'])}  {p['state']}  {human_age(p['age_s'])}"
        for p in log["ledgers"]
    ]
    if log["ledgers_not_shown"]:
        lines.append(f"(+{log['ledgers_not_shown']} more)")
    return "\n".join(lines) or "-"


def explain_table(bookie_id: str, answer: dict[str, Any]) -> Table:
    title = (
        f"{bookie_id}: minor below {answer['minor_threshold']}, "
        f"major below {answer['major_threshold']}"
        f"{', minor suspended' if answer['suspendMinor'] else ''}"
        f"{', major suspended' if answer['suspendMajor'] else ''}"
    )
    table = Table(
        "dir",
        "log",
        "size",
        "live",
        "usage",
        "pinned by: ledger size state age",
        "next minor",
        "next major",
        title=title,
    )
    for log in answer["logs"]:
        table.add_row(
            str(log["dir"]),
            f"{log['log_id']}{' (current)' if log['current'] else ''}",
            human_bytes(log["size_bytes"]),
            human_bytes(log["live_bytes"]),
            f"{log['usage']:.2f}",
            pins_cell(log),
            log["next_minor"],
            log["next_major"],
        )
    return table


def gc_explain(
    bookie: BookieOption = None,
    max_ledgers: Annotated[
        int,
        typer.Option(
            "--max-ledgers",
            min=0,
            max=10_000,
            help="Pinning ledgers shown per log, largest first (the rest are counted).",
        ),
    ] = 10,
    gateway: GatewayOption = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Why space is not coming back: each entry log on disk and what pins it.

    Every entry log still on each bookie's disk with its size, live bytes and usage; the
    live ledgers that pin it (id, bytes, and from the metadata their state and age; DELETED:
    gone from the metadata, collected at the next GC); and what the next minor and major
    compaction would do with it."""

    async def work(client: HttpClient) -> dict[str, Any]:
        answer = await client.get_json(GC_EXPLAIN, **bookie_params(bookie))
        answers = per_bookie(answer, bookie)
        metadata = await look_up(client, shown_ledgers(answers, max_ledgers))
        return explained(answers, metadata, max_ledgers, time.time_ns() // 1_000_000)

    found = run(gateway, data_dir, work)
    if output is Output.JSON:
        emit(output, found)
    else:
        for bookie_id, answer in found.items():
            error = error_of(answer)
            if error is None:
                console.print(explain_table(bookie_id, answer))
            else:
                console.print(f"{bookie_id}: {error}")
    failed = [b for b, answer in found.items() if error_of(answer) is not None]
    if failed:
        err_console.print(f"[red]error:[/red] no answer from {', '.join(failed)}")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    for name, command in (
        ("gc", gc),
        ("gc-details", gc_details),
        ("gc-explain", gc_explain),
        ("gc-suspend", gc_suspend),
        ("gc-resume", gc_resume),
    ):
        app.command(name)(command)
