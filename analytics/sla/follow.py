"""`quire analytics sla --follow`: the SLA tables kept current from the event stream.

A Structured Streaming query reads the stream through the `jetstream` source (from its first
event on the first start; from its checkpoint after that) in micro-batches of at most
`max_offsets_per_trigger` stream sequences, and stores each micro-batch's rows, as read, in
OUTPUT/_events/<batch id>/. At most every `refresh_s` seconds, when batches were stored since
the last time, every table is rebuilt from all of OUTPUT/_events (deduplicated on event_id)
by the batch job's own `run`, and the report is rewritten.

Exactly once, across restarts: Spark logs a micro-batch's offsets in the checkpoint before
running it and its commit after, and runs a batch whose commit is missing again, with the same
offsets, after a restart. Writing its rows to a directory of its own, in overwrite mode, makes
that replay replace what the first attempt stored instead of adding to it. A batch's directory
is read only once it is complete (Spark's _SUCCESS marker is written last).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from analytics.jetstream import SCHEMA, JetStreamDataSource
from analytics.sla.job import end_ms, run, table_input
from analytics.sla.options import SlaOptions
from analytics.sla.report import local_output, write_report
from analytics.sla.sources import StreamSource, deduplicate

EVENTS = "_events"
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 100_000
MAX_TRIGGER_S = 10.0  # micro-batches store events at least this often, whatever --refresh


class Follower:
    """The streaming query and the refreshes. `start()`, then `run()` until `stop()` (from
    another thread, or Ctrl-C in `follow`), which refreshes once more when batches are new."""

    def __init__(
        self,
        spark: SparkSession,
        source: StreamSource,
        options_factory: Callable[[int], SlaOptions],
        output: str | Path,
        checkpoint: str | Path,
        refresh_s: float,
        max_offsets_per_trigger: int = DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    ) -> None:
        if not isinstance(source, StreamSource):
            raise ValueError("--follow reads the event stream: give --url or --data-dir")
        self.spark = spark
        self.source = source
        self.options_factory = options_factory
        self.output = str(output).rstrip("/")
        self.report_dir = local_output(self.output)  # None: no report (not a local directory)
        self.checkpoint = str(checkpoint)
        self.refresh_s = refresh_s
        self.max_offsets_per_trigger = max_offsets_per_trigger
        self.query: StreamingQuery | None = None
        self.refreshed_batches: list[str] = []  # what the last refresh built the tables from
        # Held while a batch is stored and while the tables are rebuilt: a rebuild never reads
        # a batch directory that a replayed batch is overwriting.
        self._lock = threading.Lock()
        self._stored_since_refresh = False

    def start(self) -> StreamingQuery:
        self.spark.dataSource.register(JetStreamDataSource)
        stream = (
            self.spark.readStream.format("jetstream")
            .options(**self.source.options())
            .option("startingOffsets", "earliest")  # the first start only: then the checkpoint
            .option("maxOffsetsPerTrigger", str(self.max_offsets_per_trigger))
            .load()
        )
        trigger_s = min(self.refresh_s, MAX_TRIGGER_S)
        # What an earlier run stored and did not build into the tables is built at the first
        # refresh (decided before the query can store a batch of its own).
        self._stored_since_refresh = self._tables_behind()
        self.query = (
            stream.writeStream.foreachBatch(self._store)
            .option("checkpointLocation", self.checkpoint)
            .trigger(processingTime=f"{int(trigger_s * 1000)} milliseconds")
            .queryName("quire-sla-follow")
            .start()
        )
        return self.query

    def _store(self, batch: DataFrame, batch_id: int) -> None:
        with self._lock:
            batch.write.mode("overwrite").parquet(f"{self.output}/{EVENTS}/{batch_id:012d}")
            self._stored_since_refresh = True

    def stored_batches(self) -> list[str]:
        """The complete batch directories under OUTPUT/_events."""
        return sorted(path for path, _ in self._stored())

    def _stored(self) -> list[tuple[str, int]]:
        """The complete batch directories, each with the time (ms) its _SUCCESS was written."""
        jvm = self.spark.sparkContext._jvm
        pattern = jvm.org.apache.hadoop.fs.Path(f"{self.output}/{EVENTS}/*/_SUCCESS")
        fs = pattern.getFileSystem(self.spark.sparkContext._jsc.hadoopConfiguration())
        return [
            (status.getPath().getParent().toString(), status.getModificationTime())
            for status in fs.globStatus(pattern) or []
        ]

    def _tables_behind(self) -> bool:
        """Whether a batch was stored after the last refresh ended. A refresh writes the report
        last, and never runs while a batch is stored: a batch older than the report is in the
        tables (a replay after a crash rewrites its batch, which is then newer)."""
        stored = self._stored()
        if not stored:
            return False
        if self.report_dir is None:
            return True  # no report to tell when the tables were last built
        report = self.report_dir / "report.html"
        newest_ms = max(written_ms for _, written_ms in stored)
        return not report.exists() or newest_ms >= report.stat().st_mtime * 1000

    def refresh(self) -> bool:
        """Rebuild every table and the report from what is stored, if anything is new."""
        with self._lock:
            if not self._stored_since_refresh:
                return False
            self._stored_since_refresh = False
            started = time.monotonic()
            paths = self.stored_batches()
            stored = self.spark.read.schema(SCHEMA).parquet(*paths)
            # The period's bounds do not depend on end_ms: ask the factory for them.
            bounds = self.options_factory(0)
            # Deduplicated once for every table, not once per table.
            events = table_input(deduplicate(stored), bounds.until_ms).persist()
            try:
                options = self.options_factory(end_ms(events, bounds.since_ms, bounds.until_ms))
                run(self.spark, events, options, self.output)
            finally:
                events.unpersist()
            if self.report_dir is not None:
                write_report(self.report_dir)
            self.refreshed_batches = paths
            print(
                f"tables and report rebuilt from {len(paths)} stored batches "
                f"in {time.monotonic() - started:.1f} s",
                flush=True,
            )
            return True

    def run(self) -> None:
        """Refresh at most every `refresh_s` until the query stops; raises its failure."""
        assert self.query is not None, "start() first"
        next_refresh = time.monotonic()
        while self.query.isActive:
            wait_s = next_refresh - time.monotonic()
            # Spark takes whole milliseconds, at least one.
            if wait_s >= 0.001 and self.query.awaitTermination(wait_s):
                break
            self.refresh()
            next_refresh = time.monotonic() + self.refresh_s
        exception = self.query.exception()
        if exception is not None:
            raise exception
        self.refresh()

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()


def follow(
    spark: SparkSession,
    source: StreamSource,
    options_factory: Callable[[int], SlaOptions],
    output: str | Path,
    checkpoint: str | Path,
    refresh_s: float,
) -> None:
    """Keep OUTPUT's tables and report current until interrupted (Ctrl-C stops the query
    cleanly; the next start resumes from `checkpoint`)."""
    follower = Follower(spark, source, options_factory, output, checkpoint, refresh_s)
    follower.start()
    print(
        f"following {source.stream} at {source.url}: tables in {follower.output}, "
        f"refreshed at most every {refresh_s:g} s, checkpoint {checkpoint}",
        flush=True,
    )
    if follower.report_dir is None:
        print(
            "report: not written (OUTPUT is not a local directory): run "
            "`python -m analytics.sla.report DIR` on a copy of the tables",
            flush=True,
        )
    try:
        follower.run()
    except KeyboardInterrupt:
        follower.stop()
        follower.refresh()  # what the last micro-batches stored
    finally:
        follower.stop()  # also when a refresh failed: the query is not left running
