"""The multi-host run: the fault suite's workload, history, final phase and checker on a
cluster spread over network namespaces (quire/hosts.py), with rack-aware placement, while
the network is partitioned: one NATS server cut from the other two (a minority), one bookie
host cut from everything, one gateway host cut from its nearest NATS server; then the heal,
the repair, the final phase, the checker and a placement check of every ledger's segments.

`python -m quire.faults.multihost --out DIR [--tier short|long] [--seed S]` prints its
figures and writes DIR/run.json; tests/e2e/test_multihost.py runs the short tier (a fixed
schedule), the long one draws partitions of any kind on any host for two minutes. Needs root
(see quire/hosts.py).
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
from dataclasses import dataclass
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
from shared.metrics import scrape_sync  # noqa: E402
from shared.protocol.placement import Adherence, PlacementPolicy, PlacementRules  # noqa: E402
from shared.service import connect_nats  # noqa: E402
from shared.subjects import Subjects  # noqa: E402

PLACEMENT = PlacementRules(policy="rackaware", min_num_racks_per_write_quorum=2)
PLACEMENT_ENV = {
    "QUIRE_PLACEMENT__POLICY": PLACEMENT.policy,
    "QUIRE_PLACEMENT__MIN_NUM_RACKS_PER_WRITE_QUORUM": str(
        PLACEMENT.min_num_racks_per_write_quorum
    ),
    # A segment a fault left misplaced (a replacement placed at random while its racks'
    # bookies were cut off) is moved once they are back (docs/placement.md).
    "QUIRE_AUDITOR__REPAIRED_PLACEMENT_POLICY_NOT_ADHERING_BOOKIE_ENABLE": "true",
}
# The pace (seconds): faults long enough for a bookie's adds to time out
# (add_bookie_timeout_ms, 5 s) and for a dead link to be seen by the NATS servers' and the
# services' pings (about 10 s: quire/hosts.py, shared/service.py).
WARM_UP_S = 5.0
BETWEEN_S = 5.0
REPAIR_TIMEOUT_S = 90.0
MOVE_TIMEOUT_S = 60.0  # a nats-link fault: how long its host's services may take to move
WORKLOAD = {"writers": 2, "readers": 2, "rate": 15.0}  # two of these: the box has 2 cores
# The fault kinds, each a partition of hosts:
# - nats-minority: a NATS server cut from the other two (it keeps its clients);
# - host-isolated: a bookie host, a gateway host or the meta host cut from every other host
#   and the test;
# - nats-link: a service host cut from the NATS server its services are connected to (at
#   first the one they list first, their nearest): they must see it by their pings and
#   reconnect to another.
KINDS = ("nats-minority", "host-isolated", "nats-link")


@dataclass(frozen=True)
class Tier:
    """`schedule`: fixed faults (kind, duration), each on a host drawn from the seed; or,
    when empty, faults drawn from the seed for `fault_period_s`."""

    schedule: tuple[tuple[str, float], ...] = ()
    fault_period_s: float = 0.0
    duration_s: tuple[float, float] = (2.0, 12.0)
    gap_s: tuple[float, float] = (1.0, 4.0)


TIERS = {
    # make test's: one of each, the bookie host as the isolated one (~95 s in all).
    "short": Tier(schedule=(("nats-minority", 12.0), ("host-isolated", 15.0), ("nats-link", 12.0))),
    # Any kind on any host (the meta host and the gateways too), for two minutes.
    "long": Tier(fault_period_s=120.0),
}


class MultiHostRun:
    def __init__(
        self, run_dir: Path, tier: str = "short", seed: int = 1, stream: IO[str] = sys.stdout
    ) -> None:
        self.run_dir = run_dir
        self.tier_name = tier
        self.tier = TIERS[tier]
        self.seed = seed
        self.stream = stream
        self.rng = random.Random(seed)
        self.layout = HostsLayout()
        self.cluster = HostsCluster(run_dir / "cluster", self.layout, extra_env=PLACEMENT_ENV)
        self.faults: list[dict[str, Any]] = []

    def say(self, text: str) -> None:
        print(f"multihost: {text}", file=self.stream, flush=True)

    def execute(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "tier": self.tier_name,
            "seed": self.seed,
            "run_dir": str(self.run_dir),
        }
        workloads: list[Workload] = []
        history: History | None = None
        started = time.monotonic()
        try:
            self.cluster.start()
            result["cluster_start_s"] = round(time.monotonic() - started, 1)
            self.say(f"cluster up in {result['cluster_start_s']} s on {self.cluster.nats_url}")
            result["event_stream_replicas"] = asyncio.run(self._event_stream_replicas())
            history = History(self.run_dir / "history.jsonl")
            # Each workload's HTTP clients on one gateway, its gRPC clients on the next:
            # every gateway holds writers of both workloads, and readers and recoverers
            # read and fence ledgers whose writer is on the other gateway.
            gateways = len(self.cluster.gateway_hosts)
            for i in range(gateways):
                workloads.append(
                    Workload(
                        self.cluster.http_url(i),
                        self.cluster.grpc_address((i + 1) % gateways),
                        history,
                        seed=self.rng.randrange(2**32),
                        # Created on the other gateway: every writer's appends and closes
                        # follow a writer redirect first (then go to the writer directly).
                        create_http_url=self.cluster.http_url((i + 1) % gateways),
                        **WORKLOAD,
                    )
                )
            for workload in workloads:
                workload.start()
            self._faults()
            for workload in workloads:
                workload.stop()
            self.cluster.network.heal()
            result["writer_redirects"] = self._writer_redirects(gateways)
            # The final phase recovers (closes) every ledger and reads it back; then the
            # auditor, asked to audit, marks what the faults left under-replicated or
            # misplaced (an open ledger's last segment is checked once closed), the
            # replicator repairs it, and everything is read back again from where it is now.
            settings = QuireSettings(nats_url=self.cluster.nats_url)
            ledgers = final.ledgers_of(history.ops())
            first = final.run_final_phase(self.cluster.http_url(0), settings, ledgers)
            check = checker.check(history.ops(), first)
            result["audits"], result["repair_s"] = self._repair()
            misplaced = [
                a.get("placement_policy_check", {}).get("ledgers_not_adhering")
                for a in result["audits"]
            ]
            self.say(
                f"repair: {result['repair_s']} s, {len(result['audits'])} audit(s), ledgers "
                f"misplaced found by each: {misplaced}"
            )
            again = final.run_final_phase(self.cluster.http_url(1), settings, ledgers)
            after = checker.check(history.ops(), again)
            placement = placement_violations(again, self.layout.bookies, PLACEMENT)
            result |= {
                "check": dataclasses.asdict(check),
                "check_after_repair": dataclasses.asdict(after),
                "placement_violations": placement,
                "exited": self.cluster.exited(),
            }
            result["ok"] = (
                check.ok
                and after.ok
                and not placement
                and not result["exited"]
                and result["repair_s"] is not None
                and result["event_stream_replicas"] == 3
                and all(f.get("moved_s", 0) is not None for f in self.faults)
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

    def _writer_redirects(self, gateways: int) -> int:
        """HTTP requests the gateways answered with a writer redirect (307): the workload's
        writers create on one gateway and append through the other."""
        return int(
            sum(
                scrape_sync(f"{self.cluster.http_url(i)}/metrics").value(
                    "quire_gateway_http_requests_total", status="307"
                )
                for i in range(gateways)
            )
        )

    async def _event_stream_replicas(self) -> int:
        """QUIRE_EVENTS' replicas, as the services created it."""
        nc = await connect_nats(QuireSettings(nats_url=self.cluster.nats_url), "multihost")
        try:
            info = await nc.jetstream().stream_info(Subjects("quire").event_stream)
            return info.config.num_replicas or 1
        finally:
            await nc.close()

    def _faults(self) -> None:
        """The tier's faults, one at a time, each healed before the next; durations and
        gaps are the faults' own (pacing, not waiting for a condition)."""
        time.sleep(WARM_UP_S)
        if self.tier.schedule:
            for kind, duration_s in self.tier.schedule:
                self._inject(kind, duration_s, short=True)
                time.sleep(BETWEEN_S)
            return
        ends = time.monotonic() + self.tier.fault_period_s
        while time.monotonic() < ends:
            self._inject(self.rng.choice(KINDS), self.rng.uniform(*self.tier.duration_s))
            time.sleep(self.rng.uniform(*self.tier.gap_s))

    def _inject(self, kind: str, duration_s: float, short: bool = False) -> None:
        """One fault for `duration_s`, then the heal. `short`: the host isolated is a
        bookie's and the host cut from its NATS server a gateway's (whose clients see it)."""
        cluster, network = self.cluster, self.cluster.network
        services = ["meta", *self.layout.bookies, *cluster.gateway_hosts]
        if kind == "nats-minority":
            host, *majority = self.rng.sample(cluster.nats_hosts, len(cluster.nats_hosts))
            for other in majority:
                network.cut(host, other)
        elif kind == "host-isolated":
            host = self.rng.choice(sorted(self.layout.bookies) if short else services)
            network.isolate(host)
        elif kind == "nats-link":
            host = self.rng.choice(cluster.gateway_hosts if short else services)
            self._nats_link(host, duration_s)
            return
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        self._record({"kind": kind, "host": host, "duration_s": round(duration_s, 1)})
        time.sleep(duration_s)
        network.heal()

    def _nats_link(self, host: str, duration_s: float) -> None:
        """`host` cut from the NATS server most of its services are connected to (at first
        their nearest; a service that moved stays where it went) until they are connected
        to the others (seen in the servers' /connz; `moved_s`, None if not within
        MOVE_TIMEOUT_S), and for `duration_s` at least."""
        cluster = self.cluster
        counts = cluster.nats_connections(host)
        before = sum(counts.values())
        server = max(counts, key=lambda name: counts[name])
        started = time.monotonic()
        cluster.network.cut(host, server)
        fault = {"kind": "nats-link", "host": host, "nats": server, "moved_s": None}
        while time.monotonic() - started < MOVE_TIMEOUT_S:
            counts = cluster.nats_connections(host)
            if sum(n for name, n in counts.items() if name != server) >= before:
                fault["moved_s"] = round(time.monotonic() - started, 1)
                break
            time.sleep(0.5)
        time.sleep(max(0.0, duration_s - (time.monotonic() - started)))
        fault["duration_s"] = round(time.monotonic() - started, 1)
        self._record(fault)
        cluster.network.heal()

    def _record(self, fault: dict[str, Any]) -> None:
        self.faults.append(fault)
        moved = f", moved to other servers in {fault['moved_s']} s" if "moved_s" in fault else ""
        self.say(f"{fault['kind']}: {fault['host']} for {fault['duration_s']:.0f} s{moved}")

    def _repair(self) -> tuple[list[dict[str, Any]], float | None]:
        """Audits (trigger_audit) until one finds no ledger misplaced with none listed
        under-replicated, each after the repair of what the last one marked: the audits'
        answers, and the seconds from the first until then (None if not within
        REPAIR_TIMEOUT_S)."""
        started = time.monotonic()
        audits: list[dict[str, Any]] = []
        with httpx.Client(base_url=self.cluster.http_url(0), timeout=30.0) as client:
            while time.monotonic() - started < REPAIR_TIMEOUT_S:
                audit = _ask(client, "PUT", TRIGGER_AUDIT)
                if audit is None:
                    time.sleep(0.5)
                    continue
                audits.append(audit)
                placement = audit.get("placement_policy_check", {})
                while time.monotonic() - started < REPAIR_TIMEOUT_S:
                    if _ask(client, "GET", UNDER_REPLICATED) == []:
                        break
                    time.sleep(0.5)
                else:
                    break
                if not audit.get("ledgers_marked") and not placement.get("ledgers_not_adhering"):
                    return audits, round(time.monotonic() - started, 2)
        return audits, None


