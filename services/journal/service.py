"""The journal service: one bookie's write-ahead log on NATS.

Endpoints on `<prefix>.bookie.<bookie_id>.<op>`:
    add                 batch of entry frames -> per-entry status, answered after fsync
    fence               journal the fenced flag, then answer with the bookie's LAC
    write_lac           journal the explicit LACs of one or more ledgers
    journal.checkpoint  (from the ledgerstore) JSON {"file", "offset"}: move the LastLogMark
    journal.delete      (from the ledgerstore's garbage collector) JSON {"ledgers": [id, ...]}:
                        journal a DELETED record for each, forget them, answer once fsynced
                        with the position after them
After group commits it publishes `journal.committed` ({"file", "offset"}, core NATS), at
most once per `ledgerstore.journal_apply_interval_ms`, so that the ledgerstore applies them
together; co-hosted with the ledgerstore (`services.bookie`) it hands it each durable group
commit in process instead (`hand_over`). It also keeps the bookie registered in metadata.
Its counters are Prometheus metrics (`services.journal.metrics`; docs/metrics.md), on
`metrics_port`.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from nats.aio.subscription import DEFAULT_SUB_PENDING_BYTES_LIMIT, DEFAULT_SUB_PENDING_MSGS_LIMIT
from nats.micro.request import ERROR_CODE_HEADER, ERROR_HEADER, Request
from opentelemetry.trace import Span, StatusCode, get_current_span, use_span

from services.journal.core import high_priority_writes_allowed
from services.journal.journal import Journal, JournalStats
from services.journal.metrics import count_add_request, journal_metrics
from shared import clock, wire
from shared.aio import wait_event
from shared.bookie.cookie import (
    NO_INSTANCE,
    Cookie,
    CookieMismatch,
    check_journal_copy,
    keeps_cookie_copy,
    read_disk_cookie,
    reconcile,
    reconcile_offline,
    write_disk_cookie,
)
from shared.bookie.fault_files import files_for
from shared.bookie.gc import BadRequest, parse_journal_delete
from shared.bookie.handoff import DurableBatch
from shared.bookie.journal_dir import (
    decode_journal_position,
    encode_journal_position,
    journal_position_json,
)
from shared.bookie.journal_format import (
    FenceRecord,
    JournalFormatError,
    JournalPosition,
    LacRecord,
    LedgerDeletedRecord,
    Record,
)
from shared.bookie.rules import (
    admit_add_items,
    disk_read_only,
    frame_ledger_id,
    meta_records,
    refuse_add_items,
)
from shared.disk import fail_stop
from shared.metaclient import MetadataClient, MetadataError
from shared.metrics import serve_metrics
from shared.models import LOCATION, NO_VERSION, REGISTERED_AT, BookieState, MetaErrorCode
from shared.natsfast import reply_soon
from shared.service import ServiceRuntime
from shared.status import BookieStatus
from shared.subjects import JOURNAL_CHECKPOINT, JOURNAL_COMMITTED, JOURNAL_DELETE
from shared.telemetry import recording, start_nats_server_span

log = logging.getLogger(__name__)

UNREGISTER_TIMEOUT_S = 1.0


DiskUsage = Callable[[Path], tuple[int, int]]  # a directory -> (used, total) bytes


def _traced_request() -> Span | None:
    """The request's SERVER span when it is traced (the endpoint opened it from a sampled
    `traceparent`): its records' group commit links to it (`Journal.submit`)."""
    return get_current_span() if recording() else None


def os_disk_usage(path: Path) -> tuple[int, int]:
    usage = shutil.disk_usage(path)
    return usage.total - usage.free, usage.total


