"""The bookie as a library: its on-disk formats and its per-ledger rules.

Used by the journal and ledgerstore services, the storage CLI (`quire shell readjournal|
readlog|ledger|lastmark`) and the simulator, so that each format and rule is written once.

Pure (no IO, no clock):
    journal_format   journal records, journal files, LastLogMark, ledger-state snapshot,
                     JournalPosition
    entrylog_format  entry logs (BookKeeper's interleaved EntryLogger)
    index_schema     the ledgerstore index's SQLite schema and queries
    rules            BookieLedgerState (master key, fence, LAC, recovery adds), add
                     admission, the fence/write_lac records, the absent/UNKNOWN read answer
IO:
    journal_dir      listing a journal directory; a position in one of the bookie's
                     journals as the journal and the ledgerstore pass it on NATS
    files            FileLayer: every write, sync, truncate of the bookie's files (the fault
                     tests swap it)
    fault_files      FaultFiles: the FileLayer of a process run by the fault suite
                     (QUIRE_FAULTS_DIR): files.log, injected EIO/ENOSPC, unsafe-no-fsync
    cookie           the bookie's identity cookie on disk and its reconciliation
"""
