"""End to end: `quire up` as a user runs it, driven through the HTTP API.

One cluster per module (starting one costs seconds); the tests run in file order and
build on each other: write, restart cleanly (with --no-restart: a dead bookie is left
down), kill -9 everything, restart (supervised), read again, kill -9 single processes
and see the supervision bring them back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import signal
import time
from collections.abc import Iterator

import httpx
import nats
import pytest

from shared.metrics import Scrape, scrape
from tests.support.cluster import QuireUp, pid_alive, wait_gone
from tests.support.metrics_catalog import catalog, missing_and_unlisted
from tests.support.natsproto import nats_handshake
from tests.support.wait import until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PASSWORD = "s3cret"
AUTH = {"Quire-Ledger-Password": PASSWORD}
KINDS = {
    "nats",
    "postgres",
    "metadata",
    "journal",
    "ledgerstore",
    "auditor",
    "replicator",
    "gateway",
}


def payload(ledger_id: int, i: int) -> bytes:
    """Distinct, binary, varied-length payloads (byte-exactness is part of the check)."""
    return bytes([i % 256]) * (i % 37) + f"{ledger_id}:{i}".encode() + b"\x00\xff"


@pytest.fixture(scope="module")
def cluster(cluster_dir) -> Iterator[QuireUp]:
    parent = cluster_dir("e2e")
    data_dir = parent / "quire-data"
    # Short leases, so that a killed bookie is seen lost within seconds.
    up = QuireUp(
        data_dir,
        env={
            "QUIRE_METADATA__BOOKIE_LEASE_MS": "3000",
            "QUIRE_METADATA__BOOKIE_HEARTBEAT_MS": "500",
        },
    )
    with up.running():
        yield up


# Everything the tests have had acknowledged: ledger id -> {entry id: bytes}.
ACKED: dict[int, dict[int, bytes]] = {}
STATE: dict[str, int] = {}


def create_ledger(client: httpx.Client, **overrides) -> dict:
    body = {
        "ensemble_size": 3,
        "write_quorum": 3,
        "ack_quorum": 2,
        "digest": "crc32c",
        "password": PASSWORD,
        "metadata": {"owner": "e2e"},
    } | overrides
    resp = client.post("/v1/ledgers", json=body)
    assert resp.status_code == 201, resp.text
    ledger = resp.json()
    ACKED[ledger["ledger_id"]] = {}
    return ledger


def append_one(client: httpx.Client, ledger_id: int, data: bytes) -> int:
    resp = client.post(
        f"/v1/ledgers/{ledger_id}/entries",
        content=data,
        headers={**AUTH, "Content-Type": "application/octet-stream"},
    )
    assert resp.status_code == 200, resp.text
    entry_id = resp.json()["entry_id"]
    ACKED[ledger_id][entry_id] = data
    return entry_id


def append_batch(client: httpx.Client, ledger_id: int, items: list[bytes]) -> tuple[int, int]:
    resp = client.post(
        f"/v1/ledgers/{ledger_id}/entries",
        headers=AUTH,
        json={"entries": [base64.b64encode(d).decode() for d in items]},
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    first, last = body["first_entry_id"], body["last_entry_id"]
    assert last - first + 1 == len(items)
    for offset, data in enumerate(items):
        ACKED[ledger_id][first + offset] = data
    return first, last


def read_all(client: httpx.Client, ledger_id: int, unconfirmed: bool = False) -> dict[int, bytes]:
    expected = ACKED[ledger_id]
    last = max(expected)
    got: dict[int, bytes] = {}
    start = 0
    while start <= last:
        end = min(start + 499, last)
        params = {"from": start, "to": end}
        if unconfirmed:
            params["unconfirmed"] = "true"
        resp = client.get(f"/v1/ledgers/{ledger_id}/entries", params=params, headers=AUTH)
        assert resp.status_code == 200, resp.text
        for entry in resp.json()["entries"]:
            got[entry["entry_id"]] = base64.b64decode(entry["data"])
        start = end + 1
    return got


def test_ready_line_and_cluster_json(cluster: QuireUp) -> None:
    assert cluster.ready_line == (
        f"quire: gateway ready at http://127.0.0.1:{cluster.http_port} "
        f"(grpc 127.0.0.1:{cluster.grpc_port}); no API tokens"
    )
    info = cluster.cluster_json()
    assert info["gateway"]["http"] == cluster.url
    assert info["gateway"]["grpc"] == f"127.0.0.1:{cluster.grpc_port}"
    assert info["nats_url"].startswith("nats://127.0.0.1:")
    assert info["database_url"].startswith("postgresql")
    kinds = [row["kind"] for row in info["services"]]
    assert set(kinds) == KINDS
    assert kinds.count("journal") == kinds.count("ledgerstore") == 4
    for row in info["services"]:
        assert pid_alive(row["pid"]), row
    assert info["gateway"]["pid"] in [r["pid"] for r in info["services"] if r["kind"] == "gateway"]
    for i in range(1, 5):
        assert (cluster.data_dir / f"bookie-{i}" / "journal").is_dir()
    assert (cluster.data_dir / "nats").is_dir()
    assert (cluster.data_dir / "postgres").is_dir()


def test_every_service_answers_discovery(cluster: QuireUp) -> None:
    async def ping() -> list[dict]:
        nc = await cluster.nats_connect()
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish("$SRV.PING", b"", reply=inbox)
        replies = []
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                msg = await sub.next_msg(timeout=0.3)
            except nats.errors.TimeoutError:
                continue
            replies.append(json.loads(msg.data))
        await nc.drain()
        return replies

    names = sorted(r["name"] for r in asyncio.run(ping()))
    assert names.count("quire-journal") == 4
    assert names.count("quire-ledgerstore") == 4
    for kind in ("metadata", "auditor", "replicator", "gateway"):
        assert f"quire-{kind}" in names


def test_nats_refuses_clients_without_the_generated_credentials(cluster: QuireUp) -> None:
    url = cluster.cluster_json()["nats_url"]
    user, password = json.loads((cluster.data_dir / "nats" / "auth.json").read_text()).values()
    info, answer = nats_handshake(url, {})
    assert info["auth_required"] is True
    assert b"Authorization Violation" in answer
    _, answer = nats_handshake(url, {"user": user, "pass": "guess"})
    assert b"Authorization Violation" in answer
    _, answer = nats_handshake(url, {"user": user, "pass": password})
    assert answer.startswith(b"PONG")
    auth = cluster.data_dir / "nats" / "auth.json"
    assert auth.stat().st_mode & 0o077 == 0, "the credentials file is private"
    assert password not in json.dumps(cluster.cluster_json())


def test_postgres_wants_the_generated_password_which_is_never_shown(cluster: QuireUp) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    stored = json.loads((cluster.data_dir / "postgres" / "auth.json").read_text())
    shown = make_url(cluster.cluster_json()["database_url"])
    assert stored["password"] not in json.dumps(cluster.cluster_json())
    target = {"host": shown.host, "port": shown.port, "user": stored["user"], "dbname": "quire"}
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(**target, password="guess", connect_timeout=5).close()
    with psycopg.connect(**target, password=stored["password"], connect_timeout=5) as conn:
        assert conn.execute("SELECT count(*) FROM ledgers").fetchone() is not None
    for log in (cluster.data_dir / "logs").glob("*.log"):
        assert stored["password"] not in log.read_text(), log
    assert stored["password"] not in cluster.stderr()


def test_bookies_registered(cluster: QuireUp) -> None:
    with cluster.client() as client:
        bookies = client.get("/v1/bookies").json()["bookies"]
    assert sorted(b["bookie_id"] for b in bookies) == [f"bookie-{i}" for i in range(1, 5)]
    assert {b["state"] for b in bookies} == {"writable"}


def test_thousand_appends_read_back_byte_exact_then_close(cluster: QuireUp) -> None:
    with cluster.client() as client:
        ledger = create_ledger(client)
        lid = ledger["ledger_id"]
        assert ledger["state"] == "OPEN" and ledger["last_entry_id"] is None
        assert "password" not in json.dumps(ledger)
        assert len(ledger["segments"][0]["bookies"]) == 3
        for i in range(500):
            assert append_one(client, lid, payload(lid, i)) == i
        for batch in range(50):
            first, _ = append_batch(
                client, lid, [payload(lid, 500 + batch * 10 + k) for k in range(10)]
            )
            assert first == 500 + batch * 10
        assert read_all(client, lid) == ACKED[lid]
        one = client.get(f"/v1/ledgers/{lid}/entries/777", headers=AUTH)
        assert one.status_code == 200 and one.content == ACKED[lid][777]
        assert int(one.headers["Quire-LAC"]) >= 998
        closed = client.post(f"/v1/ledgers/{lid}/close", headers=AUTH)
        assert closed.status_code == 200, closed.text
        assert closed.json()["state"] == "CLOSED" and closed.json()["last_entry_id"] == 999
        after = client.post(
            f"/v1/ledgers/{lid}/entries",
            content=b"late",
            headers={**AUTH, "Content-Type": "application/octet-stream"},
        )
        assert after.status_code == 409 and after.json()["code"] == "LEDGER_CLOSED"
        meta = client.get(f"/v1/ledgers/{lid}").json()
        assert meta["state"] == "CLOSED" and meta["last_entry_id"] == 999
        assert meta["length"] == sum(len(d) for d in ACKED[lid].values())
        # Closed: the LAC is the last entry, and every entry reads.
        assert read_all(client, lid) == ACKED[lid]
        STATE["closed"] = lid


def test_every_target_serves_prometheus_with_bookkeepers_names(cluster: QuireUp) -> None:
    """After the appends and reads above: every process of targets.json answers with
    Prometheus text, the names of docs/metrics.md are there, and the counters of the work
    done count it."""
    targets = json.loads((cluster.data_dir / "prometheus" / "targets.json").read_text())
    rows = {r["name"]: r for r in cluster.cluster_json()["services"] if "metrics" in r}
    assert {t["labels"]["instance"] for t in targets} == set(rows)
    for target in targets:
        row = rows[target["labels"]["instance"]]
        assert target["labels"]["service"] == row["kind"]
        assert target["labels"].get("bookie_id") == row["bookie_id"]
        assert row["metrics"] == f"http://{target['targets'][0]}/metrics"

    async def scrape_all() -> dict[str, list[Scrape]]:
        scraped = await asyncio.gather(*(scrape(row["metrics"]) for row in rows.values()))
        by_kind: dict[str, list[Scrape]] = {}
        for row, one in zip(rows.values(), scraped, strict=True):
            by_kind.setdefault(row["kind"], []).append(one)
        return by_kind

    def total(scrapes: list[Scrape], name: str, **labels: str) -> float:
        return sum(one.value(name, **labels) for one in scrapes)

    async def settled() -> dict[str, list[Scrape]] | None:
        # The elected auditor's first bookie check and a replicator's first idle poll come
        # a moment after the cluster is ready.
        by_kind = await scrape_all()
        auditors, replicators = by_kind["auditor"], by_kind["replicator"]
        done = (
            total(auditors, "auditor_AUDIT_BOOKIES_TIME_count", success="true") >= 1
            and total(replicators, "quire_replicator_idle_polls_total") >= 1
        )
        return by_kind if done else None

    by_kind = asyncio.run(until(settled, "the auditor's first check and a replicator's poll"))
    assert len(by_kind["journal"]) == len(by_kind["ledgerstore"]) == 4
    listed = catalog()
    assert set(listed) == set(by_kind)
    for kind, names in listed.items():
        for one in by_kind[kind]:
            missing, unlisted = missing_and_unlisted(one, names)
            assert not missing, f"{kind} does not export {missing}"
            assert not unlisted, f"docs/metrics.md does not list {kind}'s {unlisted}"

    journals, ledgerstores = by_kind["journal"], by_kind["ledgerstore"]
    # 1,000 entries, 3 replicas each (and more by earlier tests, none refused).
    assert total(journals, "bookie_journal_JOURNAL_ADD_ENTRY_count", success="true") >= 3000
    assert total(journals, "bookkeeper_server_ADD_ENTRY_REQUEST_count", success="true") >= 3000
    assert total(journals, "bookie_journal_JOURNAL_SYNC_count", success="true") >= 1
    p99 = [
        one.value("bookie_journal_JOURNAL_SYNC", success="true", quantile="0.99")
        for one in journals
    ]
    assert all(v > 0 for v in p99 if not math.isnan(v))  # NaN: none synced in the window
    # Read back twice: each entry once from one replica, from a cache or an entry log.
    served = sum(
        total(ledgerstores, name)
        for name in (
            "bookie_write_cache_hits",
            "bookie_read_cache_hits",
            "bookie_read_cache_misses",
        )
    )
    assert served >= 2000
    assert total(ledgerstores, "bookkeeper_server_READ_ENTRY_REQUEST_count", success="true") >= 1
    assert all(one.types["bookie_write_cache_size"] == "gauge" for one in ledgerstores)
    assert all(one.types["bookie_read_cache_hits"] == "unknown" for one in ledgerstores)
    assert total(by_kind["auditor"], "quire_auditor_leader") == 1
    assert total(by_kind["auditor"], "auditor_election_attempts") >= 1
    assert total(by_kind["metadata"], "quire_metadata_requests_total", op="ledger.create") >= 1
    assert total(by_kind["gateway"], "quire_gateway_add_entries_total") >= 1000
    # And the process collectors, in every process but the gateway.
    assert all(
        "process_cpu_seconds_total" in one
        for k, s in by_kind.items()
        if k != "gateway"
        for one in s
    )


def test_events_reach_the_stream(cluster: QuireUp) -> None:
    lid = STATE["closed"]

    async def kinds() -> set[str]:
        nc = await cluster.nats_connect()
        js = nc.jetstream()
        sub = await js.subscribe("quire.events.>", ordered_consumer=True)
        seen = set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not {"ledger.created", "ledger.closed"} <= seen:
            try:
                msg = await sub.next_msg(timeout=1)
            except nats.errors.TimeoutError:
                continue
            event = json.loads(msg.data)
            assert event["schema_version"] == 1 and event["ts_ms"] > 0
            if event.get("ledger_id") == lid:
                seen.add(event["kind"])
        await nc.drain()
        return seen

    assert {"ledger.created", "ledger.closed"} <= asyncio.run(kinds())


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [
        (
            "post",
            "/v1/ledgers",
            {"json": {"ensemble_size": 3, "write_quorum": 4, "ack_quorum": 2, "password": "p"}},
            400,
            "INVALID_ARGUMENT",
        ),
        (
            "post",
            "/v1/ledgers",
            {
                "json": {
                    "ensemble_size": 3,
                    "write_quorum": 3,
                    "ack_quorum": 2,
                    "digest": "md5",
                    "password": "p",
                }
            },
            400,
            "INVALID_ARGUMENT",
        ),
        (
            "post",
            "/v1/ledgers",
            {"content": b"{not json", "headers": {"Content-Type": "application/json"}},
            400,
            "INVALID_ARGUMENT",
        ),
        (
            "post",
            "/v1/ledgers",
            {"json": {"ensemble_size": 9, "write_quorum": 3, "ack_quorum": 2, "password": "p"}},
            503,
            "NOT_ENOUGH_BOOKIES",
        ),
        ("get", "/v1/ledgers/999999999", {}, 404, "NO_SUCH_LEDGER"),
        ("get", "/v1/ledgers/abc", {}, 400, "INVALID_ARGUMENT"),
        ("get", "/v1/ledgers/{open}/entries?from=0&to=0", {}, 403, "UNAUTHORIZED"),
        (
            "get",
            "/v1/ledgers/{open}/entries?from=0&to=0",
            {"headers": {"Quire-Ledger-Password": "wrong"}},
            403,
            "UNAUTHORIZED",
        ),
        (
            "get",
            "/v1/ledgers/{open}/entries?from=5&to=2",
            {"headers": AUTH},
            400,
            "INVALID_ARGUMENT",
        ),
        ("get", "/v1/ledgers/{open}/entries/12345", {"headers": AUTH}, 404, "NO_SUCH_ENTRY"),
        (
            "post",
            "/v1/ledgers/{open}/entries",
            {"json": {"entries": ["aGk=", "%%%"]}, "headers": AUTH},
            400,
            "INVALID_ARGUMENT",
        ),
        (
            "post",
            "/v1/ledgers/{open}/entries",
            {
                "content": b"x" * (5 * 1024 * 1024 + 1),
                "headers": {**AUTH, "Content-Type": "application/octet-stream"},
            },
            413,
            "ENTRY_TOO_LARGE",
        ),
        ("post", "/v1/ledgers/{open}/close", {}, 403, "UNAUTHORIZED"),
        (
            "delete",
            "/v1/ledgers/{open}",
            {"headers": {"Quire-Ledger-Password": "no"}},
            403,
            "UNAUTHORIZED",
        ),
        (
            "get",
            "/v1/ledgers/{open}/lac?after=-1&timeout_ms=-5",
            {"headers": AUTH},
            400,
            "INVALID_ARGUMENT",
        ),
    ],
)
def test_bad_input_gets_its_code_and_changes_nothing(
    cluster: QuireUp, method: str, path: str, kwargs: dict, status: int, code: str
) -> None:
    with cluster.client() as client:
        if "open" not in STATE:
            STATE["open"] = create_ledger(client)["ledger_id"]
            append_one(client, STATE["open"], b"first")
        lid = STATE["open"]
        before = client.get(f"/v1/ledgers/{lid}").json()
        listed_before = client.get("/v1/ledgers", params={"limit": 1000}).json()
        resp = client.request(method, path.replace("{open}", str(lid)), **kwargs)
        # API.md: INVALID_ARGUMENT is 400 or 422.
        allowed = {400, 422} if code == "INVALID_ARGUMENT" else {status}
        assert resp.status_code in allowed, resp.text
        assert resp.headers["content-type"].startswith("application/problem+json")
        problem = resp.json()
        assert problem["code"] == code and problem["status"] == resp.status_code
        assert {"type", "title", "detail"} <= problem.keys()
        assert client.get(f"/v1/ledgers/{lid}").json() == before
        assert client.get("/v1/ledgers", params={"limit": 1000}).json() == listed_before
        assert read_all(client, lid, unconfirmed=True) == ACKED[lid]


def test_open_ledger_with_acknowledged_entries(cluster: QuireUp) -> None:
    with cluster.client() as client:
        lid = create_ledger(client, ensemble_size=4, write_quorum=3, ack_quorum=2, digest="crc32")[
            "ledger_id"
        ]
        append_batch(client, lid, [payload(lid, i) for i in range(200)])
        for i in range(200, 300):
            append_one(client, lid, payload(lid, i))
        lac = client.get(f"/v1/ledgers/{lid}/lac", headers=AUTH).json()["lac"]
        assert lac >= 298  # the LAC rides on the next add: at least all but the last
        STATE["open_written"] = lid


def test_clean_restart_brings_everything_back(cluster: QuireUp) -> None:
    pids = cluster.pids()
    assert cluster.stop() == 0
    assert cluster.stderr().splitlines()[-1] == "quire: stopped (restarts while up: none)"
    assert wait_gone(pids) == [], "quire up left processes behind"
    assert not (cluster.data_dir / "cluster.json").exists()
    cluster.restart = False  # the tests up to the kill -9 of everything run with --no-restart
    cluster.start()
    with cluster.client() as client:
        assert client.get(f"/v1/ledgers/{STATE['closed']}").json()["state"] == "CLOSED"
        for lid in ACKED:
            assert read_all(client, lid, unconfirmed=True) == ACKED[lid], lid
        assert read_all(client, STATE["closed"]) == ACKED[STATE["closed"]]


def test_new_ledgers_after_restart(cluster: QuireUp) -> None:
    with cluster.client() as client:
        lid = create_ledger(client, digest="hmac")["ledger_id"]
        assert lid not in (STATE["closed"], STATE["open"])
        append_batch(client, lid, [payload(lid, i) for i in range(100)])
        append_one(client, lid, b"tail")
        assert read_all(client, lid, unconfirmed=True) == ACKED[lid]


def row_of(cluster: QuireUp, name: str) -> dict:
    return next(r for r in cluster.cluster_json()["services"] if r["name"] == name)


def restarted(cluster: QuireUp, name: str, old_pid: int, restarts: int = 1) -> int:
    """The pid of `name`'s restart, once cluster.json lists it."""

    def new_pid() -> int | None:
        row = row_of(cluster, name)
        if row["pid"] in (None, old_pid) or row["restarts"] != restarts:
            return None
        return row["pid"] if pid_alive(row["pid"]) else None

    return asyncio.run(until(new_pid, f"{name} restarted", 60))


