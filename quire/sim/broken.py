"""Deliberately broken protocol and bookie rules, to show that the simulator catches them
(its power test). Each is a subclass of the real core or rule with one rule bent; the real
one is untouched."""

from __future__ import annotations

from quire.sim.model import Faults
from shared.bookie.journal_format import EntryRecord, LacRecord, Record
from shared.bookie.rules import BookieLedgerState
from shared.protocol.recovery import LedgerRecovery, RecoveryPhase
from shared.protocol.replication import LedgerReplication, ReplicationPhase
from shared.protocol.writer import LedgerWriter
from shared.quorum import AckSet, QuorumSpec
from shared.status import BookieStatus
from shared.wire import FLAG_RECOVERY_ADD, ReadResult


class EarlyAckWriter(LedgerWriter):
    """Completes an add at Qa - 1 acknowledgements."""

    def _add_one(self, payload: bytes, now_ms: int) -> None:
        super()._add_one(payload, now_ms)
        spec = self.quorum
        weaker = QuorumSpec(spec.ensemble_size, spec.write_quorum, max(1, spec.ack_quorum - 1))
        self._pending[self.last_entry_id].acks = AckSet(self.last_entry_id, weaker)


class LateDeadlineWriter(LedgerWriter):
    """Says its next deadline a little late: a tick before it would time out an add, start
    a delayed ensemble change or send the explicit LAC."""

    def next_deadline_ms(self) -> int | None:
        deadline = super().next_deadline_ms()
        return None if deadline is None else deadline + 5


class UnfencedRecovery(LedgerRecovery):
    """Skips the fence: reads forward from the last segment's start as if every bookie
    had answered, so the old writer can go on being acknowledged."""

    def _start_fence(self) -> None:
        self._enter(RecoveryPhase.FENCE)
        self._fenced = self.metadata
        self.max_lac = self.metadata.segments[-1].first_entry_id - 1
        self._fenced_ids = set(self.metadata.segments[-1].bookies)
        self._start_read()


class UnknownIsAbsentRecovery(LedgerRecovery):
    """Counts any answer but a good copy as "the bookie does not have it" (UNKNOWN and
    errors included)."""

    def _counts_as_absent(self, entry_id: int, bookie_id: str, result: ReadResult | None) -> bool:
        return result is None or result.status is not BookieStatus.OK


class FenceBlindLedgerState(BookieLedgerState):
    """A bookie that takes a normal add on a fenced ledger, as if every add were a
    recovery add: the old writer goes on being acknowledged after recovery fenced it."""

    def check_add(self, ledger_id: int, master_key: bytes, flags: int) -> BookieStatus:
        return super().check_add(ledger_id, master_key, flags | FLAG_RECOVERY_ADD)


class SharedLacLedgerState(BookieLedgerState):
    """Keeps its LACs as if the bookie had one, not one per ledger: an add's or a write_lac's
    LAC raises every ledger's. Harmless with one ledger; only a world of several catches it
    (a reader, or a recovery's fence, learns another ledger's LAC)."""

    def apply(self, record: Record) -> None:
        super().apply(record)
        if isinstance(record, EntryRecord | LacRecord):
            for facts in self._ledgers.values():
                facts.lac = max(facts.lac, record.lac)


class UncopiedTailReplication(LedgerReplication):
    """Stores a fragment's replacement once its entries are read, dropping the last ones
    read instead of waiting until the replacement holds them all."""

    def _pump(self) -> None:
        copy = self._copy
        if self.phase is ReplicationPhase.COPY and copy is not None:
            self._collect_reads(copy)
            if copy.read_done and copy.queued:
                for entry_id in copy.queued:
                    del copy.kept[entry_id]
                copy.queued.clear()
        super()._pump()


# Name -> the run overrides that break one rule (`python -m quire.sim --break NAME`).
BROKEN: dict[str, dict] = {
    "early-ack": {
        "writer_class": EarlyAckWriter,
        "ensemble_size": 3,
        "write_quorum": 3,
        "ack_quorum": 2,
    },
    "late-deadline": {"writer_class": LateDeadlineWriter},
    "no-fence": {"recovery_class": UnfencedRecovery},
    "add-after-fence": {"bookie_state_class": FenceBlindLedgerState},
    "shared-lac": {"bookie_state_class": SharedLacLedgerState},
    "uncopied-tail": {"replication_class": UncopiedTailReplication, "lose_bookie": True},
    "unknown-absent": {
        "recovery_class": UnknownIsAbsentRecovery,
        "recoveries": 3,
        "faults": Faults(crash_every_ms=100, down_ms=(10, 100), restart_unsure_ms=(100, 400)),
    },
}
