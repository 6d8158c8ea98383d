"""`bookie_availability`: each bookie's states as intervals. One row = one interval of one state
("up", "read_only", "lost", "unregistered") of one bookie.

The states come from the metadata service (`bookie.registered`: data.state; and
`bookie.unregistered`) and from the auditor (`bookie.lost`, `bookie.readonly`,
`bookie.available`: data.after). The journal's own disk-check events (`bookie.readonly`,
`bookie.writable`, without data.after) are not availability. A bookie's events are taken in
time order (ties by event_id); equal consecutive states make one interval, which ends where the
next state starts, or at SlaOptions.end_ms for the last (open) one. Intervals that overlap the
period are kept, cut at its start."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.sla.common import data_str, ms_to_ts, seconds_between
from analytics.sla.options import SlaOptions

AUDITOR_KINDS = ("bookie.lost", "bookie.readonly", "bookie.available")


def _state(value: Column) -> Column:
    """BookieState's value (shared/models.py) as an availability state; null for others."""
    return (
        F.when(value == "writable", "up")
        .when(value == "readonly", "read_only")
        .when(value == "lost", "lost")
    )


def bookie_availability(events: DataFrame, options: SlaOptions) -> DataFrame:
    kind = F.col("kind")
    state = (
        F.when(kind == "bookie.registered", _state(data_str("state")))
        .when(kind == "bookie.unregistered", F.lit("unregistered"))
        .when(kind.isin(*AUDITOR_KINDS), _state(data_str("after")))
    )
    states = (
        events.where(kind.isin("bookie.registered", "bookie.unregistered", *AUDITOR_KINDS))
        .select("bookie_id", "ts_ms", "event_id", state.alias("state"))
        .where(F.col("bookie_id").isNotNull() & F.col("state").isNotNull())
    )
    order = Window.partitionBy("bookie_id").orderBy("ts_ms", "event_id")
    previous = F.col("previous")
    starts = (
        states.withColumn("previous", F.lag("state").over(order))
        .where(previous.isNull() | (previous != F.col("state")))
        .drop("previous")
    )
    intervals = starts.select(
        "bookie_id",
        "state",
        F.col("ts_ms").alias("start_ms"),
        F.lead("ts_ms").over(order).alias("next_ms"),
    ).select(
        "bookie_id",
        "state",
        "start_ms",
        F.coalesce(F.col("next_ms"), F.lit(options.end_ms)).alias("end_ms"),
        F.col("next_ms").isNull().alias("open"),
    )
    if options.since_ms is not None:
        since = F.lit(options.since_ms)
        intervals = intervals.where(
            (F.col("end_ms") > since) | (F.col("start_ms") >= since)
        ).withColumn("start_ms", F.greatest(F.col("start_ms"), since))
    return intervals.select(
        "bookie_id",
        "state",
        ms_to_ts("start_ms").alias("start"),
        ms_to_ts("end_ms").alias("end"),
        "open",
        seconds_between(F.col("start_ms"), F.col("end_ms")).alias("duration_s"),
    )
