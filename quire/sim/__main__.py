"""`python -m quire.sim --seeds N [--seed S] [--ledgers L] [--steps K] [--log]`.

Runs N seeds (from S, default 0) and ends with the line `N seeds, F failures`; every
failure prints its seed, what broke and the command that replays it. Each seed runs L
ledgers at once (default 3) over the same bookies. `--seed S` alone
runs that one seed; `--log` prints its event log (byte-identical on every run);
`--scenario NAME` prints the transcript of a scripted scenario (quire.sim.scenarios)."""

from __future__ import annotations

import argparse
import sys

from quire.sim.broken import BROKEN
from quire.sim.run import SEED_LEDGERS, replay_command, run_config, run_seed, run_seeds
from quire.sim.scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quire.sim", description=__doc__)
    parser.add_argument("--seeds", type=int, default=None, help="how many seeds to run")
    parser.add_argument("--seed", type=int, default=0, help="the first (or only) seed")
    parser.add_argument(
        "--ledgers",
        type=int,
        default=SEED_LEDGERS,
        help=f"ledgers each seed runs at once (default {SEED_LEDGERS})",
    )
    parser.add_argument("--steps", type=int, default=None, help="cap on events per run")
    parser.add_argument("--log", action="store_true", help="print the event log of --seed")
    parser.add_argument("--scenario", default=None, help="print a scenario's transcript")
    parser.add_argument(
        "--break",
        dest="broken",
        choices=sorted(BROKEN),
        default=None,
        help="run with a deliberately broken rule (the simulator's power, by hand)",
    )
    args = parser.parse_args(argv)
    if args.scenario is not None:
        scenario = run_config(SCENARIOS[args.scenario])
        sys.stdout.write(scenario.log)
        return 0 if scenario.ok else 1
    if args.ledgers < 1:
        parser.error("--ledgers must be at least 1")
    overrides = dict(BROKEN[args.broken]) if args.broken else {}
    overrides["ledgers"] = args.ledgers
    if args.steps:
        overrides["max_events"] = args.steps
    if args.seeds is None:
        result = run_seed(args.seed, **overrides)
        if args.log:
            sys.stdout.write(result.log)
        status = "ok" if result.ok else f"FAILED: {result.error}"
        print(f"seed {args.seed}: {status} ({result.events} events)")
        print(f"1 seeds, {0 if result.ok else 1} failures")
        return 0 if result.ok else 1

    def report(result) -> None:
        print(f"seed {result.seed} FAILED: {result.error}", flush=True)
        print(f"  replay: {replay_command(result.seed, args.broken, args.ledgers)}", flush=True)

    seeds = range(args.seed, args.seed + args.seeds)
    count, failures, seconds = run_seeds(seeds, on_failure=report, **overrides)
    print(f"{count / seconds:.0f} seeds/s ({seconds:.1f} s)", file=sys.stderr)
    print(f"{count} seeds, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
