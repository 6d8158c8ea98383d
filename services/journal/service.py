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
together. It also keeps the bookie registered in metadata. Its counters are Prometheus
metrics (`services.journal.metrics`; docs/metrics.md), on `metrics_port`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from nats.micro.request import Request
from opentelemetry.trace import Span, get_current_span

from services.journal.core import high_priority_writes_allowed
from services.journal.journal import Journal, QueueFull
from services.journal.metrics import count_add_request, journal_metrics
from shared import clock, wire
from shared.aio import wait_event
from shared.bookie.cookie import (
    NO_INSTANCE,
    Cookie,
    CookieMismatch,
    check_journal_copy,
    journal_copy_dir,
    read_disk_cookie,
    reconcile,
    reconcile_offline,
    write_disk_cookie,
)
from shared.bookie.fault_files import files_for
from shared.bookie.gc import BadRequest, parse_journal_delete
from shared.bookie.journal_format import (
    JOURNAL_START,
    FenceRecord,
    JournalFormatError,
    JournalPosition,
    LacRecord,
    LedgerDeletedRecord,
    Record,
)
from shared.bookie.rules import admit_adds, disk_read_only, meta_records, refuse_adds
from shared.disk import fail_stop
from shared.metaclient import MetadataClient, MetadataError
from shared.metrics import serve_metrics
from shared.models import LOCATION, NO_VERSION, REGISTERED_AT, BookieState, MetaErrorCode
from shared.service import ServiceRuntime
from shared.status import BookieStatus
from shared.subjects import JOURNAL_CHECKPOINT, JOURNAL_COMMITTED, JOURNAL_DELETE
from shared.telemetry import recording

log = logging.getLogger(__name__)

