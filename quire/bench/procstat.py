"""CPU time and resident memory of the cluster's processes, read from /proc (Linux).

A process counts with its descendants: PostgreSQL's work is done by the backends its
postmaster forks, and those are what cluster.json's one pid would otherwise miss."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Process:
    name: str  # as cluster.json names it: gateway, bookie-1.journal, nats-server, ...
    kind: str
    pid: int


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces), or None if gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text[text.rindex(")") + 2 :].split()


def exited(processes: list[Process]) -> list[str]:
    """The names of those that are no longer running (gone, or a zombie not yet reaped)."""
    names = []
    for process in processes:
        fields = _stat_fields(process.pid)
        if fields is None or fields[0] == "Z":
            names.append(process.name)
    return names


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def _tree(pid: int, children: dict[int, list[int]]) -> list[int]:
    pids, stack = [], [pid]
    while stack:
        current = stack.pop()
        pids.append(current)
        stack.extend(children.get(current, ()))
    return pids


def cpu_seconds(processes: list[Process]) -> dict[str, float]:
    """User + system CPU seconds each process (with its descendants) has used so far."""
    children = _children_by_parent()
    totals = {}
    for process in processes:
        ticks = 0
        for pid in _tree(process.pid, children):
            fields = _stat_fields(pid)
            if fields is not None:  # utime and stime are fields 14 and 15 of stat
                ticks += int(fields[11]) + int(fields[12])
        totals[process.name] = ticks / CLOCK_TICKS_PER_S
    return totals


def rss_bytes(pid: int) -> int:
    """Resident memory of one process (not its descendants)."""
    fields = (PROC / str(pid) / "statm").read_text().split()
    return int(fields[1]) * PAGE_BYTES


# -- CPU per acknowledged entry ------------------------------------------------------------

CLIENT_KIND = "client"  # the bench process itself


def _cpu_ticks(fields: list[str]) -> int:
    """utime + stime + cutime + cstime (stat fields 14-17): a process's own CPU and that
    of the children it has reaped, so a PostgreSQL backend that ends within a window is
    still counted (in its postmaster) once it is gone."""
    return int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])


class CpuMeter:
    """CPU seconds of the processes under test (each with its descendants), by kind, and
    of this process as `client`, between `start()` and `stop()`.

    `processes` None: the system's processes are not known (a gateway URL alone), and the
    result says so instead of passing the client's CPU off as the whole. Rows sharing a
    pid (two services co-hosted in one process) count once, under their kinds joined with
    "+"; a descendant counts under the nearest row above it, never twice."""

    def __init__(self, processes: list[Process] | None) -> None:
        self.processes = processes
        self._kinds: dict[int, str] = {}  # pid -> kind, from the last scan
        self._start: dict[str, float] | None = None

    @property
    def known(self) -> bool:
        return self.processes is not None

    @property
    def started(self) -> bool:
        return self._start is not None

    def prepare(self) -> None:
        """Find every process of the set (a scan of /proc): before the measured window,
        so that `start()` only reads the stat of each."""
        self._kinds = self._scan()

    def _scan(self) -> dict[int, str]:
        if not self.processes:
            return {}
        roots: dict[int, set[str]] = {}
        for process in self.processes:
            roots.setdefault(process.pid, set()).add(process.kind)
        children = _children_by_parent()
        kinds: dict[int, str] = {}
        for root, names in roots.items():
            kind = "+".join(sorted(names))
            stack = [root]
            while stack:
                pid = stack.pop()
                kinds[pid] = kind
                # Another row's process is counted under its own row.
                stack.extend(c for c in children.get(pid, ()) if c not in roots)
        return kinds

    def _read(self, kinds: dict[int, str]) -> dict[str, float]:
        totals: dict[str, float] = {kind: 0.0 for kind in kinds.values()}
        for pid, kind in kinds.items():
            fields = _stat_fields(pid)
            if fields is not None:
                totals[kind] += _cpu_ticks(fields) / CLOCK_TICKS_PER_S
        times = os.times()
        totals[CLIENT_KIND] = times.user + times.system
        return totals

    def start(self) -> None:
        """The window opens: a read of the processes found by `prepare()`."""
        if not self._kinds:
            self.prepare()
        self._start = self._read(self._kinds)

    def stop(self) -> dict[str, float]:
        """CPU seconds by kind since `start()` (`client`: this process), every process of
        the set found again: one started within the window counts from zero, one that
        ended is in its parent's reaped-children time."""
        assert self._start is not None, "stop() before start()"
        end, start = self._read(self._scan()), self._start
        self._start = None
        return {kind: max(0.0, end[kind] - start.get(kind, 0.0)) for kind in end}
