"""The `jetstream` data source against a real JetStream (the session's nats-server) and a real
local Spark (one session for all these tests: its start dominates)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator

import pytest
from nats.js.api import StreamConfig

from analytics.jetstream import SCHEMA
from tests.support.events import ScratchStream, scratch_stream
from tests.support.wait import until

pytestmark = pytest.mark.slow


class Stream(ScratchStream):
    async def publish(self, count: int, kind: str = "ledger.created", **extra) -> None:
        for i in range(count):
            event = {
                "schema_version": 1,
                "event_id": os.urandom(8).hex(),
                "kind": kind,
                "ts_ms": 1_700_000_000_000 + i,
                "source": "bookie-1.journal",
                "ledger_id": i,
                "bookie_id": "bookie-1",
                "data": {"i": i},
                **extra,
            }
            await self.publish_raw(kind, json.dumps(event).encode())


@pytest.fixture
async def stream(nc) -> AsyncIterator[Stream]:
    async with scratch_stream(nc, Stream) as fresh:
        yield fresh


def read(spark, nats_url: str, stream: Stream, **options):
    reader = spark.read.format("jetstream").option("url", nats_url).option("stream", stream.name)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


async def test_batch_reads_every_message_once_with_the_event_schema(spark, nats_url, stream):
    await stream.publish(24)
    await stream.publish(2, kind="bookie.someday.new")  # unknown kinds are kept
    await stream.publish(1, schema_version=2, extra_field="x")  # a version we do not know
    await stream.publish(1, seq=7, boot_id="b-1")  # the publisher's optional fields
    await stream.publish_raw("ledger.created", b"not json")
    await stream.publish_raw("ledger.created", b'{"kind": "no version"}')
    df = read(spark, nats_url, stream, numPartitions=4)
    assert df.rdd.getNumPartitions() == 4
    rows = await asyncio.to_thread(df.collect)

    assert df.columns == SCHEMA.names
    assert sorted(r.stream_seq for r in rows) == list(range(1, 31))
    by_seq = {r.stream_seq: r for r in rows}
    first = by_seq[1]
    assert (first.kind, first.ledger_id, first.bookie_id, first.source) == (
        "ledger.created",
        0,
        "bookie-1",
        "bookie-1.journal",
    )
    assert json.loads(first.data) == {"i": 0}
    assert first.ts_ms == 1_700_000_000_000
    assert int(first.ts.timestamp() * 1000) == first.ts_ms
    assert first.subject == f"{stream.prefix}.events.ledger.created"
    assert first.published is not None and first.schema_known and first.error is None
    assert [by_seq[s].kind for s in (25, 26)] == ["bookie.someday.new"] * 2
    assert (by_seq[27].schema_version, by_seq[27].schema_known) == (2, False)
    assert by_seq[27].kind == "ledger.created"
    assert (by_seq[28].seq, by_seq[28].boot_id) == (7, "b-1")
    assert by_seq[24].seq is None and by_seq[24].boot_id is None
    for seq in (29, 30):
        assert by_seq[seq].error.startswith("malformed")
        assert by_seq[seq].kind is None and not by_seq[seq].schema_known
    assert by_seq[29].raw == "not json"

    # The partitions cover the range in contiguous, disjoint sequence ranges.
    spans = await asyncio.to_thread(
        df.rdd.mapPartitions(lambda it: [sorted(r.stream_seq for r in it)]).collect
    )
    assert [len(s) for s in spans] == [7, 8, 7, 8]
    assert [seq for span in spans for seq in span] == list(range(1, 31))


async def test_batch_offsets_partition_size_and_subject(spark, nats_url, stream):
    await stream.publish(10)
    await stream.publish(5, kind="gc.done")
    df = read(spark, nats_url, stream, startingOffsets=4, endingOffsets=13, partitionSize=4)
    assert df.rdd.getNumPartitions() == 3
    rows = await asyncio.to_thread(df.collect)
    assert sorted(r.stream_seq for r in rows) == list(range(4, 13))

    subject = f"{stream.prefix}.events.gc.>"
    rows = await asyncio.to_thread(read(spark, nats_url, stream, subject=subject).collect)
    assert sorted(r.stream_seq for r in rows) == list(range(11, 16))
    assert {r.kind for r in rows} == {"gc.done"}

    rows = await asyncio.to_thread(read(spark, nats_url, stream, startingOffsets="latest").collect)
    assert rows == []


class Batches:
    """What a foreachBatch sink saw: the stream sequences of each micro-batch. With
    `hold_first`, the first micro-batch does not end until `release()`: the query plans no
    further batch meanwhile (micro-batches run one after another), so a test can change the
    stream between two batches whatever the machine's speed."""

    def __init__(self, hold_first: bool = False) -> None:
        self._lock = threading.Lock()
        self.batches: list[list[int]] = []
        self._held = threading.Event()
        if not hold_first:
            self._held.set()

    def __call__(self, df, batch_id: int) -> None:
        seqs = sorted(r.stream_seq for r in df.select("stream_seq").collect())
        with self._lock:
            self.batches.append(seqs)
        self._held.wait(timeout=300)

    def release(self) -> None:
        self._held.set()

    def seqs(self) -> list[int]:
        with self._lock:
            return [seq for batch in self.batches for seq in batch]


