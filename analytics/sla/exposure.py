"""`exposure` and `exposure_timeline`: what each bookie loss left below write quorum, for how
long, and when re-replication made it whole again.

An incident is a `bookie.lost` event of the auditor in the period (a repeat of the auditor's
report for a bookie it last reported lost, e.g. by a new auditor leader, is not a new one).
Its exposed entries are the entries of `entries.acknowledged` events (any time in the input)
written to an ensemble holding the lost bookie whose write set includes it (BookKeeper's round
robin: entry e of an ensemble of E bookies with write quorum Qw goes to the bookies at indexes
(e + i) mod E, i < Qw), in ledgers not deleted before the loss. One stops being exposed at the
first `autorecovery.fragment_replicated` of its ledger at or after the loss whose bookie_src is
the lost bookie and whose range covers it, or when its ledger is deleted; otherwise it is still
exposed at `options.end_ms`. Its exposure starts at the loss, or at its ack event if later.

Entries are never exploded: an ack event's entry range is cut where the covering repairs
change, and the write-set entries of each piece are counted arithmetically.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructField, StructType

from analytics.sla.common import data_as, data_str, in_period, ms_to_ts, of_kind, seconds_between
from analytics.sla.options import SlaOptions

LOST = "lost"
# The auditor's bookie state events (data.after); the journal's own bookie.readonly has none.
AUDITOR_STATE_KINDS = ("bookie.lost", "bookie.readonly", "bookie.available")
# Past any entry id: the end of the last piece of the entry-id axis.
ENTRY_ID_MAX = 2**62

ACK_DATA = StructType(
    [
        StructField("count", LongType()),
        StructField("first_entry_id", LongType()),
        StructField("last_entry_id", LongType()),
        StructField("bytes", LongType()),
        StructField("ensemble", ArrayType(StringType())),
        StructField("write_quorum", IntegerType()),
    ]
)
FRAGMENT_DATA = StructType(
    [
        StructField("first_entry_id", LongType()),
        StructField("last_entry_id", LongType()),
        StructField("bookie_src", StringType()),
    ]
)
LOSS_SCHEMA = StructType(
    [StructField("bookie_id", StringType(), False), StructField("lost_ms", LongType(), False)]
)
INCIDENT = ["bookie_id", "lost_ms"]
INCIDENT_LEDGER = [*INCIDENT, "ledger_id"]


def exposure(events: DataFrame, options: SlaOptions) -> DataFrame:
    losses = _losses(events, options)
    # One line of aggregations from the pieces on: two consumers of the pieces would each
    # parse the ack events again (their column pruning differs, so Spark shares nothing).
    runs = _exposed_pieces(events, options, losses).groupBy(*INCIDENT_LEDGER, "start_ms", "stop_ms")
    runs = runs.agg(
        F.sum("entries").alias("entries"),
        F.sum(F.col("entries") * F.col("entry_bytes")).alias("bytes"),
        F.sum(F.when(F.col("still"), F.col("entries")).otherwise(0)).alias("still_entries"),
        F.min("first_entry_id").alias("first_entry_id"),
        F.max("last_entry_id").alias("last_entry_id"),
    ).withColumn("exposed_s", seconds_between(F.col("start_ms"), F.col("stop_ms")))
    # The worst run: the longest exposed (ties: more entries, the lowest ledger and entry id).
    worst = F.max_by(
        F.struct(
            F.col("ledger_id").alias("ledger_id"),
            F.col("first_entry_id").alias("first_entry_id"),
            F.col("last_entry_id").alias("last_entry_id"),
            F.col("exposed_s").alias("exposed_s"),
        ),
        F.struct("exposed_s", "entries", -F.col("ledger_id"), -F.col("first_entry_id")),
    )
    totals = runs.groupBy(*INCIDENT).agg(
        F.countDistinct("ledger_id").alias("ledgers_exposed"),
        F.sum("entries").alias("entries_exposed"),
        F.round(F.sum("bytes")).cast("long").alias("bytes_exposed"),
        F.sum(F.col("entries") * F.col("exposed_s")).alias("entry_seconds"),
        F.sum(F.col("bytes") * F.col("exposed_s")).alias("byte_seconds"),
        F.sum("still_entries").alias("still_exposed"),
        F.max("stop_ms").alias("last_stop_ms"),
        worst.alias("worst"),
    )
    rows = losses.join(totals, INCIDENT, "left")
    still = F.coalesce(F.col("still_exposed"), F.lit(0))
    # Nothing exposed: fully replicated all along, so "repaired" at the loss itself.
    repaired_ms = F.when(still > 0, F.lit(None)).otherwise(
        F.coalesce(F.col("last_stop_ms"), F.col("lost_ms"))
    )
    return rows.select(
        "bookie_id",
        ms_to_ts("lost_ms").alias("lost_at"),
        F.coalesce("ledgers_exposed", F.lit(0)).cast("long").alias("ledgers_exposed"),
        F.coalesce("entries_exposed", F.lit(0)).cast("long").alias("entries_exposed"),
        F.coalesce("bytes_exposed", F.lit(0)).cast("long").alias("bytes_exposed"),
        F.coalesce("entry_seconds", F.lit(0.0)).cast("double").alias("entry_seconds"),
        F.coalesce("byte_seconds", F.lit(0.0)).cast("double").alias("byte_seconds"),
        F.col("worst.ledger_id").cast("long").alias("worst_ledger_id"),
        F.col("worst.first_entry_id").cast("long").alias("worst_first_entry_id"),
        F.col("worst.last_entry_id").cast("long").alias("worst_last_entry_id"),
        F.col("worst.exposed_s").cast("double").alias("worst_exposed_s"),
        ms_to_ts(repaired_ms).alias("repaired_at"),
        seconds_between(F.col("lost_ms"), repaired_ms).alias("time_to_full_rereplication_s"),
        still.cast("long").alias("still_exposed_entries"),
    )


def exposure_timeline(events: DataFrame, options: SlaOptions) -> DataFrame:
    """A row at the loss, then one at every time exposed entries came in (acked later to the
    old ensemble) or went out (repaired, ledger deleted); entries exposed for no time at all
    (their repair or delete came before their ack event) make no step."""
    losses = _losses(events, options)
    pieces = _exposed_pieces(events, options, losses).where(F.col("exposed_s") > 0)
    entry_bytes = F.col("entries") * F.col("entry_bytes")
    came = F.struct(
        F.col("start_ms").alias("ts_ms"), F.col("entries").alias("entries"), entry_bytes.alias("b")
    )
    went = F.when(
        ~F.col("still"),
        F.struct(
            F.col("stop_ms").alias("ts_ms"),
            (-F.col("entries")).alias("entries"),
            (-entry_bytes).alias("b"),
        ),
    )
    # Both steps of a piece from one pass over the pieces (not a union of two: see exposure).
    steps = (
        pieces.select(*INCIDENT, F.explode(F.array(came, went)).alias("step"))
        .where(F.col("step").isNotNull())
        .select(*INCIDENT, "step.*")
        .unionByName(
            losses.select(
                *INCIDENT,
                F.col("lost_ms").alias("ts_ms"),
                F.lit(0).cast("long").alias("entries"),
                F.lit(0.0).alias("b"),
            )
        )
        .groupBy(*INCIDENT, "ts_ms")
        .agg(F.sum("entries").alias("entries"), F.sum("b").alias("b"))
    )
    running = (
        Window.partitionBy(*INCIDENT)
        .orderBy("ts_ms")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    return steps.select(
        "bookie_id",
        ms_to_ts("lost_ms").alias("lost_at"),
        ms_to_ts("ts_ms").alias("ts"),
        F.sum("entries").over(running).cast("long").alias("entries_exposed"),
        F.round(F.sum("b").over(running)).cast("long").alias("bytes_exposed"),
    )


def _losses(events: DataFrame, options: SlaOptions) -> DataFrame:
    """(bookie_id, lost_ms) of every incident in the period. Collected (they are a handful)
    and given back as a local relation: every part of the tables joins with them, and would
    otherwise compute them again from the events each time."""
    reports = of_kind(events, *AUDITOR_STATE_KINDS).select(
        "bookie_id", "ts_ms", "event_id", data_str("after").alias("after")
    )
    reports = reports.where(F.col("after").isNotNull() & F.col("bookie_id").isNotNull())
    previous = F.lag("after").over(Window.partitionBy("bookie_id").orderBy("ts_ms", "event_id"))
    lost = reports.select("bookie_id", "ts_ms", "after", previous.alias("previous")).where(
        (F.col("after") == LOST) & (F.col("previous").isNull() | (F.col("previous") != LOST))
    )
    found = lost.where(in_period("ts_ms", options)).select("bookie_id", "ts_ms").distinct()
    return events.sparkSession.createDataFrame(
        [(row.bookie_id, row.ts_ms) for row in found.collect()], LOSS_SCHEMA
    )


def _exposed_pieces(events: DataFrame, options: SlaOptions, losses: DataFrame) -> DataFrame:
    """Per incident, pieces of ack events' entry ranges whose write-set entries share one
    exposure: columns INCIDENT_LEDGER, entries, entry_bytes, start_ms, stop_ms, still,
    exposed_s, first_entry_id, last_entry_id (the piece's first and last exposed entry)."""
    deleted = (
        of_kind(events, "ledger.deleted")
        .groupBy("ledger_id")
        .agg(F.min("ts_ms").alias("deleted_ms"))
    )
    acks = (
        of_kind(events, "entries.acknowledged")
        .select("ledger_id", "ts_ms", data_as(ACK_DATA).alias("a"))
        .select("ledger_id", F.col("ts_ms").alias("ack_ms"), "a.*")
        # No filter on the parsed fields: Spark would push each one down as a parse of its
        # own. An event without ensemble, write quorum or entry ids gives no piece (null counts).
        .where(F.col("ledger_id").isNotNull())
        .select("*", F.posexplode("ensemble").alias("index", "bookie_id"))
        # Only ledgers written to a lost bookie go on: the incidents are few, broadcast them.
        .join(F.broadcast(losses), "bookie_id")
        .join(deleted, "ledger_id", "left")
        .where(F.col("deleted_ms").isNull() | (F.col("deleted_ms") >= F.col("lost_ms")))
    )
    cuts = _repair_cuts(events, losses)
    overlaps = (F.col("cut_first") <= F.col("last_entry_id")) & (
        F.col("cut_last") >= F.col("first_entry_id")
    )
    joined = acks.join(cuts, [*(acks[c] == cuts[c] for c in INCIDENT_LEDGER), overlaps], "left")
    joined = joined.select(acks["*"], "cut_first", "cut_last", "repaired_ms")

    size = F.size("ensemble").cast("long")
    quorum = F.least(F.col("write_quorum").cast("long"), size)
    # Entry e is written to the bookie at index k iff (k - e) mod E < Qw, i.e. iff
    # (e - (k - Qw + 1)) mod E < Qw: iff (e + offset) mod E < Qw with offset = E - k + Qw - 1
    # (adding E keeps it positive). Counting such e in a range is then _written's arithmetic.
    offset = size - F.col("index") + quorum - 1
    first = F.greatest("first_entry_id", F.coalesce("cut_first", "first_entry_id"))
    last = F.least("last_entry_id", F.coalesce("cut_last", "last_entry_id"))
    start_ms = F.greatest("ack_ms", "lost_ms")
    stop = F.least("repaired_ms", "deleted_ms")  # least() skips nulls
    still = stop.isNull() | (stop > F.lit(options.end_ms))
    stop_ms = F.greatest(start_ms, F.when(still, F.lit(options.end_ms)).otherwise(stop))
    entry_bytes = F.when(
        F.col("count") > 0, F.coalesce("bytes", F.lit(0)) / F.col("count")
    ).otherwise(0.0)
    pieces = joined.select(
        *INCIDENT_LEDGER,
        (_written(last + offset + 1, size, quorum) - _written(first + offset, size, quorum)).alias(
            "entries"
        ),
        entry_bytes.alias("entry_bytes"),
        start_ms.alias("start_ms"),
        stop_ms.alias("stop_ms"),
        still.alias("still"),
        seconds_between(start_ms, stop_ms).alias("exposed_s"),
        _first_written(first, offset, size, quorum).alias("first_entry_id"),
        _last_written(last, offset, size, quorum).alias("last_entry_id"),
    )
    return pieces.where(F.col("entries") > 0)


def _repair_cuts(events: DataFrame, losses: DataFrame) -> DataFrame:
    """Per incident and ledger with repairs, the entry-id axis cut into ranges [cut_first,
    cut_last] each covered by the same repairs, with the first of them (repaired_ms, null
    where none covers the range)."""
    fragments = (
        of_kind(events, "autorecovery.fragment_replicated")
        .select("ledger_id", "ts_ms", data_as(FRAGMENT_DATA).alias("f"))
        .select(
            "ledger_id",
            F.col("ts_ms").alias("fragment_ms"),
            F.col("f.bookie_src").alias("bookie_id"),
            F.col("f.first_entry_id").alias("fragment_first"),
            F.col("f.last_entry_id").alias("fragment_last"),
        )
        .join(F.broadcast(losses), "bookie_id")
        .where(F.col("fragment_ms") >= F.col("lost_ms"))
    )
    # Where the covering repairs may change: at each repair's ends, and 0 (the axis' start).
    ends = F.array(F.lit(0).cast("long"), "fragment_first", F.col("fragment_last") + 1)
    bounds = fragments.select(*INCIDENT_LEDGER, F.explode(ends).alias("bound")).distinct()
    following = F.lead("bound").over(Window.partitionBy(*INCIDENT_LEDGER).orderBy("bound"))
    cuts = bounds.select(
        *INCIDENT_LEDGER,
        F.col("bound").alias("cut_first"),
        (F.coalesce(following, F.lit(ENTRY_ID_MAX)) - 1).alias("cut_last"),
    )
    covers = (F.col("fragment_first") <= F.col("cut_first")) & (
        F.col("fragment_last") >= F.col("cut_last")
    )
    return (
        cuts.join(fragments, [*(cuts[c] == fragments[c] for c in INCIDENT_LEDGER), covers], "left")
        .groupBy(*(cuts[c] for c in INCIDENT_LEDGER), "cut_first", "cut_last")
        .agg(F.min("fragment_ms").alias("repaired_ms"))
    )


def _written(n: Column, size: Column, quorum: Column) -> Column:
    """How many v in [0, n) have v mod E < Qw (n >= 0)."""
    residue = F.pmod(n, size)
    # n - residue is a multiple of E: the division is exact (entry ids are far below 2**53).
    return ((n - residue) / size).cast("long") * quorum + F.least(residue, quorum)


def _first_written(first: Column, offset: Column, size: Column, quorum: Column) -> Column:
    residue = F.pmod(first + offset, size)
    return F.when(residue < quorum, first).otherwise(first + size - residue)


def _last_written(last: Column, offset: Column, size: Column, quorum: Column) -> Column:
    residue = F.pmod(last + offset, size)
    return F.when(residue < quorum, last).otherwise(last - (residue - quorum + 1))
