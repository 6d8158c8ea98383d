"""`ensemble_changes`: how often each bookie was replaced in a writer's ensemble, and how often
it came in as the replacement. One row = one bookie x one window (SlaOptions.window_s, aligned to
the epoch), from the gateway's `ledger.ensemble_changed` events in the period. A
re-replication's replacement (a `ledger.updated` from the metadata service) is not a writer's
ensemble change and is not counted."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics.sla.common import data_as, in_period, of_kind, window_start
from analytics.sla.options import SlaOptions

REPLACED = "struct<replaced: array<struct<index: int, old: string, new: string>>>"


def ensemble_changes(events: DataFrame, options: SlaOptions) -> DataFrame:
    replacements = (
        of_kind(events, "ledger.ensemble_changed")
        .where(in_period("ts_ms", options))
        .select(
            window_start("ts_ms", options.window_s).alias("window_start"),
            "ledger_id",
            F.explode(data_as(REPLACED).getField("replaced")).alias("r"),
        )
    )
    # Each replacement counts once for the bookie that went out and once for the one that came in.
    sides = replacements.select(
        "window_start",
        "ledger_id",
        F.explode(
            F.array(
                F.struct(
                    F.col("r.old").alias("bookie_id"),
                    F.lit(1).alias("out"),
                    F.lit(0).alias("in"),
                ),
                F.struct(
                    F.col("r.new").alias("bookie_id"),
                    F.lit(0).alias("out"),
                    F.lit(1).alias("in"),
                ),
            )
        ).alias("side"),
    ).select("window_start", "ledger_id", "side.*")
    return (
        sides.where(F.col("bookie_id").isNotNull())
        .groupBy("window_start", "bookie_id")
        .agg(
            F.sum("out").cast("long").alias("replaced_out"),
            F.sum("in").cast("long").alias("replaced_in"),
            F.count_distinct("ledger_id").cast("long").alias("ledgers"),
        )
        .select(
            "window_start",
            F.lit(options.window_s).cast("int").alias("window_s"),
            "bookie_id",
            "replaced_out",
            "replaced_in",
            "ledgers",
        )
    )
