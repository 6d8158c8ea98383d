"""Re-replication of a ledger's fragments on bad bookies (BookKeeper's LedgerChecker,
LedgerFragmentReplicator and the copy loop of its ReplicationWorker) as a sans-IO state
machine, in the rules of the package (`shared.protocol`): no IO, no clock, no randomness;
`step(event, now_ms)`, `tick(now_ms)`, `take_commands()`. Its phases
(`ReplicationPhase`) change only as `_TRANSITIONS` allows.

What is copied (`fragments_on`): a fragment is one segment x one ensemble index whose
bookie is bad; its entries are those of the segment's range (up to the next segment's
first entry - 1; for the last segment of a CLOSED ledger, up to its last entry) whose
write set holds that index. A bad bookie named where it holds no entry (an empty last
segment of a closed ledger) is replaced too, with nothing to copy. The last segment of a
ledger that is not closed is still being written: it is left out (`open_fragment_on`
says whether there is one; the worker fences and recovers such a ledger first, as
BookKeeper's does after its grace period).

How, one fragment after the other:
1. choose a replacement among the writable bookies (asked once) that is neither bad nor in
   the segment's ensemble, at random (a seeded generator), the same one for the same bad
   bookie across the ledger's segments when it may be;
2. read the fragment's entries with the flow-controlled `LedgerReader` (digests checked;
   the bad bookies asked only when every other replica failed), re-sign each into the very
   frame it was written as (same LAC and length: frames are deterministic), and send them
   to the replacement as recovery adds (which pass a fence), at most
   `rereplication_entry_batch_size` a request and `rereplication_batches_in_flight`
   requests unanswered; an entry is kept until the replacement stored it, and the reader
   starts no entry more than `max_buffered_entries` past the oldest kept one, so memory
   is bounded whatever the fragment's size. A failed add is retried
   (`rereplication_add_tries` in all), then the replication fails. The copies are
   throttled to `replication_rate_by_bytes` (a token bucket on `now_ms`).
3. once every entry is durable on the replacement (never before: no entry is lost), CAS
   the metadata: that segment's bookie at that index replaced. A lost CAS is merged as
   BookKeeper's MetadataUpdateLoop does: a writer's ensemble change (a new last segment)
   or a close leaves our segment as it was, so the replacement is applied to the stored
   segment that starts at the same entry if it still names the bad bookie at that index,
   and the CAS goes again; a segment someone else already repaired is done; a segment
   that no longer exists as such fails the replication cleanly.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import Enum

from shared.digest import DigestManager, LedgerKeys
from shared.models import LedgerMetadata, LedgerState, Segment, UpdateLedgerRequest
from shared.protocol.ensemble import RandomLike
from shared.protocol.messages import (
    AddSendFailed,
    BookieAddReply,
    BookieReadReply,
    EntryRead,
    EntryReadFailed,
    Fragment,
    FragmentReplicated,
    LedgerUpdated,
    LedgerUpdateFailed,
    ListWritableBookies,
    ReadSendFailed,
    ReplicaCorrupt,
    ReplicationCommand,
    ReplicationDone,
    ReplicationEvent,
    ReplicationFailed,
    SendAdds,
    SendReads,
    UpdateLedger,
    WritableBookies,
    api_for_status,
)
from shared.protocol.placement import DEFAULT_LOCATION, PlacementPolicy
from shared.protocol.reader import LedgerReader, ReadSettings
from shared.quorum import QuorumSpec, write_set
from shared.rate_limit import ByteRateLimiter
from shared.status import ApiCode, ApiCodes, BookieStatus, QuireError
from shared.wire import AddItem, add_flags

__all__ = [
    "Fragment",
    "LedgerReplication",
    "ReplicationPhase",
    "ReplicationSettings",
    "ByteRateLimiter",
    "Place",
    "fragments_on",
    "open_fragment_on",
    "places_of",
    "segment_range",
    "stored_ends",
    "stored_entry_ids",
]

# A bookie that refuses the ledger's key will refuse it again: no retry.
_FATAL_ADD = frozenset({BookieStatus.UNAUTHORIZED})


@dataclass(frozen=True, slots=True)
class ReplicationSettings:
    """The bounds of a replication (BookKeeper's rereplicationEntryBatchSize and
    replicationRateByBytes, snake_case), and the reader's."""

    rereplication_entry_batch_size: int = 10  # entries per add request to the replacement
    rereplication_batches_in_flight: int = 4  # add requests unanswered at once
    replication_rate_by_bytes: int = -1  # frame bytes a second; -1: unthrottled
    rereplication_add_tries: int = 3  # sends of one entry before the replication fails
    read: ReadSettings = field(default_factory=ReadSettings)

    def __post_init__(self) -> None:
        assert self.rereplication_entry_batch_size >= 1
        assert self.rereplication_batches_in_flight >= 1
        assert self.rereplication_add_tries >= 1
        assert self.replication_rate_by_bytes == -1 or self.replication_rate_by_bytes > 0

    @property
    def max_buffered_entries(self) -> int:
        """Entries read (or being read) and not yet stored on the replacement, at most."""
        return self.rereplication_entry_batch_size * self.rereplication_batches_in_flight


