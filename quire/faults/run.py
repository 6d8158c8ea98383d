"""The fault runner: each scenario on a fresh cluster, its workload under the nemesis, a heal,
the final phase and the checker; per-run JSON, a summary printed and written to
OUT/summary.json.

Every service process reaches NATS (and the metadata service PostgreSQL) through a listener
of the fault proxy of its own, and reads its fault-control directory (QUIRE_FAULTS_DIR); both
are set through ClusterConfig.env_for at each (re)spawn, by process name: a co-hosted
bookie's two halves share its listener and its directory. The cluster runs in this process
with restart=True, so the nemesis can signal, hold and release its processes.

Bookies run co-hosted (one process each, what `quire up` runs by default) except in the
seeds a scenario lists in `separate_seeds`, which run a journal and a ledgerstore process
per bookie so that both ways of running a bookie stay proven.
"""

from __future__ import annotations

import dataclasses
import io
import json
import random
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
from sqlalchemy.engine import make_url

from quire.cluster import Cluster, ClusterConfig
from quire.faults import checker, disk, final
from quire.faults.history import History
from quire.faults.nemesis import Nemesis, Schedule
from quire.faults.proxy import FaultProxy
from quire.faults.workload import Workload
from quire.infra import free_port
from shared.bookie.fault_files import UNSAFE_NO_FSYNC
from shared.config import QuireSettings

UNDER_REPLICATED = "/api/v1/autorecovery/list_under_replicated_ledger"
TRIGGER_AUDIT = "/api/v1/autorecovery/trigger_audit"
BOOKIE_PROCESSES = ("cohosted", "separate")


@dataclass(frozen=True)
class Scenario:
    name: str
    schedule: Schedule
    fault_period_s: float  # how long the workload runs under the nemesis
    control: bool = False  # fsync off on every bookie: the checker MUST see losses
    # Five: a ledger striped over four bookies (the workload makes some) keeps a bookie
    # outside its ensemble to re-replicate a missing fragment to.
    bookies: int = 5
    repair_timeout_s: float = 60.0  # 0: not measured
    final_deadline_s: float = final.DEADLINE_S
    seeds: tuple[int, ...] = (1,)
    workload: dict[str, Any] = field(default_factory=dict)  # Workload options
    # Not a local cluster under the nemesis: the multi-host run's long tier, partitions of
    # hosts in network namespaces (quire/faults/multihost.py; needs root); `schedule` unused.
    hosts: bool = False
    # Seeds run with a journal and a ledgerstore process per bookie (the others co-hosted):
    # there the process faults hit one half alone.
    separate_seeds: tuple[int, ...] = ()

    def bookie_process(self, seed: int) -> str:
        return "separate" if seed in self.separate_seeds else "cohosted"


# The short tier's pace: a fault every ~2.5 s on average.
BRISK: dict[str, Any] = {"duration_s": (1.0, 3.0), "gap_s": (0.5, 1.5)}
# The long tier's: faults long enough for leases to lapse and ensembles to change.
STEADY: dict[str, Any] = {"duration_s": (2.0, 12.0), "gap_s": (1.0, 4.0)}
PROCESS_FAULTS = {"kill": 3, "kill-hold": 1, "pause": 2}
NETWORK_FAULTS = {"partition": 3, "nats-restart": 1, "postgres-restart": 1}
DISK_FAULTS = {"power-loss": 2, "bitflip-journal": 1, "bitflip-entrylog": 1, "eio": 1}
MORE_DISK_FAULTS = {"enospc": 1, "coordinated-power-loss": 1, "disk-wipe": 1}
CONTROL = Schedule({"coordinated-power-loss": 1}, duration_s=(1.0, 2.0), gap_s=(4.0, 6.0))
# Every bookie's journal cut below what it checkpointed: nothing to repair from, and the
# ledgers whose entries are gone everywhere cannot be recovered; the final phase gives up on
# them sooner than on a healthy cluster (the checker counts them unrecovered).
CONTROL_RUN: dict[str, Any] = {"control": True, "repair_timeout_s": 0, "final_deadline_s": 20.0}
SHORT: dict[str, Any] = {"repair_timeout_s": 30.0}
LONG: dict[str, Any] = {"repair_timeout_s": 90.0, "seeds": (1, 2)}

