"""Synthetic events of the real schema, for the SLA jobs' tests and the scale run.

    python -m analytics.synth --events 10000000 --output DIR [--seed 1] [--bookies 6]
        [--ledgers 200] [--start 2026-01-01T00:00:00Z] [--files 8]

writes DIR/events-00000.jsonl ... (JSON lines: one event a line, exactly the JSON a service
publishes, `shared.events.Event` with its fields in order; metadata events with null `seq` and
`boot_id`), the files in time order, so that Spark reads them in parallel.

The events tell one consistent story, second by second, of a cluster of `--bookies` bookies
writing `--ledgers` ledgers at once (docs/events.md has every kind):

- the bookies register; ledgers of several quorum shapes are created on the writable
  bookies, written (one `entries.acknowledged` per ledger per second, a latency histogram of
  every entry, bytes), closed after a while and replaced by new ones; some closed ledgers are
  deleted, then each bookie that held one drops it at its next GC run (`gc.ledger_deleted`),
  and later runs reclaim its bytes (`gc.entrylog_deleted`, `gc.compacted` listing it, a
  ledger's bytes sometimes over two logs, some still unreclaimed at the end);
- bookies are lost for good: the writers on them change ensemble within a few seconds (the
  old ensemble's acks flushed first, `ledger.ensemble_changed`, `ledger.updated` with the
  segments; the entries in flight slow), the auditor reports the loss (`bookie.lost`) once the
  lease lapsed and marks every ledger with a segment on it, the replicator claims them one
  after the other and copies each fragment (`autorecovery.fragment_replicated`, the segment
  updated), a deleted ledger's claim ends at once; a new bookie joins later;
- a bookie restarts (`bookie.unregistered`, registered again; new `boot_id`s for its journal
  and ledgerstore);
- read-only spells (the journal's own `bookie.readonly`/`bookie.writable`, the registry's and
  the auditor's), the writers on the bookie changing ensemble as for a loss;
- recoveries: a writer goes away, another gateway fences its ledger (`ledger.updated` to
  IN_RECOVERY, `ledger.fenced` on each live bookie of its last segment) and closes it
  (`ledger.closed` from IN_RECOVERY, `ledger.recovered`);
- the gateway's publisher once drops a second's acknowledgements (its buffer full) and reports
  them (`events.dropped`), and `SILENT_GAPS` events are lost without a report (a gap in `seq`).

Incidents are placed at fixed fractions of the run (its length in seconds is about `--events`
/ `--ledgers`), so a small run has them too. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared.latency import latency_bucket

DEFAULT_START = "2026-01-01T00:00:00Z"
# Quorum shapes (E, Qw, Qa) and how often each is chosen.
SHAPES = [((3, 3, 2), 5), ((3, 2, 2), 3), ((5, 3, 2), 2), ((2, 2, 2), 1)]
ENTRY_SIZES = [100, 512, 1024, 4096, 16384]
LOSSES_AT = (0.15, 0.4, 0.65)  # fractions of the run at which a bookie is lost
READONLY_AT = (0.3, 0.55)
RESTART_AT = 0.5  # a bookie restarts (new boot ids)
RECOVERIES = 12  # writers that go away, spread over the run
DROP_AT = 0.37  # the gateway's publisher drops a second's acknowledgements
SILENT_GAP_AT = (0.45, 0.85)  # an event lost without a report
SILENT_GAPS = len(SILENT_GAP_AT)
ENTRY_HEAD_BYTES = 20  # an entry's head in an entry log (gc events count it)
LATENCY_TABLE = 4096


def parse_start(text: str) -> int:
    return int(
        datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp() * 1000
    )


class Output:
    """The event lines, spread over `files` files in time order (the first N/files events in
    the first file...)."""

    def __init__(self, directory: Path, files: int, events: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.paths = [directory / f"events-{i:05d}.jsonl" for i in range(files)]
        self.target = events
        self.files = files
        self.count = 0
        self._index = 0
        self._buffer: list[str] = []
        self._file = self.paths[0].open("w")

    def write(self, line: str) -> None:
        index = min(self.files - 1, self.count * self.files // max(1, self.target))
        if index != self._index:
            self.flush()
            self._file.close()
            self._index = index
            self._file = self.paths[index].open("w")
        self._buffer.append(line)
        self.count += 1
        if len(self._buffer) >= 4096:
            self.flush()

    def flush(self) -> None:
        self._file.writelines(self._buffer)
        self._buffer.clear()

    def close(self) -> None:
        self.flush()
        self._file.close()
        for path in self.paths:  # files left empty (a short run): still there, empty
            path.touch()


class Publisher:
    """One process's EventPublisher: its source, boot id and seq; ts never goes back."""

    def __init__(self, source: str, boot_id: str | None) -> None:
        self.source = source
        self.boot_id = boot_id
        self.seq = 0
        self.last_ts = 0


