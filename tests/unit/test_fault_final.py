"""The fault suite's final phase (quire/faults/final.py), its pure parts: which ledgers a
history created, and how one bookie's answer for an entry is recorded."""

from __future__ import annotations

from quire.faults.checker import REPLICA_OK, ReplicaRead
from quire.faults.final import ledgers_of, replica_read
from quire.faults.history import History
from shared import wire
from shared.digest import DigestManager
from shared.status import BookieStatus


def test_ledgers_of_a_history() -> None:
    history = History()
    made = history.invoke("writer-0", "create", None, {"password": "pw-a"})
    history.ok(made, {"ledger_id": 4})
    timed_out = history.invoke("writer-1", "create", None, {"password": "pw-b"})
    history.info(timed_out, {"code": "TIMEOUT"})
    history.invoke("writer-2", "create", None, {"password": "pw-c"})  # never completed
    assert ledgers_of(history.ops()) == {4: "pw-a"}


def test_replica_reads() -> None:
    digest = DigestManager("crc32c")
    frame = digest.sign(7, 3, 2, 100, b"payload")
    damaged = frame[:-1] + bytes([frame[-1] ^ 1])
    cases = [
        (
            wire.ReadResult(7, 3, BookieStatus.OK, frame),
            ReplicaRead("b1", 3, REPLICA_OK, b"payload"),
        ),
        (wire.ReadResult(7, 3, BookieStatus.OK, damaged), ReplicaRead("b1", 3, "DIGEST_MISMATCH")),
        # A frame of another entry is no answer for this one.
        (wire.ReadResult(7, 4, BookieStatus.OK, frame), ReplicaRead("b1", 4, "DIGEST_MISMATCH")),
        (wire.ReadResult(7, 3, BookieStatus.NO_ENTRY), ReplicaRead("b1", 3, "NO_ENTRY")),
        (wire.ReadResult(7, 3, BookieStatus.CORRUPT), ReplicaRead("b1", 3, "CORRUPT")),
    ]
    for result, expected in cases:
        assert replica_read("b1", 7, result, digest) == expected
