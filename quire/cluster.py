"""`quire up`: a whole Quire cluster on this machine, in the foreground.

Starts NATS and PostgreSQL (unless QUIRE_NATS_URL / QUIRE_DATABASE_URL name existing
ones), then the metadata service, N bookies (a journal and a ledgerstore each), the
auditor, the replicator and the gateway, each as its own process. It prints the ready
line once the gateway answers /readyz, keeps DIR/cluster.json up to date, reports a
process that dies (the rest keeps serving), and on SIGINT or SIGTERM stops everything
in order: gateway first, PostgreSQL and NATS last.

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
from dataclasses import dataclass, field
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

READY_TIMEOUT_S = 120.0
MONITOR_INTERVAL_S = 0.5


@dataclass
class ClusterConfig:
    data_dir: Path
    bookies: int = 4
    http_port: int = 7480
    grpc_port: int = 7481
    host: str = "127.0.0.1"
    nats_url: str | None = None  # existing NATS, from QUIRE_NATS_URL
    database_url: str | None = None  # existing PostgreSQL, from QUIRE_DATABASE_URL
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def bookie_ids(self) -> list[str]:
        return [f"bookie-{i}" for i in range(1, self.bookies + 1)]


@dataclass
class ServiceProcess:
    name: str
    kind: str
    proc: subprocess.Popen
    bookie_id: str | None = None
    log_path: Path | None = None
    reported_dead: bool = False
    metrics_port: int | None = None  # its Prometheus metrics server (the gateway: HTTP port)


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
        self.nats_url = config.nats_url or ""
        # Our own NATS requires a user and password, generated once per data dir.
        self.nats_credentials: tuple[str, str] | None = None
        self.database_url = config.database_url or ""
        self.services: list[ServiceProcess] = []
        self._lock_file: IO[str] | None = None
        self._stopping = threading.Event()

    # -- start --------------------------------------------------------------------------

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        (self.data_dir / "logs").mkdir(exist_ok=True)
        try:
            if not self.nats_url:
                self.nats_credentials = nats_credentials(self.data_dir, create=True)
                self.nats = start_nats(
                    self.data_dir / "nats",
                    host=self.config.host,
                    credentials=self.nats_credentials,
                )
                self.nats_url = self.nats.url
            if not self.database_url:
                _, password = postgres_credentials(self.data_dir, create=True) or ("", "")
                self.postgres = start_postgres(
                    self.data_dir / "postgres", host=self.config.host, password=password
                )
                self.database_url = self.postgres.url
            self._spawn("metadata", "metadata")
            for bookie_id in self.config.bookie_ids:
                (self.data_dir / bookie_id).mkdir(exist_ok=True)
                self._spawn(f"{bookie_id}.journal", "journal", bookie_id)
                self._spawn(f"{bookie_id}.ledgerstore", "ledgerstore", bookie_id)
            self._spawn("auditor", "auditor")
            self._spawn("replicator", "replicator")
            self._spawn("gateway", "gateway")
            self.write_cluster_json()
            self.write_targets_json()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _lock_data_dir(self) -> None:
        self._lock_file = open(self.data_dir / ".lock", "w")  # noqa: SIM115 (held while up)
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InfraError(f"another `quire up` is running on {self.data_dir}") from None

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
        # Every process keeps its spans in the cluster's span store (`quire trace show`),
        # exported within half a second rather than the SDK's 5 s.
        env["QUIRE_TRACES_DIR"] = str(self.data_dir / "traces")
        env.setdefault("OTEL_BSP_SCHEDULE_DELAY", "500")
        env.update(self.config.extra_env)
        if bookie_id:
            env["QUIRE_BOOKIE_ID"] = bookie_id
        return env

    def _spawn(self, name: str, kind: str, bookie_id: str | None = None) -> None:
        log_path = self.data_dir / "logs" / f"{name}.log"
        env = self._env(bookie_id)
        metrics_port = self.config.http_port
        if kind != "gateway":  # the gateway serves /metrics on its HTTP port
            # A port free now, closed before the process binds it: another program could
            # take it in between, which on a developer's machine is rare enough; the
            # process would then fail to start, reported like any other that dies.
            metrics_port = free_port(self.config.host)
            env["QUIRE_METRICS_PORT"] = str(metrics_port)
            env["QUIRE_METRICS_HOST"] = self.config.host
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                **ended_with_parent([sys.executable, "-m", f"services.{kind}"]),
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.services.append(
            ServiceProcess(name, kind, proc, bookie_id, log_path, metrics_port=metrics_port)
        )

    @property
    def http_url(self) -> str:
        scheme = "https" if self._tls else "http"
        return f"{scheme}://{self.config.host}:{self.config.http_port}"

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
        deadline = time.monotonic() + READY_TIMEOUT_S
        # The probe is our own, on loopback: it need not verify our certificate.
        with httpx.Client(timeout=2.0, verify=False) as client:
            while time.monotonic() < deadline:
                gateway = self.service("gateway")
                if gateway.proc.poll() is not None:
                    raise InfraError(
                        f"the gateway exited ({gateway.proc.returncode}); see {gateway.log_path}"
                    )
                try:
                    if client.get(f"{self.http_url}/readyz").status_code == 200:
                        print(
                            f"quire: gateway ready at {self.http_url} (grpc {self.grpc_address})"
                            f"; {self.auth_note}",
                            file=self.out,
                            flush=True,
                        )
                        return
                except httpx.HTTPError:
                    pass
                self.check_processes()
                time.sleep(0.2)
        raise InfraError(
            f"the gateway was not ready within {READY_TIMEOUT_S:.0f} s; "
            f"see the logs in {self.data_dir / 'logs'}"
        )

    def service(self, name: str) -> ServiceProcess:
        return next(s for s in self.services if s.name == name)

    # -- cluster.json -------------------------------------------------------------------

    def cluster_info(self) -> dict:
        rows = []
        for managed in (self.nats, self.postgres):
            if managed is not None:
                rows.append(
                    {
                        "name": managed.name,
                        "kind": managed.kind,
                        "bookie_id": None,
                        "pid": managed.pid,
                    }
                )
        rows.extend(
            {
                "name": s.name,
                "kind": s.kind,
                "bookie_id": s.bookie_id,
                "pid": s.proc.pid,
                "log": str(s.log_path),
                "metrics": self.metrics_url(s),
            }
            for s in self.services
        )
        return {
            "gateway": {
                "http": self.http_url,
                "grpc": self.grpc_address,
                "pid": self.service("gateway").proc.pid,
            },
            "nats_url": self.nats_url,
            "database_url": without_password(self.database_url),
            "data_dir": str(self.data_dir),
            "pid": os.getpid(),
            "services": rows,
        }

    def write_cluster_json(self) -> None:
        _write_json(self.data_dir / "cluster.json", self.cluster_info())

    # -- prometheus/targets.json ---------------------------------------------------------

    def metrics_url(self, svc: ServiceProcess) -> str | None:
        if svc.metrics_port is None:
            return None
        if svc.kind == "gateway":
            return f"{self.http_url}/metrics"
        return f"http://{self.config.host}:{svc.metrics_port}/metrics"

    def scrape_targets(self) -> list[dict]:
        """Prometheus file-based service discovery: one target a process, labelled with
        its service, bookie and instance name."""
        targets = []
        for svc in self.services:
            if svc.metrics_port is None:
                continue
            labels = {"service": svc.kind, "instance": svc.name}
            if svc.bookie_id is not None:
                labels["bookie_id"] = svc.bookie_id
            targets.append(
                {"targets": [f"{self.config.host}:{svc.metrics_port}"], "labels": labels}
            )
        return targets

    def write_targets_json(self, targets: list[dict] | None = None) -> None:
        """DIR/prometheus/targets.json: written once the processes are started (their set
        and ports do not change while the cluster is up), emptied when it stops."""
        path = self.data_dir / "prometheus" / "targets.json"
        path.parent.mkdir(exist_ok=True)
        _write_json(path, self.scrape_targets() if targets is None else targets)

    # -- running ------------------------------------------------------------------------

    def check_processes(self) -> list[str]:
        """Report (once) every process that died; the others keep serving."""
        died = []
        for svc in self.services:
            code = svc.proc.poll()
            if code is not None and not svc.reported_dead:
                svc.reported_dead = True
                died.append(svc.name)
                print(
                    f"quire: {svc.name} (pid {svc.proc.pid}) exited with code {code}; "
                    f"see {svc.log_path}",
                    file=self.err,
                    flush=True,
                )
        for managed in (self.nats, self.postgres):
            if managed is not None and not managed.alive() and managed.name not in died:
                if not getattr(managed, "reported_dead", False):
                    managed.reported_dead = True  # type: ignore[attr-defined]
                    died.append(managed.name)
                    print(
                        f"quire: {managed.name} (pid {managed.pid}) exited with code "
                        f"{managed.proc.returncode}; see {managed.log_path}",
                        file=self.err,
                        flush=True,
                    )
        return died

    def run_until_stopped(self) -> None:
        while not self._stopping.wait(MONITOR_INTERVAL_S):
            self.check_processes()

    def request_stop(self) -> None:
        self._stopping.set()

    # -- stop ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop in dependency order: gateway, auditor and replicator, ledgerstores,
        journals, metadata, then PostgreSQL and NATS."""
        self._stopping.set()
        order = ["gateway", "auditor", "replicator", "ledgerstore", "journal", "metadata"]
        for kind in order:
            group = [s for s in self.services if s.kind == kind]
            for svc in group:
                if svc.proc.poll() is None:
                    svc.proc.send_signal(signal.SIGTERM)
            for svc in group:
                try:
                    svc.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    print(f"quire: {svc.name} did not stop in time; killing it", file=self.err)
                    svc.proc.kill()
                    svc.proc.wait(timeout=10)
        for managed in (self.postgres, self.nats):
            if managed is not None:
                managed.stop()
        (self.data_dir / "cluster.json").unlink(missing_ok=True)
        if (self.data_dir / "prometheus" / "targets.json").exists():
            self.write_targets_json([])  # nothing to scrape any more
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


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
    print("quire: stopped", file=sys.stderr, flush=True)
    return 0