@dataclass
class Ledger:
    ledger_id: int
    shape: tuple[int, int, int]
    segments: list[tuple[int, list[str]]]  # (first entry, bookies)
    entry_bytes: int
    rate: float  # entries a second, on average
    base_us: int  # its latency's scale
    end_t: int  # the second its writer closes it (or goes away)
    next_entry: int = 0
    length: int = 0  # payload bytes acknowledged (and recovered)
    version: int = 0
    state: str = "OPEN"
    deleted: bool = False
    writing: bool = True
    change_at: dict[int, list[str]] = field(default_factory=dict)  # second -> to replace
    ack_shape: str = ""  # its acknowledgements' JSON from "ensemble" to "latency_us"

    def __post_init__(self) -> None:
        self.ensemble_changed()

    @property
    def ensemble(self) -> list[str]:
        return self.segments[-1][1]

    def ensemble_changed(self) -> None:
        e, w, a = self.shape
        self.ack_shape = (
            f'"ensemble":{json.dumps(self.ensemble, separators=(",", ":"))},'
            f'"ensemble_size":{e},"write_quorum":{w},"ack_quorum":{a},"latency_us":{{'
        )

    def held_by(self) -> set[str]:
        return {b for _, bookies in self.segments for b in bookies}

    def segment_ranges(self) -> Iterator[tuple[int, int, list[str]]]:
        """(first, last, bookies) of each segment (last < first: an empty one)."""
        for i, (first, bookies) in enumerate(self.segments):
            end = self.segments[i + 1][0] if i + 1 < len(self.segments) else self.next_entry
            yield first, end - 1, bookies


def entries_on(first: int, last: int, index: int, ensemble_size: int, write_quorum: int) -> int:
    """Entries first..last of a segment whose write set holds ensemble position `index`
    (entry e goes to positions (e + i) % E, i < Qw)."""
    count = 0
    for e in range(first, min(last, first + ensemble_size - 1) + 1):
        if (index - e) % ensemble_size < write_quorum:
            # e, e + E, e + 2E... up to last
            count += (last - e) // ensemble_size + 1
    return count


@dataclass
class Bookie:
    bookie_id: str
    journal: Publisher
    ledgerstore: Publisher
    state: str = "writable"
    gc_deleted: set[int] = field(default_factory=set)  # ledgers its GC dropped
    unreclaimed: dict[int, int] = field(default_factory=dict)  # dropped ledger -> bytes left
    next_log: int = 1


