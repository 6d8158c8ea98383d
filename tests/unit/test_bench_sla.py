"""The scale run's helpers (analytics/bench_sla.py): the events are written once per settings,
and the Spark event log is read for the executions that took longest and what each wrote."""

from __future__ import annotations

import json
from pathlib import Path

from analytics.bench_sla import slowest_executions, synthesize

PLAN = """== Physical Plan ==
Execute InsertIntoHadoopFsRelationCommand (9)
+- * Project (8)

(9) Execute InsertIntoHadoopFsRelationCommand
Input [3]: [a#1, b#2, c#3]
Arguments: file:/work/out/ack_latency, false, Parquet, [path=/work/out/ack_latency], Overwrite
"""


def test_the_events_are_written_once_for_the_same_settings(tmp_path: Path) -> None:
    settings = {"events": 500, "seed": 1, "ledgers": 5, "files": 2}
    assert synthesize(tmp_path, settings) > 0
    first = sorted(tmp_path.glob("events-*.jsonl"))
    assert len(first) == 2 and all(p.stat().st_size > 0 for p in first)
    mtimes = [p.stat().st_mtime_ns for p in first]
    assert synthesize(tmp_path, settings) == 0.0  # kept
    assert [p.stat().st_mtime_ns for p in first] == mtimes
    assert synthesize(tmp_path, {**settings, "files": 3}) > 0  # other settings: written again
    assert len(list(tmp_path.glob("events-*.jsonl"))) == 3


def test_the_slowest_executions_name_the_table_they_wrote(tmp_path: Path) -> None:
    prefix = "org.apache.spark.sql.execution.ui."
    events = [
        {
            "Event": prefix + "SparkListenerSQLExecutionStart",
            "executionId": 0,
            "time": 1_000,
            "description": "parquet at x",
            "physicalPlanDescription": PLAN,
        },
        {
            "Event": prefix + "SparkListenerSQLExecutionStart",
            "executionId": 1,
            "time": 2_000,
            "description": "count at y",
            "physicalPlanDescription": "== Physical Plan ==\n",
        },
        {"Event": prefix + "SparkListenerSQLExecutionEnd", "executionId": 1, "time": 2_500},
        {"Event": prefix + "SparkListenerSQLExecutionEnd", "executionId": 0, "time": 31_000},
        {"Event": "SparkListenerJobStart", "Job ID": 0},
    ]
    (tmp_path / "local-1").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / ".local-1.crc").write_text("not json")
    assert slowest_executions(tmp_path) == [
        {"seconds": 30.0, "what": "write ack_latency"},
        {"seconds": 0.5, "what": "count at y"},
    ]
