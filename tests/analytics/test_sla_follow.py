"""`--follow` (analytics/sla/follow.py) against a real JetStream and the session's Spark: the
tables follow the stream, and a restart from the checkpoint, after a crash between a batch's
write and its commit, counts every event exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from analytics.sla.follow import EVENTS, Follower
from analytics.sla.options import SlaOptions
from analytics.sla.sources import StreamSource
from tests.support.events import ScratchStream, scratch_stream
from tests.support.wait import until

pytestmark = pytest.mark.slow

T0_MS = 1_764_000_000_000  # an hour's start: every event in one ack_latency window
BOOT = "boot-follow"
MAX_OFFSETS = 10  # stream sequences per micro-batch


class Stream(ScratchStream):
    def __init__(self, js, name: str, prefix: str) -> None:
        super().__init__(js, name, prefix)
        self.seq = 0
        self.acked = 0  # entries the published events acknowledge

    async def publish_acks(self, events: int) -> None:
        """`events` entries.acknowledged events of one gateway, each acknowledging seq entries
        (so the counts differ from event to event)."""
        for _ in range(events):
            self.seq += 1
            count = self.seq
            event = {
                "schema_version": 1,
                "event_id": os.urandom(8).hex(),
                "kind": "entries.acknowledged",
                "ts_ms": T0_MS + self.seq * 1000,
                "source": "gateway",
                "ledger_id": 1,
                "bookie_id": None,
                "seq": self.seq,
                "boot_id": BOOT,
                "data": {
                    "count": count,
                    "first_entry_id": self.acked,
                    "last_entry_id": self.acked + count - 1,
                    "bytes": 100 * count,
                    "ensemble": ["bookie-1", "bookie-2", "bookie-3"],
                    "ensemble_size": 3,
                    "write_quorum": 3,
                    "ack_quorum": 2,
                    "latency_us": {"2000": count},
                    "latency_ms_p50": 2.0,
                    "latency_ms_p99": 2.0,
                    "latency_ms_max": 2.0,
                },
            }
            self.acked += count
            await self.publish_raw("entries.acknowledged", json.dumps(event).encode())


@pytest.fixture
async def stream(nc) -> AsyncIterator[Stream]:
    async with scratch_stream(nc, Stream) as fresh:
        yield fresh


def stored_dirs(out: Path) -> list[Path]:
    return sorted(p.parent for p in (out / EVENTS).glob("*/_SUCCESS"))


def stored_rows(out: Path) -> int:
    return sum(pq.read_table(d).num_rows for d in stored_dirs(out))


def refreshed_all(follower: Follower, out: Path) -> bool:
    """The last refresh built the tables from every batch stored (the tables are then
    written and left alone until another batch comes)."""
    dirs = [Path(d.removeprefix("file:")) for d in follower.refreshed_batches]
    return bool(dirs) and dirs == stored_dirs(out)


class Running:
    """A follower's `run()` on a thread of its own, as `follow` runs it on the main thread."""

    def __init__(self, follower: Follower) -> None:
        self.follower = follower
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.follower.run()
        except BaseException as exc:  # handed to the test, which raises it
            self.error = exc

    async def stop(self) -> None:
        await asyncio.to_thread(self.follower.stop)
        await asyncio.to_thread(self.thread.join, 120)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


async def follow_until_current(spark, nats_url, stream, out, checkpoint, published) -> None:
    follower = Follower(
        spark,
        StreamSource(url=nats_url, stream=stream.name),
        lambda end_ms: SlaOptions(end_ms=end_ms),
        out,
        checkpoint,
        refresh_s=2.0,
        max_offsets_per_trigger=MAX_OFFSETS,
    )
    await asyncio.to_thread(follower.start)
    running = Running(follower)
    running.thread.start()
    try:
        await until(
            lambda: (
                running.error is not None
                or (stored_rows(out) >= published and refreshed_all(follower, out))
            ),
            f"the tables built from {published} events",
            timeout_s=180,
        )
    finally:
        await running.stop()


def table(out: Path, name: str) -> list[dict]:
    return pq.read_table(out / name).to_pylist()


def check_tables(out: Path, stream: Stream) -> None:
    # Exactly what was published: a batch stored twice would show here before any dedup.
    assert stored_rows(out) == stream.seq
    (gateway,) = [r for r in table(out, "completeness") if r["source"] == "gateway"]
    assert (gateway["events"], gateway["first_seq"], gateway["last_seq"], gateway["missing"]) == (
        stream.seq,
        1,
        stream.seq,
        0,
    )
    overall = [r for r in table(out, "ack_latency") if r["group"] == "all"]
    assert sum(r["count"] for r in overall) == stream.acked
    assert (out / "report.html").is_file()


async def test_follow_keeps_the_tables_current_and_resumes_exactly_once(
    spark, nats_url, stream, tmp_path
):
    out, checkpoint = tmp_path / "out", tmp_path / "out" / "_checkpoint"
    await stream.publish_acks(MAX_OFFSETS)  # one micro-batch
    await follow_until_current(spark, nats_url, stream, out, checkpoint, MAX_OFFSETS)
    check_tables(out, stream)

    # A crash after the last batch was stored but before Spark logged its commit: the restart
    # runs that batch again, with the same offsets.
    commits = sorted(
        (p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    last = commits[-1]
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    replayed = out / EVENTS / f"{int(last.name):012d}" / "_SUCCESS"
    first_write_ns = replayed.stat().st_mtime_ns

    await stream.publish_acks(MAX_OFFSETS + 3)  # two more
    await follow_until_current(spark, nats_url, stream, out, checkpoint, 2 * MAX_OFFSETS + 3)
    assert replayed.stat().st_mtime_ns > first_write_ns  # it was replayed, and replaced
    assert [pq.read_table(d).num_rows for d in stored_dirs(out)] == [MAX_OFFSETS, MAX_OFFSETS, 3]
    check_tables(out, stream)
