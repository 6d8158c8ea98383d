"""Quorum arithmetic (BookKeeper's RoundRobinDistributionSchedule), shared by the gateway
and the replicator. Pure: no IO, no clock."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class QuorumSpec:
    ensemble_size: int
    write_quorum: int
    ack_quorum: int

    def __post_init__(self) -> None:
        if not 1 <= self.ack_quorum <= self.write_quorum <= self.ensemble_size:
            raise ValueError(
                "need 1 <= ack_quorum <= write_quorum <= ensemble_size, got "
                f"E={self.ensemble_size} Qw={self.write_quorum} Qa={self.ack_quorum}"
            )


def write_set(entry_id: int, spec: QuorumSpec) -> tuple[int, ...]:
    """Ensemble indexes that store `entry_id`: (e + i) mod E for i in [0, Qw)."""
    size = spec.ensemble_size
    return _write_set(entry_id % size, size, spec.write_quorum)


# Every add computes its write set several times (send, each ack, the ack set): there are
# only E of them per quorum shape, so they are computed once.
_WRITE_SETS_CACHED = 4096


@lru_cache(maxsize=_WRITE_SETS_CACHED)
def _write_set(first: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    return tuple((first + i) % ensemble_size for i in range(write_quorum))


@lru_cache(maxsize=_WRITE_SETS_CACHED)
def _write_set_members(first: int, ensemble_size: int, write_quorum: int) -> frozenset[int]:
    return frozenset(_write_set(first, ensemble_size, write_quorum))


def read_order(entry_id: int, spec: QuorumSpec, block_entries: int) -> tuple[int, ...]:
    """Ensemble indexes to try when reading `entry_id`: its write set, starting from its
    block's bookie. Entries go to their replicas in blocks of `block_entries` (a sticky read
    that rotates): block k prefers ensemble index k mod E, so a bookie is asked for runs of
    contiguous entries (which its read-ahead serves) and the blocks spread over the ensemble.
    An entry the preferred bookie does not store (E > Qw) goes first to the member of its
    write set nearest after it around the ensemble, then on around the ring."""
    size = spec.ensemble_size
    preferred = (entry_id // block_entries) % size
    return _read_order(entry_id % size, preferred, size, spec.write_quorum)


@lru_cache(maxsize=_WRITE_SETS_CACHED)
def _read_order(
    first: int, preferred: int, ensemble_size: int, write_quorum: int
) -> tuple[int, ...]:
    members = _write_set(first, ensemble_size, write_quorum)
    return tuple(sorted(members, key=lambda index: (index - preferred) % ensemble_size))


class AckSet:
    """Which bookies of one entry's write set acknowledged it."""

    __slots__ = ("_ack_quorum", "_acked", "_write_set")

    def __init__(self, entry_id: int, spec: QuorumSpec) -> None:
        size = spec.ensemble_size
        self._write_set = _write_set_members(entry_id % size, size, spec.write_quorum)
        self._ack_quorum = spec.ack_quorum
        self._acked: set[int] = set()

    def add(self, bookie_index: int) -> bool:
        """Record an ack; True once the ack quorum is reached. Duplicates count once."""
        if bookie_index not in self._write_set:
            raise ValueError(f"bookie index {bookie_index} is not in the write set")
        self._acked.add(bookie_index)
        return self.complete

    def remove(self, bookie_index: int) -> None:
        """Forget an ack (its bookie was replaced before the entry completed)."""
        self._acked.discard(bookie_index)

    @property
    def complete(self) -> bool:
        return len(self._acked) >= self._ack_quorum

    @property
    def acked(self) -> frozenset[int]:
        return frozenset(self._acked)
