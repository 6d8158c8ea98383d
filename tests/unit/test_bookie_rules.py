"""The bookie's per-ledger rules (shared.bookie.rules), table-driven: BookieLedgerState,
add admission, the fence/write_lac records, and the read answer for an absent entry."""

from __future__ import annotations

import pytest

from shared import wire
from shared.bookie.journal_format import (
    EntryRecord,
    FenceRecord,
    JournalPosition,
    LacRecord,
    LedgerDeletedRecord,
    LedgerStateRecord,
    MasterKeyRecord,
    decode_snapshot,
    encode_snapshot,
)
from shared.bookie.rules import (
    BookieLedgerState,
    absent_entry_status,
    absent_status,
    admit_add_items,
    admit_adds,
    has_authority,
    limbo_absent_status,
    meta_records,
    refuse_add_items,
    refuse_adds,
)
from shared.digest import DigestManager
from shared.status import BookieStatus
from shared.wire import FLAG_RECOVERY_ADD

KEY_A = b"a" * 20
KEY_B = b"b" * 20
DIGEST = DigestManager("crc32c")


def entry(
    ledger_id: int, entry_id: int, lac: int = -1, payload: bytes = b"x", key: bytes = KEY_A
) -> EntryRecord:
    return EntryRecord.of(key, DIGEST.sign(ledger_id, entry_id, lac, len(payload), payload))


# -- BookieLedgerState --------------------------------------------------------------------

