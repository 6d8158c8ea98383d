"""The SLA job at scale: synthetic events through `python -m analytics.sla` on local Spark,
timed, with the peak memory of the whole process tree.

    python -m analytics.bench_sla --events 10000000 --work DIR [--master local[2]]

1. writes the events with `analytics.synth` to DIR/events/ (kept for the next run: generated
   again only when absent or written with other settings, see DIR/events/_synth.json);
2. runs the job in a fresh process, `python -m analytics.sla --input DIR/events --master ...
   --output DIR/out`, with the Spark UI off and Spark's event log in DIR/eventlog/;
3. samples the resident memory of the job's process tree (the Python driver, the JVM and the
   Python workers) with psutil every second;
4. prints (and writes to DIR/bench.json) the wall time, events/s, the peak memory in all and
   of the JVM and of the Python processes, the machine's load before and after, and the
   Spark SQL executions that took longest (from the event log: what each wrote).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from analytics import synth

SAMPLE_S = 1.0  # the tree is listed from /proc each time: not free on a busy machine
SYNTH_MANIFEST = "_synth.json"


def synthesize(directory: Path, settings: dict[str, Any]) -> float:
    """The events, written unless `directory` holds them with these settings already; the
    seconds it took (0 when kept)."""
    manifest = directory / SYNTH_MANIFEST
    if manifest.exists() and json.loads(manifest.read_text()) == settings:
        return 0.0
    for old in directory.glob("events-*.jsonl"):
        old.unlink()
    started = time.monotonic()
    synth.generate(
        settings["events"],
        directory,
        seed=settings["seed"],
        ledgers=settings["ledgers"],
        files=settings["files"],
    )
    took = time.monotonic() - started
    manifest.write_text(json.dumps(settings))
    return took


class TreeMemory:
    """The peak resident memory of a process and its descendants, sampled in a thread."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.peak = self.peak_jvm = self.peak_python = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        known: dict[int, psutil.Process] = {}  # reused: a Process caches its name
        while not self._stop.is_set():
            total = jvm = python = 0
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for found in processes:
                process = known.setdefault(found.pid, found)
                try:
                    rss = process.memory_info().rss
                    name = process.name()
                except psutil.NoSuchProcess:
                    known.pop(found.pid, None)
                    continue  # a worker that ended between the listing and the reading
                total += rss
                if name == "java":
                    jvm += rss
                elif name.startswith("python"):
                    python += rss
            self.peak = max(self.peak, total)
            self.peak_jvm = max(self.peak_jvm, jvm)
            self.peak_python = max(self.peak_python, python)
            self._stop.wait(SAMPLE_S)


def slowest_executions(eventlog: Path, count: int = 12) -> list[dict[str, Any]]:
    """The Spark SQL executions of the run, longest first: seconds, and the output path its
    plan names (a table's directory, the staging) or its description."""
    starts: dict[int, tuple[int, str]] = {}
    took: list[dict[str, Any]] = []
    for path in eventlog.iterdir():
        if path.name.startswith(".") or not path.is_file():
            continue
        with path.open() as lines:
            for line in lines:
                event = json.loads(line)
                name = event.get("Event", "")
                if name.endswith("SparkListenerSQLExecutionStart"):
                    plan = event.get("physicalPlanDescription", "")
                    starts[event["executionId"]] = (event["time"], what_it_wrote(plan, event))
                elif name.endswith("SparkListenerSQLExecutionEnd"):
                    started = starts.get(event["executionId"])
                    if started is not None:
                        seconds = (event["time"] - started[0]) / 1000
                        took.append({"seconds": round(seconds, 1), "what": started[1]})
    return sorted(took, key=lambda e: -e["seconds"])[:count]


def what_it_wrote(plan: str, event: dict[str, Any]) -> str:
    written = re.search(r"InsertIntoHadoopFsRelationCommand.*?Arguments: file:(\S+?),", plan, re.S)
    if written:
        path = written.group(1)
        return "write " + ("_staging" if "/_staging/" in path else path.rsplit("/", 1)[-1])
    return event.get("description", "")[:80]


def run_job(work: Path, master: str, driver_memory: str) -> dict[str, Any]:
    eventlog = work / "eventlog"
    shutil.rmtree(eventlog, ignore_errors=True)
    eventlog.mkdir(parents=True)
    env = dict(os.environ)
    env["PYSPARK_SUBMIT_ARGS"] = (
        f"--driver-memory {driver_memory} --conf spark.ui.enabled=false "
        "--conf spark.ui.showConsoleProgress=false "
        f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir=file://{eventlog} "
        # One plain JSON-lines file (Spark 4 rolls and compresses with zstd by default).
        "--conf spark.eventLog.rolling.enabled=false --conf spark.eventLog.compress=false "
        "pyspark-shell"
    )
    command = [
        sys.executable,
        "-m",
        "analytics.sla",
        "--input",
        str(work / "events"),
        "--master",
        master,
        "--output",
        str(work / "out"),
    ]
    load_before = os.getloadavg()
    started = time.monotonic()
    with open(work / "job.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        with TreeMemory(process.pid) as memory:
            code = process.wait()
    wall_s = time.monotonic() - started
    return {
        "exit_code": code,
        "wall_s": round(wall_s, 1),
        "peak_rss_mib": memory.peak // 2**20,
        "peak_jvm_rss_mib": memory.peak_jvm // 2**20,
        "peak_python_rss_mib": memory.peak_python // 2**20,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "slowest": slowest_executions(eventlog),
        "command": " ".join(command),
        "spark_args": env["PYSPARK_SUBMIT_ARGS"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analytics.bench_sla",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--work", type=Path, required=True, help="events, output, logs")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g", help="Spark's driver (local: all)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ledgers", type=int, default=200, help="synth: ledgers at once")
    parser.add_argument("--files", type=int, default=16, help="synth: files to write")
    args = parser.parse_args(argv)
    settings = {
        # Events of another version of the generator are written again.
        "synth": hashlib.sha256(Path(synth.__file__).read_bytes()).hexdigest()[:16],
        "events": args.events,
        "seed": args.seed,
        "ledgers": args.ledgers,
        "files": args.files,
    }
    synth_s = synthesize(args.work / "events", settings)
    size = sum(p.stat().st_size for p in (args.work / "events").glob("events-*.jsonl"))
    result = {
        "events": args.events,
        "input_mib": size // 2**20,
        "synth_s": round(synth_s, 1),
        "master": args.master,
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        **run_job(args.work, args.master, args.driver_memory),
    }
    result["events_per_s"] = round(args.events / result["wall_s"])
    (args.work / "bench.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0 if result["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
