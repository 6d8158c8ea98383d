"""Hosts on one machine: a Quire cluster spread over network namespaces, one a host, each
with an address of its own on one bridge, and partitions between them.

`Network` makes the hosts. Every namespace is held by a process of ours (`unshare --net`
running `sleep`, ended with its parent), the bridge too lives in a namespace of its own,
and the test's side of the link to it is a veth whose peer is in that namespace: when the
processes end (stopped, or killed with the process that started them) the kernel removes
the namespaces, the bridge and every veth. Nothing is named under /run/netns and nothing
is left behind to clean up. A partition is a blackhole route (`ip route add blackhole
ADDR/32`) inside a namespace: its packets to that address are dropped, as a broken link
would; `cut` adds one on each side, `heal` removes them all.

`HostsCluster` lays a cluster out over them: three nats-servers clustered over their hosts'
addresses (JetStream on, QUIRE_EVENTS created by the services with 3 replicas), a "meta"
host with PostgreSQL, the metadata service, the auditor and the replicator, one host per
bookie (one co-hosted process, `python -m services.bookie`, as `quire up` and deploy/ run
it; or, with `HostsLayout(bookie_process="separate")`, its journal and its ledgerstore as
two; its rack in QUIRE_BOOKIE_LOCATION), one per gateway. Each service lists all three
NATS servers, the one of its own host's turn first (its nearest). The processes are not
restarted: the faults here are the network's, and a process that exits is reported by
`exited()`.

Needs root (network namespaces), util-linux's unshare and nsenter, and iproute2.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from quire.infra import (
    NATS_MAX_PAYLOAD,
    InfraError,
    ManagedProcess,
    ended_with_parent,
    nats_server_binary,
    start_postgres,
    wait_for_port,
    write_private,
)

NATS_PORT = 4222
ROUTE_PORT = 6222
MONITOR_PORT = 8222  # the nats-servers' monitoring endpoints (/connz: who is connected)
POSTGRES_PORT = 5432
HTTP_PORT = 7480
GRPC_PORT = 7481
SUBNET_PREFIX = "10.213"  # a /24 of 10.213.0.0/16 not routed here yet is picked
TEST_HOST_OCTET = 254  # the test's own address on the bridge
# How soon a nats-server sees a dead route or client (the default is 2 min x 2): a
# partition of a few seconds must be noticed within the run.
NATS_PING_INTERVAL = "3s"
NATS_PING_MAX = 3
READY_TIMEOUT_S = 120.0
POSTGRES_AGENT_READY = "postgres ready"


class HostsError(InfraError):
    pass


def available() -> str | None:
    """Why hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("unshare", "nsenter", "ip") if shutil.which(tool) is None]
    if missing:
        return f"missing: {', '.join(missing)}"
    return None


def _run(args: list[str]) -> None:
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise HostsError(f"{' '.join(args)}: {result.stderr.strip() or result.returncode}")


