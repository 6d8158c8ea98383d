"""Seeds to runs: each seed picks a configuration and a fault schedule, runs the world and
reports the first broken invariant with the command that replays it."""

from __future__ import annotations

import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace

from quire.sim.model import Faults, InvariantViolation, SimConfig, World

# Ledgers a random seed runs at once over the same bookies (`--ledgers` overrides it): several,
# so that their bookie state and writer deadlines interleave; three keep 1,000 seeds quick.
SEED_LEDGERS = 3
LOSE_BOOKIE_SHARE = 0.25


@dataclass
class RunResult:
    seed: int
    ok: bool
    error: str
    lines: list[str]
    events: int

    @property
    def log(self) -> str:
        return "\n".join(self.lines) + "\n"


def config_for_seed(seed: int, **overrides) -> SimConfig:
    """A varied configuration drawn from the seed: quorums, sizes, who races whom, for
    SEED_LEDGERS ledgers at once unless `ledgers` is overridden."""
    rng = random.Random(f"config-{seed}")
    bookies = rng.randint(3, 6)
    ensemble = rng.randint(2, min(4, bookies))
    write_quorum = rng.randint(2, ensemble) if ensemble > 1 else 1
    ack_quorum = rng.randint(1, write_quorum)
    faults = Faults(
        drop=rng.choice([0.0, 0.01, 0.05]),
        duplicate=rng.choice([0.0, 0.02]),
        crash_every_ms=rng.choice([0, 300, 600]),
        partition_every_ms=rng.choice([0, 300]),
        meta_conflict=rng.choice([0.0, 0.1, 0.3]),
        meta_answer_lost=rng.choice([0.0, 0.05]),
    )
    config = SimConfig(
        seed=seed,
        ledgers=SEED_LEDGERS,
        bookies=bookies,
        ensemble_size=ensemble,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        entries=rng.randint(5, 40),
        duration_ms=rng.randint(300, 1_200),
        recoveries=rng.randint(0, 3),
        close=rng.random() < 0.3,
        readers=rng.randint(0, 1),
        faults=faults,
    )
    # Drawn last, so that the draws above (and the runs they describe) stay as they were.
    faults.partial_read = rng.choice([0.0, 0.2])
    config.recovery_read_batch_size = rng.choice([1, 2, 3, 8, 64])
    # A quarter of the seeds draw it; those with a spare bookie and Qa >= 2 lose one.
    config.lose_bookie = rng.random() < LOSE_BOOKIE_SHARE
    return replace(config, **overrides)


def run_config(config: SimConfig) -> RunResult:
    world = World(config, random.Random(config.seed))
    try:
        world.run()
    except InvariantViolation as exc:
        return RunResult(config.seed, False, str(exc), world.lines, world.events)
    except Exception as exc:  # a crash of the code under test is a failure like any other
        detail = "".join(traceback.format_exception_only(exc)).strip()
        world.log(f"CRASH {detail}")
        world.log(traceback.format_exc())
        return RunResult(config.seed, False, detail, world.lines, world.events)
    return RunResult(config.seed, True, "", world.lines, world.events)


def run_seed(seed: int, **overrides) -> RunResult:
    return run_config(config_for_seed(seed, **overrides))


def replay_command(seed: int, broken: str | None = None, ledgers: int | None = None) -> str:
    extra = f" --break {broken}" if broken else ""
    if ledgers is not None and ledgers != SEED_LEDGERS:
        extra += f" --ledgers {ledgers}"
    return f"python -m quire.sim --seed {seed} --log{extra}"


def run_seeds(
    seeds: range | list[int],
    on_failure: Callable[[RunResult], None] | None = None,
    **overrides,
) -> tuple[int, list[RunResult], float]:
    """Run every seed; (runs, failures, seconds)."""
    started = time.perf_counter()
    failures = []
    count = 0
    for seed in seeds:
        result = run_seed(seed, **overrides)
        count += 1
        if not result.ok:
            failures.append(result)
            if on_failure is not None:
                on_failure(result)
    return count, failures, time.perf_counter() - started
