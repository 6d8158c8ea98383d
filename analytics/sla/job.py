"""The durability SLA job: events in (the stream, a `quire up` data dir, or JSON-lines files),
one Parquet table per SLA question out (OUTPUT/<table>/), then OUTPUT/report.html.

    python -m analytics.sla --input events.jsonl --output out/
    spark-submit --master local[2] analytics/sla/job.py --url nats://... --output out/

The tables and the options are documented in analytics/README.md.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):
    # Run as a file (`spark-submit analytics/sla/job.py`): make the repository importable
    # (a zip or wheel given with --py-files already is).
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analytics.jetstream import DEFAULT_STREAM
from analytics.sla.availability import bookie_availability
from analytics.sla.completeness import completeness
from analytics.sla.ensembles import ensemble_changes
from analytics.sla.exposure import exposure, exposure_timeline
from analytics.sla.gc import gc_reclaim
from analytics.sla.latency import ack_latency
from analytics.sla.options import DEFAULT_TARGET_MS, DEFAULT_WINDOW_S, SlaOptions
from analytics.sla.recoveries import recoveries
from analytics.sla.report import local_output, write_report
from analytics.sla.sources import (
    FileSource,
    Source,
    SourceError,
    StreamSource,
    data_dir_source,
    deduplicate,
    read_events,
)

TableFunction = Callable[[DataFrame, SlaOptions], DataFrame]

# Every table the job writes, OUTPUT/<name>/, in this order.
TABLES: dict[str, TableFunction] = {
    "ack_latency": ack_latency,
    "recoveries": recoveries,
    "ensemble_changes": ensemble_changes,
    "bookie_availability": bookie_availability,
    "completeness": completeness,
    "exposure": exposure,
    "exposure_timeline": exposure_timeline,
    "gc_reclaim": gc_reclaim,
}

DEFAULT_DATA_DIR = Path("./quire-data")
DEFAULT_REFRESH_S = 60.0
STAGING = "_staging"


class UsageError(ValueError):
    """Options that cannot work together or values out of range: reported before Spark
    starts, and nothing is written."""


def table_input(events: DataFrame, until_ms: int | None) -> DataFrame:
    """The events every table function is given: events (not `error` rows), of a schema version
    this reader knows, with a time and a kind, before `until_ms` when set."""
    rows = events.where(
        F.col("error").isNull()
        & F.col("schema_known")
        & F.col("ts_ms").isNotNull()
        & F.col("kind").isNotNull()
    )
    if until_ms is not None:
        rows = rows.where(F.col("ts_ms") < F.lit(until_ms))
    return rows


def stage(spark: SparkSession, rows: DataFrame, until_ms: int | None, directory: str) -> DataFrame:
    """The table input of `rows` (as read, duplicates included), deduplicated on event_id,
    written once as Parquet partitioned by kind and read back: the source (a stream, which may
    grow meanwhile) is read exactly once, and each table scans only the kinds it filters on.

    Duplicates are rare (a publish retried after JetStream's duplicate window), so the rows
    are written as they are and only their event_ids are checked; the rows move through a
    shuffle to be deduplicated, and are written again, only when some event_id repeats."""
    staged = _write_by_kind(
        spark, table_input(rows, until_ms).drop("raw", "error"), f"{directory}/rows"
    )
    repeated = (
        staged.where(F.col("event_id").isNotNull())
        .groupBy("event_id")
        .count()
        .where(F.col("count") > 1)
    )
    if repeated.isEmpty():
        return staged
    return _write_by_kind(spark, deduplicate(staged), f"{directory}/deduplicated")


def _write_by_kind(spark: SparkSession, rows: DataFrame, directory: str) -> DataFrame:
    rows.write.mode("overwrite").partitionBy("kind").parquet(directory)
    # With the schema given, `kind` keeps its type (not one inferred from the directory names).
    return spark.read.schema(rows.schema).parquet(directory)


def end_ms(events: DataFrame, since_ms: int | None, until_ms: int | None) -> int:
    """SlaOptions.end_ms: `until_ms` when given, else the last event's time (else `since_ms`,
    else 0, for an empty input)."""
    if until_ms is not None:
        return until_ms
    last = events.agg(F.max("ts_ms")).first()[0]
    if last is not None:
        return int(last)
    return since_ms if since_ms is not None else 0


def run(
    spark: SparkSession, events: DataFrame, options: SlaOptions, output: str | Path
) -> dict[str, DataFrame]:
    """Build every table of TABLES from `events` (the table functions' input: see
    `table_input`) and write each as Parquet to OUTPUT/<name>/, replacing what was there.
    Returns the tables as written (read back)."""
    written = {}
    for name, function in TABLES.items():
        path = f"{output}/{name}"
        function(events, options).write.mode("overwrite").parquet(path)
        written[name] = spark.read.parquet(path)
    return written


# -- the command line --------------------------------------------------------------------


def parse_time_ms(text: str) -> int:
    """An ISO 8601 time (UTC when it names no zone) as milliseconds since the epoch."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time (e.g. 2026-11-24T10:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analytics.sla",
        description="Durability SLA tables (Parquet) and report from Quire's event stream.",
    )
    source = p.add_argument_group("input (one of: --input, --url, --data-dir)")
    source.add_argument("--input", help="JSON-lines files of events: a file, directory or glob")
    source.add_argument("--url", help="NATS server URL of the events stream")
    source.add_argument("--user", help="NATS user (with --url)")
    source.add_argument("--password", help="NATS password (with --url)")
    source.add_argument(
        "--password-file",
        help="a file holding the NATS password (with --url), kept off the command line",
    )
    source.add_argument("--creds", help="NATS .creds file (with --url)")
    source.add_argument("--stream", default=DEFAULT_STREAM, help="the events stream")
    source.add_argument(
        "--data-dir",
        type=Path,
        help=f"a `quire up` data dir: its stream (default {DEFAULT_DATA_DIR})",
    )
    period = p.add_argument_group("period and targets")
    period.add_argument("--since", type=parse_time_ms, help="ISO 8601; the period's start")
    period.add_argument("--until", type=parse_time_ms, help="ISO 8601; events from it are ignored")
    period.add_argument(
        "--target-ms",
        type=_positive_float,
        default=DEFAULT_TARGET_MS,
        help=f"add latency target in ms (default {DEFAULT_TARGET_MS})",
    )
    period.add_argument(
        "--window",
        type=_positive_int,
        default=DEFAULT_WINDOW_S,
        help=f"ack_latency and ensemble_changes window, seconds (default {DEFAULT_WINDOW_S})",
    )
    run_group = p.add_argument_group("running")
    run_group.add_argument("--master", help="Spark master URL (default: Spark's, local[*])")
    run_group.add_argument("--output", required=True, help="directory of the tables and report")
    run_group.add_argument(
        "--follow", action="store_true", help="keep the tables current from the stream"
    )
    run_group.add_argument(
        "--checkpoint", help="--follow's checkpoint dir (default OUTPUT/_checkpoint)"
    )
    run_group.add_argument(
        "--refresh",
        type=_positive_float,
        default=DEFAULT_REFRESH_S,
        help=f"--follow: seconds between refreshes (default {DEFAULT_REFRESH_S:g})",
    )
    return p


