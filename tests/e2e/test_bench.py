"""`quire bench` as a user runs it: its own 3-bookie cluster, a short load, the JetStream
comparison, and the JSON and plot it writes; then the many-ledger modes (the Pulsar shape
against one ledger, `bench idle`, `bench open-ledgers`) and `bench read` (catch-up and
tailing) at tiny sizes against one running `quire up`. It checks that the benchmark works
and its counts add up, not how fast anything is."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import QuireUp, quire_executable

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
            "--repeat", "3",
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
    # A bookie is one process by default (journal and ledgerstore co-hosted): kind "bookie".
    assert_cpu_per_entry(report["quire"], {"bookie", "nats", "postgres"})
    assert_cpu_per_entry(report["jetstream"], {"nats"})
    assert_repeated(report, runs=3)
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Everything it started is gone: no data dir left behind (they are removed last).
    leftovers = [p.name for p in Path(parent).iterdir() if p.name.startswith("quire-bench")]
    assert leftovers == []


def test_bench_compares_tracing_on_and_off(cluster_dir) -> None:
    """Two fresh clusters, tracing off then on; every append traced (a ratio of 1), so
    that the traced path carries the whole load, without an error."""
    parent = cluster_dir("bench-tracing")
    report_path = parent / "bench.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUIRE_", "OTEL_"))}
    env["TMPDIR"] = str(parent)
    env["OTEL_TRACES_SAMPLER_ARG"] = "1"
    done = subprocess.run(
        [
            quire_executable(),
            "bench",
            "--bookies", "3",
            "--duration", "1.5",
            "--warmup", "0.5",
            "--in-flight", "8",
            "--compare", "tracing-off",
            "--json", str(report_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    assert "tracing on / tracing off" in done.stdout
    report = json.loads(report_path.read_text())
    assert report["quire"]["label"] == "tracing on"
    assert report["tracing_off"]["label"] == "tracing off"
    assert "1 of the requests traced" in report["settings"]["tracing"]
    for system in ("quire", "tracing_off"):
        assert report[system]["entries_per_s"] > 0 and report[system]["errors"] == 0
    assert report["ratio_throughput"] == pytest.approx(
        report["quire"]["entries_per_s"] / report["tracing_off"]["entries_per_s"], rel=0.01
    )


def assert_cpu_per_entry(figures: dict, kinds: set[str]) -> None:
    """CPU per entry is the whole of its breakdown by process kind (the bench process as
    `client`) over the entries measured, and every kind did some work."""
    by_kind = figures["cpu_us_per_entry_by_kind"]
    assert {"client"} | kinds <= by_kind.keys()
    assert figures["cpu_us_per_entry"] > 0
    assert figures["cpu_us_per_entry"] == pytest.approx(sum(by_kind.values()), abs=0.1)
    seconds = figures["cpu_s_by_kind"]
    for kind in {"client"} | kinds:
        assert seconds[kind] > 0
        assert by_kind[kind] == pytest.approx(seconds[kind] * 1e6 / figures["entries"], abs=0.1)
    assert by_kind["client"] == pytest.approx(figures["client_cpu_ms_per_1k_entries"], abs=0.1)


def assert_repeated(report: dict, runs: int) -> None:
    """Each run of both sides is reported; the medians are those of the runs, the top-level
    ratios those of the medians, and each system's own entry is its median run."""
    assert report["settings"]["repeat"] == runs and len(report["runs"]) == runs
    for system in ("quire", "jetstream"):
        throughputs = sorted(run[system]["entries_per_s"] for run in report["runs"])
        p99s = sorted(run[system]["p99_ms"] for run in report["runs"])
        median = report["median"][system]
        assert median["entries_per_s"] == throughputs[(runs - 1) // 2]
        assert median["p99_ms"] == p99s[(runs - 1) // 2]
        assert report[system]["entries_per_s"] == median["entries_per_s"]
    median = report["median"]
    assert (
        report["ratio_throughput"]
        == median["ratio_throughput"]
        == pytest.approx(
            median["quire"]["entries_per_s"] / median["jetstream"]["entries_per_s"], abs=0.001
        )
    )
    assert report["ratio_p99"] == pytest.approx(
        median["quire"]["p99_ms"] / median["jetstream"]["p99_ms"], abs=0.001
    )
    for run in report["runs"]:
        assert run["ratio_throughput"] == pytest.approx(
            run["quire"]["entries_per_s"] / run["jetstream"]["entries_per_s"], abs=0.001
        )


@pytest.fixture(scope="module")
def cluster(cluster_dir) -> Iterator[QuireUp]:
    up = QuireUp(cluster_dir("bench-many") / "quire-data", bookies=3)
    with up.running():
        yield up


def bench(cluster: QuireUp, report_path: Path, *args: str) -> dict:
    """`quire bench ARGS --data-dir D --json FILE`; its JSON report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIRE_")}
    done = subprocess.run(
        [quire_executable(), "bench", *args, "--data-dir", str(cluster.data_dir)]
        + ["--json", str(report_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(report_path.read_text())


def open_ledgers(cluster: QuireUp) -> set[int]:
    """The ids of the cluster's OPEN ledgers, page by page (every bench run closes the
    ledgers it wrote, in process or through the gateway)."""
    ledger_ids, params = set(), {"limit": 1000}
    while True:
        page = httpx.get(f"{cluster.url}/v1/ledgers", params=params, timeout=10).json()
        ledger_ids |= {row["ledger_id"] for row in page["ledgers"] if row["state"] == "OPEN"}
        if page["next_after"] is None:
            return ledger_ids
        params["after"] = page["next_after"]


@pytest.mark.parametrize("via", ["http", "inprocess"])
def test_many_slow_writers_next_to_one_fast_writer(cluster, tmp_path, via) -> None:
    open_before = open_ledgers(cluster)
    report = bench(
        cluster,
        tmp_path / "pulsar.json",
        "--ledgers", "20",
        "--rate", "40",  # 2 entries/s per ledger
        "--in-flight", "2",
        "--duration", "2",
        "--warmup", "0.5",
        "--compare", "one-ledger",
        "--via", via,
    )  # fmt: skip
    assert report["settings"]["writers"] == 20  # one per ledger unless given
    many, one = report["quire"], report["one_ledger"]
    assert (many["ledgers"], one["ledgers"]) == (20, 1)
    assert many["label"] == "20 ledgers" and one["label"] == "1 ledger"
    for figures in (many, one):
        assert figures["errors"] == 0 and figures["entries"] == figures["appends"] > 0
        assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert report["ratio_throughput"] == pytest.approx(
        many["entries_per_s"] / one["entries_per_s"], rel=0.01
    )
    assert report["ratio_p99"] == pytest.approx(many["p99_ms"] / one["p99_ms"], rel=0.01)
    # --data-dir: the cluster's processes are known from its cluster.json; a co-hosted
    # bookie's two rows (one `process`) count as one process of kind "bookie".
    rows = cluster.cluster_json()["services"]
    kinds = {"bookie" if "process" in row else row["kind"] for row in rows}
    for figures in (many, one):
        assert set(figures["cpu_us_per_entry_by_kind"]) == kinds | {"client"}
        assert figures["cpu_us_per_entry"] == pytest.approx(
            sum(figures["cpu_us_per_entry_by_kind"].values()), abs=0.1
        )
    assert open_ledgers(cluster) <= open_before  # the bench closed what it wrote


def test_bench_through_a_gateway_alone_says_the_cluster_cpu_is_unknown(cluster, tmp_path) -> None:
    """--gateway without --data-dir: no cluster.json, so no number passed off as the whole."""
    report_path = tmp_path / "gateway.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIRE_")}
    done = subprocess.run(
        [
            quire_executable(), "bench",
            "--gateway", cluster.url,
            "--via", "http",
            "--duration", "1",
            "--warmup", "0.2",
            "--in-flight", "2",
            "--json", str(report_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    figures = json.loads(report_path.read_text())["quire"]
    assert figures["cpu_us_per_entry"] is None and "not known" in figures["cpu_note"]
    assert "cpu_us_per_entry_by_kind" not in figures
    assert figures["entries"] > 0 and figures["client_cpu_ms_per_1k_entries"] > 0
    assert "CPU per entry unknown" in done.stdout


def test_idle_cpu_of_every_process_with_open_ledgers(cluster, tmp_path) -> None:
    open_before = open_ledgers(cluster)
    report = bench(
        cluster,
        tmp_path / "idle.json",
        "idle",
        "--ledgers", "10",
        "--seconds", "1",
        "--settle", "0",
        "--via", "grpc",
    )  # fmt: skip
    assert report["ledgers"] == 10 and report["append_errors"] == 0
    # A co-hosted bookie's two rows (one pid) are measured once, as its process.
    listed = {
        (row.get("process", row["name"]), row["pid"]) for row in cluster.cluster_json()["services"]
    }
    measured = {(row["name"], row["pid"]) for row in report["processes"]}
    assert measured == listed  # every process of the cluster, nats and postgres included
    assert {"gateway", "nats", "postgres"} <= {name for name, _ in measured}
    for row in report["processes"]:
        assert row["cpu_pct_no_ledgers"] >= 0 and row["cpu_pct_open_ledgers"] >= 0
    total = sum(row["cpu_pct_open_ledgers"] for row in report["processes"])
    assert report["cpu_pct_total_open_ledgers"] == pytest.approx(total, abs=0.1)
    rss = report["gateway_rss_kib"]
    assert min(rss["before"], rss["after_open"], rss["at_end"]) > 0
    assert open_ledgers(cluster) <= open_before


def test_open_ledgers_rounds(cluster, tmp_path) -> None:
    open_before = open_ledgers(cluster)
    report = bench(
        cluster,
        tmp_path / "rounds.json",
        "open-ledgers",
        "--total", "30",
        "--per-round", "10",
        "--clients", "4",
    )  # fmt: skip
    rounds = report["rounds"]
    assert [row["open_before"] for row in rounds] == [0, 10, 20]
    assert report["open_ledgers"] == 30 and report["stopped"] == "all ledgers open"
    for row in rounds:
        assert row["ledgers"] == 10 and row["errors"] == 0
        assert 0 < row["create_p50_ms"] <= row["create_p99_ms"]
        assert 0 < row["append_p50_ms"] <= row["append_p99_ms"]
    assert open_ledgers(cluster) <= open_before


READ_PASS_KEYS = {"entries", "bytes", "entries_per_s", "mb_per_s", "batches", "batch_p50_ms"}
READ_PASS_KEYS |= {"batch_p99_ms", "batch_max_ms", "page_cache_before", "page_cache_after"}


@pytest.mark.parametrize("via", ["inprocess", "http"])
def test_bench_read_cold_then_warm_with_jetstream(cluster, tmp_path, via) -> None:
    open_before = open_ledgers(cluster)
    compare = ["--compare", "jetstream"] if via == "inprocess" else []
    report = bench(
        cluster,
        tmp_path / "read.json",
        "read",
        "--entries", "1500",
        "--size", "512",
        "--batch", "200",
        "--via", via,
        *compare,
    )  # fmt: skip
    systems = ["quire", "jetstream"] if compare else ["quire"]
    assert [s for s in ("quire", "jetstream") if s in report] == systems
    for system in systems:
        assert report[system]["write"]["entries"] == 1500
        for name in ("cold", "warm"):
            figures = report[system][name]
            assert READ_PASS_KEYS <= figures.keys() and figures["error"] is None
            assert (figures["entries"], figures["bytes"]) == (1500, 1500 * 512)
            assert figures["entries_per_s"] > 0 and figures["batches"] > 0
            assert 0 < figures["batch_p50_ms"] <= figures["batch_p99_ms"]
            assert figures["batch_p99_ms"] <= figures["batch_max_ms"]
    cold, warm = report["quire"]["cold"]["ledgerstore"], report["quire"]["warm"]["ledgerstore"]
    # The cold pass came from the entry logs: nothing from the write cache, every entry
    # not read ahead by the pass itself missed the read cache.
    assert cold["write_cache_hits"] == 0
    assert cold["read_cache_misses"] > 0
    assert cold["read_cache_hits"] + cold["read_cache_misses"] == cold["ledgerstore_read_entry"]
    assert warm["ledgerstore_read_entry"] >= 1500
    assert open_ledgers(cluster) <= open_before  # the ledger read was closed


def test_bench_read_tailing(cluster, tmp_path) -> None:
    open_before = open_ledgers(cluster)
    report = bench(
        cluster,
        tmp_path / "tail.json",
        "read",
        "--tail",
        "--rate", "200",
        "--duration", "1",
        "--readers", "2",
        "--via", "grpc",
    )  # fmt: skip
    tail = report["tail"]
    assert tail["errors"] == 0 and tail["entries_written"] > 0
    assert tail["entries_read"] == 2 * tail["entries_written"]  # each reader read them all
    assert 0 < tail["lag_p50_ms"] <= tail["lag_p99_ms"] <= tail["lag_max_ms"]
    assert open_ledgers(cluster) <= open_before  # the writer closed its ledger


def test_bench_reads_beside_writes(cluster, tmp_path) -> None:
    """Cold ledgers, the peak, a write-only run at half of it, the same run beside cold
    catch-up readers: both runs' figures, the ratio from them, the readers' reads."""
    open_before = open_ledgers(cluster)
    report = bench(
        cluster,
        tmp_path / "beside.json",
        "read",
        "--beside-writes",
        "--entries", "2000",
        "--size", "512",
        "--batch", "200",
        "--readers", "2",
        "--duration", "1",
        "--warmup", "0.2",
        "--in-flight", "8",
    )  # fmt: skip
    figures = report["beside_writes"]
    assert report["settings"]["write_rate"] == "half the peak"
    assert figures["write_rate"] == pytest.approx(figures["peak"]["entries_per_s"] / 2, abs=0.1)
    alone, beside = figures["write_only"], figures["with_readers"]
    for run in (alone, beside):
        assert run["errors"] == 0 and run["entries"] > 0
        assert 0 < run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
        assert run["cpu_us_per_entry"] > 0
    assert figures["ratio_p99"] == pytest.approx(beside["p99_ms"] / alone["p99_ms"], abs=0.001)
    assert figures["ratio_p50"] == pytest.approx(beside["p50_ms"] / alone["p50_ms"], abs=0.001)
    read = figures["readers"]
    assert read["readers"] == 2 and read["errors"] == 0 and read["entries"] > 0
    assert read["bytes"] == read["entries"] * 512 and read["entries_per_s"] > 0
    # The readers read the cold ledgers (2 x 2,000 entries, at most) from the bookies'
    # entry logs: the ledgerstores served at least every entry they received.
    assert read["entries"] <= 2 * 2000
    assert read["ledgerstore"]["ledgerstore_read_entry"] >= read["entries"]
    assert read["covered_the_run"] == (read["readers_finished"] == 0)
    # CPU per entry read: the readers' process, and each kind's extra with readers.
    assert read["client_cpu_us_per_entry"] == pytest.approx(
        read["client_cpu_cores"] * 1e6 / read["entries_per_s"], abs=0.01
    )
    extra = read["cluster_cpu_us_per_entry_by_kind"]
    assert set(extra) == set(beside["cpu_s_by_kind"])
    kind = next(iter(extra))
    assert extra[kind] == pytest.approx(
        (
            beside["cpu_s_by_kind"][kind] / beside["elapsed_s"]
            - alone["cpu_s_by_kind"].get(kind, 0.0) / alone["elapsed_s"]
        )
        * 1e6
        / read["entries_per_s"],
        abs=0.5,
    )
    assert open_ledgers(cluster) <= open_before
