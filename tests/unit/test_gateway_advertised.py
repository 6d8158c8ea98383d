"""The address a gateway records as the writer of the ledgers it creates
(services/gateway/service.py:advertised_address): the configured one, else its bound host
and ports, never an every-interface address that no client can dial."""

from __future__ import annotations

import socket

from services.gateway.ledgers import WriterAddress
from services.gateway.service import advertised_address
from shared.config import GatewaySettings, QuireSettings


def test_from_the_bound_address() -> None:
    gateway = GatewaySettings()
    assert advertised_address(gateway, "127.0.0.1", 7480, 7481, tls=False) == WriterAddress(
        "http://127.0.0.1:7480", "127.0.0.1:7481"
    )
    assert advertised_address(gateway, "::1", 80, 81, tls=True) == WriterAddress(
        "https://[::1]:80", "[::1]:81"
    )
    host = socket.gethostname()
    for every in ("0.0.0.0", "::"):
        assert advertised_address(gateway, every, 1, 2, tls=False) == WriterAddress(
            f"http://{host}:1", f"{host}:2"
        )


def test_configured_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("QUIRE_GATEWAY__ADVERTISED_HTTP_URL", "https://gw-1.example:7480")
    monkeypatch.setenv("QUIRE_GATEWAY__ADVERTISED_GRPC", "gw-1.example:7481")
    gateway = QuireSettings().gateway
    assert advertised_address(gateway, "0.0.0.0", 1, 2, tls=False) == WriterAddress(
        "https://gw-1.example:7480", "gw-1.example:7481"
    )