TIERS: dict[str, list[Scenario]] = {
    "short": [
        # Separate processes: a journal or a ledgerstore killed, paused or cut off alone.
        Scenario(
            "processes", Schedule(PROCESS_FAULTS, **BRISK), 25.0, separate_seeds=(1,), **SHORT
        ),
        Scenario("network", Schedule(NETWORK_FAULTS, **BRISK), 25.0, **SHORT),
        Scenario("disk", Schedule(DISK_FAULTS, **BRISK), 25.0, **SHORT),
        Scenario("control-no-fsync", CONTROL, 12.0, **CONTROL_RUN),
    ],
    "long": [
        Scenario(
            "processes",
            Schedule(PROCESS_FAULTS | {"clock-jump": 1}, **STEADY),
            75.0,
            separate_seeds=(2,),
            **LONG,
        ),
        Scenario("network", Schedule(NETWORK_FAULTS | {"clock-jump": 1}, **STEADY), 75.0, **LONG),
        Scenario("disk", Schedule(DISK_FAULTS | MORE_DISK_FAULTS, **STEADY), 75.0, **LONG),
        Scenario("control-no-fsync", CONTROL, 20.0, **CONTROL_RUN),
        Scenario("multihost", Schedule({}), 120.0, hosts=True, seeds=(2,)),
    ],
}