# Each step: (operation, arguments, expected status or None for an apply).
SCENARIOS = {
    "first add sets the key": [
        ("add", (1, KEY_A, 0), BookieStatus.OK),
        ("add", (1, KEY_B, 0), BookieStatus.UNAUTHORIZED),
        ("add", (1, KEY_A, 0), BookieStatus.OK),
        ("add", (2, KEY_B, 0), BookieStatus.OK),
    ],
    "fenced refuses normal adds, takes recovery adds": [
        ("add", (1, KEY_A, 0), BookieStatus.OK),
        ("fence", (1, KEY_A), BookieStatus.OK),
        ("add", (1, KEY_A, 0), BookieStatus.FENCED),
        ("add", (1, KEY_A, FLAG_RECOVERY_ADD), BookieStatus.OK),
        ("add", (1, KEY_B, FLAG_RECOVERY_ADD), BookieStatus.UNAUTHORIZED),
    ],
    "fence of an unknown ledger sets its key": [
        ("fence", (5, KEY_B), BookieStatus.OK),
        ("add", (5, KEY_A, FLAG_RECOVERY_ADD), BookieStatus.UNAUTHORIZED),
        ("add", (5, KEY_B, 0), BookieStatus.FENCED),
        ("fence", (5, KEY_A), BookieStatus.UNAUTHORIZED),
    ],
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_bookie_ledger_state_rules(name: str) -> None:
    state = BookieLedgerState()
    for step, (op, args, expected) in enumerate(SCENARIOS[name]):
        if op == "add":
            ledger_id, key, flags = args
            got = state.check_add(ledger_id, key, flags)
            if got is BookieStatus.OK:
                state.apply(entry(ledger_id, step, key=key))
        else:
            ledger_id, key = args
            got = state.check_master_key(ledger_id, key)
            if got is BookieStatus.OK:
                if state.needs_master_key(ledger_id):
                    state.apply(MasterKeyRecord(ledger_id, key))
                state.apply(FenceRecord(ledger_id))
        assert got is expected, f"step {step}: {op}{args}"


def test_lac_is_the_max_of_piggybacked_and_explicit() -> None:
    state = BookieLedgerState()
    state.apply(entry(1, 0, lac=-1))
    state.apply(entry(1, 2, lac=1))
    state.apply(entry(1, 1, lac=0))  # out of order: LAC and last entry never go back
    facts = state.get(1)
    assert facts is not None and (facts.lac, facts.last_entry_id) == (1, 2)
    state.apply(LacRecord(1, 7))
    assert state.get(1).lac == 7
    state.apply(entry(1, 3, lac=2))
    assert state.get(1).lac == 7
    state.apply(LacRecord(1, 5))
    assert state.get(1).lac == 7


def test_snapshot_records_rebuild_the_same_state() -> None:
    state = BookieLedgerState()
    for record in [
        entry(1, 0),
        entry(1, 1, 0),
        MasterKeyRecord(2, KEY_B),
        FenceRecord(2),
        LacRecord(3, 4),
        entry(4, 0, key=KEY_B),
        FenceRecord(4),
    ]:
        state.apply(record)
    rebuilt = BookieLedgerState()
    snapshot = decode_snapshot(encode_snapshot(JournalPosition(1, 16), state.snapshot_records()))
    for record in snapshot.records:
        rebuilt.apply(record)
    assert rebuilt.snapshot_records() == state.snapshot_records()
    # Ledger 3 got an explicit LAC before any key: its key is still unset after reload.
    assert rebuilt.needs_master_key(3)
    assert rebuilt.check_add(3, KEY_B, 0) is BookieStatus.OK
    assert rebuilt.check_add(4, KEY_B, 0) is BookieStatus.FENCED


def test_tracked_changes_are_the_ledgers_a_record_touched() -> None:
    state = BookieLedgerState(track_changes=True)
    for record in [entry(1, 0), MasterKeyRecord(2, KEY_B), FenceRecord(3), LacRecord(4, 1)]:
        state.apply(record)
    assert state.take_changed() == {1, 2, 3, 4}
    state.apply(entry(1, 1, 0))
    state.apply(LedgerStateRecord(5, KEY_A, False, -1, -1))  # restored, not a change
    assert state.take_changed() == {1}
    assert state.take_changed() == set()
    state.restore_changed({7})
    assert state.take_changed() == {7}
    assert [r.ledger_id for r in state.snapshot_records({5, 1})] == [1, 5]
    with pytest.raises(AssertionError):
        state.copy().take_changed()  # the live copy tracks nothing


def test_copy_is_independent() -> None:
    state = BookieLedgerState()
    state.apply(entry(1, 0))
    other = state.copy()
    other.apply(FenceRecord(1))
    assert not state.get(1).fenced and other.get(1).fenced


# -- add admission ------------------------------------------------------------------------

OK, FENCED, UNAUTHORIZED = BookieStatus.OK, BookieStatus.FENCED, BookieStatus.UNAUTHORIZED
BAD_REQUEST = BookieStatus.BAD_REQUEST
RECOVERY = FLAG_RECOVERY_ADD
CRC32C = wire.add_flags("crc32c")


def add_item(ledger_id: int, entry_id: int, key: bytes = KEY_A, flags: int = 0) -> wire.AddItem:
    return wire.AddItem(flags, key, entry(ledger_id, entry_id, key=key).frame)


# (before: records applied first, items, expected (ledger, entry, status) per item,
#  expected admitted (ledger, entry)s)
ADMISSIONS = {
    "a fresh ledger takes every add": (
        [],
        [add_item(1, 0), add_item(1, 1)],
        [(1, 0, OK), (1, 1, OK)],
        [(1, 0), (1, 1)],
    ),
    "the first item sets the key the next is checked against": (
        [],
        [add_item(1, 0, KEY_A), add_item(1, 1, KEY_B), add_item(2, 0, KEY_B)],
        [(1, 0, OK), (1, 1, UNAUTHORIZED), (2, 0, OK)],
        [(1, 0), (2, 0)],
    ),
    "a fenced ledger refuses normal adds, takes recovery adds": (
        [MasterKeyRecord(1, KEY_A), FenceRecord(1)],
        [add_item(1, 5), add_item(1, 5, flags=RECOVERY), add_item(1, 6, KEY_B, RECOVERY)],
        [(1, 5, FENCED), (1, 5, OK), (1, 6, UNAUTHORIZED)],
        [(1, 5)],
    ),
    "a frame without a header is a bad request, the rest goes on": (
        [],
        [wire.AddItem(0, KEY_A, b"short"), add_item(3, 0)],
        [(0, -1, BAD_REQUEST), (3, 0, OK)],
        [(3, 0)],
    ),
    "an entry id the wire cannot carry back is a bad request": (
        [],
        [add_item(4, 2**63)],
        [(4, -1, BAD_REQUEST)],
        [],
    ),
}


@pytest.mark.parametrize("name", list(ADMISSIONS))
def test_admit_adds(name: str) -> None:
    before, items, expected, admitted = ADMISSIONS[name]
    state = BookieLedgerState()
    for record in before:
        state.apply(record)
    admission = admit_adds(state, items)
    assert [(r.ledger_id, r.entry_id, r.status) for r in admission.results] == expected
    assert [(r.ledger_id, r.entry_id) for r in admission.records] == admitted
    # Admitted records are applied to the state at once: the next batch sees them.
    for ledger_id, entry_id in admitted:
        facts = state.get(ledger_id)
        assert facts is not None and facts.last_entry_id >= entry_id


@pytest.mark.parametrize("name", list(ADMISSIONS))
def test_the_journals_tuple_path_admits_alike(name: str) -> None:
    """admit_add_items (the journal's path: tuples in, rows out) is admit_adds."""
    before, items, expected, admitted = ADMISSIONS[name]
    state = BookieLedgerState()
    for record in before:
        state.apply(record)
    rows, records = admit_add_items(state, [(i.flags, i.master_key, i.frame) for i in items])
    assert rows == expected
    assert [(r.ledger_id, r.entry_id) for r in records] == admitted
    assert all(type(r) is EntryRecord for r in records)


def test_admitted_records_carry_the_digest_code_of_the_add() -> None:
    admission = admit_adds(BookieLedgerState(), [add_item(1, 0, flags=CRC32C)])
    assert admission.records[0].digest_code == wire.digest_code_of(CRC32C) != 0


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (add_item(7, 3), (7, 3)),
        (wire.AddItem(0, KEY_A, b"short"), (0, -1)),
        (add_item(7, 2**63), (7, -1)),
    ],
)
def test_refuse_adds_answers_each_item_with_its_ids(item, expected) -> None:
    for status in (BookieStatus.READ_ONLY, BookieStatus.TOO_MANY_REQUESTS):
        assert refuse_adds([item], status) == [wire.AddResult(*expected, status)]
        raw = (item.flags, item.master_key, item.frame)
        assert refuse_add_items([raw], status) == [(*expected, status)]


