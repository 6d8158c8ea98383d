"""The fault suite's final phase, once every fault is healed: recover every ledger the
history created (a recover of a closed ledger answers its last entry and changes nothing),
read its metadata, read it whole through the gateway, and read each entry from each bookie
of its write set directly over NATS (shared.bookie_client), so the checker can judge the
ledger and its replicas (quire/faults/checker.py). Transient errors are retried until a
deadline; what still fails is recorded, not hidden: an unrecovered ledger, a cut read, a
replica that did not answer.

`final_phase(http_url, nats, ledgers)` returns one `FinalLedger` per ledger; `ledgers_of`
finds the ledgers (and passwords) in a history."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import httpx

from quire.client import HttpClient, Ledger, QuireClientError
from quire.faults.checker import (
    REPLICA_OK,
    FinalLedger,
    Op,
    ReplicaRead,
    calls,
    write_set_bookies,
)
from shared import wire
from shared.bookie_client import BookieClient
from shared.config import QuireSettings
from shared.digest import DigestManager, DigestMismatch
from shared.protocol.transport import BookieUnreachable
from shared.service import connect_nats
from shared.status import BookieStatus
from shared.subjects import Subjects

DEADLINE_S = 120.0
RETRY_S = 0.5
CALL_TIMEOUT_S = 30.0
STEP_RETRY_S = 45.0
LEDGERS_AT_ONCE = 4
REPLICA_BATCH_ENTRIES = 100
REPLICA_TRIES = 4
BOOKIE_READ_TIMEOUT_MS = 5_000
# Errors that say the answer will not change however often it is asked.
FINAL_CODES = frozenset({"UNAUTHORIZED", "NO_SUCH_LEDGER", "INVALID_ARGUMENT"})
# Bookie answers worth asking again: busy, not caught up yet, or not reached.
RETRIED_STATUSES = frozenset(
    {"UNREACHABLE", "TOO_MANY_REQUESTS", "UNKNOWN_LEDGER_STATE", "IO_ERROR"}
)
UNREACHABLE = "UNREACHABLE"
NOT_ASKED = "NOT_ASKED"


def ledgers_of(history: Iterable[Op]) -> dict[int, str]:
    """Every ledger the history created, and its password."""
    found = {}
    for call in calls(history):
        if call.invoke.kind == "create" and call.outcome == "ok":
            found[call.result["ledger_id"]] = call.invoke.value["password"]
    return found


def run_final_phase(
    http_url: str, nats: QuireSettings, ledgers: Mapping[int, str], deadline_s: float = DEADLINE_S
) -> list[FinalLedger]:
    """`final_phase` from synchronous code."""
    return asyncio.run(final_phase(http_url, nats, ledgers, deadline_s))


async def final_phase(
    http_url: str, nats: QuireSettings, ledgers: Mapping[int, str], deadline_s: float = DEADLINE_S
) -> list[FinalLedger]:
    """`nats`: the cluster's NATS URL and credentials (the bookies are asked directly)."""
    deadline = time.monotonic() + deadline_s
    nc = await connect_nats(nats, name="quire-faults-final")
    bookies = BookieClient(
        nc,
        Subjects(nats.subject_prefix),
        add_timeout_ms=BOOKIE_READ_TIMEOUT_MS,
        read_timeout_ms=BOOKIE_READ_TIMEOUT_MS,
    )
    gate = asyncio.Semaphore(LEDGERS_AT_ONCE)
    try:
        async with HttpClient(http_url, timeout_s=CALL_TIMEOUT_S) as client:

            async def one(ledger_id: int, password: str) -> FinalLedger:
                async with gate:
                    return await _final_ledger(client, bookies, ledger_id, password, deadline)

            return list(await asyncio.gather(*(one(i, p) for i, p in sorted(ledgers.items()))))
    finally:
        await nc.close()


async def _retrying(what: Any, deadline: float) -> tuple[Any, str | None]:
    """(the result of `what()`, None), retried on transient errors for STEP_RETRY_S at
    most (one ledger that never recovers must not use up the others' time) and not past
    the phase's deadline; (None, the last error) if it never succeeded."""
    error = "not tried: the final phase's deadline had passed"
    give_up = min(deadline, time.monotonic() + STEP_RETRY_S)
    while time.monotonic() < give_up:
        try:
            return await what(), None
        except QuireClientError as exc:
            error = f"{exc.code}: {exc.detail[:200]}"
            if exc.code in FINAL_CODES:
                break
        except (TimeoutError, OSError, httpx.TransportError) as exc:  # connection lost
            error = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(RETRY_S)
    return None, error


