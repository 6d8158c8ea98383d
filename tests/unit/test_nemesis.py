"""The nemesis against a stand-in cluster (the Cluster API of quire/cluster.py, processes as
flags) and a real fault proxy: every kind injects and heals what it says, the schedule is the
seed's, every injection and heal is logged, and heal_all leaves nothing faulty."""

from __future__ import annotations

import json
import random
import signal
import threading
from collections import Counter
from pathlib import Path

import pytest

from quire.faults import disk
from quire.faults.nemesis import (
    KINDS,
    SKIP_INVALID_JOURNAL_RECORD,
    Nemesis,
    NemesisError,
    Schedule,
)
from quire.faults.proxy import FaultProxy
from shared.bookie.journal_format import (
    SHORT_JOURNAL,
    FenceRecord,
    encode_file_header,
    encode_record,
    journal_file_name,
)
from tests.support.wait import until

BOOKIES = ["bookie-1", "bookie-2"]


class StandInCluster:
    """Processes that run, stop, die and come back as the supervisor would bring them back:
    at once unless held. Co-hosted, a bookie is one process, bookie-N, and its halves' names
    are unknown here: the nemesis must name the process (its fault directory, listener and
    log are the process's)."""

    def __init__(self, data_dir: Path, bookie_process: str = "separate") -> None:
        self.data_dir = data_dir
        self.config = type(
            "Config", (), {"bookie_ids": BOOKIES, "bookie_process": bookie_process}
        )()
        names = ["nats", "postgres", "metadata"]
        if bookie_process == "cohosted":
            names += BOOKIES
        else:
            names += [f"{b}.{h}" for b in BOOKIES for h in ("journal", "ledgerstore")]
        names += ["auditor", "replicator", "gateway"]
        self.running = dict.fromkeys(names, True)
        self.stopped: set[str] = set()
        self.held: set[str] = set()
        self.signals: list[tuple[str, int]] = []
        self.restart_count: Counter[str] = Counter()
        self.lock = threading.Lock()
        (data_dir / "logs").mkdir(parents=True)

    def process_names(self) -> list[str]:
        return list(self.running)

    def pid(self, name: str) -> int | None:
        return 1000 if self.running[name] else None

    def signal(self, name: str, sig: int) -> bool:
        with self.lock:
            self.signals.append((name, sig))
            if not self.running[name]:
                return False
            if sig == signal.SIGKILL:
                self.running[name] = False
                self.stopped.discard(name)
                if name not in self.held:
                    self._start(name)
            elif sig == signal.SIGSTOP:
                self.stopped.add(name)
            elif sig == signal.SIGCONT:
                self.stopped.discard(name)
            return True

    def hold(self, name: str) -> None:
        self.held.add(name)

    def release(self, name: str) -> None:
        with self.lock:
            self.held.discard(name)
            if not self.running[name]:
                self._start(name)

    def _start(self, name: str) -> None:
        self.running[name] = True
        self.restart_count[name] += 1
        with open(self.data_dir / "logs" / f"{name}.log", "a") as log:
            log.write('{"msg": "started"}\n')

    def wait_running(self, name: str, timeout_s: float) -> int:
        if not self.running[name]:
            raise TimeoutError(name)
        return 1000


@pytest.fixture
def proxy():
    with FaultProxy() as p:
        yield p


def make_nemesis(
    tmp_path: Path, proxy: FaultProxy, seed: int = 7, bookie_process: str = "separate"
):
    cluster = StandInCluster(tmp_path / "data", bookie_process)
    for name in cluster.process_names():
        if name not in ("nats", "postgres"):
            proxy.listen(name, ("127.0.0.1", 9))
    proxy.listen("metadata.pg", ("127.0.0.1", 9))
    faults = tmp_path / "faults"

    def listeners(name: str) -> list[str]:
        return [name, "metadata.pg"] if name == "metadata" else [name]

    nemesis = Nemesis(
        cluster,
        proxy,
        listeners,
        lambda name: faults / name,
        tmp_path,
        random.Random(seed),
        "http://127.0.0.1:9",
    )
    nemesis._wait_ready = lambda: None  # no gateway here: its readiness is the e2e test's
    return cluster, nemesis


