"""`quire bookie gc...`: how the gateway's answers become rows, which ledgers gc-explain
looks up (each shown one once), and the arguments refused before the gateway is asked.
Against real bookies: tests/integration/test_gc_admin.py."""

from __future__ import annotations

from typer.testing import CliRunner

from quire.cli import app
from quire.commands.bookie_gc import (
    DELETED,
    explained,
    human_age,
    human_bytes,
    per_bookie,
    rows,
    shown_ledgers,
)

DOWN = {"error": {"code": "UNAVAILABLE", "detail": "gc to bookie-2: NoRespondersError"}}


def log(log_id: int, *pins: tuple[int, int]) -> dict:
    return {
        "dir": 0,
        "log_id": log_id,
        "size_bytes": 1000,
        "live_bytes": sum(b for _, b in pins),
        "usage": sum(b for _, b in pins) / 1000,
        "current": False,
        "ledgers": [{"ledger_id": lid, "bytes": b} for lid, b in pins],
        "next_minor": "keep",
        "next_major": "compact",
    }


def explain(*logs: dict) -> dict:
    return {
        "logs": list(logs),
        "minor_threshold": 0.2,
        "major_threshold": 0.8,
        "suspendMajor": False,
        "suspendMinor": False,
    }


def test_one_bookie_or_all_become_one_row_each_errors_included() -> None:
    assert per_bookie({"run": {}}, "bookie-1") == {"bookie-1": {"run": {}}}
    answers = {"bookie-2": DOWN, "bookie-1": {"run": {"ledgers_deleted": 3}}}
    assert per_bookie(answers, None) == answers
    assert rows(answers, lambda a: a["run"]) == [
        {"bookie_id": "bookie-1", "ledgers_deleted": 3},
        {"bookie_id": "bookie-2", "error": "UNAVAILABLE: gc to bookie-2: NoRespondersError"},
    ]


def test_gc_explain_looks_up_each_shown_ledger_once() -> None:
    answers = {
        "bookie-1": explain(log(1, (10, 500), (11, 200), (12, 5)), log(2, (11, 300))),
        "bookie-2": explain(log(1, (10, 400), (13, 100))),
        "bookie-3": DOWN,
    }
    assert shown_ledgers(answers, max_ledgers=2) == [10, 11, 13]  # 12: not shown
    assert shown_ledgers(answers, max_ledgers=0) == []


def test_gc_explain_adds_state_and_age_and_counts_what_it_left_out() -> None:
    answers = {
        "bookie-1": explain(log(1, (10, 500), (11, 200), (12, 5))),
        "bookie-2": DOWN,
    }
    metadata = {
        10: {"state": "CLOSED", "ctime": 1_000},
        11: {"state": DELETED, "ctime": None},
    }
    found = explained(answers, metadata, max_ledgers=2, now_ms=3_601_000)
    assert found["bookie-2"] == DOWN
    (shown,) = found["bookie-1"]["logs"]
    assert shown["ledgers"] == [
        {"ledger_id": 10, "bytes": 500, "state": "CLOSED", "ctime": 1_000, "age_s": 3_600},
        {"ledger_id": 11, "bytes": 200, "state": DELETED, "ctime": None, "age_s": None},
    ]
    assert shown["ledgers_not_shown"] == 1
    assert found["bookie-1"]["minor_threshold"] == 0.2


def test_sizes_and_ages_for_people() -> None:
    assert [human_bytes(n) for n in (0, 1023, 1024, 5 * 1024**2, 3 * 1024**4)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "5.0 MiB",
        "3072.0 GiB",
    ]
    assert [human_age(s) for s in (None, 59, 60, 7_200, 3 * 86_400)] == [
        "-",
        "59s",
        "1m",
        "2h",
        "3d",
    ]


def test_suspend_and_resume_need_a_kind_and_ask_nothing_without_one() -> None:
    for command in ("gc-suspend", "gc-resume"):
        # The gateway named does not exist: only an argument error can be the answer.
        done = CliRunner().invoke(app, ["bookie", command, "--gateway", "http://127.0.0.1:9"])
        assert done.exit_code == 2
        assert "--major, --minor or both" in done.stderr


def test_every_gc_command_has_help() -> None:
    for command in ("gc", "gc-details", "gc-explain", "gc-suspend", "gc-resume"):
        done = CliRunner().invoke(app, ["bookie", command, "--help"])
        assert done.exit_code == 0 and "--bookie" in done.stdout
