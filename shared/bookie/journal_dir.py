"""Listing a bookie's journal directory (the names are in `journal_format`), and a
position in one of its journals as the journal and the ledgerstore pass it on NATS."""

from __future__ import annotations

import json
from pathlib import Path

from shared.bookie.journal_format import (
    JournalFormatError,
    JournalPosition,
    parse_journal_file_name,
)


def journal_files(directory: Path) -> list[int]:
    """The ids of the journal files in `directory`, ascending."""
    ids = []
    for path in directory.iterdir():
        file_id = parse_journal_file_name(path.name)
        if file_id is not None:
            ids.append(file_id)
    return sorted(ids)


def journal_position_json(journal: int, position: JournalPosition) -> dict:
    """A position in journal `journal` (the index of its directory in
    journal.journal_directories): {"journal", "file", "offset"}."""
    return {"journal": journal, **position.to_json()}


def encode_journal_position(journal: int, position: JournalPosition) -> bytes:
    return json.dumps(journal_position_json(journal, position)).encode()


def parse_journal_position(raw: object, journals: int) -> tuple[int, JournalPosition]:
    """(journal index, position) from `journal_position_json`'s form. A position without
    "journal" is the first journal's. JournalFormatError if malformed or not one of the
    bookie's `journals`."""
    if not isinstance(raw, dict):
        raise JournalFormatError(f"bad journal position {raw!r}")
    journal = raw.get("journal", 0)
    if not isinstance(journal, int) or isinstance(journal, bool) or not 0 <= journal < journals:
        raise JournalFormatError(f"no journal {journal!r} (this bookie has {journals})")
    try:
        return journal, JournalPosition.from_json(raw)
    except (KeyError, TypeError) as exc:
        raise JournalFormatError(f"bad journal position {raw!r}") from exc


def decode_journal_position(data: bytes, journals: int) -> tuple[int, JournalPosition]:
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise JournalFormatError(f"bad journal position: {exc}") from exc
    return parse_journal_position(raw, journals)
