"""`quire shell readjournal|readlog|ledger|lastmark|bookiesanity`: BookKeeper's bookie
storage commands. All but bookiesanity read the bookie's files directly (as BookKeeper's
do), given --data-dir and --bookie-id; they open nothing for writing, so they are safe on
a running bookie. bookiesanity writes, reads back and checks a test entry through NATS."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from pathlib import Path
from typing import Annotated

import typer

from quire.commands.common import DEFAULT_DATA_DIR, DataDirOption, Output, OutputOption, emit, fail
from shared.bookie import index_schema as sql
from shared.bookie.entrylog_format import (
    ENTRY_HEAD_SIZE,
    ENTRYLOG_HEADER_SIZE,
    decode_entry_head,
    entry_log_name,
    parse_entry_log_name,
)
from shared.bookie.journal_dir import journal_files
from shared.bookie.journal_format import (
    FILE_HEADER_SIZE,
    LAST_MARK,
    SNAPSHOT,
    BatchRecord,
    EntryRecord,
    FenceRecord,
    LacRecord,
    LedgerDeletedRecord,
    LedgerStateRecord,
    MasterKeyRecord,
    Record,
    ScanStop,
    decode_last_mark,
    decode_snapshot,
    journal_file_name,
    scan_records,
)
from shared.config import QuireSettings
from shared.digest import DIGEST_SIZES, HEADER_SIZE
from shared.wire import DIGEST_TYPES

BookieIdOption = Annotated[
    str, typer.Option("--bookie-id", "-b", help="The bookie whose files to read.")
]
MsgOption = Annotated[bool, typer.Option("--msg", "-m", help="Print each entry's payload too.")]
JournalOption = Annotated[
    int,
    typer.Option(
        "--journal",
        "-j",
        min=0,
        help="Which journal: the index of its directory in QUIRE_JOURNAL__JOURNAL_DIRECTORIES.",
    ),
]
SANITY_LEDGER_BASE = 2**63  # above every ledger id the metadata service hands out


def _settings(data_dir: Path, bookie_id: str) -> QuireSettings:
    return QuireSettings(data_dir=data_dir, bookie_id=bookie_id)


def _journal_dir(data_dir: Path, bookie_id: str, journal: int) -> Path:
    dirs = _settings(data_dir, bookie_id).journal_dirs
    if journal >= len(dirs):
        fail(f"no journal {journal}: the bookie has {len(dirs)} journal directories")
    return dirs[journal]


def _payload(frame: bytes, digest_code: int = 0) -> str:
    """The payload, as text, when the digest type is known (its size follows the header);
    else everything after the 32-byte header, digest included."""
    digest = DIGEST_TYPES.get(digest_code)
    start = HEADER_SIZE + (DIGEST_SIZES[digest] if digest else 0)
    return frame[start:].decode("utf-8", "backslashreplace")[:200]


def _describe(record: Record, msg: bool) -> dict:
    match record:
        case EntryRecord():
            row = {
                "kind": "ENTRY",
                "ledger_id": record.ledger_id,
                "entry_id": record.entry_id,
                "lac": record.lac,
                "size": len(record.frame),
                "digest_code": record.digest_code,
            }
            if msg:
                row["payload"] = _payload(record.frame, record.digest_code)
            return row
        case MasterKeyRecord():
            return {"kind": "MASTER_KEY", "ledger_id": record.ledger_id}
        case FenceRecord():
            return {"kind": "FENCE", "ledger_id": record.ledger_id}
        case LacRecord():
            return {"kind": "LAC", "ledger_id": record.ledger_id, "lac": record.lac}
        case BatchRecord():
            return {"kind": "BATCH", "entries": record.count, "size": record.size}
        case LedgerStateRecord():
            return {"kind": "LEDGER_STATE", "ledger_id": record.ledger_id, "lac": record.lac}
        case LedgerDeletedRecord():
            return {"kind": "DELETED", "ledger_id": record.ledger_id}
    return {"kind": type(record).__name__}


def readjournal(
    journal_id: Annotated[
        int | None, typer.Argument(help="Journal file id (default: every file).")
    ] = None,
    bookie_id: BookieIdOption = "bookie-1",
    msg: MsgOption = False,
    journal: JournalOption = 0,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Every record of the bookie's journal files, with its file and offset; stops at the
    first bad record of a file and says where and why."""
    directory = _journal_dir(data_dir, bookie_id, journal)
    if not directory.exists():
        fail(f"no journal at {directory}")
    ids = [journal_id] if journal_id is not None else journal_files(directory)
    rows = []
    for file_id in ids:
        path = directory / journal_file_name(file_id)
        if not path.exists():
            fail(f"no journal file {path}")
        data = path.read_bytes()
        scan = scan_records(memoryview(data)[FILE_HEADER_SIZE:], FILE_HEADER_SIZE)
        for scanned in scan.records:
            rows.append(
                {"file": file_id, "offset": scanned.start, **_describe(scanned.record, msg)}
            )
        if scan.stop is not ScanStop.END:
            rows.append(
                {
                    "file": file_id,
                    "offset": scan.end,
                    "kind": f"STOP ({scan.stop.value})",
                    "reason": scan.reason,
                }
            )
    columns = ["file", "offset", "kind", "ledger_id", "entry_id", "lac", "size", "entries"]
    emit(output, rows, None if output is Output.JSON else columns + (["payload"] if msg else []))


