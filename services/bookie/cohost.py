"""A co-hosted bookie: its journal service and its ledgerstore service in one process.

The composition root, and the only module that imports both services (.importlinter).
They stay two services: each its own ServiceRuntime (NATS connection, `nats.micro`
service, endpoints and subjects, events, metrics server and probes), its own code and
metric names, started and stopped as in processes of their own. One thing differs: the
journal hands each group commit it has made durable (after its fdatasync, in commit
order) to the ledgerstore by reference (`shared.bookie.handoff`), which applies those
records without reading the journal file back and parsing it again; it reads the file
only where the handoff left a gap (a full queue) and after a restart, as it always did.
Killing the process kills both halves, as a BookKeeper bookie is one process.

Shutdown: the ledgerstore first (its last checkpoint hands the LastLogMark to the
journal over NATS), then the journal. Either one stopping (a signal, a background task
that died) stops both.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from services.journal.service import JournalService
from services.journal.service import main as journal_main
from services.ledgerstore.service import LedgerstoreService
from services.ledgerstore.service import main as ledgerstore_main
from shared import clock
from shared.config import load_settings
from shared.gc_tuning import tune_gc
from shared.logs import setup_logging
from shared.service import ServiceRuntime
from shared.telemetry import setup_tracing, shutdown_tracing

log = logging.getLogger(__name__)


async def serve_cohosted(journal_rt: ServiceRuntime, ledgerstore_rt: ServiceRuntime) -> None:
    """Set up both halves on their (started) runtimes, the journal first (it checks the
    bookie's identity and writes the cookie the ledgerstore waits for)."""
    ledgerstore = LedgerstoreService(ledgerstore_rt)
    journal = JournalService(journal_rt)
    # Wired before the journal commits anything: every durable group commit is handed.
    journal.hand_over(ledgerstore.take_handoff())
    await journal_main(journal_rt, service=journal)
    await ledgerstore_main(ledgerstore_rt, service=ledgerstore)


def run_cohosted() -> int:
    """`python -m services.bookie`: run until SIGTERM or SIGINT, then drain both."""
    settings = load_settings()
    bookie = settings.bookie_id
    setup_logging(f"{bookie}.bookie", settings.log_level, bookie_id=bookie)
    # One tracer provider a process, so one service name: the journal's, whose spans are
    # the add path's (the ledgerstore's read spans carry it too; docs/storage.md).
    setup_tracing("journal", instance=f"{bookie}.journal", bookie_id=bookie)
    if settings.faults_dir is not None:
        log.warning(f"fault injection enabled from {settings.faults_dir}")
        clock.use_faults_dir(settings.faults_dir)
    ledgerstore_settings = settings.model_copy(
        update={"metrics_port": settings.ledgerstore_metrics_port}
    )

    async def amain() -> None:
        journal_rt = ServiceRuntime("journal", settings, f"{bookie}.journal")
        ledgerstore_rt = ServiceRuntime(
            "ledgerstore", ledgerstore_settings, f"{bookie}.ledgerstore"
        )
        runtimes = (ledgerstore_rt, journal_rt)  # the order of shutdown

        def stop() -> None:
            for rt in runtimes:
                rt.stop()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)
        started: list[ServiceRuntime] = []
        try:
            for rt in (journal_rt, ledgerstore_rt):
                await rt.start()
                started.append(rt)
            await serve_cohosted(journal_rt, ledgerstore_rt)
            for rt in runtimes:
                rt.started = True
            tune_gc()
            log.info("started", extra={"pid": os.getpid(), "bookie_process": "cohosted"})
            waits = [asyncio.ensure_future(rt.wait_stopped()) for rt in runtimes]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for wait in waits:
                wait.cancel()
            stop()
        finally:
            for rt in runtimes:
                if rt in started:
                    await rt.shutdown()

    try:
        import uvloop

        uvloop.run(amain())
    except Exception:
        log.exception("co-hosted bookie failed")
        return 1
    finally:
        shutdown_tracing()
    return 0
