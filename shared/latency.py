"""Latency histograms that merge exactly: the gateway summarises its acknowledgements in them
(the `entries.acknowledged` event's `latency_us`), and the SLA jobs add them up per hour, per
quorum shape and per bookie, then read percentiles off the sum.

A latency of `us` microseconds is counted in the bucket named by its lower bound,
`latency_bucket(us)`: the value itself below 1,000 us, else the value cut to three
significant digits (1,234 us -> 1,230; 98,765 us -> 98,700). A bucket's lower bound is at
most 1 % below any latency in it, so a percentile read off a histogram is at most 1 % low.
Sums of histograms are exact (counts per bucket), unlike percentiles of percentiles.

Definitions every reader of these histograms uses (the Spark jobs and their tests):
- percentile q (0 < q <= 1) of N counts: the lower bound of the bucket holding the
  ceil(q * N)-th smallest latency (nearest rank);
- within a target of T us: the latencies in buckets whose lower bound is <= T.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

EXACT_BELOW_US = 1000


def latency_bucket(us: int) -> int:
    """The lower bound of the bucket that counts a latency of `us` microseconds."""
    if us < EXACT_BELOW_US:
        return max(0, us)
    scale = 10 ** (len(str(us)) - 3)
    return us // scale * scale


def merge(histograms: Iterable[Mapping[int, int]]) -> dict[int, int]:
    total: dict[int, int] = {}
    for histogram in histograms:
        for bucket, count in histogram.items():
            total[bucket] = total.get(bucket, 0) + count
    return total


def percentile(histogram: Mapping[int, int], q: float) -> int | None:
    """Nearest-rank percentile (bucket lower bound, us); None for an empty histogram."""
    n = sum(histogram.values())
    if n == 0:
        return None
    rank = max(1, math.ceil(q * n))
    seen = 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= rank:
            return bucket
    raise AssertionError("unreachable: the ranks add up to n")


def within(histogram: Mapping[int, int], target_us: int) -> int:
    """How many latencies are within `target_us` (their bucket's lower bound is <= it)."""
    return sum(count for bucket, count in histogram.items() if bucket <= target_us)


def to_event(histogram: Mapping[int, int]) -> dict[str, int]:
    """The histogram as an event carries it: JSON object keys are strings."""
    return {str(bucket): count for bucket, count in sorted(histogram.items())}


def from_event(data: Mapping[str, int]) -> dict[int, int]:
    return {int(bucket): int(count) for bucket, count in data.items()}
