"""Rack- and zone-aware ensemble placement (BookKeeper's EnsemblePlacementPolicy family):
`random` (DefaultEnsemblePlacementPolicy, today's `choose_ensemble`), `rackaware`
(RackawareEnsemblePlacementPolicy) and `zoneaware` (ZoneawareEnsemblePlacementPolicy).

A bookie's network location is "/zone/rack" (or "/rack" alone). With round-robin striping
(shared/quorum.py write_set) entry e goes to the Qw positions e, e+1, ... (mod E), so every
cyclic window of Qw consecutive positions of an ensemble is some entry's write set: the
policies ask each window to span enough racks (the full location) or zones (its first
component; the second is the zone's upgrade domain, as BookKeeper's "/zone/upgradeDomain").

Pure: the candidates' locations come in as a mapping, randomness as a generator the caller
seeded. Placement searches over locations (bookies of one location are interchangeable), so
a layout that satisfies every window is found whenever one exists within the search budget.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

from shared.protocol.ensemble import RandomLike, choose_ensemble
from shared.status import ApiCodes, QuireError

DEFAULT_LOCATION = "/default-zone/default-rack"
POLICIES = ("random", "rackaware", "zoneaware")
_COMPONENT = r"[A-Za-z0-9_.-]+"
_LOCATION = re.compile(rf"^/{_COMPONENT}(/{_COMPONENT})?$")
# Backtracking steps one placement may take before it counts as not found: the pruning makes
# real layouts take a handful; the bound keeps a hopeless large one from stalling a caller.
SEARCH_BUDGET = 5_000
# Sets of positions a repair tries, fewest first (all sets of up to 2 positions of an
# ensemble of 10): a segment no small move fixes is reported, not marked.
REPAIR_BUDGET = 64


class Adherence(IntEnum):
    """BookKeeper's PlacementPolicyAdherence, ordered: a higher value adheres better."""

    FAIL = 0
    MEETS_SOFT = 1
    MEETS_STRICT = 2


def parse_location(text: str) -> str:
    """A network location, "/zone/rack" or "/rack"; raises ValueError on anything else."""
    if not _LOCATION.match(text):
        raise ValueError(
            f"network location {text!r}: want /zone/rack or /rack (letters, digits, '_', '.', '-')"
        )
    return text


def zone_of(location: str) -> str:
    return location.split("/")[1]


def upgrade_domain_of(location: str) -> str:
    parts = location.split("/")
    return parts[2] if len(parts) > 2 else ""


@dataclass(frozen=True, slots=True)
class PlacementRules:
    """The policy and its knobs (shared/config.py PlacementSettings carries them from the
    environment; the names are BookKeeper's)."""

    policy: str = "random"
    min_num_racks_per_write_quorum: int = 2
    enforce_min_num_racks_per_write_quorum: bool = False
    min_num_zones_per_write_quorum: int = 2
    desired_num_zones_per_write_quorum: int = 3
    enforce_strict_zoneaware_placement: bool = True

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"placement policy {self.policy!r}: want one of {POLICIES}")


@dataclass(frozen=True, slots=True)
class AdherenceCheck:
    adherence: Adherence
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Placement:
    """A chosen ensemble (new, or the old one with replacements) and how well it adheres.
    `fallback`: the policy could not be met and, not enforced, placed at random instead
    (BookKeeper logs it); callers count it."""

    bookies: tuple[str, ...]
    adherence: Adherence
    fallback: bool = False
    reason: str = ""