# -- fence and explicit LAC ---------------------------------------------------------------

# (before, ledger, key, the fact to journal, expected status, expected records)
META = {
    "a ledger without a key journals the key first": (
        [],
        (1, KEY_A, FenceRecord(1)),
        OK,
        [MasterKeyRecord(1, KEY_A), FenceRecord(1)],
    ),
    "an explicit LAC before any add journals the key too": (
        [],
        (2, KEY_B, LacRecord(2, 4)),
        OK,
        [MasterKeyRecord(2, KEY_B), LacRecord(2, 4)],
    ),
    "a ledger with the key journals only the fact": (
        [MasterKeyRecord(1, KEY_A)],
        (1, KEY_A, FenceRecord(1)),
        OK,
        [FenceRecord(1)],
    ),
    "a keyed ledger after an add": (
        [entry(3, 0)],
        (3, KEY_A, LacRecord(3, 0)),
        OK,
        [LacRecord(3, 0)],
    ),
    "another key is refused, nothing journaled": (
        [MasterKeyRecord(1, KEY_A)],
        (1, KEY_B, FenceRecord(1)),
        UNAUTHORIZED,
        [],
    ),
    "a ledger known only by its LAC has no key yet": (
        [LacRecord(5, 2)],
        (5, KEY_B, FenceRecord(5)),
        OK,
        [MasterKeyRecord(5, KEY_B), FenceRecord(5)],
    ),
}


@pytest.mark.parametrize("name", list(META))
def test_meta_records(name: str) -> None:
    before, (ledger_id, key, record), status, records = META[name]
    state = BookieLedgerState()
    for applied in before:
        state.apply(applied)
    snapshot = state.snapshot_records()
    assert meta_records(state, ledger_id, key, record) == (status, records)
    assert state.snapshot_records() == snapshot, "the rule applies nothing itself"


# -- reads: the authority rule ------------------------------------------------------------