class Run:
    """One scenario with one seed on a fresh cluster under `run_dir`."""

    def __init__(
        self, scenario: Scenario, seed: int, run_dir: Path, bookie_process: str | None = None
    ) -> None:
        self.scenario = scenario
        self.bookie_process = bookie_process or scenario.bookie_process(seed)
        self.seed = seed
        self.run_dir = run_dir
        self.faults_root = run_dir / "faults"
        self.proxy = FaultProxy()
        self._listeners: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self.cluster = Cluster(
            ClusterConfig(
                data_dir=run_dir / "data",
                bookies=scenario.bookies,
                http_port=free_port(),
                grpc_port=free_port(),
                restart=True,
                env_for=self.env_for,
                bookie_process=self.bookie_process,
            ),
            out=io.StringIO(),
            err=open(run_dir / "cluster.stderr", "a"),  # noqa: SIM115 (closed in execute)
        )
        self.rng = random.Random(seed)
        self.nemesis = Nemesis(
            self.cluster,
            self.proxy,
            self.listeners,
            self.faults_dir,
            run_dir,
            random.Random(self.rng.random()),
            self.cluster.http_url,
            # The control run loses what was not fsynced, all of it: a torn tail could keep
            # the very bytes whose loss it must show.
            power_loss_modes=("lose",) if scenario.control else disk.POWER_LOSS_MODES,
            unsafe_no_fsync=scenario.control,
        )

    # -- the processes' environment -----------------------------------------------------

    def faults_dir(self, name: str) -> Path:
        return self.faults_root / name

    def listeners(self, name: str) -> list[str]:
        with self._lock:
            return list(self._listeners.get(name, []))

    def env_for(self, name: str) -> dict[str, str]:
        """NATS (and PostgreSQL for the metadata service) through the process's own proxy
        listeners, made at its first spawn and kept across its restarts; its fault-control
        directory."""
        directory = self.faults_dir(name)
        directory.mkdir(parents=True, exist_ok=True)
        env = {"QUIRE_FAULTS_DIR": str(directory), **self.nemesis.operator_env.get(name, {})}
        with self._lock:
            if name not in self._listeners:
                nats = make_url(self.cluster.nats_url.replace("nats://", "postgresql://", 1))
                names = [name]
                self.proxy.listen(name, (nats.host, nats.port))
                if name == "metadata":
                    pg = make_url(self.cluster.database_url)
                    self.proxy.listen("metadata.pg", (pg.host, pg.port))
                    names.append("metadata.pg")
                self._listeners[name] = names
        env["QUIRE_NATS_URL"] = f"nats://{self.proxy.host}:{self.proxy.port(name)}"
        if name == "metadata":
            pg = make_url(self.cluster.database_url).set(
                host=self.proxy.host, port=self.proxy.port("metadata.pg")
            )
            env["QUIRE_DATABASE_URL"] = pg.render_as_string(hide_password=False)
        return env

    def _prepare_control(self) -> None:
        """fsync off in every bookie process, from its first start (the file is read then)."""
        for bookie in self.cluster.config.bookie_ids:
            for name in self.nemesis.bookie_processes(bookie):
                directory = self.faults_dir(name)
                directory.mkdir(parents=True, exist_ok=True)
                (directory / UNSAFE_NO_FSYNC).touch()

    # -- the run ------------------------------------------------------------------------

    def execute(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "scenario": self.scenario.name,
            "seed": self.seed,
            "control": self.scenario.control,
            "bookie_process": self.bookie_process,
            "run_dir": str(self.run_dir),
        }
        workload: Workload | None = None
        history: History | None = None
        nemesis = self.nemesis
        started = time.monotonic()
        try:
            if self.scenario.control:
                self._prepare_control()
            self.cluster.start()
            result["cluster_start_s"] = round(time.monotonic() - started, 1)
            settings = self._settings()
            history = History(self.run_dir / "history.jsonl")
            workload = Workload(
                self.cluster.http_url,
                self.cluster.grpc_address,
                history,
                seed=self.rng.randrange(2**32),
                **self.scenario.workload,
            )
            workload.start()
            nemesis.start(self.scenario.schedule)
            self._fault_period(nemesis)
            nemesis.stop()
            workload.stop()
            result["faults"] = dict(nemesis.injected)
            if nemesis.error is not None:
                raise nemesis.error
            nemesis.heal_all()
            healed_at = time.monotonic()
            if self.scenario.repair_timeout_s:
                result["repair_s"] = self._repair_time(healed_at, self.scenario.repair_timeout_s)
            final_data = final.run_final_phase(
                self.cluster.http_url,
                settings,
                final.ledgers_of(history.ops()),
                self.scenario.final_deadline_s,
            )
            check = checker.check(history.ops(), final_data)
            result |= {"check": dataclasses.asdict(check), "ok": check.ok}
        except Exception as exc:  # a run that could not finish is a failed run, with its cause
            result["ok"] = False
            result["error"] = f"{type(exc).__name__}: {exc}"
            (self.run_dir / "error.txt").write_text(traceback.format_exc())
        finally:
            result.setdefault("faults", dict(nemesis.injected))
            nemesis.stop()
            if workload is not None:
                workload.stop()
                result["workload"] = workload.stats()
            if history is not None:
                history.close()
            result["restarts"] = self.cluster.restarts() if self.cluster.services else {}
            result["proxy"] = self.proxy.stats()
            self.cluster.stop()
            self.proxy.close()
            self.cluster.err.close()
            result["elapsed_s"] = round(time.monotonic() - started, 1)
            _write_json(self.run_dir / "run.json", result)
        return result

    def _fault_period(self, nemesis: Nemesis) -> None:
        """The scenario's fault period, prolonged (up to three times) until each of its
        kinds was injected: on a loaded machine slow heals leave fewer faults."""
        started = time.monotonic()
        time.sleep(self.scenario.fault_period_s)
        longest = started + 3 * self.scenario.fault_period_s
        while not nemesis.covered() and nemesis.error is None and time.monotonic() < longest:
            time.sleep(0.5)

    def _settings(self) -> QuireSettings:
        user, password = self.cluster.nats_credentials or ("", "")
        return QuireSettings(nats_url=self.cluster.nats_url, nats_user=user, nats_password=password)

    def _repair_time(self, healed_at: float, timeout_s: float) -> float | None:
        """Seconds from the heal until the auditor (asked to audit now) lists no ledger
        under-replicated; None if that did not happen within `timeout_s`."""
        url = self.cluster.http_url
        with httpx.Client(timeout=10.0) as client:
            client.put(f"{url}{TRIGGER_AUDIT}")
            while time.monotonic() - healed_at < timeout_s:
                try:
                    response = client.get(f"{url}{UNDER_REPLICATED}")
                    if response.status_code == 200 and not response.json():
                        return round(time.monotonic() - healed_at, 2)
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        return None


