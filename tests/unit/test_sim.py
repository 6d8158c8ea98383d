"""The simulator: the real protocol cores under seeded faults. A thousand seeds pass (each
with several ledgers at once); the same seed gives the same transcript in any process; a
broken rule is caught; ledgers sharing the bookies stay apart; the classic scenarios (one
ledger) match their golden transcripts (a missing one fails; QUIRE_UPDATE_GOLDEN=1 writes
them)."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from quire.sim.broken import BROKEN
from quire.sim.model import World
from quire.sim.run import (
    SEED_LEDGERS,
    config_for_seed,
    replay_command,
    run_config,
    run_seed,
    run_seeds,
)
from quire.sim.scenarios import SCENARIOS
from shared.digest import parse_header
from tests.support.layout import ROOT

SEEDS = int(os.environ.get("QUIRE_SIM_SEEDS", "1000"))
GOLDEN_DIR = ROOT / "tests" / "scenarios"


def test_a_thousand_seeds_keep_every_invariant() -> None:
    count, failures, seconds = run_seeds(range(SEEDS))
    report = [f"seed {f.seed}: {f.error} ({replay_command(f.seed)})" for f in failures]
    assert count == SEEDS and not failures, "\n".join(report)
    print(f"{count} seeds in {seconds:.1f} s ({count / seconds:.0f} seeds/s)")


def test_the_same_seed_gives_the_same_transcript_in_any_process() -> None:
    first, again = run_seed(12345), run_seed(12345)
    assert first.ok and first.log == again.log and len(first.lines) > 100
    # Another process with another string hash seed: byte-identical all the same.
    outputs = []
    for hash_seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-m", "quire.sim", "--seed", "12345", "--log"],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr.decode()
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert outputs[0].decode().startswith(first.log)


def test_a_failure_names_its_seed_and_the_replay_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "quire.sim", "--seeds", "40", "--break", "no-fence"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stdout.splitlines()
    failed = [line for line in lines if " FAILED: " in line]
    assert done.returncode == 1 and failed, done.stdout + done.stderr
    seed = int(failed[0].split()[1])
    assert f"replay: python -m quire.sim --seed {seed} --log --break no-fence" in done.stdout
    assert lines[-1] == f"40 seeds, {len(failed)} failures"
    replay = subprocess.run(
        [sys.executable, "-m", "quire.sim", "--seed", str(seed), "--log", "--break", "no-fence"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert replay.returncode == 1 and "VIOLATION" in replay.stdout


def test_ledgers_share_the_bookies_and_stay_apart() -> None:
    """Three ledgers over the same five bookies, under the seed's faults: each is written,
    fenced, recovered and tailed in the transcript, each bookie keeps each ledger's own
    master key, and each ledger reads back exactly what its own writer wrote."""
    assert SEED_LEDGERS > 1  # random seeds run several ledgers by default
    config = config_for_seed(3, ledgers=3, recoveries=1, readers=1, close=False)
    assert config.bookies == 5 and config.ensemble_size == 3  # the ensembles must overlap
    world = World(config, random.Random(config.seed))
    world.run()
    log = "\n".join(world.lines)
    assert len(world.ledgers) == 3
    for ledger_id, ledger in world.ledgers.items():
        name = f"L{ledger_id}"
        for seen in ("writer add ", "writer ACK ", "recovery0 RECOVERED", "reader0 read ["):
            assert f"{name}.{seen}" in log, f"{name}.{seen}"
        assert f"<- {name}.recovery0 fence" in log and f"meta {name} v" in log
        closed = ledger.metadata.ledger
        assert closed.last_entry_id is not None and closed.last_entry_id >= 0
        got = ledger.read_back(closed)
        own = {i: ledger.writer.written[i] for i in range(closed.last_entry_id + 1)}
        assert got == own and all(p.startswith(f"{name}.entry-".encode()) for p in got.values())
        assert ledger.acked.items() <= got.items()
        for bookie in world.bookies.values():
            facts = bookie.durable.get(ledger_id)
            assert facts is None or facts.master_key == ledger.master_key
            for (frame_ledger_id, entry_id), frame in bookie.entries.items():
                assert parse_header(frame)[:2] == (frame_ledger_id, entry_id)
    # Some bookie held entries of every ledger: their states lived side by side.
    assert any(
        {lid for lid, _ in bookie.entries} == set(world.ledgers)
        for bookie in world.bookies.values()
    )


def test_a_bookie_mixing_ledgers_is_caught_only_by_several_ledgers() -> None:
    """shared-lac (one LAC per bookie, not per ledger) is harmless with one ledger: the
    power test catching it shows that the seeds' ledgers do share the bookies."""
    _, failures, _ = run_seeds(range(50), ledgers=1, **BROKEN["shared-lac"])
    assert not failures, failures[0].error
    _, failures, _ = run_seeds(range(50), **BROKEN["shared-lac"])
    assert failures


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_the_simulator_catches_a_broken_rule(broken: str) -> None:
    overrides = BROKEN[broken]
    _, failures, _ = run_seeds(range(300), **overrides)
    assert failures, f"the simulator did not catch {broken} in 300 seeds"
    # ...and the same runs with the rule unbroken pass.
    clean = {k: v for k, v in overrides.items() if not k.endswith("_class")}
    _, clean_failures, _ = run_seeds([f.seed for f in failures], **clean)
    assert not clean_failures, clean_failures[0].error


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_transcript_matches_its_golden_file(name: str) -> None:
    result = run_config(SCENARIOS[name])
    assert result.ok, result.error
    golden = GOLDEN_DIR / f"{name}.txt"
    if os.environ.get("QUIRE_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(result.log)
    # A missing golden file fails: a scenario's first transcript is read before it is kept.
    assert golden.exists(), f"no golden transcript {golden}: QUIRE_UPDATE_GOLDEN=1 writes it"
    assert result.log == golden.read_text(), (
        f"{name} changed: diff it against {golden}; QUIRE_UPDATE_GOLDEN=1 rewrites it"
    )


def test_scenarios_show_what_they_are_named_for() -> None:
    logs = {name: run_config(config).log for name, config in SCENARIOS.items()}
    assert "writer FAIL" in logs["basic_fencing"] and "LEDGER_FENCED" in logs["basic_fencing"]
    assert logs["parallel_recoveries"].count("RECOVERED") == 5
    assert "CRASH" in logs["recovery_with_dead_bookie"]
    assert "writer ensemble changed" in logs["ensemble_change_during_writes"]
    assert "writer closed" in logs["ensemble_change_during_writes"]
    assert "restart" in logs["bookie_restart_during_recovery"]
    lost = logs["lost_bookie_rereplicated"]
    for seen in ("LOST for good", "auditor marks", "replicator fence and recover", "REPLICATED"):
        assert seen in lost, seen


def test_seeds_that_lose_a_bookie_repair_every_ledger() -> None:
    """A bookie lost for good while the writers run: the auditor marks each ledger with a
    segment on it, the replicators copy what it held (fencing and recovering the open
    ledgers first), and every ledger ends closed, whole, naming no lost bookie (checked by
    `SimLedger.check_end`; each stored replacement by `SimMetadata`)."""
    results = [run_seed(seed, lose_bookie=True) for seed in range(150)]
    failures = [f"seed {r.seed}: {r.error}" for r in results if not r.ok]
    assert not failures, "\n".join(failures)
    logs = [r.log for r in results if "LOST for good" in r.log]
    assert len(logs) > 40
    assert all("REPLICATED" in log or "replicator RECOVERED" in log for log in logs)
    assert sum("fence and recover" in log for log in logs) > 5