def start_query(spark, nats_url, stream, tmp_path, sink, **options):
    reader = (
        spark.readStream.format("jetstream")
        .option("url", nats_url)
        .option("stream", stream.name)
        .option("startingOffsets", "earliest")
    )
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


async def test_streaming_bounds_each_micro_batch(spark, nats_url, stream, tmp_path):
    await stream.publish(18)
    sink = Batches()
    query = await asyncio.to_thread(
        start_query, spark, nats_url, stream, tmp_path, sink, maxOffsetsPerTrigger=4
    )
    try:
        await until(lambda: len(sink.seqs()) >= 18, "the first 18 events", timeout_s=120)
        await stream.publish(5)
        await until(lambda: len(sink.seqs()) >= 23, "5 more events", timeout_s=120)
        assert query.exception() is None
    finally:
        await asyncio.to_thread(query.stop)
    assert sink.seqs() == list(range(1, 24))
    assert all(len(batch) <= 4 for batch in sink.batches)


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
async def test_streaming_stream_purged_under_the_query(
    spark, nats_url, stream, tmp_path, fail_on_data_loss
):
    await stream.publish(60)
    sink = Batches(hold_first=True)
    query = await asyncio.to_thread(
        start_query,
        spark,
        nats_url,
        stream,
        tmp_path,
        sink,
        maxOffsetsPerTrigger=3,
        failOnDataLoss=str(fail_on_data_loss).lower(),
    )
    try:
        await until(lambda: sink.seqs(), "a first micro-batch", timeout_s=120)
        await stream.js.purge_stream(stream.name)  # while the first batch is held
        sink.release()
        if fail_on_data_loss:
            await until(lambda: not query.isActive, "the query to fail", timeout_s=120)
            assert "lost sequences" in str(query.exception())
            assert "failOnDataLoss=false" in str(query.exception())
        else:
            await stream.publish(4)
            await until(lambda: 64 in sink.seqs(), "the events after the purge", timeout_s=120)
            assert query.exception() is None
            seqs = sink.seqs()
            assert seqs[-4:] == [61, 62, 63, 64]
            assert len(seqs) == len(set(seqs)) < 64
    finally:
        sink.release()
        await asyncio.to_thread(query.stop)


async def test_batch_read_with_user_and_password(spark, cluster_dir):
    import nats

    from quire.infra import start_nats

    server = start_nats(cluster_dir("nats-auth"), credentials=("reader", "s3cret"))
    try:
        nc = await nats.connect(server.url, user="reader", password="s3cret")
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="QUIRE_EVENTS", subjects=["quire.events.>"]))
        await Stream(js, "QUIRE_EVENTS", "quire").publish(3)
        await nc.close()
        df = (
            spark.read.format("jetstream")
            .option("url", server.url)
            .option("user", "reader")
            .option("password", "s3cret")
            .load()
        )
        rows = await asyncio.to_thread(df.collect)
        assert sorted(r.stream_seq for r in rows) == [1, 2, 3]
    finally:
        server.stop()
