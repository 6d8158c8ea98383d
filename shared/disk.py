"""Durable file primitives the bookie's two processes share, and their fail-stop rule."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

FAIL_STOP_EXIT_CODE = 70


def fail_stop(component: str, reason: str) -> None:
    """Exit at once after a failed write or fsync: the page cache state is unknown, so
    nothing we hold is trustworthy, and an fsync is never retried (the fsyncgate rule)."""
    log.critical(f"{component} IO failed, exiting", extra={"reason": reason})
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(FAIL_STOP_EXIT_CODE)


def fsync_dir(directory: Path) -> None:
    """Make a file creation, rename or deletion in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `path` so that a crash leaves the old or the new content, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