# -- the tier and its summary -----------------------------------------------------------


def run_tier(
    tier: str,
    out: Path,
    scenario: str | None = None,
    seed: int | None = None,
    stream: IO[str] = sys.stdout,
    bookie_process: str | None = None,
) -> int:
    """Run the tier's scenarios (or one) with their seeds (or one); `bookie_process`, when
    given, for every run instead of the scenarios' choice."""
    scenarios = [s for s in TIERS[tier] if scenario is None or s.name == scenario]
    if not scenarios:
        raise SystemExit(f"no scenario {scenario!r} in tier {tier}")
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o711)  # PostgreSQL runs as another user when we are root
    results = []
    for sc in scenarios:
        for s in (seed,) if seed is not None else sc.seeds:
            run_dir = out / f"{sc.name}-seed{s}"
            run_dir.mkdir(parents=True, exist_ok=False)
            run_dir.chmod(0o711)
            if sc.hosts:
                print(f"faults: {sc.name} seed {s} ...", file=stream, flush=True)
                result = _multihost(s, run_dir)
            else:
                run = Run(sc, s, run_dir, bookie_process)
                print(
                    f"faults: {sc.name} seed {s} ({run.bookie_process} bookies) ...",
                    file=stream,
                    flush=True,
                )
                result = run.execute()
            results.append(result)
            print(f"faults: {sc.name} seed {s}: {_verdict(result)}", file=stream, flush=True)
    summary = summarise(tier, results)
    _write_json(out / "summary.json", summary)
    print_summary(summary, stream)
    return 0 if summary["passed"] else 1


def _multihost(seed: int, run_dir: Path) -> dict[str, Any]:
    """The multi-host run's long tier, as a run of this suite's summary (its first check;
    its own run.json has the rest)."""
    from quire.faults.multihost import MultiHostRun  # it uses this module's constants

    run = MultiHostRun(run_dir, "long", seed, stream=io.StringIO()).execute()
    result = {
        "scenario": "multihost",
        "seed": seed,
        "control": False,
        "run_dir": str(run_dir),
        "faults": dict(Counter(f["kind"] for f in run["faults"])),
        "ok": run["ok"],
        "elapsed_s": run["elapsed_s"],
    }
    if not run["ok"] and "error" not in run:
        result["error"] = f"the multi-host run failed its checks: see {run_dir / 'run.json'}"
    for key in ("error", "check", "repair_s"):
        if key in run:
            result.setdefault(key, run[key])
    return result


