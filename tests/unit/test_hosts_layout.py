"""quire/hosts.py's layout of a cluster's services over its hosts (no namespaces made here:
the spawning is recorded; tests/e2e/test_multihost.py runs the real thing as root)."""

from __future__ import annotations

from pathlib import Path

from quire.hosts import HostsCluster, HostsLayout


def services_of(tmp_path: Path, layout: HostsLayout) -> list[tuple[str, str, str]]:
    """(process name, services.<kind>, host) of each service process, in start order."""
    cluster = HostsCluster(tmp_path, layout)
    spawned: list[tuple[str, str, str]] = []
    cluster._wait_jetstream = lambda: None  # type: ignore[method-assign]
    cluster.address = lambda host: "10.0.0.1"  # type: ignore[method-assign]
    cluster._spawn_service = (  # type: ignore[method-assign]
        lambda name, kind, host, index, env=None: spawned.append((name, kind, host))
    )
    cluster._start_services()
    return spawned


def test_a_bookie_is_one_cohosted_process_on_its_host_by_default(tmp_path: Path) -> None:
    layout = HostsLayout(bookies={"bookie-1": "/z/r1", "bookie-2": "/z/r2"})
    bookies = [s for s in services_of(tmp_path, layout) if s[2].startswith("bookie-")]
    assert bookies == [("bookie-1", "bookie", "bookie-1"), ("bookie-2", "bookie", "bookie-2")]


def test_a_bookie_may_run_as_its_journal_and_its_ledgerstore(tmp_path: Path) -> None:
    layout = HostsLayout(bookies={"bookie-1": "/z/r1"}, bookie_process="separate")
    bookies = [s for s in services_of(tmp_path, layout) if s[2] == "bookie-1"]
    assert bookies == [
        ("bookie-1.journal", "journal", "bookie-1"),
        ("bookie-1.ledgerstore", "ledgerstore", "bookie-1"),
    ]
