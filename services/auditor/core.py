"""Pure auditor logic: which bookies changed availability between two looks at the registry."""

from __future__ import annotations

from dataclasses import dataclass

from shared.models import BookieInfo, BookieState


@dataclass(frozen=True, slots=True)
class BookieTransition:
    bookie_id: str
    before: BookieState | None  # None: not seen before
    after: BookieState


def bookie_transitions(
    previous: dict[str, BookieState], current: list[BookieInfo]
) -> list[BookieTransition]:
    """State changes since `previous` (bookie id -> state), in bookie id order."""
    changes = []
    for bookie in sorted(current, key=lambda b: b.bookie_id):
        before = previous.get(bookie.bookie_id)
        if before != bookie.state:
            changes.append(BookieTransition(bookie.bookie_id, before, bookie.state))
    return changes
