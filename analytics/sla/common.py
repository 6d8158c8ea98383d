"""Column helpers the SLA table functions share: reading fields out of an event's `data` (a JSON
string in the jetstream row schema), times, windows and the report's period.

Every helper builds native Spark expressions (no Python UDF), so that the tables scale to
millions of events on a few cores.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from analytics.sla.options import SlaOptions


def data_str(path: str) -> Column:
    """`data.<path>` as a string (`path` in get_json_object's syntax after `$.`, e.g.
    "after" or "segments[0].first_entry_id"); null when absent."""
    return F.get_json_object(F.col("data"), f"$.{path}")


# try_cast: a field of another type reads as null instead of failing the job (Spark 4 runs
# with ANSI SQL, where a bad cast raises).
def data_long(path: str) -> Column:
    return data_str(path).try_cast("long")


def data_int(path: str) -> Column:
    return data_str(path).try_cast("int")


def data_double(path: str) -> Column:
    return data_str(path).try_cast("double")


def data_as(schema: DataType | str) -> Column:
    """The whole `data` object parsed once with `schema` (a struct): cheaper than one
    get_json_object per field when a table reads several fields of the same events."""
    return F.from_json(F.col("data"), schema)


def ms_to_ts(ms: Column | str) -> Column:
    """Milliseconds since the epoch as a TimestampType (UTC)."""
    return F.timestamp_millis(F.col(ms) if isinstance(ms, str) else ms)


def window_start(ts_ms: Column | str, window_s: int) -> Column:
    """The start (a timestamp) of the window of `window_s` seconds, aligned to the epoch, that
    holds `ts_ms`."""
    ms = F.col(ts_ms) if isinstance(ts_ms, str) else ts_ms
    width_ms = window_s * 1000
    return F.timestamp_millis(ms - F.pmod(ms, F.lit(width_ms)))


def seconds_between(start_ms: Column, end_ms: Column) -> Column:
    """(end - start) in seconds, a double."""
    return (end_ms - start_ms).cast("double") / 1000.0


def of_kind(events: DataFrame, *kinds: str) -> DataFrame:
    return events.where(F.col("kind").isin(*kinds))


def in_period(ts_ms: Column | str, options: SlaOptions) -> Column:
    """True for times in the report's period [since_ms, until_ms) (each bound when set)."""
    ms = F.col(ts_ms) if isinstance(ts_ms, str) else ts_ms
    condition = F.lit(True)
    if options.since_ms is not None:
        condition = condition & (ms >= F.lit(options.since_ms))
    if options.until_ms is not None:
        condition = condition & (ms < F.lit(options.until_ms))
    return condition
