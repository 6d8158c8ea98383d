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
