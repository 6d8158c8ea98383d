"""shared/latency.py: the mergeable histograms of the entries.acknowledged event."""

import random

import pytest

from shared.latency import from_event, latency_bucket, merge, percentile, to_event, within


@pytest.mark.parametrize(
    ("us", "bucket"),
    [
        (0, 0),
        (1, 1),
        (999, 999),
        (1000, 1000),
        (1009, 1000),
        (1234, 1230),
        (9999, 9990),
        (10_000, 10_000),
        (98_765, 98_700),
        (123_456_789, 123_000_000),
        (-5, 0),
    ],
)
def test_bucket_is_the_value_cut_to_three_significant_digits(us: int, bucket: int) -> None:
    assert latency_bucket(us) == bucket


def test_a_bucket_is_at_most_one_percent_below_its_latencies() -> None:
    rng = random.Random(17)
    for _ in range(10_000):
        us = rng.randrange(0, 10_000_000)
        assert us * 0.99 <= latency_bucket(us) <= us


def test_percentiles_are_nearest_rank_on_the_merged_counts() -> None:
    a = {100: 5}
    b = {200: 4, 300: 1}
    total = merge([a, b])
    assert total == {100: 5, 200: 4, 300: 1}
    assert percentile(total, 0.5) == 100  # rank 5
    assert percentile(total, 0.51) == 200  # rank 6
    assert percentile(total, 0.9) == 200  # rank 9
    assert percentile(total, 0.99) == 300  # rank 10
    assert percentile({}, 0.5) is None


def test_percentile_of_a_histogram_matches_the_sorted_latencies() -> None:
    rng = random.Random(4)
    latencies = [rng.randrange(0, 50_000) for _ in range(5_000)]
    histogram = merge([{latency_bucket(us): 1} for us in latencies])
    ordered = sorted(latencies)
    for q in (0.5, 0.99, 0.999):
        exact = ordered[-(-int(q * 5_000 * 1000) // 1000) - 1]
        assert percentile(histogram, q) == latency_bucket(exact)


def test_within_counts_buckets_at_or_below_the_target() -> None:
    histogram = {900: 1, 1000: 2, 1010: 3}
    assert within(histogram, 999) == 1
    assert within(histogram, 1000) == 3
    assert within(histogram, 10_000) == 6


def test_event_form_round_trips() -> None:
    histogram = {1230: 2, 7: 1}
    assert to_event(histogram) == {"7": 1, "1230": 2}
    assert from_event(to_event(histogram)) == histogram