def _holder() -> ManagedProcess:
    """A process in a new network namespace that holds it while it lives."""
    proc = subprocess.Popen(
        **ended_with_parent(["unshare", "--net", "--", "sleep", "infinity"]),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    holder = ManagedProcess("netns", "netns", proc)
    ours = os.readlink("/proc/self/ns/net")
    deadline = time.monotonic() + 10
    # setpriv execs unshare, unshare execs sleep: the pid is the same, its namespace
    # changes when unshare ran.
    while True:
        if proc.poll() is not None:
            raise HostsError(f"unshare --net exited with code {proc.returncode}")
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{proc.pid}/ns/net") != ours:
                return holder
        if time.monotonic() > deadline:
            holder.stop()
            raise HostsError("unshare --net made no namespace within 10 s")
        time.sleep(0.01)


@dataclass
class Host:
    name: str
    address: str
    holder: ManagedProcess

    @property
    def netns(self) -> str:
        return f"/proc/{self.holder.pid}/ns/net"

    def command(self, args: list[str]) -> list[str]:
        """`args` run inside this host's network namespace."""
        return ["nsenter", f"--net={self.netns}", "--", *args]

    def ip(self, *args: str) -> None:
        _run(self.command(["ip", *args]))


class Network:
    """A bridge and hosts on it, and partitions between them (see the module's doc)."""

    def __init__(self) -> None:
        self.subnet = ""
        self.test_address = ""
        self.hosts: dict[str, Host] = {}
        self._switch: Host | None = None
        self.test_link = ""  # the test's end of its veth to the bridge
        self._blackholes: set[tuple[str, str]] = set()  # (host name, address) dropped

    def start(self) -> None:
        self.subnet = _free_subnet()
        self.test_address = f"{self.subnet}.{TEST_HOST_OCTET}"
        self._switch = Host("switch", "", _holder())
        try:
            self._switch.ip("link", "add", "br0", "type", "bridge")
            self._switch.ip("link", "set", "br0", "up")
            # The test's end of its link: removed by the kernel with its peer's namespace.
            outside = self.test_link = f"qh{secrets.token_hex(4)}"
            _run(
                ["ip", "link", "add", outside, "type", "veth", "peer", "name", "up0"]
                + ["netns", str(self._switch.holder.pid)]
            )
            self._switch.ip("link", "set", "up0", "master", "br0", "up")
            _run(["ip", "addr", "add", f"{self.test_address}/24", "dev", outside])
            _run(["ip", "link", "set", outside, "up"])
        except BaseException:
            self.close()
            raise

    def add_host(self, name: str) -> Host:
        assert self._switch is not None, "start() first"
        host = Host(name, f"{self.subnet}.{len(self.hosts) + 1}", _holder())
        self.hosts[name] = host
        port = f"p{len(self.hosts)}"
        self._switch.ip(
            "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns",
            str(host.holder.pid),
        )  # fmt: skip
        self._switch.ip("link", "set", port, "master", "br0", "up")
        host.ip("addr", "add", f"{host.address}/24", "dev", "eth0")
        host.ip("link", "set", "eth0", "up")
        host.ip("link", "set", "lo", "up")
        return host

    # -- partitions ---------------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        """No packet between hosts `a` and `b`, either way (until `heal`)."""
        self._drop(a, self.hosts[b].address)
        self._drop(b, self.hosts[a].address)

    def cut_test(self, name: str) -> None:
        """No packet from host `name` to the test (until `heal`): the test's own namespace
        is left as it is, and a connection whose answers never come is as cut."""
        self._drop(name, self.test_address)

    def isolate(self, name: str) -> None:
        """No packet between host `name` and any other host or the test (until `heal`)."""
        for other in self.hosts:
            if other != name:
                self.cut(name, other)
        self.cut_test(name)

    def heal(self) -> None:
        for name, address in sorted(self._blackholes):
            self.hosts[name].ip("route", "del", "blackhole", f"{address}/32")
        self._blackholes.clear()

    def _drop(self, name: str, address: str) -> None:
        if (name, address) not in self._blackholes:
            self.hosts[name].ip("route", "add", "blackhole", f"{address}/32")
            self._blackholes.add((name, address))

    def close(self) -> None:
        """End every holder: the kernel removes the namespaces, the bridge and the veths
        once the processes run in them have ended too. Waits until the test's end of the
        link is gone (the kernel removes namespaces in the background)."""
        for host in [*self.hosts.values(), *([self._switch] if self._switch else [])]:
            host.holder.stop(timeout_s=5)
        self.hosts.clear()
        self._switch = None
        self._blackholes.clear()
        deadline = time.monotonic() + 30
        while self.test_link and Path(f"/sys/class/net/{self.test_link}").exists():
            if time.monotonic() > deadline:
                raise HostsError(f"the veth {self.test_link} was not removed within 30 s")
            time.sleep(0.05)
        self.test_link = ""


def _free_subnet() -> str:
    """A 10.213.N (/24) that no route of this machine's covers yet."""
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True)
    taken = routes.stdout.decode()
    for _ in range(64):
        subnet = f"{SUBNET_PREFIX}.{secrets.randbelow(256)}"
        if f"{subnet}." not in taken:
            return subnet
    raise HostsError(f"no free /24 in {SUBNET_PREFIX}.0.0/16")


