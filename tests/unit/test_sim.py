"""The simulator: the real protocol cores under seeded faults. A thousand seeds pass; the
same seed gives the same transcript in any process; a broken rule is caught; the classic
scenarios match their golden transcripts (a missing one fails; QUIRE_UPDATE_GOLDEN=1
writes them)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from quire.sim.broken import BROKEN
from quire.sim.run import replay_command, run_config, run_seed, run_seeds
from quire.sim.scenarios import SCENARIOS
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
