"""quire/hosts.py's network: hosts in network namespaces on one bridge reach each other and
the test; `cut` drops the packets between two hosts both ways, `isolate` between one host
and everyone, `heal` undoes both; `close` leaves nothing in the kernel. Needs root, as the
multi-host test does (CI runs as root)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.errors import NoRespondersError, TimeoutError
from nats.micro.request import Request

from quire.hosts import Host, Network, available, start_nats_hosts
from quire.infra import ManagedProcess, ended_with_parent
from shared.config import QuireSettings
from shared.service import ServiceRuntime
from tests.support.events import jetstream_ready
from tests.support.wait import until

PORT = 9000
SERVE = (
    "import socket, sys\n"
    "s = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
    "while True:\n"
    "    s.accept()[0].close()\n"
)
CONNECT = (
    "import socket, sys\n"
    "socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))\n"
)


@pytest.fixture
def network() -> Iterator[Network]:
    assert available() is None, available()
    net = Network()
    net.start()
    try:
        yield net
    finally:
        net.close()


def serve(host: Host) -> ManagedProcess:
    proc = subprocess.Popen(
        **ended_with_parent(host.command([sys.executable, "-c", SERVE, host.address, str(PORT)]))
    )
    return ManagedProcess("server", "test", proc)


def reaches(src: Host | None, dst: Host, timeout_s: float) -> bool:
    """Whether `src` (None: the test) connects to `dst`'s server within `timeout_s`."""
    args = [sys.executable, "-c", CONNECT, dst.address, str(PORT), str(timeout_s)]
    return subprocess.run(src.command(args) if src else args, capture_output=True).returncode == 0


def connected(src: Host | None, dst: Host) -> bool:
    """A connect that may take long (a loaded machine), for a link that is up; the server
    starts listening a moment after it was started: tried until it answers."""
    return any(reaches(src, dst, 5.0) for _ in range(50))


def refused(src: Host | None, dst: Host) -> bool:
    """Dropped packets never connect: a short timeout cannot pass by mistake."""
    return not reaches(src, dst, 1.0)


def test_cut_isolate_and_heal(network: Network) -> None:
    a, b, c = (network.add_host(name) for name in ("a", "b", "c"))
    servers = [serve(h) for h in (a, b, c)]
    try:
        assert connected(b, a) and connected(c, a) and connected(None, a) and connected(a, b)
        network.cut("a", "b")
        assert refused(b, a) and refused(a, b)
        assert connected(c, a) and connected(c, b) and connected(None, a)
        network.isolate("c")
        assert refused(a, c) and refused(c, b) and refused(None, c)
        assert connected(None, a)
        network.heal()
        assert connected(b, a) and connected(a, b) and connected(a, c) and connected(None, c)
    finally:
        for server in servers:
            server.stop()


def test_close_leaves_no_namespace_and_no_link() -> None:
    network = Network()
    network.start()
    host = network.add_host("a")
    holders = [host.holder.pid]
    outside = network.test_link
    assert Path(f"/sys/class/net/{outside}").exists()
    network.close()
    assert not Path(f"/sys/class/net/{outside}").exists()
    for pid in holders:
        assert not os.path.exists(f"/proc/{pid}")


async def test_a_service_whose_link_to_its_nats_server_breaks_moves_to_another(
    network: Network, tmp_path: Path
) -> None:
    """Not a stopped server (the connection ends at once) but a broken link: packets
    dropped, nothing closed. The service must see it by its pings and reconnect elsewhere."""
    hosts = [network.add_host(f"nats-{i}") for i in (1, 2, 3)]
    (tmp_path / "logs").mkdir()
    servers = start_nats_hosts(hosts, tmp_path, tmp_path / "logs")
    observer = None
    rt = None
    try:
        observer = await nats.connect(servers=[servers[2].url], allow_reconnect=False)
        await until(lambda: jetstream_ready(observer), "JetStream ready", timeout_s=60)
        settings = QuireSettings(nats_url=",".join(s.url for s in servers))
        rt = ServiceRuntime("test", settings, "test-1")
        await rt.start()

        async def echo(req: Request) -> None:
            await req.respond(b"ok:" + req.data)

        subject = f"{settings.subject_prefix}.test.echo"
        await rt.add_endpoint("echo", subject, echo)
        assert rt.nc.connected_url is not None
        assert rt.nc.connected_url.hostname == hosts[0].address  # the first named

        network.cut_test("nats-1")
        await until(
            lambda: rt.nc.is_connected and rt.nc.connected_url.hostname != hosts[0].address,
            "the service reconnected to another server",
            timeout_s=60,
        )

        async def answered() -> bool:
            try:
                return (await observer.request(subject, b"b", timeout=1)).data == b"ok:b"
            except (NoRespondersError, TimeoutError):
                return False

        await until(answered, "the service answering through another server")
    finally:
        if rt is not None:
            rt.stop()
            await rt.shutdown()
        if observer is not None:
            await observer.close()
        for server in servers:
            server.stop()
