"""The whole SLA job on a synthetic story (analytics/synth.py: every kind of incident, ~20k
events in several files): `python -m analytics.sla` run once, in this process on the session's
Spark, and every table it wrote compared with its plain-Python oracle over the same events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analytics.sla.job import TABLES, main
from analytics.sla.options import SlaOptions
from analytics.synth import DEFAULT_START, generate, parse_start
from tests.support.sla import assert_same_rows, oracle_input, rows
from tests.support.sla_oracle.tables import ORACLES

pytestmark = pytest.mark.slow

EVENTS = 20_000
LEDGERS = 20  # ledgers written at once: the story lasts about EVENTS / LEDGERS seconds


def read_events(directory: Path) -> list[dict]:
    events = []
    for path in sorted(directory.glob("*.jsonl")):
        events.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return events


def test_every_table_of_a_synthetic_story_matches_its_oracle(spark, tmp_path):
    generate(EVENTS, tmp_path / "events", seed=3, ledgers=LEDGERS, files=3)
    events = read_events(tmp_path / "events")
    assert len(events) >= EVENTS
    # Some events stored twice (a publish retried after JetStream's duplicate window): the job
    # counts each once.
    repeats = [json.dumps(e) for e in events[::97]]
    (tmp_path / "events" / "repeats.jsonl").write_text("\n".join(repeats) + "\n")
    start_ms = parse_start(DEFAULT_START)
    # A period that cuts the story (incidents before, in and after it), windows of 2 minutes.
    since_ms = start_ms + 200_000
    until_ms = start_ms + 800_000
    output = tmp_path / "out"
    code = main(
        [
            "--input", str(tmp_path / "events"),
            "--output", str(output),
            "--since", "2026-01-01T00:03:20Z",
            "--until", "2026-01-01T00:13:20+00:00",
            "--window", "120",
            "--target-ms", "5",
        ]
    )  # fmt: skip
    assert code == 0
    assert sorted(p.name for p in output.iterdir()) == sorted([*TABLES, "report.html"])

    options = SlaOptions(
        end_ms=until_ms, since_ms=since_ms, until_ms=until_ms, target_ms=5, window_s=120
    )
    given = oracle_input(events, until_ms)
    for name in TABLES:
        expected = ORACLES[name](given, options)
        assert expected, f"the story has nothing for {name}: make it tell more"
        actual = rows(spark.read.parquet(str(output / name)))
        assert_same_rows(actual, expected)