def log_lines(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "nemesis.jsonl").read_text().splitlines()]


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fault kinds"):
        Schedule({"meteor": 1})


def test_process_kinds_use_the_supervision(tmp_path: Path, proxy: FaultProxy) -> None:
    cluster, nemesis = make_nemesis(tmp_path, proxy)
    fault = nemesis.inject("kill-hold")
    assert not cluster.running[fault.target] and fault.target in cluster.held
    nemesis.heal(fault)
    assert cluster.running[fault.target] and fault.target not in cluster.held

    fault = nemesis.inject("pause")
    assert fault.target in cluster.stopped
    nemesis.heal(fault)
    assert fault.target not in cluster.stopped

    fault = nemesis.inject("nats-restart")
    assert fault.target == "nats" and not cluster.running["nats"]
    nemesis.heal(fault)
    assert cluster.running["nats"] and cluster.restart_count["nats"] == 1


def test_partition_cuts_every_listener_of_the_process(tmp_path: Path, proxy: FaultProxy) -> None:
    cluster, nemesis = make_nemesis(tmp_path, proxy)
    nemesis.rng = random.Random(0)
    while (fault := nemesis.inject("partition")).target != "metadata":
        nemesis.heal(fault)
    cut = {"blackhole": "partitioned", "reset": "reset"}[fault.details["mode"]]
    assert proxy.state("metadata") == proxy.state("metadata.pg") == cut
    nemesis.heal(fault)
    assert {proxy.state(n) for n in proxy.names()} == {"open"}


def test_disk_and_clock_kinds_write_the_control_files(tmp_path: Path, proxy: FaultProxy) -> None:
    cluster, nemesis = make_nemesis(tmp_path, proxy)
    fault = nemesis.inject("clock-jump")
    offset = int((tmp_path / "faults" / fault.target / "clock-offset-ms").read_text())
    assert offset == fault.details["offset_ms"] and abs(offset) >= 5000
    nemesis.heal(fault)
    assert (tmp_path / "faults" / fault.target / "clock-offset-ms").read_text() == "0"

    fault = nemesis.inject("eio")
    op_file = tmp_path / "faults" / fault.target / f"fail-next-{fault.details['op']}"
    assert op_file.read_text() == "EIO"
    nemesis.heal(fault)  # not used by the stand-in: withdrawn
    assert not op_file.exists()

    fault = nemesis.inject("coordinated-power-loss")
    halves = [f"{b}.{h}" for b in BOOKIES for h in ("journal", "ledgerstore")]
    assert all(n in cluster.held and not cluster.running[n] for n in halves)
    nemesis.heal(fault)
    assert all(cluster.running[n] for n in halves) and not cluster.held

    # No journal file with a record yet: nothing to flip, no fault.
    assert nemesis.inject("bitflip-journal") is None


def test_cohosted_bookie_faults_act_on_its_one_process(tmp_path: Path, proxy: FaultProxy) -> None:
    cluster, nemesis = make_nemesis(tmp_path, proxy, bookie_process="cohosted")
    faults = tmp_path / "faults"
    # A file bookie-1's process wrote, fsynced at 4 bytes, 10 long now: the power loss must
    # read bookie-1's files.log (both halves log there) and cut it.
    written = tmp_path / "journal-file"
    written.write_bytes(b"0123456789")
    (faults / "bookie-1").mkdir(parents=True)
    (faults / "bookie-1" / "files.log").write_text(
        json.dumps({"op": "open", "path": str(written), "size": 0})
        + "\n"
        + json.dumps({"op": "fsync", "path": str(written), "size": 4})
        + "\n"
    )
    nemesis.power_loss_modes = ("lose",)
    fault = nemesis.inject("coordinated-power-loss")
    assert all(b in cluster.held and not cluster.running[b] for b in BOOKIES)
    assert fault.details["report"]["cut"] == [{"path": str(written), "from": 10, "to": 4}]
    assert written.read_bytes() == b"0123"
    nemesis.heal(fault)
    assert all(cluster.running[b] for b in BOOKIES) and not cluster.held

    for kind in ("eio", "enospc"):
        fault = nemesis.inject(kind)
        assert fault.target in BOOKIES
        assert (faults / fault.target / f"fail-next-{fault.details['op']}").exists()
        nemesis.heal(fault)

    for kind in ("kill", "kill-hold", "pause", "partition", "clock-jump"):
        targets = set()
        for _ in range(30):
            fault = nemesis.inject(kind)
            targets.add(fault.target)
            nemesis.heal(fault)
        assert targets & set(BOOKIES), kind  # a bookie is a target, as its process
    assert nemesis.bookie_process("bookie-2", "ledgerstore") == "bookie-2"
    assert nemesis.bookie_processes("bookie-2") == ["bookie-2"]
    nemesis.heal_all()
    assert all(cluster.running.values()) and not cluster.held


