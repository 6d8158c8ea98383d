"""The production file layer's group commit (`OsFiles.write_and_sync`): one pwritev with
RWF_DSYNC | RWF_APPEND, appending as write + fdatasync does, and falling back to them
where the kernel refuses the flags."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from shared.bookie.files import OS_FILES, OsFiles


def test_a_group_commit_appends_after_what_the_file_holds(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    fd = OS_FILES.create(path, b"HEADER")
    try:
        OS_FILES.write_and_sync(fd, b"first")
        OS_FILES.write_and_sync(fd, memoryview(b"-second" * 10_000))
    finally:
        OS_FILES.close(fd)
    assert path.read_bytes() == b"HEADER" + b"first" + b"-second" * 10_000


def test_a_file_reopened_for_appending_is_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    path.write_bytes(b"0123456789")
    fd = OS_FILES.open_append(path)
    try:
        OS_FILES.write_and_sync(fd, b"abc")
    finally:
        OS_FILES.close(fd)
    assert path.read_bytes() == b"0123456789abc"


def test_flags_the_kernel_refuses_fall_back_to_write_and_fdatasync(tmp_path: Path) -> None:
    files = OsFiles()
    files._dsync_append = 1 << 30  # no such RWF_ flag: pwritev fails, writing nothing
    path = tmp_path / "journal"
    fd = files.create(path, b"H")
    try:
        files.write_and_sync(fd, b"one")
        assert files._dsync_append == 0  # remembered: the next commits go straight there
        files.write_and_sync(fd, b"two")
    finally:
        files.close(fd)
    assert path.read_bytes() == b"Honetwo"


def test_other_errors_are_raised(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        try:
            OS_FILES.write_and_sync(fd, b"x")
        except OSError as exc:
            assert exc.errno == errno.EBADF  # not open for writing
        else:
            raise AssertionError("a write to a read-only descriptor succeeded")
    finally:
        os.close(fd)
