"""Where the SLA job reads its events from: the JetStream stream (the `jetstream` source), a
`quire up` data dir (its stream, found from DIR/cluster.json), or JSON-lines files of the
payloads as published. Every input comes out in the jetstream row schema (analytics/jetstream.py
SCHEMA), parsed by the same function (`to_row`), and deduplicated on `event_id`.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
)

from analytics.jetstream import DEFAULT_STREAM, SCHEMA, JetStreamDataSource, to_row


class SourceError(ValueError):
    """The input cannot be read (a user's mistake: a path, a data dir, credentials)."""


@dataclass(frozen=True)
class StreamSource:
    url: str
    user: str | None = None
    password: str | None = None
    creds: str | None = None
    stream: str = DEFAULT_STREAM

    def options(self) -> dict[str, str]:
        options = {"url": self.url, "stream": self.stream}
        if self.user is not None:
            options.update(user=self.user, password=self.password or "")
        if self.creds is not None:
            options["creds"] = self.creds
        return options


@dataclass(frozen=True)
class FileSource:
    """JSON-lines files: one event payload a line (blank lines skipped). `path` is a file, a
    directory (every file in it) or a glob, anything Spark's text reader takes."""

    path: str


Source = StreamSource | FileSource


def data_dir_source(data_dir: Path, stream: str = DEFAULT_STREAM) -> StreamSource:
    """The event stream of the `quire up` cluster that keeps its files in `data_dir`: its NATS
    URL from cluster.json, its user and password from the cluster's own credentials."""
    cluster = data_dir / "cluster.json"
    try:
        url = json.loads(cluster.read_text())["nats_url"]
    except FileNotFoundError:
        raise SourceError(
            f"no {cluster}: is `quire up` running with --data-dir {data_dir}? "
            "Or pass --url or --input"
        ) from None
    except (ValueError, KeyError) as exc:
        raise SourceError(f"{cluster} is not a cluster description: {exc}") from None
    # Imported here: only this way of finding the stream needs the `quire` package (a job
    # submitted to a cluster with --url or --input ships analytics and shared only).
    from quire.cluster import nats_credentials

    credentials = nats_credentials(data_dir)
    if credentials is None:
        return StreamSource(url=url, stream=stream)
    user, password = credentials
    return StreamSource(url=url, user=user, password=password, stream=stream)


def read_events(spark: SparkSession, source: Source) -> DataFrame:
    """Every message of `source` as rows of the jetstream schema, duplicates included."""
    if isinstance(source, StreamSource):
        spark.dataSource.register(JetStreamDataSource)
        return spark.read.format("jetstream").options(**source.options()).load()
    return read_files(spark, source.path)


def load_events(spark: SparkSession, source: Source) -> DataFrame:
    """Every event of `source` as rows of the jetstream schema, one row per event_id (rows
    without an event_id, such as the `error` rows of malformed messages, are all kept)."""
    return deduplicate(read_events(spark, source))


def deduplicate(rows: DataFrame) -> DataFrame:
    # Grouping puts every null event_id in one group: keep those rows apart.
    with_id = rows.where(F.col("event_id").isNotNull()).dropDuplicates(["event_id"])
    return with_id.unionByName(rows.where(F.col("event_id").isNull()))


def read_files(spark: SparkSession, path: str) -> DataFrame:
    """JSON-lines files as rows of the jetstream schema. A file has no stream: `stream_seq`
    is a number unique to the line (increasing through each file, not consecutive),
    `subject` the file's path and `published` its modification time."""
    lines = (
        spark.read.text(path)
        .where(F.trim(F.col("value")) != "")
        .select(
            F.monotonically_increasing_id().alias("line_id"),
            F.col("_metadata.file_path").alias("file_path"),
            F.col("_metadata.file_modification_time").alias("file_mtime"),
            F.col("value"),
        )
    )
    with warnings.catch_warnings():
        # mapInArrow checks the pandas version although this function uses Arrow only; PySpark
        # 4.3 warns that pandas 3 is not fully supported.
        warnings.filterwarnings(
            "ignore", "PySpark does not yet fully support pandas", FutureWarning
        )
        return lines.mapInArrow(_lines_to_rows, SCHEMA)


def _arrow_type(spark_type: DataType) -> pa.DataType:
    for kind, arrow in (
        (IntegerType, pa.int32()),
        (LongType, pa.int64()),
        (StringType, pa.string()),
        (BooleanType, pa.bool_()),
        (TimestampType, pa.timestamp("us", tz="UTC")),
    ):
        if isinstance(spark_type, kind):
            return arrow
    raise AssertionError(f"no Arrow type for {spark_type!r} of the jetstream schema")


ARROW_SCHEMA = pa.schema(
    [pa.field(f.name, _arrow_type(f.dataType), nullable=f.nullable) for f in SCHEMA.fields]
)


# The columns of a line's row that come from the file, not from the line (to_row's first
# three arguments are placeholders, replaced by these).
_PLACE = {"stream_seq": "line_id", "subject": "file_path", "published": "file_mtime"}
_NO_TIME = datetime.fromtimestamp(0, UTC)


def _lines_to_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        rows = [to_row(0, "", _NO_TIME, value.encode()) for value in batch["value"].to_pylist()]
        if not rows:
            continue
        values = dict(zip(SCHEMA.names, zip(*rows, strict=True), strict=True))
        arrays = []
        for field in ARROW_SCHEMA:
            if field.name in _PLACE:
                arrays.append(batch[_PLACE[field.name]].cast(field.type))
            elif field.name == "ts":
                # `ts` is `ts_ms` as a timestamp (to_row's datetime, exact to the ms): made from
                # the numbers in Arrow, not from one Python datetime a row.
                ts_ms = pa.array(values["ts_ms"], type=pa.int64())
                arrays.append(pc.multiply(ts_ms, 1000).cast(field.type))
            else:
                arrays.append(pa.array(values[field.name], type=field.type))
        yield pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