def readlog(
    entry_log_id: Annotated[int, typer.Argument(help="Entry log id (entrylog-NNNNNN.log).")],
    bookie_id: BookieIdOption = "bookie-1",
    msg: MsgOption = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Every entry of an entry log: offset, ledger, entry, size (in each ledger directory
    that has a log with that id)."""
    rows = []
    found = False
    for index, directory in enumerate(_settings(data_dir, bookie_id).ledger_dirs):
        path = directory / entry_log_name(entry_log_id)
        if not path.exists():
            continue
        found = True
        data = path.read_bytes()
        at = ENTRYLOG_HEADER_SIZE
        while at + ENTRY_HEAD_SIZE <= len(data):
            ledger_id, entry_id, size = decode_entry_head(data[at : at + ENTRY_HEAD_SIZE])
            frame = data[at + ENTRY_HEAD_SIZE : at + ENTRY_HEAD_SIZE + size]
            row = {
                "dir": index,
                "offset": at,
                "ledger_id": ledger_id,
                "entry_id": entry_id,
                "size": size,
            }
            if msg:
                row["payload"] = _payload(frame)
            rows.append(row)
            at += ENTRY_HEAD_SIZE + size
    if not found:
        fail(f"no entry log {entry_log_id} for {bookie_id} under {data_dir}")
    columns = ["dir", "offset", "ledger_id", "entry_id", "size"] + (["payload"] if msg else [])
    emit(output, rows, None if output is Output.JSON else columns)


def ledger(
    ledger_id: Annotated[int, typer.Argument(min=0, help="The ledger id.")],
    bookie_id: BookieIdOption = "bookie-1",
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """The index of one ledger on this bookie: each entry's entry log and offset (entries
    still in the write cache are not in the index yet)."""
    dirs = _settings(data_dir, bookie_id).ledger_dirs
    path = dirs[0] / sql.INDEX_FILE
    if not path.exists():
        fail(f"no index at {path}")
    signed = sql.to_sql_id(ledger_id)
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        facts = conn.execute(sql.SELECT_LEDGER, (signed,)).fetchone()
        rows = [
            {"entry_id": e, "entry_log": log_id, "offset": offset, "size": size, "dir": d}
            for e, log_id, offset, size, d in conn.execute(
                sql.SELECT_ENTRY_RANGE, (signed, 0, sql.MAX_ENTRY_ID)
            )
        ]
    if facts is None and not rows:
        fail(f"ledger {ledger_id} is not in the index of {bookie_id}")
    if output is Output.JSON:
        last, lac = facts or (None, None)
        emit(output, {"ledger_id": ledger_id, "last_entry_id": last, "lac": lac, "entries": rows})
    else:
        emit(output, rows, ["entry_id", "entry_log", "offset", "size", "dir"])


def lastmark(
    bookie_id: BookieIdOption = "bookie-1",
    journal: JournalOption = 0,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """The journal's LastLogMark (where replay starts), its snapshot position, and files."""
    directory = _journal_dir(data_dir, bookie_id, journal)
    mark_path, snapshot_path = directory / LAST_MARK, directory / SNAPSHOT
    mark = decode_last_mark(mark_path.read_bytes()) if mark_path.exists() else None
    snapshot = decode_snapshot(snapshot_path.read_bytes()) if snapshot_path.exists() else None
    emit(
        output,
        {
            "bookie_id": bookie_id,
            "last_log_mark": mark.to_json() if mark else None,
            "snapshot": snapshot.position.to_json() if snapshot else None,
            "snapshot_ledgers": len({r.ledger_id for r in snapshot.records}) if snapshot else 0,
            "snapshot_rows": len(snapshot.records) if snapshot else 0,
            "snapshot_torn": snapshot.torn if snapshot else "",
            "journal_files": journal_files(directory) if directory.exists() else [],
            "entry_logs": sorted(
                i
                for d in _settings(data_dir, bookie_id).ledger_dirs
                if d.exists()
                for i in (parse_entry_log_name(p.name) for p in d.iterdir())
                if i is not None
            ),
        },
    )


