"""The NATS service runner every Quire service stands on.

It connects to NATS (retrying, then reconnecting forever), registers a `nats.micro`
service (so `$SRV.PING`, `$SRV.INFO` and `$SRV.STATS` find it), serves endpoints with a
bound on requests in flight, publishes events, and on SIGTERM or SIGINT drains: stop
taking requests, finish the ones in flight, run the service's own shutdown steps, flush
events, close the connection. A handler that raises is logged and answered with a
micro error; it never takes the service down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import nats
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from nats.micro import add_service
from nats.micro.request import ERROR_CODE_HEADER, ERROR_HEADER, Request
from nats.micro.service import EndpointConfig, Service

from shared import __version__, clock
from shared.aio import cancel_all
from shared.config import QuireSettings, load_settings, nats_servers
from shared.events import EventPublisher, ensure_event_stream
from shared.gc_tuning import tune_gc
from shared.logs import setup_logging
from shared.natsfast import Deliver, subscribe_lean, unsubscribe_lean
from shared.subjects import Subjects
from shared.telemetry import nats_server_span, setup_tracing, shutdown_tracing

log = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[None]]
# A lean endpoint's handler (`ServiceRuntime.add_lean_endpoint`): reply subject (b"" if
# none), payload, headers (None if none); synchronous.
LeanHandler = Callable[[bytes, bytes, "dict[str, str] | None"], None]
ShutdownStep = Callable[[], Awaitable[None]]

CONNECT_DEADLINE_S = 60.0
# A link to the NATS server that breaks without closing (packets dropped: a partition, a
# host gone) is seen only by unanswered pings: after MAX_OUTSTANDING_PINGS of them the
# client reconnects, to another server of the cluster if it has one. nats-py's defaults
# (every 120 s, 2 outstanding) left a service deaf for minutes on a cluster that had others.
PING_INTERVAL_S = 3
MAX_OUTSTANDING_PINGS = 3
DRAIN_TIMEOUT_S = 10.0
SHUTDOWN_STEP_TIMEOUT_S = 30.0
HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_STALE_S = 10.0  # /healthz fails beyond: the event loop is stuck


def nats_options(settings: QuireSettings) -> dict[str, Any]:
    """Credentials and TLS for nats.connect, from the settings (never logged)."""
    options: dict[str, Any] = {}
    if settings.nats_user:
        options["user"] = settings.nats_user
        options["password"] = settings.nats_password.get_secret_value()
    if settings.nats_nkey_seed_file:
        options["nkeys_seed"] = str(settings.nats_nkey_seed_file)
    if settings.nats_tls_ca_file:
        options["tls"] = ssl.create_default_context(cafile=str(settings.nats_tls_ca_file))
    return options


async def connect_nats(
    settings: QuireSettings, name: str, deadline_s: float = CONNECT_DEADLINE_S
) -> NatsClient:
    """Connect, retrying while the server is not up yet; later losses reconnect forever, to
    any server of `settings.nats_url` (several when NATS is a cluster) or one the cluster
    told of. A refused authorization is not retried: it will not get better."""
    give_up_at = time.monotonic() + deadline_s
    while True:
        try:
            return await nats.connect(
                servers=nats_servers(settings.nats_url),
                # In the order given (the nearest server first), not shuffled.
                dont_randomize=True,
                name=name,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                ping_interval=PING_INTERVAL_S,
                max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                connect_timeout=2,
                allow_reconnect=True,
                **nats_options(settings),
            )
        except nats.errors.AuthorizationError:
            raise
        except Exception as exc:
            if time.monotonic() > give_up_at:
                raise
            log.info(
                "waiting for NATS",
                extra={"url": redact_nats_url(settings.nats_url), "err": repr(exc)},
            )
            await asyncio.sleep(0.3)


def redact_nats_url(url: str) -> str:
    """A NATS URL setting (one server or several, comma-separated) without passwords."""
    return ",".join(redact_url(server) for server in nats_servers(url))


def redact_url(url: str) -> str:
    """`url` without any password in it, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return parts._replace(netloc=netloc).geturl()


def _guarded(name: str, subject: str, handler: Handler, own_span: bool = False) -> Handler:
    """`handler` that never lets an exception reach the NATS subscription: it is logged and
    answered with a micro error (a malformed message never takes the service down). It runs
    in a SERVER span when the request carries a sampled `traceparent` (the span records the
    exception); a request without headers costs one attribute read. `own_span`: the
    handler opens and ends that span itself (it answers after it returns)."""

    async def guarded(request: Request) -> None:
        try:
            if own_span:
                await handler(request)
            else:
                with nats_server_span(subject, request.headers):
                    await handler(request)
        except Exception:
            log.exception("handler failed", extra={"endpoint": name})
            with contextlib.suppress(Exception):
                await request.respond_error("500", "internal error")

    return guarded


