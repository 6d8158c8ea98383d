"""The bookie wire codec: round trips, and malformed input is a WireError, never a crash."""

import pytest

from shared import wire
from shared.digest import DigestManager
from shared.status import BookieStatus

KEY = b"k" * 20


def frame(ledger: int, entry: int, payload: bytes = b"x") -> bytes:
    return DigestManager("crc32c").sign(ledger, entry, entry - 1, entry + 1, payload)


def test_add_request_round_trip() -> None:
    items = [
        wire.AddItem(0, KEY, frame(7, 0)),
        wire.AddItem(wire.FLAG_RECOVERY_ADD, KEY, frame(7, 1, b"")),
    ]
    assert wire.decode_add_request(wire.encode_add_request(items)) == items


def test_the_bookies_tuple_codec_agrees_with_the_dataclass_one() -> None:
    """decode_add_items / encode_add_reply_rows (the journal's path, no object per entry)
    read and write the same bytes as decode_add_request / encode_add_reply."""
    items = [
        wire.AddItem(wire.add_flags("crc32c"), KEY, frame(7, 0)),
        wire.AddItem(wire.FLAG_RECOVERY_ADD, b"j" * 20, frame(7, 1, b"")),
        wire.AddItem(0, KEY, b""),  # no frame at all: decodes, the rules refuse it
    ]
    data = wire.encode_add_request(items)
    assert wire.decode_add_items(data) == [(i.flags, i.master_key, i.frame) for i in items]
    assert wire.decode_add_items(wire.encode_add_request([])) == []
    results = [wire.AddResult(7, 0, BookieStatus.OK), wire.AddResult(0, -1, BookieStatus.FENCED)]
    rows = [(r.ledger_id, r.entry_id, r.status) for r in results]
    assert wire.encode_add_reply_rows(BookieStatus.OK, rows) == wire.encode_add_reply(
        BookieStatus.OK, results
    )
    assert wire.decode_add_reply(wire.encode_add_reply_rows(BookieStatus.BAD_REQUEST, [])) == (
        BookieStatus.BAD_REQUEST,
        [],
    )


def test_add_reply_round_trip() -> None:
    results = [wire.AddResult(7, 0, BookieStatus.OK), wire.AddResult(7, 1, BookieStatus.FENCED)]
    data = wire.encode_add_reply(BookieStatus.OK, results)
    assert wire.decode_add_reply(data) == (BookieStatus.OK, results)


def test_read_round_trip() -> None:
    items = [wire.ReadItem(1, 0), wire.ReadItem(2**63 - 1, -1, 1)]
    assert wire.decode_read_request(wire.encode_read_request(items)) == wire.ReadRequest(items, 0)
    budget = wire.decode_read_request(wire.encode_read_request(items, timeout_ms=2_000))
    assert budget == wire.ReadRequest(items, 2_000)
    results = [
        wire.ReadResult(1, 0, BookieStatus.OK, frame(1, 0)),
        wire.ReadResult(1, 1, BookieStatus.NO_ENTRY),
    ]
    data = wire.encode_read_reply(BookieStatus.OK, results)
    assert wire.decode_read_reply(data) == (BookieStatus.OK, results)


def test_small_messages_round_trip() -> None:
    assert wire.decode_read_lac_request(wire.encode_read_lac_request(9)) == 9
    lac = wire.LacReply(BookieStatus.OK, 41, 42)
    assert wire.decode_lac_reply(wire.encode_lac_reply(lac)) == lac
    assert wire.decode_fence_request(wire.encode_fence_request(9, KEY)) == (9, KEY)
    items = [(9, KEY, 3), (10, KEY, -1), (2**63, KEY, 7)]
    for batch in (items[:1], items):
        assert wire.decode_write_lac_request(wire.encode_write_lac_request(batch)) == batch
    statuses = [BookieStatus.OK, BookieStatus.UNAUTHORIZED, BookieStatus.BAD_REQUEST]
    assert wire.decode_write_lac_reply(wire.encode_write_lac_reply(statuses), 3) == statuses
    # One status answers every item (a request refused whole).
    refused = wire.encode_write_lac_reply([BookieStatus.BAD_REQUEST])
    assert wire.decode_write_lac_reply(refused, 3) == [BookieStatus.BAD_REQUEST] * 3


