"""The metadata service's pure decisions."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.metadata import core
from services.metadata.core import InvalidRequest, LedgerChange
from shared.models import (
    BookieInfo,
    BookieState,
    CreateLedgerRequest,
    LedgerIdRequest,
    LedgerState,
    RegisterBookieRequest,
    Segment,
    UpdateLedgerRequest,
)


@pytest.mark.parametrize(
    ("declared", "expires_at", "now", "expected"),
    [
        (BookieState.WRITABLE, 1_000, 999, BookieState.WRITABLE),
        (BookieState.WRITABLE, 1_000, 1_000, BookieState.LOST),
        (BookieState.WRITABLE, 1_000, 5_000, BookieState.LOST),
        (BookieState.READONLY, 1_000, 0, BookieState.READONLY),
        (BookieState.READONLY, 1_000, 1_001, BookieState.LOST),
    ],
)
def test_bookie_state_follows_the_lease(declared, expires_at, now, expected) -> None:
    assert core.bookie_state(declared, expires_at, now) is expected


@pytest.mark.parametrize(
    ("previous", "current", "news"),
    [
        (None, BookieState.WRITABLE, True),
        (BookieState.WRITABLE, BookieState.WRITABLE, False),
        (BookieState.WRITABLE, BookieState.READONLY, True),
        (BookieState.LOST, BookieState.WRITABLE, True),
    ],
)
def test_registration_news(previous, current, news) -> None:
    info = BookieInfo(bookie_id="b", state=current, last_seen=0, lease_expires_at=1)
    assert core.registration_is_news(previous, current) is news
    assert [e.kind for e in core.bookie_events(info, previous)] == (
        ["bookie.registered"] if news else []
    )


def test_registering_as_lost_is_refused() -> None:
    core.check_registration(RegisterBookieRequest(bookie_id="b", state=BookieState.READONLY))
    with pytest.raises(InvalidRequest, match="lost"):
        core.check_registration(RegisterBookieRequest(bookie_id="b", state=BookieState.LOST))


@pytest.mark.parametrize(
    ("ids", "limit", "page", "next_after"),
    [
        ([], 10, [], None),
        ([1, 2, 3], 3, [1, 2, 3], None),
        ([1, 2, 3, 4], 3, [1, 2, 3], 3),
        ([7], 1, [7], None),
        ([7, 9], 1, [7], 7),
    ],
)
def test_list_page(ids, limit, page, next_after) -> None:
    assert core.list_page(ids, limit, key=lambda i: i) == (page, next_after)


def test_list_window() -> None:
    assert core.list_start(None) == -1
    assert core.list_start(41) == 41
    assert core.list_fetch_limit(100) == 101


def seg(first: int, *bookies: str) -> Segment:
    return Segment(first_entry_id=first, bookies=list(bookies))


@pytest.mark.parametrize(
    ("segments", "problem"),
    [
        ([], "empty"),
        ([seg(1, "a")], "entry 0"),
        ([seg(0, "a"), seg(0, "b")], "increasing"),
        ([seg(0, "a"), seg(5, "b"), seg(3, "c")], "increasing"),
        ([seg(0, "a", "a")], "twice"),
    ],
)
def test_bad_segments(segments, problem) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        core.check_segments(segments)


def test_good_segments_and_updates_without_segments_pass() -> None:
    core.check_segments([seg(0, "a", "b"), seg(4, "a", "c"), seg(9, "d", "c")])
    core.check_update(UpdateLedgerRequest(ledger_id=1, expected_version=0, length=5))


def test_new_ledger() -> None:
    request = CreateLedgerRequest(
        ensemble_size=2,
        write_quorum=2,
        ack_quorum=1,
        digest="crc32",
        ensemble=["a", "b"],
        metadata={"k": "v"},
        password_salt="s",
        password_hash="h",
        master_key="1" * 40,
        mac_key="2" * 40,
    )
    meta = core.new_ledger(request, ledger_id=7, ctime_ms=123)
    assert (meta.ledger_id, meta.state, meta.version, meta.ctime) == (7, LedgerState.OPEN, 0, 123)
    assert meta.segments == [seg(0, "a", "b")]
    assert (meta.last_entry_id, meta.length, meta.metadata) == (None, 0, {"k": "v"})
    assert (meta.password_salt, meta.password_hash) == ("s", "h")
    assert (meta.master_key, meta.mac_key, meta.format_version) == ("1" * 40, "2" * 40, 3)


def test_ledger_keys_must_be_hex_of_a_sha1() -> None:
    with pytest.raises(ValidationError):
        CreateLedgerRequest(
            ensemble_size=1,
            write_quorum=1,
            ack_quorum=1,
            digest="crc32c",
            ensemble=["a"],
            master_key="not hex",
        )


def change(previous: LedgerState, state: LedgerState, segments_changed: bool) -> LedgerChange:
    request = CreateLedgerRequest(
        ensemble_size=1, write_quorum=1, ack_quorum=1, digest="crc32c", ensemble=["a"]
    )
    meta = core.new_ledger(request, 3, 0).model_copy(
        update={"state": state, "version": 4, "last_entry_id": 9, "length": 99}
    )
    return LedgerChange(metadata=meta, previous_state=previous, segments_changed=segments_changed)


@pytest.mark.parametrize(
    ("previous", "state", "segments_changed", "kind"),
    [
        (LedgerState.OPEN, LedgerState.CLOSED, False, "ledger.closed"),
        (LedgerState.IN_RECOVERY, LedgerState.CLOSED, False, "ledger.closed"),
        (LedgerState.CLOSED, LedgerState.CLOSED, True, "ledger.updated"),
        (LedgerState.OPEN, LedgerState.OPEN, True, "ledger.updated"),
        (LedgerState.OPEN, LedgerState.IN_RECOVERY, False, "ledger.updated"),
    ],
)
def test_change_events(previous, state, segments_changed, kind) -> None:
    [event] = core.change_events(change(previous, state, segments_changed))
    assert event.kind == kind
    assert event.data["ensemble_changed"] is segments_changed
    if kind == "ledger.closed":
        assert (event.data["last_entry_id"], event.data["length"]) == (9, 99)
    assert ("segments" in event.data) is (kind == "ledger.updated" and segments_changed)


def test_validation_errors_read_as_one_line() -> None:
    with pytest.raises(ValidationError) as bad:
        LedgerIdRequest.model_validate_json(b'{"ledger_id": "x", "extra": 1}')
    message = core.describe_validation_error(bad.value)
    assert "ledger_id:" in message and "extra:" in message and "\n" not in message
    with pytest.raises(ValidationError) as many:
        UpdateLedgerRequest.model_validate({f"f{i}": i for i in range(10)})
    assert many.value.error_count() > core.MAX_REPORTED_ERRORS
    assert core.describe_validation_error(many.value).endswith("more")


@pytest.mark.parametrize(
    ("hosts", "attrs", "safe"),
    [
        ([""], None, True),  # libpq's default host
        (["db"], None, True),
        (["db"], "any", True),
        (["pg1", "pg2"], "read-write", True),
        (["pg1", "pg2"], "primary", True),
        (["pg1", "pg2"], None, False),  # libpq's `any`: a standby may be chosen
        (["pg1", "pg2"], "any", False),
        (["pg1", "pg2", "pg3"], "prefer-standby", False),
        (["pg1", "pg2"], "read-only", False),
    ],
)
def test_several_database_hosts_need_the_primary_only(hosts, attrs, safe) -> None:
    problem = core.multi_host_problem(hosts, attrs)
    assert (problem is None) is safe
    if not safe:
        assert "target_session_attrs=read-write" in problem
