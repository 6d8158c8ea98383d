"""Services connect to a NATS that wants an nkey, or TLS, when the settings say so; a
client without them is refused."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import nkeys

from quire.infra import start_nats
from shared.config import QuireSettings
from tests.support.certs import self_signed
from tests.support.inprocess import running_service
from tests.support.natsproto import nats_handshake


async def ping_replicator(rt) -> dict:
    """The replicator's own status endpoint, asked over its own (authenticated) link."""
    reply = await rt.nc.request(rt.subjects.service("replicator", "status"), b"", timeout=5)
    return json.loads(reply.data)


async def test_a_service_connects_with_an_nkey_and_others_are_refused(tmp_path: Path) -> None:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public_key = nkeys.from_seed(seed).public_key.decode()
    seed_file = tmp_path / "user.nk"
    seed_file.write_bytes(seed)
    server = start_nats(tmp_path / "nats", nkey=public_key)
    try:
        info, answer = nats_handshake(server.url, {})
        assert info["auth_required"] is True and b"Authorization Violation" in answer
        settings = QuireSettings(
            nats_url=server.url,
            nats_nkey_seed_file=seed_file,
            subject_prefix="nk",
            data_dir=tmp_path,
        )
        async with running_service("replicator", settings) as rt:
            assert (await ping_replicator(rt))["replicated"] == 0
    finally:
        server.stop()


async def test_a_service_connects_over_tls_when_told_to(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server = start_nats(tmp_path / "nats", tls=(cert, key))
    try:
        host, port = server.url.removeprefix("nats://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            info = json.loads(sock.recv(65536).decode().removeprefix("INFO ").strip())
        assert info["tls_required"] is True
        settings = QuireSettings(
            nats_url=server.url, nats_tls_ca_file=cert, subject_prefix="tls", data_dir=tmp_path
        )
        async with running_service("replicator", settings) as rt:
            assert (await ping_replicator(rt))["replicated"] == 0
    finally:
        server.stop()
