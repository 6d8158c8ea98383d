"""The gateway app's error envelope, in process (httpx's ASGI transport): whatever goes
wrong inside, the caller gets RFC 9457 problem+json and the app keeps serving."""

from __future__ import annotations

import httpx

from services.gateway.http import create_app
from services.gateway.metrics import GatewayMetrics
from shared.config import GatewaySettings
from shared.status import ApiCodes, QuireError


class ExplodingLedgers:
    """Only what these requests reach: `get` fails as a programmer error would."""

    def __init__(self) -> None:
        self.calls = 0

    async def get(self, ledger_id: int):
        self.calls += 1
        if ledger_id == 1:
            raise QuireError(ApiCodes.NO_SUCH_LEDGER, "no ledger 1")
        raise RuntimeError("a bug")


def client(ledgers) -> httpx.AsyncClient:
    app = create_app(ledgers, GatewaySettings(), GatewayMetrics())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://gateway")


async def test_an_unexpected_exception_is_a_500_problem_and_the_app_keeps_serving() -> None:
    ledgers = ExplodingLedgers()
    async with client(ledgers) as http:
        response = await http.get("/v1/ledgers/2")
        assert response.status_code == 500
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["code"] == "INTERNAL" and "a bug" not in response.text
        response = await http.get("/v1/ledgers/1")
        assert response.status_code == 404 and response.json()["code"] == "NO_SUCH_LEDGER"
        metrics = (await http.get("/metrics")).text
    assert ledgers.calls == 2
    assert 'route="/v1/ledgers/{ledger_id}",status="500"' in metrics


async def test_validation_errors_are_invalid_argument_problems() -> None:
    async with client(ExplodingLedgers()) as http:
        response = await http.post("/v1/ledgers", json={"ensemble_size": "three"})
    problem = response.json()
    assert response.status_code == 422 and problem["code"] == "INVALID_ARGUMENT"
    assert response.headers["content-type"] == "application/problem+json"
    assert {e["loc"][-1] for e in problem["errors"]} == {"ensemble_size", "password"}
