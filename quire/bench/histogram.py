"""A log-bucketed latency histogram (HdrHistogram's idea, pure and small).

Values are microseconds (non-negative integers). Buckets grow geometrically: each power of
two is split into `SUB_BUCKETS` equal parts, so any recorded value is reported within
1/SUB_BUCKETS (about 1.6 %) of itself, whatever its size, in constant memory. Recording is
one integer computation and a list increment: cheap enough for every add.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

SUB_BUCKET_BITS = 6
SUB_BUCKETS = 1 << SUB_BUCKET_BITS  # 64 buckets per power of two
MAX_VALUE_US = (1 << 40) - 1  # about 12.7 days; larger values are clamped (and counted)


def bucket_index(value_us: int) -> int:
    """The bucket of a value: exact below SUB_BUCKETS, then SUB_BUCKETS per power of two."""
    if value_us < SUB_BUCKETS:
        return value_us
    shift = value_us.bit_length() - SUB_BUCKET_BITS - 1  # >= 0
    # Top SUB_BUCKET_BITS + 1 bits of the value; the leading 1 is implied by the shift.
    return (shift + 1) * SUB_BUCKETS + ((value_us >> shift) - SUB_BUCKETS)


def bucket_bounds(index: int) -> tuple[int, int]:
    """The inclusive range [low, high] of values that fall in bucket `index`."""
    if index < SUB_BUCKETS:
        return index, index
    shift = index // SUB_BUCKETS - 1
    low = (SUB_BUCKETS + index % SUB_BUCKETS) << shift
    return low, low + (1 << shift) - 1


BUCKETS = bucket_index(MAX_VALUE_US) + 1


class Histogram:
    """Counts of values per bucket, plus the exact count, sum, min and max."""

    __slots__ = ("counts", "count", "total_us", "min_us", "max_us", "clamped")

    def __init__(self) -> None:
        self.counts = [0] * BUCKETS
        self.count = 0
        self.total_us = 0
        self.min_us = 0
        self.max_us = 0
        self.clamped = 0

    def record(self, value_us: int, times: int = 1) -> None:
        """Record `value_us` (negative counts as 0) `times` times."""
        if value_us < 0:
            value_us = 0
        elif value_us > MAX_VALUE_US:
            value_us = MAX_VALUE_US
            self.clamped += times
        self.counts[bucket_index(value_us)] += times
        if self.count == 0 or value_us < self.min_us:
            self.min_us = value_us
        if value_us > self.max_us:
            self.max_us = value_us
        self.count += times
        self.total_us += value_us * times

    def merge(self, other: Histogram) -> None:
        if other.count == 0:
            return
        for index, count in enumerate(other.counts):
            if count:
                self.counts[index] += count
        self.min_us = other.min_us if self.count == 0 else min(self.min_us, other.min_us)
        self.max_us = max(self.max_us, other.max_us)
        self.count += other.count
        self.total_us += other.total_us
        self.clamped += other.clamped

    def percentile(self, q: float) -> int:
        """The value at quantile `q` (0..1): the highest value of the bucket that holds the
        ceil(q * count)-th smallest value, capped at the exact max. 0 when empty."""
        assert 0.0 <= q <= 1.0, f"quantile {q} outside 0..1"
        if self.count == 0:
            return 0
        # ceil(q * count), forgiving float noise (0.99 * 100 must be rank 99, not 100).
        rank = max(1, math.ceil(q * self.count - 1e-9))
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return min(bucket_bounds(index)[1], self.max_us)
        return self.max_us

    def summary(self) -> dict[str, int | float]:
        """The adds counted and their p50, p99 and max in ms, as the bench reports print
        them ({"adds": 0} when empty)."""
        if not self.count:
            return {"adds": 0}
        return {
            "adds": self.count,
            "p50_ms": round(self.percentile(0.50) / 1000, 2),
            "p99_ms": round(self.percentile(0.99) / 1000, 2),
            "max_ms": round(self.max_us / 1000, 2),
        }

    @property
    def mean_us(self) -> float:
        return self.total_us / self.count if self.count else 0.0

    def buckets(self) -> Iterator[tuple[int, int, int]]:
        """(low, high, count) of every non-empty bucket, ascending."""
        for index, count in enumerate(self.counts):
            if count:
                low, high = bucket_bounds(index)
                yield low, high, count
