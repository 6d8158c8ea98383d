"""The client quorum protocol as a library: what a BookKeeper client decides, with no IO.

- `writer.LedgerWriter`: one ledger's writer (LedgerHandle, PendingAddOp): adds, ensemble
  changes, close.
- `flow.AddFlowControl`: the writer's flow control, at most N add requests unanswered per
  bookie, the rest held and merged.
- `reader.LedgerReader`: reads a range (PendingReadOp) in order, in per-bookie windows,
  sticky blocks, speculative reads and retries within a budget.
- `recovery.LedgerRecovery`: fence, find the last entry, re-write the tail, close
  (LedgerRecoveryOp).
- `replication.LedgerReplication`: copy a ledger's fragments on bad bookies to new ones and
  store the new ensembles (LedgerChecker, LedgerFragmentReplicator).
- `ensemble.choose_ensemble`: where a new ledger goes at random; `placement.PlacementPolicy`:
  the random, rack-aware and zone-aware policies (new ensembles, replacements, adherence).
- `messages`: the events the cores take and the commands they return.
- `transport`: what a driver needs of the bookies and the metadata store (interfaces).
- `driver`: the asyncio driver over the transports (`ProtocolClient`, `WriterHandle`), which
  the gateway and the bench run. It is the one IO module of the package.

Rules of the cores (every module but `driver` and `transport`; h11's and raft's):
- No IO, no clock, no randomness: time comes in as `now_ms`, randomness as a `random.Random`
  the caller seeded. A driver does the sending: `driver.py`, or the simulator's
  (`quire.sim` runs these very classes under seeded faults).
- Input is `step(event, now_ms)` and `tick(now_ms)`; output is `take_commands()`: what the
  driver must now send, complete or fail, in order.
- A user error raises `QuireError` at once; a broken invariant raises `AssertionError`.
"""
