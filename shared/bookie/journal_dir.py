"""Listing a bookie's journal directory (the names are in `journal_format`)."""

from __future__ import annotations

from pathlib import Path

from shared.bookie.journal_format import parse_journal_file_name


def journal_files(directory: Path) -> list[int]:
    """The ids of the journal files in `directory`, ascending."""
    ids = []
    for path in directory.iterdir():
        file_id = parse_journal_file_name(path.name)
        if file_id is not None:
            ids.append(file_id)
    return sorted(ids)
