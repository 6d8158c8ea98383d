"""`quire bench` as a user runs it: its own 3-bookie cluster, a short load, the JetStream
comparison, and the JSON and plot it writes. It checks that the benchmark works, not how
fast anything is."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.cluster import quire_executable

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SUMMARY_KEYS = {"entries_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms", "max_ms"}


def test_bench_smoke_with_jetstream_comparison(cluster_dir) -> None:
    parent = cluster_dir("bench")
    report_path, plot_path = parent / "bench.json", parent / "bench.png"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIRE_")}
    env["TMPDIR"] = str(parent)  # the cluster and JetStream data dirs go here
    done = subprocess.run(
        [
            quire_executable(),
            "bench",
            "--bookies", "3",
            "--duration", "2",
            "--warmup", "0.5",
            "--writers", "1",
            "--in-flight", "4",
            "--entry-size", "512",
            "--compare", "jetstream",
            "--json", str(report_path),
            "--plot", str(plot_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    assert "quire / jetstream" in done.stdout

    report = json.loads(report_path.read_text())
    assert report["settings"]["entry_size"] == 512 and report["settings"]["writers"] == 1
    assert {"cpu_count", "cpu_model", "python", "fsync"} <= report["machine"].keys()
    for system in ("quire", "jetstream"):
        figures = report[system]
        assert SUMMARY_KEYS <= figures.keys()
        assert figures["entries_per_s"] > 0 and figures["errors"] == 0
        assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["p999_ms"]
        assert figures["p999_ms"] <= figures["max_ms"]
        assert figures["mb_per_s"] == pytest.approx(figures["entries_per_s"] * 512 / 1e6, rel=0.01)
    assert report["ratio_throughput"] == pytest.approx(
        report["quire"]["entries_per_s"] / report["jetstream"]["entries_per_s"], rel=0.01
    )
    assert report["ratio_p99"] > 0
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Everything it started is gone: no data dir left behind (they are removed last).
    leftovers = [p.name for p in Path(parent).iterdir() if p.name.startswith("quire-bench")]
    assert leftovers == []
