"""`quire up`: a whole Quire cluster on this machine, in the foreground.

Starts NATS and PostgreSQL (unless QUIRE_NATS_URL / QUIRE_DATABASE_URL name existing
ones), then the metadata service, N bookies (a journal and a ledgerstore each: one
co-hosted process, `python -m services.bookie`, or two with bookie_process="separate"),
the auditor, the replicator and the gateway, each as its own process. It prints the ready
line once the gateway answers /readyz, keeps DIR/cluster.json up to date, and on SIGINT
or SIGTERM stops everything in order: gateway first, PostgreSQL and NATS last.

It supervises what it started: a process that exits is reported and started again on the
same ports, data dir and credentials, after a backoff that doubles from 0.5 s to 30 s
while it keeps dying (reset once it stayed up 60 s), so a local cluster does not stay
degraded because one process was killed. `restart=False` (`quire up --no-restart`) only
reports it and leaves it down. The fault suite drives the same supervision: it signals a
process, holds it down and releases it (`signal`, `hold`, `release`).

Every service process serves Prometheus metrics on a port of its own (the gateway on its
HTTP port, /metrics); DIR/prometheus/targets.json lists them all for Prometheus's
file-based service discovery (docs/metrics.md).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

import httpx
from sqlalchemy.engine import make_url

from quire.infra import (
    PG_USER,
    InfraError,
    ManagedProcess,
    ended_with_parent,
    free_port,
    start_nats,
    start_postgres,
    write_private,
)
from quire.pgstandby import failover_url, forget_standby, resume_standby, start_standby
from shared.config import load_settings
from shared.protocol.placement import DEFAULT_LOCATION, POLICIES, parse_location

READY_TIMEOUT_S = 120.0
BOOKIE_PROCESSES = ("separate", "cohosted")
BOOKIE_HALVES = ("journal", "ledgerstore")
STANDBY_DIR = "postgres-standby"  # `--postgres-standby`: the standby's dir in the data dir
STANDBY_NAME = "standby1"  # its application name and replication slot
MONITOR_INTERVAL_S = 0.5
SUPERVISE_INTERVAL_S = 0.1  # how soon an exit is seen: the fault suite times its restarts
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0
BACKOFF_RESET_AFTER_S = 60.0  # up this long: the next exit is not part of a crash loop


@dataclass
class ClusterConfig:
    data_dir: Path
    bookies: int = 4
    # Gateways: the first on http_port/grpc_port, the others on ports free at the start
    # (kept across restarts), all on the same cluster, as behind a load balancer.
    gateways: int = 1
    http_port: int = 7480
    grpc_port: int = 7481
    host: str = "127.0.0.1"
    nats_url: str | None = None  # existing NATS, from QUIRE_NATS_URL
    database_url: str | None = None  # existing PostgreSQL, from QUIRE_DATABASE_URL
    # Our own PostgreSQL with a synchronous streaming standby (`--postgres-standby`).
    postgres_standby: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)
    restart: bool = True  # restart a process that exits (False: `quire up --no-restart`)
    # Called with a service process's name at each (re)spawn; its variables are applied
    # last to that process's environment (the fault runner's proxy addresses and fault
    # directories). Not called for the cluster's own NATS and PostgreSQL.
    env_for: Callable[[str], dict[str, str]] | None = None
    # Bookie id -> its network location "/zone/rack" (QUIRE_BOOKIE_LOCATION; a bookie not
    # named is at the default), and QUIRE_PLACEMENT__POLICY for every process (None: what
    # the environment says). docs/placement.md.
    bookie_locations: Mapping[str, str] = field(default_factory=dict)
    placement_policy: str | None = None
    # QUIRE_BOOKIE_PROCESS: "separate" (a journal and a ledgerstore process per bookie) or
    # "cohosted" (one `services.bookie` process per bookie, named bookie-N; its halves
    # keep their names, bookie-N.journal and bookie-N.ledgerstore, as aliases of it).
    bookie_process: str = field(default_factory=lambda: load_settings().bookie_process)

    def __post_init__(self) -> None:
        if self.bookie_process not in BOOKIE_PROCESSES:
            raise ValueError(
                f"bookie process {self.bookie_process!r}: want one of {BOOKIE_PROCESSES}"
            )
        unknown = sorted(set(self.bookie_locations) - set(self.bookie_ids))
        if unknown:
            raise ValueError(f"bookie locations for bookies not in the cluster: {unknown}")
        for location in self.bookie_locations.values():
            parse_location(location)
        if self.placement_policy is not None and self.placement_policy not in POLICIES:
            raise ValueError(f"placement policy {self.placement_policy!r}: want one of {POLICIES}")

    @property
    def bookie_ids(self) -> list[str]:
        return [f"bookie-{i}" for i in range(1, self.bookies + 1)]

    def bookie_location(self, bookie_id: str) -> str:
        return self.bookie_locations.get(bookie_id, DEFAULT_LOCATION)


@dataclass
class ServiceProcess:
    """One supervised process, across its incarnations: `proc` is the current (or last)."""

    name: str
    kind: str
    proc: subprocess.Popen
    bookie_id: str | None = None
    log_path: Path | None = None
    metrics_port: int | None = None  # its Prometheus metrics server (a gateway: HTTP port)
    # A co-hosted bookie's: its ledgerstore half's metrics (its journal's: metrics_port).
    ledgerstore_metrics_port: int | None = None
    grpc_port: int | None = None  # a gateway's
    restarts: int = 0
    held: bool = False  # once it exits, not restarted until released
    started_at: float = field(default_factory=time.monotonic)
    exit_seen: bool = False  # the current incarnation's exit was reported
    restart_at: float | None = None  # monotonic; None: not scheduled
    backoff_s: float = BACKOFF_INITIAL_S  # the wait before the next restart
    spawning: bool = False  # the supervisor is starting its next incarnation
    release_asked: bool = False  # release(): start it at the supervisor's next pass
    attempts: int = 0  # restarts tried, failed or not: what a release waits for


AUTH_FILE = "auth.json"


def stored_credentials(
    path: Path, user: str = "quire", create: bool = False
) -> tuple[str, str] | None:
    """(user, password) kept in `path` (mode 0600), made on first use when `create`."""
    if path.exists():
        stored = json.loads(path.read_text())
        return stored["user"], stored["password"]
    if not create:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(24)
    write_private(path, json.dumps({"user": user, "password": password}) + "\n")
    return user, password


def nats_credentials(data_dir: Path, create: bool = False) -> tuple[str, str] | None:
    """The cluster's own NATS user and password: DIR/nats/auth.json."""
    return stored_credentials(data_dir / "nats" / AUTH_FILE, create=create)


