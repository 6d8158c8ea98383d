"""The garbage collector's pure core (shared.bookie.gc): scan-and-compare with its safety
rule, the compaction schedule of GarbageCollectorThread.runWithFlags, and gc.explain."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.bookie.gc import (
    MAJOR,
    MINOR,
    RECLAIMED_LEDGERS_MAX,
    CompactionPolicy,
    EntryLogMetadata,
    GcFlags,
    RangeScan,
    compaction_kind,
    confirmed_deleted,
    effective_flags,
    explain,
    logs_to_compact,
    next_compaction_ms,
    reclaimed_ledgers,
    time_up,
    usage_bucket,
    usage_buckets,
)

# -- scan and compare ---------------------------------------------------------------------


def runs(ids: list[int]) -> list[tuple[int, int]]:
    """The metadata's id_runs: inclusive runs of consecutive ids."""
    out: list[tuple[int, int]] = []
    for i in sorted(ids):
        if out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def list_pages(metadata: set[int], page_size: int):
    """Pages as the metadata service answers `ledger.ranges` (list_page + id_runs)."""
    ids = sorted(metadata)
    after = -1
    while True:
        rest = [i for i in ids if i > after]
        page = rest[:page_size]
        next_after = page[-1] if len(rest) > page_size and page else None
        yield runs(page), next_after
        if next_after is None:
            return
        after = next_after


def scan(bookie: set[int], metadata: set[int], page_size: int, fail_at: int | None = None):
    gc = RangeScan(bookie)
    for number, (ranges, next_after) in enumerate(list_pages(metadata, page_size)):
        if number == fail_at:
            gc.fail("metadata timed out")
            break
        gc.page(ranges, next_after)
    return gc


@pytest.mark.parametrize(
    ("bookie", "metadata", "page_size", "expected"),
    [
        ({1, 2, 3}, {1, 2, 3}, 10, []),
        ({1, 2, 3}, {2}, 10, [1, 3]),
        ({1, 2, 3}, set(), 10, [1, 2, 3]),  # metadata empty: a complete answer
        ({5, 50, 500}, {1, 2, 3, 4, 6, 49, 51}, 2, [5, 50, 500]),  # 500 beyond the last page
        ({10, 11, 12, 20}, {10, 12, 20}, 1, [11]),
        ({7}, {1, 2, 3, 7}, 3, []),
        (set(), {1, 2}, 1, []),
    ],
)
def test_scan_names_the_bookie_ledgers_gone_from_metadata(bookie, metadata, page_size, expected):
    gc = scan(bookie, metadata, page_size)
    assert gc.done and not gc.failed
    assert gc.candidates() == expected


def test_a_listing_that_fails_part_way_deletes_nothing():
    gc = scan({1, 2, 3, 100}, {50, 60, 70}, 1, fail_at=2)
    assert gc.failed == "metadata timed out"
    assert gc.candidates() == []


def test_an_unfinished_listing_deletes_nothing():
    gc = RangeScan({1, 2, 3})
    gc.page([(2, 2)], next_after=2)  # more pages to come
    assert not gc.done
    assert gc.candidates() == []


@pytest.mark.parametrize(
    ("first_page", "second_page"),
    [
        (([(1, 1)], 5), ([(3, 3)], None)),  # a run at or below the cursor
        (([(1, 9)], 5), ([], None)),  # a run beyond the page's own span
        (([(4, 2)], None), None),  # a reversed run
        (([(1, 1)], 5), ([], 5)),  # a cursor that did not advance
    ],
)
def test_a_malformed_page_voids_the_scan(first_page, second_page):
    gc = RangeScan({1, 2, 3, 4, 9})
    gc.page(*first_page)
    if second_page is not None and not gc.failed:
        gc.page(*second_page)
    assert gc.failed.startswith("malformed") or "did not advance" in gc.failed
    assert gc.candidates() == []


def test_the_cursor_follows_the_pages():
    gc = RangeScan({1})
    assert gc.after is None
    gc.page([(0, 2)], next_after=2)
    assert gc.after == 2


@pytest.mark.parametrize(
    ("code", "deleted"),
    [("NO_SUCH_LEDGER", True), (None, False), ("UNAVAILABLE", False), ("INTERNAL", False)],
)
def test_verify_metadata_on_gc_deletes_only_on_no_such_ledger(code, deleted):
    assert confirmed_deleted(code) is deleted


@settings(max_examples=400, deadline=None)
@given(
    metadata=st.sets(st.integers(0, 200)),
    bookie=st.sets(st.integers(0, 220)),
    page_size=st.integers(1, 20),
    fail_at=st.none() | st.integers(0, 30),
)
def test_scan_never_deletes_a_ledger_metadata_has(metadata, bookie, page_size, fail_at):
    gc = scan(bookie, metadata, page_size, fail_at)
    deleted = set(gc.candidates())
    assert deleted <= bookie - metadata
    if gc.failed:
        assert deleted == set()
    else:  # a complete listing finds every ledger gone
        assert deleted == bookie - metadata


