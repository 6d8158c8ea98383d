"""The ledgerstore service: serves reads of one bookie's entries on NATS.

Endpoints on `<prefix>.bookie.<bookie_id>.<op>`:
    read               batch of (ledger, entry) -> stored frames (absent: NO_ENTRY or
                       NO_LEDGER with authority, else UNKNOWN_LEDGER_STATE; see
                       `shared.bookie.rules`); through a bounded queue
                       (`read_queue.ReadQueue`): TOO_MANY_REQUESTS when it is full, dropped
                       unanswered once it waited past its sender's timeout
    read_lac           a ledger's LAC and last stored entry (an unknown ledger: NO_LEDGER
                       with authority, else UNKNOWN_LEDGER_STATE)
    gc                 {"force_major", "force_minor", "wait"}: a garbage collection run now
                       (forceGC); with `wait`, answered with what that run did
    gc.details         the collector's state (BookKeeper's GarbageCollectionStatus and more)
    gc.suspend         {"major", "minor"}: suspend compaction of those kinds
    gc.resume          {"major", "minor"}: resume them
    gc.explain         every entry log, the ledgers that pin it, what the next minor and
                       major compactions do with it
Background: apply the journal when it announces commits (`journal.committed`, at most
once per `journal_apply_interval_ms`; co-hosted, `services.bookie`, the commits it hands
over in process, as often) or every `journal_poll_interval_ms`; checkpoint
every `flush_interval_ms` or once `flush_threshold_bytes` are cached, and hand the
position to the journal (`journal.checkpoint`) as its LastLogMark at most once per
`flush_interval_ms`. The garbage collector (`services.ledgerstore.gc`) runs every
`gc_wait_time_ms` or when forced. Its counters (the store's, the read queue's, the
collector's) are Prometheus metrics (`services.ledgerstore.metrics`; docs/metrics.md), on
`metrics_port`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from nats.micro.request import Request

from services.ledgerstore.gc import (
    GarbageCollector,
    GcError,
    JournalPositions,
    decode_delete_reply,
)
from services.ledgerstore.metrics import ledgerstore_metrics
from services.ledgerstore.read_queue import ReadQueue
from services.ledgerstore.store import LedgerStore
from shared import wire
from shared.aio import wait_event
from shared.bookie.cookie import Cookie, read_disk_cookie
from shared.bookie.fault_files import files_for
from shared.bookie.gc import BadRequest, GcRun, parse_flags
from shared.bookie.handoff import DurableBatch
from shared.bookie.journal_dir import decode_journal_position, encode_journal_position
from shared.bookie.journal_format import JournalFormatError
from shared.metaclient import MetadataClient
from shared.metrics import serve_metrics
from shared.service import ServiceRuntime
from shared.status import BookieStatus
from shared.subjects import JOURNAL_CHECKPOINT, JOURNAL_COMMITTED, JOURNAL_DELETE

log = logging.getLogger(__name__)


class LedgerstoreService:
    def __init__(self, rt: ServiceRuntime) -> None:
        self.rt = rt
        self.settings = rt.settings.ledgerstore
        self.bookie_id = rt.settings.bookie_id
        self.store = LedgerStore(
            rt.settings.bookie_dir,
            self.settings,
            ledger_dirs=rt.settings.ledger_dirs,
            journal_dirs=rt.settings.journal_dirs,
            files=files_for(rt.settings.faults_dir),
            on_corrupt=self._on_corrupt,
            skip_invalid_journal_records=rt.settings.journal.skip_replay_journal_invalid_record,
        )
        self.reads = ReadQueue(
            self.store,
            self.settings.num_read_worker_threads,
            self.settings.num_read_worker_threads
            * self.settings.max_pending_read_requests_per_thread,
            read_share=self.settings.read_share_while_writing,
        )
        self._journal_committed = asyncio.Event()
        self._handed_timer: asyncio.TimerHandle | None = None
        self._flush_soon = asyncio.Event()
        timeout_s = rt.settings.request_timeout_ms / 1000
        self.gc = GarbageCollector(
            self.store,
            self.settings,
            bookie_id=self.bookie_id,
            ledger_dirs=list(rt.settings.ledger_dirs),
            metadata=MetadataClient(rt.nc, rt.subjects, timeout_s=timeout_s),
            journal_delete=self.journal_delete,
            checkpoint=self.checkpoint,
            emit=rt.events.emit,
        )

    def _on_corrupt(self, ledger_id: int, entry_id: int, reason: str) -> None:
        # The auditor listens: the replica is to be repaired from another bookie.
        self.rt.events.emit(
            "entry.corrupt",
            ledger_id=ledger_id,
            bookie_id=self.bookie_id,
            entry_id=entry_id,
            reason=reason,
        )

    async def handle_read(self, request: Request) -> None:
        await self.reads.offer(request, request.data)

    async def handle_read_lac(self, request: Request) -> None:
        try:
            ledger_id = wire.decode_read_lac_request(request.data)
        except wire.WireError as exc:
            log.warning("bad read_lac request", extra={"err": str(exc)})
            await request.respond(wire.encode_lac_reply(wire.LacReply(BookieStatus.BAD_REQUEST)))
            return
        await request.respond(wire.encode_lac_reply(await self.store.read_lac(ledger_id)))

    def take_handoff(self) -> Callable[[DurableBatch], None]:
        """Co-hosted (`services.bookie`): the journal's durable group commits come in
        process, by reference, through this callable (bounded by
        ledgerstore.journal_handoff_queue_batches); no file re-read while they do."""
        self.store.accept_handoff(self.settings.journal_handoff_queue_batches)
        return self.handed

    def handed(self, batch: DurableBatch) -> None:
        """One durable group commit (from the journal's writer, synchronous): queued,
        and applied with the others of the next journal_apply_interval_ms."""
        self.store.offer(batch)
        if self._handed_timer is None:
            interval_s = self.settings.journal_apply_interval_ms / 1000
            loop = asyncio.get_running_loop()
            self._handed_timer = loop.call_later(interval_s, self._apply_handed_now)

    def _apply_handed_now(self) -> None:
        self._handed_timer = None
        self._journal_committed.set()

    async def on_committed(self, msg) -> None:
        try:
            index, position = decode_journal_position(msg.data, len(self.store.tailers))
        except JournalFormatError:
            log.warning("bad journal.committed notification", extra={"data": msg.data[:100]})
            return
        self.store.journal_durable(index, position)
        self._journal_committed.set()

    async def follow_journal(self) -> None:
        """Apply what the journal commits: on its notification, else by polling.

        The journal notifies at most once per `journal_apply_interval_ms`, so one
        catch-up applies many group commits: waking on every commit (hundreds a second
        per bookie) cost a ledgerstore more CPU than its applying, on the cores the
        journals need to answer adds. Nothing waits for it: adds are answered by the
        journal, and a read of an entry not applied yet catches up itself."""
        poll_s = self.settings.journal_poll_interval_ms / 1000
        loop = asyncio.get_running_loop()
        limbo_checked_s = float("-inf")
        while True:
            await wait_event(self._journal_committed, poll_s)
            self._journal_committed.clear()
            if loop.time() - limbo_checked_s >= poll_s:
                limbo_checked_s = loop.time()
                self._check_limbo()
            await self.store.catch_up()
            if self.store.unflushed_bytes >= self.settings.flush_threshold_bytes:
                # Small flushes often: a large one stalls the journals' fsyncs on the
                # same disk (ext4 commits the entry logs' data before their records).
                self._flush_soon.set()

    def _check_limbo(self) -> None:
        """Follow the cookie's `limbo`: the journal may find the disk wiped only once
        metadata answers, and clears it when the auditor says the lost ledgers are whole
        again (journal `clear_limbo`)."""
        cookie = read_disk_cookie(self.rt.settings.bookie_dir)
        limbo = cookie is not None and cookie.limbo
        if limbo and not self.store.limbo:
            log.error("bookie disk was wiped: absent entries answer UNKNOWN_LEDGER_STATE")
        elif self.store.limbo and not limbo:
            log.warning("bookie limbo cleared: absent entries answer NO_ENTRY again")
        self.store.limbo = limbo

    async def checkpoint_forever(self) -> None:
        """Checkpoint every flush_interval_ms, or sooner once flush_threshold_bytes of
        entries wait in the write cache."""
        interval_s = self.settings.flush_interval_ms / 1000
        loop = asyncio.get_running_loop()
        marked_s = loop.time()
        while True:
            await wait_event(self._flush_soon, interval_s)
            self._flush_soon.clear()
            # The journal's LastLogMark moves once per interval at most: each move writes
            # and fsyncs a file on the journal's disk, next to the adds' fsyncs.
            tell_journal = loop.time() - marked_s >= interval_s
            await self.checkpoint(tell_journal)
            if tell_journal:
                marked_s = loop.time()

    async def checkpoint(self, tell_journal: bool = True) -> None:
        """Flush the write cache, then (if `tell_journal`) hand each journal its position
        as its LastLogMark."""
        positions = await self.store.checkpoint()
        if not tell_journal or (positions is None and self.store.checkpointed is None):
            return
        marks = positions or self.store.checkpointed
        assert marks is not None
        subject = self.rt.subjects.bookie(self.bookie_id, JOURNAL_CHECKPOINT)
        for index, mark in enumerate(marks):
            try:
                # Repeated even when nothing changed: a journal that restarted learns its
                # mark.
                msg = await self.rt.nc.request(
                    subject,
                    encode_journal_position(index, mark),
                    timeout=self.rt.settings.request_timeout_ms / 1000,
                )
                reply = json.loads(msg.data)
                if not reply.get("ok"):
                    log.warning("journal refused checkpoint", extra={"reply": reply})
            except Exception as exc:  # journal down or restarting: the next one retries
                log.info("journal checkpoint not delivered", extra={"err": repr(exc)})
                return

    async def journal_delete(self, ledger_ids: list[int]) -> JournalPositions:
        """Ask the journal to forget these ledgers (DELETED records); the position after
        them in each journal that took some, once they are fsynced."""
        msg = await self.rt.nc.request(
            self.rt.subjects.bookie(self.bookie_id, JOURNAL_DELETE),
            json.dumps({"ledgers": ledger_ids}).encode(),
            timeout=self.rt.settings.request_timeout_ms / 1000,
        )
        return decode_delete_reply(msg.data, len(self.store.tailers))

    # -- the garbage collector's endpoints ------------------------------------------------

    async def handle_gc(self, request: Request) -> None:
        try:
            flags = parse_flags(request.data, ("force_major", "force_minor", "wait"))
        except BadRequest as exc:
            await respond_bad_request(request, exc)
            return
        run = self.gc.trigger(flags["force_major"], flags["force_minor"])
        if not flags["wait"]:
            await respond(request, {"ok": True, "triggered": True})
            return
        try:
            result: GcRun = await run
        except GcError as exc:
            await respond(request, {"ok": False, "error": "GC_FAILED", "message": str(exc)})
            return
        await respond(request, {"ok": True, "run": result.to_json()})

    async def handle_gc_details(self, request: Request) -> None:
        await respond(request, {"ok": True, "details": self.gc.details()})

    async def handle_gc_suspend(self, request: Request) -> None:
        await self._suspend(request, True)

    async def handle_gc_resume(self, request: Request) -> None:
        await self._suspend(request, False)

    async def _suspend(self, request: Request, suspend: bool) -> None:
        """gc.suspend / gc.resume: the kinds named true change; the others stay."""
        try:
            kinds = parse_flags(request.data, ("major", "minor"))
        except BadRequest as exc:
            await respond_bad_request(request, exc)
            return
        self.gc.set_suspended(
            major=suspend if kinds["major"] else None, minor=suspend if kinds["minor"] else None
        )
        await respond(
            request,
            {
                "ok": True,
                "suspendMajor": self.gc.suspend_major,
                "suspendMinor": self.gc.suspend_minor,
            },
        )

    async def handle_gc_explain(self, request: Request) -> None:
        await respond(request, {"ok": True, **self.gc.explain()})


async def respond(request: Request, body: dict) -> None:
    await request.respond(json.dumps(body).encode())


async def respond_bad_request(request: Request, exc: BadRequest) -> None:
    await respond(request, {"ok": False, "error": "BAD_REQUEST", "message": str(exc)})


COOKIE_WAIT_LOG_S = 5.0


async def wait_for_cookie(rt: ServiceRuntime) -> Cookie:
    """The journal checks the bookie's identity and writes its cookie before anything
    else; serve only after it did (a wiped disk's cookie says `limbo`)."""
    waited_s = 0.0
    while True:
        cookie = read_disk_cookie(rt.settings.bookie_dir)
        if cookie is not None:
            return cookie
        if waited_s >= COOKIE_WAIT_LOG_S:
            log.info("waiting for the journal to write the bookie's cookie")
            waited_s = 0.0
        await asyncio.sleep(0.05)
        waited_s += 0.05


async def main(rt: ServiceRuntime, service: LedgerstoreService | None = None) -> None:
    """`service`: one made already (the co-hosted bookie's, `services.bookie`, taking the
    journal's handoff)."""
    service = service or LedgerstoreService(rt)
    serve_metrics(rt, ledgerstore_metrics(service))
    cookie = await wait_for_cookie(rt)
    service.store.limbo = cookie.limbo
    service.gc.instance_id = cookie.instance_id
    await service.store.open()
    rt.on_shutdown(service.store.close)
    bookie = rt.settings.bookie_id
    sub = await rt.nc.subscribe(
        rt.subjects.bookie(bookie, JOURNAL_COMMITTED), cb=service.on_committed
    )
    rt.on_shutdown(sub.unsubscribe)
    await service.store.catch_up()
    rt.spawn(service.follow_journal(), "follow-journal")
    rt.spawn(service.checkpoint_forever(), "checkpoint")
    rt.spawn(service.gc.run_forever(), "garbage-collector")
    rt.on_shutdown(service.gc.close)
    service.reads.start()
    rt.on_shutdown(service.reads.drain)  # runs before store.close (last added, first run)
    await rt.add_inline_endpoint("read", rt.subjects.bookie(bookie, "read"), service.handle_read)
    await rt.add_endpoint(
        "read_lac", rt.subjects.bookie(bookie, "read_lac"), service.handle_read_lac
    )
    gc_endpoints = [
        ("gc", "gc", service.handle_gc),
        ("gc-details", "gc.details", service.handle_gc_details),
        ("gc-suspend", "gc.suspend", service.handle_gc_suspend),
        ("gc-resume", "gc.resume", service.handle_gc_resume),
        ("gc-explain", "gc.explain", service.handle_gc_explain),
    ]
    for name, op, handler in gc_endpoints:
        await rt.add_endpoint(name, rt.subjects.bookie(bookie, op), handler)
    # The server has our subscriptions once this returns: no request finds no responder.
    await rt.nc.flush()