def _ask(client: httpx.Client, method: str, path: str) -> Any:
    """The JSON answer, or None if the call failed (retried by the caller)."""
    try:
        response = client.request(method, path)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def placement_violations(
    ledgers: Iterable[FinalLedger], locations: Mapping[str, str], rules: PlacementRules
) -> list[str]:
    """Each segment holding entries whose ensemble does not adhere to the placement policy
    (shared/protocol/placement.py's check, the auditor's: every write quorum). As the
    auditor, a segment that holds no entry (the ledger closed before its first) is not
    counted; a ledger left open counts every segment."""
    policy = PlacementPolicy(rules)
    found = []
    for ledger in ledgers:
        for index, (first, bookies) in enumerate(ledger.segments):
            if index + 1 < len(ledger.segments):
                last: int | None = ledger.segments[index + 1][0] - 1
            else:
                last = ledger.last_entry_id
            if last is not None and last < first:
                continue
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
            f"entries acked {entries.get('ok', 0)} of {entries.get('attempted', 0)}; "
            f"writer redirects followed {result.get('writer_redirects')}",
            file=stream,
        )
        violations = {k: check[k] for k in checker.FATAL if check[k]}
        print(
            f"  ledgers {check['ledgers']}, final entries {check['final_entries']}; lost "
            f"{check['lost']}, unexpected {check['unexpected']}, violations {violations or 0}",
            file=stream,
        )
        after = result["check_after_repair"]
        misplaced = [
            a.get("placement_policy_check", {}).get("ledgers_not_adhering")
            for a in result["audits"]
        ]
        print(
            f"  after the repair (read through gateway-2): lost {after['lost']}, violations "
            f"{ {k: after[k] for k in checker.FATAL if after[k]} or 0 }; ledgers misplaced "
            f"found by each audit: {misplaced}",
            file=stream,
        )
        print(
            f"  placement violations {len(result['placement_violations'])}; processes exited "
            f"{result['exited'] or 0}; event stream replicas {result['event_stream_replicas']}",
            file=stream,
        )
    faults = ", ".join(
        f"{f['kind']} {f['host']} {f['duration_s']:.0f} s"
        + (f" (moved in {f['moved_s']} s)" if "moved_s" in f else "")
        for f in result["faults"]
    )
    print(f"  faults: {faults or 'none'}", file=stream)
    print(f"  repair s (after the audit): {result.get('repair_s')}", file=stream)
    print(
        f"  elapsed {result['elapsed_s']} s: {'PASSED' if result['ok'] else 'FAILED'}", file=stream
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m quire.faults.multihost",
        description="Quire over network namespaces, partitioned, checked (needs root).",
    )
    parser.add_argument("--out", type=Path, required=True, help="where the run's files go")
    parser.add_argument("--tier", choices=sorted(TIERS), default="short")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
    args.out.mkdir(parents=True, exist_ok=False)
    args.out.chmod(0o711)  # PostgreSQL runs as another user when we are root
    result = MultiHostRun(args.out, args.tier, args.seed).execute()
    print_result(result, sys.stdout)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