# -- the compaction schedule --------------------------------------------------------------

POLICY = CompactionPolicy(
    minor_threshold=0.2,
    minor_interval_ms=3_600_000,
    minor_max_time_ms=-1,
    major_threshold=0.8,
    major_interval_ms=86_400_000,
    major_max_time_ms=-1,
)
ALLOW = CompactionPolicy(0.2, 3_600_000, -1, 0.8, 86_400_000, -1, True)
NO_MAJOR = CompactionPolicy(0.2, 3_600_000, -1, 0.0, 86_400_000, -1)
NO_INTERVALS = CompactionPolicy(0.2, 0, -1, 0.8, 0, -1)
HOUR = 3_600_000
DAY = 24 * HOUR


@pytest.mark.parametrize(
    ("name", "policy", "flags", "now_ms", "expected"),
    [
        ("nothing due", POLICY, GcFlags(), HOUR, ""),
        ("minor interval elapsed", POLICY, GcFlags(), HOUR + 1, MINOR),
        ("major interval elapsed", POLICY, GcFlags(), DAY + 1, MAJOR),
        ("forced major", POLICY, GcFlags(force_major=True), 1, MAJOR),
        ("forced minor", POLICY, GcFlags(force_minor=True), 1, MINOR),
        ("forced both: major covers minor", POLICY, GcFlags(True, True), 1, MAJOR),
        ("major suspended: minor runs", POLICY, GcFlags(suspend_major=True), DAY + 1, MINOR),
        ("both suspended", POLICY, GcFlags(suspend_major=True, suspend_minor=True), DAY + 1, ""),
        ("forced overrides suspended", POLICY, GcFlags(True, False, True, True), 1, MAJOR),
        ("major disabled (threshold 0)", NO_MAJOR, GcFlags(force_major=True), DAY + 1, MINOR),
        ("intervals 0: never by itself", NO_INTERVALS, GcFlags(), 10 * DAY, ""),
        ("intervals 0: forceable", NO_INTERVALS, GcFlags(force_minor=True), 1, MINOR),
        ("disk full suspends both", POLICY, GcFlags(disk_full=True), DAY + 1, ""),
        ("disk full, forced, still suspended", POLICY, GcFlags(True, disk_full=True), 1, ""),
        ("disk full with allow forces", ALLOW, GcFlags(disk_full=True), 1, MAJOR),
        ("allow, disk fine: schedule", ALLOW, GcFlags(), 1, ""),
    ],
)
def test_compaction_kind(name, policy, flags, now_ms, expected):
    assert compaction_kind(policy, flags, now_ms, last_major_ms=0, last_minor_ms=0) == expected


def test_a_full_disk_without_allow_suspends_both_even_if_forced():
    flags = effective_flags(GcFlags(force_major=True, disk_full=True), POLICY)
    assert flags.suspend_major and flags.suspend_minor


def log(log_id: int, size: int, live: dict[int, int], dir: int = 0) -> EntryLogMetadata:
    return EntryLogMetadata(dir, log_id, size, live)


def test_logs_to_compact_lowest_usage_first_below_the_threshold():
    logs = [
        log(1, 100, {1: 50}),  # 0.5
        log(2, 100, {1: 5}),  # 0.05
        log(3, 100, {}),  # empty: deleted, not compacted
        log(4, 100, {2: 15}),  # 0.15
        log(5, 100, {2: 90}),  # 0.9
        log(6, 100, {3: 5}, dir=1),  # 0.05, other dir
    ]
    assert [(m.dir, m.log_id) for m in logs_to_compact(logs, 0.2)] == [(0, 2), (1, 6), (0, 4)]
    major = [(m.dir, m.log_id) for m in logs_to_compact(logs, 0.8)]
    assert major == [(0, 2), (1, 6), (0, 4), (0, 1)]  # covers the minor ones


@pytest.mark.parametrize(
    ("started", "now", "limit", "up"),
    [(0, 10, -1, False), (0, 10, 0, False), (0, 9, 10, False), (0, 10, 10, True)],
)
def test_time_up(started, now, limit, up):
    assert time_up(started, now, limit) is up


@pytest.mark.parametrize(
    ("usage", "bucket"), [(0.0, 0), (0.05, 0), (0.1, 1), (0.55, 5), (0.99, 9), (1.0, 9)]
)
def test_usage_bucket(usage, bucket):
    assert usage_bucket(usage) == bucket


