"""Entry frames: every digest type signs and verifies, and any damage is caught."""

import pytest

from shared.digest import (
    DIGEST_SIZES,
    HEADER_SIZE,
    DigestManager,
    DigestMismatch,
    DigestType,
    LedgerKeys,
    mac_key,
    master_key,
    parse_header,
)


@pytest.mark.parametrize("digest", list(DigestType))
def test_sign_then_verify(digest: DigestType) -> None:
    dm = DigestManager(digest, b"secret")
    frame = dm.sign(5, 9, 8, 1234, b"payload")
    assert len(frame) == HEADER_SIZE + DIGEST_SIZES[digest] + len(b"payload")
    entry = dm.verify(frame, 5, 9)
    assert (entry.ledger_id, entry.entry_id, entry.lac, entry.length, entry.payload) == (
        5,
        9,
        8,
        1234,
        b"payload",
    )
    assert parse_header(frame) == (5, 9, 8, 1234)
    assert dm.check(frame, 5, 9) == (8, 1234)
    assert dm.payload(frame) == b"payload"


@pytest.mark.parametrize("digest", [DigestType.CRC32, DigestType.CRC32C, DigestType.HMAC])
@pytest.mark.parametrize("offset", [0, 9, 17, 25, HEADER_SIZE, -1])
def test_any_flipped_byte_is_caught(digest: DigestType, offset: int) -> None:
    dm = DigestManager(digest, b"secret")
    frame = bytearray(dm.sign(5, 9, 8, 1234, b"payload"))
    frame[offset] ^= 0x01
    with pytest.raises(DigestMismatch):
        dm.verify(bytes(frame), 5, 9)
    with pytest.raises(DigestMismatch):
        dm.check(bytes(frame), 5, 9)


def test_frame_of_another_entry_is_rejected_even_with_a_good_digest() -> None:
    dm = DigestManager("crc32c")
    frame = dm.sign(5, 9, 8, 1, b"p")
    with pytest.raises(DigestMismatch):
        dm.verify(frame, 5, 10)
    with pytest.raises(DigestMismatch):
        dm.verify(frame, 6, 9)


def test_hmac_depends_on_the_password() -> None:
    frame = DigestManager("hmac", b"right").sign(1, 0, -1, 1, b"p")
    with pytest.raises(DigestMismatch):
        DigestManager("hmac", b"wrong").verify(frame, 1, 0)


def test_short_frames_are_rejected() -> None:
    with pytest.raises(DigestMismatch):
        DigestManager("crc32c").verify(b"\x00" * 10, 0, 0)
    with pytest.raises(DigestMismatch):
        DigestManager("hmac").verify(b"\x00" * (HEADER_SIZE + 3), 0, 0)


def test_master_key_is_not_the_password() -> None:
    key = master_key(b"pw")
    assert len(key) == 20 and b"pw" not in key
    assert master_key(b"pw") == key != master_key(b"pw2")


def test_unknown_digest_type() -> None:
    with pytest.raises(ValueError):
        DigestManager("md5")


def test_ledger_keys_come_from_the_password_or_the_stored_metadata() -> None:
    keys = LedgerKeys.from_password(b"secret")
    assert keys == LedgerKeys(master_key(b"secret"), mac_key(b"secret"))

    class Stored:
        master_key = keys.master_key.hex()
        mac_key = keys.mac_key.hex()

    class Older:
        master_key = ""
        mac_key = ""

    assert LedgerKeys.of(Stored()) == keys
    assert LedgerKeys.of(Older()) is None


@pytest.mark.parametrize("digest", list(DigestType))
def test_a_digest_manager_from_keys_signs_as_one_from_the_password(digest: DigestType) -> None:
    by_password = DigestManager(digest, b"secret")
    by_keys = DigestManager.for_keys(digest, LedgerKeys.from_password(b"secret"))
    frame = by_password.sign(3, 4, 2, 100, b"payload")
    assert by_keys.sign(3, 4, 2, 100, b"payload") == frame
    assert by_keys.verify(frame, 3, 4).payload == b"payload"
