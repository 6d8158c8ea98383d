"""A streaming standby of a PostgreSQL primary started by `quire.infra.start_postgres`,
synchronous replication to it, its promotion, and an old primary's return as a standby
(pg_rewind): what `quire up --postgres-standby` and the metadata failover test drive, and
what deploy/postgres/README.md tells an operator to do by hand.

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
from sqlalchemy.engine import URL, make_url

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
REWIND_USER = "quire_rewind"  # pg_rewind's source connection: reading files, no more
REWIND_DATABASE = "postgres"
# What pg_rewind calls on its source server (PostgreSQL's documented grants for a
# non-superuser; deploy/postgres/roles.sql), granted in the database it connects to.
REWIND_FUNCTIONS = (
    "pg_catalog.pg_ls_dir(text, boolean, boolean)",
    "pg_catalog.pg_stat_file(text, boolean)",
    "pg_catalog.pg_read_binary_file(text)",
    "pg_catalog.pg_read_binary_file(text, bigint, bigint, boolean)",
)
STANDBY_READY_S = 60.0
WAL_KEEP_SIZE = "1GB"  # the old primary's WAL that pg_rewind may need (see prepare_primary)
POLL_S = 0.05


def address(server: ManagedProcess) -> tuple[str, int]:
    url = make_url(server.url)
    assert url.host is not None and url.port is not None
    return url.host, url.port


def failover_url(url: str, servers: list[ManagedProcess]) -> str:
    """`url` (of one of `servers`) naming them all, in order, and settling only on the
    one that takes writes (deploy/postgres/README.md: the multi-host form)."""
    base = make_url(url)
    hosts = tuple(f"{host}:{port}" for host, port in map(address, servers))
    return URL.create(
        base.drivername,
        username=base.username,
        password=base.password,
        database=base.database,
        query={**base.query, "host": hosts, "target_session_attrs": "read-write"},
    ).render_as_string(hide_password=False)


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
    """The replication and rewind users (with `password`, the same as the superuser's,
    when the cluster authenticates), a `wal_keep_size` and the physical replication slot
    `slot` on `primary`, each made once. initdb's pg_hba.conf already lets them in on
    loopback."""
    from psycopg import sql

    with connect(primary, password) as conn:
        for role, attributes in ((REPLICATION_USER, "REPLICATION LOGIN"), (REWIND_USER, "LOGIN")):
            found = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
            if found.fetchone() is None:
                conn.execute(f"CREATE ROLE {role} WITH {attributes}")
            if password:
                conn.execute(
                    sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                        sql.Identifier(role), sql.Literal(password)
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
    # A function's grants belong to one database: the one pg_rewind connects to.
    with connect(primary, password, dbname=REWIND_DATABASE) as conn:
        for function in REWIND_FUNCTIONS:
            conn.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {REWIND_USER}")


def start_standby(
    primary: ManagedProcess,
    directory: Path,
    *,
    name: str = "standby",
    port: int | None = None,
    host: str | None = None,
    synchronous: bool = True,
    password: str | None = None,
    install: Path | None = None,
    cache_root: Path | None = None,
) -> ManagedProcess:
    """A hot standby of `primary` with its cluster in `directory/data`, streaming through
    the replication slot `name` (lower case letters, digits and underscores, as a slot's
    name must be) under the application name `name`; returned once it streams, and (with
    `synchronous`) once the primary waits for it at each commit (until it streams, the
    primary waits for no standby). It listens on `host` (default: the primary's). Runs as
    `start_postgres` runs its servers (as 'nobody' when we are root)."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "data").exists():
        raise InfraError(f"{directory / 'data'} exists: a standby starts from a base backup")
    primary_host, primary_port = address(primary)
    # A standby of that name made before and gone would make every commit wait, the ones
    # preparing this standby included: none is waited for until this one streams.
    set_synchronous_standbys(primary, [], password)
    prepare_primary(primary, name, password)
    user = _run_as()
    binaries = usable_postgres_install(install or postgres_install(), user, cache_root) / "bin"
    if user:
        _chown_tree(directory, user)
    with _PostgresDir.open(directory, user) as pgdir:
        _run(
            binaries / "pg_basebackup",
            ["-h", primary_host, "-p", str(primary_port), "-U", REPLICATION_USER, "-D", pgdir.data]
            + ["-X", "stream", "-S", name, "--checkpoint=fast", "-w"],
            directory,
            pgdir,
            user,
            password,
        )
    return _follow(primary, binaries, directory, name, port, host, synchronous, password)


def rejoin_as_standby(
    new_primary: ManagedProcess,
    directory: Path,
    *,
    name: str,
    port: int | None = None,
    host: str | None = None,
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
    primary_host, primary_port = address(new_primary)
    set_synchronous_standbys(new_primary, [], password)  # as start_standby says why
    prepare_primary(new_primary, name, password)
    user = _run_as()
    binaries = usable_postgres_install(install or postgres_install(), user, cache_root) / "bin"
    # The password goes by PGPASSWORD (`_run`), not on a command line others can read.
    source = make_conninfo(
        host=primary_host, port=primary_port, user=REWIND_USER, dbname=REWIND_DATABASE
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
    return _follow(new_primary, binaries, directory, name, port, host, synchronous, password)


def resume_standby(
    primary: ManagedProcess,
    directory: Path,
    *,
    name: str = "standby",
    port: int | None = None,
    host: str | None = None,
    password: str | None = None,
    wait_streaming: bool = True,
    install: Path | None = None,
    cache_root: Path | None = None,
) -> ManagedProcess:
    """The standby `start_standby` made in `directory/data` started again, following
    `primary` where it listens now (its port may have changed since); with
    `wait_streaming`, returned once it streams (else once it listens: it keeps trying to
    reach the primary by itself)."""
    directory = directory.resolve()
    if not (directory / "data" / "standby.signal").exists():
        raise InfraError(
            f"{directory / 'data'} is not a standby (promoted?): remove it to make a new one"
        )
    user = _run_as()
    binaries = usable_postgres_install(install or postgres_install(), user, cache_root) / "bin"
    managed = _launch_standby(primary, binaries, directory, name, port, host, password)
    try:
        if wait_streaming:
            _wait_for(lambda: _sync_state(primary, name, password) is not None, f"{name} to stream")
    except BaseException:
        managed.stop()
        raise
    return managed


def forget_standby(primary: ManagedProcess, name: str, password: str | None = None) -> None:
    """`primary` on its own: no synchronous standby to wait for, and no slot keeping WAL
    for `name`."""
    with connect(primary, password) as conn:
        if conn.execute("SHOW synchronous_standby_names").fetchone() != ("",):
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            conn.execute("SELECT pg_reload_conf()")
        found = conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (name,))
        if found.fetchone() is not None:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))


