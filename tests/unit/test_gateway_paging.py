"""The range pager (services/gateway/paging.py) at its edges, table-driven, over a fake of
`Ledgers.read_range`: the pager only decides which pages to ask for and when to stop, so
a fake that keeps read_range's contract (capped at the LAC unless unconfirmed; an
unconfirmed range stops at the first entry no replica has; at most a page per call) is all
it needs. The real read_range is exercised by tests/integration/test_gateway_http.py and
test_gateway_grpc.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from services.gateway.paging import Page, read_pages
from shared.status import ApiCodes, QuireError

PAGE = 4
LEDGER = 7
PASSWORD = b"pw"


@dataclass
class FakeLedgers:
    """Entries 0..stored-1 exist; `lacs` is the LAC each successive read sees (the last
    one repeats), so a test can move the LAC while a read is under way."""

    stored: int
    lacs: list[int]
    fail_on_call: int | None = None  # this call (0-based) fails with TIMEOUT
    calls: list[tuple[int, int | None, bool]] = field(default_factory=list)

    async def read_range(
        self,
        ledger_id: int,
        password: bytes | None,
        first: int,
        last: int | None,
        unconfirmed: bool = False,
    ) -> tuple[list[tuple[int, bytes]], int]:
        assert (ledger_id, password) == (LEDGER, PASSWORD)
        call = len(self.calls)
        self.calls.append((first, last, unconfirmed))
        if call == self.fail_on_call:
            raise QuireError(ApiCodes.TIMEOUT, "no bookie answered")
        lac = self.lacs[min(call, len(self.lacs) - 1)]
        if last is None:
            if unconfirmed:
                raise QuireError(ApiCodes.INVALID_ARGUMENT, "an unconfirmed read needs `to`")
            last = first + PAGE - 1
        # Ledgers refuses a range longer than a page: the pager must never ask for one.
        assert first - 1 <= last <= first + PAGE - 1, (first, last)
        if not unconfirmed:
            last = min(last, lac)
        entries = []
        for entry_id in range(first, last + 1):
            if entry_id >= self.stored:
                assert unconfirmed and entry_id > lac, "an entry up to the LAC is missing"
                break  # the first entry no replica has ends an unconfirmed range
            entries.append((entry_id, b"e%d" % entry_id))
        return entries, lac


async def pages_of(fake: FakeLedgers, first: int, last: int | None, unconfirmed: bool) -> list:
    return [
        page
        async for page in read_pages(
            fake, LEDGER, PASSWORD, first, last, unconfirmed=unconfirmed, page_entries=PAGE
        )
    ]


def shape(pages: list[Page]) -> list[tuple[list[int], int, bool]]:
    return [([entry_id for entry_id, _ in p.entries], p.lac, p.final) for p in pages]


# (name, stored, lacs, first, last, unconfirmed, pages as (entry ids, lac, final), asked)
CASES = [
    (
        "empty range: one empty page that still answers the LAC",
        10, [9], 5, 4, False,
        [([], 9, True)],
        [(5, 4)],
    ),
    (
        "within one page, below the LAC",
        10, [9], 0, 2, False,
        [([0, 1, 2], 9, True)],
        [(0, 2)],
    ),
    (
        "crossing the LAC: capped there, the short page is the last",
        10, [6], 1, 20, False,
        [([1, 2, 3, 4], 6, False), ([5, 6], 6, True)],
        [(1, 4), (5, 6)],
    ),
    (
        "the LAC on a page boundary: no extra empty read",
        10, [7], 0, 20, False,
        [([0, 1, 2, 3], 7, False), ([4, 5, 6, 7], 7, True)],
        [(0, 3), (4, 7)],
    ),
    (
        "a full last page ends the range",
        20, [19], 0, 11, False,
        [([0, 1, 2, 3], 19, False), ([4, 5, 6, 7], 19, False), ([8, 9, 10, 11], 19, True)],
        [(0, 3), (4, 7), (8, 11)],
    ),
    (
        "a short last page: the range ends inside it",
        20, [19], 0, 9, False,
        [([0, 1, 2, 3], 19, False), ([4, 5, 6, 7], 19, False), ([8, 9], 19, True)],
        [(0, 3), (4, 7), (8, 9)],
    ),
    (
        "a range that starts beyond the LAC is empty",
        10, [5], 8, 12, False,
        [([], 5, True)],
        [(8, 11)],
    ),
    (
        "the LAC moving during the read does not stretch a confirmed range",
        20, [5, 15], 0, 19, False,
        [([0, 1, 2, 3], 5, False), ([4, 5], 15, True)],
        [(0, 3), (4, 5)],
    ),
    (
        "unconfirmed: past the LAC, up to the first entry no replica has",
        10, [3], 0, 20, True,
        [([0, 1, 2, 3], 3, False), ([4, 5, 6, 7], 3, False), ([8, 9], 3, True)],
        [(0, 3), (4, 7), (8, 11)],
    ),
    (
        "unconfirmed: the first missing entry opens a page, which comes back empty",
        8, [3], 0, 20, True,
        [([0, 1, 2, 3], 3, False), ([4, 5, 6, 7], 3, False), ([], 3, True)],
        [(0, 3), (4, 7), (8, 11)],
    ),
    (
        "unconfirmed: the range ends before what exists",
        20, [3], 2, 6, True,
        [([2, 3, 4, 5], 3, False), ([6], 3, True)],
        [(2, 5), (6, 6)],
    ),
    (
        "no last: one page from first, capped at the LAC",
        20, [19], 2, None, False,
        [([2, 3, 4, 5], 19, True)],
        [(2, None)],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("stored", "lacs", "first", "last", "unconfirmed", "expected", "asked"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
async def test_pages(stored, lacs, first, last, unconfirmed, expected, asked) -> None:
    fake = FakeLedgers(stored, lacs)
    pages = await pages_of(fake, first, last, unconfirmed)
    assert shape(pages) == expected
    assert fake.calls == [(f, la, unconfirmed) for f, la in asked]
    assert all(data == b"e%d" % entry_id for p in pages for entry_id, data in p.entries)


async def test_a_page_is_read_only_when_the_previous_one_was_taken() -> None:
    fake = FakeLedgers(20, [19])
    pages = read_pages(fake, LEDGER, PASSWORD, 0, 19, page_entries=PAGE)
    first = await anext(pages)
    assert not first.final and fake.calls == [(0, 3, False)]
    await pages.aclose()
    assert len(fake.calls) == 1


async def test_an_error_on_a_later_page_ends_the_iteration_with_it() -> None:
    fake = FakeLedgers(20, [19], fail_on_call=1)
    pages = read_pages(fake, LEDGER, PASSWORD, 0, 19, page_entries=PAGE)
    assert [e for e, _ in (await anext(pages)).entries] == [0, 1, 2, 3]
    with pytest.raises(QuireError) as raised:
        await anext(pages)
    assert raised.value.api == ApiCodes.TIMEOUT
    with pytest.raises(StopAsyncIteration):
        await anext(pages)


async def test_an_open_unconfirmed_range_is_refused_by_read_range() -> None:
    with pytest.raises(QuireError) as raised:
        await pages_of(FakeLedgers(10, [3]), 0, None, True)
    assert raised.value.api == ApiCodes.INVALID_ARGUMENT


async def test_a_page_holds_at_least_one_entry() -> None:
    with pytest.raises(ValueError, match="page_entries"):
        await anext(read_pages(FakeLedgers(1, [0]), LEDGER, PASSWORD, 0, 0, page_entries=0))
