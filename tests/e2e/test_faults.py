"""The fault suite's short tier, as `make faults` runs it: real clusters under the nemesis, the
workload's history and the final read-back judged by the checker (docs/reliability.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from quire.faults.checker import FATAL
from quire.faults.run import TIERS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

OPERATIONS = ("attempted", "acked", "failed", "indeterminate")


@pytest.mark.timeout(900)
def test_short_tier() -> None:
    # Outside the session's temp tree: a failed run's logs and data stay for its diagnosis
    # (the failure names the directory); a passed one is removed.
    parent = Path(tempfile.mkdtemp(prefix="quire-faults-"))
    parent.chmod(0o711)  # PostgreSQL runs as another user when we are root
    out = parent / "out"
    done = subprocess.run(
        [sys.executable, "-m", "quire.faults", "--tier", "short", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=840,
    )
    report = f"runs kept in {out}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr[-5000:]}"
    assert (out / "summary.json").exists(), report
    summary = json.loads((out / "summary.json").read_text())
    assert done.returncode == (0 if summary["passed"] else 1), report
    assert "fault suite PASSED" in done.stdout, report

    scenarios = {s.name: s for s in TIERS["short"]}
    assert set(summary["scenarios"]) == set(scenarios)
    # Both ways of running a bookie are proven: co-hosted (quire up's default) and separate.
    assert {run["bookie_process"] for run in summary["runs"]} == {"cohosted", "separate"}
    for run in summary["runs"]:
        assert "error" not in run, f"{run.get('error')}; {report}"
        check = run["check"]
        if run["control"]:
            # The control run (fsync off, every bookie losing power at once) must lose
            # acknowledged entries: proof that the checker sees a loss.
            assert check["lost"] > 0, run["run_dir"]
        else:
            assert {rule: check[rule] for rule in FATAL} == dict.fromkeys(FATAL, 0), check[
                "examples"
            ]
        # Each kind the scenario schedules was injected at least once.
        kinds = set(scenarios[run["scenario"]].schedule.weights)
        assert kinds <= {kind for kind, n in run["faults"].items() if n > 0}, run["faults"]
        assert check["operations"]["append"]["ok"] > 0  # the workload did work

    for name, row in [*summary["scenarios"].items(), ("total", summary["total"])]:
        ops, entries = row["operations"], row["entries"]
        assert ops["acked"] + ops["failed"] + ops["indeterminate"] == ops["attempted"], name
        assert entries["acked"] <= entries["attempted"], name
    # The total is the normal runs' (the control's losses are deliberate).
    total = summary["total"]
    normal = [row for row in summary["scenarios"].values() if not row["control"]]
    assert total["runs"] == sum(row["runs"] for row in normal)
    for key in OPERATIONS:
        assert total["operations"][key] == sum(row["operations"][key] for row in normal)
    assert total["violations"] == dict.fromkeys(FATAL, 0)
    for run in summary["runs"]:
        assert (Path(run["run_dir"]) / "nemesis.jsonl").exists()
        assert (Path(run["run_dir"]) / "history.jsonl").exists()
        # The nemesis named processes: a co-hosted bookie as bookie-N, never by a half.
        faults = Path(run["run_dir"]) / "faults"
        bookies = sorted(d.name for d in faults.iterdir() if d.name.startswith("bookie-"))
        if run["bookie_process"] == "cohosted":
            assert bookies and all("." not in name for name in bookies), bookies
        else:
            assert bookies and all(n.endswith((".journal", ".ledgerstore")) for n in bookies)
    shutil.rmtree(parent)
