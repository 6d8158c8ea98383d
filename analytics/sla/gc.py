"""`gc_reclaim`: for each ledger a bookie's GC dropped, how long after its delete the bookie
dropped it and got its disk space back, and how many bytes that was.

One row per (ledger, bookie) of a `gc.ledger_deleted` event in the period. The space comes
back when an entry log holding the ledger's entries is deleted or compacted: the
`gc.entrylog_deleted` and `gc.compacted` events list the deleted ledgers whose bytes they
reclaimed (`ledgers`: {"<ledger_id>": bytes}), on the bookie that emitted them.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, MapType, StringType, StructField, StructType

from analytics.sla.common import data_as, in_period, ms_to_ts, of_kind, seconds_between
from analytics.sla.options import SlaOptions

RECLAIM_KINDS = ("gc.entrylog_deleted", "gc.compacted")
RECLAIM_DATA = StructType([StructField("ledgers", MapType(StringType(), LongType()))])


def gc_reclaim(events: DataFrame, options: SlaOptions) -> DataFrame:
    dropped = (
        of_kind(events, "gc.ledger_deleted")
        .where(F.col("ledger_id").isNotNull() & F.col("bookie_id").isNotNull())
        .groupBy("ledger_id", "bookie_id")
        .agg(F.min("ts_ms").alias("gc_ms"))
        .where(in_period("gc_ms", options))
    )
    deleted = (
        of_kind(events, "ledger.deleted")
        .groupBy("ledger_id")
        .agg(F.min("ts_ms").alias("deleted_ms"))
    )
    reclaimed = (
        of_kind(events, *RECLAIM_KINDS)
        .where(F.col("bookie_id").isNotNull())
        .select(
            "bookie_id",
            "ts_ms",
            F.explode(data_as(RECLAIM_DATA).getField("ledgers")).alias("ledger", "b"),
        )
        .select("bookie_id", "ts_ms", F.col("ledger").try_cast("long").alias("ledger_id"), "b")
        .groupBy("ledger_id", "bookie_id")
        .agg(F.max("ts_ms").alias("reclaimed_ms"), F.sum("b").alias("bytes_reclaimed"))
    )
    rows = dropped.join(deleted, "ledger_id", "left").join(
        reclaimed, ["ledger_id", "bookie_id"], "left"
    )
    return rows.select(
        F.col("ledger_id").cast("long"),
        "bookie_id",
        ms_to_ts("deleted_ms").alias("deleted_at"),
        ms_to_ts("gc_ms").alias("gc_deleted_at"),
        ms_to_ts("reclaimed_ms").alias("reclaimed_at"),
        F.coalesce("bytes_reclaimed", F.lit(0)).cast("long").alias("bytes_reclaimed"),
        seconds_between(F.col("deleted_ms"), F.col("gc_ms")).alias("delete_to_gc_s"),
        seconds_between(F.col("deleted_ms"), F.col("reclaimed_ms")).alias("delete_to_reclaim_s"),
    )
