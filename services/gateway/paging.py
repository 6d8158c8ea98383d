"""Range reads in pages: the paging rule `Ledgers.read_stream` reads by (and through it
the HTTP range read and the gRPC `Read` and `Tail` streams).

A bookie read batch holds at most `max_batch_entries` entries, so a longer range is read a
page at a time and handed on as it arrives, never held whole. The rule:

- A confirmed range ends at the LAC the first page saw: the range is what was acknowledged
  when the read began, so one LAC describes every entry the read returns.
- An unconfirmed range ends at `last`, or earlier at the first entry no replica has
  (`Ledgers.read_range` stops there).
- A page that comes back shorter than asked, or reaches the end, is the final page. An empty
  range still reads one (empty) page: it checks the password and answers the LAC.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Protocol


class RangeReader(Protocol):
    """What the pager needs of `Ledgers`: its range read of at most one page."""

    async def read_range(
        self,
        ledger_id: int,
        password: bytes | None,
        first: int,
        last: int | None,
        unconfirmed: bool = False,
    ) -> tuple[list[tuple[int, bytes]], int]: ...


@dataclass(frozen=True, slots=True)
class Page:
    entries: list[tuple[int, bytes]]  # (entry id, payload), dense and in order
    lac: int  # the LAC this page's read saw
    final: bool  # no page follows


async def read_pages(
    ledgers: RangeReader,
    ledger_id: int,
    password: bytes | None,
    first: int,
    last: int | None,
    *,
    unconfirmed: bool = False,
    page_entries: int,
) -> AsyncGenerator[Page, None]:
    """Entries first..last (inclusive) in pages of at most `page_entries`, each read when the
    previous one has been taken. `last` None reads a single page from `first`, as
    `read_range` reads an open range (capped at the LAC; an unconfirmed read needs `last`).
    Errors of any page propagate from the iteration."""
    if page_entries < 1:
        raise ValueError(f"page_entries must be at least 1, not {page_entries}")
    if last is None:
        entries, lac = await ledgers.read_range(ledger_id, password, first, None, unconfirmed)
        yield Page(entries, lac, final=True)
        return
    end: int | None = last if unconfirmed else None  # confirmed: known after the first page
    following = first
    while True:
        asked_last = min(last if end is None else end, following + page_entries - 1)
        entries, lac = await ledgers.read_range(
            ledger_id, password, following, asked_last, unconfirmed
        )
        if end is None:
            end = min(last, lac)
        assert not entries or (
            entries[0][0] == following and entries[-1][0] == following + len(entries) - 1
        ), f"read_range answered {following}..{asked_last} out of order"
        final = (
            not entries
            or len(entries) < asked_last - following + 1  # capped, or unconfirmed end
            or entries[-1][0] >= end
        )
        yield Page(entries, lac, final)
        if final:
            return
        following = entries[-1][0] + 1