def start_nats_hosts(hosts: list[Host], directory: Path, logs: Path) -> list[ManagedProcess]:
    """A nats-server on each host, clustered over their addresses (routes on ROUTE_PORT),
    JetStream on, pinging its routes and clients every NATS_PING_INTERVAL; each waited for
    on its client port. JetStream is ready some seconds later (a meta leader is elected)."""
    routes = ", ".join(f'"nats-route://{h.address}:{ROUTE_PORT}"' for h in hosts)
    servers: list[ManagedProcess] = []
    try:
        for host in hosts:
            node_dir = directory / host.name
            node_dir.mkdir(parents=True, exist_ok=True)
            config = node_dir / "nats.conf"
            write_private(
                config,
                f'server_name: "{host.name}"\n'
                f'listen: "{host.address}:{NATS_PORT}"\n'
                f"max_payload: {NATS_MAX_PAYLOAD}\n"
                f'ping_interval: "{NATS_PING_INTERVAL}"\n'
                f"ping_max: {NATS_PING_MAX}\n"
                f'http: "{host.address}:{MONITOR_PORT}"\n'
                f'jetstream {{\n  store_dir: "{node_dir / "jetstream"}"\n}}\n'
                f'cluster {{\n  name: "quire-hosts"\n  listen: "{host.address}:{ROUTE_PORT}"\n'
                f"  routes: [{routes}]\n}}\n",
            )
            command = host.command([str(nats_server_binary()), "-c", str(config)])
            servers.append(launch(host.name, "nats", command, os.environ.copy(), logs))
            servers[-1].url = f"nats://{host.address}:{NATS_PORT}"
        for host, server in zip(hosts, servers, strict=True):
            wait_listening(host.address, NATS_PORT, server)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def launch(
    name: str, kind: str, command: list[str], env: dict[str, str], logs: Path
) -> ManagedProcess:
    """`command` started with its output in `logs/<name>.log`, ended with its parent."""
    log_path = logs / f"{name}.log"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            **ended_with_parent(command),
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return ManagedProcess(name, kind, proc, log_path=log_path)


def wait_listening(address: str, port: int, managed: ManagedProcess) -> None:
    try:
        wait_for_port(address, port, 60, managed.proc, what=managed.name)
    except InfraError as exc:
        raise HostsError(f"{exc}; see {managed.log_path}") from None


# -- the cluster ------------------------------------------------------------------------


@dataclass
class HostsLayout:
    # bookie id -> its network location ("/zone/rack"), one host each
    bookies: dict[str, str] = field(
        default_factory=lambda: {
            "bookie-1": "/zone-a/rack-1",
            "bookie-2": "/zone-a/rack-1",
            "bookie-3": "/zone-a/rack-2",
            "bookie-4": "/zone-a/rack-2",
            "bookie-5": "/zone-a/rack-3",
        }
    )
    gateways: int = 2
    nats_nodes: int = 3
    # A bookie as one co-hosted process (`bookie-N`, `python -m services.bookie`) or as
    # two (`bookie-N.journal`, `bookie-N.ledgerstore`): QuireSettings.bookie_process.
    bookie_process: Literal["separate", "cohosted"] = "cohosted"


