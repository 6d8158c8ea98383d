"""`quire up`'s supervision (quire/cluster.py), on the real Cluster with small scripts
standing in for the services: spawns, environments, exits, backoff, hold and release,
pauses, --no-restart and stop. The real services' restarts are tested end to end in
tests/e2e/test_quire_up.py."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import quire.cluster
from quire.bench import command
from quire.cluster import Cluster, ClusterConfig, ServiceProcess
from quire.infra import ManagedProcess, free_port
from tests.support.wait import until

# A service process's stand-in: it records its environment, then exits, lives a second,
# or runs until signalled, as DIR/<name>.mode says at its start; the gateway answers
# /readyz so that the Cluster's start completes as it does for the real one. Like a real
# service it handles SIGTERM (a clean exit), so a paused one acts on it only once resumed.
CHILD = """
import http.server, json, os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
out, name = os.environ["SUP_OUT"], os.environ["SUP_NAME"]
with open(os.path.join(out, f"{name}.{os.getpid()}.env"), "w") as f:
    json.dump(dict(os.environ), f)
try:
    mode = open(os.path.join(out, f"{name}.mode")).read().strip()
except FileNotFoundError:
    mode = "run"
if mode == "exit":
    sys.exit(3)
if mode == "brief":
    time.sleep(1.0)
    sys.exit(0)
if name.startswith("gateway"):
    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
        def log_message(self, *args):
            pass
    port = int(os.environ["QUIRE_GATEWAY__HTTP_PORT"])
    http.server.HTTPServer(("127.0.0.1", port), Ready).serve_forever()
while True:
    time.sleep(3600)
"""


CHILD_HANDLING_SIGTERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("ready", flush=True)
time.sleep(3600)
"""


class ScriptCluster(Cluster):
    def _service_command(self, kind: str) -> list[str]:
        return [sys.executable, "-c", CHILD]


class SlowRestart(ScriptCluster):
    """A restart that waits for the test's word, as NATS's or PostgreSQL's takes a while."""

    entered = threading.Event()
    gate = threading.Event()

    def _relaunch(self, svc: ServiceProcess):
        self.entered.set()
        self.gate.wait(30)
        return super()._relaunch(svc)


