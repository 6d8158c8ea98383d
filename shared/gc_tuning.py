"""Python's cyclic garbage collector, set for processes that hold long-lived state for
thousands of ledgers (the gateway, the bench's in-process client, a bookie).

With CPython's default thresholds (700, 10, 10) a full collection runs whenever the
long-lived objects grew by a quarter, and each walks every object in the heap. With many
open ledgers the heap is large and, under load, pending adds live long enough to reach the
oldest generation: `quire bench --ledgers 5000 --rate 5000` (in process) spent 20 s of its
35 s in 52 full collections and reached 3,390 entries/s at a p50 of 8.3 s. With these
thresholds the same run made no full collection, 54 young ones (1.5 s in all) and kept the
rate (4,987 entries/s). Almost all the garbage of an add is freed by reference counting
the moment it is dropped; the collector is only there for cycles, which are rare on these
paths, so collecting less often costs little memory.

`gc.freeze()` at start moves what the process built while starting (modules, classes,
settings) out of every later collection: it is never garbage.
"""

from __future__ import annotations

import gc

# (young, middle, old): a young collection every 50,000 net allocations, a middle one every
# 20 young ones, an old (full) one every 100 middle ones, and then only if the long-lived
# objects grew by a quarter (CPython's own rule).
GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    """Call once a process has started, before it takes load."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