class JournalService:
    def __init__(self, rt: ServiceRuntime, disk_usage: DiskUsage = os_disk_usage) -> None:
        self.rt = rt
        self.bookie_id = rt.settings.bookie_id
        # The disks of this bookie: every journal directory and every ledger directory.
        self.journal_dirs = rt.settings.journal_dirs
        self.disk_dirs = [*self.journal_dirs, *rt.settings.ledger_dirs]
        # The journal directories on disks of their own keep a copy of the cookie.
        self.journal_copies = [
            d for d in self.journal_dirs if keeps_cookie_copy(rt.settings.bookie_dir, d)
        ]
        self.disk_usage = disk_usage
        self.read_only = False
        self.disk_usage_fraction = 0.0
        self.disk_free_bytes = 0  # the least free space of its disks, at the last check
        self._state_changed = asyncio.Event()
        self.identity_checked = False
        # The disk was found wiped (the cookie says `limbo`): registered so that the auditor
        # has the bookie's ledgers re-replicated, then clears it (`handle_clear_limbo`).
        self.limbo = False
        self.committed_subject = rt.subjects.bookie(self.bookie_id, JOURNAL_COMMITTED)
        self._announce_positions: dict[int, JournalPosition] = {}
        self._announce_timer: asyncio.TimerHandle | None = None
        self._announcing: set[asyncio.Future[None]] = set()  # fire-and-forget publishes
        # One journal per directory (BookKeeper's journalDirectories): its own writer
        # thread, group commit and fsync; the ledgers are spread over them by id
        # (`journal_for`), so a ledger's records stay in one journal, in order.
        stats = JournalStats()
        files = files_for(rt.settings.faults_dir)  # one files.log, one fault side channel
        self.journals = [
            Journal(
                directory,
                rt.settings.journal,
                on_commit=functools.partial(self._on_commit, index),
                files=files,
                bookie_id=self.bookie_id,
                stats=stats,
            )
            for index, directory in enumerate(self.journal_dirs)
        ]
        self.stats = stats
        for index, journal in enumerate(self.journals):
            journal.index = index
        # False when co-hosted with the ledgerstore, which is handed the commits in
        # process (`hand_over`) and needs no `journal.committed` notification.
        self.announce = True

        self._add_subject = rt.subjects.bookie(self.bookie_id, "add")
        self.adds_waiting = 0  # add requests waiting for their group commit
        self._max_adds_waiting = rt.settings.journal.max_adds_in_progress_limit
        # Add requests beyond that bound, in arrival order (`_queue_add`).
        self._add_queue: collections.deque[tuple[bytes, bytes, dict[str, str] | None]] = (
            collections.deque()
        )
        self.add_queue_bytes = 0
        self.adds_dropped = 0  # beyond the queue's bound (the senders time out)
        self._add_queue_drained: asyncio.Future[None] | None = None
        self._serve_queued_add = rt.guard_lean("add", self._handle_add)

    @property
    def adds_queued(self) -> int:
        """Add requests waiting for a slot (`_queue_add`)."""
        return len(self._add_queue)

    def hand_over(self, on_durable: Callable[[DurableBatch], None]) -> None:
        """Co-hosted (`services.bookie`): hand every durable group commit to
        `on_durable` (the ledgerstore's), in commit order, instead of announcing it."""
        for journal in self.journals:
            journal.on_durable = on_durable
        self.announce = False

    def journal_for(self, ledger_id: int) -> Journal:
        """The journal of a ledger: by ledger id modulo their count, as BookKeeper picks
        a ledger's journal (and as the ledger directories are picked)."""
        return self.journals[ledger_id % len(self.journals)]

    def _on_commit(self, index: int, position: JournalPosition) -> None:
        """Tell the ledgerstore what is durable, at most once per
        ledgerstore.journal_apply_interval_ms: one notification (and one catch-up of the
        ledgerstore) for all the group commits of that interval, not one per commit, and
        never ahead of the answers to the adds just committed (a message costs tens of
        microseconds of CPU in each process it passes)."""
        if not self.announce:
            return
        self._announce_positions[index] = position
        if self._announce_timer is None:
            interval_s = self.rt.settings.ledgerstore.journal_apply_interval_ms / 1000
            loop = asyncio.get_running_loop()
            self._announce_timer = loop.call_later(interval_s, self._announce_now)

    def _announce_now(self) -> None:
        self._announce_timer = None
        positions, self._announce_positions = self._announce_positions, {}
        task = asyncio.create_task(self._announce(positions))
        self._announcing.add(task)
        task.add_done_callback(self._announcing.discard)

    async def _announce(self, positions: dict[int, JournalPosition]) -> None:
        # Fire and forget: the ledgerstore also polls, a lost notification only delays it.
        try:
            for index, position in positions.items():
                await self.rt.nc.publish(
                    self.committed_subject, encode_journal_position(index, position)
                )
        except Exception as exc:
            log.debug("committed notification not sent", extra={"err": repr(exc)})

    def _by_journal(self, ledger_ids: list[int]) -> dict[int, list[int]]:
        """The indexes of `ledger_ids` by the index of their journal (`journal_for`)."""
        count = len(self.journals)
        if count == 1:
            return {0: list(range(len(ledger_ids)))}
        groups: dict[int, list[int]] = {}
        for i, ledger_id in enumerate(ledger_ids):
            groups.setdefault(ledger_id % count, []).append(i)
        return groups

    def _submit(self, records: list[Record]) -> dict[int, asyncio.Future] | None:
        """Queue admitted records, each in its ledger's journal, and apply them to its
        live state; None if a journal's queue is full (nothing queued then). The futures
        by journal index: all of them are durable."""
        groups = self._by_journal([record.ledger_id for record in records])
        parts = {index: [records[i] for i in at] for index, at in groups.items()}
        if not all(self.journals[index].room_for(len(part)) for index, part in parts.items()):
            return None
        futures = {}
        span = _traced_request()
        for index, part in parts.items():
            journal = self.journals[index]
            # room_for checked every part: this cannot be refused.
            futures[index] = journal.submit(part, time.monotonic() * 1000, span)
            for record in part:
                journal.live.apply(record)
        return futures

    # -- add ------------------------------------------------------------------------------

    def handle_add(self, reply: bytes, data: bytes, headers: dict[str, str] | None) -> None:
        """An add request, where the connection's read loop parses it
        (`add_lean_endpoint`), in arrival order: decoded, admitted and queued at once;
        answered from its group commit's completion (`_answer_add`), with no task or
        coroutine per request. At most journal.max_adds_in_progress_limit wait for their
        commit: beyond, requests wait in arrival order in `_add_queue` (bounded as nats-py
        bounds a subscription's pending messages; beyond that they are dropped as nats-py
        drops a slow consumer's) and are admitted as answers free their slots."""
        if self._add_queue or self.adds_waiting >= self._max_adds_waiting:
            self._queue_add(reply, data, headers)
            return
        self._handle_add(reply, data, headers)

    def _handle_add(self, reply: bytes, data: bytes, headers: dict[str, str] | None) -> None:
        arrived = time.perf_counter()
        span = start_nats_server_span(self._add_subject, headers)
        try:
            if span is None:
                status, rows, durable = self._admit_request(data)
            else:
                with use_span(span, end_on_exit=False):
                    status, rows, durable = self._admit_request(data)
        except BaseException as exc:
            if span is not None:
                span.record_exception(exc)
                span.set_status(StatusCode.ERROR)
                span.end()
            raise
        if durable is None:
            self._answer_add(reply, status, rows, arrived, span, None)
            return
        self.adds_waiting += 1
        self.rt.hold(durable)
        durable.add_done_callback(
            functools.partial(self._answer_add, reply, status, rows, arrived, span)
        )

    def _queue_add(self, reply: bytes, data: bytes, headers: dict[str, str] | None) -> None:
        if (
            len(self._add_queue) >= DEFAULT_SUB_PENDING_MSGS_LIMIT
            or self.add_queue_bytes + len(data) > DEFAULT_SUB_PENDING_BYTES_LIMIT
        ):
            self.adds_dropped += 1
            log.warning(
                "add request dropped: too many queued",
                extra={"queued": len(self._add_queue), "queued_bytes": self.add_queue_bytes},
            )
            return
        if not self._add_queue:
            self._add_queue_drained = asyncio.get_running_loop().create_future()
            self.rt.hold(self._add_queue_drained)  # the drain at shutdown waits for them
        self._add_queue.append((reply, data, headers))
        self.add_queue_bytes += len(data)

    def _admit_queued(self) -> None:
        """Admit the queued requests while slots are free (in arrival order)."""
        queue = self._add_queue
        while queue and self.adds_waiting < self._max_adds_waiting:
            reply, data, headers = queue.popleft()
            self.add_queue_bytes -= len(data)
            self._serve_queued_add(reply, data, headers)
        if not queue and self._add_queue_drained is not None:
            self._add_queue_drained.set_result(None)
            self._add_queue_drained = None

    def _answer_add(
        self,
        reply: bytes,
        status: BookieStatus,
        rows: list[wire.AddResultRow],
        arrived: float,
        span: Span | None,
        durable: asyncio.Future | None,
    ) -> None:
        if durable is not None:
            self.adds_waiting -= 1
            error = durable.exception() if not durable.cancelled() else asyncio.CancelledError()
            if error is not None:  # a failed commit: the journal is exiting (fail-stop)
                log.error("add not committed", extra={"err": repr(error)})
                if span is not None:
                    span.record_exception(error)
                    span.set_status(StatusCode.ERROR)
                    span.end()
                # Answered as a handler that raised is: with a micro error.
                if reply:
                    self.rt.spawn_reply(
                        self.rt.nc.publish(
                            reply.decode(),
                            b"",
                            headers={ERROR_HEADER: "internal error", ERROR_CODE_HEADER: "500"},
                        )
                    )
                self._admit_queued()
                return
        if reply:
            reply_soon(self.rt.nc, reply, wire.encode_add_reply_rows(status, rows))
        ok = sum(1 for row in rows if row[2] is BookieStatus.OK)
        count_add_request(self.stats, ok, len(rows), (time.perf_counter() - arrived) * 1000)
        if span is not None:
            span.end()
        if durable is not None and self._add_queue:  # a slot is free (never re-entered:
            self._admit_queued()  # an answer without a commit frees none)

    def _admit_request(
        self, data: bytes
    ) -> tuple[BookieStatus, list[wire.AddResultRow], asyncio.Future | None]:
        try:
            items = wire.decode_add_items(data)
        except wire.WireError as exc:
            log.warning("bad add request", extra={"err": str(exc)})
            return BookieStatus.BAD_REQUEST, [], None
        if self.read_only:
            rows, durable = self._admit_read_only(items)
        else:
            rows, durable = self._admit_adds(items)
        return BookieStatus.OK, rows, durable

    def _admit_adds(
        self, items: list[wire.RawAddItem]
    ) -> tuple[list[wire.AddResultRow], asyncio.Future | None]:
        """Admit the batch by the ledger rules (`admit_add_items`) and queue what they
        admit, each item in its ledger's journal, all in one synchronous step (so the
        checks see the adds that arrived before). The future (None if nothing was queued):
        every queued item is durable. A journal whose queue is full refuses its items
        whole."""
        if len(self.journals) == 1:
            return self._admit_to(self.journals[0], items)
        groups = self._by_journal([frame_ledger_id(frame) for _, _, frame in items])
        rows: dict[int, wire.AddResultRow] = {}
        durable = []
        for index, at in groups.items():
            part_rows, part_durable = self._admit_to(self.journals[index], [items[i] for i in at])
            for i, row in zip(at, part_rows, strict=True):
                rows[i] = row
            if part_durable is not None:
                durable.append(part_durable)
        answers = [rows[i] for i in range(len(items))]
        if not durable:
            return answers, None
        return answers, durable[0] if len(durable) == 1 else asyncio.gather(*durable)

    def _admit_to(
        self, journal: Journal, items: list[wire.RawAddItem]
    ) -> tuple[list[wire.AddResultRow], asyncio.Future | None]:
        if not journal.room_for(len(items)):
            return self._refuse(items, BookieStatus.TOO_MANY_REQUESTS), None
        rows, records = admit_add_items(journal.live, items)
        if len(records) < len(rows):
            for row in rows:
                if row[2] is not BookieStatus.OK:
                    self.stats.rejected(row[2].name)
        if not records:
            return rows, None
        # room_for checked the whole batch: this cannot be refused.
        durable = journal.submit(records, time.monotonic() * 1000, _traced_request())
        return rows, durable

    def _admit_read_only(
        self, items: list[wire.RawAddItem]
    ) -> tuple[list[wire.AddResultRow], asyncio.Future | None]:
        """diskUsageThreshold passed: normal adds are refused READ_ONLY; recovery adds (the
        replicator's and a recovery's: BookKeeper's high-priority writes) are admitted while
        the fullest disk keeps min_usable_size_for_high_priority_writes_bytes free."""
        allowed = high_priority_writes_allowed(
            self.disk_free_bytes,
            self.rt.settings.ledgerstore.min_usable_size_for_high_priority_writes_bytes,
        )
        recovery = [allowed and bool(item[0] & wire.FLAG_RECOVERY_ADD) for item in items]
        if not any(recovery):
            return self._refuse(items, BookieStatus.READ_ONLY), None
        admitted, durable = self._admit_adds([i for i, r in zip(items, recovery, strict=True) if r])
        refused = iter(
            self._refuse(
                [i for i, r in zip(items, recovery, strict=True) if not r], BookieStatus.READ_ONLY
            )
        )
        taken = iter(admitted)
        return [next(taken) if r else next(refused) for r in recovery], durable

    def _refuse(
        self, items: list[wire.RawAddItem], status: BookieStatus
    ) -> list[wire.AddResultRow]:
        for _ in items:
            self.stats.rejected(status.name)
        return refuse_add_items(items, status)

    # -- disk usage -----------------------------------------------------------------------

    def measure_disks(self) -> tuple[float, int]:
        """The fullest of this bookie's disks, as a used fraction, and the least free space
        of them in bytes (blocking)."""
        fractions, free = [], []
        for directory in self.disk_dirs:
            directory.mkdir(parents=True, exist_ok=True)
            used, total = self.disk_usage(directory)
            fractions.append(used / total if total else 1.0)
            free.append(max(0, total - used))
        return max(fractions), min(free)

    def apply_disk_usage(self, fraction: float, free_bytes: int) -> bool:
        """Turn read-only or writable as the thresholds say; True if the state changed."""
        settings = self.rt.settings.ledgerstore
        self.disk_usage_fraction = fraction
        self.disk_free_bytes = free_bytes
        read_only = disk_read_only(
            self.read_only,
            fraction,
            settings.disk_usage_threshold,
            settings.disk_usage_lwm_threshold,
        )
        if read_only == self.read_only:
            return False
        self.read_only = read_only
        kind = "bookie.readonly" if read_only else "bookie.writable"
        log.warning(kind, extra={"disk_usage": round(fraction, 4)})
        self.rt.events.emit(kind, bookie_id=self.bookie_id, disk_usage=fraction)
        self._state_changed.set()
        return True

    async def check_disks(self) -> None:
        try:
            self.apply_disk_usage(*await asyncio.to_thread(self.measure_disks))
        except OSError as exc:
            log.error("disk check failed", extra={"err": repr(exc)})

    async def watch_disks(self) -> None:
        interval_s = self.rt.settings.ledgerstore.disk_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            await self.check_disks()

    # -- fence and explicit LAC -----------------------------------------------------------

    async def handle_fence(self, request: Request) -> None:
        try:
            ledger_id, master_key = wire.decode_fence_request(request.data)
        except wire.WireError as exc:
            log.warning("bad fence request", extra={"err": str(exc)})
            await request.respond(wire.encode_lac_reply(wire.LacReply(BookieStatus.BAD_REQUEST)))
            return
        journal = self.journal_for(ledger_id)
        facts = journal.durable.get(ledger_id)
        was_fenced = facts is not None and facts.fenced
        status = await self._journal_meta(ledger_id, master_key, FenceRecord(ledger_id))
        if status is not BookieStatus.OK:
            await request.respond(wire.encode_lac_reply(wire.LacReply(status)))
            return
        facts = journal.durable.get(ledger_id)
        assert facts is not None and facts.fenced
        await request.respond(
            wire.encode_lac_reply(wire.LacReply(BookieStatus.OK, facts.lac, facts.last_entry_id))
        )
        if not was_fenced:
            log.info("ledger fenced", extra={"ledger_id": ledger_id})
            self.rt.events.emit(
                "ledger.fenced",
                ledger_id=ledger_id,
                bookie_id=self.bookie_id,
                lac=facts.lac,
                last_entry_id=facts.last_entry_id,
            )

    async def handle_write_lac(self, request: Request) -> None:
        """Explicit LACs of one or more ledgers (a client merges those of its ledgers for
        this bookie into one request): each item checked, the good ones journalled
        together, one status per item once they are durable."""
        try:
            items = wire.decode_write_lac_request(request.data)
        except wire.WireError as exc:
            log.warning("bad write_lac request", extra={"err": str(exc)})
            await request.respond(wire.encode_write_lac_reply([BookieStatus.BAD_REQUEST]))
            return
        # At most two records an item (the ledger's key first, if it has none).
        groups = self._by_journal([ledger_id for ledger_id, _, _ in items])
        if not all(self.journals[i].room_for(2 * len(at)) for i, at in groups.items()):
            statuses = [BookieStatus.TOO_MANY_REQUESTS] * len(items)
            await request.respond(wire.encode_write_lac_reply(statuses))
            return
        statuses, records = [], []
        for ledger_id, master_key, lac in items:
            if lac < -1:
                statuses.append(BookieStatus.BAD_REQUEST)
                continue
            live = self.journal_for(ledger_id).live
            status, facts = meta_records(live, ledger_id, master_key, LacRecord(ledger_id, lac))
            for record in facts:  # applied at once: the next item of the ledger sees its key
                live.apply(record)
            records.extend(facts)
            statuses.append(status)
        if records:
            now_ms = time.monotonic() * 1000
            parts = self._by_journal([record.ledger_id for record in records])
            # room_for checked the whole request: none of these can be refused.
            await asyncio.gather(
                *(
                    self.journals[i].submit([records[r] for r in at], now_ms)
                    for i, at in parts.items()
                )
            )
        await request.respond(wire.encode_write_lac_reply(statuses))

    async def _journal_meta(
        self, ledger_id: int, master_key: bytes, record: FenceRecord | LacRecord
    ) -> BookieStatus:
        """Journal a ledger fact (`meta_records`: with the ledger's key first if it has
        none) and wait until it is durable."""
        status, records = meta_records(
            self.journal_for(ledger_id).live, ledger_id, master_key, record
        )
        if status is not BookieStatus.OK:
            return status
        durable = self._submit(records)
        if durable is None:
            return BookieStatus.TOO_MANY_REQUESTS
        await asyncio.gather(*durable.values())
        return BookieStatus.OK

    # -- checkpoint and stats -------------------------------------------------------------

    async def handle_checkpoint(self, request: Request) -> None:
        """The ledgerstore made one journal's records durable up to a position
        (`journal_position_json`): that journal's LastLogMark moves there."""
        try:
            index, requested = decode_journal_position(request.data, len(self.journals))
        except JournalFormatError as exc:
            await request.respond(json.dumps({"ok": False, "error": str(exc)}).encode())
            return
        journal = self.journals[index]
        mark, deleted = await journal.checkpoint(requested)
        await request.respond(
            json.dumps(
                {"ok": True, "journal": index, "mark": mark.to_json(), "deleted": deleted}
            ).encode()
        )
        if deleted:
            where = {"journal_dir": str(journal.directory)}
            log.info(
                "journal checkpoint",
                extra={"mark": mark.to_json(), "deleted": deleted, **where},
            )
            self.rt.events.emit(
                "journal.checkpoint",
                bookie_id=self.bookie_id,
                mark=mark.to_json(),
                deleted_files=deleted,
                **where,
            )

    async def handle_delete(self, request: Request) -> None:
        """The garbage collector found these ledgers gone from metadata: journal one
        DELETED record each (a read-only bookie too: deleting frees its space), forget them
        in the live state (a later add or fence starts the ledger afresh) and answer once
        the records are fsynced, with the position after them; the ledgerstore applies them
        in journal order like any other record."""
        try:
            ledger_ids = parse_journal_delete(request.data)
        except BadRequest as exc:
            reply = {"ok": False, "error": BookieStatus.BAD_REQUEST.name, "message": str(exc)}
            await request.respond(json.dumps(reply).encode())
            return
        durable = self._submit([LedgerDeletedRecord(ledger_id) for ledger_id in ledger_ids])
        if durable is None:
            reply = {
                "ok": False,
                "error": BookieStatus.TOO_MANY_REQUESTS.name,
                "message": "the journal queue is full",
            }
            await request.respond(json.dumps(reply).encode())
            return
        positions = [
            journal_position_json(index, await future) for index, future in durable.items()
        ]
        log.info("ledgers deleted", extra={"ledgers": len(ledger_ids), "at": positions})
        await request.respond(json.dumps({"ok": True, "positions": positions}).encode())

    def bookie_info(self) -> dict:
        """What the bookie says of itself (blocking: it lists and sizes files)."""
        settings = self.rt.settings
        disks = []
        for directory in self.disk_dirs:
            usage = shutil.disk_usage(directory)
            disks.append(
                {
                    "dir": str(directory),
                    "free_bytes": usage.free,
                    "total_bytes": usage.total,
                    "used_fraction": round(self.disk_usage(directory)[0] / usage.total, 4),
                }
            )
        files = []
        for directory in self.disk_dirs:
            for path in sorted(directory.iterdir()) if directory.exists() else []:
                if path.is_file():
                    files.append({"path": str(path), "size_bytes": path.stat().st_size})
        journals = [
            {
                "dir": str(journal.directory),
                "last_log_mark": journal.mark.to_json() if journal.mark else None,
                "durable": journal.durable_position.to_json(),
                "ledgers": len(journal.durable),
            }
            for journal in self.journals
        ]
        return {
            "bookie_id": self.bookie_id,
            "state": "readonly" if self.read_only else "writable",
            "free_bytes": min(d["free_bytes"] for d in disks),
            "total_bytes": min(d["total_bytes"] for d in disks),
            "disk_usage": self.disk_usage_fraction,
            "disk_usage_threshold": settings.ledgerstore.disk_usage_threshold,
            "disk_usage_lwm_threshold": settings.ledgerstore.disk_usage_lwm_threshold,
            # The first journal's, as before there were several; all in "journals".
            "last_log_mark": journals[0]["last_log_mark"],
            "journal_durable": journals[0]["durable"],
            "ledgers": sum(j["ledgers"] for j in journals),
            "journal_dir": journals[0]["dir"],
            "journals": journals,
            "ledger_dirs": [str(d) for d in settings.ledger_dirs],
            "disks": disks,
            "files": files,
        }

    async def handle_info(self, request: Request) -> None:
        info = await asyncio.to_thread(self.bookie_info)
        await request.respond(json.dumps(info).encode())

    # -- identity -------------------------------------------------------------------------

    def expected_cookie(self, instance_id: str = NO_INSTANCE) -> Cookie:
        settings = self.rt.settings
        return Cookie(
            bookie_id=self.bookie_id,
            journal_dir=str(self.journal_dirs[0].resolve()),
            more_journal_dirs=[str(d.resolve()) for d in self.journal_dirs[1:]],
            ledger_dirs=[str(d.resolve()) for d in settings.ledger_dirs],
            instance_id=instance_id,
        )

    def _has_data(self) -> bool:
        return any(d.exists() and any(d.iterdir()) for d in self.disk_dirs)

    def _write_cookie(self, cookie: Cookie) -> None:
        write_disk_cookie(
            self.rt.settings.bookie_dir, cookie, self.journals[0].files, self.journal_copies
        )

    async def establish_identity(self, client: MetadataClient) -> bool:
        """Check the cookie on disk against this bookie and against metadata; write what is
        missing. CookieMismatch if the disk is not this bookie's. False if metadata could
        not be asked (then only the disk was checked; `keep_registered` asks later)."""
        bookie_dir = self.rt.settings.bookie_dir
        disk = read_disk_cookie(bookie_dir)
        for directory in self.journal_copies:
            check_journal_copy(self.expected_cookie(), disk, directory)
        try:
            instance_id = await client.instance_id()
            stored = await client.get_cookie(self.bookie_id)
        except MetadataError as exc:
            if exc.code is not MetaErrorCode.UNAVAILABLE:
                raise
            log.warning("metadata unavailable: cookie checked against the disk only")
            cookie = reconcile_offline(self.expected_cookie(), disk, self._has_data())
            if cookie != disk:
                self._write_cookie(cookie)
            self.limbo = cookie.limbo
            return False
        meta = Cookie.decode(stored.data) if stored.data else None
        cookie, publish = reconcile(self.expected_cookie(instance_id), disk, meta, self._has_data())
        if cookie != disk:
            self._write_cookie(cookie)
        self.limbo = cookie.limbo
        if publish:
            await client.put_cookie(
                self.bookie_id, replace(cookie, limbo=False).encode(), NO_VERSION
            )
            log.info("bookie cookie registered", extra={"instance_id": cookie.instance_id})
        return True

    # -- registration ---------------------------------------------------------------------

    async def keep_registered(self) -> None:
        """Renew the bookie's lease forever; metadata being down is logged, never fatal."""
        settings = self.rt.settings
        client = MetadataClient(
            self.rt.nc, self.rt.subjects, timeout_s=settings.request_timeout_ms / 1000
        )
        # Called once the endpoints are subscribed (main), so registered_at never precedes
        # them; clients give a bookie registered that recently a moment before they take its
        # "no responders" for its death.
        info = {
            "journal_pid": os.getpid(),
            "bookie_dir": str(settings.bookie_dir.resolve()),
            REGISTERED_AT: clock.wall_ms(),
            LOCATION: settings.bookie_location,
        }
        registered = False
        while True:
            if not self.identity_checked:
                try:
                    self.identity_checked = await self.establish_identity(client)
                except CookieMismatch as exc:
                    fail_stop("journal", str(exc))
                except Exception as exc:
                    log.warning("cookie check failed, will retry", extra={"err": str(exc)})
            self._state_changed.clear()
            state = BookieState.READONLY if self.read_only else BookieState.WRITABLE
            try:
                await client.register_bookie(
                    self.bookie_id, state=state, info={**info, "limbo": self.limbo}
                )
                if not registered:
                    log.info("bookie registered", extra={"state": state.value})
                    registered = True
            except (MetadataError, Exception) as exc:  # noqa: B014 (both logged alike)
                log.warning("bookie registration failed, will retry", extra={"err": str(exc)})
                registered = False
            # A state change (read-only or back) is registered at once, not at the next beat.
            await wait_event(self._state_changed, settings.metadata.bookie_heartbeat_ms / 1000)

    async def handle_clear_limbo(self, request: Request) -> None:
        """The auditor found no ledger that still needs what the wiped disk lost: rewrite
        the cookie without `limbo` (the ledgerstore follows it and answers NO_ENTRY again
        where it has the authority to)."""
        bookie_dir = self.rt.settings.bookie_dir
        cookie = read_disk_cookie(bookie_dir)
        if cookie is not None and cookie.limbo:
            self._write_cookie(replace(cookie, limbo=False))
            log.warning("bookie limbo cleared: its lost ledgers were re-replicated")
        self.limbo = False
        self._state_changed.set()  # registered at once, not at the next beat
        await request.respond(json.dumps({"ok": True, "limbo": False}).encode())

    async def unregister(self) -> None:
        client = MetadataClient(self.rt.nc, self.rt.subjects, timeout_s=UNREGISTER_TIMEOUT_S)
        try:
            await client.unregister_bookie(self.bookie_id)
        except Exception as exc:
            log.info("bookie unregister skipped", extra={"err": str(exc)})


