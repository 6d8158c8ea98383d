"""`python -m quire.faults --tier short|long --out DIR [--scenario NAME] [--seed S]
[--bookie-process cohosted|separate]`."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

# Before gRPC is imported: the cluster forks its processes (which exec at once) while the
# workload's gRPC threads run, and gRPC's fork handlers would only log that they skipped.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from quire.faults.run import BOOKIE_PROCESSES, TIERS, run_tier  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m quire.faults",
        description="The fault suite: scenarios of faults over fresh local clusters.",
    )
    parser.add_argument("--tier", choices=sorted(TIERS), default="short")
    parser.add_argument("--out", type=Path, required=True, help="where runs and summary.json go")
    parser.add_argument("--scenario", help="only this scenario of the tier")
    parser.add_argument("--seed", type=int, help="only this seed (default: the scenario's)")
    parser.add_argument(
        "--bookie-process",
        choices=BOOKIE_PROCESSES,
        help="every run's bookies co-hosted or separate (default: each scenario's choice)",
    )
    args = parser.parse_args(argv)
    # SIGTERM as Ctrl-C, and Ctrl-C even when started in the background of a script (which
    # ignores SIGINT): the runs' cleanup (heal, stop every cluster) runs either way.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
    return run_tier(
        args.tier, args.out, args.scenario, args.seed, bookie_process=args.bookie_process
    )


if __name__ == "__main__":
    sys.exit(main())
