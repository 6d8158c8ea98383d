"""The runner's side of the disk and clock faults (the processes' side is
`shared/bookie/fault_files.py` and `shared/clock.py`, switched on by `QUIRE_FAULTS_DIR`).

- `power_loss`: once the processes that wrote a bookie's files are dead, make the files
  what a power loss could leave, per the `files.log` of each (see `fault_files`).
- `flip_bit`: one bit of a record (its header or its data) of a journal file or an entry log.
- `fail_next`: the process's next write or fsync of a bookie file fails with EIO or ENOSPC.
- `set_clock_offset`: shift one process's wall clock.
- `bookie_files`, `wipe_bookie`: a bookie's files; a bookie's disk lost whole. The
  operator's procedure for a wiped bookie is to start it again (docs/storage.md, "A wiped
  bookie"): its cookie is gone but metadata has it, so it comes up in `limbo` (never claims
  an entry absent), the auditor has its ledgers re-replicated and then clears the limbo.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Sequence
from pathlib import Path

from shared.bookie.entrylog_format import (
    ENTRY_HEAD_SIZE,
    ENTRYLOG_HEADER_SIZE,
    decode_entry_head,
    parse_entry_log_name,
)
from shared.bookie.fault_files import (
    FAIL_NEXT_FSYNC,
    FAIL_NEXT_WRITE,
    FAULT_ERRNOS,
    FILES_LOG,
    replay_files_log,
)
from shared.bookie.index_schema import INDEX_FILE
from shared.bookie.journal_format import (
    FILE_HEADER_SIZE,
    LAST_MARK,
    RECORD_HEAD_SIZE,
    SNAPSHOT,
    EntryRecord,
    JournalPosition,
    decode_last_mark,
    parse_journal_file_name,
    scan_records,
)
from shared.clock import CLOCK_OFFSET_FILE
from shared.config import QuireSettings

POWER_LOSS_MODES = ("lose", "tear")


def _write_atomic(path: Path, text: str) -> None:
    """The processes poll these files: they must never see half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def power_loss(faults_dirs: list[Path], mode: str, rng: random.Random) -> dict:
    """Apply a power loss to the files the processes of `faults_dirs` wrote (they must be
    dead): "lose" cuts every file to its last durable size, "tear" to a random size
    between that and its current one; a file whose name never became durable is removed.
    Each files.log is then consumed (what is left on disk is all durable). Returns what
    was done: {"mode", "cut": [{"path", "from", "to"}], "removed": [path]}."""
    if mode not in POWER_LOSS_MODES:
        raise ValueError(f"power loss mode {mode!r}: one of {POWER_LOSS_MODES}")
    cut: list[dict] = []
    removed: list[str] = []
    for faults_dir in faults_dirs:
        log_path = faults_dir / FILES_LOG
        if not log_path.exists():
            continue
        fates = replay_files_log(log_path.read_text().splitlines())
        for name, fate in sorted(fates.items()):
            path = Path(name)
            if not path.exists():
                continue
            if not fate.named:
                path.unlink()
                removed.append(name)
                continue
            size = path.stat().st_size
            if fate.durable_size is None or size <= fate.durable_size:
                continue
            keep = fate.durable_size if mode == "lose" else rng.randint(fate.durable_size, size)
            if keep < size:
                os.truncate(path, keep)
                cut.append({"path": name, "from": size, "to": keep})
        log_path.unlink()
    return {"mode": mode, "cut": cut, "removed": removed}


def _journal_targets(data: bytes) -> list[tuple[int, int, int, int]]:
    """(start, end, ledger, entry) of the entry records of a journal file (else of all
    its records, with ledger and entry -1)."""
    scan = scan_records(memoryview(data)[FILE_HEADER_SIZE:], FILE_HEADER_SIZE)
    entries = [
        (r.start, r.end, r.record.ledger_id, r.record.entry_id)
        for r in scan.records
        if isinstance(r.record, EntryRecord)
    ]
    return entries or [(r.start, r.end, -1, -1) for r in scan.records]


def _entrylog_targets(data: bytes) -> list[tuple[int, int, int, int]]:
    """(start, end, ledger, entry) of every whole entry (head and frame) of an entry log."""
    targets = []
    at = ENTRYLOG_HEADER_SIZE
    while at + ENTRY_HEAD_SIZE <= len(data):
        ledger_id, entry_id, length = decode_entry_head(data[at : at + ENTRY_HEAD_SIZE])
        end = at + ENTRY_HEAD_SIZE + length
        if length < 0 or end > len(data):
            break
        targets.append((at, end, ledger_id, entry_id))
        at = end
    return targets