class PlacementPolicy:
    """One policy over the rules: new ensembles, replacements, adherence checks."""

    def __init__(self, rules: PlacementRules | None = None) -> None:
        self.rules = rules or PlacementRules()

    @property
    def name(self) -> str:
        return self.rules.policy

    # -- adherence --------------------------------------------------------------------------

    def check(
        self, ensemble: Sequence[str], write_quorum: int, locations: Mapping[str, str]
    ) -> AdherenceCheck:
        """isEnsembleAdheringToPlacementPolicy: the worst of its write quorums. A bookie
        without a known location counts as DEFAULT_LOCATION."""
        if not ensemble:
            return AdherenceCheck(Adherence.FAIL, "empty ensemble")
        if self.name == "random":
            return AdherenceCheck(Adherence.MEETS_STRICT)
        invalid = self._invalid_quorum(len(ensemble), write_quorum)
        if invalid:
            return AdherenceCheck(Adherence.FAIL, invalid)
        locs = [locations.get(b, DEFAULT_LOCATION) for b in ensemble]
        worst = AdherenceCheck(Adherence.MEETS_STRICT)
        for start in range(len(ensemble)):
            window = [locs[(start + j) % len(locs)] for j in range(write_quorum)]
            level, why = self._window(window, write_quorum)
            if level < worst.adherence:
                members = [ensemble[(start + j) % len(ensemble)] for j in range(write_quorum)]
                worst = AdherenceCheck(
                    level, f"write quorum at position {start} {members} on {window}: {why}"
                )
                if level is Adherence.FAIL:
                    break
        return worst

    def _invalid_quorum(self, ensemble_size: int, write_quorum: int) -> str:
        """Quorums strict zone-aware placement refuses (BookKeeper throws for them)."""
        rules = self.rules
        if self.name != "zoneaware" or not rules.enforce_strict_zoneaware_placement:
            return ""
        if ensemble_size % write_quorum:
            return (
                f"strict zone-aware placement needs ensemble_size ({ensemble_size}) to be a "
                f"multiple of write_quorum ({write_quorum})"
            )
        if write_quorum <= rules.min_num_zones_per_write_quorum:
            return (
                f"strict zone-aware placement needs write_quorum ({write_quorum}) above "
                f"min_num_zones_per_write_quorum ({rules.min_num_zones_per_write_quorum})"
            )
        return ""

    def _window(self, window: Sequence[str], write_quorum: int) -> tuple[Adherence, str]:
        """How one complete write quorum (its bookies' locations) adheres."""
        rules = self.rules
        if self.name == "rackaware":
            need = min(write_quorum, rules.min_num_racks_per_write_quorum)
            if rules.enforce_min_num_racks_per_write_quorum and DEFAULT_LOCATION in window:
                return Adherence.FAIL, "a bookie in the default rack (enforced)"
            racks = len(set(window))
            if racks < need:
                return Adherence.FAIL, f"{racks} rack(s), want {need}"
            return Adherence.MEETS_STRICT, ""
        zones: dict[str, set[str]] = defaultdict(set)
        counts = Counter(zone_of(loc) for loc in window)
        for loc in window:
            zones[zone_of(loc)].add(upgrade_domain_of(loc))
        for zone, count in counts.items():
            if count > 1 and len(zones[zone]) < 2:
                return Adherence.FAIL, f"{count} bookies of zone {zone} in one upgrade domain"
        desired = min(write_quorum, rules.desired_num_zones_per_write_quorum)
        if len(counts) >= desired:
            return Adherence.MEETS_STRICT, ""
        if len(counts) >= rules.min_num_zones_per_write_quorum:
            return Adherence.MEETS_SOFT, f"{len(counts)} zone(s), desired {desired}"
        return (
            Adherence.FAIL,
            f"{len(counts)} zone(s), want {rules.min_num_zones_per_write_quorum}",
        )

    def may_reach(
        self, assigned: Sequence[str], free: int, write_quorum: int, target: Adherence
    ) -> bool:
        """Optimistic: can a window with these locations and `free` open positions still
        reach `target`? (Open positions may take new racks or zones.)"""
        if free == 0:
            return self._window(assigned, write_quorum)[0] >= target
        rules = self.rules
        if self.name == "rackaware":
            if rules.enforce_min_num_racks_per_write_quorum and DEFAULT_LOCATION in assigned:
                return False
            need = min(write_quorum, rules.min_num_racks_per_write_quorum)
            return len(set(assigned)) + free >= need
        zones = len({zone_of(loc) for loc in assigned})
        if target is Adherence.MEETS_STRICT:
            need = min(write_quorum, rules.desired_num_zones_per_write_quorum)
        else:
            need = rules.min_num_zones_per_write_quorum
        return zones + free >= need

    # -- new ensembles and replacements -------------------------------------------------------

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        candidates: Mapping[str, str],
        rng: RandomLike | None,
        excluded: Iterable[str] = (),
    ) -> Placement:
        """newEnsemble: `ensemble_size` distinct bookies among `candidates` (bookie ->
        location) minus `excluded`. Raises QuireError NOT_ENOUGH_BOOKIES when there are not
        enough, or when an enforced policy cannot be met; INVALID_ARGUMENT for quorums
        strict zone-aware placement refuses."""
        skip = set(excluded)
        pool = {b: loc for b, loc in candidates.items() if b not in skip}
        if self.name == "random":
            assert rng is not None, "a new ensemble is chosen at random"
            chosen = choose_ensemble(pool, ensemble_size, rng)
            return Placement(tuple(chosen), Adherence.MEETS_STRICT)
        if ensemble_size < 1:
            raise QuireError(ApiCodes.INVALID_ARGUMENT, "ensemble_size must be at least 1")
        self._refuse_invalid(ensemble_size, write_quorum)
        if len(pool) < ensemble_size:
            raise QuireError(
                ApiCodes.NOT_ENOUGH_BOOKIES,
                f"ensemble_size {ensemble_size} needs as many writable bookies; "
                f"{len(pool)} are writable",
            )
        slots: list[str | None] = [None] * ensemble_size
        return self._place(slots, list(range(ensemble_size)), write_quorum, pool, rng, candidates)

    def replace(
        self,
        ensemble: Sequence[str],
        write_quorum: int,
        positions: Iterable[int],
        candidates: Mapping[str, str],
        rng: RandomLike | None,
        excluded: Iterable[str] = (),
        known: Mapping[str, str] | None = None,
    ) -> Placement:
        """replaceBookie for each of `positions` (an ensemble change, a re-replication):
        the replacements are none of the ensemble's bookies nor `excluded`, and the write
        quorums containing them adhere as well as the candidates allow. `known`: locations
        of bookies that are not candidates (the ensemble's others). `rng` None takes the
        first fitting candidates in order (the cores' deterministic tests). Raises
        QuireError NOT_ENOUGH_BOOKIES as new_ensemble does."""
        order = sorted(set(positions))
        known = known or {}
        skip = set(excluded) | set(ensemble)
        pool = {b: loc for b, loc in candidates.items() if b not in skip}
        if len(pool) < len(order):
            raise QuireError(
                ApiCodes.NOT_ENOUGH_BOOKIES,
                f"{len(order)} bookie(s) to replace and {len(pool)} writable bookie(s) "
                "outside the ensemble",
            )
        if self.name == "random":
            names = sorted(pool)
            chosen = rng.sample(names, len(order)) if rng is not None else names[: len(order)]
            bookies = list(ensemble)
            for index, new in zip(order, chosen, strict=True):
                bookies[index] = new
            return Placement(tuple(bookies), Adherence.MEETS_STRICT)
        # Unlike a new ensemble, a replacement is not refused for a quorum strict zone-aware
        # placement would not create (BookKeeper's replaceBookie neither): the ledger exists.
        slots: list[str | None] = list(ensemble)
        for index in order:
            slots[index] = None
        return self._place(slots, order, write_quorum, pool, rng, {**known, **candidates})

    def repair(
        self,
        ensemble: Sequence[str],
        write_quorum: int,
        candidates: Mapping[str, str],
        known: Mapping[str, str],
    ) -> tuple[int, ...]:
        """BookKeeper's replaceToAdherePlacementPolicy, as positions: the fewest positions of
        an ensemble that fails the policy whose bookies, replaced by `candidates` (bookie ->
        location; those in the ensemble do not count), make it adhere. () when it adheres
        already, or when no replacement can (nor then a quorum the policy refuses)."""
        located = {**known, **candidates}
        if self.check(ensemble, write_quorum, located).adherence is not Adherence.FAIL:
            return ()
        if self._invalid_quorum(len(ensemble), write_quorum):
            return ()
        pool = {b: loc for b, loc in candidates.items() if b not in set(ensemble)}
        if self._enforced():
            pool = {b: loc for b, loc in pool.items() if loc != DEFAULT_LOCATION}
        by_location: dict[str, list[str]] = defaultdict(list)
        for bookie in sorted(pool):
            by_location[pool[bookie]].append(bookie)
        locs = [located.get(b, DEFAULT_LOCATION) for b in ensemble]
        size = len(ensemble)
        target = Adherence.MEETS_STRICT if self.name == "rackaware" else Adherence.MEETS_SOFT
        if not self._spread_enough({*locs, *pool.values()}, write_quorum, target):
            return ()  # not racks (zones) enough between them all: cut short
        tried = 0
        for count in range(1, min(size, len(pool)) + 1):
            for positions in itertools.combinations(range(size), count):
                tried += 1
                if tried > REPAIR_BUDGET:
                    return ()
                layout: list[str | None] = list(locs)
                for index in positions:
                    layout[index] = None
                if not self._untouched_adhere(layout, write_quorum, target):
                    continue
                search = _Search(self, layout, write_quorum, by_location, None, target)
                if search.run(list(positions)) is not None:
                    return positions
        return ()

    def _spread_enough(self, locations: set[str], write_quorum: int, target: Adherence) -> bool:
        """Whether these locations hold the racks (zones) one write quorum needs to reach
        `target`: a search that cannot succeed is not started."""
        rules = self.rules
        usable = locations - {DEFAULT_LOCATION} if self._enforced() else locations
        if self.name == "rackaware":
            return len(usable) >= min(write_quorum, rules.min_num_racks_per_write_quorum)
        if target is Adherence.MEETS_STRICT:
            need = min(write_quorum, rules.desired_num_zones_per_write_quorum)
        else:
            need = rules.min_num_zones_per_write_quorum
        return len({zone_of(loc) for loc in usable}) >= need

    def _untouched_adhere(
        self, layout: Sequence[str | None], write_quorum: int, target: Adherence
    ) -> bool:
        """The write quorums with no open position reach `target` as they are."""
        size = len(layout)
        for start in range(size):
            window = [layout[(start + j) % size] for j in range(write_quorum)]
            full = [loc for loc in window if loc is not None]
            if len(full) == len(window) and self._window(full, write_quorum)[0] < target:
                return False
        return True

    def _refuse_invalid(self, ensemble_size: int, write_quorum: int) -> None:
        invalid = self._invalid_quorum(ensemble_size, write_quorum)
        if invalid:
            raise QuireError(ApiCodes.INVALID_ARGUMENT, invalid)

    def _enforced(self) -> bool:
        rules = self.rules
        if self.name == "rackaware":
            return rules.enforce_min_num_racks_per_write_quorum
        return rules.enforce_strict_zoneaware_placement

    def _place(
        self,
        slots: list[str | None],
        open_positions: list[int],
        write_quorum: int,
        pool: dict[str, str],
        rng: RandomLike | None,
        known: Mapping[str, str],
    ) -> Placement:
        """Fill the open slots: the best adherence a search over locations finds; else,
        not enforced, at random (BookKeeper's fallback), else NOT_ENOUGH_BOOKIES."""
        enforced = self._enforced()
        if enforced:
            # BookKeeper leaves the default rack (fault domain) out when it enforces.
            pool = {b: loc for b, loc in pool.items() if loc != DEFAULT_LOCATION}
        by_location: dict[str, list[str]] = defaultdict(list)
        for bookie in sorted(pool):
            by_location[pool[bookie]].append(bookie)
        layout = [None if b is None else known.get(b, DEFAULT_LOCATION) for b in slots]
        targets = [Adherence.MEETS_STRICT]
        if self.name == "zoneaware":
            targets.append(Adherence.MEETS_SOFT)
        spread = {*by_location, *(loc for loc in layout if loc is not None)}
        for target in targets:
            if not self._spread_enough(spread, write_quorum, target):
                continue
            search = _Search(self, layout, write_quorum, by_location, rng, target)
            found = search.run(open_positions)
            if found is not None:
                placed = self._bookies_for(slots, found, by_location, rng)
                invalid = self._invalid_quorum(len(slots), write_quorum)
                return Placement(placed, Adherence.FAIL if invalid else target, reason=invalid)
        what = (
            f"no {self.name} placement of {len(open_positions)} bookie(s) with write_quorum "
            f"{write_quorum} over {len(pool)} candidate(s) in "
            f"{len(by_location)} location(s) {sorted(by_location)}"
        )
        if enforced or len(pool) < len(open_positions):
            raise QuireError(ApiCodes.NOT_ENOUGH_BOOKIES, what)
        names = sorted(pool)
        count = len(open_positions)
        chosen = rng.sample(names, count) if rng is not None else names[:count]
        bookies = list(slots)
        for index, new in zip(open_positions, chosen, strict=True):
            bookies[index] = new
        final = tuple(b for b in bookies if b is not None)
        check = self.check(final, write_quorum, {**known, **pool})
        return Placement(final, check.adherence, fallback=True, reason=what)

    @staticmethod
    def _bookies_for(
        slots: Sequence[str | None],
        layout: Mapping[int, str],
        by_location: Mapping[str, list[str]],
        rng: RandomLike | None,
    ) -> tuple[str, ...]:
        """Bookies for a layout of locations: bookies of one location are interchangeable."""
        wanted: dict[str, list[int]] = defaultdict(list)
        for index in sorted(layout):
            wanted[layout[index]].append(index)
        bookies = list(slots)
        for location, indexes in wanted.items():
            names = by_location[location]
            picked = rng.sample(names, len(indexes)) if rng is not None else names[: len(indexes)]
            for index, name in zip(indexes, picked, strict=True):
                bookies[index] = name
        return tuple(b for b in bookies if b is not None)