ADD_MAX_IN_FLIGHT = 1024  # add batches waiting for their group commit at once
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
        # The disks of this bookie: the journal's and every ledger directory.
        (self.journal_dir,) = rt.settings.journal_dirs  # one: JournalSettings checks it
        self.disk_dirs = [self.journal_dir, *rt.settings.ledger_dirs]
        self.journal_copy = journal_copy_dir(rt.settings.bookie_dir, self.journal_dir)
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
        self._announce_position = JOURNAL_START
        self._announce_timer: asyncio.TimerHandle | None = None
        self._announcing: set[asyncio.Task[None]] = set()
        self.journal = Journal(
            self.journal_dir,
            rt.settings.journal,
            on_commit=self._on_commit,
            files=files_for(rt.settings.faults_dir),
            bookie_id=self.bookie_id,
        )

    def _on_commit(self, position: JournalPosition) -> None:
        """Tell the ledgerstore what is durable, at most once per
        ledgerstore.journal_apply_interval_ms: one notification (and one catch-up of the
        ledgerstore) for all the group commits of that interval, not one per commit, and
        never ahead of the answers to the adds just committed (a message costs tens of
        microseconds of CPU in each process it passes)."""
        self._announce_position = position
        if self._announce_timer is None:
            interval_s = self.rt.settings.ledgerstore.journal_apply_interval_ms / 1000
            loop = asyncio.get_running_loop()
            self._announce_timer = loop.call_later(interval_s, self._announce_now)

    def _announce_now(self) -> None:
        self._announce_timer = None
        task = asyncio.create_task(self._announce(self._announce_position))
        self._announcing.add(task)
        task.add_done_callback(self._announcing.discard)

    async def _announce(self, position: JournalPosition) -> None:
        # Fire and forget: the ledgerstore also polls, a lost notification only delays it.
        try:
            await self.rt.nc.publish(
                self.committed_subject, json.dumps(position.to_json()).encode()
            )
        except Exception as exc:
            log.debug("committed notification not sent", extra={"err": repr(exc)})

    def _submit(self, records: list[Record]) -> asyncio.Future | None:
        """Queue admitted records and apply them to the live state; None if the queue is
        full (nothing queued then). The future: all of them are durable."""
        try:
            future = self.journal.submit(records, time.monotonic() * 1000, _traced_request())
        except QueueFull:
            return None
        for record in records:
            self.journal.live.apply(record)
        return future

    # -- add ------------------------------------------------------------------------------

    async def handle_add(self, request: Request) -> None:
        arrived = time.perf_counter()
        try:
            items = wire.decode_add_request(request.data)
        except wire.WireError as exc:
            log.warning("bad add request", extra={"err": str(exc)})
            await request.respond(wire.encode_add_reply(BookieStatus.BAD_REQUEST, []))
            return
        if self.read_only:
            results, durable = self._admit_read_only(items)
        else:
            results, durable = self._admit_adds(items)
        if durable is not None:
            await durable
        await request.respond(wire.encode_add_reply(BookieStatus.OK, results))
        count_add_request(self.journal.stats, results, (time.perf_counter() - arrived) * 1000)

    def _admit_adds(
        self, items: list[wire.AddItem]
    ) -> tuple[list[wire.AddResult], asyncio.Future | None]:
        """Admit the batch by the ledger rules (`admit_adds`) and queue what they admit,
        all in one synchronous step (so the checks see the adds that arrived before). The
        future (None if nothing was queued): every queued item is durable."""
        if not self.journal.room_for(len(items)):
            return self._refuse(items, BookieStatus.TOO_MANY_REQUESTS), None
        admission = admit_adds(self.journal.live, items)
        for result in admission.results:
            if result.status is not BookieStatus.OK:
                self.journal.stats.rejected(result.status.name)
        if not admission.records:
            return admission.results, None
        # room_for checked the whole batch: this cannot be refused.
        durable = self.journal.submit(admission.records, time.monotonic() * 1000, _traced_request())
        return admission.results, durable

    def _admit_read_only(
        self, items: list[wire.AddItem]
    ) -> tuple[list[wire.AddResult], asyncio.Future | None]:
        """diskUsageThreshold passed: normal adds are refused READ_ONLY; recovery adds (the
        replicator's and a recovery's: BookKeeper's high-priority writes) are admitted while
        the fullest disk keeps min_usable_size_for_high_priority_writes_bytes free."""
        allowed = high_priority_writes_allowed(
            self.disk_free_bytes,
            self.rt.settings.ledgerstore.min_usable_size_for_high_priority_writes_bytes,
        )
        recovery = [allowed and bool(item.flags & wire.FLAG_RECOVERY_ADD) for item in items]
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

    def _refuse(self, items: list[wire.AddItem], status: BookieStatus) -> list[wire.AddResult]:
        for _ in items:
            self.journal.stats.rejected(status.name)
        return refuse_adds(items, status)

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
        facts = self.journal.durable.get(ledger_id)
        was_fenced = facts is not None and facts.fenced
        status = await self._journal_meta(ledger_id, master_key, FenceRecord(ledger_id))
        if status is not BookieStatus.OK:
            await request.respond(wire.encode_lac_reply(wire.LacReply(status)))
            return
        facts = self.journal.durable.get(ledger_id)
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
        if not self.journal.room_for(2 * len(items)):
            statuses = [BookieStatus.TOO_MANY_REQUESTS] * len(items)
            await request.respond(wire.encode_write_lac_reply(statuses))
            return
        live = self.journal.live
        statuses, records = [], []
        for ledger_id, master_key, lac in items:
            if lac < -1:
                statuses.append(BookieStatus.BAD_REQUEST)
                continue
            status, facts = meta_records(live, ledger_id, master_key, LacRecord(ledger_id, lac))
            for record in facts:  # applied at once: the next item of the ledger sees its key
                live.apply(record)
            records.extend(facts)
            statuses.append(status)
        if records:
            # room_for checked the whole request: this cannot be refused.
            await self.journal.submit(records, time.monotonic() * 1000)
        await request.respond(wire.encode_write_lac_reply(statuses))

    async def _journal_meta(
        self, ledger_id: int, master_key: bytes, record: FenceRecord | LacRecord
    ) -> BookieStatus:
        """Journal a ledger fact (`meta_records`: with the ledger's key first if it has
        none) and wait until it is durable."""
        status, records = meta_records(self.journal.live, ledger_id, master_key, record)
        if status is not BookieStatus.OK:
            return status
        durable = self._submit(records)
        if durable is None:
            return BookieStatus.TOO_MANY_REQUESTS
        await durable
        return BookieStatus.OK

    # -- checkpoint and stats -------------------------------------------------------------

    async def handle_checkpoint(self, request: Request) -> None:
        try:
            requested = JournalPosition.from_json(json.loads(request.data))
        except (ValueError, KeyError, TypeError, JournalFormatError) as exc:
            await request.respond(json.dumps({"ok": False, "error": str(exc)}).encode())
            return
        mark, deleted = await self.journal.checkpoint(requested)
        await request.respond(
            json.dumps({"ok": True, "mark": mark.to_json(), "deleted": deleted}).encode()
        )
        if deleted:
            log.info("journal checkpoint", extra={"mark": mark.to_json(), "deleted": deleted})
            self.rt.events.emit(
                "journal.checkpoint",
                bookie_id=self.bookie_id,
                mark=mark.to_json(),
                deleted_files=deleted,
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
        position = await durable
        log.info("ledgers deleted", extra={"ledgers": len(ledger_ids), "at": position.to_json()})
        await request.respond(json.dumps({"ok": True, "position": position.to_json()}).encode())

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
        mark = self.journal.mark
        return {
            "bookie_id": self.bookie_id,
            "state": "readonly" if self.read_only else "writable",
            "free_bytes": min(d["free_bytes"] for d in disks),
            "total_bytes": min(d["total_bytes"] for d in disks),
            "disk_usage": self.disk_usage_fraction,
            "disk_usage_threshold": settings.ledgerstore.disk_usage_threshold,
            "disk_usage_lwm_threshold": settings.ledgerstore.disk_usage_lwm_threshold,
            "last_log_mark": mark.to_json() if mark else None,
            "journal_durable": self.journal.durable_position.to_json(),
            "ledgers": len(self.journal.durable),
            "journal_dir": str(self.journal.directory),
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
            journal_dir=str(self.journal_dir.resolve()),
            ledger_dirs=[str(d.resolve()) for d in settings.ledger_dirs],
            instance_id=instance_id,
        )

    def _has_data(self) -> bool:
        return any(d.exists() and any(d.iterdir()) for d in self.disk_dirs)

    def _write_cookie(self, cookie: Cookie) -> None:
        write_disk_cookie(
            self.rt.settings.bookie_dir, cookie, self.journal.files, self.journal_copy
        )

    async def establish_identity(self, client: MetadataClient) -> bool:
        """Check the cookie on disk against this bookie and against metadata; write what is
        missing. CookieMismatch if the disk is not this bookie's. False if metadata could
        not be asked (then only the disk was checked; `keep_registered` asks later)."""
        bookie_dir = self.rt.settings.bookie_dir
        disk = read_disk_cookie(bookie_dir)
        if self.journal_copy is not None:
            check_journal_copy(self.expected_cookie(), disk, self.journal_copy)
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


async def main(rt: ServiceRuntime, disk_usage: DiskUsage = os_disk_usage) -> None:
    """`disk_usage` is the disk usage source (tests pass their own)."""
    service = JournalService(rt, disk_usage)
    serve_metrics(rt, journal_metrics(service))
    # Identity first: a disk that is not this bookie's is never replayed or served.
    client = MetadataClient(rt.nc, rt.subjects, timeout_s=rt.settings.request_timeout_ms / 1000)
    service.identity_checked = await service.establish_identity(client)
    await service.journal.open()
    await service.check_disks()
    rt.on_shutdown(service.journal.close)
    rt.on_shutdown(service.unregister)
    rt.spawn(service.journal.run_writer(), "journal-writer")
    bookie = rt.settings.bookie_id
    endpoints = [
        ("add", "add", service.handle_add, ADD_MAX_IN_FLIGHT),
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
