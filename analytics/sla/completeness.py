"""`completeness`: how much of each publisher's output the input holds. One row = one publisher
instance (source, boot_id): the events seen, the range of its `seq` (1, 2, 3... per instance,
dropped events included: shared/events.py), the seqs missing from that range and the drops the
publisher itself reported (`events.dropped`). The metadata outbox has no seq: its row counts
events only."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics.sla.common import data_long
from analytics.sla.options import SlaOptions

DROPPED = "events.dropped"


def completeness(events: DataFrame, options: SlaOptions) -> DataFrame:
    # Over every input event, the period's and the ones before it alike: a gap before
    # `since` is as much a hole in what the tables know.
    per_instance = events.groupBy("source", "boot_id").agg(
        F.count_distinct("event_id").alias("events"),
        F.min("seq").alias("first_seq"),
        F.max("seq").alias("last_seq"),
        F.count_distinct("seq").alias("seqs"),
        F.sum(F.when(F.col("kind") == DROPPED, data_long("dropped")).otherwise(0)).alias(
            "dropped_reported"
        ),
    )
    expected = F.col("last_seq") - F.col("first_seq") + 1
    return per_instance.select(
        "source",
        "boot_id",
        F.col("events").cast("long").alias("events"),
        "first_seq",
        "last_seq",
        (expected - F.col("seqs")).cast("long").alias("missing"),
        F.col("dropped_reported").cast("long").alias("dropped_reported"),
        (F.col("events") / expected).cast("double").alias("completeness"),
    )
