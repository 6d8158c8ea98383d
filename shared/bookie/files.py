"""The file operations the bookie's durability rests on, behind one object.

The journal and the ledgerstore write, sync, truncate and replace files only through a
`FileLayer`. Production uses `OS_FILES` (plain `os` calls); the fault tests pass a
subclass that loses what was not fsynced, tears the last write, fails an fsync with EIO
or a write with ENOSPC, or "crashes" at a chosen operation (`tests/support/faultfs.py`).
Reads go straight to `os.pread`: a crash does not change what a live reader sees.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from shared import disk


class FileLayer:
    """Blocking file operations; every method may raise OSError."""

    def create(self, path: Path, header: bytes) -> int:
        """Create `path` (it must not exist) for appending, write `header`, fsync it and
        its directory. Returns the file descriptor."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            self.write(fd, header)
            self.fsync(fd)
            self.fsync_dir(path.parent)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_append(self, path: Path) -> int:
        return os.open(path, os.O_WRONLY | os.O_APPEND)

    def write(self, fd: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def write_and_sync(self, fd: int, data: bytes | memoryview) -> None:
        """Append `data` to `fd` (opened by `create`/`open_append`) and fdatasync it: the
        journal's group commit. Here as `write` then `fdatasync`, so a subclass that
        overrides either (the fault layers) sees both; `OsFiles` does it in one call."""
        self.write(fd, data)
        self.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def sync_file(self, path: Path) -> None:
        """fsync an existing file: what a process that crashed wrote to it may still be in
        the page cache only, and a power loss would take it."""
        fd = os.open(path, os.O_RDONLY)
        try:
            self.fsync(fd)
        finally:
            os.close(fd)

    def truncate(self, path: Path, size: int) -> None:
        """Cut `path` to `size` bytes, durably."""
        with open(path, "r+b") as f:
            f.truncate(size)
            f.flush()
            self.fsync(f.fileno())

    def fsync_dir(self, directory: Path) -> None:
        disk.fsync_dir(directory)

    def drop_cache(self, fd: int, offset: int, length: int) -> None:
        """Let the kernel drop the cached pages of a synced range (no durability effect:
        the bytes are on disk). On this project's VM a write into a fresh page-cache page
        costs 30-50x one into a page that was just freed; handing back what was written
        keeps the writes on recycled pages (BookKeeper's journalRemovePagesFromCache)."""
        if length > 0:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)

    def write_atomic(self, path: Path, data: bytes) -> None:
        disk.write_atomic(path, data)

    def append(self, path: Path, data: bytes) -> None:
        """Append `data` to the existing `path` and fsync it (a crash may leave a prefix
        of it: the reader must tell a torn tail)."""
        fd = self.open_append(path)
        try:
            self.write(fd, data)
            self.fsync(fd)
        finally:
            self.close(fd)

    def unlink(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def rename(self, source: Path, target: Path) -> None:
        """Rename within a directory (atomic); durable once the caller fsyncs the
        directory."""
        os.rename(source, target)

    def point(self, name: str) -> None:
        """A named step with no IO of its own (e.g. "index.commit"): the fault layer may
        crash here, so tests reach every step of a checkpoint."""


# pwritev's per-call O_DSYNC (Linux 4.7) and O_APPEND (4.16): the write returns once its
# data (and what is needed to read it back: the file's new size) is on disk, as
# write + fdatasync; 0 where the platform has neither.
if hasattr(os, "RWF_DSYNC") and hasattr(os, "RWF_APPEND"):
    _DSYNC_APPEND = os.RWF_DSYNC | os.RWF_APPEND
else:
    _DSYNC_APPEND = 0


class OsFiles(FileLayer):
    """Production's file layer: plain `os` calls, and a group commit in one system call
    (`write_and_sync`)."""

    def __init__(self) -> None:
        self._dsync_append = _DSYNC_APPEND

    def write_and_sync(self, fd: int, data: bytes | memoryview) -> None:
        """One pwritev with RWF_DSYNC | RWF_APPEND instead of write + fdatasync: the same
        durability (POSIX synchronized I/O data integrity, what fdatasync gives), one
        system call, and one release of the GIL instead of two. The journal's writer
        thread must take the GIL back after each release, and while the event loop's
        thread is busy that wait can be as long as the switch interval (5 ms): at half
        the peak rate the loop is busy most of the time. Where the kernel refuses the
        flags (EINVAL/EOPNOTSUPP: nothing was written), write + fdatasync from then on."""
        if not self._dsync_append:
            super().write_and_sync(fd, data)
            return
        view = memoryview(data)
        while view:
            try:
                written = os.pwritev(fd, [view], 0, self._dsync_append)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP) or len(view) != len(data):
                    raise
                self._dsync_append = 0
                super().write_and_sync(fd, data)
                return
            view = view[written:]


OS_FILES: FileLayer = OsFiles()
