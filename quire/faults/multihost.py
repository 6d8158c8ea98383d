"""The multi-host run: the fault suite's workload, history, final phase and checker on a
cluster spread over network namespaces (quire/hosts.py), with rack-aware placement, while
the network is partitioned: one NATS server cut from the other two (a minority), then one
bookie host cut from everything; then a heal, the repair, the final phase, the checker and
a placement check of every ledger's segments.

`python -m quire.faults.multihost --out DIR [--seed S]` prints its figures and writes
DIR/run.json; tests/e2e/test_multihost.py runs it. Needs root (see quire/hosts.py).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

# Before gRPC is imported (see quire/faults/__main__.py).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import httpx  # noqa: E402

from quire.faults import checker, final  # noqa: E402
from quire.faults.checker import FinalLedger  # noqa: E402
from quire.faults.history import History  # noqa: E402
from quire.faults.run import TRIGGER_AUDIT, UNDER_REPLICATED  # noqa: E402
from quire.faults.workload import Workload  # noqa: E402
from quire.hosts import HostsCluster, HostsLayout  # noqa: E402
from shared.config import QuireSettings  # noqa: E402
from shared.protocol.placement import Adherence, PlacementPolicy, PlacementRules  # noqa: E402
from shared.service import connect_nats  # noqa: E402
from shared.subjects import Subjects  # noqa: E402

PLACEMENT = PlacementRules(policy="rackaware", min_num_racks_per_write_quorum=2)
PLACEMENT_ENV = {
    "QUIRE_PLACEMENT__POLICY": PLACEMENT.policy,
    "QUIRE_PLACEMENT__MIN_NUM_RACKS_PER_WRITE_QUORUM": str(
        PLACEMENT.min_num_racks_per_write_quorum
    ),
}
# The schedule's pace (seconds): long enough for a bookie's adds to time out
# (add_bookie_timeout_ms, 5 s) and for the NATS servers to see a dead route (quire/hosts.py).
WARM_UP_S = 5.0
NATS_PARTITION_S = 12.0
BOOKIE_PARTITION_S = 15.0
BETWEEN_S = 5.0
REPAIR_TIMEOUT_S = 90.0
WORKLOAD = {"writers": 2, "readers": 1, "rate": 15.0}  # per gateway: the box has 2 cores


class MultiHostRun:
    def __init__(self, run_dir: Path, seed: int = 1, stream: IO[str] = sys.stdout) -> None:
        self.run_dir = run_dir
        self.seed = seed
        self.stream = stream
        self.rng = random.Random(seed)
        self.layout = HostsLayout()
        self.cluster = HostsCluster(run_dir / "cluster", self.layout, extra_env=PLACEMENT_ENV)
        self.faults: list[dict[str, Any]] = []

    def say(self, text: str) -> None:
        print(f"multihost: {text}", file=self.stream, flush=True)

    def execute(self) -> dict[str, Any]:
        result: dict[str, Any] = {"seed": self.seed, "run_dir": str(self.run_dir)}
        workloads: list[Workload] = []
        history: History | None = None
        started = time.monotonic()
        try:
            self.cluster.start()
            result["cluster_start_s"] = round(time.monotonic() - started, 1)
            self.say(f"cluster up in {result['cluster_start_s']} s on {self.cluster.nats_url}")
            result["event_stream_replicas"] = asyncio.run(self._event_stream_replicas())
            history = History(self.run_dir / "history.jsonl")
            for i in range(len(self.cluster.gateway_hosts)):
                workloads.append(
                    Workload(
                        self.cluster.http_url(i),
                        self.cluster.grpc_address(i),
                        history,
                        seed=self.rng.randrange(2**32),
                        **WORKLOAD,
                    )
                )
            for workload in workloads:
                workload.start()
            self._faults()
            for workload in workloads:
                workload.stop()
            self.cluster.network.heal()
            healed_at = time.monotonic()
            result["repair_s"] = self._repair_time(healed_at)
            self.say(f"repair: {result['repair_s']} s after the heal")
            final_data = final.run_final_phase(
                self.cluster.http_url(0),
                QuireSettings(nats_url=self.cluster.nats_url),
                final.ledgers_of(history.ops()),
            )
            check = checker.check(history.ops(), final_data)
            placement = placement_violations(final_data, self.layout.bookies, PLACEMENT)
            result |= {
                "check": dataclasses.asdict(check),
                "placement_violations": placement,
                "exited": self.cluster.exited(),
            }
            result["ok"] = (
                check.ok
                and not placement
                and not result["exited"]
                and result["repair_s"] is not None
                and result["event_stream_replicas"] == 3
            )
        except Exception as exc:  # a run that could not finish is a failed run, with its cause
            result["ok"] = False
            result["error"] = f"{type(exc).__name__}: {exc}"
            (self.run_dir / "error.txt").write_text(traceback.format_exc())
        finally:
            for workload in workloads:
                try:
                    workload.stop()
                except RuntimeError as exc:
                    result.setdefault("error", f"workload: {exc}")
                    result["ok"] = False
            result["workload"] = [w.stats() for w in workloads]
            result["faults"] = self.faults
            if history is not None:
                history.close()
            self.cluster.stop()
            result["elapsed_s"] = round(time.monotonic() - started, 1)
            (self.run_dir / "run.json").write_text(json.dumps(result, indent=2, default=str))
        return result

    async def _event_stream_replicas(self) -> int:
        """QUIRE_EVENTS' replicas, as the services created it."""
        nc = await connect_nats(QuireSettings(nats_url=self.cluster.nats_url), "multihost")
        try:
            info = await nc.jetstream().stream_info(Subjects("quire").event_stream)
            return info.config.num_replicas or 1
        finally:
            await nc.close()

    def _faults(self) -> None:
        """The schedule: the NATS minority partition, then a bookie host cut off; the
        durations are the faults' own (pacing, not waiting for a condition)."""
        network = self.cluster.network
        time.sleep(WARM_UP_S)
        minority, *majority = self.rng.sample(self.cluster.nats_hosts, 3)
        self._fault("nats-minority", minority, NATS_PARTITION_S)
        for other in majority:
            network.cut(minority, other)
        time.sleep(NATS_PARTITION_S)
        network.heal()
        time.sleep(BETWEEN_S)
        bookie = self.rng.choice(sorted(self.layout.bookies))
        self._fault("bookie-isolated", bookie, BOOKIE_PARTITION_S)
        network.isolate(bookie)
        time.sleep(BOOKIE_PARTITION_S)
        network.heal()
        time.sleep(BETWEEN_S)

    def _fault(self, kind: str, host: str, duration_s: float) -> None:
        self.faults.append({"kind": kind, "host": host, "duration_s": duration_s})
        self.say(f"{kind}: {host} for {duration_s:.0f} s")

    def _repair_time(self, healed_at: float) -> float | None:
        """Seconds from the heal until the auditor (asked to audit now) lists no ledger
        under-replicated; None if that did not happen within REPAIR_TIMEOUT_S."""
        url = self.cluster.http_url(0)
        with httpx.Client(timeout=10.0) as client:
            client.put(f"{url}{TRIGGER_AUDIT}")
            while time.monotonic() - healed_at < REPAIR_TIMEOUT_S:
                try:
                    response = client.get(f"{url}{UNDER_REPLICATED}")
                    if response.status_code == 200 and not response.json():
                        return round(time.monotonic() - healed_at, 2)
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        return None


