"""The simulated metadata store: one row per ledger, compare-and-set on its version, with
foreign writes and lost answers injected, checking every write against the ledger rules."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.models import LedgerMetadata, LedgerState, UpdateLedgerRequest
from shared.protocol.messages import LedgerUpdated, LedgerUpdateFailed
from shared.quorum import write_set

if TYPE_CHECKING:
    from quire.sim.model import World


class SimMetadata:
    """The metadata service's row of one ledger: CAS on the version, checked on every write.
    `tag` names the ledger in the log when the world holds several."""

    def __init__(self, world: World, metadata: LedgerMetadata, tag: str) -> None:
        self.world = world
        self.ledger = metadata
        self.tag = tag
        self.foreign_writes = 0

    def write(self, new: LedgerMetadata, who: str, replication: bool = False) -> None:
        """`replication`: a replicator's update of the ensembles (not its recovery's)."""
        old = self.ledger
        self.world.check(new.version == old.version + 1, "metadata versions increase by one")
        if old.state is LedgerState.CLOSED:
            # Re-replication may replace bookies of a closed ledger; nothing else changes.
            segments_same = new.segments == old.segments or (
                replication
                and [s.first_entry_id for s in new.segments]
                == [s.first_entry_id for s in old.segments]
            )
            self.world.check(
                (new.state, new.last_entry_id, new.length)
                == (old.state, old.last_entry_id, old.length)
                and segments_same,
                f"a CLOSED ledger changed: {who} wrote {new.state} last={new.last_entry_id}",
            )
        if replication and new.segments != old.segments:
            self._check_replacements(old, new, who)
        if new.state is LedgerState.OPEN:
            self.world.check(old.state is LedgerState.OPEN, "a ledger never reopens")
        self.ledger = new
        self.world.log(
            f"meta {self.tag}v{new.version} {new.state.value} last={new.last_entry_id} "
            f"segments={[(s.first_entry_id, s.bookies) for s in new.segments]} by {who}"
        )

    def _check_replacements(self, old: LedgerMetadata, new: LedgerMetadata, who: str) -> None:
        """A replicator names a new bookie in a segment only once every entry of that
        fragment is durable on it (synced: a crash would not lose it)."""
        olds = {s.first_entry_id: s.bookies for s in old.segments}
        quorum = new.quorum
        for position, segment in enumerate(new.segments):
            before = olds.get(segment.first_entry_id)
            self.world.check(before is not None, f"{who} made a new segment")
            assert before is not None
            if position + 1 < len(new.segments):
                last = new.segments[position + 1].first_entry_id - 1
            else:
                self.world.check(
                    new.state is LedgerState.CLOSED or segment.bookies == before,
                    f"{who} changed the open last segment",
                )
                last = new.last_entry_id if new.last_entry_id is not None else -1
            if new.state is LedgerState.CLOSED and new.last_entry_id is not None:
                last = min(last, new.last_entry_id)
            for index, (was, now) in enumerate(zip(before, segment.bookies, strict=True)):
                if was == now:
                    continue
                bookie = self.world.bookies[now]
                for entry_id in range(segment.first_entry_id, last + 1):
                    if index in write_set(entry_id, quorum):
                        self.world.check(
                            (new.ledger_id, entry_id) in bookie.entries,
                            f"{self.tag}{who} named {now} for entry {entry_id} before it "
                            "held it durably",
                        )

    def update(self, request: UpdateLedgerRequest, who: str) -> LedgerUpdated | LedgerUpdateFailed:
        faults = self.world.faults
        if (
            self.world.random_faults
            and self.ledger.state is not LedgerState.CLOSED
            and self.world.rng.random() < faults.meta_conflict
        ):
            # Someone else's harmless CAS (re-replication of the metadata, custom fields).
            self.foreign_writes += 1
            bumped = dict(self.ledger.metadata, foreign=str(self.foreign_writes))
            self.write(
                self.ledger.model_copy(
                    update={"version": self.ledger.version + 1, "metadata": bumped}
                ),
                "foreign",
            )
        if request.expected_version != self.ledger.version:
            return LedgerUpdateFailed(self.ledger, "BAD_VERSION")
        changes = {
            name: getattr(request, name)
            for name in ("state", "last_entry_id", "length", "segments")
            if getattr(request, name) is not None
        }
        replication = who.endswith("replicator") and request.state is None
        self.write(
            self.ledger.model_copy(update={**changes, "version": self.ledger.version + 1}),
            who,
            replication,
        )
        if self.world.random_faults and self.world.rng.random() < faults.meta_answer_lost:
            return LedgerUpdateFailed(self.ledger, "UNAVAILABLE (answer lost, re-read)")
        return LedgerUpdated(self.ledger)
