"""Quire beyond one machine, on this one: every NATS server, bookie and gateway in a network
namespace of its own (quire/hosts.py), NATS a real 3-node cluster, placement rack-aware over
bookies in three racks; the fault suite's workload on both gateways while one NATS server is
cut from the other two, then one bookie host from everything, then one gateway host from its
nearest NATS server (it must reconnect to another); after the heal the repair,
the final phase and the checker: nothing lost, no violation, every write set of every
ledger's segments in at least two racks (docs/reliability.md, "Multi-host run")."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from quire.faults.checker import FATAL
from quire.hosts import available

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_multihost_run_under_partitions() -> None:
    assert available() is None, available()
    # Outside the session's temp tree: a failed run's logs and data stay for its diagnosis
    # (the failure names the directory); a passed one is removed.
    parent = Path(tempfile.mkdtemp(prefix="quire-multihost-"))
    parent.chmod(0o711)  # PostgreSQL runs as another user when we are root
    out = parent / "out"
    done = subprocess.run(
        [sys.executable, "-m", "quire.faults.multihost", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    report = f"run kept in {out}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr[-5000:]}"
    assert (out / "run.json").exists(), report
    run = json.loads((out / "run.json").read_text())
    assert "error" not in run, f"{run.get('error')}; {report}"
    check = run["check"]
    assert {rule: check[rule] for rule in FATAL} == dict.fromkeys(FATAL, 0), check["examples"]
    after = run["check_after_repair"]  # read back again once the repair finished
    assert {rule: after[rule] for rule in FATAL} == dict.fromkeys(FATAL, 0), after["examples"]
    assert check["operations"]["append"]["ok"] > 0  # the workload did work
    # Ledgers are created on one gateway and written through the other: redirects followed.
    assert run["writer_redirects"] > 0
    assert [f["kind"] for f in run["faults"]] == ["nats-minority", "host-isolated", "nats-link"]
    # The gateway cut from its nearest NATS server moved to the others.
    assert run["faults"][2]["moved_s"] is not None, run["faults"]
    assert run["placement_violations"] == []
    assert run["exited"] == []
    assert run["event_stream_replicas"] == 3
    assert run["repair_s"] is not None, report  # nothing left under-replicated
    assert done.returncode == 0 and "PASSED" in done.stdout, report
    shutil.rmtree(parent, ignore_errors=True)
