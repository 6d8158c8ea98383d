"""`completeness`: how much of each publisher's output the input holds. One row = one publisher
instance (source, boot_id): the events seen, the range of its `seq` (1, 2, 3... per instance,
dropped events included: shared/events.py), the seqs missing from that range and the drops the
publisher itself reported (`events.dropped`). The metadata outbox has no seq: its row counts
events only."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics.sla.common import data_long, of_kind
from analytics.sla.options import SlaOptions

INSTANCE = ["source", "boot_id"]


def completeness(events: DataFrame, options: SlaOptions) -> DataFrame:
    # Over every input event, the period's and the ones before it alike: a gap before
    # `since` is as much a hole in what the tables know. The input is deduplicated on
    # event_id, so counting event_ids counts distinct events; one group per seq first makes
    # the distinct seqs a plain count (no row expansion for two distinct aggregates).
    per_seq = events.groupBy(*INSTANCE, "seq").agg(F.count("event_id").alias("events"))
    per_instance = per_seq.groupBy(*INSTANCE).agg(
        F.sum("events").alias("events"),
        F.min("seq").alias("first_seq"),
        F.max("seq").alias("last_seq"),
        F.count("seq").alias("seqs"),
    )
    # Only the publishers' own reports are parsed (not every event's data).
    reported = (
        of_kind(events, "events.dropped")
        .groupBy(*INSTANCE)
        .agg(F.sum(data_long("dropped")).alias("dropped_reported"))
    )
    p, r = per_instance.alias("p"), reported.alias("r")
    # The metadata outbox's boot_id is null: match instances null-safely.
    joined = p.join(r, [F.col(f"p.{c}").eqNullSafe(F.col(f"r.{c}")) for c in INSTANCE], "left")
    expected = F.col("last_seq") - F.col("first_seq") + 1
    return joined.select(
        *(F.col(f"p.{c}").alias(c) for c in INSTANCE),
        F.col("events").cast("long").alias("events"),
        "first_seq",
        "last_seq",
        (expected - F.col("seqs")).cast("long").alias("missing"),
        F.coalesce(F.col("dropped_reported"), F.lit(0)).cast("long").alias("dropped_reported"),
        (F.col("events") / expected).cast("double").alias("completeness"),
    )
