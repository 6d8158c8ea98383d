"""The fault suite's workload, final phase and checker against a real `quire up` with NO
faults: every operation kind happens, and the checker finds nothing; the same data with an
acknowledged entry dropped and another's bytes changed shows the counts it must."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from quire.cluster import nats_credentials
from quire.faults.checker import FATAL, FinalLedger, calls, check, summary
from quire.faults.final import ledgers_of, run_final_phase
from quire.faults.history import History, load
from quire.faults.workload import Workload
from shared.config import QuireSettings
from tests.support.cluster import QuireUp

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUN_TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def cluster(cluster_dir) -> Iterator[QuireUp]:
    up = QuireUp(cluster_dir("e2e-fault-workload") / "quire-data", bookies=4)
    with up.running():
        yield up


WANTED_OK = {"append": 150, "recover": 3, "close": 3, "read": 10, "tail": 2, "lac": 2, "get": 3}
SHAPES = {(3, 3), (4, 3), (3, 2)}  # (ensemble, write quorum): striping exercised
VIAS = {"http", "grpc", "grpc-stream"}


def missing(ops: list) -> list[str]:
    """What the run has not done yet: every kind of operation a few times (appends many),
    every quorum shape, both transports and AppendStream, and a writer fenced."""
    done = calls(ops)
    ok = Counter(c.invoke.kind for c in done if c.outcome == "ok")
    shapes = {
        (c.invoke.value["ensemble_size"], c.invoke.value["write_quorum"])
        for c in done
        if c.invoke.kind == "create" and c.outcome == "ok"
    }
    vias = {c.invoke.value.get("via") for c in done if c.outcome == "ok"}
    fenced = any(c.result.get("code") == "LEDGER_FENCED" for c in done)
    return [
        *(f"{n} {kind} ok" for kind, n in WANTED_OK.items() if ok[kind] < n),
        *(f"a ledger E{e} Qw{w}" for e, w in SHAPES - shapes),
        *(f"an append via {via}" for via in VIAS - vias),
        *([] if fenced else ["a writer fenced by a recover"]),
    ]


def run_workload(cluster: QuireUp, path: Path) -> History:
    history = History(path)
    workload = Workload(
        cluster.url,
        f"127.0.0.1:{cluster.grpc_port}",
        history,
        seed=7,
        writers=4,
        readers=2,
        entries_per_ledger=15,
        entry_size=200,
        rate=80.0,
        recover_every_s=1.0,
    )
    workload.start()
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while todo := missing(history.ops()):
            assert time.monotonic() < deadline, f"the workload did not do: {todo}"
            time.sleep(0.2)
    finally:
        workload.stop()
        history.close()
    return history


@pytest.fixture(scope="module")
def run(cluster: QuireUp, cluster_dir) -> tuple[History, list[FinalLedger], Path]:
    path = cluster_dir("e2e-fault-workload-run") / "history.jsonl"
    history = run_workload(cluster, path)
    user, password = nats_credentials(cluster.data_dir) or ("", "")
    nats = QuireSettings(
        nats_url=cluster.cluster_json()["nats_url"], nats_user=user, nats_password=password
    )
    finals = run_final_phase(cluster.url, nats, ledgers_of(history.ops()), deadline_s=60)
    return history, finals, path


def test_no_faults_no_violations(run) -> None:
    history, finals, path = run
    ops = history.ops()
    assert load(path) == ops
    assert history.open_ops() == []
    result = check(ops, finals)
    figures = summary(result)
    assert result.ok, figures
    assert result.replicas_corrupt == 0, figures
    # Every entry is held by at least an ack quorum of its write set. Not necessarily by all
    # of it: a recover may fence a bookie before the writer's add reaches it, once the
    # others acknowledged the entry (autorecovery's work, as in BookKeeper).
    for f in finals:
        held = Counter(r.entry_id for r in f.replicas if r.status == "OK")
        assert all(held[entry_id] >= f.ack_quorum for entry_id, _ in f.entries), f.ledger_id
    assert all(f.state == "CLOSED" and f.read_error is None for f in finals)
    assert len(finals) == len(ledgers_of(ops)) >= 10
    assert figures["entries"]["acked"] >= 150
    assert result.final_entries >= figures["entries"]["acked"]
    assert len(result.recovery_ms) == len(finals)
    assert missing(ops) == []
    # Reads saw entries, with the LAC the gateway reported (the beyond-LAC rule's input).
    seen = [e for c in calls(ops) if c.invoke.kind == "read" for e in c.result.get("entries", ())]
    assert any(lac is not None for _, _, lac in seen)


def test_tampered_final_data_is_counted(run) -> None:
    history, finals, _ = run
    ops = history.ops()
    acked = {
        (c.invoke.ledger, entry_id)
        for c in calls(ops)
        if c.invoke.kind == "append" and c.outcome == "ok"
        for entry_id in range(c.result["first"], c.result["last"] + 1)
    }
    # Two acknowledged entries of one closed ledger: drop the first, change the second.
    victim = next(f for f in finals if {(f.ledger_id, 0), (f.ledger_id, 1)} <= acked)
    entries = [(e, b"tampered" if e == 1 else d) for e, d in victim.entries if e != 0]
    tampered = [replace(f, entries=entries) if f is victim else f for f in finals]
    result = check(ops, tampered)
    assert not result.ok
    assert result.lost == 2, result.examples
    assert result.non_dense == 1
    assert result.unexpected == 1
    assert result.corrupt == 1
    assert result.replicas_differing == victim.write_quorum  # they hold the true bytes
    # Reads during the run that saw either entry may now disagree with the final ledger
    # (beyond_lac); nothing else may.
    for rule in set(FATAL) - {
        "lost",
        "non_dense",
        "unexpected",
        "corrupt",
        "replicas_differing",
        "beyond_lac",
    }:
        assert getattr(result, rule) == 0, (rule, result.examples)
