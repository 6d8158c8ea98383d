from services.auditor.core import BookieTransition, bookie_transitions
from shared.models import BookieInfo, BookieState

W, R, L = BookieState.WRITABLE, BookieState.READONLY, BookieState.LOST


def bookie(bid: str, state: BookieState) -> BookieInfo:
    return BookieInfo(bookie_id=bid, state=state, last_seen=0, lease_expires_at=0)


def test_transitions_report_only_changes() -> None:
    previous = {"b1": W, "b2": W, "b3": L}
    current = [bookie("b2", L), bookie("b1", W), bookie("b3", W), bookie("b4", W)]
    assert bookie_transitions(previous, current) == [
        BookieTransition("b2", W, L),
        BookieTransition("b3", L, W),
        BookieTransition("b4", None, W),
    ]


def test_no_change_no_transition() -> None:
    assert bookie_transitions({"b1": R}, [bookie("b1", R)]) == []
