"""Where things are in the repository, for tests that check the code itself."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The pure cores (STYLE.md rule 1): no IO, no clock, no randomness; mypy-checked.
CORES = [
    "shared/quorum.py",
    "shared/autorecovery.py",
    "shared/digest.py",
    "shared/wire.py",
    "shared/status.py",
    "shared/autorecovery_worker.py",
    "shared/bookie/journal_format.py",
    "shared/bookie/entrylog_format.py",
    "shared/bookie/index_schema.py",
    "shared/bookie/rules.py",
    "shared/bookie/gc.py",
    "shared/protocol/messages.py",
    "shared/protocol/ensemble.py",
    "shared/protocol/placement.py",
    "shared/protocol/flow.py",
    "shared/protocol/writer.py",
    "shared/protocol/reader.py",
    "shared/protocol/recovery.py",
    "shared/protocol/replication.py",
    *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("services/*/core.py")),
    "quire/sim/model.py",
    "quire/sim/bookie.py",
    "quire/sim/metadata.py",
    "quire/sim/clients.py",
    "quire/sim/ledger.py",
    "quire/faults/checker.py",
]
