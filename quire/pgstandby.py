"""A streaming standby of a PostgreSQL primary started by `quire.infra.start_postgres`,
synchronous replication to it, and its promotion: what the metadata failover test drives
and what deploy/postgres/README.md tells an operator to do by hand.

The standby is a physical copy (`pg_basebackup`) that replays the primary's WAL as the
primary streams it, through a replication slot (the primary keeps the WAL the standby has
not yet received, however long it is away). With `synchronous=True` the primary names it
in `synchronous_standby_names`: with `synchronous_commit=on` (the default) a commit is
acknowledged only once the standby has flushed its WAL, so a compare-and-set the metadata
service acknowledged survives the primary's loss. Promotion (`pg_promote`) ends its
recovery: it becomes a primary of its own, with no standby of its own until one is made.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from psycopg.conninfo import make_conninfo
from sqlalchemy.engine import make_url

from quire.infra import (
    PG_DATABASE,
    PG_USER,
    InfraError,
    ManagedProcess,
    _chown_tree,
    _launch_postgres,
    _PostgresDir,
    _run_as,
    _spawn,
    free_port,
    postgres_install,
    usable_postgres_install,
    wait_for_port,
)

REPLICATION_USER = "quire_replication"  # what a standby logs in as: REPLICATION, no more
STANDBY_READY_S = 60.0
WAL_KEEP_SIZE = "1GB"  # the old primary's WAL that pg_rewind may need (see prepare_primary)
POLL_S = 0.05


def address(server: ManagedProcess) -> tuple[str, int]:
    url = make_url(server.url)
    assert url.host is not None and url.port is not None
    return url.host, url.port


def connect(server: ManagedProcess, password: str | None = None, dbname: str = PG_DATABASE):
    """An autocommit psycopg connection to `server` as the superuser."""
    import psycopg

    host, port = address(server)
    return psycopg.connect(
        host=host,
        port=port,
        user=PG_USER,
        password=password,
        dbname=dbname,
        autocommit=True,
        connect_timeout=2,
    )


def prepare_primary(primary: ManagedProcess, slot: str, password: str | None = None) -> None:
    """The replication user (with `password`, the same as the superuser's, when the cluster
    authenticates), a `wal_keep_size` and the physical replication slot `slot` on
    `primary`, each made once. initdb's pg_hba.conf already has the loopback
    `replication` lines."""
    from psycopg import sql

    with connect(primary, password) as conn:
        role = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (REPLICATION_USER,))
        if role.fetchone() is None:
            conn.execute(f"CREATE ROLE {REPLICATION_USER} WITH REPLICATION LOGIN")
        if password:
            conn.execute(
                sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(REPLICATION_USER), sql.Literal(password)
                )
            )
        # pg_rewind reads the old primary's WAL back to the last checkpoint before the
        # servers diverged: keep that much, or a crashed primary cannot be rewound.
        if conn.execute("SHOW wal_keep_size").fetchone() == ("0",):
            conn.execute(f"ALTER SYSTEM SET wal_keep_size = '{WAL_KEEP_SIZE}'")
            conn.execute("SELECT pg_reload_conf()")
        found = conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        if found.fetchone() is None:
            conn.execute("SELECT pg_create_physical_replication_slot(%s)", (slot,))


def start_standby(
    primary: ManagedProcess,
    directory: Path,
    *,
    name: str = "standby",
    port: int | None = None,
    synchronous: bool = True,
    password: str | None = None,
    install: Path | None = None,
    cache_root: Path | None = None,
) -> ManagedProcess:
    """A hot standby of `primary` with its cluster in `directory/data`, streaming through
    the replication slot `name` (lower case letters, digits and underscores, as a slot's
    name must be) under the application name `name`; returned once it
    streams, and (with `synchronous`) once the primary waits for it at each commit.
    Runs as `start_postgres` runs its servers (as 'nobody' when we are root)."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "data").exists():
        raise InfraError(f"{directory / 'data'} exists: a standby starts from a base backup")
    host, primary_port = address(primary)
    prepare_primary(primary, name, password)
    user = _run_as()
    binaries = usable_postgres_install(install or postgres_install(), user, cache_root) / "bin"
    if user:
        _chown_tree(directory, user)
    with _PostgresDir.open(directory, user) as pgdir:
        _run(
            binaries / "pg_basebackup",
            ["-h", host, "-p", str(primary_port), "-U", REPLICATION_USER, "-D", pgdir.data]
            + ["-X", "stream", "-S", name, "--checkpoint=fast", "-w"],
            directory,
            pgdir,
            user,
            password,
        )
    return _follow(primary, binaries, directory, name, port, synchronous, password)


def rejoin_as_standby(
    new_primary: ManagedProcess,
    directory: Path,
    *,
    name: str,
    port: int | None = None,
    synchronous: bool = True,
    password: str | None = None,
    install: Path | None = None,
    cache_root: Path | None = None,
) -> ManagedProcess:
    """Bring an old primary (stopped or crashed; its cluster in `directory/data`) back as
    a standby of `new_primary`, the standby promoted in its place: `pg_rewind` first
    undoes what the old primary wrote that never reached the new one (a crash leaves such
    WAL behind: a commit the standby never confirmed, so never acknowledged), then it
    streams from the new primary like any standby."""
    directory = directory.resolve()
    host, primary_port = address(new_primary)
    prepare_primary(new_primary, name, password)
    user = _run_as()
    binaries = usable_postgres_install(install or postgres_install(), user, cache_root) / "bin"
    source = make_conninfo(
        host=host, port=primary_port, user=PG_USER, password=password, dbname="postgres"
    )
    with _PostgresDir.open(directory, user) as pgdir:
        _run(
            binaries / "pg_rewind",
            ["-D", pgdir.data, "--source-server", source],
            directory,
            pgdir,
            user,
            password,
        )
    return _follow(new_primary, binaries, directory, name, port, synchronous, password)


