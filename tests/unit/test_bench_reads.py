"""`quire bench read`'s parts without a cluster: the page-cache eviction it relies on for a
cold read, the pass that checks the order and count of what it reads, and the tailing
run against a fake ledger. Counts only, no timings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from quire.bench import pagecache
from quire.bench.reads import Batch, Tail, TailSpec, read_pass, tailing


def test_page_cache_eviction_of_the_files_only(tmp_path) -> None:
    evicted, kept = tmp_path / "evicted", tmp_path / "kept"
    for path in (evicted, kept):
        path.write_bytes(b"x" * 1_000_000)
        path.read_bytes()
    (tmp_path / "empty").write_bytes(b"")
    assert pagecache.resident([evicted]) == {"resident_bytes": 1_000_000, "file_bytes": 1_000_000}
    assert sorted(p.name for p in pagecache.files_under([tmp_path, tmp_path / "missing"])) == [
        "empty",
        "evicted",
        "kept",
    ]
    pagecache.drop([evicted, tmp_path / "removed meanwhile"])
    assert pagecache.resident([evicted])["resident_bytes"] == 0
    assert pagecache.resident([kept])["resident_bytes"] == 1_000_000


async def batches(*ranges: range) -> AsyncIterator[Batch]:
    for entry_ids in ranges:
        yield [(entry_id, b"ab") for entry_id in entry_ids]


def test_read_pass_counts_entries_bytes_and_batches() -> None:
    result = asyncio.run(read_pass(batches(range(5, 8), range(8, 10)), 5, 9))
    assert (result.entries, result.bytes, result.batches, result.first_error) == (5, 10, 2, None)
    assert result.batch_wait.count == 2


def test_read_pass_reports_a_gap_and_a_short_stream() -> None:
    gap = asyncio.run(read_pass(batches(range(0, 3), range(4, 6)), 0, 5))
    assert gap.first_error == "RuntimeError: entry 4 came where 3 was due"
    short = asyncio.run(read_pass(batches(range(0, 3)), 0, 5))
    assert short.first_error == "RuntimeError: the stream ended after entry 2, not 5"
    assert short.entries == 3


class FakeTail(Tail):
    """A ledger in memory: an append confirms its entry at once; readers wait for it."""

    def __init__(self) -> None:
        self.entries: list[bytes] = []
        self.closed = False
        self.changed = asyncio.Condition()

    async def open(self) -> None:
        pass

    async def create(self) -> None:
        pass

    async def append(self, payload: bytes) -> int:
        async with self.changed:
            self.entries.append(payload)
            self.changed.notify_all()
            return len(self.entries) - 1

    async def close_ledger(self) -> None:
        async with self.changed:
            self.closed = True
            self.changed.notify_all()

    async def follow(self) -> AsyncIterator[Batch]:
        following = 0
        while True:
            async with self.changed:
                await self.changed.wait_for(
                    lambda following=following: self.closed or len(self.entries) > following
                )
                batch = list(enumerate(self.entries))[following:]
                done = self.closed
            if batch:
                yield batch
                following = batch[-1][0] + 1
            if done and following == len(self.entries):
                return

    async def aclose(self) -> None:
        pass


def test_tailing_every_reader_reads_every_entry() -> None:
    tail = FakeTail()
    spec = TailSpec(rate=200, readers=3, duration_s=0.1, entry_size=16)
    figures = asyncio.run(tailing(tail, spec, lambda message: None))
    written = len(tail.entries)
    assert written > 0 and figures["entries_written"] == written
    assert figures["entries_read"] == 3 * written
    assert figures["errors"] == 0 and figures["first_error"] is None
    assert tail.entries[0] == bytes(16)
