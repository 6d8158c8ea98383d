"""The simulated metadata store: one row per ledger, compare-and-set on its version, with
foreign writes and lost answers injected, checking every write against the ledger rules."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.models import LedgerMetadata, LedgerState, UpdateLedgerRequest
from shared.protocol.messages import LedgerUpdated, LedgerUpdateFailed

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

    def write(self, new: LedgerMetadata, who: str) -> None:
        old = self.ledger
        self.world.check(new.version == old.version + 1, "metadata versions increase by one")
        if old.state is LedgerState.CLOSED:
            self.world.check(
                (new.state, new.last_entry_id, new.length, new.segments)
                == (old.state, old.last_entry_id, old.length, old.segments),
                f"a CLOSED ledger changed: {who} wrote {new.state} last={new.last_entry_id}",
            )
        if new.state is LedgerState.OPEN:
            self.world.check(old.state is LedgerState.OPEN, "a ledger never reopens")
        self.ledger = new
        self.world.log(
            f"meta {self.tag}v{new.version} {new.state.value} last={new.last_entry_id} "
            f"segments={[(s.first_entry_id, s.bookies) for s in new.segments]} by {who}"
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
        self.write(
            self.ledger.model_copy(update={**changes, "version": self.ledger.version + 1}), who
        )
        if self.world.random_faults and self.world.rng.random() < faults.meta_answer_lost:
            return LedgerUpdateFailed(self.ledger, "UNAVAILABLE (answer lost, re-read)")
        return LedgerUpdated(self.ledger)