class ServiceRuntime:
    def __init__(
        self,
        kind: str,
        settings: QuireSettings,
        instance: str,
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.settings = settings
        self.instance = instance
        self.subjects = Subjects(settings.subject_prefix)
        self.metadata = dict(metadata or {})
        self.nc: NatsClient
        self.micro: Service
        self.events: EventPublisher
        self._stop = asyncio.Event()
        self._shutdown_steps: list[ShutdownStep] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._in_flight: set[asyncio.Future[Any]] = set()  # request tasks, `hold`s
        self._lean_subs: list[Subscription] = []  # add_lean_endpoint's
        # For the probes (`health`, `readiness`), read from the metrics server's thread:
        # when the event loop last ran the heartbeat, and whether `main` has set the
        # service up (a journal's replay, a metadata service's schema...).
        self._heartbeat = time.monotonic()
        self.started = False

    async def start(self) -> None:
        self.nc = await connect_nats(self.settings, self.instance)
        js = self.nc.jetstream()
        await ensure_event_stream(js, self.subjects, self.settings.event_stream_replicas)
        self.events = EventPublisher(js, self.subjects, source=self.instance)
        self.events.start()
        self.spawn(self._beat(), "heartbeat")
        self.micro = await add_service(
            self.nc,
            name=f"quire-{self.kind}",
            version=__version__,
            description=f"Quire {self.kind} ({self.instance})",
            metadata={"instance": self.instance, "pid": str(os.getpid()), **self.metadata},
        )

    async def add_endpoint(
        self,
        name: str,
        subject: str,
        handler: Handler,
        *,
        queue_group: str | None = None,
        max_in_flight: int = 256,
    ) -> None:
        """Serve `subject`. Requests run as tasks, at most `max_in_flight` at once, started
        in arrival order (a handler's synchronous prefix runs in that order)."""
        slots = asyncio.Semaphore(max_in_flight)

        guarded = _guarded(name, subject, handler)

        async def serve(request: Request) -> None:
            try:
                await guarded(request)
            finally:
                slots.release()

        async def dispatch(request: Request) -> None:
            await slots.acquire()
            task = asyncio.create_task(serve(request))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

        await self.micro.add_endpoint(
            EndpointConfig(
                name=name,
                subject=subject,
                handler=dispatch,
                queue_group=queue_group or f"q-{subject}",
            )
        )

    async def add_inline_endpoint(
        self, name: str, subject: str, handler: Handler, *, own_span: bool = False
    ) -> None:
        """Serve `subject` by calling `handler` on the subscription's own task, in arrival
        order, for a handler that never waits for work: it answers at once, or hands the
        request to a bounded queue of its own, which serves it and drains it at shutdown
        (see `on_shutdown`), or answers it from a callback on a future it gives `hold` (the
        drain waits for it). Requests beyond `add_endpoint`'s `max_in_flight` wait in the
        subscription's pending queue instead, unbounded and past their senders' timeouts,
        unless the handler bounds them itself. `own_span`: the handler opens and ends the
        request's SERVER span itself (`shared.telemetry.start_nats_server_span`)."""
        await self.micro.add_endpoint(
            EndpointConfig(
                name=name,
                subject=subject,
                handler=_guarded(name, subject, handler, own_span),
                queue_group=f"q-{subject}",
            )
        )

    async def add_lean_endpoint(self, name: str, subject: str, handler: LeanHandler) -> None:
        """Serve `subject` by calling `handler(reply, payload, headers)` where nats-py's
        read loop parses each message (`shared.natsfast.subscribe_lean`): no Msg, no
        subscription queue or task, no micro request, for a hot subject. The handler must
        not block: it answers at once (`shared.natsfast.reply_soon`), or from a callback on
        a future it gives `hold`, or queues the request in a bounded queue of its own that
        `hold` covers; it opens its own SERVER span from the headers. One that raises is
        logged and answered with a micro error (code 500). The endpoint is not one of the
        micro service's (`$SRV.STATS` does not count it); the shutdown's drain stops it
        first, with the micro endpoints."""
        guarded = self.guard_lean(name, handler)
        sub = await subscribe_lean(self.nc, subject, guarded, queue=f"q-{subject}")
        self._lean_subs.append(sub)

    def guard_lean(self, name: str, handler: LeanHandler) -> Deliver:
        """`handler`, logging any exception it raises and answering its request with a
        micro error (code 500): a malformed message never takes the service down."""

        def guarded(reply: bytes, data: bytes, headers: dict[str, str] | None) -> None:
            try:
                handler(reply, data, headers)
            except Exception:
                log.exception("handler failed", extra={"endpoint": name})
                if reply:
                    self.spawn_reply(
                        self.nc.publish(
                            reply.decode(),
                            b"",
                            headers={ERROR_HEADER: "internal error", ERROR_CODE_HEADER: "500"},
                        )
                    )

        return guarded

    def spawn_reply(self, publish: Awaitable[None]) -> None:
        """Send an answer from a synchronous handler (a task the drain waits for; a failed
        send is logged: the requester times out)."""

        async def send() -> None:
            try:
                await publish
            except Exception as exc:
                log.debug("reply not sent", extra={"err": repr(exc)})

        self.hold(asyncio.ensure_future(send()))

    def hold(self, future: asyncio.Future[Any]) -> None:
        """Count `future` as a request in flight until it is done: the drain at shutdown
        waits for it as for a request's task (an inline handler answers from it)."""
        self._in_flight.add(future)
        future.add_done_callback(self._in_flight.discard)

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        """A background task, cancelled at shutdown. If it dies, the service stops."""
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._background.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("background task died", exc_info=t.exception(), extra={"task": name})
                self.stop()

        task.add_done_callback(done)
        return task

    async def _beat(self) -> None:
        while True:
            self._heartbeat = time.monotonic()
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)

    def health(self) -> tuple[bool, str]:
        """Liveness: the event loop ran the heartbeat lately (a process stuck in a blocking
        call or a busy loop answers no request: restart it)."""
        age = time.monotonic() - self._heartbeat
        if age > HEARTBEAT_STALE_S:
            return False, f"the event loop has not run for {age:.1f} s"
        return True, "ok"

    def readiness(self) -> tuple[bool, str]:
        """Readiness: alive, set up, connected to NATS and not shutting down."""
        healthy, why = self.health()
        if not healthy:
            return False, why
        if not self.started:
            return False, "starting"
        if self.stopping:
            return False, "stopping"
        if not self.nc.is_connected:
            return False, "not connected to NATS"
        return True, "ok"

    def on_shutdown(self, step: ShutdownStep) -> None:
        """Run `step` at shutdown, after requests drained; steps run last-added first."""
        self._shutdown_steps.append(step)

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def wait_stopped(self) -> None:
        await self._stop.wait()

    async def shutdown(self) -> None:
        log.info("draining")
        with contextlib.suppress(Exception):
            await self.micro.stop()
        for sub in self._lean_subs:
            # Drained as micro drains its endpoints: no more messages once the server has
            # the UNSUB (a flush's round trip); those sent before it are still served.
            with contextlib.suppress(Exception):
                await sub.drain()
            unsubscribe_lean(self.nc, sub)
        if self._in_flight:
            await asyncio.wait(set(self._in_flight), timeout=DRAIN_TIMEOUT_S)
        await cancel_all(set(self._background))
        for step in reversed(self._shutdown_steps):
            try:
                async with asyncio.timeout(SHUTDOWN_STEP_TIMEOUT_S):
                    await step()
            except Exception:  # a timeout included: shutting down goes on regardless
                log.exception("shutdown step failed", extra={"step": repr(step)})
        await self.events.close()
        with contextlib.suppress(Exception):
            await self.nc.drain()
        log.info("stopped")


