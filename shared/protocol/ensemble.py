"""Ensemble placement: which bookies a new ledger is written to (BookKeeper's
DefaultEnsemblePlacementPolicy, random among the writable bookies). Pure: randomness comes
in as a generator the caller seeded."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from shared.status import ApiCodes, QuireError


class RandomLike(Protocol):
    """What the cores need of a seeded `random.Random`."""

    def sample(self, population: Sequence[str], k: int) -> list[str]: ...


def choose_ensemble(
    writable_bookie_ids: Iterable[str], ensemble_size: int, rng: RandomLike
) -> list[str]:
    """`ensemble_size` distinct bookies picked at random (BookKeeper's default placement);
    `rng` is a seeded `random.Random`. Sorted input makes a seed reproduce the choice."""
    candidates = sorted(set(writable_bookie_ids))
    if ensemble_size < 1:
        raise QuireError(ApiCodes.INVALID_ARGUMENT, "ensemble_size must be at least 1")
    if len(candidates) < ensemble_size:
        raise QuireError(
            ApiCodes.NOT_ENOUGH_BOOKIES,
            f"ensemble_size {ensemble_size} needs as many writable bookies; "
            f"{len(candidates)} are writable",
        )
    return rng.sample(candidates, ensemble_size)
