"""The fault suite's checker: a history of operations and the final phase's read-back in,
the violations out (Jepsen's idea: clients record what they asked and what they were told,
the checker judges the system by that alone). A pure core: plain data, no IO, no clock.

The history is a list of `Op`s: each operation is an `invoke` and then exactly one of `ok`,
`fail` (it certainly did not happen) or `info` (indeterminate: it may or may not have
happened, now or later); an invoke with no completion (a run that died) counts as `info`.
Ops carry their position in the history, the order in which they were recorded in one
process, which is real-time order: an op whose `ok` precedes another's `invoke` completed
before the other began.

Which appends `fail` (append_outcome): only an error that proves no entry was sent to a
bookie. INVALID_ARGUMENT, ENTRY_TOO_LARGE, UNAUTHORIZED and NO_SUCH_LEDGER are answered before
the writer sees the entries; LEDGER_CLOSED is answered when the ledger is closed or closing
(no add is taken once a close started, and a close waits for the adds already taken, so
those are acknowledged, not failed). Everything else is `info`: LEDGER_FENCED may come after
the entries reached some bookies (a recovery may then find them and keep them, as in
BookKeeper), as may NOT_ENOUGH_BOOKIES (a failed ensemble change), TIMEOUT, UNAVAILABLE, any
5xx, a lost connection or a client-side timeout; TOO_MANY_REQUESTS too, since a bookie's
answer maps to it as well as the gateway's admission control. A code taken as `info` when it
was in fact a `fail` only weakens one rule (a failed append found in the ledger); the other
way round would report violations that are not there.

The rules (each counted, with a few examples):

- lost: an acknowledged append whose entry the final ledger lacks or holds with other bytes.
- unexpected: a final entry whose bytes no append to that ledger invoked, or whose append
  failed for certain (bytes never invoked anywhere count as corrupt as well).
- duplicates: an invoked payload at more than one place in the final ledgers (each extra).
- non_dense: a final ledger whose entry ids read back are not exactly 0..last_entry_id.
- beyond_lac: a read (not `unconfirmed`) that returned an entry past the LAC it reported,
  or one the closed final ledger does not hold; any read of an entry the final ledger holds
  with other bytes (one writer assigns each entry id once, so even an unconfirmed read of
  an id inside the closed ledger saw its bytes); a LAC seen beyond the final last entry.
- ack_after_fence: an append acknowledged although it was invoked after a recover or close
  of its ledger had completed, or acknowledged, after such a close was seen, with an entry
  id past the close's last entry. (An acknowledged entry that a later close left out is
  lost.)
- closed_changed: a ledger seen closed at two different last entry ids (close, recover,
  GET and the final phase).
- corrupt: any bytes read (during the run, through the gateway at the end, or from a
  replica) that no append ever invoked: silent corruption. Such a read counts only here
  (not also as beyond_lac); a replica only where it differs from the ledger (the gateway's
  read of the same bytes counted them already).
- replicas_differing: a bookie of an entry's write set (per the final metadata) that
  serves it, digest intact, with other bytes than the ledger's.
- unrecovered: a ledger the final phase could not recover and close.

Figures, not violations: replicas_missing (a write-set bookie without the entry:
autorecovery may still be copying it) and replicas_corrupt (a bookie that answered CORRUPT
or served a frame failing its digest: detected, so readers go to another replica).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.quorum import QuorumSpec, write_set

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
OUTCOMES = (OK, FAIL, INFO)
MAX_EXAMPLES = 5
# Violations: any of these non-zero makes a run fail.
FATAL = (
    "lost",
    "unexpected",
    "duplicates",
    "non_dense",
    "beyond_lac",
    "ack_after_fence",
    "closed_changed",
    "corrupt",
    "replicas_differing",
    "unrecovered",
)
FIGURES = ("replicas_missing", "replicas_corrupt")

# The append errors that prove nothing was written (see the module docstring).
APPEND_FAIL_CODES = frozenset(
    {"INVALID_ARGUMENT", "ENTRY_TOO_LARGE", "UNAUTHORIZED", "NO_SUCH_LEDGER", "LEDGER_CLOSED"}
)
# A create, close or recover refused with one of these changed nothing.
CHANGE_FAIL_CODES = frozenset({"INVALID_ARGUMENT", "UNAUTHORIZED", "NO_SUCH_LEDGER"})
# A create needs that many writable bookies before it writes any metadata.
CREATE_FAIL_CODES = CHANGE_FAIL_CODES | {"NOT_ENOUGH_BOOKIES"}
# Operations that change nothing: a failed one is simply `fail`.
READ_KINDS = frozenset({"read", "tail", "lac", "get"})
CLOSED = "CLOSED"
# Replica read statuses (ReplicaRead.status) besides the bookie's own names.
REPLICA_OK = "OK"
REPLICA_CORRUPT = ("CORRUPT", "DIGEST_MISMATCH")


def outcome(kind: str, code: str) -> str:
    """`fail` or `info` for an operation of `kind` that ended with error `code`."""
    if kind in READ_KINDS:
        return FAIL
    if kind == "append":
        return FAIL if code in APPEND_FAIL_CODES else INFO
    if kind == "create":
        return FAIL if code in CREATE_FAIL_CODES else INFO
    return FAIL if code in CHANGE_FAIL_CODES else INFO


@dataclass(frozen=True)
class Op:
    """One line of the history.

    `value` by kind, invoke / ok (fail and info carry `code` and `detail`, and reads the
    entries they got before the error):
    - create: {"ensemble_size", "write_quorum", "ack_quorum", "password"} / {"ledger_id"}
    - append: {"payloads": [bytes]} / {"first", "last", "lac"}
    - read, tail: {"from", "to", "unconfirmed"} / {"entries": [[entry_id, bytes, lac]]}
      (lac: the LAC the gateway reported with that entry, None when it did not say)
    - lac: {"after"} / {"lac"}
    - get: {} / {"state", "last_entry_id"}
    - close, recover: {} / {"last_entry_id"}
    """

    index: int  # position in the history: real-time order
    op_id: int  # an invoke and its completion share it
    type: str  # invoke, ok, fail, info
    process: str  # who did it: writer-0, reader-1, recoverer
    kind: str
    ledger: int | None
    value: Mapping[str, Any] = field(default_factory=dict)
    time_s: float = 0.0  # since the history began (figures only)


@dataclass(frozen=True)
class ReplicaRead:
    """One entry as one bookie answered it: status OK with the payload of a frame whose
    digest verified, DIGEST_MISMATCH (served, digest wrong), or the bookie's status
    (NO_ENTRY, CORRUPT, ...) or UNREACHABLE, payload None."""

    bookie_id: str
    entry_id: int
    status: str
    payload: bytes | None = None


@dataclass(frozen=True)
class FinalLedger:
    """A ledger after the final phase: recovered (closed) if it could be, read whole through
    the gateway, and each entry read from each bookie of its write set."""

    ledger_id: int
    state: str
    last_entry_id: int | None  # None unless CLOSED
    entries: Sequence[tuple[int, bytes]]  # as read through the gateway, in order
    write_quorum: int = 0
    ack_quorum: int = 0
    segments: Sequence[tuple[int, Sequence[str]]] = ()  # (first_entry_id, bookies)
    replicas: Sequence[ReplicaRead] = ()
    read_error: str | None = None  # the gateway read failed part way: `entries` is partial
    recover_error: str | None = None
    recovery_ms: float | None = None  # how long the final recover took


@dataclass
class CheckResult:
    lost: int = 0
    unexpected: int = 0
    duplicates: int = 0
    non_dense: int = 0
    beyond_lac: int = 0
    ack_after_fence: int = 0
    closed_changed: int = 0
    corrupt: int = 0
    replicas_differing: int = 0
    unrecovered: int = 0
    replicas_missing: int = 0
    replicas_corrupt: int = 0
    ledgers: int = 0
    final_entries: int = 0
    # kind -> {"attempted", "ok", "fail", "info"}; entries: the same for appended entries
    operations: dict[str, dict[str, int]] = field(default_factory=dict)
    entries: dict[str, int] = field(default_factory=dict)
    recovery_ms: list[float] = field(default_factory=list)
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(getattr(self, name) for name in FATAL)

    def count(self, rule: str, example: str) -> None:
        setattr(self, rule, getattr(self, rule) + 1)
        shown = self.examples.setdefault(rule, [])
        if len(shown) < MAX_EXAMPLES:
            shown.append(example)


@dataclass(frozen=True)
class Call:
    """An operation: its invoke and its completion (None: never completed, so `info`)."""

    invoke: Op
    completion: Op | None

    @property
    def outcome(self) -> str:
        return self.completion.type if self.completion is not None else INFO

    @property
    def result(self) -> Mapping[str, Any]:
        return self.completion.value if self.completion is not None else {}

    @property
    def done_index(self) -> int | None:
        return self.completion.index if self.completion is not None else None


def calls(history: Iterable[Op]) -> list[Call]:
    """Pair each invoke with its completion, in invoke order. A completion without its
    invoke, or a second one, is a broken history: an error, not a finding."""
    invokes: dict[int, Op] = {}
    completions: dict[int, Op] = {}
    for op in history:
        if op.type == INVOKE:
            assert op.op_id not in invokes, f"op {op.op_id} invoked twice"
            invokes[op.op_id] = op
        else:
            assert op.type in OUTCOMES, f"unknown op type {op.type!r}"
            assert op.op_id in invokes, f"op {op.op_id} completed before its invoke"
            assert op.op_id not in completions, f"op {op.op_id} completed twice"
            completions[op.op_id] = op
    ordered = sorted(invokes.values(), key=lambda op: op.index)
    return [Call(op, completions.get(op.op_id)) for op in ordered]


def show(data: bytes | None) -> str:
    """A payload, short enough for an example line."""
    if data is None:
        return "nothing"
    return repr(data[:40]) + ("..." if len(data) > 40 else "")


@dataclass
class _Observed:
    """What the history says, indexed for the rules."""

    invoked: dict[int, set[bytes]] = field(default_factory=lambda: defaultdict(set))
    failed: dict[int, set[bytes]] = field(default_factory=lambda: defaultdict(set))
    acked: list[tuple[Call, int, bytes]] = field(default_factory=list)  # call, entry id, bytes
    acked_calls: list[Call] = field(default_factory=list)
    # ledger -> the earliest history index at which a recover or close of it had completed
    fenced_at: dict[int, int] = field(default_factory=dict)
    # ledger -> [(last_entry_id, what said so, the history index it was said at or None)]
    closed: dict[int, list[tuple[int, str, int | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # (call, entry id, bytes, reported lac or None)
    reads: list[tuple[Call, int, bytes, int | None]] = field(default_factory=list)
    lacs: list[tuple[Call, int]] = field(default_factory=list)

    def all_invoked(self) -> set[bytes]:
        return set().union(*self.invoked.values()) if self.invoked else set()


def _observe(history_calls: Sequence[Call]) -> _Observed:
    seen = _Observed()
    for call in history_calls:
        op, result, ledger = call.invoke, call.result, call.invoke.ledger
        where = f"{op.process} op {op.op_id}"
        if op.kind == "append" and ledger is not None:
            payloads = list(op.value["payloads"])
            seen.invoked[ledger].update(payloads)
            if call.outcome == FAIL:
                seen.failed[ledger].update(payloads)
            elif call.outcome == OK:
                first, last = result["first"], result["last"]
                assert last - first + 1 == len(payloads), f"{where}: ids do not match payloads"
                seen.acked.extend((call, first + i, p) for i, p in enumerate(payloads))
                seen.acked_calls.append(call)
        elif op.kind in ("close", "recover") and call.outcome == OK and ledger is not None:
            done = call.done_index
            assert done is not None
            seen.fenced_at[ledger] = min(seen.fenced_at.get(ledger, done), done)
            seen.closed[ledger].append((result["last_entry_id"], f"{op.kind} ({where})", done))
        elif op.kind == "get" and call.outcome == OK and ledger is not None:
            if result.get("state") == CLOSED:
                closed = (result["last_entry_id"], f"get ({where})", call.done_index)
                seen.closed[ledger].append(closed)
        elif op.kind == "lac" and call.outcome == OK:
            seen.lacs.append((call, result["lac"]))
        if op.kind in ("read", "tail"):
            # Entries that came before an error were read all the same.
            for entry_id, data, lac in result.get("entries", ()):
                seen.reads.append((call, entry_id, data, lac))
    return seen


def check(history: Iterable[Op], final: Iterable[FinalLedger]) -> CheckResult:
    history_calls = calls(history)
    finals = {f.ledger_id: f for f in final}
    result = CheckResult(ledgers=len(finals))
    _count_operations(history_calls, result)
    seen = _observe(history_calls)
    written = seen.all_invoked()
    final_bytes = {lid: dict(f.entries) for lid, f in finals.items()}
    for f in finals.values():
        result.final_entries += len(f.entries)
        if f.recovery_ms is not None:
            result.recovery_ms.append(f.recovery_ms)
        if f.state == CLOSED and f.last_entry_id is not None:
            seen.closed[f.ledger_id].append((f.last_entry_id, "the final phase", None))
    _check_lost(seen, final_bytes, result)
    _check_final_ledgers(seen, finals, written, result)
    _check_reads(seen, finals, final_bytes, written, result)
    _check_fences(seen, result)
    _check_closes(seen, result)
    _check_replicas(finals, final_bytes, written, result)
    return result


def _count_operations(history_calls: Sequence[Call], result: CheckResult) -> None:
    entries = dict.fromkeys(("attempted", *OUTCOMES), 0)
    for call in history_calls:
        counts = result.operations.setdefault(
            call.invoke.kind, dict.fromkeys(("attempted", *OUTCOMES), 0)
        )
        counts["attempted"] += 1
        counts[call.outcome] += 1
        if call.invoke.kind == "append":
            n = len(call.invoke.value["payloads"])
            entries["attempted"] += n
            entries[call.outcome] += n
    result.entries = entries


def _check_lost(
    seen: _Observed, final_bytes: Mapping[int, Mapping[int, bytes]], result: CheckResult
) -> None:
    for call, entry_id, data in seen.acked:
        ledger = call.invoke.ledger
        assert ledger is not None
        got = final_bytes.get(ledger, {}).get(entry_id)
        if got != data:
            result.count(
                "lost",
                f"ledger {ledger} entry {entry_id}: acknowledged {show(data)} "
                f"({call.invoke.process} op {call.invoke.op_id}), final has {show(got)}",
            )


def _check_final_ledgers(
    seen: _Observed, finals: Mapping[int, FinalLedger], written: set[bytes], result: CheckResult
) -> None:
    where: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for ledger, f in finals.items():
        if f.state != CLOSED:
            result.count("unrecovered", f"ledger {ledger}: {f.state}, {f.recover_error}")
        ids = [entry_id for entry_id, _ in f.entries]
        expected = list(range(f.last_entry_id + 1 if f.last_entry_id is not None else len(ids)))
        if ids != expected:
            result.count("non_dense", _first_difference(ledger, ids, expected, f.read_error))
        for entry_id, data in f.entries:
            if data not in seen.invoked.get(ledger, ()):
                result.count(
                    "unexpected",
                    f"ledger {ledger} entry {entry_id}: {show(data)}, never appended to it",
                )
            elif data in seen.failed.get(ledger, ()):
                result.count(
                    "unexpected",
                    f"ledger {ledger} entry {entry_id}: {show(data)}, whose append failed",
                )
            if data in written:
                where[data].append((ledger, entry_id))
            else:
                result.count(
                    "corrupt", f"final read of ledger {ledger} entry {entry_id}: {show(data)}"
                )
    for data, places in where.items():
        for ledger, entry_id in places[1:]:
            result.count(
                "duplicates",
                f"{show(data)} at ledger {ledger} entry {entry_id}, first at {places[0]}",
            )


def _first_difference(
    ledger: int, ids: list[int], expected: list[int], read_error: str | None
) -> str:
    for position, (got, want) in enumerate(zip(ids, expected, strict=False)):
        if got != want:
            return f"ledger {ledger}: id {got} at position {position}, expected {want}"
    why = f" (read failed: {read_error})" if read_error else ""
    return f"ledger {ledger}: read {len(ids)} entries, expected {len(expected)}{why}"


def _check_reads(
    seen: _Observed,
    finals: Mapping[int, FinalLedger],
    final_bytes: Mapping[int, Mapping[int, bytes]],
    written: set[bytes],
    result: CheckResult,
) -> None:
    for call, entry_id, data, lac in seen.reads:
        op, ledger = call.invoke, call.invoke.ledger
        assert ledger is not None
        what = f"{op.process} {op.kind} (op {op.op_id}) of ledger {ledger} entry {entry_id}"
        if data not in written:
            result.count("corrupt", f"{what}: {show(data)}")
            continue
        unconfirmed = bool(op.value.get("unconfirmed"))
        f = finals.get(ledger)
        held = final_bytes.get(ledger, {}).get(entry_id)
        if not unconfirmed and lac is not None and entry_id > lac:
            result.count("beyond_lac", f"{what}: past the LAC {lac} it reported")
        elif held is not None and held != data:
            result.count("beyond_lac", f"{what}: read {show(data)}, final has {show(held)}")
        elif (
            not unconfirmed
            and f is not None
            and f.last_entry_id is not None
            and entry_id > f.last_entry_id
        ):
            result.count("beyond_lac", f"{what}: the ledger closed at {f.last_entry_id}")
    # Each LAC once per operation (a read reports its LAC with every entry).
    reported = {(call.invoke.op_id, lac): call for call, _, _, lac in seen.reads if lac is not None}
    reported |= {(call.invoke.op_id, lac): call for call, lac in seen.lacs}
    for (_, lac), call in sorted(reported.items(), key=lambda item: item[0]):
        ledger = call.invoke.ledger
        f = finals.get(ledger) if ledger is not None else None
        if f is not None and f.last_entry_id is not None and lac > f.last_entry_id:
            result.count(
                "beyond_lac",
                f"{call.invoke.process} {call.invoke.kind} (op {call.invoke.op_id}) saw LAC "
                f"{lac} of ledger {ledger}, which closed at {f.last_entry_id}",
            )


def _check_fences(seen: _Observed, result: CheckResult) -> None:
    for call in seen.acked_calls:
        op, ledger, last = call.invoke, call.invoke.ledger, call.result["last"]
        assert ledger is not None
        fenced_at = seen.fenced_at.get(ledger)
        done = call.done_index
        assert done is not None
        # Closes the history saw complete before this ack: the final phase's comes after
        # every ack (an acknowledged entry past it is lost, not acknowledged after a fence).
        closes = [
            (c, by) for c, by, at in seen.closed.get(ledger, []) if at is not None and at < done
        ]
        if fenced_at is not None and op.index > fenced_at:
            result.count(
                "ack_after_fence",
                f"ledger {ledger}: {op.process} op {op.op_id} acknowledged, invoked after a "
                f"recover or close had completed (history line {fenced_at})",
            )
        elif closes and last > min(closes)[0]:
            closed, by = min(closes)
            result.count(
                "ack_after_fence",
                f"ledger {ledger}: {op.process} op {op.op_id} acknowledged entry {last}, "
                f"the ledger closed at {closed} ({by})",
            )


def _check_closes(seen: _Observed, result: CheckResult) -> None:
    for ledger, closes in sorted(seen.closed.items()):
        if len({closed for closed, _, _ in closes}) > 1:
            said = ", ".join(f"{closed} by {by}" for closed, by, _ in closes)
            result.count("closed_changed", f"ledger {ledger} closed at {said}")


def _check_replicas(
    finals: Mapping[int, FinalLedger],
    final_bytes: Mapping[int, Mapping[int, bytes]],
    written: set[bytes],
    result: CheckResult,
) -> None:
    for ledger, f in finals.items():
        if not f.segments:
            continue
        answers = {(r.bookie_id, r.entry_id): r for r in f.replicas}
        for entry_id, data in final_bytes[ledger].items():
            for bookie_id in write_set_bookies(f, entry_id):
                what = f"ledger {ledger} entry {entry_id} on {bookie_id}"
                answer = answers.get((bookie_id, entry_id))
                if answer is None:
                    result.count("replicas_missing", f"{what}: not asked")
                elif answer.status == REPLICA_OK:
                    assert answer.payload is not None
                    if answer.payload != data:
                        result.count(
                            "replicas_differing",
                            f"{what}: {show(answer.payload)}, the ledger has {show(data)}",
                        )
                        if answer.payload not in written:
                            result.count(
                                "corrupt", f"replica read of {what}: {show(answer.payload)}"
                            )
                elif answer.status in REPLICA_CORRUPT:
                    result.count("replicas_corrupt", f"{what}: {answer.status}")
                else:
                    result.count("replicas_missing", f"{what}: {answer.status}")


def write_set_bookies(f: FinalLedger, entry_id: int) -> list[str]:
    """The bookies that store `entry_id`: BookKeeper's round robin over the ensemble of the
    segment that holds it (shared.quorum.write_set), as the final metadata says."""
    ensemble: Sequence[str] = ()
    for first_entry_id, bookies in f.segments:
        if first_entry_id <= entry_id:
            ensemble = bookies
    spec = QuorumSpec(len(ensemble), f.write_quorum, f.ack_quorum)
    return [ensemble[index] for index in write_set(entry_id, spec)]


def summary(result: CheckResult) -> dict[str, Any]:
    """The run's figures as plain JSON data: operations attempted/acked/failed/indeterminate
    by kind, appended entries the same way, every violation and figure, recovery times."""
    recoveries = sorted(result.recovery_ms)
    return {
        "ok": result.ok,
        "operations": {
            kind: {
                "attempted": c["attempted"],
                "acked": c[OK],
                "failed": c[FAIL],
                "indeterminate": c[INFO],
            }
            for kind, c in sorted(result.operations.items())
        },
        "entries": {
            "attempted": result.entries.get("attempted", 0),
            "acked": result.entries.get(OK, 0),
            "failed": result.entries.get(FAIL, 0),
            "indeterminate": result.entries.get(INFO, 0),
        },
        "ledgers": result.ledgers,
        "final_entries": result.final_entries,
        **{name: getattr(result, name) for name in (*FATAL, *FIGURES)},
        "recovery_ms": {
            "count": len(recoveries),
            "p50": recoveries[len(recoveries) // 2] if recoveries else None,
            "max": recoveries[-1] if recoveries else None,
        },
        "examples": {rule: list(lines) for rule, lines in sorted(result.examples.items())},
    }
