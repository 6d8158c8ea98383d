"""The fault runner's summary: per scenario and in total, and its verdict (a normal run
must have no violation, a control run must lose acknowledged entries)."""

from __future__ import annotations

import dataclasses
import io

from quire.faults.checker import CheckResult
from quire.faults.run import print_summary, summarise


def run(scenario: str, control: bool = False, **violations: int) -> dict:
    check = CheckResult(
        operations={
            "append": {"attempted": 10, "ok": 7, "fail": 1, "info": 2},
            "read": {"attempted": 5, "ok": 5, "fail": 0, "info": 0},
        },
        entries={"attempted": 30, "ok": 21, "fail": 3, "info": 6},
        recovery_ms=[120.0, 80.0],
        **violations,
    )
    return {
        "scenario": scenario,
        "seed": 1,
        "control": control,
        "faults": {"kill": 2, "pause": 1},
        "repair_s": 1.5,
        "check": dataclasses.asdict(check),
        "ok": check.ok,
    }


def test_totals_and_a_passing_tier() -> None:
    summary = summarise("short", [run("processes"), run("processes"), run("c", True, lost=4)])
    row = summary["scenarios"]["processes"]
    assert row["runs"] == 2 and row["failed_runs"] == 0
    assert row["faults"] == {"kill": 4, "pause": 2}
    assert row["operations"] == {"attempted": 30, "acked": 24, "failed": 2, "indeterminate": 4}
    assert row["entries"]["acked"] == 42
    assert row["recovery_s"] == [0.12, 0.08, 0.12, 0.08]
    # The control's deliberate losses stay in its row, out of the total.
    assert summary["scenarios"]["c"]["violations"]["lost"] == 4
    assert summary["total"]["violations"]["lost"] == 0 and summary["total"]["runs"] == 2
    assert summary["passed"]
    out = io.StringIO()
    print_summary(summary, out)
    assert "c (control: fsync off): runs 1, failed 0" in out.getvalue()
    assert out.getvalue().rstrip().endswith("fault suite PASSED")


def test_a_run_not_repaired_in_time_is_counted() -> None:
    summary = summarise("short", [run("p"), {**run("p"), "repair_s": None}])
    assert summary["scenarios"]["p"]["repair_s"] == [1.5]
    assert summary["scenarios"]["p"]["unrepaired_runs"] == 1
    out = io.StringIO()
    print_summary(summary, out)
    assert "(not repaired in time: 1 runs)" in out.getvalue()


def test_a_violation_an_error_or_a_control_without_loss_fails() -> None:
    assert not summarise("short", [run("p", duplicates=1)])["passed"]
    assert not summarise("short", [run("c", True)])["passed"]
    assert not summarise("short", [{**run("p"), "ok": False, "error": "NemesisError: x"}])["passed"]
