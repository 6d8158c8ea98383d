"""The `quire` command line, run as a user runs it, against a cluster from `quire up`."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from shared.models import PRIVATE_LEDGER_FIELDS
from tests.support.cluster import QuireUp, quire_executable

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(cluster_dir) -> Iterator[QuireUp]:
    parent = cluster_dir("cli")
    # Two bookies labelled, the third at the default location: three racks, so rackaware
    # placement changes nothing for the 3-bookie ledgers of the other tests.
    locations = ["bookie-1=/zone-a/rack-1", "bookie-2=/zone-a/rack-2"]
    args = ["--placement-policy", "rackaware"]
    for location in locations:
        args += ["--bookie-location", location]
    up = QuireUp(parent / "quire-data", bookies=3, args=args)
    with up.running():
        yield up


def quire(
    cluster: QuireUp,
    *args: str,
    stdin: bytes | None = None,
    via: str = "data-dir",
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run `quire ARGS`; the gateway found from cluster.json (as a user in the repo would)
    or from --gateway or QUIRE_GATEWAY."""
    env = {k: v for k, v in os.environ.items() if k != "QUIRE_GATEWAY"}
    extra: list[str] = []
    if via == "data-dir":
        extra = ["--data-dir", str(cluster.data_dir)]
    elif via == "flag":
        extra = ["--gateway", cluster.url]
    else:
        env["QUIRE_GATEWAY"] = cluster.url
    done = subprocess.run(
        [quire_executable(), *args, *extra], input=stdin, capture_output=True, env=env, timeout=120
    )
    if check:
        assert done.returncode == 0, done.stderr.decode()
    return done


def as_json(done: subprocess.CompletedProcess):
    return json.loads(done.stdout)


@pytest.mark.parametrize("via", ["data-dir", "flag", "env"])
def test_ledger_lifecycle(cluster: QuireUp, via: str) -> None:
    created = as_json(
        quire(
            cluster,
            "ledger",
            "create",
            "--ensemble",
            "3",
            "--write-quorum",
            "3",
            "--ack-quorum",
            "2",
            "--password",
            "pw",
            "--metadata",
            "team=ops",
            "-o",
            "json",
            via=via,
        )
    )
    lid = str(created["ledger_id"])
    assert created["state"] == "OPEN" and created["metadata"]["team"] == "ops"
    assert created["metadata"]["quire.writer.http"] == cluster.url
    appended = as_json(
        quire(cluster, "ledger", "append", lid, "one", "two", "-p", "pw", "-o", "json", via=via)
    )
    assert (appended["first_entry_id"], appended["last_entry_id"]) == (0, 1)
    quire(cluster, "ledger", "append", lid, "--lines", "-p", "pw", stdin=b"three\nfour\n", via=via)
    closed = as_json(quire(cluster, "ledger", "close", lid, "-p", "pw", "-o", "json", via=via))
    assert closed["last_entry_id"] == 3
    read = as_json(quire(cluster, "ledger", "read", lid, "-p", "pw", "-o", "json", via=via))
    assert [base64.b64decode(e["data"]) for e in read] == [b"one", b"two", b"three", b"four"]
    table = quire(cluster, "ledger", "read", lid, "-p", "pw", via=via).stdout.decode()
    assert "three" in table and "entry_id" in table
    got = as_json(quire(cluster, "ledger", "get", lid, "-o", "json", via=via))
    assert got["state"] == "CLOSED" and "password" not in json.dumps(got)
    tail = quire(cluster, "ledger", "tail", lid, "-p", "pw", "-o", "json", via=via)
    assert [json.loads(line)["entry_id"] for line in tail.stdout.splitlines()] == [0, 1, 2, 3]
    listed = as_json(quire(cluster, "ledger", "list", "-o", "json", via=via))
    assert int(lid) in [row["ledger_id"] for row in listed]
    quire(cluster, "ledger", "delete", lid, "-p", "pw", via=via)
    gone = quire(cluster, "ledger", "get", lid, via=via, check=False)
    assert gone.returncode == 1 and b"NO_SUCH_LEDGER" in gone.stderr


def test_errors_are_clear_and_exit_non_zero(cluster: QuireUp) -> None:
    created = as_json(quire(cluster, "ledger", "create", "-p", "pw", "-o", "json"))
    lid = str(created["ledger_id"])
    wrong = quire(cluster, "ledger", "append", lid, "x", "-p", "nope", check=False)
    assert wrong.returncode == 1 and b"UNAUTHORIZED" in wrong.stderr
    too_many = quire(cluster, "ledger", "create", "--ensemble", "5", "-p", "x", check=False)
    assert too_many.returncode == 1 and b"NOT_ENOUGH_BOOKIES" in too_many.stderr
    bad = quire(cluster, "ledger", "create", "--metadata", "novalue", "-p", "x", check=False)
    assert bad.returncode == 1 and b"key=value" in bad.stderr
    nowhere = subprocess.run(
        [quire_executable(), "ledger", "list", "--data-dir", "/nonexistent"],
        capture_output=True,
        env={**os.environ, "QUIRE_GATEWAY": ""},
    )
    assert nowhere.returncode == 1 and b"no gateway" in nowhere.stderr


