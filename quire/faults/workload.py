"""The fault suite's workload: writers, readers and a recoverer on many ledgers through the
gateway's HTTP and gRPC APIs, every operation recorded in a `History` (invoke, then ok, fail
or info: quire/faults/checker.py says which error is which).

- Writers (half over HTTP, half over gRPC) each own one ledger at a time: create it (E3/Qw3/
  Qa2 mostly, some E4/Qw3/Qa2 and E3/Qw2/Qa2 so that striping is exercised), append
  `entries_per_ledger` entries (single appends, batches, and over gRPC AppendStream, where
  each entry is an operation of its own acknowledged by its own ack), close it, open the
  next. A ledger that answers LEDGER_FENCED, LEDGER_CLOSED or NO_SUCH_LEDGER is left for a
  new one; so is one that failed three appends in a row, after a try to close it.
- The recoverer now and then recovers (fences and closes) a ledger some writer is still
  appending to, as a second client taking over would, and reads its metadata back.
- Readers read ranges (confirmed, recording the LAC the gateway reported with them, and
  unconfirmed), long-poll the LAC, read the metadata, and tail for a moment.

Each payload names its writer, ledger and sequence number and is padded to `entry_size`
bytes, so any entry read back identifies the append that wrote it. Every call has a
timeout (`op_timeout_s`): under a fault a call ends in an error, never hangs. The
writers pace themselves to `rate` entries per second in all: the cluster shares the
machine.

Runs on an event loop of its own in one thread: `start()`, `stop()` (lets every worker
finish the operation it is in, then joins; a worker that died of a bug re-raises here),
`stats()`."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import random
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
import httpx

from quire.client import GrpcClient, HttpClient, QuireClient, QuireClientError
from quire.client.grpc import _client_error
from quire.faults.checker import INFO, OK, outcome
from quire.faults.history import History
from quire.v1 import ledgers_pb2 as pb

log = logging.getLogger(__name__)

PASSWORD = "quire-faults"
# (ensemble, write quorum, ack quorum) and how often each is picked.
QUORUMS: tuple[tuple[tuple[int, int, int], int], ...] = (
    ((3, 3, 2), 3),
    ((4, 3, 2), 1),
    ((3, 2, 2), 1),
)
# Codes after which a writer leaves its ledger: it is fenced, closed or gone.
LEDGER_DONE_CODES = frozenset({"LEDGER_FENCED", "LEDGER_CLOSED", "NO_SUCH_LEDGER"})
APPENDS_FAILED_MAX = 3
CREATE_RETRY_S = 0.5
LONG_POLL_MS = 1_000
TAIL_FOR_S = 2.0
TAIL_ENTRIES_MAX = 50
READ_SPAN_MAX = 20
KNOWN_LEDGERS_MAX = 200  # readers pick among the latest ledgers
CLIENT_TIMEOUT = "CLIENT_TIMEOUT"
CONNECTION_LOST = "CONNECTION_LOST"
STREAM_ENDED = "STREAM_ENDED"
STOP_GRACE_S = 15.0
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]  # on top of op_timeout_s, for stop() to join


class _Grpc(GrpcClient):
    """GrpcClient and what the history needs beyond its calls: AppendStream with one ack
    per entry, and reads with the LAC the gateway sent with each entry. Its channel tries
    to reconnect at least every second: gRPC's default backoff grows to two minutes, which
    would leave a gRPC worker failing long after a restarted gateway is back."""

    def __init__(self, target: str) -> None:
        super().__init__(target, channel_options=RECONNECT_OPTIONS)

    def stream_call(self, ledger_id: int, requests: AsyncIterator[bytes]) -> Any:
        async def messages() -> AsyncIterator[pb.AppendStreamRequest]:
            async for data in requests:
                yield pb.AppendStreamRequest(ledger_id=ledger_id, entry=data)

        return self._stub.AppendStream(messages(), metadata=self._metadata(PASSWORD))

    async def read_with_lac(
        self, ledger_id: int, first: int, last: int | None, unconfirmed: bool, out: list
    ) -> None:
        request = pb.ReadRequest(ledger_id=ledger_id, from_entry_id=first, unconfirmed=unconfirmed)
        if last is not None:
            request.to_entry_id = last
        await self._batches(self._stub.ReadBatches(request, metadata=self._metadata(PASSWORD)), out)

    async def tail_with_lac(self, ledger_id: int, first: int, out: list) -> None:
        request = pb.TailRequest(ledger_id=ledger_id, from_entry_id=first)
        await self._batches(self._stub.TailBatches(request, metadata=self._metadata(PASSWORD)), out)

    @staticmethod
    async def _batches(call: Any, out: list) -> None:
        try:
            async for batch in call:
                out.extend([e.entry_id, e.data, e.lac] for e in batch.entries)
                if len(out) >= TAIL_ENTRIES_MAX:
                    return
        except grpc.aio.AioRpcError as error:
            raise _client_error(error) from None
        finally:
            call.cancel()


class _Http(HttpClient):
    """HttpClient and a range read in the JSON form, which says the LAC it read at."""

    async def read_with_lac(
        self, ledger_id: int, first: int, last: int | None, unconfirmed: bool, out: list
    ) -> None:
        params: dict[str, Any] = {"from": first}
        if last is not None:
            params["to"] = last
        if unconfirmed:
            params["unconfirmed"] = "true"
        path = f"/v1/ledgers/{ledger_id}/entries"
        body = await self.request_json("GET", path, password=PASSWORD, params=params)
        lac = body["lac"]
        out.extend([e["entry_id"], base64.b64decode(e["data"]), lac] for e in body["entries"])

    async def tail_with_lac(self, ledger_id: int, first: int, out: list) -> None:
        async for entry in self.tail(ledger_id, PASSWORD, first):
            out.append([entry.entry_id, entry.data, None])  # below a LAC it does not show
            if len(out) >= TAIL_ENTRIES_MAX:
                return


def error_code(exc: BaseException) -> str | None:
    """The code an operation's error is recorded with; None for an error that is no
    answer of the system under test (a bug here: it propagates)."""
    if isinstance(exc, QuireClientError):
        return exc.code
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return CLIENT_TIMEOUT
    if isinstance(exc, httpx.RequestError | grpc.aio.AioRpcError | OSError):
        return CONNECTION_LOST
    return None


class Workload:
    def __init__(
        self,
        http_url: str,
        grpc_address: str,
        history: History,
        seed: int = 0,
        writers: int = 4,
        readers: int = 2,
        entries_per_ledger: int = 20,
        entry_size: int = 256,
        rate: float = 40.0,
        recover_every_s: float = 3.0,
        op_timeout_s: float = 10.0,
        quorums: Sequence[tuple[tuple[int, int, int], int]] = QUORUMS,
        create_http_url: str | None = None,
    ) -> None:
        """`rate`: appended entries per second, all writers together. `create_http_url`:
        another gateway the writers create their ledgers through, so that their appends and
        closes reach a gateway that does not hold the writer and follow its redirect."""
        self.http_url = http_url
        self.create_http_url = create_http_url
        self.grpc_address = grpc_address
        self.history = history
        self.seed = seed
        self.writers = writers
        self.readers = readers
        self.entries_per_ledger = entries_per_ledger
        self.entry_size = entry_size
        self.rate = rate
        self.recover_every_s = recover_every_s
        self.op_timeout_s = op_timeout_s
        self.quorums = quorums
        self._counts: Counter[tuple[str, str]] = Counter()
        self._counts_lock = threading.Lock()  # stats() is called from other threads
        self._created = 0
        self._active: dict[int, str] = {}  # ledger -> the writer appending to it
        self._known: list[int] = []  # every ledger created, oldest first
        self._lacs: dict[int, int] = {}  # the highest LAC seen of each ledger
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._stopped = False

    # -- running --------------------------------------------------------------------------

    def start(self) -> None:
        assert self._thread is None, "start() once"
        self._thread = threading.Thread(target=self._run, name="fault-workload", daemon=True)
        self._thread.start()
        self._started.wait()

    def stop(self) -> None:
        """Stop and join. Raises (once) if a worker died of a bug or a call outlived its
        timeout; a second stop() does nothing."""
        assert self._thread is not None and self._loop is not None and self._stopping
        if self._stopped:
            return
        with contextlib.suppress(RuntimeError):  # the loop already ended (a worker died)
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(self.op_timeout_s + STOP_GRACE_S)
        if self._thread.is_alive():
            raise RuntimeError("the workload did not stop: a call outlived its timeout")
        self._stopped = True
        if self._error is not None:
            raise RuntimeError("a workload worker failed") from self._error

    def stats(self) -> dict[str, Any]:
        """Operations by kind and outcome so far, and the ledgers created."""
        with self._counts_lock:
            counts = sorted(self._counts.items())
        by_kind: dict[str, dict[str, int]] = {}
        for (kind, result), n in counts:
            by_kind.setdefault(kind, {})[result] = n
        return {"operations": by_kind, "ledgers": self._created}

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # kept for stop() to raise in the caller's thread
            self._error = exc
            log.exception("the fault workload failed")
        finally:
            self._started.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._started.set()
        workers: list[Awaitable[None]] = []
        clients: list[QuireClient] = []
        creator: _Http | None = None
        if self.create_http_url is not None:
            creator = _Http(self.create_http_url, timeout_s=self.op_timeout_s)
            clients.append(creator)
        for i in range(self.writers):
            client = self._client(i)
            clients.append(client)
            rng = random.Random(self.seed * 1000 + i)
            workers.append(self._writer(f"writer-{i}", client, rng, creator or client))
        for i in range(self.readers):
            client = self._client(i)
            clients.append(client)
            rng = random.Random(self.seed * 1000 + 100 + i)
            workers.append(self._reader(f"reader-{i}", client, rng))
        recoverer = [self._client(0), self._client(1)]
        clients.extend(recoverer)
        workers.append(self._recoverer(recoverer, random.Random(self.seed * 1000 + 999)))
        try:
            await asyncio.gather(*workers)
        finally:
            for client in clients:
                await client.aclose()

    def _client(self, i: int) -> _Http | _Grpc:
        if i % 2 == 0:
            return _Http(self.http_url, timeout_s=self.op_timeout_s)
        return _Grpc(self.grpc_address)

    @property
    def stopping(self) -> bool:
        assert self._stopping is not None
        return self._stopping.is_set()

    async def _pause(self, seconds: float) -> None:
        """Wait `seconds`, less if stop() is called meanwhile (pacing, not a condition)."""
        assert self._stopping is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), max(seconds, 0.0))

    # -- one operation --------------------------------------------------------------------

    async def _op(
        self,
        process: str,
        kind: str,
        ledger: int | None,
        value: dict[str, Any],
        call: Callable[[], Awaitable[dict[str, Any]]],
        partial: list | None = None,
    ) -> tuple[str, str | None, dict[str, Any]]:
        """Invoke, run `call` (within the timeout), record its completion: (outcome, error
        code or None, the ok value). `partial`: a read's entries so far, recorded with an
        error too. A cancelled call is recorded `info` and the cancellation goes on."""
        op_id = self.history.invoke(process, kind, ledger, value)
        try:
            async with asyncio.timeout(self.op_timeout_s):
                result = await call()
        except asyncio.CancelledError:
            self._complete(op_id, kind, INFO, {"code": "CANCELLED"})
            raise
        except Exception as exc:
            code = error_code(exc)
            if code is None:
                self._complete(op_id, kind, INFO, {"code": "BUG", "detail": repr(exc)})
                raise
            detail = {"code": code, "detail": str(exc)[:300]}
            if partial is not None:
                detail["entries"] = partial
            result_type = outcome(kind, code)
            self._complete(op_id, kind, result_type, detail)
            return result_type, code, {}
        self._complete(op_id, kind, OK, result)
        return OK, None, result

    def _complete(self, op_id: int, kind: str, result_type: str, value: dict[str, Any]) -> None:
        self.history.complete(op_id, result_type, value)
        with self._counts_lock:
            self._counts[(kind, result_type)] += 1

    # -- writers --------------------------------------------------------------------------

    async def _writer(
        self, name: str, client: _Http | _Grpc, rng: random.Random, creator: QuireClient
    ) -> None:
        sequence = 0
        entry_period_s = self.writers / self.rate
        while not self.stopping:
            ledger_id = await self._create(name, creator, rng)
            if ledger_id is None:
                await self._pause(CREATE_RETRY_S)
                continue
            self._active[ledger_id] = name
            written, failures, fenced = 0, 0, False
            while not self.stopping and written < self.entries_per_ledger and not fenced:
                count = 1 if rng.random() < 0.5 else rng.randint(2, 5)
                payloads = [self._payload(name, ledger_id, sequence + i) for i in range(count)]
                sequence += count
                began = asyncio.get_running_loop().time()
                if isinstance(client, _Grpc) and count > 1 and rng.random() < 0.5:
                    acked, code = await self._append_stream(name, client, ledger_id, payloads)
                else:
                    acked, code = await self._append(name, client, ledger_id, payloads)
                written += acked
                failures = 0 if code is None else failures + 1
                fenced = code in LEDGER_DONE_CODES
                if failures >= APPENDS_FAILED_MAX:
                    break
                elapsed = asyncio.get_running_loop().time() - began
                await self._pause(count * entry_period_s - elapsed)
            self._active.pop(ledger_id, None)
            if not fenced:
                await self._op(name, "close", ledger_id, {}, self._closer(client, ledger_id))

    async def _create(self, name: str, client: QuireClient, rng: random.Random) -> int | None:
        shapes, weights = zip(*self.quorums, strict=True)
        ensemble, write_quorum, ack_quorum = rng.choices(shapes, weights)[0]
        value = {
            "ensemble_size": ensemble,
            "write_quorum": write_quorum,
            "ack_quorum": ack_quorum,
            "password": PASSWORD,
        }

        async def create() -> dict[str, Any]:
            ledger = await client.create(
                password=PASSWORD,
                ensemble_size=ensemble,
                write_quorum=write_quorum,
                ack_quorum=ack_quorum,
                metadata={"app": "quire-faults"},
            )
            return {"ledger_id": ledger.ledger_id}

        result_type, _, result = await self._op(name, "create", None, value, create)
        if result_type != OK:
            return None
        self._created += 1
        self._known.append(result["ledger_id"])
        del self._known[:-KNOWN_LEDGERS_MAX]
        return result["ledger_id"]

    def _payload(self, writer: str, ledger_id: int, sequence: int) -> bytes:
        head = f"{writer}|L{ledger_id}|S{sequence:08d}|".encode()
        return head + b"." * max(self.entry_size - len(head), 0)

    async def _append(
        self, name: str, client: QuireClient, ledger_id: int, payloads: list[bytes]
    ) -> tuple[int, str | None]:
        """One append call (one entry or a batch): (entries acknowledged, error code)."""

        async def append() -> dict[str, Any]:
            first, last, lac = await client.append(ledger_id, PASSWORD, payloads)
            self._lacs[ledger_id] = max(self._lacs.get(ledger_id, -1), lac)
            return {"first": first, "last": last, "lac": lac}

        value = {"payloads": payloads, "via": _via(client)}
        result_type, code, _ = await self._op(name, "append", ledger_id, value, append)
        return (len(payloads) if result_type == OK else 0), code

    async def _append_stream(
        self, name: str, client: _Grpc, ledger_id: int, payloads: list[bytes]
    ) -> tuple[int, str | None]:
        """AppendStream: each entry its own operation, invoked as the stream takes it and
        ok at its ack. An error ends the stream for every entry past the last ack: those are
        `info` whatever the code, since the gateway may have had them in an append already."""
        op_ids: list[int] = []

        async def entries() -> AsyncIterator[bytes]:
            for data in payloads:
                value = {"payloads": [data], "via": "grpc-stream"}
                op_ids.append(self.history.invoke(name, "append", ledger_id, value))
                yield data

        acked, code = 0, None
        call = client.stream_call(ledger_id, entries())
        try:
            async with asyncio.timeout(self.op_timeout_s):
                async for ack in call:
                    value = {"first": ack.entry_id, "last": ack.entry_id, "lac": ack.lac}
                    self._complete(op_ids[acked], "append", OK, value)
                    acked += 1
            if acked < len(payloads):
                code = STREAM_ENDED
        except asyncio.CancelledError:
            for op_id in op_ids[acked:]:
                self._complete(op_id, "append", INFO, {"code": "CANCELLED"})
            raise
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            error = _client_error(exc) if isinstance(exc, grpc.aio.AioRpcError) else None
            code = error.code if error is not None else CLIENT_TIMEOUT
        finally:
            call.cancel()
        if code is not None:
            for op_id in op_ids[acked:]:
                self._complete(op_id, "append", INFO, {"code": code})
        return acked, code

    @staticmethod
    def _closer(client: QuireClient, ledger_id: int) -> Callable[[], Awaitable[dict[str, Any]]]:
        async def close() -> dict[str, Any]:
            return {"last_entry_id": await client.close(ledger_id, PASSWORD)}

        return close

    # -- the recoverer ----------------------------------------------------------------------

    async def _recoverer(self, clients: list[_Http | _Grpc], rng: random.Random) -> None:
        name = "recoverer"
        while not self.stopping:
            await self._pause(self.recover_every_s * rng.uniform(0.5, 1.5))
            # Mostly a ledger a writer is still appending to; now and then one already
            # closed (a recover of a closed ledger must answer the same last entry).
            pool = list(self._active) if rng.random() < 0.9 else self._known
            if not pool or self.stopping:
                continue
            ledger_id = rng.choice(pool)
            client = rng.choice(clients)

            async def recover(c: QuireClient = client, lid: int = ledger_id) -> dict[str, Any]:
                return {"last_entry_id": await c.recover(lid, PASSWORD)}

            await self._op(name, "recover", ledger_id, {"via": _via(client)}, recover)
            await self._get(name, client, ledger_id)

    # -- readers ----------------------------------------------------------------------------

    async def _reader(self, name: str, client: _Http | _Grpc, rng: random.Random) -> None:
        while not self.stopping:
            if not self._known:
                await self._pause(0.2)
                continue
            active = list(self._active)
            ledger_id = rng.choice(active if active and rng.random() < 0.7 else self._known)
            action = rng.choice(("read", "read", "unconfirmed", "lac", "get", "tail"))
            if action in ("read", "unconfirmed"):
                await self._read(name, client, ledger_id, rng, action == "unconfirmed")
            elif action == "lac":
                await self._long_poll(name, client, ledger_id)
            elif action == "get":
                await self._get(name, client, ledger_id)
            else:
                await self._tail(name, client, ledger_id, rng)
            await self._pause(0.05)

    async def _read(
        self,
        name: str,
        client: _Http | _Grpc,
        ledger_id: int,
        rng: random.Random,
        unconfirmed: bool,
    ) -> None:
        known = self._lacs.get(ledger_id, -1)
        first = rng.randint(0, max(known, 0))
        # A confirmed read is capped at the LAC: to the end, or a span; an unconfirmed one
        # needs its end.
        last = first + rng.randint(0, READ_SPAN_MAX)
        if not unconfirmed and rng.random() < 0.5:
            last = None
        entries: list = []
        value = {"from": first, "to": last, "unconfirmed": unconfirmed, "via": _via(client)}

        async def read() -> dict[str, Any]:
            await client.read_with_lac(ledger_id, first, last, unconfirmed, entries)
            return {"entries": entries}

        await self._op(name, "read", ledger_id, value, read, partial=entries)

    async def _long_poll(self, name: str, client: QuireClient, ledger_id: int) -> None:
        after = self._lacs.get(ledger_id, -1)

        async def lac() -> dict[str, Any]:
            got = await client.read_lac(ledger_id, PASSWORD, after, LONG_POLL_MS)
            self._lacs[ledger_id] = max(self._lacs.get(ledger_id, -1), got)
            return {"lac": got}

        await self._op(name, "lac", ledger_id, {"after": after, "via": _via(client)}, lac)

    async def _get(self, name: str, client: QuireClient, ledger_id: int) -> None:
        async def get() -> dict[str, Any]:
            ledger = await client.get(ledger_id)
            return {"state": ledger.state, "last_entry_id": ledger.last_entry_id}

        await self._op(name, "get", ledger_id, {"via": _via(client)}, get)

    async def _tail(
        self, name: str, client: _Http | _Grpc, ledger_id: int, rng: random.Random
    ) -> None:
        """Follow the ledger for a moment: the tail ends with its ledger's close, at
        TAIL_ENTRIES_MAX entries, or when this reader has seen enough (TAIL_FOR_S): the
        last is this reader's choice, so an ok."""
        first = rng.randint(0, max(self._lacs.get(ledger_id, -1), 0))
        entries: list = []

        async def tail() -> dict[str, Any]:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TAIL_FOR_S):
                    await client.tail_with_lac(ledger_id, first, entries)
            return {"entries": entries}

        value = {"from": first, "to": None, "unconfirmed": False, "via": _via(client)}
        await self._op(name, "tail", ledger_id, value, tail, partial=entries)


def _via(client: QuireClient) -> str:
    return "grpc" if isinstance(client, GrpcClient) else "http"