def test_no_restart_leaves_a_dead_bookie_down_and_the_cluster_keeps_serving(
    cluster: QuireUp,
) -> None:
    with cluster.client() as client:
        ledger = create_ledger(client)
        lid = ledger["ledger_id"]
        append_one(client, lid, b"before")
        victim = ledger["segments"][0]["bookies"][0]
        row = row_of(cluster, f"{victim}.journal")
        process = row.get("process", row["name"])  # a co-hosted bookie: bookie-N
        seen = len(cluster.stderr())  # what this run of quire up said after the kill
        os.kill(row["pid"], signal.SIGKILL)
        # Qw=3, Qa=2: adds still complete on the two living bookies.
        for i in range(20):
            append_one(client, lid, payload(lid, i))
        assert read_all(client, lid, unconfirmed=True) == ACKED[lid]
    reported = f"quire: {process} (pid {row['pid']}) exited with code -9; see "
    asyncio.run(until(lambda: reported in cluster.stderr()[seen:], "the exit reported", 10))
    assert cluster.proc is not None and cluster.proc.poll() is None
    # Left down, its lease lapses: the registry says lost, and the auditor publishes
    # bookie.lost.
    with cluster.client() as client:
        deadline = time.monotonic() + 15
        state = None
        while time.monotonic() < deadline and state != "lost":
            bookies = client.get("/v1/bookies").json()["bookies"]
            state = next(b["state"] for b in bookies if b["bookie_id"] == victim)
            time.sleep(0.3)
        assert state == "lost"
    assert row_of(cluster, f"{victim}.journal")["pid"] is None
    assert "restart" not in cluster.stderr()[seen:]

    async def lost_event() -> bool:
        nc = await cluster.nats_connect()
        sub = await nc.jetstream().subscribe("quire.events.bookie.lost", ordered_consumer=True)
        found = False
        deadline = time.monotonic() + 10
        while not found and time.monotonic() < deadline:
            try:
                msg = await sub.next_msg(timeout=1)
            except nats.errors.TimeoutError:
                continue
            found = json.loads(msg.data)["bookie_id"] == victim
        await nc.drain()
        return found

    assert asyncio.run(lost_event())


