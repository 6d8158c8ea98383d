"""What `quire bench autorecovery` says the lost bookie held (`held_by`): the replicator's
rule of what a fragment stores (shared.protocol.replication), counted."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from quire.bench.autorecovery import held_by
from quire.bench.procstat import Process, exited
from shared.digest import DigestType
from shared.models import LedgerMetadata, LedgerState, Segment
from shared.quorum import write_set


def closed(segments: list[tuple[int, list[str]]], last: int, qw: int) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=1,
        state=LedgerState.CLOSED,
        ensemble_size=len(segments[0][1]),
        write_quorum=qw,
        ack_quorum=qw,
        digest=DigestType.CRC32C,
        last_entry_id=last,
        segments=[Segment(first_entry_id=f, bookies=b) for f, b in segments],
    )


@pytest.mark.parametrize("qw", [1, 2, 3])
@pytest.mark.parametrize("last", [-1, 0, 4, 9, 30])
def test_held_by_counts_each_entry_where_its_write_set_puts_it(qw: int, last: int) -> None:
    metadata = closed([(0, ["a", "b", "c"]), (5, ["d", "b", "a"])], last, qw)
    for bookie in "abcd":
        expected = 0
        for entry_id in range(last + 1):
            segment = metadata.segment_for(entry_id)
            if bookie in segment.bookies:
                index = segment.bookies.index(bookie)
                expected += index in write_set(entry_id, metadata.quorum)
        assert held_by(metadata, bookie) == expected
    # Every entry is held write-quorum times over the ensemble.
    assert sum(held_by(metadata, b) for b in "abcd") == (last + 1) * qw


def test_exited_names_the_processes_no_longer_running() -> None:
    """What the bench checks before its kill and reports after a failed repair: a process
    that died (a zombie until reaped, or gone) is named, a running one is not."""
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        processes = [Process("up", "journal", running.pid), Process("down", "journal", dead.pid)]
        deadline = time.monotonic() + 30
        while exited(processes) != ["down"]:  # a zombie once it exits: not reaped yet
            assert time.monotonic() < deadline, exited(processes)
            time.sleep(0.01)
        dead.wait()  # reaped: gone altogether
        assert exited(processes) == ["down"]
    finally:
        running.kill()
        running.wait()
    assert exited(processes) == ["up", "down"]
