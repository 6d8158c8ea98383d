"""The journal service's pure core: group-commit planning and the disk-usage rule."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from services.journal.core import (
    FlushPlan,
    GroupCommitPolicy,
    batch_length,
    plan_group_commit,
)
from shared.bookie.rules import disk_read_only

# -- group commit -------------------------------------------------------------------------

WAITING = GroupCommitPolicy(
    max_group_wait_ms=2.0,
    buffered_writes_threshold_bytes=1000,
    buffered_entries_threshold=10,
    flush_when_queue_empty=False,
)
EAGER = GroupCommitPolicy(2.0, 1000, 10, flush_when_queue_empty=True)


@pytest.mark.parametrize(
    ("policy", "records", "size", "oldest_ms", "now_ms", "expected"),
    [
        (WAITING, 0, 0, 0.0, 50.0, FlushPlan(False, None)),
        (EAGER, 0, 0, 0.0, 50.0, FlushPlan(False, None)),
        (EAGER, 1, 10, 100.0, 100.0, FlushPlan(True)),  # idle writer, nothing more to wait for
        (WAITING, 1, 10, 100.0, 100.0, FlushPlan(False, 2.0)),
        (WAITING, 1, 10, 100.0, 101.5, FlushPlan(False, 0.5)),
        (WAITING, 1, 10, 100.0, 102.0, FlushPlan(True)),  # waited max_group_wait_ms
        (WAITING, 3, 1000, 100.0, 100.0, FlushPlan(True)),  # byte threshold
        (WAITING, 10, 100, 100.0, 100.0, FlushPlan(True)),  # entry threshold
        (WAITING, 9, 999, 100.0, 101.0, FlushPlan(False, 1.0)),
    ],
)
def test_plan_group_commit(policy, records, size, oldest_ms, now_ms, expected) -> None:
    assert plan_group_commit(policy, records, size, oldest_ms, now_ms) == expected


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ([], 0),
        ([10], 1),
        ([10] * 5, 5),
        ([10] * 25, 10),  # entry threshold caps a batch
        ([400, 400, 400], 2),  # byte threshold caps a batch
        ([5000, 10], 1),  # an oversized record goes alone
        ([10, 5000], 1),
    ],
)
def test_batch_length(sizes: list[int], expected: int) -> None:
    assert batch_length(EAGER, sizes) == expected


FORBIDDEN = {"asyncio", "nats", "sqlalchemy", "time", "random", "os", "sqlite3", "aiofiles"}


@pytest.mark.parametrize(
    "path",
    [
        "services/journal/core.py",
        "services/ledgerstore/core.py",
        "shared/bookie/journal_format.py",
        "shared/bookie/entrylog_format.py",
        "shared/bookie/index_schema.py",
        "shared/bookie/rules.py",
    ],
)
def test_cores_are_pure(path: str) -> None:
    tree = ast.parse((Path(__file__).parents[2] / path).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN


@pytest.mark.parametrize(
    ("read_only", "usage", "expected"),
    [
        (False, 0.50, False),
        (False, 0.95, True),  # at diskUsageThreshold
        (False, 0.92, False),  # between the marks, writable stays writable
        (True, 0.92, True),  # ... and read-only stays read-only (no flapping)
        (True, 0.90, True),  # at the low-water mark
        (True, 0.89, False),  # below it: writable again
    ],
)
def test_disk_usage_thresholds(read_only: bool, usage: float, expected: bool) -> None:
    assert disk_read_only(read_only, usage, threshold=0.95, lwm_threshold=0.90) is expected
