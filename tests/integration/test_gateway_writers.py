"""Two gateways over one cluster (real NATS, PostgreSQL, bookies), as behind a load balancer:
the gateway that creates a ledger records itself as its writer; the other sends that
ledger's appends and close there (HTTP 307, gRPC WRITER_REDIRECT), and the clients follow.
When the writer's gateway is gone, the ledger is recovered through the other one and the
application writes on in a new ledger (deploy/gateway/README.md)."""

from __future__ import annotations

import httpx
import pytest

from quire.client import GrpcClient, HttpClient, QuireClientError
from tests.support.stack import gateway_settings, running_stack

PASSWORD = "s3cret"
PW_KEY = "Quire-Ledger-Password"
PW = {PW_KEY: PASSWORD}


def addresses(settings) -> tuple[str, str]:
    gateway = settings.gateway
    return f"http://127.0.0.1:{gateway.http_port}", f"127.0.0.1:{gateway.grpc_port}"


async def test_the_other_gateway_sends_appends_to_the_writer(settings, fresh_database_url) -> None:
    async with running_stack(settings, fresh_database_url) as stack:
        a_http, a_grpc = addresses(stack.settings)
        b_settings = gateway_settings(stack.settings)
        await stack.start("gateway-b", "gateway", b_settings)
        b_http, b_grpc = addresses(b_settings)
        async with (
            HttpClient(a_http) as a,
            HttpClient(b_http) as b,
            GrpcClient(b_grpc) as b_rpc,
            httpx.AsyncClient(base_url=b_http) as raw_b,
        ):
            ledger = await a.create(password=PASSWORD, metadata={"app": "x"})
            lid = ledger.ledger_id
            # The writer is recorded where everyone sees it.
            writer = {"quire.writer.http": a_http, "quire.writer.grpc": a_grpc}
            assert ledger.metadata == {"app": "x", **writer}
            assert (await b.get(lid)).metadata == {"app": "x", **writer}
            with pytest.raises(QuireClientError) as reserved:
                await b.create(password=PASSWORD, metadata={"quire.writer.http": "elsewhere"})
            assert reserved.value.code == "INVALID_ARGUMENT"

            # B answers 307 to the same path on A, method and body kept, problem body too.
            path = f"/v1/ledgers/{lid}/entries?trace=1"
            headers = {**PW, "Content-Type": "application/octet-stream"}
            redirected = await raw_b.post(path, content=b"e0", headers=headers)
            assert redirected.status_code == 307
            assert redirected.headers["location"] == f"{a_http}{path}"
            assert redirected.headers["quire-writer-grpc"] == a_grpc
            problem = redirected.json()
            assert problem["code"] == "WRITER_REDIRECT" and problem["status"] == 307
            assert problem["writer"] == {"http": a_http, "grpc": a_grpc}
            # The password is checked before the writer is named.
            wrong = await raw_b.post(path, content=b"e0", headers={**headers, PW_KEY: "x"})
            assert wrong.status_code == 403
            # Nothing was appended by the redirect itself.
            assert await a.read_lac(lid, PASSWORD) == -1

            # Both clients follow it once, and the entries land on A's writer, in order.
            assert await b.append(lid, PASSWORD, [b"e0"]) == (0, 0, 0)
            assert (await b.append(lid, PASSWORD, [b"e1", b"e2"]))[:2] == (1, 2)
            assert (await b_rpc.append(lid, PASSWORD, [b"e3"]))[:2] == (3, 3)
            assert await b_rpc.append_many(lid, PASSWORD, [b"e4", b"e5", b"e6"]) == (4, 6)
            assert await b.append_many(lid, PASSWORD, [b"e7", b"e8"], batch=1) == (7, 8)
            entries = await a.read(lid, PASSWORD, 0, None)
            assert [e.data for e in entries] == [f"e{i}".encode() for i in range(9)]
            # The owner never redirects: A takes its own ledger's appends.
            assert (await a.append(lid, PASSWORD, [b"e9"]))[1] == 9

            # A close through B is A's close, at A's last entry.
            other = await a.create(password=PASSWORD)
            await a.append(other.ledger_id, PASSWORD, [b"only"])
            assert await b_rpc.close(other.ledger_id, PASSWORD) == 0
            closed = await b.get(other.ledger_id)
            assert closed.state == "CLOSED" and closed.last_entry_id == 0
            # A closed ledger is no one's to redirect to.
            with pytest.raises(QuireClientError) as refused:
                await b.append(other.ledger_id, PASSWORD, [b"late"])
            assert refused.value.code == "LEDGER_CLOSED"

            # The OpenAPI document says so.
            spec = (await raw_b.get("/openapi.json")).json()
            append_doc = spec["paths"]["/v1/ledgers/{ledger_id}/entries"]["post"]
            assert "WRITER_REDIRECT" in append_doc["responses"]["307"]["description"]
            close_doc = spec["paths"]["/v1/ledgers/{ledger_id}/close"]["post"]
            assert "307" in close_doc["responses"]
            get_doc = spec["paths"]["/v1/ledgers/{ledger_id}"]["get"]
            assert "quire.writer.http" in get_doc["description"]

            # A goes away, and its writer handle with it: the redirect leads nowhere.
            await stack.stop("gateway")
            for client in (b, b_rpc):
                with pytest.raises(QuireClientError) as gone:
                    await client.append(lid, PASSWORD, [b"lost"])
                assert gone.value.code == "WRITER_UNREACHABLE", gone.value

            # A comes back at the same address: it is the recorded writer, holds no handle,
            # and says so (409 LEDGER_FENCED), not redirecting anyone (no loop).
            await stack.start("gateway", "gateway", stack.settings)
            for client in (a, b, b_rpc):
                with pytest.raises(QuireClientError) as fenced:
                    await client.append(lid, PASSWORD, [b"lost"])
                assert fenced.value.code == "LEDGER_FENCED", fenced.value

            # Any gateway recovers it, at its last acknowledged entry; then it is closed.
            assert await b.recover(lid, PASSWORD) == 9
            with pytest.raises(QuireClientError) as after:
                await b.append(lid, PASSWORD, [b"late"])
            assert after.value.code == "LEDGER_CLOSED"
            assert [e.data for e in await b.read(lid, PASSWORD, 0, None)][-1] == b"e9"

            # The application writes on in a new ledger, on whichever gateway it reached.
            fresh = await b.create(password=PASSWORD)
            assert fresh.metadata == {"quire.writer.http": b_http, "quire.writer.grpc": b_grpc}
            assert await b.append(fresh.ledger_id, PASSWORD, [b"next"]) == (0, 0, 0)
            async with GrpcClient(a_grpc) as a_rpc:
                # And through A, it is redirected to B.
                assert (await a.append(fresh.ledger_id, PASSWORD, [b"more"]))[1] == 1
                assert (await a_rpc.append(fresh.ledger_id, PASSWORD, [b"rpc"]))[1] == 2
                # The clients remember the writer: with A gone, they write to B directly.
                await stack.stop("gateway")
                assert (await a.append(fresh.ledger_id, PASSWORD, [b"direct"]))[1] == 3
                assert (await a_rpc.append(fresh.ledger_id, PASSWORD, [b"direct"]))[1] == 4
                assert await a_rpc.append_many(fresh.ledger_id, PASSWORD, [b"5", b"6"]) == (5, 6)
                assert await a.close(fresh.ledger_id, PASSWORD) == 6
