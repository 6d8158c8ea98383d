"""Every NATS subject Quire uses is built here, and nowhere else.

<prefix>.bookie.<bookie_id>.<op>   requests to one bookie (journal or ledgerstore)
<prefix>.meta.<area>.<op>          requests to the metadata service (queue group)
<prefix>.meta.watch.ledger.<id>    a ledger's new metadata after each change (core NATS)
<prefix>.<service>.<op>            requests to the auditor or replicators
<prefix>.auditor.<candidate>.<op>  operator commands to one auditor (the elected one serves them)
<prefix>.events.<kind>             domain events, captured by the QUIRE_EVENTS stream
"""

from __future__ import annotations

from dataclasses import dataclass

# Bookie-internal: the journal tells its ledgerstore that records were committed, and the
# ledgerstore tells its journal how far it has checkpointed.
JOURNAL_COMMITTED = "journal.committed"
JOURNAL_CHECKPOINT = "journal.checkpoint"
# The ledgerstore's garbage collector asks the journal to forget deleted ledgers.
JOURNAL_DELETE = "journal.delete"

METADATA_QUEUE_GROUP = "quire-metadata"
EVENT_STREAM = "QUIRE_EVENTS"


@dataclass(frozen=True)
class Subjects:
    prefix: str = "quire"

    def bookie(self, bookie_id: str, op: str) -> str:
        return f"{self.prefix}.bookie.{bookie_id}.{op}"

    def meta(self, op: str) -> str:
        """`op` is dotted, e.g. "ledger.create"."""
        return f"{self.prefix}.meta.{op}"

    def ledger_watch(self, ledger_id: int) -> str:
        """Change notifications of one ledger (BookKeeper's metadata watch)."""
        return f"{self.prefix}.meta.watch.ledger.{ledger_id}"

    @property
    def ledger_watches(self) -> str:
        """Every ledger's change notifications (to observe them all, e.g. `nats sub`)."""
        return f"{self.prefix}.meta.watch.ledger.*"

    def service(self, kind: str, op: str) -> str:
        """Requests to a singleton-style service, e.g. ("auditor", "status")."""
        return f"{self.prefix}.{kind}.{op}"

    def auditor_command(self, candidate_id: str, op: str) -> str:
        """An operator command (trigger_audit, recover_bookie, decommission) to the auditor
        `candidate_id`: only the elected one acts, so callers address the leader by name."""
        return f"{self.prefix}.auditor.{candidate_id}.{op}"

    def event(self, kind: str) -> str:
        """`kind` is dotted, e.g. "ledger.created"."""
        return f"{self.prefix}.events.{kind}"

    @property
    def events_wildcard(self) -> str:
        return f"{self.prefix}.events.>"

    @property
    def event_stream(self) -> str:
        # Stream names cannot contain dots; a non-default prefix gets its own stream.
        if self.prefix == "quire":
            return EVENT_STREAM
        return f"{EVENT_STREAM}_{self.prefix.replace('.', '_').upper()}"