def run_service(
    kind: str,
    main: Callable[[ServiceRuntime], Awaitable[None]],
    *,
    instance: Callable[[QuireSettings], str] | None = None,
    metadata: Callable[[QuireSettings], dict[str, str]] | None = None,
) -> int:
    """Run one service process until SIGTERM or SIGINT. `main` sets up the endpoints and
    background tasks and returns; the runner then waits and drains."""
    settings = load_settings()
    name = instance(settings) if instance else kind
    static = {"bookie_id": settings.bookie_id} if kind in ("journal", "ledgerstore") else {}
    setup_logging(name, settings.log_level, **static)
    setup_tracing(kind, instance=name, bookie_id=static.get("bookie_id"))
    if settings.faults_dir is not None:
        log.warning(f"fault injection enabled from {settings.faults_dir}")
        clock.use_faults_dir(settings.faults_dir)

    async def amain() -> None:
        rt = ServiceRuntime(kind, settings, name, metadata(settings) if metadata else None)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, rt.stop)
        await rt.start()
        try:
            await main(rt)
            rt.started = True
            tune_gc()
            log.info("started", extra={"pid": os.getpid()})
            await rt.wait_stopped()
        finally:
            await rt.shutdown()

    try:
        import uvloop

        uvloop.run(amain())
    except Exception:
        logging.getLogger(kind).exception("service failed")
        return 1
    finally:
        shutdown_tracing()
    return 0