def _verdict(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"FAILED ({result['error']})"
    lost = result["check"]["lost"]
    if result["control"]:
        return f"control: {lost} lost ({'seen' if lost else 'NOT SEEN'})"
    return "ok" if result["ok"] else "VIOLATIONS"


# The history's outcomes as the summary names them.
OPERATIONS = {"attempted": "attempted", "acked": "ok", "failed": "fail", "indeterminate": "info"}


def summarise(tier: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scenario and in total: runs, faults by kind, operations, violations, repair and
    recovery times; `passed` when every normal run finished with no violation and every
    control run lost acknowledged entries."""
    scenarios: dict[str, dict[str, Any]] = {}
    for result in results:
        row = scenarios.setdefault(result["scenario"], _empty_row(result["control"]))
        _add(row, result)
    # The control runs' losses are deliberate: the total is the normal runs'.
    total = _empty_row(False)
    total.pop("control")
    for result in results:
        if not result["control"]:
            _add(total, result)
    return {
        "tier": tier,
        "passed": all(_passed(r) for r in results),
        "scenarios": scenarios,
        "total": total,
        "runs": results,
    }


def _passed(result: dict[str, Any]) -> bool:
    if "error" in result:
        return False
    if result["control"]:
        return result["check"]["lost"] > 0
    return bool(result["ok"])


def _empty_row(control: bool) -> dict[str, Any]:
    return {
        "control": control,
        "runs": 0,
        "failed_runs": 0,
        "faults": {},
        "operations": dict.fromkeys(OPERATIONS, 0),
        "entries": dict.fromkeys(OPERATIONS, 0),
        "violations": dict.fromkeys(checker.FATAL, 0),
        "figures": dict.fromkeys(checker.FIGURES, 0),
        "repair_s": [],
        "unrepaired_runs": 0,  # the under-replicated list not empty within the bound
        "recovery_s": [],
    }


def _add(row: dict[str, Any], result: dict[str, Any]) -> None:
    row["runs"] += 1
    row["failed_runs"] += not _passed(result)
    faults = Counter(row["faults"])
    faults.update(result.get("faults", {}))
    row["faults"] = dict(sorted(faults.items()))
    check = result.get("check")
    if check is None:
        return
    for name, outcome in OPERATIONS.items():
        row["operations"][name] += sum(c[outcome] for c in check["operations"].values())
        row["entries"][name] += check["entries"].get(outcome, 0)
    for key in checker.FATAL:
        row["violations"][key] += check[key]
    for key in checker.FIGURES:
        row["figures"][key] += check[key]
    if result.get("repair_s") is not None:
        row["repair_s"].append(result["repair_s"])
    elif "repair_s" in result:
        row["unrepaired_runs"] += 1
    row["recovery_s"].extend(round(ms / 1000, 3) for ms in check["recovery_ms"])


def print_summary(summary: dict[str, Any], stream: IO[str]) -> None:
    rows = [*summary["scenarios"].items(), ("TOTAL (normal runs)", summary["total"])]
    print(f"\nfault suite, tier {summary['tier']}:", file=stream)
    for name, row in rows:
        ops, entries, v = row["operations"], row["entries"], row["violations"]
        others = {k: n for k, n in v.items() if k not in ("lost", "unexpected") and n}
        label = f"{name} (control: fsync off)" if row.get("control") else name
        print(f"  {label}: runs {row['runs']}, failed {row['failed_runs']}", file=stream)
        print(
            f"    operations: attempted {ops['attempted']} acked {ops['acked']} failed "
            f"{ops['failed']} indeterminate {ops['indeterminate']} (entries appended: "
            f"attempted {entries['attempted']} acked {entries['acked']})",
            file=stream,
        )
        print(
            f"    lost {v['lost']}, unexpected {v['unexpected']}, other violations "
            f"{others or 0}; replicas missing {row['figures']['replicas_missing']}, "
            f"corrupt (detected) {row['figures']['replicas_corrupt']}",
            file=stream,
        )
        faults = ", ".join(f"{k} {n}" for k, n in row["faults"].items()) or "none"
        print(f"    faults: {faults}", file=stream)
        unrepaired = f" (not repaired in time: {row['unrepaired_runs']} runs)"
        print(
            f"    repair s: {_spread(row['repair_s'])}"
            f"{unrepaired if row['unrepaired_runs'] else ''}; "
            f"recovery s: {_spread(row['recovery_s'])}",
            file=stream,
        )
    verdict = "PASSED" if summary["passed"] else "FAILED"
    print(f"fault suite {verdict}", file=stream, flush=True)


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"median {ordered[len(ordered) // 2]:.2f} max {ordered[-1]:.2f} (n={len(ordered)})"


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