def test_a_cohosted_journal_refusing_damage_is_restarted_the_operators_way(
    tmp_path: Path, proxy: FaultProxy
) -> None:
    """The bookie's process refuses at its first start after the flip (its log says so):
    the operator's setting goes to that process, by the name the runner's env_for is asked
    for (bookie-N), and it starts."""
    cluster, nemesis = make_nemesis(tmp_path, proxy, bookie_process="cohosted")
    journal = tmp_path / "data" / "bookie-1" / "journal"
    journal.mkdir(parents=True)
    records = b"".join(encode_record(FenceRecord(i)) for i in range(1, 4))
    (journal / journal_file_name(1)).write_bytes(encode_file_header(1) + records)
    nemesis.rng = random.Random(0)
    nemesis._bookie_ids = lambda: ["bookie-1"]
    started = cluster._start
    refused = []

    def start_refusing_once(name: str) -> None:
        if name == "bookie-1" and not refused:
            refused.append(name)
            cluster.running[name] = True  # up a moment, long enough to say why it exits
            with open(cluster.data_dir / "logs" / f"{name}.log", "a") as log:
                log.write('{"exc": "JournalStartupError: ... refusing to start ..."}\n')
            return
        started(name)

    cluster._start = start_refusing_once
    fault = nemesis.inject("bitflip-journal")
    assert fault.target == "bookie-1" and fault.details["flip"]["flipped"]
    nemesis.heal(fault)
    assert refused == ["bookie-1"] and cluster.running["bookie-1"]
    assert nemesis.operator_env == {"bookie-1": {SKIP_INVALID_JOURNAL_RECORD: "true"}}
    assert [x["target"] for x in log_lines(tmp_path) if x["event"] == "operator"] == ["bookie-1"]


async def test_schedule_is_the_seeds_and_everything_is_logged(tmp_path: Path) -> None:
    async def kinds_of(where: Path) -> list[str]:
        where.mkdir()
        with FaultProxy() as proxy:
            _, nemesis = make_nemesis(where, proxy, seed=1)
            schedule = Schedule(
                {"kill": 1, "pause": 1, "partition": 1, "clock-jump": 1},
                duration_s=(0.0, 0.01),
                gap_s=(0.0, 0.01),
            )
            nemesis.start(schedule)

            def heals() -> int:
                if not (where / "nemesis.jsonl").exists():
                    return 0
                return sum(x["event"] == "heal" for x in log_lines(where))

            await until(lambda: heals() >= 8, "8 faults healed")
            nemesis.heal_all()
        assert nemesis.error is None and nemesis.covered()
        injected = [x for x in log_lines(where) if x["event"] == "inject"]
        healed = [x for x in log_lines(where) if x["event"] == "heal"]
        assert len(healed) == len(injected)  # each injection healed, the last by stop()
        assert all(h["kind"] == i["kind"] for i, h in zip(injected, healed, strict=True))
        assert sum(nemesis.injected.values()) == len(injected)
        kinds = [x["kind"] for x in injected][:8]
        assert set(kinds[:4]) == set(schedule.weights)  # each kind once first
        return kinds

    assert await kinds_of(tmp_path / "a") == await kinds_of(tmp_path / "b")