def _follow(
    primary: ManagedProcess,
    binaries: Path,
    directory: Path,
    name: str,
    port: int | None,
    synchronous: bool,
    password: str | None,
) -> ManagedProcess:
    """Start the copy in `directory/data` as a standby of `primary` and wait until it
    streams (and, with `synchronous`, until the primary waits for it)."""
    host, primary_port = address(primary)
    upstream = make_conninfo(
        host=host,
        port=primary_port,
        user=REPLICATION_USER,
        password=password,
        application_name=name,
    )
    data = directory / "data"
    # Appended after the copied postgresql.auto.conf, so these win. No synchronous
    # standby of its own: promoted, it would wait at every commit for one it lacks.
    with open(data / "postgresql.auto.conf", "a") as conf:
        conf.write(
            f"primary_conninfo = {_quoted(upstream)}\n"
            f"primary_slot_name = {_quoted(name)}\n"
            "hot_standby = on\n"
            "synchronous_standby_names = ''\n"
        )
    (data / "standby.signal").touch()
    user = _run_as()
    if user:
        _chown_tree(directory, user)
    with _PostgresDir.open(directory, user) as pgdir:
        managed = _launch_postgres(
            binaries, directory, pgdir, port or free_port(host), host, name, user, password
        )
    try:
        wait_for_port(host, managed.extra["port"], 30, managed.proc, what="standby postgres")
        _wait_for(lambda: _sync_state(primary, name, password) is not None, f"{name} to stream")
        if synchronous:
            set_synchronous_standbys(primary, [name], password)
            _wait_for(lambda: _sync_state(primary, name, password) == "sync", f"{name} sync")
    except BaseException:
        managed.stop()
        raise
    return managed


def _run(
    binary: Path,
    args: list[str],
    directory: Path,
    pgdir: _PostgresDir,
    user: str | None,
    password: str | None,
) -> None:
    """One of PostgreSQL's client programs, as the server's user; InfraError if it fails."""
    env = {**os.environ, "PGPASSWORD": password} if password else None
    done = _spawn(
        subprocess.run,
        [str(binary), *args],
        user,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=directory,
        env=env,
        pass_fds=pgdir.pass_fds,
    )
    if done.returncode != 0:
        raise InfraError(f"{binary.name} failed ({done.returncode}): {done.stderr.strip()}")


def _quoted(value: str) -> str:
    """A postgresql.conf string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def set_synchronous_standbys(
    primary: ManagedProcess, names: list[str], password: str | None = None
) -> None:
    """Make `primary` wait at each commit for the first of `names` that streams (none:
    asynchronous). A reload, no restart: commits from now on wait."""
    from psycopg import sql

    value = "FIRST 1 (" + ", ".join(f'"{n}"' for n in names) + ")" if names else ""
    with connect(primary, password) as conn:
        conn.execute(
            sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(sql.Literal(value))
        )
        conn.execute("SELECT pg_reload_conf()")
        _wait_for(
            lambda: conn.execute("SHOW synchronous_standby_names").fetchone() == (value,),
            "synchronous_standby_names to take effect",
        )


def replication_status(primary: ManagedProcess, password: str | None = None) -> list[dict]:
    """pg_stat_replication on `primary`: each standby's name, state, sync state and how far
    behind it is (bytes of WAL not yet replayed, and the lags PostgreSQL measured)."""
    from psycopg.rows import dict_row

    with connect(primary, password) as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT application_name, state, sync_state,"
            " pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn) AS replay_lag_bytes,"
            " write_lag, flush_lag, replay_lag"
            " FROM pg_stat_replication ORDER BY application_name"
        ).fetchall()


def _sync_state(primary: ManagedProcess, name: str, password: str | None) -> str | None:
    for row in replication_status(primary, password):
        if row["application_name"] == name and row["state"] == "streaming":
            return row["sync_state"]
    return None


def promote(standby: ManagedProcess, password: str | None = None, timeout_s: int = 60) -> None:
    """End the standby's recovery: from now on it is a primary that takes writes. The old
    primary must be fenced first (stopped, or cut off from clients): two primaries would
    each take compare-and-sets the other never sees."""
    with connect(standby, password) as conn:
        row = conn.execute("SELECT pg_promote(true, %s)", (timeout_s,)).fetchone()
        if row != (True,):
            raise InfraError(f"{standby.name} was not promoted within {timeout_s} s")


def is_primary(server: ManagedProcess, password: str | None = None) -> bool:
    with connect(server, password) as conn:
        return conn.execute("SELECT NOT pg_is_in_recovery()").fetchone() == (True,)


def kill_hard(server: ManagedProcess) -> None:
    """SIGKILL to the server and every backend at once (its process group), as when its
    host dies: no shutdown checkpoint, no goodbye to clients or standbys."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.proc.wait(timeout=10)


def _wait_for(condition: Any, what: str, timeout_s: float = STANDBY_READY_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise InfraError(f"timed out waiting for {what}")
        time.sleep(POLL_S)