def postgres_credentials(data_dir: Path, create: bool = False) -> tuple[str, str] | None:
    """The cluster's own PostgreSQL user and password: DIR/postgres/auth.json."""
    return stored_credentials(data_dir / "postgres" / AUTH_FILE, user=PG_USER, create=create)


def without_password(url: str) -> str:
    """A database URL fit to print or store in cluster.json."""
    return make_url(url).render_as_string(hide_password=True)


class Cluster:
    def __init__(
        self, config: ClusterConfig, out: IO[str] = sys.stdout, err: IO[str] = sys.stderr
    ) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.out = out
        self.err = err
        self.nats: ManagedProcess | None = None
        self.postgres: ManagedProcess | None = None
        self.postgres_standby: ManagedProcess | None = None
        self.nats_url = config.nats_url or ""
        # Our own NATS requires a user and password, generated once per data dir.
        self.nats_credentials: tuple[str, str] | None = None
        self.database_url = config.database_url or ""
        self.services: list[ServiceProcess] = []
        # NATS and PostgreSQL when we started them, then the services: everything supervised.
        self._processes: dict[str, ServiceProcess] = {}
        # A co-hosted bookie's halves (bookie-N.journal, bookie-N.ledgerstore) -> bookie-N:
        # signalling, holding or releasing a half is doing it to the bookie's process.
        self._aliases: dict[str, str] = {}
        self._postgres_password: str | None = None
        self._lock_file: IO[str] | None = None
        self._stopping = threading.Event()
        # Guards the process table; its condition tells stop() that a spawn finished.
        self._lock = threading.Condition(threading.RLock())
        self._supervisor: threading.Thread | None = None
        self._launched = threading.Event()  # the first processes started (or failed to)
        self._wake = threading.Event()  # a release asks the supervisor to act now
        self._finished = threading.Event()  # stopped: the supervisor thread may end

    # -- start --------------------------------------------------------------------------

    def start(self) -> None:
        """Start every process (in the supervisor thread, see `_supervise`) and wait for
        the gateway to be ready."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        (self.data_dir / "logs").mkdir(exist_ok=True)
        failure: list[BaseException] = []
        self._supervisor = threading.Thread(
            target=self._supervise, args=(failure,), name="quire-supervisor", daemon=True
        )
        self._supervisor.start()
        try:
            self._launched.wait()
            if failure:
                raise failure[0]
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _launch(self) -> None:
        """Every process, in dependency order."""
        if not self.nats_url:
            self.nats_credentials = nats_credentials(self.data_dir, create=True)
            self.nats = start_nats(
                self.data_dir / "nats",
                host=self.config.host,
                credentials=self.nats_credentials,
            )
            self.nats_url = self.nats.url
            self._adopt(self.nats)
        if not self.database_url:
            _, password = postgres_credentials(self.data_dir, create=True) or ("", "")
            self._postgres_password = password
            self.postgres = start_postgres(
                self.data_dir / "postgres", host=self.config.host, password=password
            )
            self.database_url = self.postgres.url
            self._adopt(self.postgres)
            self._launch_postgres_standby()
        self._spawn("metadata", "metadata")
        for bookie_id in self.config.bookie_ids:
            (self.data_dir / bookie_id).mkdir(exist_ok=True)
            if self.config.bookie_process == "cohosted":
                for half in BOOKIE_HALVES:
                    self._aliases[f"{bookie_id}.{half}"] = bookie_id
                self._spawn(bookie_id, "bookie", bookie_id)
                continue
            self._spawn(f"{bookie_id}.journal", "journal", bookie_id)
            self._spawn(f"{bookie_id}.ledgerstore", "ledgerstore", bookie_id)
        self._spawn("auditor", "auditor")
        self._spawn("replicator", "replicator")
        for name in self.gateway_names:
            self._spawn(name, "gateway")
        self.write_cluster_json()
        self.write_targets_json()

    def _launch_postgres_standby(self) -> None:
        """With `postgres_standby`, our PostgreSQL's synchronous standby (made once, then
        resumed), and a database URL naming both that only ever settles on the primary.
        Without, a standby left from an earlier run is refused rather than forgotten: the
        primary would wait at every commit for it, or it would silently fall behind."""
        assert self.postgres is not None
        directory = self.data_dir / STANDBY_DIR
        password = self._postgres_password
        if not self.config.postgres_standby:
            if directory.exists():
                raise InfraError(
                    f"{directory} holds the standby of an earlier `quire up "
                    "--postgres-standby`: run with --postgres-standby, or remove it"
                )
            forget_standby(self.postgres, STANDBY_NAME, password)
            return
        if (directory / "data").exists():
            standby = resume_standby(self.postgres, directory, name=STANDBY_NAME, password=password)
        else:
            standby = start_standby(self.postgres, directory, name=STANDBY_NAME, password=password)
        self.postgres_standby = standby
        self._adopt(replace(standby, name=STANDBY_DIR, kind="postgres-standby"))
        self.database_url = failover_url(self.database_url, [self.postgres, standby])

    def _lock_data_dir(self) -> None:
        self._lock_file = open(self.data_dir / ".lock", "w")  # noqa: SIM115 (held while up)
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InfraError(f"another `quire up` is running on {self.data_dir}") from None

    def _adopt(self, managed: ManagedProcess) -> None:
        """Supervise NATS or PostgreSQL, which we started."""
        with self._lock:
            self._processes[managed.name] = ServiceProcess(
                managed.name, managed.kind, managed.proc, log_path=managed.log_path
            )

    def _env(self, bookie_id: str | None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "QUIRE_NATS_URL": self.nats_url,
                **(
                    {
                        "QUIRE_NATS_USER": self.nats_credentials[0],
                        "QUIRE_NATS_PASSWORD": self.nats_credentials[1],
                    }
                    if self.nats_credentials
                    else {}
                ),
                "QUIRE_DATABASE_URL": self.database_url,
                "QUIRE_DATA_DIR": str(self.data_dir),
                "QUIRE_GATEWAY__HTTP_HOST": self.config.host,
                "QUIRE_GATEWAY__HTTP_PORT": str(self.config.http_port),
                "QUIRE_GATEWAY__GRPC_PORT": str(self.config.grpc_port),
                "QUIRE_GATEWAY__READY_MIN_WRITABLE_BOOKIES": str(min(3, self.config.bookies)),
            }
        )
        if self.config.placement_policy is not None:
            env["QUIRE_PLACEMENT__POLICY"] = self.config.placement_policy
        # Every process keeps its spans in the cluster's span store (`quire trace show`),
        # exported within half a second rather than the SDK's 5 s.
        env["QUIRE_TRACES_DIR"] = str(self.data_dir / "traces")
        env.setdefault("OTEL_BSP_SCHEDULE_DELAY", "500")
        env.update(self.config.extra_env)
        if bookie_id:
            env["QUIRE_BOOKIE_ID"] = bookie_id
            if bookie_id in self.config.bookie_locations:
                env["QUIRE_BOOKIE_LOCATION"] = self.config.bookie_locations[bookie_id]
        return env

    @property
    def gateway_names(self) -> list[str]:
        return ["gateway", *(f"gateway-{i}" for i in range(2, self.config.gateways + 1))]

    def _spawn(self, name: str, kind: str, bookie_id: str | None = None) -> None:
        log_path = self.data_dir / "logs" / f"{name}.log"
        # A port free now, closed before the process binds it: another program could
        # take it in between, which on a developer's machine is rare enough; the process
        # would then fail to start, reported like any other that dies. Its restarts keep
        # it, so targets.json and cluster.json stay true.
        grpc_port = None
        if kind != "gateway":
            metrics_port = free_port(self.config.host)
        elif name == "gateway":  # a gateway serves /metrics on its HTTP port
            metrics_port, grpc_port = self.config.http_port, self.config.grpc_port
        else:
            metrics_port, grpc_port = free_port(self.config.host), free_port(self.config.host)
        ledgerstore_port = free_port(self.config.host) if kind == "bookie" else None
        proc = self._launch_service(
            name, kind, bookie_id, metrics_port, grpc_port, ledgerstore_port
        )
        svc = ServiceProcess(
            name,
            kind,
            proc,
            bookie_id,
            log_path,
            metrics_port=metrics_port,
            grpc_port=grpc_port,
            ledgerstore_metrics_port=ledgerstore_port,
        )
        with self._lock:
            self.services.append(svc)
            self._processes[name] = svc

    def _launch_service(
        self,
        name: str,
        kind: str,
        bookie_id: str | None,
        metrics_port: int,
        grpc_port: int | None = None,
        ledgerstore_metrics_port: int | None = None,
    ) -> subprocess.Popen:
        """An incarnation of a service process, its output appended to its log."""
        env = self._env(bookie_id)
        if kind != "gateway":
            env["QUIRE_METRICS_PORT"] = str(metrics_port)
            env["QUIRE_METRICS_HOST"] = self.config.host
        else:
            env["QUIRE_GATEWAY__HTTP_PORT"] = str(metrics_port)
            env["QUIRE_GATEWAY__GRPC_PORT"] = str(grpc_port)
        if ledgerstore_metrics_port is not None:
            env["QUIRE_LEDGERSTORE_METRICS_PORT"] = str(ledgerstore_metrics_port)
        if self.config.env_for is not None:
            env.update(self.config.env_for(name))
        with open(self.data_dir / "logs" / f"{name}.log", "ab") as log_file:
            return subprocess.Popen(
                **ended_with_parent(self._service_command(kind)),
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _service_command(self, kind: str) -> list[str]:
        return [sys.executable, "-m", f"services.{kind}"]

    def _relaunch(self, svc: ServiceProcess) -> subprocess.Popen:
        """A new incarnation of `svc`; NATS and PostgreSQL on the same port and data."""
        if svc.kind == "nats":
            assert self.nats is not None
            port = int(self.nats.url.rsplit(":", 1)[1])
            self.nats = start_nats(
                self.data_dir / "nats",
                port=port,
                host=self.config.host,
                credentials=self.nats_credentials,
            )
            return self.nats.proc
        if svc.kind == "postgres":
            assert self.postgres is not None
            self.postgres = start_postgres(
                self.data_dir / "postgres",
                port=self.postgres.extra["port"],
                host=self.config.host,
                password=self._postgres_password,
            )
            return self.postgres.proc
        if svc.kind == "postgres-standby":
            assert self.postgres is not None and self.postgres_standby is not None
            self.postgres_standby = resume_standby(
                self.postgres,
                self.data_dir / STANDBY_DIR,
                name=STANDBY_NAME,
                port=self.postgres_standby.extra["port"],
                password=self._postgres_password,
                wait_streaming=False,  # it reconnects by itself, whenever the primary is up
            )
            return self.postgres_standby.proc
        assert svc.metrics_port is not None
        return self._launch_service(
            svc.name,
            svc.kind,
            svc.bookie_id,
            svc.metrics_port,
            svc.grpc_port,
            svc.ledgerstore_metrics_port,
        )

    @property
    def http_url(self) -> str:
        """The first gateway's."""
        return self.gateway_http_url(self.config.http_port)

    def gateway_http_url(self, port: int | None) -> str:
        scheme = "https" if self._tls else "http"
        return f"{scheme}://{self.config.host}:{port}"

    @property
    def _tls(self) -> bool:
        env = self._env(None)
        return bool(env.get("QUIRE_GATEWAY__TLS_CERT_FILE"))

    @property
    def auth_note(self) -> str:
        """What the ready line says of authentication."""
        tokens = bool(self._env(None).get("QUIRE_API_TOKENS", "").strip())
        return "bearer tokens required" if tokens else "no API tokens"

    @property
    def grpc_address(self) -> str:
        return f"{self.config.host}:{self.config.grpc_port}"

    def _wait_ready(self) -> None:
        """Wait for every gateway's /readyz; then the ready line (the first gateway's), and
        a line for each further gateway."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        for name in self.gateway_names:
            self._wait_gateway_ready(self.service(name), deadline)
        print(
            f"quire: gateway ready at {self.http_url} (grpc {self.grpc_address}); {self.auth_note}",
            file=self.out,
            flush=True,
        )
        for name in self.gateway_names[1:]:
            gateway = self.service(name)
            print(
                f"quire: {name} ready at {self.gateway_http_url(gateway.metrics_port)} "
                f"(grpc {self.config.host}:{gateway.grpc_port})",
                file=self.out,
                flush=True,
            )

    def _wait_gateway_ready(self, gateway: ServiceProcess, deadline: float) -> None:
        # The probe is our own, on loopback: it need not verify our certificate.
        # Its first incarnation: a gateway that cannot start (its port taken) fails the
        # start rather than being restarted in a loop the user never sees the end of.
        first = gateway.proc
        url = f"{self.gateway_http_url(gateway.metrics_port)}/readyz"
        with httpx.Client(timeout=2.0, verify=False) as client:
            while time.monotonic() < deadline:
                if first.poll() is not None:
                    raise InfraError(
                        f"the {gateway.name} exited ({first.returncode}); see {gateway.log_path}"
                    )
                try:
                    if client.get(url).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise InfraError(
            f"the {gateway.name} was not ready within {READY_TIMEOUT_S:.0f} s; "
            f"see the logs in {self.data_dir / 'logs'}"
        )

    def service(self, name: str) -> ServiceProcess:
        return next(s for s in self.services if s.name == name)

    # -- cluster.json -------------------------------------------------------------------

    def cluster_info(self) -> dict:
        """cluster.json: a row per process, its pid null while it is down."""
        with self._lock:
            rows = []
            for svc in self._processes.values():
                for name, kind, metrics in self._rows_of(svc):
                    row = {
                        "name": name,
                        "kind": kind,
                        "bookie_id": svc.bookie_id,
                        "pid": self._pid(svc),
                        **(
                            {"location": self.config.bookie_location(svc.bookie_id)}
                            if svc.bookie_id is not None
                            else {}
                        ),
                        "restarts": svc.restarts,
                    }
                    if svc.kind == "bookie":
                        row["process"] = svc.name  # both halves: one process, one pid
                    if svc in self.services:
                        row |= {"log": str(svc.log_path), "metrics": metrics}
                    rows.append(row)
            gateways = [
                {
                    "name": gateway.name,
                    "http": self.gateway_http_url(gateway.metrics_port),
                    "grpc": f"{self.config.host}:{gateway.grpc_port}",
                    "pid": self._pid(gateway),
                }
                for gateway in map(self.service, self.gateway_names)
            ]
        return {
            "gateway": {key: gateways[0][key] for key in ("http", "grpc", "pid")},
            "gateways": gateways,
            "nats_url": self.nats_url,
            "database_url": without_password(self.database_url),
            "data_dir": str(self.data_dir),
            "pid": os.getpid(),
            # What every process was given (the environment's, unless --placement-policy).
            "placement_policy": self._env(None).get("QUIRE_PLACEMENT__POLICY", "random"),
            "services": rows,
        }

    def write_cluster_json(self) -> None:
        with self._lock:  # one writer at a time: they share the temporary file
            if self._lock_file is not None:  # the data dir is ours: started, not stopped
                _write_json(self.data_dir / "cluster.json", self.cluster_info())

    # -- prometheus/targets.json ---------------------------------------------------------

    def _rows_of(self, svc: ServiceProcess) -> list[tuple[str, str, str | None]]:
        """(name, kind, metrics URL) of each service a process runs: a co-hosted bookie
        is listed as its two halves, under their names in separate processes."""
        if svc.kind != "bookie":
            return [(svc.name, svc.kind, self.metrics_url(svc))]
        ledgerstore = replace(svc, metrics_port=svc.ledgerstore_metrics_port)
        return [
            (f"{svc.name}.journal", "journal", self.metrics_url(svc)),
            (f"{svc.name}.ledgerstore", "ledgerstore", self.metrics_url(ledgerstore)),
        ]

    def metrics_url(self, svc: ServiceProcess) -> str | None:
        if svc.metrics_port is None:
            return None
        if svc.kind == "gateway":
            return f"{self.gateway_http_url(svc.metrics_port)}/metrics"
        return f"http://{self.config.host}:{svc.metrics_port}/metrics"

    def scrape_targets(self) -> list[dict]:
        """Prometheus file-based service discovery: one target a process, labelled with
        its service, bookie and instance name."""
        targets = []
        for svc in self.services:
            ports = {svc.name: (svc.kind, svc.metrics_port)}
            if svc.kind == "bookie":
                ports = {
                    f"{svc.name}.journal": ("journal", svc.metrics_port),
                    f"{svc.name}.ledgerstore": ("ledgerstore", svc.ledgerstore_metrics_port),
                }
            for name, (kind, port) in ports.items():
                if port is None:
                    continue
                labels = {"service": kind, "instance": name}
                if svc.bookie_id is not None:
                    labels["bookie_id"] = svc.bookie_id
                targets.append({"targets": [f"{self.config.host}:{port}"], "labels": labels})
        return targets

    def write_targets_json(self, targets: list[dict] | None = None) -> None:
        """DIR/prometheus/targets.json: written once the processes are started (their set
        and ports do not change while the cluster is up), emptied when it stops."""
        path = self.data_dir / "prometheus" / "targets.json"
        path.parent.mkdir(exist_ok=True)
        _write_json(path, self.scrape_targets() if targets is None else targets)

    # -- supervision --------------------------------------------------------------------

    def process_names(self) -> list[str]:
        """Every process this cluster started: NATS and PostgreSQL (when it started them),
        then the services (a co-hosted bookie once, as bookie-N; its halves' names are
        aliases of it for `pid`, `signal`, `hold`, `release` and `wait_running`)."""
        with self._lock:
            return list(self._processes)

    def _process(self, name: str) -> ServiceProcess:
        return self._processes[self._aliases.get(name, name)]

    def pid(self, name: str) -> int | None:
        """The pid of `name`'s current incarnation; None while it is down. A process
        stopped by SIGSTOP is not down."""
        with self._lock:
            return self._pid(self._process(name))

    @staticmethod
    def _pid(svc: ServiceProcess) -> int | None:
        if svc.spawning or svc.proc.poll() is not None:
            return None
        return svc.proc.pid

    def signal(self, name: str, sig: int) -> bool:
        """Send `sig` to `name`'s current incarnation; False when it is down."""
        with self._lock:
            svc = self._process(name)
            if self._pid(svc) is None:
                return False
            svc.proc.send_signal(sig)
            return True

    def hold(self, name: str) -> None:
        """When `name` exits it is not restarted until `release(name)`."""
        with self._lock:
            self._process(name).held = True

    def release(self, name: str) -> None:
        """Supervise `name` again; if it is down, have it started now (no backoff) and
        return once that was tried. Also with restart=False: releasing asks for it back."""
        with self._lock:
            svc = self._process(name)
            if self._stopping.is_set() or svc.spawning or svc.proc.poll() is None:
                svc.held = False
                return
            self._note_exit(svc, time.monotonic())  # reported as held, if it was
            svc.held = False
            svc.release_asked = True
            tried = svc.attempts
            self._wake.set()
            supervisor = self._supervisor
            while svc.attempts == tried and not self._stopping.is_set():
                if supervisor is None or not supervisor.is_alive():
                    raise InfraError(f"{name} cannot be released: the cluster is not running")
                self._lock.wait(0.5)

    def wait_running(self, name: str, timeout_s: float) -> int:
        """The pid of `name` once it runs (its restart, for one just killed); TimeoutError
        if it is still down after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            pid = self.pid(name)
            if pid is not None:
                return pid
            if time.monotonic() >= deadline or self._stopping.is_set():
                raise TimeoutError(f"{name} is not running after {timeout_s:g} s")
            time.sleep(0.05)

    def restarts(self) -> dict[str, int]:
        with self._lock:
            return {name: svc.restarts for name, svc in self._processes.items()}

    def _supervise(self, failure: list[BaseException]) -> None:
        """The supervisor thread: it starts every process, then restarts them, until the
        cluster has stopped. One long-lived thread does all of it because a process
        started through `ended_with_parent` gets SIGTERM when the THREAD that started it
        ends (PR_SET_PDEATHSIG follows the thread): started by a short-lived thread (a
        fault runner's release), it would be killed a moment later."""
        try:
            self._launch()
        except BaseException as exc:  # start() raises it in the caller, then stops
            failure.append(exc)
        finally:
            self._launched.set()
        while not self._finished.is_set():
            self._wake.wait(SUPERVISE_INTERVAL_S)
            self._wake.clear()
            try:
                self._supervise_once()
            except OSError as exc:  # cluster.json not written (a full disk): go on
                self._say(f"quire: supervision: {exc}")

    def _supervise_once(self) -> None:
        """Report every exit once; start again each exited process that is due: with
        restart=True, not held and its backoff passed; in any case, when released."""
        now = time.monotonic()
        due = []
        with self._lock:
            if self._stopping.is_set():
                return
            for svc in self._processes.values():
                if svc.spawning or svc.proc.poll() is None:
                    continue
                self._note_exit(svc, now)
                backoff_over = svc.restart_at is not None and now >= svc.restart_at
                if svc.release_asked or (self.config.restart and not svc.held and backoff_over):
                    svc.release_asked = False
                    svc.spawning = True
                    due.append(svc)
        for svc in due:
            self._restart(svc)

    def _note_exit(self, svc: ServiceProcess, now: float) -> None:
        """Once per incarnation (lock held): report the exit and schedule the restart."""
        if svc.exit_seen:
            return
        svc.exit_seen = True
        if now - svc.started_at >= BACKOFF_RESET_AFTER_S:
            svc.backoff_s = BACKOFF_INITIAL_S
        what = f"quire: {svc.name} (pid {svc.proc.pid}) exited with code {svc.proc.returncode}"
        if not self.config.restart:
            self._say(f"{what}; see {svc.log_path}")
        elif svc.held:
            self._say(f"{what}; held: not restarted until released; see {svc.log_path}")
        else:
            self._say(f"{what}; restarting in {svc.backoff_s:g}s; see {svc.log_path}")
        self._schedule(svc, now)
        self.write_cluster_json()

    def _schedule(self, svc: ServiceProcess, now: float) -> None:
        svc.restart_at = now + svc.backoff_s
        svc.backoff_s = min(svc.backoff_s * 2, BACKOFF_MAX_S)

    def _restart(self, svc: ServiceProcess) -> None:
        """Start `svc`'s next incarnation (its `spawning` set by the caller), outside the
        lock: NATS or PostgreSQL take a while to listen, and the fault runner's calls
        must not wait for that."""
        try:
            proc = self._relaunch(svc)
        except Exception as exc:  # the supervisor outlives any one failed start
            with self._lock:
                svc.spawning = False
                svc.attempts += 1
                self._schedule(svc, time.monotonic())
                self._say(
                    f"quire: restarting {svc.name} failed ({exc}); "
                    f"trying again in {svc.restart_at - time.monotonic():.1f}s"
                )
                self._lock.notify_all()
            return
        with self._lock:
            svc.proc = proc
            svc.restarts += 1
            svc.attempts += 1
            svc.started_at = time.monotonic()
            svc.exit_seen = False
            svc.restart_at = None
            svc.spawning = False
            self._lock.notify_all()
            self._say(f"quire: {svc.name} restarted (pid {proc.pid}, restart {svc.restarts})")
            self.write_cluster_json()

    def _say(self, line: str) -> None:
        print(line, file=self.err, flush=True)

    def run_until_stopped(self) -> None:
        """Wait for SIGINT or SIGTERM (`request_stop`); the supervisor thread reports and
        restarts meanwhile."""
        while not self._stopping.wait(MONITOR_INTERVAL_S):
            pass

    def request_stop(self) -> None:
        self._stopping.set()

    # -- stop ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop in dependency order: gateway, auditor and replicator, ledgerstores,
        journals, metadata, then PostgreSQL and NATS. Nothing is restarted from the moment
        it is called; a restart under way is let finish, and what it started is stopped."""
        self._stopping.set()
        if self._supervisor is not None:
            self._launched.wait()  # a start under way finishes first: what it started stops
        with self._lock:
            while any(svc.spawning for svc in self._processes.values()):
                self._lock.wait()
        order = ["gateway", "auditor", "replicator", "ledgerstore", "journal", "bookie", "metadata"]
        for kind in order:
            group = [s for s in self.services if s.kind == kind]
            for svc in group:
                if svc.proc.poll() is None:
                    svc.proc.send_signal(signal.SIGTERM)
                    # One stopped by SIGSTOP (the fault suite's pause) must run to exit.
                    svc.proc.send_signal(signal.SIGCONT)
            for svc in group:
                try:
                    svc.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    print(f"quire: {svc.name} did not stop in time; killing it", file=self.err)
                    svc.proc.kill()
                    svc.proc.wait(timeout=10)
        # The primary first: its clean shutdown hands its last WAL to the standby.
        for managed in (self.postgres, self.postgres_standby, self.nats):
            if managed is not None:
                managed.stop()
        with self._lock:
            (self.data_dir / "cluster.json").unlink(missing_ok=True)
            if (self.data_dir / "prometheus" / "targets.json").exists():
                self.write_targets_json([])  # nothing to scrape any more
            if self._lock_file is not None:
                self._lock_file.close()
                self._lock_file = None
        # Only now: the processes it started get SIGTERM when it ends (PR_SET_PDEATHSIG).
        self._finished.set()
        self._wake.set()
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join()


def _write_json(path: Path, data: object) -> None:
    """Replace `path` at once: a reader (Prometheus, a CLI) never sees half a file."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def run_up(config: ClusterConfig) -> int:
    """The body of `quire up`: start, serve until SIGINT/SIGTERM, stop."""
    cluster = Cluster(config)

    def on_signal(signum: int, frame: object) -> None:
        cluster.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        cluster.start()
    except (InfraError, OSError, subprocess.SubprocessError) as exc:
        print(f"quire: {exc}", file=sys.stderr)
        return 1
    print(
        f"quire: data in {cluster.data_dir}, logs in {cluster.data_dir / 'logs'}; "
        "Ctrl-C stops the cluster",
        file=sys.stderr,
        flush=True,
    )
    cluster.run_until_stopped()
    print("quire: stopping", file=sys.stderr, flush=True)
    cluster.stop()
    print(f"quire: stopped ({restarts_summary(cluster.restarts())})", file=sys.stderr, flush=True)
    return 0


def restarts_summary(restarts: dict[str, int]) -> str:
    """What the supervision did while the cluster was up, in one line's words."""
    restarted = [f"{name} {count}" for name, count in restarts.items() if count]
    return "restarts while up: " + (", ".join(restarted) if restarted else "none")