def test_kill_9_everything_then_restart_loses_nothing_acknowledged(cluster: QuireUp) -> None:
    killed = cluster.kill_everything()
    assert killed
    cluster.restart = True  # supervised again, for the tests below
    cluster.start()
    with cluster.client() as client:
        for lid in ACKED:
            assert read_all(client, lid, unconfirmed=True) == ACKED[lid], lid
        ledgers = client.get("/v1/ledgers", params={"limit": 1000}).json()["ledgers"]
        assert set(ACKED) <= {row["ledger_id"] for row in ledgers}


def test_a_killed_bookie_and_gateway_come_back_and_serve(cluster: QuireUp) -> None:
    with cluster.client() as client:
        ledger = create_ledger(client)
        lid = ledger["ledger_id"]
        append_one(client, lid, b"before")
        victim = ledger["segments"][0]["bookies"][0]
        row = row_of(cluster, f"{victim}.journal")
        journal, process = row["pid"], row.get("process", row["name"])  # co-hosted: bookie-N
        os.kill(journal, signal.SIGKILL)
        # Qw=3, Qa=2: adds complete on the two others while it comes back.
        for i in range(20):
            append_one(client, lid, payload(lid, i))
        back = restarted(cluster, f"{victim}.journal", journal)
        assert read_all(client, lid, unconfirmed=True) == ACKED[lid]
    assert f"quire: {process} (pid {journal}) exited with code -9; restarting in" in (
        cluster.stderr()
    )
    assert f"quire: {process} restarted (pid {back}, restart 1)" in cluster.stderr()
    gateway = cluster.cluster_json()["gateway"]["pid"]
    os.kill(gateway, signal.SIGKILL)
    new_gateway = restarted(cluster, "gateway", gateway)
    assert cluster.cluster_json()["gateway"]["pid"] == new_gateway

    def serving() -> dict | None:
        try:
            with cluster.client() as client:
                resp = client.post(
                    "/v1/ledgers",
                    json={"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2, "password": "p"},
                )
        except httpx.HTTPError:
            return None
        return resp.json() if resp.status_code == 201 else None

    created = asyncio.run(until(serving, "the restarted gateway creating a ledger", 60))

    def all_writable() -> bool:
        with cluster.client() as client:
            bookies = client.get("/v1/bookies").json()["bookies"]
        return len(bookies) == 4 and {b["state"] for b in bookies} == {"writable"}

    asyncio.run(until(all_writable, "every bookie writable", 60))
    with cluster.client() as client:
        # The restarted journal serves its share: a new ledger on every bookie takes it.
        lid = create_ledger(client, ensemble_size=4, write_quorum=4, ack_quorum=4)["ledger_id"]
        append_batch(client, lid, [payload(lid, i) for i in range(50)])
        assert read_all(client, lid) == ACKED[lid]
        assert created["ledger_id"] != lid
    assert cluster.proc is not None and cluster.proc.poll() is None


async def events_stored(cluster: QuireUp) -> int:
    """The last sequence number of the event stream."""
    nc = await cluster.nats_connect()
    try:
        js = nc.jetstream()
        name = await js.find_stream_name_by_subject("quire.events.>")
        return (await js.stream_info(name)).state.last_seq
    finally:
        await nc.drain()


def test_nats_and_postgres_come_back_on_their_port_with_their_data(cluster: QuireUp) -> None:
    before = cluster.cluster_json()
    events_before = asyncio.run(events_stored(cluster))
    nats_pid, postgres_pid = row_of(cluster, "nats")["pid"], row_of(cluster, "postgres")["pid"]
    os.kill(nats_pid, signal.SIGKILL)
    os.kill(postgres_pid, signal.SIGKILL)
    restarted(cluster, "nats", nats_pid)
    restarted(cluster, "postgres", postgres_pid)
    after = cluster.cluster_json()
    assert (after["nats_url"], after["database_url"]) == (
        before["nats_url"],
        before["database_url"],
    )

    def created() -> int | None:
        # The metadata service reconnects to both; until then a create fails.
        with cluster.client() as client:
            resp = client.post(
                "/v1/ledgers",
                json={"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2, "password": PASSWORD},
            )
        return resp.json()["ledger_id"] if resp.status_code == 201 else None

    lid = asyncio.run(until(created, "a ledger created after NATS and PostgreSQL restarted", 90))
    ACKED[lid] = {}
    with cluster.client() as client:
        append_batch(client, lid, [payload(lid, i) for i in range(20)])
        # Every ledger still there, every acknowledged entry (the database and the bookies'
        # data kept).
        listed = client.get("/v1/ledgers", params={"limit": 1000}).json()["ledgers"]
        assert set(ACKED) <= {row["ledger_id"] for row in listed}
        for one in ACKED:
            assert read_all(client, one, unconfirmed=True) == ACKED[one], one

    # JetStream's store kept: no event stored before the kill is gone.
    assert asyncio.run(events_stored(cluster)) >= events_before
