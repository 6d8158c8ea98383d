"""A TCP fault proxy: the fault suite's network partitions.

One listener per service process stands between it and NATS (and, for the metadata service,
PostgreSQL). With one NATS server every path between two processes goes through the bus, so
cutting a process's listener cuts it off from every other process. A proxy needs no root and
no extra package (this machine has no nftables, CI machines may not be root) and leaves
nothing behind in the kernel when a run dies; network namespaces come with several NATS nodes
(issue 19).

A listener is in one of three states:
- open: bytes are forwarded both ways;
- partitioned (a blackhole): established connections stay up but nothing is forwarded either
  way, and new connections are accepted and hang, as across a cut link. What a side sent is
  held (the proxy stops reading, so TCP's own flow control pushes back) and delivered on heal,
  as TCP's retransmissions would once the link is back;
- reset: every connection is closed and new ones are refused (accepted and closed at once),
  as when the peer's host is up but its port is not.

The proxy runs an asyncio loop in a thread of its own; its methods are called from any other
thread and wait for the loop to have done what they ask.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import uvloop

CHUNK = 65536
CALL_TIMEOUT_S = 10.0

OPEN = "open"
PARTITIONED = "partitioned"
RESET = "reset"


@dataclass
class _Listener:
    name: str
    upstream: tuple[str, int]
    server: asyncio.Server | None = None
    state: str = OPEN
    # Set while the listener forwards; pumps and new connections wait on it while partitioned.
    passing: asyncio.Event = field(default_factory=asyncio.Event)
    connections: set[_Connection] = field(default_factory=set)
    accepted: int = 0
    refused: int = 0
    upstream_failures: int = 0
    bytes_up: int = 0  # from the service to the upstream server
    bytes_down: int = 0


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)

    def end(self, abort: bool = False) -> None:
        """Close both sides: at once (`abort`, what a reset does) or after what is buffered
        has been written (one side closed: the other sees it close too)."""
        for task in self.tasks:
            task.cancel()
        for writer in (self.client, self.upstream):
            if writer is not None:
                if abort:
                    writer.transport.abort()
                else:
                    writer.close()


class FaultProxy:
    """Listeners by name, each forwarding to one upstream (host, port)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._listeners: dict[str, _Listener] = {}
        # uvloop: every byte of the cluster's bus traffic goes through this one thread.
        self._loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CALL_TIMEOUT_S)

    # -- the runner's side --------------------------------------------------------------

    def listen(self, name: str, upstream: tuple[str, int]) -> int:
        """A new listener `name` forwarding to `upstream`; its port (on `host`)."""
        return self._call(self._listen(name, upstream))

    def port(self, name: str) -> int:
        server = self._listeners[name].server
        assert server is not None
        return server.sockets[0].getsockname()[1]

    def names(self) -> list[str]:
        return list(self._listeners)

    def partition(self, name: str) -> None:
        self._call(self._set_state(name, PARTITIONED))

    def reset(self, name: str) -> None:
        self._call(self._set_state(name, RESET))

    def heal(self, name: str) -> None:
        self._call(self._set_state(name, OPEN))

    def state(self, name: str) -> str:
        return self._listeners[name].state

    def stats(self) -> dict[str, dict[str, Any]]:
        return self._call(self._stats())

    def close(self) -> None:
        """Close every listener and connection and end the loop's thread."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- in the loop --------------------------------------------------------------------

    async def _listen(self, name: str, upstream: tuple[str, int]) -> int:
        if name in self._listeners:
            raise ValueError(f"a listener named {name!r} exists already")
        listener = _Listener(name, upstream)
        listener.passing.set()
        listener.server = await asyncio.start_server(
            lambda r, w: self._accept(listener, r, w), self.host, 0
        )
        self._listeners[name] = listener
        return listener.server.sockets[0].getsockname()[1]

    async def _set_state(self, name: str, state: str) -> None:
        listener = self._listeners[name]
        listener.state = state
        if state == OPEN:
            listener.passing.set()
            return
        listener.passing.clear()
        if state == RESET:
            for conn in list(listener.connections):
                conn.end(abort=True)
            listener.connections.clear()

    async def _accept(
        self, listener: _Listener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if listener.state == RESET:
            listener.refused += 1
            writer.transport.abort()
            return
        listener.accepted += 1
        conn = _Connection(writer)
        listener.connections.add(conn)
        try:
            # Across a cut link the connection is not even made: the client waits (and its
            # connect timeout decides) until the link is healed.
            await listener.passing.wait()
            try:
                up_reader, up_writer = await asyncio.open_connection(*listener.upstream)
            except OSError:
                listener.upstream_failures += 1
                return
            conn.upstream = up_writer
            conn.tasks = [
                asyncio.create_task(self._pump(listener, reader, up_writer, "bytes_up")),
                asyncio.create_task(self._pump(listener, up_reader, writer, "bytes_down")),
            ]
            # Either side closing ends both: the other pump's writer is closed below.
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            listener.connections.discard(conn)
            conn.end()

    async def _pump(
        self,
        listener: _Listener,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        counter: str,
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                # Not reading while partitioned leaves what a side sends in the kernel's
                # buffers, then pushes back on the sender, as an unanswered TCP peer does.
                await listener.passing.wait()
                data = await reader.read(CHUNK)
                if not data:
                    return
                await listener.passing.wait()
                writer.write(data)
                setattr(listener, counter, getattr(listener, counter) + len(data))
                await writer.drain()

    async def _stats(self) -> dict[str, dict[str, Any]]:
        return {
            name: {
                "state": lst.state,
                "upstream": f"{lst.upstream[0]}:{lst.upstream[1]}",
                "open_connections": len(lst.connections),
                "accepted": lst.accepted,
                "refused": lst.refused,
                "upstream_failures": lst.upstream_failures,
                "bytes_up": lst.bytes_up,
                "bytes_down": lst.bytes_down,
            }
            for name, lst in self._listeners.items()
        }

    async def _close(self) -> None:
        for listener in self._listeners.values():
            if listener.server is not None:
                listener.server.close()
            for conn in list(listener.connections):
                conn.end(abort=True)
            listener.connections.clear()
