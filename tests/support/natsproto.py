"""The NATS protocol spoken by hand, for tests of what a server refuses (nats-py leaks its
socket when a connect is refused)."""

from __future__ import annotations

import json
import socket


def nats_handshake(url: str, connect: dict) -> tuple[dict, bytes]:
    """Speak the NATS protocol by hand (nats-py leaks its socket on a refused connect):
    the server's INFO, and its answer to CONNECT + PING."""
    host, port = url.removeprefix("nats://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        info = json.loads(sock.recv(65536).decode().removeprefix("INFO ").strip())
        sock.sendall(b"CONNECT " + json.dumps({"verbose": False, **connect}).encode() + b"\r\n")
        sock.sendall(b"PING\r\n")
        return info, sock.recv(65536)
