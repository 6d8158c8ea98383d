"""The nemesis: faults injected into a running cluster, one at a time, each bounded in time
and healed, on a schedule drawn from a seeded generator.

Process faults go through the cluster's supervision (quire.cluster.Cluster: signal, hold,
release), partitions through the fault proxy (quire/faults/proxy.py), disk and clock faults
through the fault-control directories the service processes read (quire/faults/disk.py).
Every injection and heal is logged, with its times, to `nemesis.jsonl` in the run dir.

Faults act on processes. A co-hosted bookie (the default of `quire up`) is one process,
bookie-N: killed, paused, partitioned, skewed, powered off, failing its next IO or
restarted after a bitflip as a whole, with one fault directory and one proxy listener that
both its halves use. Run with separate bookie processes (bookie-N.journal,
bookie-N.ledgerstore), the process faults hit one half alone, EIO and ENOSPC the half
drawn, a bitflip restarts the half that owns the file (a journal file: the journal), and
a power loss or a wipe takes both.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from quire.cluster import Cluster
from quire.faults import disk
from quire.faults.proxy import FaultProxy
from shared.bookie.fault_files import FAIL_NEXT_FSYNC, FAIL_NEXT_WRITE
from shared.bookie.journal_format import SHORT_JOURNAL
from shared.clock import CLOCK_OFFSET_FILE

KINDS = (
    "kill",
    "kill-hold",
    "pause",
    "partition",
    "nats-restart",
    "postgres-restart",
    "clock-jump",
    "power-loss",
    "coordinated-power-loss",
    "bitflip-journal",
    "bitflip-entrylog",
    "eio",
    "enospc",
    "disk-wipe",
)

SERVERS = ("nats", "postgres")
BOOKIE_HALVES = ("journal", "ledgerstore")
# What a service's log says once it started (shared/service.py run_service), and what the
# journal says when it refuses to start on a damaged journal (services/journal/journal.py).
STARTED = '"msg": "started"'
REFUSED = "refusing to start"
SKIP_INVALID_JOURNAL_RECORD = "QUIRE_JOURNAL__SKIP_REPLAY_JOURNAL_INVALID_RECORD"
FAIL_NEXT = {"write": FAIL_NEXT_WRITE, "fsync": FAIL_NEXT_FSYNC}
RUNNING_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 120.0
CLOCK_JUMP_MS = (5_000, 120_000)


class NemesisError(Exception):
    """The cluster could not be brought back: a finding of the run, not a fault of the suite."""


@dataclass(frozen=True)
class Schedule:
    """What a scenario's nemesis does: fault kinds with their weights, how long each fault
    lasts and the quiet gaps between them (seconds, drawn uniformly)."""

    weights: dict[str, float]
    duration_s: tuple[float, float] = (2.0, 6.0)
    gap_s: tuple[float, float] = (1.0, 3.0)

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds: {sorted(unknown)}")


@dataclass
class Fault:
    """One injected fault: what it hit and how to undo it."""

    kind: str
    target: str
    start: float
    details: dict[str, Any] = field(default_factory=dict)
    heal: Callable[[], None] = lambda: None


class Nemesis:
    """Injects the faults of a Schedule into `cluster` until stopped, then heals everything."""

    def __init__(
        self,
        cluster: Cluster,
        proxy: FaultProxy,
        listeners: Callable[[str], list[str]],
        faults_dir: Callable[[str], Path],
        run_dir: Path,
        rng: random.Random,
        ready_url: str,
        power_loss_modes: tuple[str, ...] = disk.POWER_LOSS_MODES,
        unsafe_no_fsync: bool = False,
    ) -> None:
        self.cluster = cluster
        self.proxy = proxy
        self.listeners = listeners  # a process's proxy listeners
        self.faults_dir = faults_dir  # a process's QUIRE_FAULTS_DIR
        self.rng = rng
        self.ready_url = ready_url
        self.power_loss_modes = power_loss_modes
        self.unsafe_no_fsync = unsafe_no_fsync  # the control run: bookies skip their fsyncs
        self.log_path = run_dir / "nemesis.jsonl"
        self.injected: Counter[str] = Counter()
        self.last_heal_at: float | None = None
        self._kinds: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        # Environment the operator gave a process (on top of the runner's), by name.
        self.operator_env: dict[str, dict[str, str]] = {}

    # -- the schedule -------------------------------------------------------------------

    def start(self, schedule: Schedule) -> None:
        self._kinds = set(schedule.weights)
        self._thread = threading.Thread(
            target=self._run, args=(schedule,), name="nemesis", daemon=True
        )
        self._thread.start()

    def covered(self) -> bool:
        """Every kind of the schedule injected at least once."""
        return self._kinds <= set(self.injected)

    def stop(self) -> None:
        """End the schedule; the fault under way (if any) is healed before this returns."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, schedule: Schedule) -> None:
        """Each kind once first, in a seeded order (a short run covers them all), then
        kinds drawn by weight. A kind with no target yet (a bitflip before any record was
        written) is tried again later."""
        kinds = sorted(schedule.weights)
        weights = [schedule.weights[k] for k in kinds]
        first = self.rng.sample(kinds, len(kinds))
        try:
            while not self._stop.wait(self.rng.uniform(*schedule.gap_s)):
                kind = first.pop(0) if first else self.rng.choices(kinds, weights)[0]
                fault = self.inject(kind)
                if fault is None:
                    if kind not in self.injected:
                        first.append(kind)
                    continue
                self._stop.wait(self.rng.uniform(*schedule.duration_s))
                self.heal(fault)
        except BaseException as exc:  # reported by the runner as the run's failure
            self.error = exc
            self._log("error", kind="nemesis", target="", error=repr(exc))

    # -- inject and heal ----------------------------------------------------------------

    def inject(self, kind: str) -> Fault | None:
        """Inject one fault of `kind` on a target drawn from the cluster; None when the
        cluster has no target for it now."""
        fault = getattr(self, "_" + kind.replace("-", "_"))()
        if fault is None:
            return None
        self.injected[kind] += 1
        self._log("inject", kind=fault.kind, target=fault.target, **fault.details)
        return fault

    def heal(self, fault: Fault) -> None:
        try:
            fault.heal()
        finally:
            self.last_heal_at = time.time()
            self._log(
                "heal",
                kind=fault.kind,
                target=fault.target,
                started=fault.start,
                lasted_s=round(self.last_heal_at - fault.start, 3),
            )

    def heal_all(self) -> None:
        """After the schedule: undo every fault that may be left (a partition, a clock
        offset, a paused or held process, an unused disk fault), then wait until every
        process runs and the gateway is ready."""
        self.stop()
        for name in self.proxy.names():
            if self.proxy.state(name) != "open":
                self.proxy.heal(name)
        for name in self._services():
            directory = self.faults_dir(name)
            for leftover in FAIL_NEXT.values():
                (directory / leftover).unlink(missing_ok=True)
            if (directory / CLOCK_OFFSET_FILE).exists():
                disk.set_clock_offset(directory, 0)
        for name in self.cluster.process_names():
            self.cluster.release(name)
            if self.cluster.pid(name) is not None:
                self.cluster.signal(name, signal.SIGCONT)
        for name in self.cluster.process_names():
            self._wait_running(name)
        self._wait_ready()
        self._log("healed-all", kind="all", target="")

    # -- the kinds ----------------------------------------------------------------------

    def _kill(self) -> Fault:
        name = self.rng.choice(self._services())
        self.cluster.signal(name, signal.SIGKILL)
        return Fault("kill", name, time.time(), heal=lambda: self._wait_running(name))

    def _kill_hold(self) -> Fault:
        name = self.rng.choice(self._services())
        self._kill_held([name])
        return Fault("kill-hold", name, time.time(), heal=lambda: self._bring_back([name]))

    def _pause(self) -> Fault:
        name = self.rng.choice(self._services() + self._servers())
        self.cluster.signal(name, signal.SIGSTOP)
        return Fault(
            "pause", name, time.time(), heal=lambda: self.cluster.signal(name, signal.SIGCONT)
        )

    def _partition(self) -> Fault:
        """Mostly a blackhole (a cut link: the process notices only by its timeouts), now
        and then a reset (its connections closed and refused: it notices at once and keeps
        reconnecting)."""
        name = self.rng.choice(self._services())
        cut = self.listeners(name)
        mode = self.rng.choices(("blackhole", "reset"), (3, 1))[0]
        for listener in cut:
            if mode == "blackhole":
                self.proxy.partition(listener)
            else:
                self.proxy.reset(listener)

        def heal() -> None:
            for listener in cut:
                self.proxy.heal(listener)

        return Fault("partition", name, time.time(), {"listeners": cut, "mode": mode}, heal)

    def _nats_restart(self) -> Fault | None:
        return self._server_restart("nats")

    def _postgres_restart(self) -> Fault | None:
        return self._server_restart("postgres")

    def _server_restart(self, name: str) -> Fault | None:
        if name not in self.cluster.process_names():
            return None
        self._kill_held([name])
        return Fault(f"{name}-restart", name, time.time(), heal=lambda: self._release([name]))

    def _clock_jump(self) -> Fault:
        name = self.rng.choice(self._services())
        offset = self.rng.randint(*CLOCK_JUMP_MS) * self.rng.choice((-1, 1))
        directory = self.faults_dir(name)
        disk.set_clock_offset(directory, offset)
        return Fault(
            "clock-jump",
            name,
            time.time(),
            {"offset_ms": offset},
            heal=lambda: disk.set_clock_offset(directory, 0),
        )

    def _power_loss(self) -> Fault:
        bookie = self.rng.choice(self.cluster.config.bookie_ids)
        return self._lose_power("power-loss", bookie, [bookie])

    def _coordinated_power_loss(self) -> Fault:
        return self._lose_power("coordinated-power-loss", "all-bookies", self._bookie_ids())

    def _lose_power(self, kind: str, target: str, bookies: list[str]) -> Fault:
        processes = [p for b in bookies for p in self.bookie_processes(b)]
        self._kill_held(processes)
        mode = self.rng.choice(self.power_loss_modes)
        report = disk.power_loss([self.faults_dir(p) for p in processes], mode, self.rng)
        return Fault(
            kind,
            target,
            time.time(),
            {"mode": mode, "report": report},
            # Without fsync (the control run) a power loss cuts what the journal had
            # checkpointed: it may refuse to start, as it should, and the operator steps in.
            heal=lambda: self._bring_back(processes, damage_expected=self.unsafe_no_fsync),
        )

    def _bitflip_journal(self) -> Fault | None:
        return self._bitflip("bitflip-journal", "journal", "journal")

    def _bitflip_entrylog(self) -> Fault | None:
        return self._bitflip("bitflip-entrylog", "entrylog", "ledgerstore")

    def _bitflip(self, kind: str, files: str, half: str) -> Fault | None:
        """A bit flipped in one of a bookie's files while its process is down, so that the
        restarted process reads the file from disk (replay, recovery, reads). A journal
        damaged before its tail refuses to start (docs/storage.md): the heal is then the
        operator's, a restart that skips the damaged records."""
        bookie = self.rng.choice(self._bookie_ids())
        candidates = [
            p
            for p in disk.bookie_files(self.cluster.data_dir, bookie).get(files, [])
            if p.exists() and p.stat().st_size > 0
        ]
        if not candidates:
            return None
        name = self.bookie_process(bookie, half)
        self._kill_held([name])
        report = disk.flip_bit(self.rng.choice(sorted(candidates)), self.rng)
        return Fault(
            kind,
            name,
            time.time(),
            {"flip": report},
            heal=lambda: self._bring_back([name], damage_expected=True),
        )

    def _bring_back(self, names: list[str], damage_expected: bool = False) -> None:
        """Release held processes and wait until each service among them has started. A
        journal that refuses to start on damage is restarted the operator's way when the
        fault damaged it on purpose; otherwise its refusal is a finding of the run."""
        since = {name: self._log_size(name) for name in names}
        self._release(names)
        for name in names:
            if name in SERVERS:
                continue
            started = self._wait_started(name, since[name])
            if started == "started":
                continue
            if not damage_expected:
                raise NemesisError(f"{name} refused to start after the fault; see its log")
            if started == "short":
                self._wipe_and_restart(name)
                continue
            # BookKeeper's skipReplayJournalInvalidRecord: the damaged batch is lost on this
            # bookie, which from then on answers UNKNOWN_LEDGER_STATE (not NO_ENTRY) for
            # what it lacks. Kept for the rest of the run: the damage stays in the file.
            self.operator_env[name] = {SKIP_INVALID_JOURNAL_RECORD: "true"}
            self._log("operator", kind="restart-skipping-damage", target=name)
            self._kill_held([name])
            again = self._log_size(name)
            self._release([name])
            if self._wait_started(name, again) != "started":
                raise NemesisError(f"{name} refused to start even skipping damaged records")

    def _wipe_and_restart(self, name: str) -> None:
        """The operator's way with a journal shorter than its recorded position (what was
        fsynced and checkpointed is gone: the control run's fsync off): skipping records
        cannot bring those bytes back, so the bookie's disk is wiped and it starts again,
        in limbo, for the auditor to have what it held re-replicated (docs/storage.md, "A
        wiped bookie"); what no other bookie holds is lost, and the checker says so."""
        bookie = next(
            (name.removesuffix(f".{h}") for h in BOOKIE_HALVES if name.endswith(f".{h}")), name
        )
        processes = self.bookie_processes(bookie)
        self._log("operator", kind="wipe-bookie", target=bookie, refused=name)
        self._kill_held(processes)
        disk.wipe_bookie(self.cluster.data_dir, bookie, [self.faults_dir(p) for p in processes])
        since = {p: self._log_size(p) for p in processes}
        self._release(processes)
        for process in processes:
            if self._wait_started(process, since[process]) != "started":
                raise NemesisError(f"{process} refused to start even on a wiped disk")

    def _eio(self) -> Fault:
        return self._fail_next("eio", "EIO")

    def _enospc(self) -> Fault:
        return self._fail_next("enospc", "ENOSPC")

    def _fail_next(self, kind: str, errno_name: str) -> Fault:
        """The next write or fsync of a bookie file by one bookie process (separate: one
        half's) fails: it fail-stops and the supervisor restarts it. Heal: the fault is
        withdrawn if it was not used, and the process runs again."""
        bookie = self.rng.choice(self._bookie_ids())
        name = self.bookie_process(bookie, self.rng.choice(BOOKIE_HALVES))
        op = self.rng.choice(("write", "fsync"))
        directory = self.faults_dir(name)
        disk.fail_next(directory, op, errno_name)

        def heal() -> None:
            path = directory / FAIL_NEXT[op]
            used = not path.exists()
            path.unlink(missing_ok=True)
            self._log("detail", kind=kind, target=name, used=used)
            self._wait_running(name)

        return Fault(kind, name, time.time(), {"op": op}, heal)

    def _disk_wipe(self) -> Fault:
        bookie = self.rng.choice(self._bookie_ids())
        processes = self.bookie_processes(bookie)
        self._kill_held(processes)
        report = disk.wipe_bookie(
            self.cluster.data_dir, bookie, [self.faults_dir(p) for p in processes]
        )
        return Fault(
            "disk-wipe",
            bookie,
            time.time(),
            {"report": report},
            heal=lambda: self._bring_back(processes),
        )

    # -- helpers ------------------------------------------------------------------------

    @property
    def cohosted(self) -> bool:
        return self.cluster.config.bookie_process == "cohosted"

    def bookie_processes(self, bookie: str) -> list[str]:
        """The processes of a bookie: itself co-hosted, else its journal and ledgerstore."""
        return [bookie] if self.cohosted else [f"{bookie}.{half}" for half in BOOKIE_HALVES]

    def bookie_process(self, bookie: str, half: str) -> str:
        """The process that runs `half` of `bookie` (co-hosted: the bookie's one process,
        whose name has the fault directory, the proxy listener, the log and the operator's
        environment; the cluster takes a half's name as an alias, the runner would not)."""
        return bookie if self.cohosted else f"{bookie}.{half}"

    def _services(self) -> list[str]:
        return [n for n in self.cluster.process_names() if n not in SERVERS]

    def _servers(self) -> list[str]:
        return [n for n in self.cluster.process_names() if n in SERVERS]

    def _bookie_ids(self) -> list[str]:
        return list(self.cluster.config.bookie_ids)

    def _kill_held(self, names: list[str]) -> None:
        """kill -9 each of `names`, kept down until released; returns once all are down."""
        for name in names:
            self.cluster.hold(name)
            if self.cluster.pid(name) is not None:
                self.cluster.signal(name, signal.SIGKILL)
        deadline = time.monotonic() + RUNNING_TIMEOUT_S
        while any(self.cluster.pid(n) is not None for n in names):
            if time.monotonic() > deadline:
                raise NemesisError(f"{names} still up {RUNNING_TIMEOUT_S:.0f} s after kill -9")
            time.sleep(0.05)

    def _release(self, names: list[str]) -> None:
        for name in names:
            self.cluster.release(name)
        for name in names:
            self._wait_running(name)

    def _wait_running(self, name: str) -> None:
        try:
            self.cluster.wait_running(name, RUNNING_TIMEOUT_S)
        except TimeoutError:
            raise NemesisError(
                f"{name} not running {RUNNING_TIMEOUT_S:.0f} s after its heal"
            ) from None

    def _log_size(self, name: str) -> int:
        path = self.cluster.data_dir / "logs" / f"{name}.log"
        return path.stat().st_size if path.exists() else 0

    def _wait_started(self, name: str, since: int) -> str:
        """ "started" once `name`'s log (from byte `since`) says it started, "refused" if it
        says the process refused to start (a damaged journal), "short" if it refused a
        journal shorter than its recorded position."""
        path = self.cluster.data_dir / "logs" / f"{name}.log"
        deadline = time.monotonic() + RUNNING_TIMEOUT_S
        while time.monotonic() < deadline:
            with open(path, "rb") as log:
                log.seek(since)
                text = log.read().decode(errors="replace")
            if STARTED in text:
                return "started"
            if REFUSED in text:
                return "short" if SHORT_JOURNAL in text else "refused"
            time.sleep(0.1)
        raise NemesisError(f"{name} did not start within {RUNNING_TIMEOUT_S:.0f} s")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        with httpx.Client(timeout=2.0, verify=False) as client:
            while time.monotonic() < deadline:
                try:
                    if client.get(f"{self.ready_url}/readyz").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise NemesisError(f"the gateway was not ready {READY_TIMEOUT_S:.0f} s after the heal")

    def _log(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "at": round(time.time(), 3), **fields}, default=str)
        with self._lock, open(self.log_path, "a") as out:
            out.write(line + "\n")
