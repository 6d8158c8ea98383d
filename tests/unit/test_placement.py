"""Rack- and zone-aware placement (shared/protocol/placement.py): tables for the cases
BookKeeper's policies spell out, properties for "every write quorum adheres whenever some
layout of the candidates can", and the random policy reproducing `choose_ensemble`."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.config import PlacementSettings, QuireSettings
from shared.protocol.ensemble import choose_ensemble
from shared.protocol.placement import (
    DEFAULT_LOCATION,
    Adherence,
    PlacementPolicy,
    PlacementRules,
    parse_location,
)
from shared.status import ApiCodes, QuireError

RACKAWARE = PlacementPolicy(PlacementRules(policy="rackaware"))
RACKAWARE_ENFORCED = PlacementPolicy(
    PlacementRules(policy="rackaware", enforce_min_num_racks_per_write_quorum=True)
)
ZONEAWARE = PlacementPolicy(PlacementRules(policy="zoneaware"))
ZONEAWARE_SOFT = PlacementPolicy(
    PlacementRules(policy="zoneaware", enforce_strict_zoneaware_placement=False)
)


def layout(*racks: tuple[str, int]) -> dict[str, str]:
    """Bookies b0, b1, ... with `count` bookies at each location."""
    bookies: dict[str, str] = {}
    for location, count in racks:
        for _ in range(count):
            bookies[f"b{len(bookies)}"] = location
    return bookies


def windows(ensemble: tuple[str, ...], quorum: int) -> list[list[str]]:
    size = len(ensemble)
    return [[ensemble[(s + j) % size] for j in range(quorum)] for s in range(size)]


def feasible(policy: PlacementPolicy, size: int, quorum: int, candidates: dict[str, str]) -> bool:
    """Brute force: does any ensemble of the candidates meet the policy strictly?"""
    return any(
        policy.check(ensemble, quorum, candidates).adherence is Adherence.MEETS_STRICT
        for ensemble in itertools.permutations(sorted(candidates), size)
    )


# -- locations and settings ---------------------------------------------------------------


@pytest.mark.parametrize("text", ["/zone-a/rack-1", "/rack_1", "/z.1/r.2"])
def test_locations_parse(text: str) -> None:
    assert parse_location(text) == text


@pytest.mark.parametrize("text", ["", "/", "rack", "/a/b/c", "/a//b", "/a/b/", "/a b"])
def test_bad_locations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="network location"):
        parse_location(text)


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIRE_BOOKIE_LOCATION", "/zone-a/rack-2")
    monkeypatch.setenv("QUIRE_PLACEMENT__POLICY", "rackaware")
    monkeypatch.setenv("QUIRE_PLACEMENT__ENFORCE_MIN_NUM_RACKS_PER_WRITE_QUORUM", "true")
    config = QuireSettings()
    assert config.bookie_location == "/zone-a/rack-2"
    assert config.placement.rules() == PlacementRules(
        policy="rackaware", enforce_min_num_racks_per_write_quorum=True
    )
    monkeypatch.delenv("QUIRE_BOOKIE_LOCATION")
    assert QuireSettings().bookie_location == DEFAULT_LOCATION


def test_settings_refuse_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIRE_BOOKIE_LOCATION", "rack-1")
    with pytest.raises(ValueError, match="network location"):
        QuireSettings()
    with pytest.raises(ValueError):
        PlacementSettings(policy="nearest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="desired_num_zones"):
        PlacementSettings(min_num_zones_per_write_quorum=3, desired_num_zones_per_write_quorum=2)


# -- random: today's behaviour exactly ------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_random_reproduces_choose_ensemble(seed: int) -> None:
    candidates = {f"bookie-{i}": DEFAULT_LOCATION for i in range(7)}
    placed = PlacementPolicy().new_ensemble(4, 2, candidates, random.Random(seed), {"bookie-3"})
    expected = choose_ensemble([b for b in candidates if b != "bookie-3"], 4, random.Random(seed))
    assert placed.bookies == tuple(expected)
    assert placed.adherence is Adherence.MEETS_STRICT and not placed.fallback


def test_random_replacement_is_the_old_sample() -> None:
    candidates = {f"bookie-{i}": DEFAULT_LOCATION for i in range(8)}
    ensemble = ("bookie-0", "bookie-1", "bookie-2")
    placed = PlacementPolicy().replace(ensemble, 2, [2, 0], candidates, random.Random(4))
    chosen = random.Random(4).sample([f"bookie-{i}" for i in range(3, 8)], 2)
    assert placed.bookies == (chosen[0], "bookie-1", chosen[1])
    first = PlacementPolicy().replace(ensemble, 2, [1], candidates, None)
    assert first.bookies == ("bookie-0", "bookie-3", "bookie-2")


# -- rackaware ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "quorum", "racks", "strict"),
    [
        (4, 2, [("/z/r1", 2), ("/z/r2", 2)], True),
        (2, 2, [("/z/r1", 2), ("/z/r2", 2)], True),
        (3, 3, [("/z/r1", 2), ("/z/r2", 2)], True),
        (4, 3, [("/z/r1", 2), ("/z/r2", 2)], True),
        # An odd ring cannot alternate two racks: some write quorum shares one.
        (3, 2, [("/z/r1", 2), ("/z/r2", 2)], False),
        (3, 2, [("/z/r1", 1), ("/z/r2", 1), ("/z/r3", 1)], True),
        # Three of four bookies in one rack: E4/Qw2 needs two positions of each rack.
        (4, 2, [("/z/r1", 3), ("/z/r2", 1)], False),
    ],
)
def test_rackaware_new_ensemble(size, quorum, racks, strict: bool) -> None:
    candidates = layout(*racks)
    for seed in range(10):
        placed = RACKAWARE.new_ensemble(size, quorum, candidates, random.Random(seed))
        assert len(set(placed.bookies)) == size
        check = RACKAWARE.check(placed.bookies, quorum, candidates)
        assert check.adherence is placed.adherence
        if strict:
            assert placed.adherence is Adherence.MEETS_STRICT and not placed.fallback
            for window in windows(placed.bookies, quorum):
                assert len({candidates[b] for b in window}) >= 2
        else:
            # Not enforced: placed anyway, at random, and flagged (BookKeeper's fallback).
            assert placed.fallback and placed.reason.startswith("no rackaware placement")
            with pytest.raises(QuireError) as err:
                RACKAWARE_ENFORCED.new_ensemble(size, quorum, candidates, random.Random(seed))
            assert err.value.api == ApiCodes.NOT_ENOUGH_BOOKIES


def test_all_in_one_rack_degrades_as_bookkeeper() -> None:
    """All bookies in one rack: not enforced, a random ensemble that fails the check (the
    auditor reports it); enforced, NOT_ENOUGH_BOOKIES naming what was missing."""
    candidates = layout(("/zone/rack-1", 5))
    placed = RACKAWARE.new_ensemble(3, 2, candidates, random.Random(1))
    assert placed.fallback and placed.adherence is Adherence.FAIL
    assert "1 rack(s), want 2" in RACKAWARE.check(placed.bookies, 2, candidates).reason
    with pytest.raises(QuireError) as err:
        RACKAWARE_ENFORCED.new_ensemble(3, 2, candidates, random.Random(1))
    assert err.value.api == ApiCodes.NOT_ENOUGH_BOOKIES
    assert "1 location(s) ['/zone/rack-1']" in err.value.detail


def test_enforced_rackaware_leaves_the_default_rack_out() -> None:
    candidates = {**layout(("/z/r1", 1), ("/z/r2", 1)), "plain": DEFAULT_LOCATION}
    placed = RACKAWARE_ENFORCED.new_ensemble(2, 2, candidates, random.Random(1))
    assert "plain" not in placed.bookies
    check = RACKAWARE_ENFORCED.check(("b0", "plain"), 2, candidates)
    assert check.adherence is Adherence.FAIL and "default rack" in check.reason
    assert RACKAWARE.check(("b0", "plain"), 2, candidates).adherence is Adherence.MEETS_STRICT


def test_not_enough_bookies_at_all() -> None:
    with pytest.raises(QuireError) as err:
        RACKAWARE.new_ensemble(3, 2, layout(("/z/r1", 1), ("/z/r2", 1)), random.Random(1))
    assert err.value.api == ApiCodes.NOT_ENOUGH_BOOKIES


def test_rackaware_replacement_keeps_the_windows() -> None:
    """Replacing position 1 of r1 r2 r1 r2: its windows are (0, 1) and (1, 2), both r1
    around it, so only an r2 bookie fits, never one already in the ensemble."""
    candidates = layout(("/z/r1", 4), ("/z/r2", 4))
    ensemble = ("b0", "b4", "b1", "b5")
    for seed in range(20):
        placed = RACKAWARE.replace(
            ensemble, 2, [1], candidates, random.Random(seed), excluded={"b6"}
        )
        new = placed.bookies[1]
        assert candidates[new] == "/z/r2" and new not in {"b4", "b5", "b6"}
        assert placed.adherence is Adherence.MEETS_STRICT


def test_replacement_without_a_fitting_candidate() -> None:
    candidates = layout(("/z/r1", 3), ("/z/r2", 1))
    ensemble = ("b0", "b3")  # the only r2 bookie fails
    placed = RACKAWARE.replace(ensemble, 2, [1], candidates, random.Random(1))
    assert placed.fallback and placed.bookies[1] in {"b1", "b2"}
    with pytest.raises(QuireError) as err:
        RACKAWARE_ENFORCED.replace(ensemble, 2, [1], candidates, random.Random(1))
    assert err.value.api == ApiCodes.NOT_ENOUGH_BOOKIES


# -- zoneaware ------------------------------------------------------------------------------


def test_zoneaware_strict_soft_and_fail() -> None:
    three = layout(("/z1/u1", 2), ("/z2/u1", 2), ("/z3/u1", 2))
    placed = ZONEAWARE.new_ensemble(6, 3, three, random.Random(1))
    assert placed.adherence is Adherence.MEETS_STRICT
    for window in windows(placed.bookies, 3):
        assert len({three[b].split("/")[1] for b in window}) == 3
    # Two zones: below desired (3), at min (2): MEETS_SOFT, the zone doubled in one window
    # spread over two upgrade domains.
    two = layout(("/z1/u1", 2), ("/z1/u2", 2), ("/z2/u1", 2), ("/z2/u2", 2))
    placed = ZONEAWARE.new_ensemble(6, 3, two, random.Random(1))
    assert placed.adherence is Adherence.MEETS_SOFT
    assert ZONEAWARE.check(placed.bookies, 3, two).adherence is Adherence.MEETS_SOFT
    # One upgrade domain per zone: a doubled zone fails.
    flat = layout(("/z1/u1", 4), ("/z2/u1", 4))
    with pytest.raises(QuireError) as err:
        ZONEAWARE.new_ensemble(6, 3, flat, random.Random(1))
    assert err.value.api == ApiCodes.NOT_ENOUGH_BOOKIES
    check = ZONEAWARE.check(("b0", "b1", "b4"), 3, flat)
    assert check.adherence is Adherence.FAIL and "one upgrade domain" in check.reason


@pytest.mark.parametrize(("size", "quorum"), [(5, 3), (4, 2)])
def test_strict_zoneaware_refuses_quorums_as_bookkeeper(size: int, quorum: int) -> None:
    candidates = layout(("/z1/u", 3), ("/z2/u", 3), ("/z3/u", 3))
    with pytest.raises(QuireError) as err:
        ZONEAWARE.new_ensemble(size, quorum, candidates, random.Random(1))
    assert err.value.api == ApiCodes.INVALID_ARGUMENT
    ensemble = tuple(sorted(candidates))[:size]
    assert ZONEAWARE.check(ensemble, quorum, candidates).adherence is Adherence.FAIL


def test_zoneaware_not_strict_places_at_random_and_reports() -> None:
    candidates = layout(("/z1/u", 6))
    placed = ZONEAWARE_SOFT.new_ensemble(3, 3, candidates, random.Random(1))
    assert placed.fallback and placed.adherence is Adherence.FAIL


# -- properties -----------------------------------------------------------------------------

RACKS = st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(
    counts=RACKS,
    size=st.integers(min_value=1, max_value=5),
    quorum=st.integers(min_value=1, max_value=5),
    seed=st.integers(min_value=0, max_value=1000),
)
def test_rackaware_meets_the_policy_whenever_possible(counts, size, quorum, seed) -> None:
    quorum = min(quorum, size)
    candidates = layout(*((f"/z/r{i}", n) for i, n in enumerate(counts)))
    if len(candidates) < size:
        with pytest.raises(QuireError):
            RACKAWARE.new_ensemble(size, quorum, candidates, random.Random(seed))
        return
    placed = RACKAWARE.new_ensemble(size, quorum, candidates, random.Random(seed))
    assert len(set(placed.bookies)) == size and set(placed.bookies) <= set(candidates)
    possible = feasible(RACKAWARE, size, quorum, candidates)
    assert (placed.adherence is Adherence.MEETS_STRICT) == possible
    assert placed.fallback == (not possible)
    if not possible:
        with pytest.raises(QuireError) as err:
            RACKAWARE_ENFORCED.new_ensemble(size, quorum, candidates, random.Random(seed))
        assert err.value.api == ApiCodes.NOT_ENOUGH_BOOKIES


@settings(max_examples=150, deadline=None)
@given(
    counts=RACKS,
    size=st.integers(min_value=2, max_value=5),
    quorum=st.integers(min_value=2, max_value=5),
    data=st.data(),
)
def test_replacement_never_reuses_and_keeps_what_it_can(counts, size, quorum, data) -> None:
    quorum = min(quorum, size)
    candidates = layout(*((f"/z/r{i}", n) for i, n in enumerate(counts)), ("/z/spare", 2))
    if len(candidates) < size + 1:
        return
    names = sorted(candidates)
    ensemble = tuple(data.draw(st.permutations(names))[:size])
    positions = data.draw(st.sets(st.integers(0, size - 1), min_size=1, max_size=2))
    excluded = set(data.draw(st.sets(st.sampled_from(names), max_size=2)))
    rng = random.Random(data.draw(st.integers(0, 1000)))
    try:
        placed = RACKAWARE.replace(ensemble, quorum, positions, candidates, rng, excluded)
    except QuireError as err:
        assert err.api == ApiCodes.NOT_ENOUGH_BOOKIES
        return
    for index in range(size):
        if index in positions:
            assert placed.bookies[index] not in set(ensemble) | excluded
        else:
            assert placed.bookies[index] == ensemble[index]
    # Whenever some candidate layout of the open positions meets the policy, one is taken.
    pool = [b for b in names if b not in set(ensemble) | excluded]
    order = sorted(positions)
    possible = False
    for chosen in itertools.permutations(pool, len(order)):
        trial = list(ensemble)
        for index, bookie in zip(order, chosen, strict=True):
            trial[index] = bookie
        touched = {(p - back) % size for p in order for back in range(quorum)}
        if all(
            len({candidates[trial[(s + j) % size]] for j in range(quorum)}) >= min(quorum, 2)
            for s in touched
        ):
            possible = True
            break
    assert placed.fallback == (not possible)


# -- repair (the auditor's marks) ----------------------------------------------------------


def test_repair_names_the_fewest_bookies_whose_move_makes_it_adhere() -> None:
    located = layout(("/z/r1", 2), ("/z/r2", 2))  # b0 b1 in r1, b2 b3 in r2
    spares = {"s1": "/z/r1", "s2": "/z/r2"}
    ensemble = ("b0", "b1", "b2", "b3")  # (b0, b1) and (b2, b3) each on one rack
    positions = RACKAWARE.repair(ensemble, 2, spares, located)
    assert len(positions) == 2  # one move cannot do: each is between both racks
    placed = RACKAWARE.replace(ensemble, 2, positions, spares, random.Random(1), known=located)
    assert placed.adherence is Adherence.MEETS_STRICT
    assert RACKAWARE.repair(("b0", "b2", "b1", "b3"), 2, spares, located) == ()  # adheres
    assert RACKAWARE.repair(ensemble, 2, {"s1": "/z/r1"}, located) == ()  # nothing can fix


@settings(max_examples=100, deadline=None)
@given(counts=RACKS, spare=RACKS, size=st.integers(2, 5), quorum=st.integers(2, 5), data=st.data())
def test_repair_positions_are_enough(counts, spare, size, quorum, data) -> None:
    quorum = min(quorum, size)
    located = layout(*((f"/z/r{i}", n) for i, n in enumerate(counts)))
    if len(located) < size:
        return
    spares = {
        f"s{b}": loc for b, loc in layout(*((f"/z/r{i}", n) for i, n in enumerate(spare))).items()
    }
    ensemble = tuple(data.draw(st.permutations(sorted(located)))[:size])
    positions = RACKAWARE.repair(ensemble, quorum, spares, located)
    check = RACKAWARE.check(ensemble, quorum, located)
    if not positions:
        return
    assert check.adherence is Adherence.FAIL
    placed = RACKAWARE.replace(ensemble, quorum, positions, spares, random.Random(0), known=located)
    assert placed.adherence is Adherence.MEETS_STRICT and not placed.fallback


@settings(max_examples=100, deadline=None)
@given(
    zones=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1)), min_size=1, max_size=6),
    shape=st.sampled_from([(3, 3), (6, 3), (4, 4), (2, 2)]),
    seed=st.integers(0, 1000),
)
def test_zoneaware_reaches_the_best_level_possible(zones, shape, seed) -> None:
    """Strict zone-aware placement: the best of MEETS_STRICT / MEETS_SOFT some ensemble of
    the candidates reaches, else NOT_ENOUGH_BOOKIES (INVALID_ARGUMENT for Qw 2)."""
    size, quorum = shape
    candidates = {f"b{i}": f"/z{z}/u{u}_{i}" if u else f"/z{z}/u" for i, (z, u) in enumerate(zones)}
    best = max(
        (
            ZONEAWARE.check(ensemble, quorum, candidates).adherence
            for ensemble in itertools.permutations(sorted(candidates), size)
        ),
        default=None,
    )
    try:
        placed = ZONEAWARE.new_ensemble(size, quorum, candidates, random.Random(seed))
    except QuireError as err:
        if quorum <= 2:
            assert err.api == ApiCodes.INVALID_ARGUMENT
        else:
            assert err.api == ApiCodes.NOT_ENOUGH_BOOKIES
            assert best is None or best is Adherence.FAIL
        return
    assert placed.adherence is best and best is not Adherence.FAIL
    assert ZONEAWARE.check(placed.bookies, quorum, candidates).adherence is best


def test_repair_moves_a_default_rack_bookie_when_enforced() -> None:
    located = {"b0": "/z/r1", "plain": DEFAULT_LOCATION}
    assert RACKAWARE_ENFORCED.repair(("b0", "plain"), 2, {"s": "/z/r2"}, located) == (1,)
    assert RACKAWARE_ENFORCED.repair(("b0", "plain"), 2, {"s": "/z/r1"}, located) == ()


def test_strict_zoneaware_still_replaces_in_a_quorum_it_would_not_create() -> None:
    """A ledger made before the policy (E3/Qw2) keeps getting replacements; the result is
    reported as failing the policy, as the auditor's check says."""
    candidates = layout(("/z1/u1", 2), ("/z2/u1", 2), ("/z3/u1", 2))
    placed = ZONEAWARE.replace(("b0", "b2", "b4"), 2, [1], candidates, random.Random(1))
    assert candidates[placed.bookies[1]] == "/z2/u1" and placed.bookies[1] != "b2"
    assert placed.adherence is Adherence.FAIL and "multiple of write_quorum" in placed.reason
    assert not placed.fallback
