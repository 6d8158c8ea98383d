"""`jetstream`: a PySpark data source (batch and streaming) over a JetStream stream.

    spark.dataSource.register(JetStreamDataSource)
    spark.read.format("jetstream").option("url", "nats://...").load()

Offsets are stream sequences: an offset is `{"seq": N}`, the next sequence to read, and a
micro-batch or a batch read covers [start, end). The driver only asks the stream for its first
and last sequence; each Spark task reads its own sequence range with an ephemeral pull consumer
(deliver policy by_start_sequence, no acks) inside the Python worker. Options and the schema are
documented in analytics/README.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

log = logging.getLogger(__name__)

DEFAULT_STREAM = "QUIRE_EVENTS"
# The schema versions of shared.events.Event this reader knows. Not imported from shared:
# the reader states what it was written for, and a newer publisher must not silently change it.
KNOWN_SCHEMA_VERSIONS = frozenset({1})
DEFAULT_PARTITION_SIZE = 10_000
FETCH_BATCH = 256
FETCH_TIMEOUT_S = 5.0

SCHEMA = StructType(
    [
        StructField("schema_version", IntegerType()),
        StructField("event_id", StringType()),
        StructField("kind", StringType()),
        StructField("ts", TimestampType()),
        StructField("ts_ms", LongType()),
        StructField("source", StringType()),
        StructField("ledger_id", LongType()),
        StructField("bookie_id", StringType()),
        StructField("data", StringType()),  # the event's data object as JSON
        StructField("seq", LongType()),  # the publisher's own sequence, when it sets one
        StructField("boot_id", StringType()),  # the publisher's boot, when it sets one
        StructField("stream_seq", LongType(), nullable=False),
        StructField("subject", StringType(), nullable=False),
        StructField("published", TimestampType(), nullable=False),  # JetStream's timestamp
        # False when schema_version is one this reader does not know: the row is kept, its
        # fields read by name as far as they match.
        StructField("schema_known", BooleanType(), nullable=False),
        # Set (and `raw` holds the payload) when the message is not an event: the row is kept.
        StructField("error", StringType()),
        StructField("raw", StringType()),
    ]
)


class JetStreamDataLoss(RuntimeError):
    """Sequences in the range to read were gone (purged, aged out or deleted)."""


@dataclass(frozen=True)
class Connection:
    url: str
    user: str | None = None
    password: str | None = None
    creds: str | None = None

    async def connect(self) -> Any:
        import nats

        # `url` may list the servers of a cluster, comma-separated (QUIRE_NATS_URL's form).
        servers = [part.strip() for part in self.url.split(",") if part.strip()]
        kwargs: dict[str, Any] = {
            "servers": servers,
            "dont_randomize": True,  # in the order given, as the services connect
            "allow_reconnect": False,
        }
        if self.user is not None:
            kwargs.update(user=self.user, password=self.password)
        if self.creds is not None:
            kwargs["user_credentials"] = self.creds
        return await nats.connect(**kwargs)


@dataclass(frozen=True)
class SequenceRange(InputPartition):
    """Stream sequences [start, end) of one Spark task."""

    start: int
    end: int


@dataclass(frozen=True)
class Options:
    connection: Connection
    stream: str
    subject: str | None
    fail_on_data_loss: bool
    partition_size: int | None
    num_partitions: int | None

    @classmethod
    def parse(cls, options: dict[str, str]) -> Options:
        if "url" not in options:
            raise ValueError("jetstream: the option 'url' is required")
        if "partitionsize" in options and "numpartitions" in options:
            raise ValueError("jetstream: give partitionSize or numPartitions, not both")
        return cls(
            connection=Connection(
                url=options["url"],
                user=options.get("user"),
                password=options.get("password"),
                creds=options.get("creds"),
            ),
            stream=options.get("stream", DEFAULT_STREAM),
            subject=options.get("subject"),
            fail_on_data_loss=_boolean(options.get("failondataloss", "true"), "failOnDataLoss"),
            partition_size=_positive(options.get("partitionsize"), "partitionSize"),
            num_partitions=_positive(options.get("numpartitions"), "numPartitions"),
        )


def _boolean(value: str, name: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise ValueError(f"jetstream: {name} must be true or false, not {value!r}")
    return value.lower() == "true"


def _positive(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    number = int(value)
    if number < 1:
        raise ValueError(f"jetstream: {name} must be at least 1, not {value!r}")
    return number


def split(start: int, end: int, partition_size: int | None, num_partitions: int | None) -> list:
    """[start, end) as consecutive SequenceRanges: of `partition_size` sequences, or
    `num_partitions` of them as equal as can be."""
    total = end - start
    if total <= 0:
        return []
    if num_partitions is not None:
        count = min(num_partitions, total)
        bounds = [start + total * i // count for i in range(count + 1)]
        return [SequenceRange(lo, hi) for lo, hi in zip(bounds, bounds[1:], strict=False)]
    size = partition_size or DEFAULT_PARTITION_SIZE
    return [SequenceRange(lo, min(lo + size, end)) for lo in range(start, end, size)]


async def _stream_bounds(options: Options) -> tuple[int, int]:
    """The stream's first sequence and the one after its last."""
    nc = await options.connection.connect()
    try:
        info = await nc.jetstream().stream_info(options.stream)
    finally:
        await nc.close()
    last = info.state.last_seq
    # An empty stream reports first_seq 0 when it never held a message, last_seq + 1 after a purge.
    return max(info.state.first_seq, 1), last + 1