class _Search:
    """Backtracking over the open positions' locations, pruning a position's choice as soon
    as one of the write quorums containing it can no longer reach the target."""

    def __init__(
        self,
        policy: PlacementPolicy,
        layout: list[str | None],
        write_quorum: int,
        by_location: Mapping[str, list[str]],
        rng: RandomLike | None,
        target: Adherence,
    ) -> None:
        self.policy = policy
        self.layout = list(layout)
        self.size = len(layout)
        self.write_quorum = write_quorum
        self.left = {loc: len(names) for loc, names in by_location.items()}
        self.rng = rng
        self.target = target
        self.steps = 0

    def run(self, open_positions: list[int]) -> dict[int, str] | None:
        self.open = open_positions
        if not self._fill(0):
            return None
        return {i: loc for i in open_positions if (loc := self.layout[i]) is not None}

    def _fill(self, k: int) -> bool:
        if k == len(self.open):
            return True
        position = self.open[k]
        choices = sorted(loc for loc, n in self.left.items() if n > 0)
        if self.rng is not None:
            choices = self.rng.sample(choices, len(choices))
        for location in choices:
            self.steps += 1
            if self.steps > SEARCH_BUDGET:
                return False
            self.layout[position] = location
            self.left[location] -= 1
            if self._windows_may_reach(position) and self._fill(k + 1):
                return True
            self.left[location] += 1
            self.layout[position] = None
        return False

    def _windows_may_reach(self, position: int) -> bool:
        size, quorum = self.size, self.write_quorum
        for back in range(min(quorum, size)):
            start = position - back
            window = [self.layout[(start + j) % size] for j in range(quorum)]
            assigned = [loc for loc in window if loc is not None]
            free = len(window) - len(assigned)
            if not self.policy.may_reach(assigned, free, quorum, self.target):
                return False
        return True
