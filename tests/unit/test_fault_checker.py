"""The fault suite's checker (quire/faults/checker.py), table-driven: each case a small
history and final read-back, and the counts the checker must find (every other count zero)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from quire.faults.checker import (
    FATAL,
    FIGURES,
    INVOKE,
    Op,
    ReplicaRead,
    calls,
    check,
    outcome,
    summary,
    write_set_bookies,
)
from quire.faults.checker import (
    FinalLedger as Final,
)

BOOKIES = ("b1", "b2", "b3", "b4")


@dataclass
class H:
    """A history written by hand: invoke, then complete."""

    ops: list[Op] = field(default_factory=list)
    next_id: int = 0

    def invoke(self, kind: str, ledger: int | None, process: str = "w0", **value: Any) -> int:
        op_id, self.next_id = self.next_id, self.next_id + 1
        self.ops.append(Op(len(self.ops), op_id, INVOKE, process, kind, ledger, value))
        return op_id

    def complete(self, op_id: int, type_: str, **value: Any) -> None:
        invoke = next(op for op in self.ops if op.op_id == op_id)
        self.ops.append(
            Op(len(self.ops), op_id, type_, invoke.process, invoke.kind, invoke.ledger, value)
        )

    def append(self, ledger: int, payloads: Sequence[bytes], first: int | None) -> int:
        """An acknowledged append at `first`, or (first None) one left for the caller."""
        op_id = self.invoke("append", ledger, payloads=list(payloads))
        if first is not None:
            last = first + len(payloads) - 1
            self.complete(op_id, "ok", first=first, last=last, lac=last)
        return op_id

    def read(
        self,
        ledger: int,
        entries: Sequence[tuple[int, bytes, int | None]],
        unconfirmed: bool = False,
        type_: str = "ok",
        kind: str = "read",
    ) -> None:
        op_id = self.invoke(kind, ledger, "r0", unconfirmed=unconfirmed)
        self.complete(op_id, type_, entries=[list(e) for e in entries])

    def done(self, kind: str, ledger: int, last_entry_id: int, process: str = "rec") -> None:
        op_id = self.invoke(kind, ledger, process)
        self.complete(op_id, "ok", last_entry_id=last_entry_id)


def p(n: int, ledger: int = 1) -> bytes:
    return b"w0|L%d|%04d|padding" % (ledger, n)


def closed(
    payloads: Sequence[bytes],
    ledger: int = 1,
    last: int | None = None,
    ensemble: Sequence[str] = BOOKIES[:3],
    write_quorum: int = 3,
    segments: Sequence[tuple[int, Sequence[str]]] | None = None,
    replicas: Callable[[str, int, bytes], ReplicaRead | None] | None = None,
    **more: Any,
) -> Final:
    """A closed final ledger holding `payloads` at 0.., every replica answering them (or
    what `replicas(bookie, entry_id, payload)` says, None for no answer)."""
    segments = segments or [(0, list(ensemble))]
    final = Final(
        ledger,
        "CLOSED",
        len(payloads) - 1 if last is None else last,
        list(enumerate(payloads)),
        write_quorum=write_quorum,
        ack_quorum=2,
        segments=segments,
        **more,
    )
    answers = []
    for entry_id, data in final.entries:
        for bookie in write_set_bookies(final, entry_id):
            answer = (
                replicas(bookie, entry_id, data)
                if replicas
                else ReplicaRead(bookie, entry_id, "OK", data)
            )
            if answer is not None:
                answers.append(answer)
    return Final(**{**final.__dict__, "replicas": answers})


def acked(h: H, n: int, ledger: int = 1) -> list[bytes]:
    """n single appends acknowledged at 0..n-1; their payloads."""
    payloads = [p(i, ledger) for i in range(n)]
    for i, data in enumerate(payloads):
        h.append(ledger, [data], i)
    return payloads


@dataclass
class Case:
    name: str
    build: Callable[[H], list[Final]]
    expect: dict[str, int] = field(default_factory=dict)


def clean(h: H) -> list[Final]:
    payloads = acked(h, 3)
    h.append(1, [p(3), p(4)], 3)  # a batch
    h.read(1, [(0, payloads[0], 4), (1, payloads[1], 4)])
    h.done("close", 1, 4, process="w0")
    return [closed([*payloads, p(3), p(4)])]


def lost_absent(h: H) -> list[Final]:
    payloads = acked(h, 3)
    return [closed(payloads[:2])]


def lost_other_bytes(h: H) -> list[Final]:
    payloads = acked(h, 2)
    return [closed([payloads[1], payloads[0]])]  # both invoked, swapped


def lost_ledger_missing(h: H) -> list[Final]:
    acked(h, 2)
    return []


def info_kept(h: H) -> list[Final]:
    payloads = acked(h, 2)
    op_id = h.append(1, [p(2)], None)
    h.complete(op_id, "info", code="TIMEOUT")
    return [closed([*payloads, p(2)])]


def info_dropped(h: H) -> list[Final]:
    payloads = acked(h, 2)
    op_id = h.append(1, [p(2)], None)
    h.complete(op_id, "info", code="LEDGER_FENCED")
    return [closed(payloads)]


def pending_kept(h: H) -> list[Final]:
    payloads = acked(h, 1)
    h.append(1, [p(1)], None)  # never completed: the run died
    return [closed([*payloads, p(1)])]


def failed_present(h: H) -> list[Final]:
    payloads = acked(h, 1)
    op_id = h.append(1, [p(1)], None)
    h.complete(op_id, "fail", code="LEDGER_CLOSED")
    return [closed([*payloads, p(1)])]


def never_written(h: H) -> list[Final]:
    payloads = acked(h, 1)
    return [closed([*payloads, b"garbage"])]


def other_ledgers_payload(h: H) -> list[Final]:
    one = acked(h, 1, ledger=1)
    two = acked(h, 1, ledger=2)
    return [closed(one, ledger=1), closed([*two, one[0]], ledger=2)]


def duplicate_in_ledger(h: H) -> list[Final]:
    payloads = acked(h, 2)
    return [closed([*payloads, payloads[1]])]


def gap(h: H) -> list[Final]:
    payloads = acked(h, 4)
    final = closed(payloads)
    return [Final(**{**final.__dict__, "entries": [e for e in final.entries if e[0] != 2]})]


def partial_final_read(h: H) -> list[Final]:
    payloads = [p(i) for i in range(4)]
    for data in payloads:
        h.append(1, [data], None)  # indeterminate, all kept by the recovery
    final = closed(payloads)
    return [Final(**{**final.__dict__, "entries": final.entries[:2], "read_error": "TIMEOUT"})]


def read_past_reported_lac(h: H) -> list[Final]:
    payloads = acked(h, 3)
    h.read(1, [(2, payloads[2], 1)])
    return [closed(payloads)]


def unconfirmed_past_lac(h: H) -> list[Final]:
    payloads = acked(h, 3)
    h.read(1, [(2, payloads[2], 1)], unconfirmed=True)
    return [closed(payloads)]


def unconfirmed_past_close(h: H) -> list[Final]:
    payloads = acked(h, 2)
    op_id = h.append(1, [p(2)], None)
    h.complete(op_id, "info", code="TIMEOUT")
    h.read(1, [(2, p(2), 1)], unconfirmed=True)  # recovery did not keep it: allowed
    return [closed(payloads)]


def confirmed_past_close(h: H) -> list[Final]:
    payloads = acked(h, 2)
    op_id = h.append(1, [p(2)], None)
    h.complete(op_id, "info", code="TIMEOUT")
    h.read(1, [(2, p(2), None)], kind="tail")  # a tail saw it confirmed; the close dropped it
    return [closed(payloads)]


def read_other_bytes(h: H) -> list[Final]:
    payloads = acked(h, 2)
    h.read(1, [(1, payloads[0], 1)], unconfirmed=True)
    return [closed(payloads)]


def lac_past_close(h: H) -> list[Final]:
    payloads = acked(h, 2)
    op_id = h.invoke("lac", 1, "r0", after=0)
    h.complete(op_id, "ok", lac=5)
    return [closed(payloads)]


def lac_past_close_in_a_read(h: H) -> list[Final]:
    """A read reports its LAC with each entry: one violation for the read, not per entry."""
    payloads = acked(h, 3)
    h.read(1, [(0, payloads[0], 4), (1, payloads[1], 4)], kind="tail")
    return [closed(payloads)]


def corrupt_read(h: H) -> list[Final]:
    payloads = acked(h, 2)
    h.read(1, [(0, payloads[0], 1), (1, b"flipped", 1)], type_="fail")
    return [closed(payloads)]


def corrupt_unconfirmed_read(h: H) -> list[Final]:
    payloads = acked(h, 2)
    h.read(1, [(5, b"flipped", 1)], unconfirmed=True)
    return [closed(payloads)]


def ack_after_recover(h: H) -> list[Final]:
    payloads = acked(h, 2)
    h.done("recover", 1, 1)
    h.append(1, [p(2)], 2)  # invoked after the recover completed, yet acknowledged
    return [closed([*payloads, p(2)])]


def ack_across_recover(h: H) -> list[Final]:
    payloads = acked(h, 2)
    op_id = h.append(1, [p(2)], None)
    h.done("recover", 1, 2)  # the recovery found entry 2 and kept it
    h.complete(op_id, "ok", first=2, last=2, lac=2)
    return [closed([*payloads, p(2)])]


def ack_past_recovered_last(h: H) -> list[Final]:
    payloads = acked(h, 2)
    op_id = h.append(1, [p(2)], None)
    h.done("recover", 1, 1)
    h.complete(op_id, "ok", first=2, last=2, lac=2)
    return [closed(payloads)]


def close_then_other_last(h: H) -> list[Final]:
    payloads = acked(h, 3)
    h.done("close", 1, 1, process="w0")
    return [closed(payloads)]


def get_closed_other_last(h: H) -> list[Final]:
    payloads = acked(h, 2)
    h.done("recover", 1, 1)
    op_id = h.invoke("get", 1, "r0")
    h.complete(op_id, "ok", state="CLOSED", last_entry_id=0)
    op_id = h.invoke("get", 1, "r0")
    h.complete(op_id, "ok", state="OPEN", last_entry_id=None)
    return [closed(payloads)]


def replica_missing(h: H) -> list[Final]:
    payloads = acked(h, 3)

    def answer(bookie: str, entry_id: int, data: bytes) -> ReplicaRead | None:
        if (bookie, entry_id) == ("b2", 1):
            return ReplicaRead(bookie, entry_id, "NO_ENTRY")
        return (
            None if (bookie, entry_id) == ("b3", 2) else ReplicaRead(bookie, entry_id, "OK", data)
        )

    return [closed(payloads, replicas=answer)]


def replica_differing(h: H) -> list[Final]:
    payloads = acked(h, 3)

    def answer(bookie: str, entry_id: int, data: bytes) -> ReplicaRead:
        if (bookie, entry_id) == ("b1", 0):
            return ReplicaRead(bookie, entry_id, "OK", payloads[2])
        if (bookie, entry_id) == ("b1", 1):
            return ReplicaRead(bookie, entry_id, "OK", b"never written")
        return ReplicaRead(bookie, entry_id, "OK", data)

    return [closed(payloads, replicas=answer)]


def replica_corrupt(h: H) -> list[Final]:
    payloads = acked(h, 2)

    def answer(bookie: str, entry_id: int, data: bytes) -> ReplicaRead:
        if bookie == "b3":
            status = "CORRUPT" if entry_id == 0 else "DIGEST_MISMATCH"
            return ReplicaRead(bookie, entry_id, status)
        return ReplicaRead(bookie, entry_id, "OK", data)

    return [closed(payloads, replicas=answer)]


def striped(h: H) -> list[Final]:
    """E4 Qw3 with an ensemble change at entry 3: each entry asked of its own write set."""
    payloads = acked(h, 6)
    segments = [(0, ["b1", "b2", "b3", "b4"]), (3, ["b1", "b5", "b3", "b4"])]
    final = closed(payloads, segments=segments)
    asked = {(r.bookie_id, r.entry_id) for r in final.replicas}
    assert ("b2", 0) in asked and ("b4", 0) not in asked  # 0 lives on b1 b2 b3
    assert ("b4", 2) in asked and ("b1", 2) in asked and ("b2", 2) not in asked
    assert ("b5", 4) in asked and ("b2", 4) not in asked  # the new segment
    return [final]


def striped_wrong_bookie(h: H) -> list[Final]:
    """A replica answering for an entry it does not hold per the metadata does not count;
    the write-set bookie that did not answer is missing."""
    payloads = acked(h, 4)
    final = closed(payloads, ensemble=BOOKIES, write_quorum=2)
    replicas = [r for r in final.replicas if (r.bookie_id, r.entry_id) != ("b2", 0)]
    replicas.append(ReplicaRead("b4", 0, "OK", payloads[0]))
    return [Final(**{**final.__dict__, "replicas": replicas})]


def unrecovered(h: H) -> list[Final]:
    payloads = acked(h, 2)
    final = Final(1, "IN_RECOVERY", None, list(enumerate(payloads)), recover_error="TIMEOUT")
    return [final]


CASES = [
    Case("clean", clean),
    Case("acked entry absent", lost_absent, {"lost": 1}),
    Case("acked entries with other (written) bytes", lost_other_bytes, {"lost": 2}),
    Case("ledger missing from the final phase", lost_ledger_missing, {"lost": 2}),
    Case("indeterminate append kept", info_kept),
    Case("indeterminate append dropped", info_dropped),
    Case("invoke never completed, kept", pending_kept),
    Case("failed append present", failed_present, {"unexpected": 1}),
    Case("bytes never written", never_written, {"unexpected": 1, "corrupt": 1}),
    Case(
        "another ledger's payload",
        other_ledgers_payload,
        {"unexpected": 1, "duplicates": 1},
    ),
    Case("payload twice in a ledger", duplicate_in_ledger, {"duplicates": 1}),
    Case("gap in the ids", gap, {"non_dense": 1, "lost": 1}),
    Case("final read cut short", partial_final_read, {"non_dense": 1}),
    Case("confirmed read past its LAC", read_past_reported_lac, {"beyond_lac": 1}),
    Case("unconfirmed read past the LAC", unconfirmed_past_lac),
    Case("unconfirmed read past the close", unconfirmed_past_close),
    Case("confirmed read past the close", confirmed_past_close, {"beyond_lac": 1}),
    Case("read of other bytes than the final", read_other_bytes, {"beyond_lac": 1}),
    Case("LAC past the close", lac_past_close, {"beyond_lac": 1}),
    Case("LAC past the close in a read", lac_past_close_in_a_read, {"beyond_lac": 1}),
    Case("corrupt bytes in a failed read", corrupt_read, {"corrupt": 1}),
    Case("corrupt bytes in an unconfirmed read", corrupt_unconfirmed_read, {"corrupt": 1}),
    Case(
        "ack of an append invoked after recover",
        ack_after_recover,
        {"ack_after_fence": 1, "closed_changed": 1},
    ),
    Case("ack of an append that straddled recover", ack_across_recover),
    Case(
        "ack past the recovered last entry",
        ack_past_recovered_last,
        {"ack_after_fence": 1, "lost": 1},
    ),
    Case(
        "close and final disagree",
        close_then_other_last,
        {"closed_changed": 1},
    ),
    Case(
        "GET closed disagrees, GET open ignored",
        get_closed_other_last,
        {"closed_changed": 1},
    ),
    Case("replica missing", replica_missing, {"replicas_missing": 2}),
    Case(
        "replica differing",
        replica_differing,
        {"replicas_differing": 2, "corrupt": 1},
    ),
    Case("replica corrupt", replica_corrupt, {"replicas_corrupt": 2}),
    Case("striped and changed ensembles", striped),
    Case("E4 Qw2: only the write set counts", striped_wrong_bookie, {"replicas_missing": 1}),
    Case("unrecovered ledger", unrecovered, {"unrecovered": 1}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_check(case: Case) -> None:
    h = H()
    finals = case.build(h)
    result = check(h.ops, finals)
    counts = {name: getattr(result, name) for name in (*FATAL, *FIGURES)}
    assert counts == {name: case.expect.get(name, 0) for name in counts}, result.examples
    assert result.ok == (not set(case.expect) & set(FATAL))
    for rule, n in case.expect.items():
        assert len(result.examples[rule]) == min(n, 5)


def test_examples_name_the_ledger_and_entry() -> None:
    h = H()
    result = check(h.ops, lost_absent(h))
    assert result.examples["lost"] == [
        "ledger 1 entry 2: acknowledged b'w0|L1|0002|padding' (w0 op 2), final has nothing"
    ]


@pytest.mark.parametrize(
    ("kind", "code", "expected"),
    [
        ("append", "INVALID_ARGUMENT", "fail"),
        ("append", "ENTRY_TOO_LARGE", "fail"),
        ("append", "UNAUTHORIZED", "fail"),
        ("append", "NO_SUCH_LEDGER", "fail"),
        ("append", "LEDGER_CLOSED", "fail"),
        ("append", "LEDGER_FENCED", "info"),
        ("append", "NOT_ENOUGH_BOOKIES", "info"),
        ("append", "TIMEOUT", "info"),
        ("append", "UNAVAILABLE", "info"),
        ("append", "TOO_MANY_REQUESTS", "info"),
        ("append", "INTERNAL", "info"),
        ("append", "CLIENT_TIMEOUT", "info"),
        ("append", "CONNECTION_LOST", "info"),
        ("create", "NOT_ENOUGH_BOOKIES", "fail"),
        ("create", "TIMEOUT", "info"),
        ("recover", "UNAUTHORIZED", "fail"),
        ("recover", "TIMEOUT", "info"),
        ("close", "LEDGER_FENCED", "info"),
        ("read", "TIMEOUT", "fail"),
        ("lac", "CONNECTION_LOST", "fail"),
    ],
)
def test_outcome(kind: str, code: str, expected: str) -> None:
    assert outcome(kind, code) == expected


def test_a_broken_history_is_an_error_not_a_finding() -> None:
    h = H()
    op_id = h.append(1, [p(0)], 0)
    with pytest.raises(AssertionError, match="completed twice"):
        calls([*h.ops, h.ops[-1]])
    orphan = Op(9, 99, "ok", "w0", "append", 1, {})
    with pytest.raises(AssertionError, match="before its invoke"):
        calls([orphan])
    assert [c.invoke.op_id for c in calls(h.ops)] == [op_id]


def test_summary() -> None:
    h = H()
    payloads = acked(h, 2)
    op_id = h.append(1, [p(2), p(3)], None)
    h.complete(op_id, "info", code="TIMEOUT")
    op_id = h.append(1, [p(4)], None)
    h.complete(op_id, "fail", code="LEDGER_CLOSED")
    h.done("recover", 1, 1)
    final = closed(payloads, recovery_ms=12.5)
    got = summary(check(h.ops, [final]))
    assert got["ok"] is True
    assert got["operations"]["append"] == {
        "attempted": 4,
        "acked": 2,
        "failed": 1,
        "indeterminate": 1,
    }
    assert got["operations"]["recover"]["acked"] == 1
    assert got["entries"] == {"attempted": 5, "acked": 2, "failed": 1, "indeterminate": 2}
    assert got["lost"] == 0 and got["replicas_missing"] == 0
    assert got["recovery_ms"] == {"count": 1, "p50": 12.5, "max": 12.5}
    assert (got["ledgers"], got["final_entries"]) == (1, 2)