class HostsCluster:
    """A Quire cluster over `Network` hosts (see the module's doc) with its data and logs
    under `directory`; `extra_env` goes to every service process."""

    def __init__(
        self,
        directory: Path,
        layout: HostsLayout | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.directory = directory.resolve()
        self.layout = layout or HostsLayout()
        self.extra_env = dict(extra_env or {})
        self.network = Network()
        self.nats: list[ManagedProcess] = []
        self.postgres: ManagedProcess | None = None
        self.services: list[ManagedProcess] = []
        self.database_url = ""

    # -- names and addresses ------------------------------------------------------------

    @property
    def nats_hosts(self) -> list[str]:
        return [f"nats-{i}" for i in range(1, self.layout.nats_nodes + 1)]

    @property
    def gateway_hosts(self) -> list[str]:
        return [f"gateway-{i}" for i in range(1, self.layout.gateways + 1)]

    def address(self, host: str) -> str:
        return self.network.hosts[host].address

    @property
    def nats_url(self) -> str:
        """Every NATS server, for a client in the test's own namespace."""
        return ",".join(f"nats://{self.address(h)}:{NATS_PORT}" for h in self.nats_hosts)

    def nats_connections(self, host: str) -> dict[str, int]:
        """How many client connections from `host` each NATS server has (its /connz)."""
        counts = {}
        with httpx.Client(timeout=5.0) as client:
            for name in self.nats_hosts:
                url = f"http://{self.address(name)}:{MONITOR_PORT}/connz"
                connz = client.get(url, params={"limit": 10_000}).json()
                address = self.address(host)
                counts[name] = sum(1 for c in connz.get("connections", []) if c["ip"] == address)
        return counts

    def nats_url_for(self, index: int) -> str:
        """Every NATS server, the `index`-th host's turn first (its nearest)."""
        urls = [f"nats://{self.address(h)}:{NATS_PORT}" for h in self.nats_hosts]
        first = index % len(urls)
        return ",".join(urls[first:] + urls[:first])

    def http_url(self, gateway: int = 0) -> str:
        return f"http://{self.address(self.gateway_hosts[gateway])}:{HTTP_PORT}"

    def grpc_address(self, gateway: int = 0) -> str:
        return f"{self.address(self.gateway_hosts[gateway])}:{GRPC_PORT}"

    # -- start and stop -----------------------------------------------------------------

    def start(self) -> None:
        (self.directory / "logs").mkdir(parents=True, exist_ok=True)
        try:
            self.network.start()
            for name in [*self.nats_hosts, "meta", *self.layout.bookies, *self.gateway_hosts]:
                self.network.add_host(name)
            self._start_nats()
            self._start_postgres()
            self._start_services()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _start_nats(self) -> None:
        self.nats = start_nats_hosts(
            [self.network.hosts[name] for name in self.nats_hosts],
            self.directory,
            self.directory / "logs",
        )

    def _start_postgres(self) -> None:
        """PostgreSQL in the meta host: started there by an agent process of ours
        (`python -m quire.hosts postgres`), which stops it when it is stopped."""
        password = secrets.token_urlsafe(24)
        pg_dir = self.directory / "meta" / "postgres"
        pg_dir.mkdir(parents=True, exist_ok=True)
        env = os.environ | {"QUIRE_HOSTS_POSTGRES_PASSWORD": password}
        command = self.network.hosts["meta"].command(
            [sys.executable, "-m", "quire.hosts", "postgres", str(pg_dir), self.address("meta")]
        )
        self.postgres = launch("postgres", "postgres", command, env, self.directory / "logs")
        wait_listening(self.address("meta"), POSTGRES_PORT, self.postgres)
        log_path = self.postgres.log_path
        assert log_path is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while POSTGRES_AGENT_READY not in log_path.read_text(errors="replace"):
            self._check_alive(self.postgres)
            if time.monotonic() > deadline:
                raise HostsError(f"PostgreSQL not ready; see {log_path}")
            time.sleep(0.1)
        self.database_url = (
            f"postgresql+psycopg://quire:{password}@{self.address('meta')}:{POSTGRES_PORT}/quire"
        )

    def _start_services(self) -> None:
        self._wait_jetstream()
        spawn = self._spawn_service
        spawn("metadata", "metadata", "meta", 0)
        for i, (bookie_id, location) in enumerate(self.layout.bookies.items()):
            (self.directory / bookie_id).mkdir(exist_ok=True)
            env = {"QUIRE_BOOKIE_ID": bookie_id, "QUIRE_BOOKIE_LOCATION": location}
            if self.layout.bookie_process == "cohosted":
                spawn(bookie_id, "bookie", bookie_id, i + 1, env)
            else:
                spawn(f"{bookie_id}.journal", "journal", bookie_id, i + 1, env)
                spawn(f"{bookie_id}.ledgerstore", "ledgerstore", bookie_id, i + 1, env)
        spawn("auditor", "auditor", "meta", 0)
        spawn("replicator", "replicator", "meta", 0)
        for i, host in enumerate(self.gateway_hosts):
            address = self.address(host)
            env = {
                "QUIRE_GATEWAY__HTTP_HOST": address,
                "QUIRE_GATEWAY__HTTP_PORT": str(HTTP_PORT),
                "QUIRE_GATEWAY__GRPC_PORT": str(GRPC_PORT),
                "QUIRE_GATEWAY__ADVERTISED_HTTP_URL": f"http://{address}:{HTTP_PORT}",
                "QUIRE_GATEWAY__ADVERTISED_GRPC": f"{address}:{GRPC_PORT}",
            }
            spawn(host, "gateway", host, i, env)

    def _wait_jetstream(self) -> None:
        """Until the NATS cluster elected its JetStream meta leader: a service's first
        step is to create the event stream, which needs it."""
        probe = [
            sys.executable,
            "-c",
            "import asyncio, sys, nats\n"
            "async def main():\n"
            "    nc = await nats.connect(servers=sys.argv[1].split(','), connect_timeout=2)\n"
            "    try:\n"
            "        await nc.jetstream().account_info()\n"
            "    finally:\n"
            "        await nc.close()\n"
            "asyncio.run(main())\n",
            self.nats_url,
        ]
        deadline = time.monotonic() + READY_TIMEOUT_S
        while subprocess.run(probe, capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise HostsError("the NATS cluster's JetStream was not ready in time")
            time.sleep(0.5)

    def _spawn_service(
        self, name: str, kind: str, host: str, index: int, env: dict[str, str] | None = None
    ) -> None:
        full_env = os.environ | {
            "QUIRE_NATS_URL": self.nats_url_for(index),
            "QUIRE_DATABASE_URL": self.database_url,
            "QUIRE_DATA_DIR": str(self.directory),
            "QUIRE_EVENT_STREAM_REPLICAS": str(min(3, self.layout.nats_nodes)),
            "QUIRE_GATEWAY__READY_MIN_WRITABLE_BOOKIES": str(min(3, len(self.layout.bookies))),
            **self.extra_env,
            **(env or {}),
        }
        command = self.network.hosts[host].command([sys.executable, "-m", f"services.{kind}"])
        self.services.append(launch(name, kind, command, full_env, self.directory / "logs"))

    @staticmethod
    def _check_alive(managed: ManagedProcess) -> None:
        if not managed.alive():
            raise HostsError(
                f"{managed.name} exited ({managed.proc.returncode}); see {managed.log_path}"
            )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        with httpx.Client(timeout=2.0) as client:
            for i in range(len(self.gateway_hosts)):
                while True:
                    for managed in self.services:
                        self._check_alive(managed)
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(f"{self.http_url(i)}/readyz").status_code == 200:
                            break
                    if time.monotonic() > deadline:
                        raise HostsError(
                            f"{self.gateway_hosts[i]} not ready within {READY_TIMEOUT_S:.0f} s;"
                            f" see the logs in {self.directory / 'logs'}"
                        )
                    time.sleep(0.2)

    def exited(self) -> list[str]:
        """The processes that are no longer running (none should be)."""
        everything = [*self.nats, *([self.postgres] if self.postgres else []), *self.services]
        return [f"{m.name} ({m.proc.returncode})" for m in everything if not m.alive()]

    def stop(self) -> None:
        """Gateways first, NATS and the namespaces last."""
        for managed in reversed(self.services):
            managed.stop()
        if self.postgres is not None:
            self.postgres.stop()
        for server in self.nats:
            server.stop()
        self.network.close()


# -- PostgreSQL's agent in the meta host ------------------------------------------------


def _postgres_agent(directory: Path, host: str) -> None:
    """Run PostgreSQL on `host` (an address of this namespace) until SIGTERM or SIGINT."""
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    password = os.environ["QUIRE_HOSTS_POSTGRES_PASSWORD"]
    hba = directory / "data" / "pg_hba.conf"
    if not hba.exists():
        # The cluster made on loopback (start_postgres trusts nothing else), then opened
        # to the hosts' subnet with the same password authentication.
        start_postgres(directory, host="127.0.0.1", password=password).stop()
        subnet = host.rsplit(".", 1)[0]
        with hba.open("a") as f:
            f.write(f"host all all {subnet}.0/24 scram-sha-256\n")
    managed = start_postgres(directory, port=POSTGRES_PORT, host=host, password=password)
    print(POSTGRES_AGENT_READY, flush=True)
    try:
        while not stopping.wait(1.0):
            if not managed.alive():
                raise SystemExit(f"postgres exited ({managed.proc.returncode})")
    finally:
        managed.stop()


if __name__ == "__main__":
    if sys.argv[1:2] != ["postgres"] or len(sys.argv) != 4:
        raise SystemExit("usage: python -m quire.hosts postgres DIR ADDRESS")
    _postgres_agent(Path(sys.argv[2]), sys.argv[3])