def bookiesanity(
    bookie_id: BookieIdOption = "bookie-1",
    entries: Annotated[int, typer.Option("--entries", "-n", min=1, max=1000)] = 10,
    timeout_s: Annotated[float, typer.Option("--timeout", min=0.1)] = 10.0,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    output: OutputOption = Output.TABLE,
) -> None:
    """Write test entries to the bookie, read them back and check them (through NATS, as
    the gateway would; the cluster is found from DIR/cluster.json). The entries go to a
    ledger id above every real one; they stay on disk (the bookie deletes no entries)."""
    emit(output, asyncio.run(_sanity(data_dir, bookie_id, entries, timeout_s)))


async def _sanity(data_dir: Path, bookie_id: str, count: int, timeout_s: float) -> dict:
    from quire.cluster import nats_credentials
    from shared import wire
    from shared.digest import DigestManager, master_key
    from shared.service import connect_nats
    from shared.status import BookieStatus
    from shared.subjects import Subjects

    cluster = data_dir / "cluster.json"
    if not cluster.exists():
        fail(f"no running cluster: {cluster} not found (is `quire up` running?)")
    info = json.loads(cluster.read_text())
    credentials = nats_credentials(data_dir)
    settings = QuireSettings(
        nats_url=info["nats_url"],
        **({"nats_user": credentials[0], "nats_password": credentials[1]} if credentials else {}),
    )
    subjects = Subjects(os.environ.get("QUIRE_SUBJECT_PREFIX", settings.subject_prefix))
    nc = await connect_nats(settings, "quire-shell-bookiesanity", deadline_s=timeout_s)
    try:
        ledger_id = SANITY_LEDGER_BASE + int.from_bytes(os.urandom(7), "big")
        digest = DigestManager("crc32c")
        key = master_key(os.urandom(16))
        frames = [
            digest.sign(ledger_id, e, e - 1, 9 * (e + 1), f"sanity-{e:02d}".encode()[:9])
            for e in range(count)
        ]
        items = [wire.AddItem(wire.add_flags("crc32c"), key, f) for f in frames]
        reply = await nc.request(
            subjects.bookie(bookie_id, "add"), wire.encode_add_request(items), timeout=timeout_s
        )
        status, results = wire.decode_add_reply(reply.data)
        if status is not BookieStatus.OK or any(r.status is not BookieStatus.OK for r in results):
            fail(f"bookie {bookie_id} refused the test adds: {[r.status.name for r in results]}")
        request = wire.encode_read_request(
            [wire.ReadItem(ledger_id, e) for e in range(count)], round(timeout_s * 1000)
        )
        reply = await nc.request(subjects.bookie(bookie_id, "read"), request, timeout=timeout_s)
        status, results = wire.decode_read_reply(reply.data)
        for result, frame in zip(results, frames, strict=True):
            if result.status is not BookieStatus.OK or result.frame != frame:
                fail(f"bookie {bookie_id}: entry {result.entry_id} read back {result.status.name}")
        return {"bookie_id": bookie_id, "ledger_id": ledger_id, "entries": count, "result": "OK"}
    finally:
        await nc.close()


def register(app: typer.Typer) -> None:
    for command in (readjournal, readlog, ledger, lastmark, bookiesanity):
        app.command(command.__name__)(command)
