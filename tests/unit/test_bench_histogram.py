"""The benchmark's log-bucketed histogram: bucket maths and percentiles."""

from __future__ import annotations

import math
import random

import pytest

from quire.bench.histogram import (
    BUCKETS,
    MAX_VALUE_US,
    SUB_BUCKETS,
    Histogram,
    bucket_bounds,
    bucket_index,
)


@pytest.mark.parametrize(
    "value",
    [0, 1, 63, 64, 65, 127, 128, 129, 1000, 4095, 4096, 123_456, 10**9, MAX_VALUE_US],
)
def test_a_value_lies_within_its_bucket(value: int) -> None:
    low, high = bucket_bounds(bucket_index(value))
    assert low <= value <= high
    # Relative width: exact below SUB_BUCKETS, then at most 1/SUB_BUCKETS of the value.
    assert high - low <= max(0, value // SUB_BUCKETS)


def test_buckets_tile_the_range_without_gaps() -> None:
    previous_high = -1
    for index in range(BUCKETS):
        low, high = bucket_bounds(index)
        assert low == previous_high + 1 and high >= low
        assert bucket_index(low) == index and bucket_index(high) == index
        previous_high = high
    assert previous_high == MAX_VALUE_US


@pytest.mark.parametrize(
    ("q", "expected"), [(0.0, 1), (0.5, 50), (0.99, 99), (0.999, 100), (1.0, 100)]
)
def test_percentiles_of_small_exact_values(q: float, expected: int) -> None:
    histogram = Histogram()
    for value in range(1, 101):
        histogram.record(value)
    # 1..63 are exact buckets; 64..100 are buckets 1 wide up to 127 too.
    assert histogram.percentile(q) == expected


def test_percentiles_within_bucket_precision_against_sorting() -> None:
    rng = random.Random(7)
    values = [int(rng.lognormvariate(8, 1.5)) for _ in range(20_000)]
    histogram = Histogram()
    for value in values:
        histogram.record(value)
    ordered = sorted(values)
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = ordered[max(0, math.ceil(q * len(ordered) - 1e-9) - 1)]
        got = histogram.percentile(q)
        assert exact <= got <= exact + exact // SUB_BUCKETS + 1, (q, exact, got)
    assert histogram.max_us == max(values) and histogram.min_us == min(values)
    assert histogram.count == len(values)
    assert histogram.mean_us == pytest.approx(sum(values) / len(values))


def test_merge_equals_recording_everything_in_one() -> None:
    one, two, both = Histogram(), Histogram(), Histogram()
    for value in (5, 500, 50_000):
        one.record(value)
        both.record(value)
    for value in (7, 7000, 700_000):
        two.record(value, times=2)
        both.record(value, times=2)
    one.merge(two)
    assert one.counts == both.counts
    assert (one.count, one.total_us, one.min_us, one.max_us) == (
        both.count,
        both.total_us,
        both.min_us,
        both.max_us,
    )


def test_empty_negative_and_huge_values() -> None:
    histogram = Histogram()
    assert histogram.percentile(0.99) == 0 and histogram.mean_us == 0.0
    histogram.record(-5)
    histogram.record(MAX_VALUE_US * 4)
    assert histogram.min_us == 0
    assert histogram.max_us == MAX_VALUE_US and histogram.clamped == 1
    assert histogram.percentile(1.0) == MAX_VALUE_US
    assert [count for _, _, count in histogram.buckets()] == [1, 1]