def _follow(
    primary: ManagedProcess,
    binaries: Path,
    directory: Path,
    name: str,
    port: int | None,
    host: str | None,
    synchronous: bool,
    password: str | None,
) -> ManagedProcess:
    """Start the copy in `directory/data` as a standby of `primary` and wait until it
    streams (and, with `synchronous`, until the primary waits for it)."""
    (directory / "data" / "standby.signal").touch()
    managed = _launch_standby(primary, binaries, directory, name, port, host, password)
    try:
        _wait_for(lambda: _sync_state(primary, name, password) is not None, f"{name} to stream")
        if synchronous:
            set_synchronous_standbys(primary, [name], password)
            _wait_for(lambda: _sync_state(primary, name, password) == "sync", f"{name} sync")
    except BaseException:
        managed.stop()
        raise
    return managed


# The settings that make a copy a standby of a primary, in its postgresql.auto.conf.
STANDBY_SETTINGS = (
    "primary_conninfo",
    "primary_slot_name",
    "hot_standby",
    "synchronous_standby_names",
)


def _launch_standby(
    primary: ManagedProcess,
    binaries: Path,
    directory: Path,
    name: str,
    port: int | None,
    host: str | None,
    password: str | None,
) -> ManagedProcess:
    """Point the copy in `directory/data` at `primary` and start it, listening on `host`
    (default: the primary's, as on one machine); returned once it listens."""
    primary_host, primary_port = address(primary)
    host = host or primary_host
    upstream = make_conninfo(
        host=primary_host,
        port=primary_port,
        user=REPLICATION_USER,
        password=password,
        application_name=name,
    )
    auto_conf = directory / "data" / "postgresql.auto.conf"
    # Ours replace any earlier (the primary's, copied; or ours, for an older primary
    # port). No synchronous standby of its own: promoted, it would wait at every commit
    # for one it lacks.
    kept = [
        line
        for line in auto_conf.read_text().splitlines()
        if line.split("=", 1)[0].strip() not in STANDBY_SETTINGS
    ]
    auto_conf.write_text(
        "\n".join(kept) + f"\nprimary_conninfo = {_quoted(upstream)}\n"
        f"primary_slot_name = {_quoted(name)}\n"
        "hot_standby = on\n"
        "synchronous_standby_names = ''\n"
    )
    user = _run_as()
    if user:
        _chown_tree(directory, user)
    with _PostgresDir.open(directory, user) as pgdir:
        managed = _launch_postgres(
            binaries, directory, pgdir, port or free_port(host), host, name, user, password
        )
    try:
        wait_for_port(host, managed.extra["port"], 30, managed.proc, what="standby postgres")
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
