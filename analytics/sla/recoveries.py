"""`recoveries`: how long fenced ledgers took to be recovered and closed. One row = one ledger
whose first `ledger.fenced` (a bookie fenced it: a reader started recovery) is in the period.

The recovery is the ledger's first `ledger.recovered` (the gateway, after a successful
recovery: when it began, how many entries it re-wrote) and its close the first `ledger.closed`
whose previous state is in-recovery; a ledger closes once, so neither is matched by time."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analytics.sla.common import data_as, in_period, ms_to_ts, of_kind, seconds_between
from analytics.sla.options import SlaOptions

RECOVERED = "struct<started_ts_ms: long, recovered_entries: long, last_entry_id: long>"
CLOSED = "struct<previous_state: string, last_entry_id: long>"


def _first(column: str) -> Column:
    """`column` of the earliest event of the group (ties broken by event_id)."""
    return F.min_by(F.col(column), F.struct("ts_ms", "event_id"))


def recoveries(events: DataFrame, options: SlaOptions) -> DataFrame:
    fenced = (
        of_kind(events, "ledger.fenced")
        .where(F.col("ledger_id").isNotNull())
        .groupBy("ledger_id")
        .agg(
            F.min("ts_ms").alias("fenced_ms"),
            F.count_distinct("bookie_id").cast("int").alias("bookies_fenced"),
        )
        .where(in_period("fenced_ms", options))
    )
    recovered = (
        of_kind(events, "ledger.recovered")
        .withColumn("recovery", data_as(RECOVERED))
        .groupBy("ledger_id")
        .agg(_first("recovery").alias("recovery"))
    )
    closed = (
        of_kind(events, "ledger.closed")
        .withColumn("close", data_as(CLOSED))
        # LedgerState's values (shared/models.py) are upper case; read either case.
        .where(F.lower(F.col("close.previous_state")) == "in_recovery")
        .withColumn("close", F.struct("ts_ms", F.col("close.last_entry_id").alias("last_entry_id")))
        .groupBy("ledger_id")
        .agg(_first("close").alias("close"))
    )
    joined = fenced.join(recovered, "ledger_id", "left").join(closed, "ledger_id", "left")
    return joined.select(
        "ledger_id",
        ms_to_ts("fenced_ms").alias("fenced_at"),
        "bookies_fenced",
        ms_to_ts(F.col("recovery.started_ts_ms")).alias("recovery_started_at"),
        ms_to_ts(F.col("close.ts_ms")).alias("closed_at"),
        seconds_between(F.col("fenced_ms"), F.col("close.ts_ms")).alias("fence_to_close_s"),
        F.col("recovery.recovered_entries").alias("recovered_entries"),
        F.coalesce(F.col("close.last_entry_id"), F.col("recovery.last_entry_id")).alias(
            "last_entry_id"
        ),
    )
