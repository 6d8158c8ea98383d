"""HttpClient and a gateway's 307 to a ledger's writer (quire/client/http.py), over a fake
transport: followed once with the same method, body and headers; the writer remembered;
never a loop; a writer it cannot connect to is WRITER_UNREACHABLE."""

from __future__ import annotations

import json

import httpx
import pytest

from quire.client import HttpClient, QuireClientError

LB = "http://lb.example:7480"
WRITER = "http://gw-1.example:7480"
PATH = "/v1/ledgers/7/entries"


def redirect(request: httpx.Request) -> httpx.Response:
    problem = {"code": "WRITER_REDIRECT", "detail": "elsewhere", "status": 307}
    location = f"{WRITER}{request.url.raw_path.decode()}"
    return httpx.Response(307, headers={"Location": location}, json=problem)


class Gateways:
    """The load balancer's gateway redirects every append; the writer answers it, or
    redirects too (`writer_redirects`), or cannot be connected to (`writer_down`)."""

    def __init__(self) -> None:
        self.seen: list[httpx.Request] = []
        self.writer_redirects = False
        self.writer_down = False
        self.next_entry = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if request.url.host != "gw-1.example":
            return redirect(request)
        if self.writer_down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.writer_redirects:
            return redirect(request)
        if request.url.path.endswith("/close"):
            return httpx.Response(200, json={"state": "CLOSED", "last_entry_id": 0})
        if request.headers["Content-Type"] == "application/json":
            count = len(json.loads(request.content)["entries"])
            first, self.next_entry = self.next_entry, self.next_entry + count
            last = self.next_entry - 1
            return httpx.Response(
                200, json={"first_entry_id": first, "last_entry_id": last, "lac": last}
            )
        entry, self.next_entry = self.next_entry, self.next_entry + 1
        return httpx.Response(200, json={"entry_id": entry, "lac": entry})


@pytest.fixture
def gateways() -> Gateways:
    return Gateways()


def client(gateways: Gateways) -> HttpClient:
    return HttpClient(LB, transport=httpx.MockTransport(gateways))


async def test_followed_once_then_straight_to_the_writer(gateways: Gateways) -> None:
    async with client(gateways) as http:
        assert await http.append(7, "pw", [b"zero"]) == (0, 0, 0)
        first, followed = gateways.seen
        assert (first.url.host, followed.url.host) == ("lb.example", "gw-1.example")
        assert followed.method == "POST" and str(followed.url) == f"{WRITER}{PATH}"
        assert followed.content == b"zero"
        assert followed.headers["Quire-Ledger-Password"] == "pw"
        assert followed.headers["Content-Type"] == "application/octet-stream"
        # The writer is remembered: the next appends and the close skip the hop.
        assert await http.append(7, "pw", [b"one", b"two"]) == (1, 2, 2)
        assert json.loads(gateways.seen[-1].content)["entries"] == ["b25l", "dHdv"]
        assert await http.close(7, "pw") == 0  # the fake's answer
        assert [r.url.host for r in gateways.seen[2:]] == ["gw-1.example"] * 2
        # Closed: forgotten, so a later call asks the load balancer again.
        await http.append(7, "pw", [b"late"])
        assert gateways.seen[-2].url.host == "lb.example"


async def test_a_writer_that_redirects_too_is_an_error_not_a_loop(gateways: Gateways) -> None:
    gateways.writer_redirects = True
    async with client(gateways) as http:
        with pytest.raises(QuireClientError) as refused:
            await http.append(7, "pw", [b"zero"])
    assert refused.value.code == "WRITER_REDIRECT" and len(gateways.seen) == 2


async def test_a_writer_it_cannot_connect_to_is_unreachable_and_forgotten(
    gateways: Gateways,
) -> None:
    async with client(gateways) as http:
        await http.append(7, "pw", [b"zero"])
        gateways.writer_down = True
        with pytest.raises(QuireClientError) as gone:
            await http.append(7, "pw", [b"one"])
        assert gone.value.code == "WRITER_UNREACHABLE"
        # Forgotten: the next try goes through the load balancer again.
        with pytest.raises(QuireClientError):
            await http.append(7, "pw", [b"one"])
        assert gateways.seen[-2].url.host == "lb.example"