def test_heal_all_undoes_whatever_is_left(tmp_path: Path, proxy: FaultProxy) -> None:
    cluster, nemesis = make_nemesis(tmp_path, proxy)
    proxy.partition("gateway")
    proxy.reset("auditor")
    cluster.signal("replicator", signal.SIGSTOP)
    cluster.hold("metadata")
    cluster.signal("metadata", signal.SIGKILL)
    disk.set_clock_offset(tmp_path / "faults" / "auditor", -60000)
    disk.fail_next(tmp_path / "faults" / "bookie-1.journal", "write", "ENOSPC")
    nemesis.heal_all()
    assert {proxy.state(n) for n in proxy.names()} == {"open"}
    assert not cluster.stopped and not cluster.held and all(cluster.running.values())
    assert (tmp_path / "faults" / "auditor" / "clock-offset-ms").read_text() == "0"
    assert not (tmp_path / "faults" / "bookie-1.journal" / "fail-next-write").exists()
    assert log_lines(tmp_path)[-1]["event"] == "healed-all"


def test_a_process_that_does_not_come_back_is_a_finding(tmp_path: Path, proxy) -> None:
    cluster, nemesis = make_nemesis(tmp_path, proxy)
    cluster._start = lambda name: None  # it never starts again
    fault = nemesis.inject("kill")
    with pytest.raises(NemesisError, match="not running"):
        nemesis.heal(fault)


def test_every_kind_of_the_contract_is_there() -> None:
    assert set(KINDS) == {
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
    }


@pytest.mark.parametrize("bookie_process", ["separate", "cohosted"])
def test_a_journal_shorter_than_its_mark_after_a_power_loss_is_wiped_the_operators_way(
    tmp_path: Path, proxy: FaultProxy, bookie_process: str
) -> None:
    """The control run (fsync off) cuts journals below their LastLogMark: the journal
    refuses to start (its log says so, as services/journal/journal.py words it). Skipping
    records cannot help; the operator's way is to wipe the bookie and start it again (it
    rejoins in limbo), logged as an `operator` line; the other bookies are left alone."""
    cluster, nemesis = make_nemesis(tmp_path, proxy, bookie_process=bookie_process)
    nemesis.unsafe_no_fsync = True  # the control run: damage is expected
    refusing = "bookie-1" if bookie_process == "cohosted" else "bookie-1.journal"
    journal = tmp_path / "data" / "bookie-1" / "journal"
    journal.mkdir(parents=True)
    (journal / journal_file_name(1)).write_bytes(encode_file_header(1))
    started = cluster._start
    refused = []

    def start_refusing_once(name: str) -> None:
        if name == refusing and not refused:
            refused.append(name)
            cluster.running[name] = True
            with open(cluster.data_dir / "logs" / f"{name}.log", "a") as log:
                log.write(f'{{"msg": "{SHORT_JOURNAL}: ...; refusing to start ..."}}\n')
            return
        started(name)

    cluster._start = start_refusing_once
    fault = nemesis.inject("coordinated-power-loss")
    nemesis.heal(fault)
    assert refused == [refusing] and all(cluster.running.values()) and not cluster.held
    assert not journal.exists()  # wiped
    assert nemesis.operator_env == {}  # not restarted skipping records
    operator = [x for x in log_lines(tmp_path) if x["event"] == "operator"]
    assert [(x["kind"], x["target"]) for x in operator] == [("wipe-bookie", "bookie-1")]
    kills = Counter(name for name, sig in cluster.signals if sig == signal.SIGKILL)
    assert all(kills[p] == 2 for p in nemesis.bookie_processes("bookie-1"))  # power, wipe
    assert all(kills[p] == 1 for p in nemesis.bookie_processes("bookie-2"))


def test_a_short_journal_outside_the_control_run_is_a_finding(
    tmp_path: Path, proxy: FaultProxy
) -> None:
    """With fsync on, a power loss never cuts below the mark: a refusal is the run's finding."""
    cluster, nemesis = make_nemesis(tmp_path, proxy, bookie_process="cohosted")
    started = cluster._start

    def start_refusing(name: str) -> None:
        if name != "bookie-1":
            return started(name)
        cluster.running[name] = True
        with open(cluster.data_dir / "logs" / f"{name}.log", "a") as log:
            log.write(f'{{"msg": "{SHORT_JOURNAL}: ...; refusing to start ..."}}\n')

    cluster._start = start_refusing
    fault = nemesis.inject("coordinated-power-loss")
    with pytest.raises(NemesisError, match="bookie-1 refused to start"):
        nemesis.heal(fault)