def _resolve(value: str, first: int, after_last: int, name: str) -> int:
    if value == "earliest":
        return first
    if value == "latest":
        return after_last
    try:
        number = int(value)
    except ValueError:
        raise ValueError(
            f"jetstream: {name} must be earliest, latest or a stream sequence, not {value!r}"
        ) from None
    if number < 1:
        raise ValueError(f"jetstream: {name} must be a sequence of at least 1, not {value!r}")
    return number


def to_row(seq: int, subject: str, published: datetime, payload: bytes) -> tuple:
    """One message as a row of SCHEMA. Never raises: what is not an event becomes a row with
    `error` and the `raw` payload."""
    try:
        event = json.loads(payload)
        if not isinstance(event, dict):
            raise ValueError(f"a JSON {type(event).__name__}, not an object")
        version = event.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise ValueError(f"schema_version {version!r} is not an integer")
        ts_ms = _optional(event, "ts_ms", int)
        row = (
            version,
            _optional(event, "event_id", str),
            _optional(event, "kind", str),
            None if ts_ms is None else datetime.fromtimestamp(ts_ms / 1000, tz=UTC),
            ts_ms,
            _optional(event, "source", str),
            _optional(event, "ledger_id", int),
            _optional(event, "bookie_id", str),
            None if event.get("data") is None else json.dumps(event["data"]),
            _optional(event, "seq", int),
            _optional(event, "boot_id", str),
            seq,
            subject,
            published,
            version in KNOWN_SCHEMA_VERSIONS,
            None,
            None,
        )
    # ValueError covers json.JSONDecodeError and UnicodeDecodeError; a ts_ms out of the
    # calendar's range raises OverflowError or OSError.
    except (ValueError, TypeError, OverflowError, OSError) as exc:
        text = payload.decode("utf-8", errors="replace")
        return (None,) * 11 + (seq, subject, published, False, f"malformed: {exc}", text)
    return row


def _optional(event: dict, field: str, kind: type) -> Any:
    value = event.get(field)
    if value is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{field} {value!r} is not {kind.__name__}")
    return value


def read_range(options: Options, part: SequenceRange) -> Iterator[tuple]:
    """The rows of the messages with stream sequences in [part.start, part.end), in order.

    A Spark worker has no event loop: this one runs a loop of its own and yields between
    fetches, so a task holds one fetch batch in memory, not its whole range."""
    if not isinstance(part, SequenceRange):
        # Spark reads an empty plan as one partition, InputPartition(None): nothing to read.
        return
    loop = asyncio.new_event_loop()
    reader = _RangeReader(options, part)
    try:
        batch = loop.run_until_complete(reader.open())
        while batch is not None:
            yield from batch
            batch = loop.run_until_complete(reader.next_batch())
    finally:
        loop.run_until_complete(reader.close())
        loop.close()
    if reader.lost:
        log.warning(
            "jetstream: skipped lost sequences",
            extra={"stream": options.stream, "range": [part.start, part.end], "lost": reader.lost},
        )