def test_usage_buckets_count_logs_by_tenths():
    logs = [log(1, 100, {}), log(2, 100, {1: 15}), log(3, 100, {1: 100}), log(4, 100, {1: 19})]
    assert usage_buckets(logs) == [1, 2, 0, 0, 0, 0, 0, 0, 0, 1]


def test_next_compaction_ms():
    assert next_compaction_ms(POLICY, MINOR, 1000) == 1000 + HOUR
    assert next_compaction_ms(NO_MAJOR, MAJOR, 1000) == 0
    assert next_compaction_ms(NO_INTERVALS, MINOR, 1000) == 0


@pytest.mark.parametrize(
    ("policy", "flags", "kind", "meta", "words"),
    [
        (POLICY, GcFlags(), MINOR, None, "current log: never compacted"),
        (POLICY, GcFlags(), MINOR, log(1, 100, {}), "delete: no live ledger"),
        (POLICY, GcFlags(), MINOR, log(1, 100, {1: 5}), "compact: usage 0.05 < 0.2"),
        (POLICY, GcFlags(), MINOR, log(1, 100, {1: 45}), "keep: usage 0.45 >= 0.2"),
        (POLICY, GcFlags(), MAJOR, log(1, 100, {1: 45}), "compact: usage 0.45 < 0.8"),
        (POLICY, GcFlags(suspend_minor=True), MINOR, log(1, 100, {1: 5}), "suspended"),
        (POLICY, GcFlags(disk_full=True), MAJOR, log(1, 100, {1: 5}), "suspended"),
        (ALLOW, GcFlags(disk_full=True), MAJOR, log(1, 100, {1: 5}), "compact: usage 0.05 < 0.8"),
        (NO_MAJOR, GcFlags(), MAJOR, log(1, 100, {1: 5}), "disabled"),
        (NO_MAJOR, GcFlags(), MAJOR, log(1, 100, {}), "delete: no live ledger"),
    ],
)
def test_explain(policy, flags, kind, meta, words):
    assert explain(policy, flags, kind, meta) == words


@settings(max_examples=300, deadline=None)
@given(
    initial=st.sets(st.integers(0, 100)),
    changes=st.lists(
        st.tuples(st.booleans(), st.integers(0, 120)), max_size=30
    ),  # between pages: (create?, id)
    page_size=st.integers(1, 10),
)
def test_a_ledger_that_exists_throughout_the_listing_is_never_deleted(initial, changes, page_size):
    """Ledgers created and deleted while the pages are fetched (keyset pages over the
    metadata as it is at each page): whatever exists from the snapshot to the last page is
    kept; only the bookie's ledgers may be named."""
    metadata = set(initial)
    bookie = set(initial)  # every ledger the bookie holds was created before the snapshot
    throughout = set(initial)
    gc = RangeScan(bookie)
    changes = list(changes)
    while not gc.done:
        after = -1 if gc.after is None else gc.after
        rest = sorted(i for i in metadata if i > after)
        page = rest[:page_size]
        next_after = page[-1] if len(rest) > page_size and page else None
        gc.page(runs(page), next_after)
        if changes:
            create, ledger_id = changes.pop(0)
            if create:
                metadata.add(ledger_id)
            else:
                metadata.discard(ledger_id)
                throughout.discard(ledger_id)
    deleted = set(gc.candidates())
    assert deleted <= bookie
    assert not deleted & throughout


def test_a_deleted_ledgers_bytes_stay_with_its_log_until_the_log_goes() -> None:
    meta = EntryLogMetadata(0, 1, 1000, {1: 100, 2: 300})
    meta.forget([2, 7])  # 7: not in this log
    assert (meta.ledgers, meta.deleted, meta.live_bytes) == ({1: 100}, {2: 300}, 100)
    copy = meta.copy()
    copy.forget([1])
    assert meta.deleted == {2: 300} and copy.deleted == {2: 300, 1: 100}


def test_a_gc_event_lists_the_largest_reclaimed_ledgers_and_says_when_it_left_some_out() -> None:
    assert reclaimed_ledgers({}) == ({}, False)
    listed, truncated = reclaimed_ledgers({5: 10, 6: 30, 7: 10, 8: 20})
    assert list(listed.items()) == [("6", 30), ("8", 20), ("5", 10), ("7", 10)]
    assert not truncated
    listed, truncated = reclaimed_ledgers({5: 10, 6: 30, 7: 10, 8: 20}, limit=2)
    assert listed == {"6": 30, "8": 20} and truncated
    many = {ledger_id: ledger_id for ledger_id in range(RECLAIMED_LEDGERS_MAX + 1)}
    listed, truncated = reclaimed_ledgers(many)
    assert len(listed) == RECLAIMED_LEDGERS_MAX and "0" not in listed and truncated