# -- which fragments --------------------------------------------------------------------------


def segment_range(metadata: LedgerMetadata, position: int) -> tuple[int, int | None]:
    """Inclusive [first, last] entry ids of the segment at `position` in the segment list;
    last None: the open last segment of a ledger that is not closed. An empty range (a
    closed ledger's segment past its last entry) has last < first."""
    segments = metadata.segments
    first = segments[position].first_entry_id
    closed = metadata.state is LedgerState.CLOSED
    last_entry_id = metadata.last_entry_id if metadata.last_entry_id is not None else -1
    if position + 1 < len(segments):
        last = segments[position + 1].first_entry_id - 1
        # A closed ledger holds nothing past its last entry, whatever its segments say.
        return first, min(last, last_entry_id) if closed else last
    return first, last_entry_id if closed else None


def stored_entry_ids(quorum: QuorumSpec, first: int, last: int, index: int) -> Iterator[int]:
    """The entries of first..last stored at ensemble index `index`: those whose write set
    holds it. The one definition of what a bookie of a segment stores, for the replicator,
    the auditor (`shared.autorecovery`) and the bench."""
    for entry_id in range(first, last + 1):
        if index in write_set(entry_id, quorum):
            yield entry_id


def stored_ends(quorum: QuorumSpec, first: int, last: int, index: int) -> tuple[int, int] | None:
    """The first and the last entry of first..last stored at ensemble index `index`; None:
    it stores none of them."""
    # Each ensemble index recurs every E entries: the first and last stored entries are
    # within E of the range's ends, so this looks at no more than 2E entries.
    size = quorum.ensemble_size
    head = next(stored_entry_ids(quorum, first, min(last, first + size - 1), index), None)
    if head is None:
        return None
    *_, tail = stored_entry_ids(quorum, max(first, last - size + 1), last, index)
    return head, tail


@dataclass(frozen=True, slots=True)
class Place:
    """Where the segment at `position` names `bookie_id`, at `ensemble_index`, with the
    segment's range (`segment_range`: last_entry_id None when the segment is open)."""

    position: int
    first_entry_id: int
    last_entry_id: int | None
    ensemble_index: int
    bookie_id: str


def places_of(metadata: LedgerMetadata, bookie_ids: Collection[str]) -> Iterator[Place]:
    """Every place a segment names one of `bookie_ids`, in segment order then ensemble
    index, whether it stores entries there or not."""
    wanted = set(bookie_ids)
    for position, segment in enumerate(metadata.segments):
        first, last = segment_range(metadata, position)
        for index, bookie_id in enumerate(segment.bookies):
            if bookie_id in wanted:
                yield Place(position, first, last, index, bookie_id)


def fragments_on(metadata: LedgerMetadata, bookie_ids: Collection[str]) -> list[Fragment]:
    """The fragments stored on `bookie_ids` that hold entries, in entry order then ensemble
    index; without the open last segment of a ledger that is not closed."""
    quorum = metadata.quorum
    return [
        f
        for f in _named_on(metadata, bookie_ids)
        if stored_ends(quorum, f.first_entry_id, f.last_entry_id, f.ensemble_index) is not None
    ]


def _named_on(metadata: LedgerMetadata, bookie_ids: Collection[str]) -> list[Fragment]:
    """Every place a segment that is not open names one of `bookie_ids`, as a fragment,
    holding entries or not (an empty segment of a closed ledger, an index no entry of a
    short segment uses): those too get their replacement, so that the metadata stops
    naming a lost bookie."""
    return [
        Fragment(p.first_entry_id, p.first_entry_id, p.last_entry_id, p.ensemble_index, p.bookie_id)
        for p in places_of(metadata, bookie_ids)
        if p.last_entry_id is not None
    ]


