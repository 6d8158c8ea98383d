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

import pytest

from quire.hosts import Host, Network, available
from quire.infra import ManagedProcess, ended_with_parent

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