def source_of(args: argparse.Namespace) -> Source:
    """The input the options name, checked as far as it can be without Spark."""
    given = [name for name in ("input", "url", "data_dir") if getattr(args, name) is not None]
    if len(given) > 1:
        raise UsageError("give one of --input, --url, --data-dir")
    credentials = (args.user, args.password, args.password_file, args.creds)
    if any(c is not None for c in credentials) and args.url is None:
        raise UsageError("--user, --password, --password-file and --creds go with --url")
    if args.input is not None:
        if args.follow:
            raise UsageError("--follow reads the stream: use --url or --data-dir, not --input")
        _check_readable(args.input)
        return FileSource(args.input)
    if args.url is not None:
        password = args.password
        if args.password_file is not None:
            if password is not None:
                raise UsageError("give --password or --password-file, not both")
            try:
                password = Path(args.password_file).read_text().strip()
            except OSError as exc:
                raise UsageError(f"--password-file: {exc.strerror}") from None
        return StreamSource(args.url, args.user, password, args.creds, args.stream)
    try:
        return data_dir_source(args.data_dir or DEFAULT_DATA_DIR, args.stream)
    except SourceError as exc:
        raise UsageError(str(exc)) from None


def _check_readable(path: str) -> None:
    if "://" in path:
        return  # another file system (hdfs://, s3a://...): Spark reads and checks it
    if glob.has_magic(path):
        if not glob.glob(path):
            raise UsageError(f"--input {path}: no file matches")
        return
    target = Path(path)
    if not target.exists():
        raise UsageError(f"--input {path}: no such file or directory")
    try:
        if target.is_dir():
            if not any(child.is_file() for child in target.iterdir()):
                raise UsageError(f"--input {path}: an empty directory")
        else:
            with target.open("rb"):
                pass
    except OSError as exc:
        raise UsageError(f"--input {path}: cannot be read ({exc.strerror})") from None