def open_fragment_on(metadata: LedgerMetadata, bookie_ids: Collection[str]) -> bool:
    """The ledger is not closed and its last segment (still written) names one of them."""
    if metadata.state is LedgerState.CLOSED:
        return False
    return any(b in bookie_ids for b in metadata.segments[-1].bookies)


def _segment_at(metadata: LedgerMetadata, first_entry_id: int) -> Segment | None:
    for segment in metadata.segments:
        if segment.first_entry_id == first_entry_id:
            return segment
    return None


# -- throttling -------------------------------------------------------------------------------


# -- the core ---------------------------------------------------------------------------------


class ReplicationPhase(Enum):
    LIST = "list"  # asking for the writable bookies
    COPY = "copy"  # copying one fragment's entries to its replacement
    UPDATE = "update"  # the CAS naming the replacement is in flight
    DONE = "done"
    FAILED = "failed"


# Every phase change a replication may make, and no other: `_enter` raises on the rest.
_TRANSITIONS: dict[ReplicationPhase, frozenset[ReplicationPhase]] = {
    ReplicationPhase.LIST: frozenset(
        {ReplicationPhase.COPY, ReplicationPhase.DONE, ReplicationPhase.FAILED}
    ),
    ReplicationPhase.COPY: frozenset({ReplicationPhase.UPDATE, ReplicationPhase.FAILED}),
    ReplicationPhase.UPDATE: frozenset(
        {ReplicationPhase.COPY, ReplicationPhase.DONE, ReplicationPhase.FAILED}
    ),
    ReplicationPhase.DONE: frozenset(),
    ReplicationPhase.FAILED: frozenset(),
}
_FINAL = frozenset({ReplicationPhase.DONE, ReplicationPhase.FAILED})


@dataclass(slots=True)
class _Copy:
    """One fragment being copied to its replacement."""

    fragment: Fragment
    target: str
    reader: LedgerReader
    kept: dict[int, bytes] = field(default_factory=dict)  # read, not yet stored: its frame
    queued: list[int] = field(default_factory=list)  # a heap of kept entries to send
    sends: set[tuple[int, ...]] = field(default_factory=set)  # unanswered SendAdds
    tries: dict[int, int] = field(default_factory=dict)  # failed sends of an entry
    read_done: bool = False
    entries: int = 0
    bytes: int = 0
    placement_fallback: str = ""  # why the target breaks the placement policy, if it does

    @property
    def complete(self) -> bool:
        return self.read_done and not self.kept


