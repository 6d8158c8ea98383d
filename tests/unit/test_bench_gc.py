"""What `quire bench gc` counts: the bytes one entry takes in an entry log (against the
real encoders), the entry-log files it sums, and the seconds of a run it takes as "during
compaction"."""

from __future__ import annotations

from pathlib import Path

from quire.bench.gc import entry_log_bytes, record_size, seconds_within
from quire.bench.histogram import Histogram
from quire.bench.load import LoadResult, TimelinePoint
from shared.bookie.entrylog_format import encode_entry, entry_log_name
from shared.digest import DigestManager


def test_record_size_is_what_the_ledgerstore_writes_for_a_crc32c_entry() -> None:
    for size in (0, 1, 1024, 65_536):
        frame = DigestManager("crc32c").sign(7, 42, 41, size, b"x" * size)
        assert record_size(size) == len(encode_entry(7, 42, frame))


def test_entry_log_bytes_sums_entry_logs_only_in_every_ledger_directory(tmp_path: Path) -> None:
    (tmp_path / "ledgers").mkdir()
    (tmp_path / "ledgers2").mkdir()
    (tmp_path / "ledgers" / entry_log_name(1)).write_bytes(b"a" * 100)
    (tmp_path / "ledgers" / entry_log_name(2)).write_bytes(b"a" * 50)
    (tmp_path / "ledgers2" / entry_log_name(1)).write_bytes(b"a" * 7)
    # Neither a compaction's temporary output nor the index counts.
    (tmp_path / "ledgers" / (entry_log_name(3) + ".compacting")).write_bytes(b"a" * 1000)
    (tmp_path / "ledgers" / "index.sqlite").write_bytes(b"a" * 1000)
    assert entry_log_bytes(tmp_path) == (157, 3)


def test_seconds_within_takes_the_whole_seconds_inside_the_window() -> None:
    timeline = []
    for second in range(5):
        latency = Histogram()
        latency.record(1000 * (second + 1))
        timeline.append(TimelinePoint(float(second), 1, latency))
    result = LoadResult("quire", 5, 5, 5.0, Histogram(), timeline)
    # Measurement from t=100; the window [101.5, 104.0] holds seconds 2 and 3 whole.
    inside = seconds_within(result, 100.0, 101.5, 104.0)
    assert inside.count == 2
    assert (inside.min_us, inside.max_us) == (3000, 4000)
    assert seconds_within(result, 100.0, 101.2, 101.9).count == 0