async def _final_ledger(
    client: HttpClient, bookies: BookieClient, ledger_id: int, password: str, deadline: float
) -> FinalLedger:
    started = time.monotonic()
    _, recover_error = await _retrying(lambda: client.recover(ledger_id, password), deadline)
    recovery_ms = None if recover_error else (time.monotonic() - started) * 1000
    ledger, get_error = await _retrying(lambda: client.get(ledger_id), deadline)
    if ledger is None:
        return FinalLedger(ledger_id, "UNKNOWN", None, (), recover_error=get_error)
    assert isinstance(ledger, Ledger)
    closed = ledger.state == "CLOSED"
    last = ledger.last_entry_id if closed else None
    entries: list[tuple[int, bytes]] = []

    async def read() -> None:
        entries.clear()
        if last is None or last >= 0:
            async for entry in client.read_stream(ledger_id, password, 0, last):
                entries.append((entry.entry_id, entry.data))

    _, read_error = await _retrying(read, deadline)
    segments = [(s["first_entry_id"], list(s["bookies"])) for s in ledger.segments]
    final = FinalLedger(
        ledger_id,
        ledger.state,
        last,
        list(entries),
        write_quorum=ledger.write_quorum,
        ack_quorum=ledger.ack_quorum,
        segments=segments,
        read_error=read_error,
        recover_error=recover_error,
        recovery_ms=recovery_ms,
    )
    digest = DigestManager(ledger.digest, password.encode())
    ids = [entry_id for entry_id, _ in entries]
    replicas = await _replicas(bookies, final, digest, ids, deadline)
    return replace(final, replicas=replicas)


async def _replicas(
    bookies: BookieClient,
    final: FinalLedger,
    digest: DigestManager,
    entry_ids: Sequence[int],
    deadline: float,
) -> list[ReplicaRead]:
    """Each entry as each bookie of its write set answers it (per the final metadata)."""
    asked: dict[str, list[int]] = {}
    for entry_id in entry_ids:
        for bookie_id in write_set_bookies(final, entry_id):
            asked.setdefault(bookie_id, []).append(entry_id)
    answers: list[ReplicaRead] = []
    for bookie_id, ids in sorted(asked.items()):
        for start in range(0, len(ids), REPLICA_BATCH_ENTRIES):
            batch = ids[start : start + REPLICA_BATCH_ENTRIES]
            answers.extend(
                await _read_replica(bookies, final.ledger_id, bookie_id, batch, digest, deadline)
            )
    return answers


async def _read_replica(
    bookies: BookieClient,
    ledger_id: int,
    bookie_id: str,
    entry_ids: list[int],
    digest: DigestManager,
    deadline: float,
) -> list[ReplicaRead]:
    """The entries as one bookie answers them; transient answers asked again a few times,
    and nothing asked once the deadline has passed (NOT_ASKED: counted missing)."""
    got = {e: ReplicaRead(bookie_id, e, NOT_ASKED) for e in entry_ids}
    todo = list(entry_ids)
    for attempt in range(REPLICA_TRIES):
        if not todo or time.monotonic() > deadline:
            break
        if attempt:
            await asyncio.sleep(RETRY_S)
        got.update(await _ask(bookies, ledger_id, bookie_id, todo, digest))
        todo = [e for e in todo if got[e].status in RETRIED_STATUSES]
    return [got[e] for e in entry_ids]


async def _ask(
    bookies: BookieClient,
    ledger_id: int,
    bookie_id: str,
    entry_ids: list[int],
    digest: DigestManager,
) -> dict[int, ReplicaRead]:
    items = [wire.ReadItem(ledger_id, e) for e in entry_ids]
    try:
        status, results = await bookies.read(bookie_id, items)
    except BookieUnreachable:
        return {e: ReplicaRead(bookie_id, e, UNREACHABLE) for e in entry_ids}
    # An entry the reply leaves out: the request's status, or (OK) no answer for it.
    missing = status.name if status is not BookieStatus.OK else "NOT_IN_REPLY"
    answers = {e: ReplicaRead(bookie_id, e, missing) for e in entry_ids}
    for result in results:
        answers[result.entry_id] = replica_read(bookie_id, ledger_id, result, digest)
    return answers


def replica_read(
    bookie_id: str, ledger_id: int, result: wire.ReadResult, digest: DigestManager
) -> ReplicaRead:
    if result.status is not BookieStatus.OK:
        return ReplicaRead(bookie_id, result.entry_id, result.status.name)
    try:
        frame = digest.verify(result.frame, ledger_id, result.entry_id)
    except DigestMismatch:
        return ReplicaRead(bookie_id, result.entry_id, "DIGEST_MISMATCH")
    return ReplicaRead(bookie_id, result.entry_id, REPLICA_OK, frame.payload)
