"""Drive `quire up` as a user would: a real process tree, its ready line, its cluster.json."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from quire.infra import free_port

READY_PREFIX = "quire: gateway ready at "


def quire_executable() -> str:
    return str(Path(sysconfig.get_path("scripts")) / "quire")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


@dataclass
class QuireUp:
    data_dir: Path
    bookies: int = 4
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    restart: bool = True  # False: `--no-restart`, for a test that kills a process for good
    args: list[str] = field(default_factory=list)  # more options of `quire up`
    proc: subprocess.Popen | None = None
    ready_line: str = ""
    stderr_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self, timeout_s: float = 180.0) -> None:
        self.stderr_path = self.data_dir.parent / f"{self.data_dir.name}-quire-up.stderr"
        env = {**os.environ, **self.env}
        env.pop("QUIRE_NATS_URL", None)
        env.pop("QUIRE_DATABASE_URL", None)
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                [
                    quire_executable(),
                    "up",
                    "--data-dir",
                    str(self.data_dir),
                    "--bookies",
                    str(self.bookies),
                    "--http-port",
                    str(self.http_port),
                    "--grpc-port",
                    str(self.grpc_port),
                    *([] if self.restart else ["--no-restart"]),
                    *self.args,
                ],
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
                text=True,
            )
        assert self.proc.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not selector.select(timeout=0.5):
                if self.proc.poll() is not None:
                    break
                continue
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith(READY_PREFIX):
                self.ready_line = line.rstrip("\n")
                return
        raise AssertionError(f"quire up did not become ready:\n{self.stderr()}")

    @contextlib.contextmanager
    def running(self) -> Iterator[QuireUp]:
        """Started, then stopped as a user would (SIGTERM); whatever a test left running
        (it may have killed `quire up` itself) is killed."""
        self.start()
        try:
            yield self
        finally:
            if self.proc and self.proc.poll() is None:
                self.stop()
            if (self.data_dir / "cluster.json").exists():
                for pid in self.pids():
                    if pid_alive(pid):
                        os.kill(pid, signal.SIGKILL)

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path else ""

    def cluster_json(self) -> dict:
        return json.loads((self.data_dir / "cluster.json").read_text())

    def pids(self) -> list[int]:
        """The processes of cluster.json that are up (a row's pid is null while its
        process is down, waiting for its restart)."""
        return [row["pid"] for row in self.cluster_json()["services"] if row["pid"] is not None]

    def stop(self, timeout_s: float = 90.0) -> int:
        """SIGTERM, as a user's Ctrl-C would; the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            if self.proc.stdout:
                self.proc.stdout.close()

    def kill_everything(self) -> list[int]:
        """kill -9 of quire up and of every process it started, all at once."""
        assert self.proc is not None
        pids = [self.proc.pid, *self.pids()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
        if self.proc.stdout:
            self.proc.stdout.close()
        wait_gone(pids)
        return pids

    async def nats_connect(self, **kwargs):
        """A nats-py client of the cluster's NATS, with its generated credentials."""
        import nats

        from quire.cluster import nats_credentials
        from shared.config import nats_servers

        credentials = nats_credentials(self.data_dir)
        assert credentials is not None, "quire up made no NATS credentials"
        user, password = credentials
        servers = nats_servers(self.cluster_json()["nats_url"])
        return await nats.connect(servers=servers, user=user, password=password, **kwargs)

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30.0, **kwargs)


def wait_gone(pids: list[int], timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if pid_alive(pid)]
        if alive:
            time.sleep(0.1)
    return alive


def python() -> str:
    return sys.executable