def flip_bit(path: Path, rng: random.Random) -> dict:
    """Flip one bit of `path` (a journal file or an entry log), in a whole record: its
    header or its data, never the file header or a tail still being written. Returns
    {"path", "flipped", "offset", "bit", "ledger_id", "entry_id", "in": "head"|"data"},
    and for a journal file "checkpointed" (below the LastLogMark); "flipped": False when
    the file holds no whole record yet."""
    data = path.read_bytes()
    file_id = parse_journal_file_name(path.name)
    if file_id is not None:
        targets, head_size = _journal_targets(data), RECORD_HEAD_SIZE
    elif parse_entry_log_name(path.name) is not None:
        targets, head_size = _entrylog_targets(data), ENTRY_HEAD_SIZE
    else:
        raise ValueError(f"{path}: neither a journal file nor an entry log")
    if not targets:
        return {"path": str(path), "flipped": False}
    start, end, ledger_id, entry_id = rng.choice(targets)
    offset = rng.randrange(start, end)
    bit = rng.randrange(8)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))
    flipped = {
        "path": str(path),
        "flipped": True,
        "offset": offset,
        "bit": bit,
        "ledger_id": ledger_id,
        "entry_id": entry_id,
        "in": "head" if offset < start + head_size else "data",
    }
    if file_id is not None:
        # Journal records the ledgerstore has checkpointed are never read again (replay
        # starts past them); the others are damage the journal sees at its next start.
        mark_path = path.parent / LAST_MARK
        mark = decode_last_mark(mark_path.read_bytes()) if mark_path.exists() else None
        flipped["checkpointed"] = mark is not None and JournalPosition(file_id, end) <= mark
    return flipped


def fail_next(faults_dir: Path, op: str, errno_name: str) -> None:
    """The process's next `op` ("write" or "fsync") of a bookie file fails with
    `errno_name` ("EIO" or "ENOSPC"), once."""
    names = {"write": FAIL_NEXT_WRITE, "fsync": FAIL_NEXT_FSYNC}
    if op not in names or errno_name not in FAULT_ERRNOS:
        raise ValueError(
            f"fail_next({op!r}, {errno_name!r}): op in {list(names)}, errno in {list(FAULT_ERRNOS)}"
        )
    faults_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(faults_dir / names[op], errno_name)


def set_clock_offset(faults_dir: Path, ms: int) -> None:
    """Shift the process's wall clock by `ms` (0: back to true time); it sees the change
    within ~100 ms."""
    faults_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(faults_dir / CLOCK_OFFSET_FILE, str(int(ms)))


def bookie_files(data_dir: Path, bookie_id: str) -> dict[str, list[Path]]:
    """A bookie's files by kind: journal, journal_meta (lastMark, snapshot), entrylog,
    index (the SQLite files), cookie. Its directories are those its processes get from
    this process's environment (QUIRE_JOURNAL__JOURNAL_DIRECTORIES,
    QUIRE_LEDGERSTORE__LEDGER_DIRECTORIES; `quire up` passes its own on)."""
    settings = QuireSettings(data_dir=data_dir, bookie_id=bookie_id)

    def listed(directories: list[Path]) -> list[Path]:
        return [p for d in directories if d.is_dir() for p in sorted(d.iterdir())]

    journal, ledgers = listed(settings.journal_dirs), listed(settings.ledger_dirs)
    return {
        "journal": [p for p in journal if parse_journal_file_name(p.name) is not None],
        "journal_meta": [p for p in journal if p.name in (LAST_MARK, SNAPSHOT)],
        "entrylog": [p for p in ledgers if parse_entry_log_name(p.name) is not None],
        "index": [p for p in ledgers if p.name.startswith(INDEX_FILE)],
        "cookie": [p for p in [settings.bookie_dir / "cookie"] if p.exists()],
    }


def wipe_bookie(data_dir: Path, bookie_id: str, faults_dirs: Sequence[Path] = ()) -> dict:
    """The bookie's disk lost whole (its processes must be down): remove its directory,
    and the files.log of its processes (they described files that are gone). Heal it by
    starting it again (module docstring)."""
    settings = QuireSettings(data_dir=data_dir, bookie_id=bookie_id)
    counts = {kind: len(paths) for kind, paths in bookie_files(data_dir, bookie_id).items()}
    # Directories on other disks (absolute paths) are outside the bookie's dir.
    for directory in [*settings.journal_dirs, *settings.ledger_dirs, settings.bookie_dir]:
        shutil.rmtree(directory, ignore_errors=True)
    for faults_dir in faults_dirs:
        (faults_dir / FILES_LOG).unlink(missing_ok=True)
    return {"bookie_id": bookie_id, "removed": counts}