def test_bookie_commands(cluster: QuireUp) -> None:
    bookies = as_json(quire(cluster, "bookie", "list", "-o", "json"))
    assert {b["bookie_id"]: b["location"] for b in bookies} == {
        "bookie-1": "/zone-a/rack-1",
        "bookie-2": "/zone-a/rack-2",
        "bookie-3": "/default-zone/default-rack",
    }
    assert b"/zone-a/rack-1" in quire(cluster, "bookie", "list").stdout  # the table's column
    recorded = json.loads((cluster.data_dir / "cluster.json").read_text())
    assert recorded["placement_policy"] == "rackaware"
    journals = {
        s["bookie_id"]: s["location"] for s in recorded["services"] if s["kind"] == "journal"
    }
    assert journals == {b["bookie_id"]: b["location"] for b in bookies}
    state = as_json(quire(cluster, "bookie", "state", "bookie-2", "-o", "json"))
    assert state == {"bookie_id": "bookie-2", "state": "writable"}
    missing = quire(cluster, "bookie", "state", "bookie-9", check=False)
    assert missing.returncode == 1 and b"no bookie bookie-9" in missing.stderr


def test_shell_classic_commands(cluster: QuireUp) -> None:
    result = as_json(
        quire(
            cluster,
            "shell",
            "simpletest",
            "-e",
            "3",
            "-w",
            "2",
            "-a",
            "2",
            "-n",
            "250",
            "-o",
            "json",
        )
    )
    assert result["result"] == "OK" and result["entries"] == 250
    created = as_json(quire(cluster, "ledger", "create", "-p", "pw", "-o", "json"))
    lid = str(created["ledger_id"])
    quire(cluster, "ledger", "append", lid, "a", "b", "c", "-p", "pw")
    listed = as_json(quire(cluster, "shell", "listledgers", "-o", "json"))
    assert {"ledger_id": int(lid)} in listed
    meta = as_json(quire(cluster, "shell", "ledgermetadata", "--ledgerid", lid, "-o", "json"))
    assert meta["ledger_id"] == int(lid)
    assert not PRIVATE_LEDGER_FIELDS & set(meta)  # no password material, no ledger keys
    # The gateway holds the writer, so its LAC is the last acknowledged entry.
    entries = as_json(quire(cluster, "shell", "readledger", "-l", lid, "-p", "pw", "-o", "json"))
    assert [base64.b64decode(e["data"]) for e in entries] == [b"a", b"b", b"c"]
    rw = as_json(quire(cluster, "shell", "listbookies", "-rw", "-o", "json"))
    assert len(rw) == 3
    assert as_json(quire(cluster, "shell", "listbookies", "-ro", "-o", "json")) == []


def test_autorecovery_status_tells_the_switch_and_the_replicators(cluster: QuireUp) -> None:
    """The switch as stored; `quire up` runs a replicator, so ledgers are re-replicated
    while the switch is on, and not while it is off."""
    status = as_json(quire(cluster, "autorecovery", "status", "-o", "json"))
    assert set(status) == {
        "enabled",
        "replicators",
        "ledger_replication_active",
        "detail",
        "lost_bookie_recovery_delay_s",
    }
    assert status["replicators"] >= 1
    assert (status["enabled"], status["ledger_replication_active"]) == (True, True)
    try:
        off = as_json(quire(cluster, "autorecovery", "status", "--disable", "-o", "json"))
        assert (off["enabled"], off["ledger_replication_active"]) == (False, False)
    finally:
        on = as_json(quire(cluster, "autorecovery", "status", "--enable", "-o", "json"))
    assert (on["enabled"], on["ledger_replication_active"]) == (True, True)
    table = quire(cluster, "autorecovery", "status").stdout.decode()
    assert "ledger_replication_active" in table and "True" in table


def test_auditor_commands(cluster: QuireUp) -> None:
    """BookKeeper's auditor commands reach the elected auditor; a live bookie is not
    decommissioned. (bookie-9 was never registered: nothing of it to mark.)"""
    deadline = time.monotonic() + 30
    while as_json(quire(cluster, "shell", "whoisauditor", "-o", "json"))["auditor"] is None:
        assert time.monotonic() < deadline, "no auditor elected"
        time.sleep(0.2)
    audit = as_json(quire(cluster, "autorecovery", "trigger-audit", "-o", "json"))
    assert "ledgers_marked" in audit
    live = quire(cluster, "shell", "decommissionbookie", "-bookieid", "bookie-1", check=False)
    assert live.returncode == 1 and b"INVALID_ARGUMENT" in live.stderr
    gone = as_json(quire(cluster, "autorecovery", "decommission", "bookie-9", "-o", "json"))
    assert gone["ledgers_marked"] == 0
    recovered = as_json(quire(cluster, "shell", "recover", "bookie-9", "-d", "-o", "json"))
    assert recovered["ledgers_marked"] == 0
    listed = as_json(
        quire(cluster, "shell", "listunderreplicated", "-mr", "bookie-9", "-pmr", "-o", "json")
    )
    assert listed == []