class LedgerReplication:
    """Copy every fragment of one ledger stored on `bad_bookies` to a replacement and store
    each replacement in the metadata (see the module's rules)."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        bad_bookies: Iterable[str],
        keys: LedgerKeys,
        now_ms: int,
        *,
        settings: ReplicationSettings | None = None,
        rng: RandomLike | None = None,
        placement: PlacementPolicy | None = None,
    ) -> None:
        self.metadata = metadata
        self.ledger_id = metadata.ledger_id
        self.quorum = metadata.quorum
        self.bad_bookies = frozenset(bad_bookies)
        self.master_key = keys.master_key
        self.settings = settings or ReplicationSettings()
        self._digest = DigestManager.for_keys(metadata.digest, keys)
        self._flags = add_flags(metadata.digest, recovery=True)
        self._rng = rng
        self.placement = placement or PlacementPolicy()
        self._now_ms = now_ms
        self._throttle = ByteRateLimiter(self.settings.replication_rate_by_bytes, now_ms)
        self.phase = ReplicationPhase.LIST
        self.error: QuireError | None = None
        # Those without entries too: nothing to copy, the replacement stored all the same.
        self.fragments = _named_on(metadata, self.bad_bookies)
        self._next_fragment = 0
        self._writable: frozenset[str] = frozenset()
        self._located: dict[str, str] = {}  # bookie -> network location, of those known
        self._chosen: dict[str, str] = {}  # bad bookie -> its replacement so far
        self._copy: _Copy | None = None
        self._commands: list[ReplicationCommand] = []
        # What was done, for the driver's result and the tests.
        self.replicated: list[FragmentReplicated] = []
        self.repaired_by_others = 0  # fragments someone else replaced meanwhile
        self.entries_copied = 0
        self.bytes_copied = 0
        self.buffered_max = 0  # the most entries held at once (kept + being read)
        if self.fragments:
            self._commands.append(ListWritableBookies())
        else:
            self._finish()

    @property
    def done(self) -> bool:
        return self.phase in _FINAL

    @property
    def buffered(self) -> int:
        """Entries held now: read and not yet stored on the replacement, or being read."""
        copy = self._copy
        return 0 if copy is None else len(copy.kept) + copy.reader.buffered

    def _enter(self, phase: ReplicationPhase) -> None:
        if phase not in _TRANSITIONS[self.phase]:
            raise AssertionError(
                f"replication phase {self.phase.value} -> {phase.value} not allowed"
            )
        self.phase = phase

    # -- 1. the next fragment and its replacement -----------------------------------------------

    def _start_next(self) -> None:
        """Start copying the next fragment that still needs it; done when none is left."""
        while self._next_fragment < len(self.fragments):
            fragment = self.fragments[self._next_fragment]
            self._next_fragment += 1
            segment = _segment_at(self.metadata, fragment.segment_first_entry_id)
            if segment is None:
                self._fail(ApiCodes.UNAVAILABLE, f"{self._name(fragment)}: its segment is gone")
                return
            if segment.bookies[fragment.ensemble_index] != fragment.bookie_id:
                self.repaired_by_others += 1
                continue
            try:
                target, fallback = self._choose_target(fragment, segment)
            except QuireError as exc:
                self._fail(exc.api, f"{self._name(fragment)}: {exc.detail}")
                return
            if target is None:
                self._fail(
                    ApiCodes.NOT_ENOUGH_BOOKIES,
                    f"{self._name(fragment)}: no writable bookie outside its ensemble "
                    f"{segment.bookies} and the bad bookies",
                )
                return
            self._start_copy(fragment, target, fallback)
            return
        self._finish()

    def _choose_target(self, fragment: Fragment, segment: Segment) -> tuple[str | None, str]:
        """The fragment's new bookie (None: no writable one outside the ensemble and the bad
        bookies) and, when it breaks the placement policy, why. The random policy keeps one
        replacement per bad bookie across its segments; the others place each segment's
        by its write quorums (BookKeeper's replaceBookie), with every bad bookie of the
        segment open at once: bookies the auditor marked to fix the placement are moved
        together (a pair in a row of one rack may need both moved). Raises QuireError when
        an enforced policy finds none."""
        excluded = self.bad_bookies | set(segment.bookies)
        spare = self._writable - excluded
        if not spare:
            return None, ""
        positions = [fragment.ensemble_index]
        if self.placement.name == "random":
            previous = self._chosen.get(fragment.bookie_id)
            if previous is not None and previous not in excluded:
                return previous, ""
        else:
            bad = [i for i, b in enumerate(segment.bookies) if b in self.bad_bookies]
            if len(bad) <= len(spare):
                positions = bad
        writable = {b: self._located.get(b, DEFAULT_LOCATION) for b in self._writable}
        placed = self.placement.replace(
            segment.bookies,
            self.quorum.write_quorum,
            positions,
            writable,
            self._rng,
            excluded=self.bad_bookies,
            known=self._located,
        )
        chosen = placed.bookies[fragment.ensemble_index]
        self._chosen[fragment.bookie_id] = chosen
        return chosen, placed.reason if placed.fallback else ""

    # -- 2. copy ----------------------------------------------------------------------------------

    def _start_copy(self, fragment: Fragment, target: str, fallback: str) -> None:
        self._enter(ReplicationPhase.COPY)
        settings = self.settings
        buffered = settings.max_buffered_entries
        read_settings = settings.read
        if read_settings.read_ahead_max_entries > buffered:
            read_settings = _bounded_read_ahead(read_settings, buffered)
        reader = LedgerReader(self.metadata, self._digest, read_settings, avoid=self.bad_bookies)
        self._copy = _Copy(fragment, target, reader, placement_fallback=fallback)
        index, quorum = fragment.ensemble_index, self.quorum
        reader.read(
            fragment.first_entry_id,
            fragment.last_entry_id,
            self._now_ms,
            wanted=lambda entry_id: index in write_set(entry_id, quorum),
            admit_until=fragment.first_entry_id + buffered - 1,
        )
        self._pump()

    def _collect_reads(self, copy: _Copy) -> None:
        for command in copy.reader.take_commands():
            match command:
                case EntryRead():
                    # The very frame it was written as: same LAC and ledger length.
                    copy.kept[command.entry_id] = self._digest.sign(
                        self.ledger_id,
                        command.entry_id,
                        command.lac,
                        command.length,
                        command.payload,
                    )
                    heapq.heappush(copy.queued, command.entry_id)
                case EntryReadFailed():
                    self._fail(command.api, f"{self._name(copy.fragment)}: {command.detail}")
                    return
                case SendReads() | ReplicaCorrupt():
                    self._commands.append(command)
        if copy.reader.done:
            copy.read_done = True

    def _send_adds(self, copy: _Copy) -> None:
        """Send what is kept: a full batch, or whatever is there when nothing else is on
        its way (what comes meanwhile then goes together), within the throttle."""
        settings = self.settings
        batch = settings.rereplication_entry_batch_size
        while copy.queued and len(copy.sends) < settings.rereplication_batches_in_flight:
            if len(copy.queued) < batch and copy.sends and not copy.read_done:
                return
            if not self._throttle.allows(self._now_ms):
                return
            entry_ids = tuple(
                heapq.heappop(copy.queued) for _ in range(min(batch, len(copy.queued)))
            )
            items = tuple(AddItem(self._flags, self.master_key, copy.kept[e]) for e in entry_ids)
            self._throttle.spend(sum(len(item.frame) for item in items), self._now_ms)
            copy.sends.add(entry_ids)
            self._commands.append(SendAdds(copy.target, entry_ids, items))

    def _on_add_reply(self, event: BookieAddReply | AddSendFailed) -> None:
        copy = self._copy
        if copy is None or event.bookie_id != copy.target or event.entry_ids not in copy.sends:
            return  # a stray answer (an earlier fragment's, a duplicate)
        copy.sends.discard(event.entry_ids)
        if isinstance(event, AddSendFailed):
            statuses = dict.fromkeys(event.entry_ids, None)
            detail = event.reason
        else:
            # An entry sent but missing from an OK answer counts as the bookie's IO_ERROR.
            missing = BookieStatus.IO_ERROR if event.status is BookieStatus.OK else event.status
            statuses = dict.fromkeys(event.entry_ids, missing)
            if event.status is BookieStatus.OK:
                for result in event.results:
                    if result.ledger_id == self.ledger_id and result.entry_id in statuses:
                        statuses[result.entry_id] = result.status
            detail = ""
        for entry_id, status in statuses.items():
            if status is BookieStatus.OK:
                frame = copy.kept.pop(entry_id)
                copy.entries += 1
                copy.bytes += len(frame)
                continue
            tries = copy.tries.get(entry_id, 0) + 1
            copy.tries[entry_id] = tries
            why = status.name if status is not None else f"no answer ({detail})"
            if status in _FATAL_ADD or tries >= self.settings.rereplication_add_tries:
                self._fail(
                    ApiCodes.UNAVAILABLE if status is None else api_for_status(status),
                    f"{self._name(copy.fragment)}: bookie {copy.target} did not store entry "
                    f"{entry_id} ({why}, {tries} tries)",
                )
                return
            heapq.heappush(copy.queued, entry_id)

    def _make_room(self, copy: _Copy) -> None:
        """The reader may start entries up to max_buffered_entries past the oldest kept."""
        oldest = min(copy.kept) if copy.kept else copy.reader.next_entry_id
        copy.reader.admit_until(oldest + self.settings.max_buffered_entries - 1, self._now_ms)

    # -- 3. store the replacement -----------------------------------------------------------------

    def _start_update(self, copy: _Copy) -> None:
        self._enter(ReplicationPhase.UPDATE)
        self._cas(copy)

    def _cas(self, copy: _Copy) -> None:
        fragment = copy.fragment
        segments = []
        for segment in self.metadata.segments:
            if segment.first_entry_id == fragment.segment_first_entry_id:
                bookies = list(segment.bookies)
                bookies[fragment.ensemble_index] = copy.target
                segment = Segment(first_entry_id=segment.first_entry_id, bookies=bookies)
            segments.append(segment)
        self._commands.append(
            UpdateLedger(
                UpdateLedgerRequest(
                    ledger_id=self.ledger_id,
                    expected_version=self.metadata.version,
                    segments=segments,
                )
            )
        )

    def _on_updated(self, stored: LedgerMetadata) -> None:
        copy = self._copy
        assert copy is not None
        self.metadata = stored
        self._copy = None
        replicated = FragmentReplicated(
            copy.fragment, copy.target, copy.entries, copy.bytes, stored, copy.placement_fallback
        )
        self.replicated.append(replicated)
        self._commands.append(replicated)
        self._start_next()

    def _on_update_failed(self, current: LedgerMetadata | None, reason: str) -> None:
        """MetadataUpdateLoop: merge our replacement into what is stored, or give up."""
        copy = self._copy
        assert copy is not None
        fragment = copy.fragment
        if current is None:
            self._fail(ApiCodes.UNAVAILABLE, f"{self._name(fragment)}: metadata update: {reason}")
            return
        self.metadata = current
        segment = _segment_at(current, fragment.segment_first_entry_id)
        if segment is None or len(segment.bookies) <= fragment.ensemble_index:
            self._fail(
                ApiCodes.UNAVAILABLE,
                f"{self._name(fragment)}: the segment changed under the replication ({reason})",
            )
            return
        holder = segment.bookies[fragment.ensemble_index]
        if holder == copy.target:
            self._on_updated(current)  # our CAS landed; its answer was lost
            return
        if holder != fragment.bookie_id:
            # Someone else repaired it: our copies are unreferenced (garbage to collect).
            self.repaired_by_others += 1
            self._copy = None
            self._start_next()
            return
        if copy.target in segment.bookies:
            self._fail(
                ApiCodes.UNAVAILABLE,
                f"{self._name(fragment)}: {copy.target} joined the segment meanwhile",
            )
            return
        self._cas(copy)

    # -- events, time, outputs ------------------------------------------------------------------

    def step(self, event: ReplicationEvent, now_ms: int) -> None:
        self._now_ms = max(self._now_ms, now_ms)
        if self.done:
            return
        match event:
            case WritableBookies():
                if self.phase is ReplicationPhase.LIST:
                    self._writable = frozenset(event.bookie_ids)
                    self._located = dict(event.locations)
                    self._start_next()
            case BookieReadReply() | ReadSendFailed():
                if self.phase is ReplicationPhase.COPY and self._copy is not None:
                    self._copy.reader.step(event, self._now_ms)
            case BookieAddReply() | AddSendFailed():
                if self.phase is ReplicationPhase.COPY:
                    self._on_add_reply(event)
            case LedgerUpdated():
                if self.phase is ReplicationPhase.UPDATE:
                    self._on_updated(event.metadata)
            case LedgerUpdateFailed():
                if self.phase is ReplicationPhase.UPDATE:
                    self._on_update_failed(event.current, event.reason)
            case _:
                raise AssertionError(f"unknown event {event!r}")
        self._pump()

    def tick(self, now_ms: int) -> None:
        self._now_ms = max(self._now_ms, now_ms)
        if self.done:
            return
        if self.phase is ReplicationPhase.COPY and self._copy is not None:
            self._copy.reader.tick(self._now_ms)
        self._pump()

    def _pump(self) -> None:
        """Take what the reader delivered, send what may go, let the reader go on; once
        the fragment is whole on its replacement, store it."""
        copy = self._copy
        if self.phase is not ReplicationPhase.COPY or copy is None:
            return
        self._collect_reads(copy)
        if self.done:
            return
        self._send_adds(copy)
        if not copy.read_done:
            self._make_room(copy)
            self._collect_reads(copy)
            if self.done:
                return
            self._send_adds(copy)
        self.buffered_max = max(self.buffered_max, self.buffered)
        if copy.complete:
            assert not copy.sends and not copy.queued
            self.entries_copied += copy.entries
            self.bytes_copied += copy.bytes
            self._start_update(copy)

    def _finish(self) -> None:
        self._enter(ReplicationPhase.DONE)
        self._commands.append(ReplicationDone(self.metadata))

    def _fail(self, api: ApiCode, detail: str) -> None:
        if self.done:
            return
        self._enter(ReplicationPhase.FAILED)
        self._copy = None
        self.error = QuireError(api, detail)
        self._commands.append(ReplicationFailed(api, detail))

    def _name(self, fragment: Fragment) -> str:
        return (
            f"ledger {self.ledger_id} entries {fragment.first_entry_id}..{fragment.last_entry_id}"
            f" on {fragment.bookie_id} (index {fragment.ensemble_index})"
        )

    def take_commands(self) -> list[ReplicationCommand]:
        """Reads and adds to send, the metadata update, fragments done, the outcome last."""
        commands, self._commands = self._commands, []
        return commands


def _bounded_read_ahead(settings: ReadSettings, entries: int) -> ReadSettings:
    """The reader's settings with no more than `entries` read ahead (nor in its windows)."""
    return replace(
        settings,
        read_ahead_max_entries=entries,
        read_window_initial_entries=min(settings.read_window_initial_entries, entries),
        read_window_max_entries=min(settings.read_window_max_entries, entries),
    )
