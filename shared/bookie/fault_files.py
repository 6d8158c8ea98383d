"""The FileLayer of a real bookie process run by the fault suite (`QUIRE_FAULTS_DIR`).

`files_for(settings.faults_dir)` is the one place that decides: without a faults dir the
journal and the ledgerstore get `OS_FILES` (the production code paths); with one they get
`FaultFiles`, which does the same IO and also works with the runner (`quire/faults/disk.py`)
through files in that directory:

- `files.log`: one JSON line per durability event, appended BEFORE the operation returns
  (never fsynced itself: a kill -9 keeps the page cache, and what the log models is the
  disk). From it the runner computes what a power loss may take once the process is dead
  (`replay_files_log`): every byte past a file's last fsync, and every file whose name was
  not made durable by a directory fsync. Writes are not logged, only what makes bytes or
  names durable, and the size a file had when this process first opened it.
- `fail-next-write`, `fail-next-fsync` (content: an errno name, `EIO` or `ENOSPC`): the
  next write (or fsync, fdatasync, directory fsync) of a bookie file fails with it; the
  file is unlinked when used, so it fires once. A failed write leaves half its bytes (as
  a real one may); a failed fsync makes nothing durable. The bookie then fail-stops.
- `unsafe-no-fsync` (looked at once, when the process starts): the `fsync`/`fdatasync`
  calls of the journal and the ledgerstore (group commits, entry log flushes) are skipped
  and not logged: acknowledged adds are then lost to a power loss. The layer's own
  composite operations (`create`'s header, `truncate`, `append`, `write_atomic`: file
  headers, the LastLogMark, the ledger-state snapshot, the cookie) stay durable, so that
  what the control run loses is data, not a bookie that cannot start.

The SQLite index is not behind the FileLayer: SQLite is its own durability layer (WAL,
`synchronous=FULL`): what a power loss could take from it is a transaction that had not
committed, which SQLite's recovery discards (WAL frame checksums), and the ledgerstore
commits the index only after the entry logs it names are fsynced.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shared import disk
from shared.bookie.files import OS_FILES, FileLayer

log = logging.getLogger(__name__)

FILES_LOG = "files.log"
FAIL_NEXT_WRITE = "fail-next-write"
FAIL_NEXT_FSYNC = "fail-next-fsync"
UNSAFE_NO_FSYNC = "unsafe-no-fsync"
FAULT_ERRNOS = {"EIO": errno.EIO, "ENOSPC": errno.ENOSPC}

# files.log operations.
CREATE = "create"  # a new file; its name is not durable until its directory is fsynced
OPEN = "open"  # opened for append at `size` (its durable size, if not seen before)
FSYNC = "fsync"  # durable up to `size`
FSYNC_DIR = "fsync_dir"  # the names in directory `path` are durable
TRUNCATE = "truncate"  # cut to `size`, durably
RENAME = "rename"  # `path` renamed to `to`; `replaced`: `to` existed before
UNLINK = "unlink"


def files_for(faults_dir: Path | None) -> FileLayer:
    return OS_FILES if faults_dir is None else FaultFiles(faults_dir)


class FaultFiles(FileLayer):
    def __init__(self, faults_dir: Path) -> None:
        faults_dir.mkdir(parents=True, exist_ok=True)
        self.dir = faults_dir
        self.unsafe_no_fsync = (faults_dir / UNSAFE_NO_FSYNC).exists()
        if self.unsafe_no_fsync:
            log.warning("fault injection: fsync of the bookie's files is OFF (unsafe-no-fsync)")
        self._log_fd = os.open(faults_dir / FILES_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self._lock = threading.Lock()
        self._paths: dict[int, str] = {}  # open fd -> its file's path

    # -- the runner's side channel --------------------------------------------------------

    def _record(self, op: str, path: str, **fields: object) -> None:
        line = json.dumps({"op": op, "path": path, **fields}) + "\n"
        # One write of an O_APPEND descriptor: lines of several threads never interleave.
        os.write(self._log_fd, line.encode())

    def _take_fault(self, name: str) -> None:
        """Raise the errno the runner asked for in `name`, once (the file is consumed)."""
        path = self.dir / name
        try:
            wanted = path.read_text().strip()
            path.unlink()
        except FileNotFoundError:  # none asked, or another thread took it
            return
        code = FAULT_ERRNOS.get(wanted, errno.EIO)
        log.warning("fault injection: failing an IO", extra={"fault": name, "errno": wanted})
        raise OSError(code, f"{os.strerror(code)} (injected by {path})")

    def _path(self, fd: int) -> str:
        with self._lock:
            return self._paths[fd]

    def _track(self, fd: int, path: Path) -> None:
        with self._lock:
            self._paths[fd] = str(path.absolute())

    # -- the operations -------------------------------------------------------------------

    def create(self, path: Path, header: bytes) -> int:
        if path.exists():  # not logged: a power loss must not take the file that was there
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
        self._record(CREATE, str(path.absolute()))  # first: the kill may come before the log
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._track(fd, path)
        try:
            self.write(fd, header)
            self._sync(fd, os.fsync)
            self.fsync_dir(path.parent)
        except BaseException:
            self.close(fd)
            raise
        return fd

    def open_append(self, path: Path) -> int:
        fd = super().open_append(path)
        self._track(fd, path)
        self._record(OPEN, self._path(fd), size=os.fstat(fd).st_size)
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> None:
        try:
            self._take_fault(FAIL_NEXT_WRITE)
        except OSError:
            super().write(fd, memoryview(data)[: len(data) // 2])
            raise
        super().write(fd, data)

    def _sync(self, fd: int, sync: Callable[[int], None]) -> None:
        """fsync or fdatasync `fd`, then log the size it made durable."""
        self._take_fault(FAIL_NEXT_FSYNC)
        size = os.fstat(fd).st_size  # what was written before the sync is durable after it
        sync(fd)
        self._record(FSYNC, self._path(fd), size=size)

    def fdatasync(self, fd: int) -> None:
        if not self.unsafe_no_fsync:
            self._sync(fd, os.fdatasync)

    def fsync(self, fd: int) -> None:
        if not self.unsafe_no_fsync:
            self._sync(fd, os.fsync)

    def sync_file(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        self._track(fd, path)
        try:
            self.fsync(fd)
        finally:
            self.close(fd)

    def close(self, fd: int) -> None:
        with self._lock:
            self._paths.pop(fd, None)
        os.close(fd)

    def truncate(self, path: Path, size: int) -> None:
        self._take_fault(FAIL_NEXT_FSYNC)
        with open(path, "r+b") as f:
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())
        self._record(TRUNCATE, str(path.absolute()), size=size)

    def fsync_dir(self, directory: Path) -> None:
        self._take_fault(FAIL_NEXT_FSYNC)
        disk.fsync_dir(directory)
        self._record(FSYNC_DIR, str(directory.absolute()))

    def write_atomic(self, path: Path, data: bytes) -> None:
        """`disk.write_atomic` through this layer's steps, so each is logged and can fail."""
        tmp = path.with_name(path.name + ".tmp")
        self.unlink(tmp)  # a leftover of a write that died
        fd = self.create(tmp, data)
        self.close(fd)
        self.rename(tmp, path)
        self.fsync_dir(path.parent)

    def append(self, path: Path, data: bytes) -> None:
        fd = self.open_append(path)
        try:
            self.write(fd, data)
            self._sync(fd, os.fsync)
        finally:
            self.close(fd)

    def unlink(self, path: Path) -> None:
        self._record(UNLINK, str(path.absolute()))
        super().unlink(path)

    def rename(self, source: Path, target: Path) -> None:
        self._record(
            RENAME, str(source.absolute()), to=str(target.absolute()), replaced=target.exists()
        )
        super().rename(source, target)
        with self._lock:
            for fd, name in self._paths.items():
                if name == str(source.absolute()):
                    self._paths[fd] = str(target.absolute())