async def main(
    rt: ServiceRuntime,
    disk_usage: DiskUsage = os_disk_usage,
    service: JournalService | None = None,
) -> None:
    """`disk_usage` is the disk usage source (tests pass their own); `service` one made
    already (the co-hosted bookie's, `services.bookie`, wired to its ledgerstore)."""
    service = service or JournalService(rt, disk_usage)
    serve_metrics(rt, journal_metrics(service))
    # Identity first: a disk that is not this bookie's is never replayed or served.
    client = MetadataClient(rt.nc, rt.subjects, timeout_s=rt.settings.request_timeout_ms / 1000)
    service.identity_checked = await service.establish_identity(client)
    # Replayed side by side: each journal reads its own disk.
    await asyncio.gather(*(journal.open() for journal in service.journals))
    await service.check_disks()
    for journal in service.journals:
        rt.on_shutdown(journal.close)
    rt.on_shutdown(service.unregister)
    for index, journal in enumerate(service.journals):
        rt.spawn(journal.run_writer(), f"journal-writer-{index}")
    bookie = rt.settings.bookie_id
    # Adds where the read loop parses them (admitted in arrival order, answered from
    # their commit: handle_add).
    await rt.add_lean_endpoint("add", rt.subjects.bookie(bookie, "add"), service.handle_add)
    endpoints = [
        ("fence", "fence", service.handle_fence, 256),
        ("write_lac", "write_lac", service.handle_write_lac, 256),
        ("journal-checkpoint", JOURNAL_CHECKPOINT, service.handle_checkpoint, 4),
        ("journal-delete", JOURNAL_DELETE, service.handle_delete, 4),
        ("info", "info", service.handle_info, 16),
        ("clear_limbo", "clear_limbo", service.handle_clear_limbo, 1),
    ]
    for name, op, handler, max_in_flight in endpoints:
        await rt.add_endpoint(
            name, rt.subjects.bookie(bookie, op), handler, max_in_flight=max_in_flight
        )
    rt.spawn(service.keep_registered(), "bookie-registration")
    rt.spawn(service.watch_disks(), "disk-checker")
    # The server has our subscriptions once this returns: no request finds no responder.
    await rt.nc.flush()
