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
from contextvars import Context, copy_context

from services.journal.service import JournalService
from services.journal.service import main as journal_main
from services.ledgerstore.service import LedgerstoreService
from services.ledgerstore.service import main as ledgerstore_main
from shared import clock
from shared.config import load_settings
from shared.gc_tuning import tune_gc
from shared.logs import setup_logging
from shared.service import ServiceRuntime
from shared.telemetry import setup_tracing, shutdown_tracing, use_service_tracing

log = logging.getLogger(__name__)


async def serve_cohosted(
    journal_rt: ServiceRuntime, ledgerstore_rt: ServiceRuntime, ledgerstore_context: Context
) -> None:
    """Set up both halves on their (started) runtimes, the journal first (it checks the
    bookie's identity and writes the cookie the ledgerstore waits for). The ledgerstore's
    tasks (its endpoints' subscriptions, its background tasks) start in
    `ledgerstore_context`: its spans are the ledgerstore's (`use_service_tracing`)."""
    ledgerstore = LedgerstoreService(ledgerstore_rt)
    journal = JournalService(journal_rt)
    # Wired before the journal commits anything: every durable group commit is handed.
    journal.hand_over(ledgerstore.take_handoff())
    await journal_main(journal_rt, service=journal)
    await asyncio.create_task(
        ledgerstore_main(ledgerstore_rt, service=ledgerstore), context=ledgerstore_context
    )


def run_cohosted() -> int:
    """`python -m services.bookie`: run until SIGTERM or SIGINT, then drain both."""
    settings = load_settings()
    bookie = settings.bookie_id
    setup_logging(f"{bookie}.bookie", settings.log_level, bookie_id=bookie)
    # Each half traces as its service, as in processes of their own: the journal with the
    # process's provider, the ledgerstore with one of its own in its context.
    setup_tracing("journal", instance=f"{bookie}.journal", bookie_id=bookie)
    ledgerstore_context = copy_context()
    ledgerstore_context.run(
        use_service_tracing, "ledgerstore", instance=f"{bookie}.ledgerstore", bookie_id=bookie
    )
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
            await journal_rt.start()
            started.append(journal_rt)
            # Its NATS connection's tasks in its context too.
            await asyncio.create_task(ledgerstore_rt.start(), context=ledgerstore_context)
            started.append(ledgerstore_rt)
            await serve_cohosted(journal_rt, ledgerstore_rt, ledgerstore_context)
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