# -- reading files.log (the runner) -------------------------------------------------------


@dataclass
class FileFate:
    """What a power loss may leave of one file, as far as the log knows."""

    durable_size: int | None  # None: all of it (it was durable before the log saw it)
    named: bool  # its name is durable (directory fsynced since it was created)


def replay_files_log(lines: list[str]) -> dict[str, FileFate]:
    """The fate of every file the log names (a file it does not name is wholly durable).

    A rename over an existing file is taken as durable at once: the old content is gone,
    and "the new name survived" is one thing a power loss may leave. An unlink likewise
    (the file cannot be brought back). A rename to a new name is like a creation."""
    fates: dict[str, FileFate] = {}
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # the last line cut short by the kill: the operation had not returned
        op, path = rec["op"], rec["path"]
        if op == CREATE:
            fates[path] = FileFate(0, named=False)
        elif op == OPEN:
            fates.setdefault(path, FileFate(rec["size"], named=True))
        elif op in (FSYNC, TRUNCATE):
            fate = fates.setdefault(path, FileFate(rec["size"], named=True))
            fate.durable_size = rec["size"]
        elif op == FSYNC_DIR:
            for name, fate in fates.items():
                if os.path.dirname(name) == path:
                    fate.named = True
        elif op == RENAME:
            fate = fates.pop(path, None) or FileFate(None, named=True)
            fates[rec["to"]] = FileFate(fate.durable_size, named=rec["replaced"])
        elif op == UNLINK:
            fates.pop(path, None)
    return fates
