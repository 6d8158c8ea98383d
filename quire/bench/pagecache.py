"""The OS page cache of a set of files: how much of them it holds (mincore), and evicting
them from it, so that `quire bench read` can read "cold" and show that it did."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterable
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


def files_under(directories: Iterable[Path]) -> list[Path]:
    """Every regular file below the directories (missing directories are skipped)."""
    found = []
    for directory in directories:
        for root, _, names in os.walk(directory):
            found.extend(Path(root) / name for name in names)
    return [path for path in found if path.is_file()]


def _resident_bytes(path: Path) -> tuple[int, int]:
    """(bytes of the file in the page cache, its size)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # removed meanwhile (a journal file the bookie deleted)
        return 0, 0
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address == _MAP_FAILED:
            raise OSError(ctypes.get_errno(), f"mmap of {path}")
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vector = (ctypes.c_ubyte * pages)()
            if _libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path}")
            resident = sum(byte & 1 for byte in vector) * mmap.PAGESIZE
        finally:
            _libc.munmap(address, size)
        return min(resident, size), size
    finally:
        os.close(fd)


def resident(paths: Iterable[Path]) -> dict[str, int]:
    """How much of the files the page cache holds: {"resident_bytes", "file_bytes"}."""
    held = total = 0
    for path in paths:
        r, s = _resident_bytes(path)
        held, total = held + r, total + s
    return {"resident_bytes": held, "file_bytes": total}


def drop(paths: Iterable[Path]) -> None:
    """Evict the files from the page cache with posix_fadvise(DONTNEED), after an fsync
    (DONTNEED leaves dirty pages in place). Only these files: /proc/sys/vm/drop_caches
    would empty the cache of every process on the machine; `resident` shows what is left."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # removed meanwhile
            continue
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
