"""Where things are in the repository, for tests that check the code itself."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The pure cores (STYLE.md rule 1): no IO, no clock, no randomness; mypy-checked.
CORES = [
    "shared/quorum.py",
    "shared/digest.py",
    "shared/wire.py",
    "shared/status.py",
    "shared/bookie/journal_format.py",
    "shared/bookie/entrylog_format.py",
    "shared/bookie/index_schema.py",
    "shared/bookie/rules.py",
    *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("services/*/core.py")),
    "services/gateway/recovery.py",
    "quire/sim/model.py",
]