@pytest.mark.parametrize(
    ("applied", "acknowledged", "expected"),
    [
        (JournalPosition(1, 100), JournalPosition(1, 100), True),
        (JournalPosition(1, 120), JournalPosition(1, 100), True),
        (JournalPosition(1, 99), JournalPosition(1, 100), False),
        (JournalPosition(1, 5000), JournalPosition(2, 16), False),  # the file order first
        (JournalPosition(2, 0), JournalPosition(1, 5000), True),
    ],
)
def test_has_authority_once_everything_acknowledged_is_applied(
    applied, acknowledged, expected
) -> None:
    assert has_authority(applied, acknowledged) is expected


@pytest.mark.parametrize(
    ("known", "caught_up", "expected"),
    [
        (True, True, BookieStatus.NO_ENTRY),
        (False, True, BookieStatus.NO_LEDGER),
        (True, False, BookieStatus.UNKNOWN_LEDGER_STATE),
        (False, False, BookieStatus.UNKNOWN_LEDGER_STATE),
    ],
)
def test_absent_status_never_claims_absence_when_unsure(known, caught_up, expected) -> None:
    assert absent_status(known, caught_up) is expected


@pytest.mark.parametrize(
    ("first_entry_id", "entry_id", "expected"),
    [
        (None, 0, BookieStatus.UNKNOWN_LEDGER_STATE),  # not seen since the wipe
        (-1, 0, BookieStatus.UNKNOWN_LEDGER_STATE),  # fenced, no entry since
        (100, 50, BookieStatus.UNKNOWN_LEDGER_STATE),
        (100, 121, BookieStatus.NO_ENTRY),
        (0, 4, BookieStatus.NO_ENTRY),
    ],
)
def test_a_wiped_bookie_claims_absence_only_since_the_wipe(
    first_entry_id, entry_id, expected
) -> None:
    assert limbo_absent_status(first_entry_id, entry_id, authority=True) is expected
    assert absent_entry_status(entry_id, first_entry_id, True, limbo=True) is expected


@pytest.mark.parametrize(
    ("entry_id", "first_entry_id", "authority", "limbo", "expected"),
    [
        (3, 0, True, False, BookieStatus.NO_ENTRY),
        (3, -1, True, False, BookieStatus.NO_ENTRY),  # known (fenced), no entries
        (3, None, True, False, BookieStatus.NO_LEDGER),
        (3, 0, False, False, BookieStatus.UNKNOWN_LEDGER_STATE),
        (3, None, False, False, BookieStatus.UNKNOWN_LEDGER_STATE),
        (3, 0, False, True, BookieStatus.UNKNOWN_LEDGER_STATE),
        (3, 0, True, True, BookieStatus.NO_ENTRY),
        (3, 5, True, True, BookieStatus.UNKNOWN_LEDGER_STATE),
    ],
)
def test_absent_entry_status(entry_id, first_entry_id, authority, limbo, expected) -> None:
    assert absent_entry_status(entry_id, first_entry_id, authority, limbo) is expected


def test_a_deleted_ledger_is_forgotten_and_a_snapshot_segment_says_so():
    state = BookieLedgerState(track_changes=True)
    state.apply(MasterKeyRecord(1, KEY_A))
    state.apply(FenceRecord(1))
    state.apply(MasterKeyRecord(2, KEY_B))
    earlier = state.snapshot_records()
    state.take_changed()
    state.apply(LedgerDeletedRecord(1))
    state.apply(LedgerDeletedRecord(9))  # never known: nothing changes
    assert 1 not in state and 2 in state
    changed = state.take_changed()
    assert changed == {1}
    segment = state.snapshot_records(changed)
    assert [(r.ledger_id, r.deleted) for r in segment] == [(1, True)]
    # Restoring the earlier rows and then the segment leaves ledger 1 gone.
    restored = BookieLedgerState()
    restored.restore([*earlier, *segment])
    assert 1 not in restored and restored.get(2).master_key == KEY_B
    # A ledger deleted and then added again starts afresh: any key is accepted.
    assert restored.check_master_key(1, KEY_B) is BookieStatus.OK