def wait(condition: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    return asyncio.run(until(condition, what, timeout_s))


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.data_dir = tmp_path / "quire-data"
        self.clusters: list[Cluster] = []

    def mode(self, name: str, mode: str) -> None:
        (self.out / f"{name}.mode").write_text(mode)

    def start(
        self,
        restart: bool = True,
        env: dict[str, str] | None = None,
        cls=ScriptCluster,
        gateways: int = 1,
        bookie_process: str = "separate",
    ) -> ScriptCluster:
        def env_for(name: str) -> dict[str, str]:
            return {"SUP_OUT": str(self.out), "SUP_NAME": name, **(env or {})}

        config = ClusterConfig(
            data_dir=self.data_dir,
            bookies=1,
            gateways=gateways,
            http_port=free_port(),
            grpc_port=free_port(),
            # Set, so that the Cluster starts neither: only its services are scripts.
            nats_url="nats://127.0.0.1:4222",
            database_url="postgresql+psycopg://quire@127.0.0.1:5432/quire",
            restart=restart,
            env_for=env_for,
            bookie_process=bookie_process,
        )
        cluster = cls(config, out=io.StringIO(), err=io.StringIO())
        self.clusters.append(cluster)
        cluster.start()
        return cluster

    def env_of(self, name: str, pid: int) -> dict[str, str]:
        path = self.out / f"{name}.{pid}.env"
        wait(path.exists, f"{name} (pid {pid}) to record its environment")
        return wait(lambda: _json(path), f"{name}'s environment written whole")


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


def restarted(cluster: Cluster, name: str, old: int | None) -> int:
    """The pid of `name`'s next incarnation, once it runs."""

    def new_pid() -> int | None:
        pid = cluster.pid(name)
        return pid if pid not in (None, old) else None

    return wait(new_pid, f"{name}'s restart")


def stderr(cluster: Cluster) -> str:
    assert isinstance(cluster.err, io.StringIO)
    return cluster.err.getvalue()


def row(cluster: Cluster, name: str) -> dict:
    info = json.loads((cluster.data_dir / "cluster.json").read_text())
    return next(r for r in info["services"] if r["name"] == name)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    yield h
    for cluster in h.clusters:
        cluster.stop()


def test_every_service_process_is_named_and_env_for_comes_last_at_every_spawn(
    harness: Harness,
) -> None:
    cluster = harness.start(env={"QUIRE_NATS_URL": "nats://127.0.0.1:9999"})
    assert cluster.process_names() == [
        "metadata",
        "bookie-1.journal",
        "bookie-1.ledgerstore",
        "auditor",
        "replicator",
        "gateway",
    ]
    first = cluster.pid("bookie-1.journal")
    assert first is not None
    env = harness.env_of("bookie-1.journal", first)
    # The runner's address wins over the cluster's own.
    assert env["QUIRE_NATS_URL"] == "nats://127.0.0.1:9999"
    assert env["SUP_NAME"] == "bookie-1.journal" and env["QUIRE_BOOKIE_ID"] == "bookie-1"
    assert cluster.signal("bookie-1.journal", signal.SIGKILL)
    second = restarted(cluster, "bookie-1.journal", first)
    again = harness.env_of("bookie-1.journal", second)
    assert again["QUIRE_NATS_URL"] == "nats://127.0.0.1:9999"
    # The same metrics port: targets.json stays true.
    assert again["QUIRE_METRICS_PORT"] == env["QUIRE_METRICS_PORT"]


def test_several_gateways_each_on_ports_of_its_own_kept_across_restarts(
    harness: Harness,
) -> None:
    cluster = harness.start(gateways=3)
    assert cluster.process_names()[-3:] == ["gateway", "gateway-2", "gateway-3"]
    info = json.loads((cluster.data_dir / "cluster.json").read_text())
    gateways = info["gateways"]
    assert [g["name"] for g in gateways] == ["gateway", "gateway-2", "gateway-3"]
    # "gateway" stays the first one, as API.md describes it.
    assert info["gateway"] == {k: gateways[0][k] for k in ("http", "grpc", "pid")}
    assert gateways[0]["http"] == cluster.http_url
    ports = set()
    for gateway in gateways:
        env = harness.env_of(gateway["name"], gateway["pid"])
        assert gateway["http"].endswith(f":{env['QUIRE_GATEWAY__HTTP_PORT']}")
        assert gateway["grpc"].endswith(f":{env['QUIRE_GATEWAY__GRPC_PORT']}")
        ports |= {env["QUIRE_GATEWAY__HTTP_PORT"], env["QUIRE_GATEWAY__GRPC_PORT"]}
    assert len(ports) == 6
    out = cluster.out.getvalue()
    assert out.startswith(f"quire: gateway ready at {cluster.http_url} ")
    assert f"quire: gateway-3 ready at {gateways[2]['http']} (grpc {gateways[2]['grpc']})" in out
    # A restarted gateway comes back on its own ports.
    assert cluster.signal("gateway-2", signal.SIGKILL)
    new = restarted(cluster, "gateway-2", gateways[1]["pid"])
    again = harness.env_of("gateway-2", new)
    assert gateways[1]["http"].endswith(f":{again['QUIRE_GATEWAY__HTTP_PORT']}")
    assert gateways[1]["grpc"].endswith(f":{again['QUIRE_GATEWAY__GRPC_PORT']}")


def test_a_killed_process_is_reported_restarted_and_listed(harness: Harness) -> None:
    cluster = harness.start()
    old = cluster.pid("auditor")
    assert old is not None and row(cluster, "auditor")["pid"] == old
    assert cluster.signal("auditor", signal.SIGKILL)
    new = restarted(cluster, "auditor", old)
    assert cluster.wait_running("auditor", 30) == new
    assert cluster.restarts()["auditor"] == 1
    assert f"quire: auditor (pid {old}) exited with code -9; restarting in 0.5s" in stderr(cluster)
    assert f"quire: auditor restarted (pid {new}, restart 1)" in stderr(cluster)
    assert (row(cluster, "auditor")["pid"], row(cluster, "auditor")["restarts"]) == (new, 1)
    assert {n: c for n, c in cluster.restarts().items() if c} == {"auditor": 1}


def test_a_crash_loop_stays_in_backoff_doubling_and_reported_each_time(harness: Harness) -> None:
    cluster = harness.start()
    harness.mode("replicator", "exit")  # from its next incarnation on
    assert cluster.signal("replicator", signal.SIGKILL)
    wait(lambda: "restarting in 2s" in stderr(cluster), "the third exit of the loop")
    exits = [line for line in stderr(cluster).splitlines() if "quire: replicator (pid" in line]
    assert [line.split("; ")[1] for line in exits[:3]] == [
        "restarting in 0.5s",
        "restarting in 1s",
        "restarting in 2s",
    ]
    assert "exited with code 3" in exits[1] and "exited with code 3" in exits[2]
    assert cluster.restarts()["replicator"] >= 2


def test_the_backoff_starts_again_once_the_process_stayed_up(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each incarnation lives a second, far beyond this (the real one is 60 s).
    monkeypatch.setattr(quire.cluster, "BACKOFF_RESET_AFTER_S", 0.2)
    harness.mode("auditor", "brief")
    cluster = harness.start()
    wait(lambda: cluster.restarts()["auditor"] >= 2, "two restarts of the auditor")
    exits = [line for line in stderr(cluster).splitlines() if "quire: auditor (pid" in line]
    assert len(exits) >= 2
    assert all("exited with code 0; restarting in 0.5s" in line for line in exits)


def test_a_held_process_stays_down_until_released(harness: Harness) -> None:
    cluster = harness.start()
    held = cluster.pid("auditor")
    cluster.hold("auditor")
    assert cluster.signal("auditor", signal.SIGKILL)
    other = cluster.pid("replicator")
    assert cluster.signal("replicator", signal.SIGKILL)
    # The replicator, killed with it on the same backoff, is back: the supervisor went
    # past the auditor's time to restart.
    wait(lambda: cluster.restarts()["replicator"] == 1, "the replicator's restart")
    assert f"quire: auditor (pid {held}) exited with code -9; held" in stderr(cluster)
    assert cluster.pid("auditor") is None and cluster.restarts()["auditor"] == 0
    assert row(cluster, "auditor")["pid"] is None
    assert cluster.pid("replicator") not in (None, other)
    cluster.release("auditor")
    back = cluster.pid("auditor")  # at once: release starts it in the caller
    assert back is not None and back != held
    assert cluster.restarts()["auditor"] == 1
    assert f"quire: auditor restarted (pid {back}, restart 1)" in stderr(cluster)
    # Supervised again: its next death is restarted.
    assert cluster.signal("auditor", signal.SIGKILL)
    wait(lambda: cluster.restarts()["auditor"] == 2, "the released auditor's restart")


def test_a_paused_process_is_alive_and_stop_still_ends_it(harness: Harness) -> None:
    cluster = harness.start()
    paused = cluster.pid("metadata")
    assert paused is not None
    harness.env_of("metadata", paused)  # written after its SIGTERM handler was set
    assert cluster.signal("metadata", signal.SIGSTOP)
    assert cluster.signal("replicator", signal.SIGKILL)
    wait(lambda: cluster.restarts()["replicator"] == 1, "the replicator's restart")
    assert cluster.pid("metadata") == paused and cluster.restarts()["metadata"] == 0
    assert "quire: metadata" not in stderr(cluster)
    metadata = cluster.service("metadata").proc
    cluster.stop()
    # Its clean exit on SIGTERM (a SIGCONT let it act on it), not a kill after 20 s.
    assert metadata.returncode == 0
    assert "did not stop in time" not in stderr(cluster)


def test_a_paused_server_is_stopped_by_its_stop_signal() -> None:
    """NATS and PostgreSQL (ManagedProcess) paused by the fault suite stop as well."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD_HANDLING_SIGTERM], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # its handler set
    server = ManagedProcess("nats", "nats", proc)
    proc.send_signal(signal.SIGSTOP)
    server.stop(timeout_s=20)
    assert proc.returncode == 0  # its own exit on SIGTERM: not killed after the wait
    proc.stdout.close()


def test_no_restart_reports_the_exit_and_leaves_it_down(harness: Harness) -> None:
    cluster = harness.start(restart=False)
    dead = cluster.pid("bookie-1.ledgerstore")
    assert cluster.signal("bookie-1.ledgerstore", signal.SIGKILL)
    line = f"quire: bookie-1.ledgerstore (pid {dead}) exited with code -9; see "
    wait(lambda: line in stderr(cluster), "the ledgerstore's exit reported")
    # Another exit, reported after it: the supervisor went past the first's backoff.
    assert cluster.signal("auditor", signal.SIGKILL)
    wait(lambda: "quire: auditor (pid" in stderr(cluster), "the auditor's exit reported")
    assert "restarting" not in stderr(cluster) and "restarted" not in stderr(cluster)
    assert stderr(cluster).count(line) == 1
    assert cluster.pid("bookie-1.ledgerstore") is None
    assert cluster.restarts()["bookie-1.ledgerstore"] == 0
    assert not cluster.signal("bookie-1.ledgerstore", signal.SIGKILL)
    # Released, it comes back even so: the fault runner's hold/release works either way.
    cluster.release("bookie-1.ledgerstore")
    assert cluster.pid("bookie-1.ledgerstore") not in (None, dead)


def test_stop_lets_a_restart_under_way_finish_and_stops_what_it_started(
    harness: Harness,
) -> None:
    cluster = harness.start(cls=SlowRestart)
    cluster.hold("auditor")
    assert cluster.signal("auditor", signal.SIGKILL)
    wait(lambda: "auditor (pid" in stderr(cluster), "the auditor's exit")
    releasing = threading.Thread(target=cluster.release, args=("auditor",))
    releasing.start()
    assert SlowRestart.entered.wait(30)
    stopping = threading.Thread(target=cluster.stop)
    stopping.start()
    wait(cluster._stopping.is_set, "stop to begin")
    SlowRestart.gate.set()
    releasing.join(30)
    stopping.join(60)
    assert not stopping.is_alive() and not releasing.is_alive()
    assert cluster.restarts()["auditor"] == 1
    assert cluster.service("auditor").proc.poll() is not None, "the new auditor was stopped"
    assert all(cluster.pid(name) is None for name in cluster.process_names())
    assert not (cluster.data_dir / "cluster.json").exists()
    assert cluster._supervisor is not None and not cluster._supervisor.is_alive()


def test_a_process_released_from_a_thread_that_ends_lives_on(harness: Harness) -> None:
    """PR_SET_PDEATHSIG follows the thread that started a process: the supervisor's own
    thread starts it, not the fault runner's that asked (which may end at once)."""
    cluster = harness.start()
    held = cluster.pid("auditor")
    cluster.hold("auditor")
    assert cluster.signal("auditor", signal.SIGKILL)
    wait(lambda: cluster.pid("auditor") is None, "the auditor down")
    releasing = threading.Thread(target=cluster.release, args=("auditor",))
    releasing.start()
    releasing.join(30)
    wait(
        lambda: not Path(f"/proc/self/task/{releasing.native_id}").exists(),
        "the releasing thread gone from the kernel",
    )
    back = cluster.pid("auditor")
    assert back not in (None, held)
    other = cluster.pid("replicator")
    assert cluster.signal("replicator", signal.SIGKILL)
    restarted(cluster, "replicator", other)  # time enough for a SIGTERM to have acted
    assert cluster.pid("auditor") == back and cluster.restarts()["auditor"] == 1
    assert f"quire: auditor (pid {back}) exited" not in stderr(cluster)


def test_a_cohosted_bookie_is_one_process_listed_as_its_two_services(harness: Harness) -> None:
    cluster = harness.start(bookie_process="cohosted")
    assert cluster.process_names() == ["metadata", "bookie-1", "auditor", "replicator", "gateway"]
    pid = cluster.pid("bookie-1")
    assert pid is not None
    assert cluster.pid("bookie-1.journal") == cluster.pid("bookie-1.ledgerstore") == pid
    journal, ledgerstore = row(cluster, "bookie-1.journal"), row(cluster, "bookie-1.ledgerstore")
    assert (journal["kind"], ledgerstore["kind"]) == ("journal", "ledgerstore")
    assert journal["pid"] == ledgerstore["pid"] == pid
    assert journal["process"] == ledgerstore["process"] == "bookie-1"
    env = harness.env_of("bookie-1", pid)
    assert journal["metrics"].endswith(f":{env['QUIRE_METRICS_PORT']}/metrics")
    assert ledgerstore["metrics"].endswith(f":{env['QUIRE_LEDGERSTORE_METRICS_PORT']}/metrics")
    targets = json.loads((cluster.data_dir / "prometheus" / "targets.json").read_text())
    halves = {t["labels"]["instance"]: t["labels"]["service"] for t in targets}
    assert halves["bookie-1.journal"] == "journal"
    assert halves["bookie-1.ledgerstore"] == "ledgerstore"
    # The bench counts the process's CPU once.
    info = json.loads((cluster.data_dir / "cluster.json").read_text())
    bookies = [p for p in command._processes(info["services"]) if p.pid == pid]
    assert [(p.name, p.kind) for p in bookies] == [("bookie-1", "bookie")]
    # Killing either half kills the bookie's one process; it comes back whole.
    assert cluster.signal("bookie-1.ledgerstore", signal.SIGKILL)
    new = restarted(cluster, "bookie-1.journal", pid)
    assert cluster.pid("bookie-1.ledgerstore") == new
    assert cluster.restarts()["bookie-1"] == 1
    # Held by one half's name, released by the other's.
    cluster.hold("bookie-1.journal")
    assert cluster.signal("bookie-1", signal.SIGKILL)
    wait(lambda: cluster.pid("bookie-1.ledgerstore") is None, "the bookie to stay down")
    cluster.release("bookie-1.ledgerstore")
    assert cluster.wait_running("bookie-1.journal", 30) not in (None, new)
