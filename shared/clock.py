"""The wall clock the services decide by (leases, registrations, event timestamps, GC ages).

Plain `time.time()`, unless the process runs under the fault suite (`QUIRE_FAULTS_DIR`,
`use_faults_dir` at start): then the integer in `<faults dir>/clock-offset-ms` (absent: 0)
is added, so the suite can jump one service's clock. The file is read at most every
OFFSET_REREAD_S; the offset is cached in between. Monotonic clocks are not changed, as a
wall clock jump does not move CLOCK_MONOTONIC.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

CLOCK_OFFSET_FILE = "clock-offset-ms"
OFFSET_REREAD_S = 0.1


class _Offset:
    def __init__(self) -> None:
        self.path: Path | None = None
        self.ms = 0
        self.read_at = float("-inf")  # time.monotonic() of the last read
        self.lock = threading.Lock()

    def get_ms(self) -> int:
        if self.path is None:
            return 0
        now = time.monotonic()
        if now - self.read_at < OFFSET_REREAD_S:
            return self.ms
        with self.lock:
            if now - self.read_at >= OFFSET_REREAD_S:
                self.read_at = now
                self._read()
        return self.ms

    def _read(self) -> None:
        assert self.path is not None
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            text = "0"
        try:
            ms = int(text or "0")
        except ValueError:
            return  # caught mid-write by the runner (it writes atomically): keep the last
        if ms != self.ms:
            log.warning("fault injection: wall clock offset", extra={"offset_ms": ms})
        self.ms = ms


_offset = _Offset()


def use_faults_dir(faults_dir: Path | None) -> None:
    """Take the clock offset from `faults_dir` from now on (None: no offset)."""
    _offset.path = None if faults_dir is None else faults_dir / CLOCK_OFFSET_FILE
    _offset.read_at = float("-inf")
    _offset.ms = 0


def wall_s() -> float:
    return time.time() + _offset.get_ms() / 1000


def wall_ms() -> int:
    return time.time_ns() // 1_000_000 + _offset.get_ms()
