"""Quorum arithmetic, table-driven."""

import pytest

from shared.quorum import AckSet, QuorumSpec, write_set


@pytest.mark.parametrize(
    ("entry", "spec", "expected"),
    [
        (0, (3, 3, 2), (0, 1, 2)),
        (1, (3, 3, 2), (1, 2, 0)),
        (0, (5, 3, 2), (0, 1, 2)),
        (3, (5, 3, 2), (3, 4, 0)),
        (4, (5, 2, 2), (4, 0)),
        (7, (1, 1, 1), (0,)),
        (10, (4, 3, 3), (2, 3, 0)),
    ],
)
def test_write_set(entry: int, spec: tuple[int, int, int], expected: tuple[int, ...]) -> None:
    assert write_set(entry, QuorumSpec(*spec)) == expected


@pytest.mark.parametrize("spec", [(3, 4, 2), (3, 2, 3), (0, 0, 0), (3, 3, 0)])
def test_invalid_quorums_are_refused(spec: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        QuorumSpec(*spec)


def test_ack_set_completes_at_ack_quorum_and_counts_duplicates_once() -> None:
    acks = AckSet(1, QuorumSpec(3, 3, 2))
    assert not acks.add(1)
    assert not acks.add(1)
    assert acks.add(0)
    assert acks.acked == {0, 1}
    acks.remove(0)
    assert not acks.complete


def test_ack_from_outside_the_write_set_is_a_bug() -> None:
    acks = AckSet(0, QuorumSpec(5, 2, 2))
    with pytest.raises(ValueError):
        acks.add(3)
