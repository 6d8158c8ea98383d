"""The in-process handoff from a co-hosted bookie's journal to its ledgerstore (pure).

When one process runs both halves of a bookie (`services.bookie`), the journal hands each
group commit it has just made durable (after its fdatasync, in commit order) to the
ledgerstore by reference: the same `Record` objects the ledgerstore would otherwise
decode again from the journal file, with the positions the file tailer would have given.
The ledgerstore applies one only if it continues exactly where it stands in that journal
(`continues`); one it has already applied (read from the file) is dropped; anything else
(a batch dropped from the full queue, a partial overlap with a file read) means a gap,
and the file tailer takes over from where the ledgerstore stands, as in separate
processes, until a handed batch continues it again. Nothing of crash safety changes: the
ledgerstore's checkpoint names positions in the journal files, and after a restart it
catches up by reading them.

This module decides; it does no IO and keeps no clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from shared.bookie.journal_format import FILE_HEADER_SIZE, JournalPosition, Record


@dataclass(frozen=True, slots=True)
class DurableBatch:
    """One group commit of journal `journal`, fsynced: its records in journal order.

    `previous`: where the journal's durable records ended before it (possibly in an
    earlier file: the journal rolled, or started a new file at open); `start`: where its
    bytes begin; `end`: the position after it (the position a tail of the file gives once
    its records are applied)."""

    journal: int
    previous: JournalPosition
    start: JournalPosition
    end: JournalPosition
    records: list[Record]


class Decision(Enum):
    APPLY = "apply"  # continues the applied position exactly: apply it, move to its end
    SKIP = "skip"  # already applied (read from the file): drop it
    GAP = "gap"  # does not continue it: tail the file up to its end first


def continues(applied: JournalPosition, batch: DurableBatch) -> bool:
    """Whether `batch` starts exactly where `applied` stands, as the file tailer would see
    it: at the same offset of the same file (the header counts as nothing), or at the
    first record of a new file while `applied` is where the journal's durable records
    ended in the earlier one (the tailer would have read nothing more there)."""
    start = batch.start
    if applied.file_id == start.file_id:
        return max(applied.offset, FILE_HEADER_SIZE) == start.offset
    return applied == batch.previous and start.offset == FILE_HEADER_SIZE


def decide(applied: JournalPosition, batch: DurableBatch) -> Decision:
    if batch.end <= applied:
        return Decision.SKIP
    if continues(applied, batch):
        return Decision.APPLY
    return Decision.GAP


@dataclass
class HandoffQueue:
    """The bounded queue of handed batches (all journals of one bookie), in commit order
    per journal. A batch offered when it is full is dropped and counted: the ledgerstore
    then sees a gap at the next batch of that journal and tails the file across it."""

    max_batches: int
    batches: deque[DurableBatch] = field(default_factory=deque)
    offered: int = 0
    dropped: int = 0

    def offer(self, batch: DurableBatch) -> bool:
        self.offered += 1
        if len(self.batches) >= self.max_batches:
            self.dropped += 1
            return False
        self.batches.append(batch)
        return True

    def take(self) -> list[DurableBatch]:
        """Everything queued, oldest first; the queue is empty after."""
        batches = list(self.batches)
        self.batches.clear()
        return batches

    def __len__(self) -> int:
        return len(self.batches)