class Story:
    def __init__(
        self,
        output: Output,
        seed: int,
        bookies: int,
        ledgers: int,
        start_ms: int,
    ) -> None:
        self.out = output
        self.rng = random.Random(seed)
        self.start_ms = start_ms
        self.concurrent = ledgers
        # About one acknowledgement per ledger per second, and a few per cent more of the rest.
        self.seconds = max(60, math.ceil(output.target / (ledgers * 1.02)))
        self.gateway = Publisher("gateway", self._id())
        self.recovering_gateway = Publisher("gateway-2", self._id())
        self.auditor = Publisher("auditor", self._id())
        self.replicator = Publisher("replicator", self._id())
        self.metadata_instance = self._id()
        self.outbox_id = 0
        self.bookies = {
            f"bookie-{i}": Bookie(
                f"bookie-{i}",
                Publisher(f"bookie-{i}.journal", self._id()),
                Publisher(f"bookie-{i}.ledgerstore", self._id()),
            )
            for i in range(1, bookies + 1)
        }
        self.ledgers: dict[int, Ledger] = {}
        self.active: list[Ledger] = []
        self.next_ledger_id = 1
        # The replicator's queue: (ledger, lost bookie, when marked).
        self.marked: list[tuple[int, str, int]] = []
        self.actions: list[tuple[int, int, Callable[[int], None]]] = []  # (second, n, action)
        self._n = 0
        self._silent: set[int] = {int(f * self.seconds) for f in SILENT_GAP_AT}
        self._latency = {
            base: [
                latency_bucket(
                    int(
                        base
                        * math.exp(self.rng.gauss(0, 0.45))
                        * (8 if self.rng.random() < 0.01 else 1)
                    )
                )
                for _ in range(LATENCY_TABLE)
            ]
            for base in (500, 800, 1200, 2000, 3500)
        }
        self.dropped_kinds: dict[str, int] = {}

    # -- events -----------------------------------------------------------------------------

    def _id(self) -> str:
        return f"{self.rng.getrandbits(128):032x}"

    def ts(self, t: int, offset_ms: int) -> int:
        return self.start_ms + t * 1000 + offset_ms

    def emit(
        self,
        publisher: Publisher,
        kind: str,
        ts_ms: int,
        data: dict[str, Any],
        ledger_id: int | None = None,
        bookie_id: str | None = None,
    ) -> None:
        ts_ms = max(ts_ms, publisher.last_ts)
        publisher.last_ts = ts_ms
        publisher.seq += 1
        self._write(
            {
                "schema_version": 1,
                "event_id": self._id(),
                "kind": kind,
                "ts_ms": ts_ms,
                "source": publisher.source,
                "ledger_id": ledger_id,
                "bookie_id": bookie_id,
                "data": data,
                "seq": publisher.seq,
                "boot_id": publisher.boot_id,
            }
        )

    def outbox(
        self,
        kind: str,
        ts_ms: int,
        data: dict[str, Any],
        ledger_id: int | None = None,
        bookie_id: str | None = None,
    ) -> None:
        self.outbox_id += 1
        self._write(
            {
                "schema_version": 1,
                "event_id": f"{self.metadata_instance}-{self.outbox_id}",
                "kind": kind,
                "ts_ms": ts_ms,
                "source": "metadata",
                "ledger_id": ledger_id,
                "bookie_id": bookie_id,
                "data": data,
                "seq": None,
                "boot_id": None,
            }
        )

    def _write(self, event: dict[str, Any]) -> None:
        self.out.write(json.dumps(event, separators=(",", ":")) + "\n")

    def at(self, second: int, action: Callable[[int], None]) -> None:
        self._n += 1
        heapq.heappush(self.actions, (second, self._n, action))

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> None:
        self.outbox("auditor.elected", self.start_ms, {"leader_id": "auditor", "term": 1})
        for bookie in self.bookies.values():
            self.register(bookie, 0, None)
        for i, fraction in enumerate(LOSSES_AT):
            self.at(int(fraction * self.seconds), lambda t, i=i: self.lose_bookie(t, i))
        self.at(int(RESTART_AT * self.seconds), self.restart)
        for fraction in READONLY_AT:
            self.at(int(fraction * self.seconds), self.read_only_spell)
        for i in range(RECOVERIES):
            self.at(int((i + 0.5) * 0.8 * self.seconds / RECOVERIES), self.writer_goes_away)
        gc_interval = max(30, self.seconds // 12)
        for i, bookie in enumerate(self.bookies.values()):
            self.at(gc_interval * (i + 1) // len(self.bookies), lambda t, b=bookie: self.gc(t, b))
        t = 0
        drop_t = int(DROP_AT * self.seconds)
        while self.out.count < self.out.target:
            while self.actions and self.actions[0][0] <= t:
                _, _, action = heapq.heappop(self.actions)
                action(t)
            self.churn(t)
            self.acknowledge(t, drop=t == drop_t)
            t += 1

    def register(self, bookie: Bookie, t: int, previous: str | None, offset_ms: int = 1) -> None:
        ts = self.ts(t, offset_ms)
        data = {"state": bookie.state, "previous_state": previous, "lease_expires_at": ts + 10_000}
        self.outbox("bookie.registered", ts, data, bookie_id=bookie.bookie_id)

    def writable(self, exclude: frozenset[str] | set[str] = frozenset()) -> list[str]:
        return [
            b.bookie_id
            for b in self.bookies.values()
            if b.state == "writable" and b.bookie_id not in exclude
        ]

    # -- ledgers ----------------------------------------------------------------------------

    def churn(self, t: int) -> None:
        still = []
        for ledger in self.active:
            if ledger.end_t <= t and ledger.writing:
                self.close(ledger, t, self.ts(t, 950), "OPEN")
            elif ledger.writing:
                still.append(ledger)
        self.active = still
        while len(self.active) < self.concurrent:
            if not self.create(t):
                break

    def create(self, t: int) -> bool:
        writable = self.writable()
        shapes = [(s, w) for s, w in SHAPES if s[0] <= len(writable)]
        if not shapes:
            return False
        shape = self.rng.choices([s for s, _ in shapes], [w for _, w in shapes])[0]
        ensemble = self.rng.sample(writable, shape[0])
        # Ledgers live up to a quarter of the run, the first ones cut short at random so
        # that closes spread over the run.
        life = self.rng.randint(20, max(21, self.seconds // 4))
        ledger = Ledger(
            ledger_id=self.next_ledger_id,
            shape=shape,
            segments=[(0, ensemble)],
            entry_bytes=self.rng.choice(ENTRY_SIZES),
            rate=math.exp(self.rng.uniform(0, math.log(300))),
            base_us=self.rng.choice(list(self._latency)),
            end_t=t + (self.rng.randint(1, life) if t == 0 else life),
        )
        self.next_ledger_id += 1
        self.ledgers[ledger.ledger_id] = ledger
        self.active.append(ledger)
        ts = self.ts(t, self.rng.randint(0, 99))
        e, w, a = shape
        self.outbox(
            "ledger.created",
            ts,
            {
                "ensemble_size": e,
                "write_quorum": w,
                "ack_quorum": a,
                "digest": "crc32c",
                "ensemble": ensemble,
                "ctime": ts,
            },
            ledger_id=ledger.ledger_id,
        )
        return True

    def close(self, ledger: Ledger, t: int, ts: int, previous: str) -> None:
        ledger.writing = False
        ledger.version += 1
        ledger.state = "CLOSED"
        self.outbox(
            "ledger.closed",
            ts,
            {
                "version": ledger.version,
                "state": "CLOSED",
                "previous_state": previous,
                "last_entry_id": ledger.next_entry - 1,
                "length": ledger.length,
                "ensemble_changed": False,
            },
            ledger_id=ledger.ledger_id,
        )
        if self.rng.random() < 0.4:  # deleted later
            delay = self.rng.randint(10, max(11, self.seconds // 8))
            self.at(t + delay, lambda t2, ledger=ledger: self.delete(ledger, t2))

    def delete(self, ledger: Ledger, t: int) -> None:
        ledger.deleted = True
        self.outbox("ledger.deleted", self.ts(t, 10), {}, ledger_id=ledger.ledger_id)

    # -- acknowledgements -------------------------------------------------------------------

    def acknowledge(self, t: int, drop: bool) -> None:
        flush_ts = self.ts(t, 900)
        dropped_from = None
        dropped = 0
        silent = t in self._silent
        rng = self.rng
        for ledger in self.active:
            count = max(1, int(ledger.rate * (0.5 + rng.random())))
            bad = ledger.change_at.pop(t, None)
            if bad is not None:
                # The adds in flight on the bad bookie wait for the new segment: the old
                # ensemble's part is flushed at the change, the rest goes to the new one.
                before = max(1, count // 3)
                change_ts = self.ts(t, 300)
                stall_us = rng.randint(300_000, 2_500_000)
                self.ack_event(ledger, before, change_ts, stall_us)
                for bookie_id in bad:
                    self.change_ensemble(ledger, bookie_id, change_ts)
                count -= before
                if count == 0:
                    continue
            if drop and dropped < 50:
                # The publisher's buffer is full: the event is dropped, its seq taken.
                self.gateway.seq += 1
                dropped += 1
                dropped_from = dropped_from or self.gateway.seq
                self.advance(ledger, count)
                continue
            if silent:
                self.gateway.seq += 1  # lost on the way, unreported
                silent = False
                self.advance(ledger, count)
                continue
            self.ack_event(ledger, count, flush_ts, 0)
        if dropped:
            self.emit(
                self.gateway,
                "events.dropped",
                self.ts(t, 950),
                {
                    "dropped": dropped,
                    "by_kind": {"entries.acknowledged": dropped},
                    "first_seq": dropped_from,
                    "last_seq": dropped_from + dropped - 1,
                },
            )

    def advance(self, ledger: Ledger, count: int) -> None:
        ledger.next_entry += count
        ledger.length += count * ledger.entry_bytes

    def ack_event(self, ledger: Ledger, count: int, ts: int, stall_us: int) -> None:
        table = self._latency[ledger.base_us]
        rng = self.rng
        samples = min(count, 3)
        share = count // samples
        histogram: dict[int, int] = {}
        for _ in range(samples):
            bucket = table[rng.getrandbits(12)]
            histogram[bucket] = histogram.get(bucket, 0) + share
        first_bucket = next(iter(histogram))
        histogram[first_bucket] += count - share * samples
        if stall_us:
            stalled = max(1, count // 4)
            histogram[first_bucket] -= stalled
            if histogram[first_bucket] == 0:
                del histogram[first_bucket]
            bucket = latency_bucket(stall_us)
            histogram[bucket] = histogram.get(bucket, 0) + stalled
        # The percentiles as shared.latency.percentile reads them (nearest rank), in the
        # same pass as the JSON: this runs for nine events in ten.
        rank50, rank99 = max(1, math.ceil(0.5 * count)), max(1, math.ceil(0.99 * count))
        p50 = p99 = 0
        seen = 0
        parts = []
        for bucket, n in sorted(histogram.items()):
            parts.append(f'"{bucket}":{n}')
            if seen < rank50 <= seen + n:
                p50 = bucket
            if seen < rank99 <= seen + n:
                p99 = bucket
            seen += n
        first = ledger.next_entry
        self.advance(ledger, count)
        gateway = self.gateway
        ts = max(ts, gateway.last_ts)
        gateway.last_ts = ts
        gateway.seq += 1
        self.out.write(
            f'{{"schema_version":1,"event_id":"{self._id()}","kind":"entries.acknowledged",'
            f'"ts_ms":{ts},"source":"gateway","ledger_id":{ledger.ledger_id},"bookie_id":null,'
            f'"data":{{"count":{count},"first_entry_id":{first},'
            f'"last_entry_id":{ledger.next_entry - 1},"bytes":{count * ledger.entry_bytes},'
            f"{ledger.ack_shape}{','.join(parts)}}},"
            f'"latency_ms_p50":{p50 / 1000},"latency_ms_p99":{p99 / 1000},'
            f'"latency_ms_max":{bucket / 1000}}},'
            f'"seq":{gateway.seq},"boot_id":"{gateway.boot_id}"}}\n'
        )

    def change_ensemble(self, ledger: Ledger, bad: str, ts: int) -> None:
        """The writer replaces `bad` in its ensemble: a new segment from its next entry (or
        the last one replaced, if it has no entry yet)."""
        ensemble = ledger.ensemble
        if bad not in ensemble:
            return
        candidates = self.writable(set(ensemble))
        if not candidates:
            return  # nowhere to go: it keeps writing to what it has (it would stall)
        new = self.rng.choice(candidates)
        index = ensemble.index(bad)
        bookies = [new if b == bad else b for b in ensemble]
        first = ledger.next_entry
        if ledger.segments[-1][0] == first:
            ledger.segments[-1] = (first, bookies)
        else:
            ledger.segments.append((first, bookies))
        ledger.ensemble_changed()
        ledger.version += 1
        self.segments_updated(ledger, ts - 2)
        self.emit(
            self.gateway,
            "ledger.ensemble_changed",
            ts,
            {
                "first_entry_id": first,
                "replaced": [{"index": index, "old": bad, "new": new}],
                "version": ledger.version,
            },
            ledger_id=ledger.ledger_id,
        )

    @staticmethod
    def segments_json(ledger: Ledger) -> list[dict[str, Any]]:
        return [{"first_entry_id": f, "bookies": list(b)} for f, b in ledger.segments]

    def segments_updated(self, ledger: Ledger, ts: int) -> None:
        """The metadata store's event of a won compare-and-set that changed the segments."""
        self.outbox(
            "ledger.updated",
            ts,
            {
                "version": ledger.version,
                "state": ledger.state,
                "previous_state": ledger.state,
                "ensemble_changed": True,
                "segments": self.segments_json(ledger),
            },
            ledger_id=ledger.ledger_id,
        )

    def writers_leave(self, bookie_id: str, t: int) -> None:
        """Every writer on the bookie changes ensemble within a few seconds."""
        for ledger in self.active:
            if bookie_id in ledger.ensemble:
                ledger.change_at.setdefault(t + self.rng.randint(0, 3), []).append(bookie_id)

    # -- bookies ----------------------------------------------------------------------------

    def lose_bookie(self, t: int, i: int) -> None:
        candidates = [b for b in self.bookies.values() if b.state == "writable"]
        if len(candidates) < 4:
            return
        bookie = candidates[(i * 7 + 3) % len(candidates)]
        bookie.state = "lost"
        self.writers_leave(bookie.bookie_id, t)
        lease_s = max(2, min(15, self.seconds // 200))
        self.at(t + lease_s, lambda t2: self.auditor_sees_loss(bookie, t2))
        self.at(t + max(lease_s + 5, int(self.seconds * 0.12)), self.new_bookie)

    def auditor_sees_loss(self, bookie: Bookie, t: int) -> None:
        ts = self.ts(t, 500)
        self.emit(
            self.auditor,
            "bookie.lost",
            ts,
            {"before": "writable", "after": "lost"},
            bookie_id=bookie.bookie_id,
        )
        for ledger in self.ledgers.values():
            if ledger.deleted or bookie.bookie_id not in ledger.held_by():
                continue
            ts += 2
            self.emit(
                self.auditor,
                "autorecovery.marked",
                ts,
                {"bookie_ids": [bookie.bookie_id], "reason": "lost_bookie"},
                ledger_id=ledger.ledger_id,
                bookie_id=bookie.bookie_id,
            )
            self.outbox(
                "ledger.underreplicated",
                ts + 1,
                {"missing_bookies": [bookie.bookie_id], "mark_version": 1},
                ledger_id=ledger.ledger_id,
            )
            self.marked.append((ledger.ledger_id, bookie.bookie_id, ts))
        # The replicator works through them in a few per cent of the run.
        per_second = max(1, len(self.marked) // max(1, int(self.seconds * 0.04)))
        self.at(t + 2, lambda t2: self.replicate(t2, per_second))

    def replicate(self, t: int, per_second: int) -> None:
        ts = self.ts(t, 100)
        for _ in range(min(per_second, len(self.marked))):
            ledger_id, lost, marked_at = self.marked.pop(0)
            ledger = self.ledgers[ledger_id]
            ts += 5
            claimed = ts
            worker = f"replicator-4242-{self.rng.randint(1, 2)}"
            common = {"worker_id": worker, "missing_bookies": [lost], "mark_version": 1}
            self.emit(
                self.replicator,
                "autorecovery.claimed",
                ts,
                {**common, "marked_at": marked_at, "since_mark_ms": ts - marked_at},
                ledger_id=ledger_id,
            )
            if not ledger.deleted:
                ts = self.copy_fragments(ledger, lost, worker, ts)
            ts += 5
            self.emit(
                self.replicator,
                "autorecovery.replicated",
                ts,
                {
                    **common,
                    "duration_ms": ts - claimed,
                    "recovered": False,
                    "ledger_deleted": ledger.deleted,
                    "since_mark_ms": ts - marked_at,
                },
                ledger_id=ledger_id,
            )
            if ledger.deleted:
                continue  # its mark went with it
            self.outbox("ledger.replicated", ts + 1, {"mark_version": 1}, ledger_id=ledger_id)
        if self.marked:
            self.at(t + 1, lambda t2: self.replicate(t2, per_second))

    def copy_fragments(self, ledger: Ledger, lost: str, worker: str, ts: int) -> int:
        """Copy every fragment of `lost` (the segments it is in); the time when done."""
        e, w, _ = ledger.shape
        for i, (first, last, bookies) in enumerate(list(ledger.segment_ranges())):
            if lost not in bookies:
                continue
            index = bookies.index(lost)
            candidates = self.writable(set(bookies))
            if not candidates:
                continue
            new = self.rng.choice(candidates)
            ledger.segments[i] = (first, [new if b == lost else b for b in bookies])
            if i == len(ledger.segments) - 1:
                ledger.ensemble_changed()
            ledger.version += 1
            ts += 10
            self.segments_updated(ledger, ts)
            if last < first:
                continue  # an empty segment: nothing to copy
            entries = entries_on(first, last, index, e, w)
            self.emit(
                self.replicator,
                "autorecovery.fragment_replicated",
                ts + 1,
                {
                    "worker_id": worker,
                    "first_entry_id": first,
                    "last_entry_id": last,
                    "ensemble_index": index,
                    "bookie_src": lost,
                    "bookie_dest": new,
                    "entries": entries,
                    "bytes": entries * ledger.entry_bytes,
                    "duration_ms": 10,
                },
                ledger_id=ledger.ledger_id,
            )
        return ts + 1

    def new_bookie(self, t: int) -> None:
        """A new bookie joins (the lost one stays lost: its data is gone with its disks)."""
        bookie_id = f"bookie-{len(self.bookies) + 1}"
        bookie = self.bookies[bookie_id] = Bookie(
            bookie_id,
            Publisher(f"{bookie_id}.journal", self._id()),
            Publisher(f"{bookie_id}.ledgerstore", self._id()),
        )
        self.register(bookie, t, None)
        self.at(t + 1, lambda t2: self.gc(t2, bookie))

    def restart(self, t: int) -> None:
        """A bookie restarts (an upgrade): it unregisters, comes back at once as new
        processes (new boot ids, seq from 1); its lease lapsed, so it was `lost` meanwhile."""
        candidates = [b for b in self.bookies.values() if b.state == "writable"]
        bookie = candidates[0]
        self.outbox("bookie.unregistered", self.ts(t, 100), {}, bookie_id=bookie.bookie_id)
        bookie.journal = Publisher(bookie.journal.source, self._id())
        bookie.ledgerstore = Publisher(bookie.ledgerstore.source, self._id())
        self.register(bookie, t, "lost", offset_ms=150)

    def read_only_spell(self, t: int) -> None:
        candidates = [b for b in self.bookies.values() if b.state == "writable"]
        if len(candidates) < 4:
            return
        bookie = candidates[-1]
        self.disk_state(bookie, t, "readonly", 0.951)
        self.writers_leave(bookie.bookie_id, t)
        self.at(
            t + max(5, int(self.seconds * 0.05)),
            lambda t2: self.disk_state(bookie, t2, "writable", 0.849),
        )

    def disk_state(self, bookie: Bookie, t: int, state: str, usage: float) -> None:
        previous, bookie.state = bookie.state, state
        kind = "bookie.readonly" if state == "readonly" else "bookie.writable"
        self.emit(
            bookie.journal, kind, self.ts(t, 200), {"disk_usage": usage}, bookie_id=bookie.bookie_id
        )
        self.register(bookie, t, previous)
        self.emit(
            self.auditor,
            "bookie.readonly" if state == "readonly" else "bookie.available",
            self.ts(t, 700),
            {"before": previous, "after": state},
            bookie_id=bookie.bookie_id,
        )

    # -- recoveries -------------------------------------------------------------------------

    def writer_goes_away(self, t: int) -> None:
        candidates = [ledger for ledger in self.active if not ledger.change_at]
        if not candidates:
            return
        ledger = candidates[0]
        ledger.writing = False
        self.active.remove(ledger)
        self.at(t + self.rng.randint(2, 20), lambda t2: self.recover(ledger, t2))

    def recover(self, ledger: Ledger, t: int) -> None:
        started = self.ts(t, self.rng.randint(0, 200))
        ledger.version += 1
        self.outbox(
            "ledger.updated",
            started + 2,
            {
                "version": ledger.version,
                "state": "IN_RECOVERY",
                "previous_state": "OPEN",
                "ensemble_changed": False,
            },
            ledger_id=ledger.ledger_id,
        )
        ledger.state = "IN_RECOVERY"
        lac = ledger.next_entry - 1
        recovered = self.rng.randint(0, 2)  # on the bookies, never acknowledged
        ts = started + 5
        for bookie_id in ledger.ensemble:
            bookie = self.bookies[bookie_id]
            if bookie.state == "lost":
                continue
            ts += 1
            self.emit(
                bookie.journal,
                "ledger.fenced",
                ts,
                {"lac": lac, "last_entry_id": lac + recovered},
                ledger_id=ledger.ledger_id,
                bookie_id=bookie_id,
            )
        self.advance(ledger, recovered)
        duration = self.rng.randint(20, 400)
        self.close(ledger, t, started + duration - 1, "IN_RECOVERY")
        self.emit(
            self.recovering_gateway,
            "ledger.recovered",
            started + duration,
            {
                "last_entry_id": ledger.next_entry - 1,
                "recovered_entries": recovered,
                "started_ts_ms": started,
                "duration_ms": duration,
            },
            ledger_id=ledger.ledger_id,
        )

    # -- garbage collection -----------------------------------------------------------------

    def gc(self, t: int, bookie: Bookie) -> None:
        interval = max(30, self.seconds // 12)
        self.at(t + interval, lambda t2: self.gc(t2, bookie))
        if bookie.state == "lost":
            return
        ts = self.ts(t, 400)
        for ledger in self.ledgers.values():
            if not ledger.deleted or ledger.ledger_id in bookie.gc_deleted:
                continue
            if bookie.bookie_id not in ledger.held_by():
                continue
            bookie.gc_deleted.add(ledger.ledger_id)
            ts += 1
            self.emit(
                bookie.ledgerstore,
                "gc.ledger_deleted",
                ts,
                {},
                ledger_id=ledger.ledger_id,
                bookie_id=bookie.bookie_id,
            )
            bookie.unreclaimed[ledger.ledger_id] = self.bytes_on(ledger, bookie.bookie_id)
        # Entry logs holding only deleted ledgers go, others are compacted; a ledger's
        # bytes may be in two logs (half now, half at a later run), some wait for later.
        reclaim: dict[int, int] = {}
        for ledger_id, size in sorted(bookie.unreclaimed.items()):
            roll = self.rng.random()
            if roll < 0.2:
                continue
            part = size if roll < 0.85 or size < 2 else size // 2
            reclaim[ledger_id] = part
            if part == size:
                del bookie.unreclaimed[ledger_id]
            else:
                bookie.unreclaimed[ledger_id] = size - part
        ids = list(reclaim)
        for start in range(0, len(ids), 40):
            group = {i: reclaim[i] for i in ids[start : start + 40]}
            listed = {str(i): b for i, b in sorted(group.items(), key=lambda x: (-x[1], x[0]))}
            total = sum(group.values())
            log_id = bookie.next_log
            bookie.next_log += 1
            ts += 3
            if self.rng.random() < 0.5:
                self.emit(
                    bookie.ledgerstore,
                    "gc.entrylog_deleted",
                    ts,
                    {
                        "dir": 0,
                        "log_id": log_id,
                        "bytes": total,
                        "reason": "no_live_ledger",
                        "ledgers": listed,
                        "ledgers_truncated": False,
                    },
                    bookie_id=bookie.bookie_id,
                )
                continue
            copied = self.rng.randint(1, 4) * total // 4 + 1
            self.emit(
                bookie.ledgerstore,
                "gc.compacted",
                ts,
                {
                    "dir": 0,
                    "log_id": log_id,
                    "new_log_id": log_id + 100_000,
                    "kind": self.rng.choice(["minor", "major"]),
                    "usage": round(copied / (copied + total), 4),
                    "entries": max(1, copied // 1000),
                    "bytes_copied": copied,
                    "bytes_reclaimed": total,
                    "duration_ms": self.rng.randint(5, 500),
                    "ledgers": listed,
                    "ledgers_truncated": False,
                },
                bookie_id=bookie.bookie_id,
            )
            self.emit(
                bookie.ledgerstore,
                "gc.entrylog_deleted",
                ts + 1,
                {
                    "dir": 0,
                    "log_id": log_id,
                    "bytes": copied + total,
                    "reason": "compacted",
                    "ledgers": {},
                    "ledgers_truncated": False,
                },
                bookie_id=bookie.bookie_id,
            )
        self.emit(
            bookie.journal,
            "journal.checkpoint",
            ts + 5,
            {"mark": {"file": t // 60 + 1, "offset": 4096}, "deleted_files": 1},
            bookie_id=bookie.bookie_id,
        )

    @staticmethod
    def bytes_on(ledger: Ledger, bookie_id: str) -> int:
        """What the ledger's entries take on the bookie (heads included)."""
        e, w, _ = ledger.shape
        total = 0
        for first, last, bookies in ledger.segment_ranges():
            if bookie_id in bookies and last >= first:
                entries = entries_on(first, last, bookies.index(bookie_id), e, w)
                total += entries * (ledger.entry_bytes + ENTRY_HEAD_BYTES)
        return total


def generate(
    events: int,
    output: Path,
    *,
    seed: int = 1,
    bookies: int = 6,
    ledgers: int = 200,
    start_ms: int | None = None,
    files: int = 8,
) -> int:
    """Write about `events` events (a second's events may take it a little over) to
    `output`; how many were written."""
    out = Output(output, files, events)
    story = Story(out, seed, bookies, ledgers, start_ms or parse_start(DEFAULT_START))
    try:
        story.run()
    finally:
        out.close()
    return out.count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analytics.synth",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, required=True, help="how many events, about")
    parser.add_argument("--output", type=Path, required=True, help="the directory to write")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bookies", type=int, default=6)
    parser.add_argument("--ledgers", type=int, default=200, help="ledgers written at once")
    parser.add_argument("--start", default=DEFAULT_START, help="the story's start (ISO 8601)")
    parser.add_argument("--files", type=int, default=8)
    args = parser.parse_args(argv)
    if args.bookies < 5:
        parser.error("--bookies: at least 5 (a loss and a read-only spell leave 3 writable)")
    written = generate(
        args.events,
        args.output,
        seed=args.seed,
        bookies=args.bookies,
        ledgers=args.ledgers,
        start_ms=parse_start(args.start),
        files=args.files,
    )
    print(f"{written} events in {args.files} files under {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
