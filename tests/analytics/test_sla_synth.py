"""Every SLA table of the job (analytics.sla.job.TABLES) on a small synthetic story
(analytics/synth.py: losses, re-replication, recoveries, deletes and GC, drops) equals its
plain-Python oracle's rows, over a period inside the story."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analytics.sla.job import TABLES
from analytics.sla.options import SlaOptions
from analytics.synth import generate
from tests.support.sla import assert_same_rows, oracle_input, rows, spark_input
from tests.support.sla_oracle.availability import bookie_availability
from tests.support.sla_oracle.completeness import completeness
from tests.support.sla_oracle.ensembles import ensemble_changes
from tests.support.sla_oracle.exposure import exposure, exposure_timeline
from tests.support.sla_oracle.gc import gc_reclaim
from tests.support.sla_oracle.latency import ack_latency
from tests.support.sla_oracle.recoveries import recoveries

pytestmark = pytest.mark.slow

ORACLES = {
    "ack_latency": ack_latency,
    "recoveries": recoveries,
    "ensemble_changes": ensemble_changes,
    "bookie_availability": bookie_availability,
    "completeness": completeness,
    "exposure": exposure,
    "exposure_timeline": exposure_timeline,
    "gc_reclaim": gc_reclaim,
}


def test_every_table_of_a_synthetic_story_equals_its_oracle(spark, tmp_path: Path) -> None:
    assert set(ORACLES) == set(TABLES)
    # 20 ledgers for ~250 s: every incident of the story, a few thousand events.
    generate(5_000, tmp_path, seed=11, ledgers=20, files=1)
    lines = (tmp_path / "events-00000.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    first, last = events[0]["ts_ms"], max(e["ts_ms"] for e in events)
    # A period that leaves events out on both sides (what came before it still counts), a
    # window of a minute so that ack_latency and ensemble_changes have several rows.
    options = SlaOptions(
        end_ms=first + (last - first) * 9 // 10,
        since_ms=first + (last - first) // 5,
        until_ms=first + (last - first) * 9 // 10,
        target_ms=2.0,
        window_s=60,
    )
    table_input = spark_input(spark, events, options.until_ms)
    kept = oracle_input(events, options.until_ms)
    for name, function in TABLES.items():
        expected = ORACLES[name](kept, options)
        assert expected, f"{name}: no rows in the period, nothing compared"
        assert_same_rows(rows(function(table_input, options)), expected, rel=1e-6)
