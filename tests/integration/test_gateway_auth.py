"""Bearer tokens and TLS on both APIs, against a real stack whose gateway has both on."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quire.client import GrpcClient, HttpClient, QuireClientError
from quire.v1 import ledgers_pb2 as pb
from quire.v1 import ledgers_pb2_grpc as pb_grpc
from tests.support.certs import self_signed
from tests.support.stack import Stack, running_stack, scratch_database, stack_settings

TOKENS = ("alpha-token", "beta-token")


@pytest.fixture(scope="module")
async def secured(nats_url: str, database_url: str, tmp_path_factory) -> AsyncIterator[Stack]:
    directory = tmp_path_factory.mktemp("secured")
    cert, key = self_signed(directory)
    tokens = directory / "tokens"
    tokens.write_text("# the API tokens\n" + "\n".join(TOKENS) + "\n")
    settings = stack_settings(nats_url, directory, api_tokens=f"@{tokens}")
    with scratch_database(database_url) as db:
        async with running_stack(settings, db, tls_cert_file=cert, tls_key_file=key) as stack:
            yield stack


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_http_needs_a_token_except_for_health(secured: Stack) -> None:
    http = secured.http
    assert secured.url.startswith("https://")
    assert (await http.get("/healthz")).status_code == 200
    assert (await http.get("/readyz")).status_code == 200
    for headers in ({}, auth("wrong"), {"Authorization": "Basic YWxwaGE="}):
        response = await http.get("/v1/ledgers", headers=headers)
        assert response.status_code == 401
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["code"] == "UNAUTHORIZED"
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    for token in TOKENS:
        assert (await http.get("/v1/ledgers", headers=auth(token))).status_code == 200
    refused = await http.post("/v1/ledgers", json={"password": "p"})
    assert refused.status_code == 401
    listed = (await http.get("/v1/ledgers", headers=auth(TOKENS[0]))).json()
    assert listed["ledgers"] == []  # the refused create created nothing


async def test_plain_http_is_refused_when_tls_is_on(secured: Stack) -> None:
    plain = secured.url.replace("https://", "http://")
    async with httpx.AsyncClient(base_url=plain, timeout=5) as http:
        with pytest.raises(httpx.HTTPError):
            await http.get("/healthz")


async def test_clients_over_tls_with_tokens(secured: Stack) -> None:
    cert = secured.settings.gateway.tls_cert_file
    assert cert is not None
    port = secured.settings.gateway.grpc_port
    credentials = grpc.ssl_channel_credentials(cert.read_bytes())
    async with grpc.aio.secure_channel(f"localhost:{port}", credentials) as channel:
        stub = pb_grpc.LedgersStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.List(pb.ListRequest())
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.List(pb.ListRequest(), metadata=(("authorization", "Bearer nope"),))
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reply = await stub.List(
            pb.ListRequest(), metadata=(("authorization", "Bearer beta-token"),)
        )
        assert list(reply.ledgers) == []
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING  # open, like /healthz

    context = ssl.create_default_context(cafile=str(cert))
    async with HttpClient(secured.url, token="alpha-token", verify=context) as client:
        ledger = await client.create_ledger(password="pw")
        assert await ledger.append(b"over tls") == 0
    async with HttpClient(secured.url, verify=context) as client:
        with pytest.raises(QuireClientError) as refused:
            await client.get(ledger.ledger_id)
        assert refused.value.code == "UNAUTHORIZED" and refused.value.status == 401
    async with GrpcClient(f"localhost:{port}", token="beta-token", tls_ca=cert.read_bytes()) as g:
        assert [e.data for e in await g.read(ledger.ledger_id, "pw", 0, 0)] == [b"over tls"]
