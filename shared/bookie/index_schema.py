"""The ledgerstore's index (`index.sqlite` in the first ledger directory): its SQLite
schema and the queries that read it. Pure: SQL text and id conversions, no IO.

The ledgerstore (`EntryIndex`) creates and writes it; `quire shell ledger` opens it
read-only with the same queries.

    entries     (ledger, entry) -> entry log id, offset of the entry's size field, frame
                length, ledger directory index
    ledgers     per-ledger facts: last entry, LAC, digest code, first entry
    checkpoint  the journal position the index reflects and the first directory's log end
    journal_positions  with several journal directories only: the position of each journal
                after the first (whose position is in `checkpoint`), as of that checkpoint
    log_ends    each ledger directory's entry log end as of that checkpoint
    facts       key/value facts (`unsure`: why absent entries answer UNKNOWN; `usage`:
                the entry_log_usage table is complete, see below)
    entry_log_usage  (dir, log, ledger) -> bytes of the ledger's entries in that entry log
                (each with its 20-byte head): what the garbage collector deletes and
                compacts by (BookKeeper's EntryLogMetadata). Written in the same
                transaction as the entries rows it counts, so the two never disagree:
                every entries row pointing into a log has a usage row for (log, ledger);
                a log with no usage row holds nothing live.
"""

from __future__ import annotations

INDEX_FILE = "index.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    ledger_id INTEGER NOT NULL, entry_id INTEGER NOT NULL,
    log_id INTEGER NOT NULL, offset INTEGER NOT NULL, size INTEGER NOT NULL,
    dir INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (ledger_id, entry_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledgers (
    ledger_id INTEGER PRIMARY KEY, last_entry_id INTEGER NOT NULL, lac INTEGER NOT NULL,
    digest INTEGER NOT NULL DEFAULT 0, first_entry INTEGER NOT NULL DEFAULT -1);
CREATE TABLE IF NOT EXISTS checkpoint (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    journal_file INTEGER NOT NULL, journal_offset INTEGER NOT NULL,
    log_id INTEGER NOT NULL, log_size INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS log_ends (
    dir INTEGER PRIMARY KEY, log_id INTEGER NOT NULL, log_size INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS facts (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entry_log_usage (
    dir INTEGER NOT NULL, log_id INTEGER NOT NULL, ledger_id INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    PRIMARY KEY (dir, log_id, ledger_id)) WITHOUT ROWID;
"""
# Created only by a bookie with several journal directories: with one, the index is as
# it was (its one position is in `checkpoint`).
JOURNAL_POSITIONS_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal_positions (
    journal INTEGER PRIMARY KEY CHECK (journal >= 1),
    journal_file INTEGER NOT NULL, journal_offset INTEGER NOT NULL);
"""
SELECT_JOURNAL_POSITIONS = "SELECT journal, journal_file, journal_offset FROM journal_positions"
INSERT_JOURNAL_POSITION = "INSERT OR REPLACE INTO journal_positions VALUES (?, ?, ?)"
# Columns added after the first release of the schema: (table, column, definition).
ADDED_COLUMNS = [
    ("entries", "dir", "INTEGER NOT NULL DEFAULT 0"),
    ("ledgers", "digest", "INTEGER NOT NULL DEFAULT 0"),
    ("ledgers", "first_entry", "INTEGER NOT NULL DEFAULT -1"),
]

SELECT_CHECKPOINT = "SELECT journal_file, journal_offset, log_id, log_size FROM checkpoint"
SELECT_LOG_ENDS = "SELECT dir, log_id, log_size FROM log_ends"
SELECT_LEDGERS = "SELECT ledger_id, last_entry_id, lac, digest, first_entry FROM ledgers"
SELECT_LEDGER = "SELECT last_entry_id, lac FROM ledgers WHERE ledger_id = ?"
SELECT_FACTS = "SELECT key, value FROM facts"
# Rows of both entry queries: (log_id, offset, size, dir), the second after the entry id.
SELECT_ENTRY = "SELECT log_id, offset, size, dir FROM entries WHERE ledger_id = ? AND entry_id = ?"
SELECT_ENTRY_RANGE = (
    "SELECT entry_id, log_id, offset, size, dir FROM entries "
    "WHERE ledger_id = ? AND entry_id BETWEEN ? AND ? ORDER BY entry_id"
)
INSERT_ENTRY = "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?)"
INSERT_LEDGER = (
    "INSERT OR REPLACE INTO ledgers "
    "(ledger_id, last_entry_id, lac, digest, first_entry) VALUES (?, ?, ?, ?, ?)"
)
INSERT_CHECKPOINT = "INSERT OR REPLACE INTO checkpoint VALUES (1, ?, ?, ?, ?)"
INSERT_LOG_END = "INSERT OR REPLACE INTO log_ends VALUES (?, ?, ?)"
INSERT_FACT = "INSERT OR REPLACE INTO facts VALUES (?, ?)"
USAGE_FACT = "usage"  # fact set once entry_log_usage counts every entries row

# A deleted ledger: these first in its checkpoint's transaction, then the flush's inserts
# (entries journaled after the DELETED record, a zombie writer's, survive).
DELETE_LEDGER_ENTRIES = "DELETE FROM entries WHERE ledger_id = ?"
DELETE_LEDGER = "DELETE FROM ledgers WHERE ledger_id = ?"
DELETE_LEDGER_USAGE = "DELETE FROM entry_log_usage WHERE ledger_id = ?"
SELECT_USAGE = "SELECT dir, log_id, ledger_id, bytes FROM entry_log_usage"
ADD_USAGE = (
    "INSERT INTO entry_log_usage VALUES (?, ?, ?, ?) "
    "ON CONFLICT (dir, log_id, ledger_id) DO UPDATE SET bytes = bytes + excluded.bytes"
)
DELETE_LOG_USAGE = "DELETE FROM entry_log_usage WHERE dir = ? AND log_id = ?"
# Compaction's switch: an entry moves only if its row still points at the old copy (a
# newer copy written meanwhile, or the ledger deleted meanwhile, wins).
MOVE_ENTRY = (
    "UPDATE entries SET log_id = ?, offset = ?, dir = ? "
    "WHERE ledger_id = ? AND entry_id = ? AND dir = ? AND log_id = ? AND offset = ?"
)

MAX_ENTRY_ID = 2**63 - 1  # every entry of a ledger: SELECT_ENTRY_RANGE from 0 to this


def to_sql_id(ledger_id: int) -> int:
    """A u64 ledger id as SQLite stores it (integers there are signed 64-bit)."""
    return ledger_id - (1 << 64) if ledger_id >= 1 << 63 else ledger_id


def from_sql_id(value: int) -> int:
    return value + (1 << 64) if value < 0 else value
