"""Reading a range of entries (BookKeeper's PendingReadOp, batched and flow-controlled) as a
sans-IO state machine, in the rules of the package (`shared.protocol`): `read(first, last,
now_ms)`, `step(event, now_ms)`, `tick(now_ms)`, `take_commands()`.

The rules of a range read, and why:

- **In order, bounded.** Entries are asked at most `read_ahead_max_entries` past the next
  entry not yet delivered; answers that come early wait in a reorder buffer, and
  `EntryRead`s leave `take_commands` in entry order. Memory is bounded whatever the range,
  and a consumer that stops taking (the driver stops calling) stops the asking.
- **Sticky blocks.** Each entry is asked first of its block's bookie
  (`shared.quorum.read_order`): a bookie gets runs of contiguous entries, which its
  read-ahead serves, and the blocks rotate over the ensemble.
- **A window per bookie** (AIMD, TCP's congestion window): at most `window` entries asked
  of a bookie and unanswered, in requests of at most `read_batch_entries`. It starts at
  `read_window_initial_entries`, grows by the entries answered (slow start, doubling each
  round trip; past the last halving by one entry per round trip) while answers come back
  in less than half of `speculative_read_timeout_ms` (a quarter of `read_entry_timeout_ms`
  when speculation is off), up to `read_window_max_entries`; it eases off by half a window
  a round trip while they come back slower than that whole (they queued at the bookie),
  and halves on a timeout or a TOO_MANY_REQUESTS. A request is therefore small and soon
  served, so its timeout (`read_entry_timeout_ms`) measures the bookie's progress, never
  the range's size.
- **Busy bookies back off.** A timeout or a TOO_MANY_REQUESTS also stops all sending to that
  bookie for a delay that doubles from `read_backoff_initial_ms` to `read_backoff_max_ms`
  (reset by a good answer). The entries that were waiting for it (never sent) go to their
  next replica that is not backing off, as do those of a bookie found unreachable.
- **Speculative reads** only for the entries the consumer waits for (within
  `read_batch_entries` of the next to deliver), once each: the others may just be queued.
- **A retry budget** (gRPC's retry throttling): a speculative read, or a read of another
  replica after a timeout or a TOO_MANY_REQUESTS, spends a token; an entry read without one
  earns `read_retry_budget_token_ratio`, up to `read_retry_budget_max_tokens` (the bucket
  starts full). Without a token the entry waits for the same bookie's backoff instead of
  adding load to a busy cluster. A replica that failed for good (an error, a digest
  mismatch, NO_ENTRY, unreachable) is left for the next at no cost: that is no extra load.
- **When an entry fails.** Every replica failed for good: the outcome of `_read_outcome`
  (NO_SUCH_ENTRY only if all said absent). Or `read_max_tries` rounds over its replicas all
  ended in a timeout or TOO_MANY_REQUESTS (with the defaults, nine tries of 2 s each at
  worst, each its own small request): TIMEOUT or TOO_MANY_REQUESTS, naming the entry and
  the replicas. The first failure in entry order ends the read: nothing more is sent.

Options for a reader that copies replicas (`replication.LedgerReplication`):
- **avoid**: bookies asked for an entry only once every other replica of it failed (the
  bookies being replaced: lost, or holding a damaged copy).
- **wanted**: only the entries of the range it accepts are read and delivered (a fragment's
  entries are those whose write set holds one ensemble index: with E > Qw, not all).
- **admit_until**: a consumer that keeps what it is given (until a bookie has stored it)
  paces the reader: no entry past the limit is started, whatever the read-ahead allows.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from shared.digest import DigestManager, DigestMismatch
from shared.models import LedgerMetadata
from shared.protocol.messages import (
    ABSENT,
    BookieReadReply,
    EntryRead,
    EntryReadFailed,
    ReaderCommand,
    ReadSendFailed,
    ReplicaCorrupt,
    SendReads,
    api_for_status,
)
from shared.quorum import read_order
from shared.status import ApiCode, ApiCodes, BookieStatus
from shared.wire import ReadItem, ReadResult

# One (bookie, status, detail) per failed ask; None as the status means "no answer in time".
Failure = tuple[str, BookieStatus | None, str]


@dataclass(frozen=True, slots=True)
class ReadSettings:
    """The bounds and timeouts of a LedgerReader (the gateway's come from GatewaySettings,
    where each is explained)."""

    read_entry_timeout_ms: int = 2_000
    speculative_read_timeout_ms: int = 0
    read_batch_entries: int = 64
    read_window_initial_entries: int = 16
    read_window_max_entries: int = 512
    read_ahead_max_entries: int = 4_096
    sticky_read_block_entries: int = 256
    read_retry_budget_max_tokens: float = 64.0
    read_retry_budget_token_ratio: float = 0.1
    read_backoff_initial_ms: int = 50
    read_backoff_max_ms: int = 2_000
    read_max_tries: int = 3

    def __post_init__(self) -> None:
        assert 1 <= self.read_window_initial_entries <= self.read_window_max_entries
        assert self.read_batch_entries >= 1 and self.read_ahead_max_entries >= 1
        assert self.sticky_read_block_entries >= 1 and self.read_max_tries >= 1

    @property
    def fast_reply_ms(self) -> int:
        """An answer in less than half of this grows its bookie's window; one slower than
        this shrinks it."""
        return self.speculative_read_timeout_ms or max(self.read_entry_timeout_ms // 4, 1)


@dataclass(slots=True)
class _PendingRead:
    entry_id: int
    replicas: tuple[str, ...]  # preference order (read_order)
    asked: dict[str, int] = field(default_factory=dict)  # outstanding asks: bookie -> sent ms
    queued: str | None = None  # the bookie whose queue holds it, waiting for window room
    spent: frozenset[str] = frozenset()  # replicas that failed for good
    failures: tuple[Failure, ...] = ()
    transient_failures: int = 0  # timeouts and TOO_MANY_REQUESTS
    retried: bool = False  # asked of another replica for a retry or speculatively
    speculated: bool = False


@dataclass(slots=True)
class _BookieFlow:
    """One bookie's side of a read: its window, what is asked of it, what waits for it."""

    window: float
    threshold: float  # slow start below it, one entry per round trip above
    asked: dict[int, int] = field(default_factory=dict)  # entry -> sent ms, in send order
    queue: list[int] = field(default_factory=list)  # a heap of entry ids: asked in order
    to_send: list[int] = field(default_factory=list)  # asked at this step, not yet taken
    backoff_ms: int = 0
    resume_ms: int = 0  # nothing is sent to it before (its backoff)


