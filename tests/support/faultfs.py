"""A fault-injecting FileLayer: what a disk and a kernel can do to the bookie's files.

It passes every operation to the real files and remembers, per file, how many bytes an
fsync has made durable. Then a test can:

- fail the next fsync with EIO or the next write with ENOSPC (`fail_next`);
- "crash" at the n-th operation (`crash_at`): that operation and every later one raise
  `Crash`, as if the process had died there;
- apply a power loss (`power_loss`) to what is on disk: every byte not fsynced is lost,
  or the last unsynced write is torn (a prefix survives), or its pages land out of order
  (a hole inside it while a later part survives); files whose creation was not made
  durable by a directory fsync disappear;
- flip a bit of a file at rest (`flip_bit`).

The contract test (tests/unit/test_faultfs.py) checks that without faults it behaves
like OS_FILES and that each fault does what it says.
"""

from __future__ import annotations

import errno
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from shared.bookie.files import FileLayer


class Crash(BaseException):  # noqa: N818 (a simulated process death, not an error)
    """The simulated process died at this operation. BaseException: no `except
    Exception` in the code under test may swallow it."""


@dataclass
class _FileState:
    durable_size: int
    writes: list[tuple[int, int]] = field(default_factory=list)  # unsynced (offset, length)
    created_unsynced: bool = False  # created, but no directory fsync since


class FaultyFiles(FileLayer):
    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.ops = 0  # operations so far (a crash point is an index into them)
        self.op_names: list[str] = []
        self._crash_at: int | None = None
        self.crashed = False
        self._fail: dict[str, int] = {}  # op kind -> errno for its next call
        self._files: dict[Path, _FileState] = {}
        self._fds: dict[int, Path] = {}

    # -- configuring faults ---------------------------------------------------------------

    def crash_at(self, op_index: int) -> None:
        self._crash_at = op_index

    def fail_next(self, kind: str, err: int) -> None:
        """`kind` is "fsync" (fsync and fdatasync) or "write"."""
        self._fail[kind] = err

    # -- the operations -------------------------------------------------------------------

    def _step(self, name: str) -> None:
        if self.crashed:
            raise Crash(f"already crashed; {name}")
        if self._crash_at is not None and self.ops >= self._crash_at:
            self.crashed = True
            raise Crash(f"crash at operation {self.ops} ({name})")
        self.ops += 1
        self.op_names.append(name)

    def _state(self, path: Path) -> _FileState:
        path = path.resolve()
        if path not in self._files:
            size = path.stat().st_size if path.exists() else 0
            self._files[path] = _FileState(size)
        return self._files[path]

    def create(self, path: Path, header: bytes) -> int:
        self._step(f"create {path.name}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._fds[fd] = path.resolve()
        self._files[path.resolve()] = _FileState(0, created_unsynced=True)
        try:
            self.write(fd, header)
            self.fsync(fd)
            self.fsync_dir(path.parent)
        except BaseException:
            self.close(fd)
            raise
        return fd

    def open_append(self, path: Path) -> int:
        fd = super().open_append(path)
        self._fds[fd] = path.resolve()
        self._state(path)
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> None:
        self._step(f"write {self._fds[fd].name}")
        err = self._fail.pop("write", None)
        state = self._files[self._fds[fd]]
        offset = os.fstat(fd).st_size
        if err is not None:
            # A failed write may leave part of its bytes behind.
            part = bytes(data[: len(data) // 2])
            os.write(fd, part)
            state.writes.append((offset, len(part)))
            raise OSError(err, os.strerror(err))
        super().write(fd, data)
        state.writes.append((offset, len(data)))

    def _sync(self, fd: int, name: str) -> None:
        self._step(f"{name} {self._fds[fd].name}")
        err = self._fail.pop("fsync", None)
        state = self._files[self._fds[fd]]
        if err is not None:
            # After a failed fsync the dirty pages may be dropped: nothing becomes durable.
            raise OSError(err, os.strerror(err))
        state.durable_size = os.fstat(fd).st_size
        state.writes.clear()

    def fdatasync(self, fd: int) -> None:
        self._sync(fd, "fdatasync")

    def fsync(self, fd: int) -> None:
        self._sync(fd, "fsync")

    def close(self, fd: int) -> None:
        if self._fds.pop(fd, None) is not None:
            os.close(fd)

    def sync_file(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        self._fds[fd] = path.resolve()
        self._state(path)
        try:
            self.fsync(fd)
        finally:
            self.close(fd)

    def truncate(self, path: Path, size: int) -> None:
        self._step(f"truncate {path.name}")
        with open(path, "r+b") as f:
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())
        state = self._state(path)
        state.durable_size = size
        state.writes.clear()

    def fsync_dir(self, directory: Path) -> None:
        self._step(f"fsync_dir {directory.name}")
        super().fsync_dir(directory)
        for path, state in self._files.items():
            if path.parent == directory.resolve():
                state.created_unsynced = False

    def write_atomic(self, path: Path, data: bytes) -> None:
        self._step(f"write_atomic {path.name}")
        super().write_atomic(path, data)
        self._files.pop(path.resolve(), None)

    def unlink(self, path: Path) -> None:
        self._step(f"unlink {path.name}")
        super().unlink(path)
        self._files.pop(path.resolve(), None)

    def rename(self, source: Path, target: Path) -> None:
        self._step(f"rename {source.name}")
        super().rename(source, target)
        state = self._files.pop(source.resolve(), None)
        if state is not None:
            # Until the directory is fsynced the new name may not survive: treated as a
            # file created unsynced (the test's power loss removes it).
            state.created_unsynced = True
            self._files[target.resolve()] = state
        for fd, path in self._fds.items():
            if path == source.resolve():
                self._fds[fd] = target.resolve()

    def point(self, name: str) -> None:
        self._step(name)

    # -- after the crash ------------------------------------------------------------------

    def power_loss(self, mode: str = "lose") -> None:
        """Make the files on disk what a power loss could leave. `mode`: "lose" (every
        unsynced byte gone), "tear" (a prefix of the unsynced bytes survives), "holes" (the
        unsynced bytes survive except a stretch in the middle of the last write, zeroed:
        pages written back out of order)."""
        for fd in list(self._fds):
            self.close(fd)
        for path, state in list(self._files.items()):
            if not path.exists():
                continue
            if state.created_unsynced and mode == "lose":
                path.unlink()
                continue
            size = path.stat().st_size
            if size <= state.durable_size:
                continue
            if mode == "lose":
                keep = state.durable_size
            elif mode == "tear":
                keep = self.rng.randrange(state.durable_size, size)
            else:
                keep = size
                offset, length = state.writes[-1] if state.writes else (state.durable_size, 0)
                if length > 2:
                    start = offset + self.rng.randrange(0, length // 2)
                    end = start + self.rng.randrange(1, length - (start - offset))
                    with open(path, "r+b") as f:
                        f.seek(start)
                        f.write(bytes(end - start))
            with open(path, "r+b") as f:
                f.truncate(keep)
        self._files.clear()


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


EIO = errno.EIO
ENOSPC = errno.ENOSPC