def placement_violations(
    ledgers: Iterable[FinalLedger], locations: Mapping[str, str], rules: PlacementRules
) -> list[str]:
    """Each segment of each ledger whose ensemble does not adhere to the placement policy
    (shared/protocol/placement.py's check, the auditor's: every write quorum)."""
    policy = PlacementPolicy(rules)
    found = []
    for ledger in ledgers:
        for first, bookies in ledger.segments:
            adherence = policy.check(bookies, ledger.write_quorum, locations)
            if adherence.adherence is Adherence.FAIL:
                found.append(f"ledger {ledger.ledger_id} segment {first}: {adherence.reason}")
    return found


def print_result(result: dict[str, Any], stream: IO[str]) -> None:
    print("\nmulti-host run:", file=stream)
    if "error" in result:
        print(f"  FAILED: {result['error']}", file=stream)
    check = result.get("check")
    if check is not None:
        ops = {k: sum(c[k] for c in check["operations"].values()) for k in ("ok", "fail", "info")}
        entries = check["entries"]
        print(
            f"  operations: acked {ops['ok']} failed {ops['fail']} indeterminate {ops['info']}; "
            f"entries acked {entries.get('ok', 0)} of {entries.get('attempted', 0)}",
            file=stream,
        )
        violations = {k: check[k] for k in checker.FATAL if check[k]}
        print(
            f"  ledgers {check['ledgers']}, final entries {check['final_entries']}; lost "
            f"{check['lost']}, unexpected {check['unexpected']}, violations {violations or 0}",
            file=stream,
        )
        print(
            f"  placement violations {len(result['placement_violations'])}; processes exited "
            f"{result['exited'] or 0}; event stream replicas {result['event_stream_replicas']}",
            file=stream,
        )
    faults = ", ".join(f"{f['kind']} {f['host']} {f['duration_s']:.0f} s" for f in result["faults"])
    print(f"  faults: {faults or 'none'}; repair s: {result.get('repair_s')}", file=stream)
    print(
        f"  elapsed {result['elapsed_s']} s: {'PASSED' if result['ok'] else 'FAILED'}", file=stream
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m quire.faults.multihost",
        description="Quire over network namespaces, partitioned, checked (needs root).",
    )
    parser.add_argument("--out", type=Path, required=True, help="where the run's files go")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
    args.out.mkdir(parents=True, exist_ok=False)
    args.out.chmod(0o711)  # PostgreSQL runs as another user when we are root
    result = MultiHostRun(args.out, args.seed).execute()
    print_result(result, sys.stdout)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