def test_a_single_write_lac_keeps_the_classic_bytes() -> None:
    """One item is the write_lac of before: v | ledger | key | lac, answered v | status."""
    assert wire.encode_write_lac_request([(9, KEY, 3)]) == (
        b"\x01" + (9).to_bytes(8, "big") + KEY + (3).to_bytes(8, "big")
    )
    assert wire.encode_write_lac_reply([BookieStatus.FENCED]) == b"\x01\x01\xf8"


GOOD_ADD = wire.encode_add_request([wire.AddItem(0, KEY, frame(1, 0))])
GOOD_ADD_REPLY = wire.encode_add_reply(
    BookieStatus.OK,
    [wire.AddResult(1, 0, BookieStatus.OK), wire.AddResult(1, 1, BookieStatus.FENCED)],
)


def test_add_reply_round_trips() -> None:
    status, results = wire.decode_add_reply(GOOD_ADD_REPLY)
    assert status is BookieStatus.OK
    assert results == [
        wire.AddResult(1, 0, BookieStatus.OK),
        wire.AddResult(1, 1, BookieStatus.FENCED),
    ]


@pytest.mark.parametrize(
    ("decoder", "data"),
    [
        (wire.decode_add_request, b""),
        (wire.decode_add_request, b"\x02" + GOOD_ADD[1:]),  # unknown version
        (wire.decode_add_request, GOOD_ADD[:-1]),  # truncated frame
        (wire.decode_add_request, GOOD_ADD + b"!"),  # trailing bytes
        (wire.decode_add_request, GOOD_ADD[:3]),  # truncated count
        (wire.decode_add_items, b""),
        (wire.decode_add_items, b"\x02" + GOOD_ADD[1:]),  # unknown version
        (wire.decode_add_items, GOOD_ADD[:-1]),  # truncated frame
        (wire.decode_add_items, GOOD_ADD[:20]),  # truncated item header
        (wire.decode_add_items, GOOD_ADD + b"!"),  # trailing bytes
        (wire.decode_add_items, GOOD_ADD[:3]),  # truncated count
        (wire.decode_add_items, b"\x01\xff\xff\xff\xff"),  # a count with no items
        (wire.decode_read_request, wire.encode_read_request([wire.ReadItem(1, 2)])[:-1]),
        (wire.decode_read_request, wire.encode_read_request([wire.ReadItem(1, 2)])[:8]),
        # A request without the timeout field (the format before it) is the wrong length.
        (wire.decode_read_request, b"\x01\x00\x00\x00\x01" + bytes(17)),
        (wire.decode_read_lac_request, b"\x01\x00"),
        (wire.decode_fence_request, b"\x01" + b"\x00" * 8),
        (wire.decode_write_lac_request, b"\x01"),  # no item
        (wire.decode_write_lac_request, wire.encode_write_lac_request([(9, KEY, 3)]) + b"!"),
        (wire.decode_add_reply, wire.encode_add_reply(BookieStatus.OK, [])[:2]),
        (wire.decode_add_reply, GOOD_ADD_REPLY[:-1]),  # a result cut short
        (wire.decode_add_reply, GOOD_ADD_REPLY[:-2] + b"\x00\x07"),  # unknown status 7
    ],
)
def test_malformed_messages_raise_wire_error(decoder, data: bytes) -> None:
    with pytest.raises(wire.WireError):
        decoder(data)


@pytest.mark.parametrize("data", [b"\x01\x00\x07", b"\x01\x00\x00\x00\x00"])
def test_malformed_write_lac_replies_raise_wire_error(data: bytes) -> None:
    """An unknown status (7), or a count of statuses that is neither 1 nor the items'."""
    with pytest.raises(wire.WireError):
        wire.decode_write_lac_reply(data, 3)


def test_master_key_must_be_20_bytes() -> None:
    with pytest.raises(ValueError):
        wire.encode_add_request([wire.AddItem(0, b"short", b"")])