def validate(args: argparse.Namespace) -> Source:
    if args.since is not None and args.until is not None and args.since >= args.until:
        raise UsageError("--since must be before --until")
    if args.checkpoint is not None and not args.follow:
        raise UsageError("--checkpoint goes with --follow")
    return source_of(args)


def spark_session(master: str | None) -> SparkSession:
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        # Not under spark-submit: this process starts Spark, and its Python workers must run
        # this interpreter and connect back over loopback (../shared/NOTES.md).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        if master is None or master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName("quire-sla").config("spark.sql.session.timeZone", "UTC")
    if master is not None:
        builder = builder.master(master)
    return builder.getOrCreate()


def options_factory(args: argparse.Namespace) -> Callable[[int], SlaOptions]:
    def make(end: int) -> SlaOptions:
        return SlaOptions(
            end_ms=end,
            since_ms=args.since,
            until_ms=args.until,
            target_ms=args.target_ms,
            window_s=args.window,
        )

    return make


def batch(spark: SparkSession, source: Source, args: argparse.Namespace) -> dict[str, DataFrame]:
    output = args.output.rstrip("/")
    staging = f"{output}/{STAGING}/{uuid.uuid4().hex}"
    try:
        events = stage(spark, read_events(spark, source), args.until, staging)
        options = options_factory(args)(end_ms(events, args.since, args.until))
        return run(spark, events, options, output)
    finally:
        _delete(spark, f"{output}/{STAGING}")


def _delete(spark: SparkSession, path: str) -> None:
    """Delete `path` (recursively) on whatever file system Spark writes it to."""
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).delete(
        hadoop_path, True
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        source = validate(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    spark = spark_session(args.master)
    if args.follow:
        # Imported here: follow.py builds its tables with this module's `run`.
        from analytics.sla.follow import follow

        follow(
            spark,
            source,
            options_factory(args),
            args.output,
            args.checkpoint or f"{args.output.rstrip('/')}/_checkpoint",
            args.refresh,
        )
        return 0
    tables = batch(spark, source, args)
    for name, table in tables.items():
        print(f"{name}: {table.count()} rows -> {args.output.rstrip('/')}/{name}/")
    report_dir = local_output(args.output)
    if report_dir is None:
        # The report is written with pyarrow and matplotlib from a local directory.
        print(
            "report: not written (OUTPUT is not a local directory): run "
            "`python -m analytics.sla.report DIR` on a copy of the tables"
        )
    else:
        print(f"report: {write_report(report_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