class _RangeReader:
    def __init__(self, options: Options, part: SequenceRange) -> None:
        self._options = options
        self._part = part
        self._nc: Any = None
        self._js: Any = None
        self._sub: Any = None
        self._expected = part.start  # the next sequence this range should see
        self._pending = 0  # messages the consumer still has for us (up to the stream's end)
        self.lost = 0

    async def open(self) -> list[tuple] | None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        self._nc = await self._options.connection.connect()
        self._js = self._nc.jetstream()
        info = await self._js.stream_info(self._options.stream)
        first = max(info.state.first_seq, 1)
        if first > self._expected:
            self._lose(self._expected, min(first, self._part.end))
        if self._expected >= self._part.end:
            return None
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self._expected,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=60.0,  # the server removes it if this worker dies
            max_ack_pending=-1,
            mem_storage=True,
        )
        if self._options.subject is not None:
            config.filter_subject = self._options.subject
        self._sub = await self._js.pull_subscribe(
            self._options.subject or ">", stream=self._options.stream, config=config
        )
        consumer = await self._sub.consumer_info()
        self._pending = consumer.num_pending
        return await self.next_batch()

    async def next_batch(self) -> list[tuple] | None:
        if self._pending == 0 or self._expected >= self._part.end:
            return await self._finish()
        want = min(FETCH_BATCH, self._pending, self._part.end - self._expected)
        try:
            msgs = await self._sub.fetch(want, timeout=FETCH_TIMEOUT_S)
        except TimeoutError:
            # Nothing came although the consumer had messages: they were removed meanwhile.
            self._pending = 0
            return await self._finish()
        rows = []
        for msg in msgs:
            meta = msg.metadata
            seq = meta.sequence.stream
            self._pending = meta.num_pending
            if seq >= self._part.end:
                self._pending = 0
                break
            if seq > self._expected:
                await self._gap(seq)
            self._expected = seq + 1
            rows.append(to_row(seq, msg.subject, meta.timestamp, msg.data))
        return rows

    async def _finish(self) -> None:
        # The stream ran dry before the range's end: what is missing before `end` was deleted
        # (without a filter every sequence up to the stream's last is ours).
        if self._expected < self._part.end:
            await self._gap(self._part.end)
        return None

    async def _gap(self, upto: int) -> None:
        """Sequences [expected, upto) were not delivered: lost, or (with a subject filter)
        perhaps messages of other subjects."""
        if self._options.subject is None:
            info = await self._js.stream_info(self._options.stream)
            upto = min(upto, info.state.last_seq + 1)
            self._lose(self._expected, upto)
            return
        info = await self._js.stream_info(self._options.stream)
        # With a filter only what was removed from the stream's head is known to be lost.
        first = max(info.state.first_seq, 1)
        if first > self._expected:
            self._lose(self._expected, min(first, upto))

    def _lose(self, start: int, end: int) -> None:
        if end <= start:
            return
        if self._options.fail_on_data_loss:
            raise JetStreamDataLoss(
                f"jetstream: stream {self._options.stream} lost sequences {start}..{end - 1} "
                "(purged, aged out or deleted) before they were read; set failOnDataLoss=false "
                "to skip them"
            )
        self.lost += end - start
        self._expected = max(self._expected, end)

    async def close(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
                await self._js.delete_consumer(self._options.stream, self._sub._consumer)
            except Exception as exc:  # the consumer also expires by itself (inactive_threshold)
                log.warning("jetstream: consumer cleanup failed", extra={"err": repr(exc)})
        if self._nc is not None:
            await self._nc.close()


class JetStreamDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "jetstream"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return JetStreamBatchReader(dict(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return JetStreamStreamReader(dict(self.options))


class JetStreamBatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self._options = Options.parse(options)
        first, after_last = asyncio.run(_stream_bounds(self._options))
        self._start = _resolve(
            options.get("startingoffsets", "earliest"), first, after_last, "startingOffsets"
        )
        ending = options.get("endingoffsets", "latest")
        if ending == "earliest":
            raise ValueError("jetstream: endingOffsets must be latest or a stream sequence")
        self._end = _resolve(ending, first, after_last, "endingOffsets")

    def partitions(self) -> list:
        return split(
            self._start, self._end, self._options.partition_size, self._options.num_partitions
        )

    def read(self, partition: SequenceRange) -> Iterator[tuple]:
        return read_range(self._options, partition)


class JetStreamStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self._options = Options.parse(options)
        self._starting = options.get("startingoffsets", "latest")
        if "endingoffsets" in options:
            raise ValueError("jetstream: endingOffsets is for batch reads only")
        max_offsets = _positive(options.get("maxoffsetspertrigger"), "maxOffsetsPerTrigger")
        self._limit: ReadLimit = (
            ReadAllAvailable() if max_offsets is None else ReadMaxRows(max_offsets)
        )

    def initialOffset(self) -> dict:
        first, after_last = asyncio.run(_stream_bounds(self._options))
        return {"seq": _resolve(self._starting, first, after_last, "startingOffsets")}

    def getDefaultReadLimit(self) -> ReadLimit:
        return self._limit

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        _, after_last = asyncio.run(_stream_bounds(self._options))
        end = max(after_last, start["seq"])
        if isinstance(limit, ReadMaxRows):
            # Offsets, not rows: with a subject filter a batch may hold fewer rows.
            end = min(end, start["seq"] + limit.max_rows)
        return {"seq": end}

    def partitions(self, start: dict, end: dict) -> list:
        return split(
            start["seq"], end["seq"], self._options.partition_size, self._options.num_partitions
        )

    def read(self, partition: SequenceRange) -> Iterator[tuple]:
        return read_range(self._options, partition)

    def commit(self, end: dict) -> None:
        # Nothing to acknowledge: the consumers are ephemeral and ack nothing; the stream's
        # own limits decide what it keeps.
        return None
