"""`ack_latency`: add latency SLO attainment. One row = one window (SlaOptions.window_s, aligned
to the epoch) x one group: "all" acknowledged entries, one quorum "shape" (ensemble size, write
quorum, ack quorum), or one "bookie" (the entries of segments whose ensemble held it).

From the gateway's `entries.acknowledged` events in the period: their `latency_us` histograms
(every acknowledged entry counted in its shared.latency bucket) are summed per group, and the
percentiles and the share within the target are read off the sums with shared/latency.py's
definitions (nearest rank; within = the bucket's lower bound <= the target). Events without a
histogram (or an empty one) are not counted, so `count` is the histograms' total.

Native Spark throughout: each event's histogram is exploded to (bucket, count) rows, summed per
window, shape and ensemble first (many events share them), then per group; the nearest-rank
percentiles come from running sums over the buckets in order.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.sla.common import data_as, in_period, of_kind, window_start
from analytics.sla.options import SlaOptions

ACKNOWLEDGED = (
    "struct<bytes: long, ensemble: array<string>, ensemble_size: int, write_quorum: int, "
    "ack_quorum: int, latency_us: map<string, long>>"
)
QUANTILES = {"p50_ms": 0.5, "p99_ms": 0.99, "p999_ms": 0.999}
GROUP = ["window_start", "group", "ensemble_size", "write_quorum", "ack_quorum", "bookie_id"]
SHAPE = ["ensemble_size", "write_quorum", "ack_quorum"]


def _label(group: str, shape: list[Column], bookie: Column) -> Column:
    return F.struct(
        F.lit(group).alias("group"),
        *(column.cast("int").alias(name) for column, name in zip(shape, SHAPE, strict=True)),
        bookie.cast("string").alias("bookie_id"),
    )


def _labels() -> Column:
    """The groups a (window, shape, ensemble) row counts in: all, its shape, each bookie."""
    none = [F.lit(None)] * len(SHAPE)
    ensemble = F.coalesce(F.array_distinct("ensemble"), F.array().cast("array<string>"))
    return F.concat(
        F.array(
            _label("all", none, F.lit(None)),
            _label("shape", [F.col(name) for name in SHAPE], F.lit(None)),
        ),
        F.transform(ensemble, lambda bookie: _label("bookie", none, bookie)),
    )


def ack_latency(events: DataFrame, options: SlaOptions) -> DataFrame:
    acks = (
        of_kind(events, "entries.acknowledged")
        .where(in_period("ts_ms", options))
        .select(
            window_start("ts_ms", options.window_s).alias("window_start"),
            data_as(ACKNOWLEDGED).alias("d"),
        )
    )
    # One row per event and bucket; the event's bytes ride on its first bucket only. An event
    # without a histogram (or an empty one) makes no row. (No filter on `d`: Spark would push
    # it below the projection as a second JSON parse of every event.)
    buckets = acks.select(
        "window_start",
        *(F.col(f"d.{name}").alias(name) for name in SHAPE),
        F.col("d.ensemble").alias("ensemble"),
        F.posexplode("d.latency_us").alias("pos", "bucket_key", "n"),
        F.col("d.bytes").alias("event_bytes"),
    ).select(
        "window_start",
        *SHAPE,
        "ensemble",
        F.col("bucket_key").try_cast("long").alias("bucket"),
        F.coalesce(F.col("n"), F.lit(0)).alias("n"),
        F.when(F.col("pos") == 0, F.coalesce(F.col("event_bytes"), F.lit(0)))
        .otherwise(0)
        .alias("bytes"),
    )
    per_ensemble = buckets.groupBy("window_start", *SHAPE, "ensemble", "bucket").agg(
        F.sum("n").alias("n"), F.sum("bytes").alias("bytes")
    )
    histograms = (
        per_ensemble.select("window_start", "bucket", "n", "bytes", F.explode(_labels()).alias("g"))
        .select("window_start", "g.*", "bucket", "n", "bytes")
        .groupBy(*GROUP, "bucket")
        .agg(F.sum("n").alias("n"), F.sum("bytes").alias("bytes"))
    )
    return _summarise(histograms, options)


def _summarise(histograms: DataFrame, options: SlaOptions) -> DataFrame:
    """One row per group from its (bucket, n) rows: nearest-rank percentiles off running sums."""
    running = (
        Window.partitionBy(*GROUP)
        .orderBy("bucket")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    whole = Window.partitionBy(*GROUP)
    ranked = histograms.withColumn("seen", F.sum("n").over(running)).withColumn(
        "total", F.sum("n").over(whole)
    )
    target_us = options.target_ms * 1000

    def percentile(q: float) -> Column:
        rank = F.greatest(F.lit(1), F.ceil(F.lit(q) * F.col("total")))
        return F.min(F.when(F.col("seen") >= rank, F.col("bucket"))) / 1000.0

    summary = ranked.groupBy(*GROUP).agg(
        F.sum("n").cast("long").alias("count"),
        *(percentile(q).cast("double").alias(name) for name, q in QUANTILES.items()),
        F.sum(F.when(F.col("bucket") <= F.lit(target_us), F.col("n")).otherwise(0))
        .cast("long")
        .alias("within_target"),
        F.sum("bytes").cast("long").alias("bytes"),
    )
    return summary.select(
        "window_start",
        F.lit(options.window_s).cast("int").alias("window_s"),
        *GROUP[1:],
        "count",
        *QUANTILES,
        F.lit(float(options.target_ms)).alias("target_ms"),
        "within_target",
        F.try_divide(F.col("within_target"), F.col("count")).cast("double").alias("attainment"),
        "bytes",
    )
