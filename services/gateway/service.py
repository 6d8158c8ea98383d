"""The gateway service: the client quorum protocol behind the HTTP and gRPC APIs.

`main` wires the driver (`Ledgers`) to NATS and the metadata service, and serves the
FastAPI app with uvicorn inside this process's event loop. Uvicorn gets a socket bound
here (a busy port fails `main` loudly instead of exiting the process) and none of its
signal handling: the service runner owns SIGTERM and drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from services.gateway.auth import TokenAuth, TokenError, load_tokens
from services.gateway.grpc_api import start_grpc_server
from services.gateway.http import create_app
from services.gateway.ledgers import Ledgers, WriterAddress
from services.gateway.metrics import GatewayMetrics
from shared.bookie_client import BookieClient
from shared.config import GatewaySettings
from shared.metaclient import MetadataClient
from shared.service import ServiceRuntime

log = logging.getLogger(__name__)

HTTP_START_TIMEOUT_S = 10.0
HTTP_GRACEFUL_SHUTDOWN_S = 5


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signals to the service runner."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def tls_files(gateway: GatewaySettings) -> tuple[Path, Path] | None:
    """(certificate, key) when TLS is configured; both or neither must be set."""
    cert, key = gateway.tls_cert_file, gateway.tls_key_file
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise RuntimeError("TLS needs both QUIRE_GATEWAY__TLS_CERT_FILE and __TLS_KEY_FILE")
    for path in (cert, key):
        if not path.is_file():
            raise RuntimeError(f"TLS file {path} does not exist")
    return cert, key


def bind_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def advertised_address(
    gateway: GatewaySettings, host: str, http_port: int, grpc_port: int, tls: bool
) -> WriterAddress:
    """How clients reach this gateway: the configured addresses, else the bound ones (the
    host name in place of an every-interface address, which no client can dial)."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"
    http = gateway.advertised_http_url or f"{'https' if tls else 'http'}://{host}:{http_port}"
    return WriterAddress(http=http, grpc=gateway.advertised_grpc or f"{host}:{grpc_port}")


async def main(rt: ServiceRuntime) -> None:
    settings = rt.settings
    gateway = settings.gateway
    metrics = GatewayMetrics(rt.events.stats)
    meta = MetadataClient(rt.nc, rt.subjects, timeout_s=settings.request_timeout_ms / 1000)
    bookies = BookieClient(
        rt.nc,
        rt.subjects,
        add_timeout_ms=gateway.add_bookie_timeout_ms,
        read_timeout_ms=gateway.read_entry_timeout_ms,
        new_bookie_grace_ms=gateway.new_bookie_grace_ms,
    )
    ledgers = Ledgers(rt.nc, settings, meta, bookies, rt.events, metrics)
    rt.spawn(ledgers.run_ack_events(), "gateway-ack-events")
    rt.on_shutdown(ledgers.stop)

    try:
        auth = TokenAuth(load_tokens(settings.api_tokens))
    except TokenError as exc:
        raise RuntimeError(f"QUIRE_API_TOKENS: {exc}") from exc
    tls = tls_files(gateway)
    app = create_app(ledgers, gateway, metrics, auth)
    config = uvicorn.Config(
        app,
        ssl_certfile=str(tls[0]) if tls else None,
        ssl_keyfile=str(tls[1]) if tls else None,
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=HTTP_GRACEFUL_SHUTDOWN_S,
    )
    server = EmbeddedServer(config)
    sock = bind_socket(gateway.http_host, gateway.http_port)
    host, port = sock.getsockname()[:2]

    # gRPC first: its port is known only once bound, and the address this gateway records
    # in the ledgers it creates names both ports before either API takes a call.
    def advertise(grpc_port: int) -> None:
        ledgers.advertise(advertised_address(gateway, host, port, grpc_port, tls is not None))

    try:
        grpc_server, grpc_port = await start_grpc_server(ledgers, gateway, auth, advertise)
    except BaseException:
        sock.close()
        raise

    async def stop_grpc() -> None:
        await grpc_server.stop(HTTP_GRACEFUL_SHUTDOWN_S)

    rt.on_shutdown(stop_grpc)
    log.info("gateway gRPC listening", extra={"address": f"{host}:{grpc_port}"})

    async def serve() -> None:
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            # Shutdown: stop accepting, let requests in flight finish (bounded), then go.
            server.should_exit = True
            await task
            raise
        finally:
            sock.close()

    http_task = rt.spawn(serve(), "gateway-http")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HTTP_START_TIMEOUT_S
    while not server.started:
        if http_task.done() or loop.time() > deadline:
            raise RuntimeError(f"the HTTP server did not start on {host}:{port}")
        await asyncio.sleep(0.01)
    scheme = "https" if tls else "http"
    assert ledgers.address is not None
    log.info(
        "gateway HTTP listening",
        extra={
            "url": f"{scheme}://{host}:{port}",
            "api_tokens": auth.enabled,
            "advertised_http": ledgers.address.http,
            "advertised_grpc": ledgers.address.grpc,
        },
    )