class LedgerReader:
    """Reads entries first..last of one ledger (see the module's rules); each entry from its
    replicas, verifying digests, moving on after errors, timeouts and digest mismatches."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        digest: DigestManager,
        settings: ReadSettings | None = None,
        *,
        avoid: Collection[str] = (),
    ) -> None:
        self.metadata = metadata
        self._avoid = frozenset(avoid)
        self.ledger_id = metadata.ledger_id
        self.quorum = metadata.quorum
        self._digest = digest
        self.settings = settings or ReadSettings()
        self._tokens = self.settings.read_retry_budget_max_tokens
        self._pending: dict[int, _PendingRead] = {}
        self._results: dict[int, EntryRead | EntryReadFailed] = {}  # the reorder buffer
        self._flows: dict[str, _BookieFlow] = {}
        self._replicas_cached: dict[tuple[int, tuple[int, ...]], tuple[str, ...]] = {}
        self._unreachable: set[str] = set()  # chosen only when no other replica will do
        self._commands: list[ReaderCommand] = []
        self._started = False
        self._ended = False
        self._last = -1
        self._wanted: Callable[[int], bool] | None = None  # None: every entry of the range
        self._admit_limit: int | None = None  # None: only the read-ahead bounds the reading
        self.next_entry_id = 0  # the next entry to deliver
        self._next_admitted = 0  # the next entry to start reading
        # Counters, for the driver's metrics and the tests.
        self.speculative_reads = 0
        self.retries = 0  # another replica asked after a timeout or TOO_MANY_REQUESTS
        self.retries_refused = 0  # ... or a speculative read, refused by the retry budget
        self.backoffs = 0

    @property
    def done(self) -> bool:
        """Every entry was delivered, or a failure ended the read."""
        return self._started and (self._ended or self.next_entry_id > self._last)

    @property
    def buffered(self) -> int:
        """Entries started and not yet delivered (pending or in the reorder buffer)."""
        return max(self._next_admitted - self.next_entry_id, 0)

    def window(self, bookie_id: str) -> float:
        flow = self._flows.get(bookie_id)
        return flow.window if flow else self.settings.read_window_initial_entries

    def in_flight(self, bookie_id: str) -> int:
        flow = self._flows.get(bookie_id)
        return len(flow.asked) if flow else 0

    def read(
        self,
        first: int,
        last: int,
        now_ms: int,
        *,
        wanted: Callable[[int], bool] | None = None,
        admit_until: int | None = None,
    ) -> None:
        """Start reading entries first..last (inclusive; empty when last < first); with
        `wanted`, only the entries it accepts; with `admit_until`, none past it for now."""
        assert not self._started and first >= 0
        self._started = True
        self.next_entry_id = self._next_admitted = first
        self._last = last
        self._wanted = wanted
        self._admit_limit = admit_until
        self._pump(now_ms)

    def admit_until(self, entry_id: int, now_ms: int) -> None:
        """Entries up to `entry_id` may now be started (the consumer made room)."""
        assert self._admit_limit is not None, "a reader paced by admit_until from its start"
        if entry_id > self._admit_limit:
            self._admit_limit = entry_id
            self._pump(now_ms)

    # -- events -------------------------------------------------------------------------------

    def step(self, event: BookieReadReply | ReadSendFailed, now_ms: int) -> None:
        match event:
            case BookieReadReply():
                self._on_reply(event, now_ms)
            case ReadSendFailed():
                self._on_send_failed(event, now_ms)
            case _:
                raise AssertionError(f"unknown event {event!r}")
        self._pump(now_ms)

    def _on_send_failed(self, event: ReadSendFailed, now_ms: int) -> None:
        # A timeout is a busy bookie; an undeliverable request is as good as the bookie's
        # own IO_ERROR (it is down: the entries still to come are asked of others first).
        if event.timed_out:
            if self._outstanding(event.bookie_id, event.entry_ids):
                self._bookie_busy(event.bookie_id, now_ms)
            status = None
        else:
            self._unreachable.add(event.bookie_id)
            if event.bookie_id in self._flows:
                self._reroute(event.bookie_id, now_ms)
            status = BookieStatus.IO_ERROR
        for entry_id in event.entry_ids:
            self._replica_failed(entry_id, event.bookie_id, status, event.reason, now_ms)

    def _on_reply(self, event: BookieReadReply, now_ms: int) -> None:
        bookie_id = event.bookie_id
        if event.status is not BookieStatus.OK:
            if event.status is BookieStatus.TOO_MANY_REQUESTS and self._outstanding(
                bookie_id, event.entry_ids
            ):
                self._bookie_busy(bookie_id, now_ms)
            for entry_id in event.entry_ids:
                self._replica_failed(
                    entry_id, bookie_id, event.status, f"answered {event.status.name}", now_ms
                )
            return
        flow = self._flows.get(bookie_id)
        sent_ms = [flow.asked[e] for e in event.entry_ids if e in flow.asked] if flow else []
        if sent_ms and any(r.status is BookieStatus.TOO_MANY_REQUESTS for r in event.results):
            self._bookie_busy(bookie_id, now_ms)  # refused some: as busy as refusing all
        answered = set()
        for result in event.results:
            if result.ledger_id != self.ledger_id or result.entry_id not in event.entry_ids:
                continue
            answered.add(result.entry_id)
            self._on_result(bookie_id, result, now_ms)
        if answered and sent_ms:
            self._bookie_answered(bookie_id, len(answered), now_ms - min(sent_ms))
        missing = [e for e in event.entry_ids if e not in answered]
        if missing and answered:
            # A partial answer (the reply had to fit one message): ask that bookie again.
            for entry_id in missing:
                pending = self._pending.get(entry_id)
                if pending is not None and bookie_id in pending.asked:
                    self._forget_ask(pending, bookie_id)
                    if pending.queued is None:
                        self._enqueue(pending, bookie_id)
        else:
            for entry_id in missing:
                self._replica_failed(
                    entry_id,
                    bookie_id,
                    BookieStatus.IO_ERROR,
                    "answered without this entry",
                    now_ms,
                )

    def _on_result(self, bookie_id: str, result: ReadResult, now_ms: int) -> None:
        pending = self._pending.get(result.entry_id)
        if pending is None or bookie_id not in pending.replicas:
            return
        if result.status is not BookieStatus.OK:
            self._replica_failed(
                result.entry_id, bookie_id, result.status, f"answered {result.status.name}", now_ms
            )
            return
        try:
            lac, length = self._digest.check(result.frame, self.ledger_id, result.entry_id)
        except DigestMismatch as exc:
            self._commands.append(ReplicaCorrupt(bookie_id, result.entry_id, str(exc)))
            self._replica_failed(result.entry_id, bookie_id, BookieStatus.CORRUPT, str(exc), now_ms)
            return
        # Any replica's good answer will do, even a late one from a replica we gave up on.
        self._unreachable.discard(bookie_id)
        for asked in list(pending.asked):
            self._forget_ask(pending, asked)
        del self._pending[result.entry_id]
        if not pending.retried:
            self._earn_token()
        # One object per entry: the payload goes straight from the frame into the EntryRead.
        self._results[result.entry_id] = EntryRead(
            result.entry_id, self._digest.payload(result.frame), lac, length
        )

    def _replica_failed(
        self, entry_id: int, bookie_id: str, status: BookieStatus | None, detail: str, now_ms: int
    ) -> None:
        pending = self._pending.get(entry_id)
        if pending is None or bookie_id not in pending.asked:
            return  # decided already, or a late answer from a replica we moved past
        self._forget_ask(pending, bookie_id)
        pending.failures += ((bookie_id, status, detail),)
        transient = status is None or status is BookieStatus.TOO_MANY_REQUESTS
        if transient:
            pending.transient_failures += 1
        else:
            pending.spent |= {bookie_id}
        if pending.asked or pending.queued is not None:
            return  # another replica is on it (a speculative read)
        tries_max = self.settings.read_max_tries * len(pending.replicas)
        if len(pending.spent) == len(pending.replicas) or pending.transient_failures >= tries_max:
            self._fail(pending)
            return
        following = self._choose(pending, now_ms, avoid=bookie_id)
        if transient and following != bookie_id:
            if self._spend_token():
                self.retries += 1
                pending.retried = True
            else:
                self.retries_refused += 1
                following = bookie_id  # after its backoff, not on top of a busy cluster
        self._enqueue(pending, following)

    def _fail(self, pending: _PendingRead) -> None:
        del self._pending[pending.entry_id]
        api, summary = _read_outcome(pending.failures)
        self._results[pending.entry_id] = EntryReadFailed(
            pending.entry_id, api, f"entry {pending.entry_id}: {summary}"
        )

    def tick(self, now_ms: int) -> None:
        """Asks older than read_entry_timeout_ms have failed (their bookie is busy); an entry
        that holds up delivery (within read_batch_entries of the next to deliver), asked
        longer ago than speculative_read_timeout_ms, gets its next replica asked too, once,
        if the retry budget allows."""
        settings = self.settings
        for bookie_id, flow in list(self._flows.items()):  # a retry may add a bookie's flow
            expired = []
            for entry_id, sent_ms in flow.asked.items():  # in send order: oldest first
                if now_ms - sent_ms < settings.read_entry_timeout_ms:
                    break
                expired.append(entry_id)
            if expired:
                self._bookie_busy(bookie_id, now_ms)
                detail = f"no answer within {settings.read_entry_timeout_ms} ms"
                for entry_id in expired:
                    self._replica_failed(entry_id, bookie_id, None, detail, now_ms)
            if settings.speculative_read_timeout_ms:
                self._speculate(flow, now_ms)
        self._pump(now_ms)

    def _speculate(self, flow: _BookieFlow, now_ms: int) -> None:
        for entry_id, sent_ms in flow.asked.items():
            if now_ms - sent_ms < self.settings.speculative_read_timeout_ms:
                break
            if entry_id >= self.next_entry_id + self.settings.read_batch_entries:
                break  # only entries the consumer waits for now: the rest may just queue
            pending = self._pending[entry_id]
            if pending.speculated or pending.queued is not None:
                continue
            others = [
                b for b in pending.replicas if b not in pending.spent and b not in pending.asked
            ]
            if not others:
                continue
            pending.speculated = True  # once per entry, whether the budget allows it or not
            if not self._spend_token():
                self.retries_refused += 1
                continue
            self.speculative_reads += 1
            pending.retried = True
            self._enqueue(pending, others[0])

    # -- bookies: windows and backoff ---------------------------------------------------------

    def _flow(self, bookie_id: str) -> _BookieFlow:
        flow = self._flows.get(bookie_id)
        if flow is None:
            max_entries = self.settings.read_window_max_entries
            flow = _BookieFlow(self.settings.read_window_initial_entries, max_entries)
            self._flows[bookie_id] = flow
        return flow

    def _outstanding(self, bookie_id: str, entry_ids: Sequence[int]) -> bool:
        flow = self._flows.get(bookie_id)
        return flow is not None and any(e in flow.asked for e in entry_ids)

    def _bookie_answered(self, bookie_id: str, entries: int, latency_ms: int) -> None:
        """Grow the window while answers are quick; ease it off while they are slow (they
        queued at the bookie behind the rest of the window): by half a window a round trip,
        so what is asked stays about what the bookie serves in fast_reply_ms."""
        flow = self._flow(bookie_id)
        flow.backoff_ms = 0
        fast_reply_ms = self.settings.fast_reply_ms
        if latency_ms >= fast_reply_ms:
            flow.window = max(flow.window - entries / 2, 1.0)
            flow.threshold = min(flow.threshold, flow.window)
            return
        if latency_ms >= fast_reply_ms // 2:
            return
        if flow.window < flow.threshold:
            flow.window += entries
        else:
            flow.window += entries / flow.window
        flow.window = min(flow.window, self.settings.read_window_max_entries)

    def _bookie_busy(self, bookie_id: str, now_ms: int) -> None:
        settings = self.settings
        flow = self._flow(bookie_id)
        flow.window = max(flow.window / 2, 1.0)
        flow.threshold = flow.window
        flow.backoff_ms = min(
            max(flow.backoff_ms * 2, settings.read_backoff_initial_ms), settings.read_backoff_max_ms
        )
        flow.resume_ms = now_ms + flow.backoff_ms
        self.backoffs += 1
        self._reroute(bookie_id, now_ms)

    def _reroute(self, bookie_id: str, now_ms: int) -> None:
        """The entries waiting for a bookie that backs off or is unreachable go to their
        next replica that is neither: they were never sent, so that adds no load."""
        flow = self._flows[bookie_id]
        waiting, flow.queue = flow.queue, []
        for entry_id in waiting:
            pending = self._pending.get(entry_id)
            if pending is None or pending.queued != bookie_id:
                continue
            self._enqueue(pending, self._choose(pending, now_ms, avoid=bookie_id))

    def _choose(self, pending: _PendingRead, now_ms: int, avoid: str | None = None) -> str:
        """The first replica in preference order after `avoid` (around the ring, so that
        retries visit every replica) that has not failed for good, is reachable and is not
        backing off; else the first that has not failed for good; else `avoid` (the entry
        waits for it)."""
        replicas = pending.replicas
        if avoid is None and not pending.spent and not self._unreachable:  # the usual case
            flow = self._flows.get(replicas[0])
            if flow is None or flow.resume_ms <= now_ms:
                return replicas[0]
        if avoid in replicas:
            after = replicas.index(avoid) + 1
            replicas = replicas[after:] + replicas[:after]
        live = [b for b in replicas if b != avoid and b not in pending.spent]
        for bookie_id in live:
            flow = self._flows.get(bookie_id)
            if bookie_id not in self._unreachable and (flow is None or flow.resume_ms <= now_ms):
                return bookie_id
        if live:
            return live[0]
        assert avoid is not None, "an entry with every replica spent has failed"
        return avoid

    def _spend_token(self) -> bool:
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def _earn_token(self) -> None:
        settings = self.settings
        self._tokens = min(
            self._tokens + settings.read_retry_budget_token_ratio,
            settings.read_retry_budget_max_tokens,
        )

    # -- the pipeline: deliver in order, start more, send what fits ---------------------------

    def _pump(self, now_ms: int) -> None:
        self._deliver()
        if self._ended:
            return
        self._admit(now_ms)
        self._dispatch(now_ms)

    def _deliver(self) -> None:
        wanted = self._wanted
        while not self._ended:
            if self.next_entry_id in self._results:
                outcome = self._results.pop(self.next_entry_id)
                self._commands.append(outcome)
                self.next_entry_id += 1
                if isinstance(outcome, EntryReadFailed):
                    self._end()
            elif (
                wanted is not None
                and self.next_entry_id <= self._last
                and not wanted(self.next_entry_id)
            ):
                self.next_entry_id += 1  # not asked for: nothing to deliver
            else:
                break

    def _end(self) -> None:
        """A failure was delivered: the read is over, what is in flight is abandoned."""
        self._ended = True
        self._pending.clear()
        self._results.clear()
        self._flows.clear()

    def _admit(self, now_ms: int) -> None:
        settings = self.settings
        limit = min(self._last, self.next_entry_id + settings.read_ahead_max_entries - 1)
        if self._admit_limit is not None:
            limit = min(limit, self._admit_limit)
        # Entries not wanted are passed over by the delivery without being started.
        self._next_admitted = max(self._next_admitted, self.next_entry_id)
        wanted = self._wanted
        while self._next_admitted <= limit:
            entry_id = self._next_admitted
            self._next_admitted += 1
            if wanted is not None and not wanted(entry_id):
                continue
            pending = _PendingRead(entry_id, self._replicas(entry_id))
            self._pending[entry_id] = pending
            self._enqueue(pending, self._choose(pending, now_ms))

    def _replicas(self, entry_id: int) -> tuple[str, ...]:
        segments = self.metadata.segments
        segment = segments[0] if len(segments) == 1 else self.metadata.segment_for(entry_id)
        order = read_order(entry_id, self.quorum, self.settings.sticky_read_block_entries)
        key = (segment.first_entry_id, order)
        replicas = self._replicas_cached.get(key)
        if replicas is None:  # at most E x E orders per segment
            replicas = tuple(segment.bookies[i] for i in order)
            if self._avoid:
                # Stable: the preferred order among the rest, the avoided ones last.
                replicas = tuple(sorted(replicas, key=lambda b: b in self._avoid))
            self._replicas_cached[key] = replicas
        return replicas

    def _enqueue(self, pending: _PendingRead, bookie_id: str) -> None:
        pending.queued = bookie_id
        heapq.heappush(self._flow(bookie_id).queue, pending.entry_id)

    def _forget_ask(self, pending: _PendingRead, bookie_id: str) -> None:
        del pending.asked[bookie_id]
        flow = self._flows.get(bookie_id)
        if flow is not None:
            flow.asked.pop(pending.entry_id, None)

    def _dispatch(self, now_ms: int) -> None:
        for bookie_id, flow in self._flows.items():
            if now_ms < flow.resume_ms:
                continue
            while flow.queue and len(flow.asked) < flow.window:
                entry_id = heapq.heappop(flow.queue)
                pending = self._pending.get(entry_id)
                if pending is None or pending.queued != bookie_id:
                    continue  # read meanwhile, or queued elsewhere since
                pending.queued = None
                pending.asked[bookie_id] = now_ms
                flow.asked[entry_id] = now_ms
                flow.to_send.append(entry_id)

    def take_commands(self) -> list[ReaderCommand]:
        """The reads to send (one request per bookie and `read_batch_entries`), then the
        entries delivered in order, the corrupt replicas to report, and a failure last."""
        sends: list[ReaderCommand] = []
        batch = self.settings.read_batch_entries
        for bookie_id, flow in self._flows.items():
            entry_ids, flow.to_send = flow.to_send, []
            for start in range(0, len(entry_ids), batch):
                chunk = entry_ids[start : start + batch]
                sends.append(
                    SendReads(bookie_id, tuple(ReadItem(self.ledger_id, e) for e in chunk))
                )
        commands, self._commands = self._commands, []
        return [*sends, *commands]


def _read_outcome(failures: Sequence[Failure]) -> tuple[ApiCode, str]:
    """NO_ENTRY from every replica is a definite NO_SUCH_ENTRY; otherwise the first other
    failure decides (a replica that did not answer may hold the entry). The summary names
    each replica once, with its last failure and how many there were."""
    last: dict[str, tuple[str, int]] = {}
    for bookie, _, detail in failures:
        last[bookie] = (detail, last.get(bookie, ("", 0))[1] + 1)
    summary = "; ".join(
        f"{bookie}: {detail}" + (f" ({count} times)" if count > 1 else "")
        for bookie, (detail, count) in last.items()
    )
    for _, status, _ in failures:
        if status is None:
            return ApiCodes.TIMEOUT, summary
        if status not in ABSENT:
            return api_for_status(status), summary
    return ApiCodes.NO_SUCH_ENTRY, summary


def lac_from_replies(replies: Sequence[tuple[BookieStatus, int]]) -> int | None:
    """The LAC from the read_lac answers of a segment's bookies: the highest one (each
    bookie's LAC is a lower bound of the real one). -1 if every bookie knows nothing of the
    ledger; None if none answered usefully."""
    values = [lac for status, lac in replies if status is BookieStatus.OK]
    if values:
        return max(values)
    if replies and all(status in ABSENT for status, _ in replies):
        return -1
    return None
