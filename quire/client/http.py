"""The HTTP client (API.md section 2) on httpx."""

from __future__ import annotations

import base64
import json
import ssl
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from quire.client.base import (
    WRITER_UNREACHABLE,
    Entry,
    Ledger,
    QuireClient,
    QuireClientError,
)

PASSWORD_HEADER = "Quire-Ledger-Password"
NDJSON = "application/x-ndjson"
TAIL_POLL_MS = 10_000
# The code of a range read whose body ended without its last line: the connection was cut
# part way (an error after the first entries, or the gateway's progress deadline).
CUT = "RESPONSE_CUT"
# The most ledgers whose writer's gateway a client remembers (the oldest are forgotten:
# their next append is redirected again).
WRITERS_KEPT = 4096


# An idle pooled connection is dropped after this long: well before the gateway's server
# closes it (uvicorn's keep-alive timeout, 5 s). At httpx's default, also 5 s, a request
# sent on a connection idle for about 5 s raced the server's close and failed with
# "Server disconnected without sending a response" (`quire bench --compare one-ledger
# --via http` closed the first run's ledgers after the second run's few seconds).
KEEPALIVE_EXPIRY_S = 2.0


def problem_error(response: httpx.Response) -> QuireClientError:
    """An error answer's problem details (API.md) as the exception."""
    try:
        problem = response.json()
        code, detail = problem["code"], problem.get("detail", "")
    except (ValueError, KeyError, TypeError):
        code, detail = "HTTP_ERROR", response.text
    return QuireClientError(code, detail, response.status_code)


class HttpClient(QuireClient):
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 60.0,
        verify: ssl.SSLContext | bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """`token`: the bearer token, when the gateway wants one; `verify`: TLS
        verification (an SSLContext trusting a private CA, for example)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            timeout=timeout_s,
            verify=verify,
            transport=transport,
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S),
        )
        # The writers' gateways redirects named, by ledger (base URLs), oldest first.
        self._writers: OrderedDict[int, str] = OrderedDict()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        password: str | None = None,
        ledger: int | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """`ledger`: the call is an append or close of that ledger, sent straight to its
        writer's gateway once a redirect named it."""
        headers = kwargs.pop("headers", {})
        if password is not None:
            headers[PASSWORD_HEADER] = password
        writer = self._writers.get(ledger) if ledger is not None else None
        if writer is not None:
            response = await self._at_writer(ledger, writer + path, method, headers, **kwargs)
        else:
            response = await self._http.request(method, path, headers=headers, **kwargs)
            if response.status_code == httpx.codes.TEMPORARY_REDIRECT:
                response = await self._follow_writer(response, ledger, method, headers, **kwargs)
        if response.status_code >= 400:
            raise problem_error(response)
        return response

    async def _follow_writer(
        self,
        redirect: httpx.Response,
        ledger: int | None,
        method: str,
        headers: dict[str, str],
        **kwargs: Any,
    ) -> httpx.Response:
        """A gateway sent an append or close to the gateway that holds the ledger's writer
        (307: same method, same body). Followed once: the writer never redirects, so a
        second 307 is an error, not a loop. The writer is remembered: a ledger's writer
        never changes."""
        location = redirect.headers.get("location")
        if location is None:
            raise problem_error(redirect)
        response = await self._at_writer(ledger, location, method, headers, **kwargs)
        sent = redirect.request.url.raw_path.decode()
        if ledger is not None and location.endswith(sent):
            self._writers[ledger] = location[: -len(sent)]
            while len(self._writers) > WRITERS_KEPT:
                self._writers.popitem(last=False)
        return response

    async def _at_writer(
        self, ledger: int | None, url: str, method: str, headers: dict[str, str], **kwargs: Any
    ) -> httpx.Response:
        try:
            response = await self._http.request(method, url, headers=headers, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # the request never went
            if ledger is not None:
                self._writers.pop(ledger, None)
            raise QuireClientError(
                WRITER_UNREACHABLE, f"the ledger's writer at {url} does not answer: {exc}"
            ) from exc
        if response.is_redirect:
            raise problem_error(response)
        return response

    async def create(
        self,
        *,
        password: str,
        ensemble_size: int = 3,
        write_quorum: int = 3,
        ack_quorum: int = 2,
        digest: str = "crc32c",
        metadata: dict[str, str] | None = None,
    ) -> Ledger:
        body = {
            "ensemble_size": ensemble_size,
            "write_quorum": write_quorum,
            "ack_quorum": ack_quorum,
            "digest": digest,
            "password": password,
            "metadata": metadata or {},
        }
        return Ledger.from_json((await self._call("POST", "/v1/ledgers", json=body)).json())

    async def get(self, ledger_id: int) -> Ledger:
        return Ledger.from_json((await self._call("GET", f"/v1/ledgers/{ledger_id}")).json())

    async def list(
        self, after: int | None = None, limit: int = 100
    ) -> tuple[list[Ledger], int | None]:
        params: dict[str, int] = {"limit": limit}
        if after is not None:
            params["after"] = after
        body = (await self._call("GET", "/v1/ledgers", params=params)).json()
        return [Ledger.from_json(row) for row in body["ledgers"]], body["next_after"]

    async def delete(self, ledger_id: int, password: str) -> None:
        await self._call("DELETE", f"/v1/ledgers/{ledger_id}", password)

    async def append(
        self, ledger_id: int, password: str, entries: Sequence[bytes]
    ) -> tuple[int, int, int]:
        path = f"/v1/ledgers/{ledger_id}/entries"
        if len(entries) == 1:
            response = await self._call(
                "POST",
                path,
                password,
                ledger_id,
                content=entries[0],
                headers={"Content-Type": "application/octet-stream"},
            )
            body = response.json()
            return body["entry_id"], body["entry_id"], body["lac"]
        batch = {"entries": [base64.b64encode(e).decode() for e in entries]}
        body = (await self._call("POST", path, password, ledger_id, json=batch)).json()
        return body["first_entry_id"], body["last_entry_id"], body["lac"]

    async def append_many(
        self, ledger_id: int, password: str, entries: Sequence[bytes], batch: int = 500
    ) -> tuple[int, int]:
        """Batches one after another: HTTP gives no order between concurrent requests, and
        the entries must land in the order given. Each batch amortises the round trip."""
        first = last = -1
        for start in range(0, len(entries), batch):
            a, last, _ = await self.append(ledger_id, password, entries[start : start + batch])
            first = a if first < 0 else first
        return first, last

    async def read_stream(
        self,
        ledger_id: int,
        password: str,
        first: int,
        last: int | None,
        unconfirmed: bool = False,
    ) -> AsyncIterator[Entry]:
        """One streamed request in NDJSON (the gateway's form of a range read for clients
        that read as it comes): an entry a line, then `{"lac": m}` once the range is whole,
        or `{"error": {problem}}`. A body that ends with neither was cut: a failure too."""
        params: dict[str, Any] = {"from": first}
        if last is not None:
            params["to"] = last
        if unconfirmed:
            params["unconfirmed"] = "true"
        headers = {PASSWORD_HEADER: password, "Accept": NDJSON}
        path = f"/v1/ledgers/{ledger_id}/entries"
        async with self._http.stream("GET", path, params=params, headers=headers) as response:
            if response.status_code >= 400:
                await response.aread()
                raise problem_error(response)
            try:
                async for line in response.aiter_lines():
                    if not line:
                        continue
                    item = json.loads(line)
                    if "entry_id" in item:
                        yield Entry(item["entry_id"], base64.b64decode(item["data"]))
                    elif "error" in item:
                        problem = item["error"]
                        raise QuireClientError(
                            problem["code"], problem.get("detail", ""), problem.get("status")
                        )
                    elif set(item) == {"lac"}:
                        return  # the range is read whole
                    else:
                        raise QuireClientError("HTTP_ERROR", f"not a line of a read: {line:.200}")
            except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
                detail = f"the read of ledger {ledger_id} broke off: {exc}"
                raise QuireClientError(CUT, detail) from exc
        raise QuireClientError(CUT, f"the read of ledger {ledger_id} ended before its last line")

    async def read_lac(
        self, ledger_id: int, password: str, after: int | None = None, timeout_ms: int = 0
    ) -> int:
        params: dict[str, int] = {"timeout_ms": timeout_ms}
        if after is not None:
            params["after"] = after
        response = await self._call("GET", f"/v1/ledgers/{ledger_id}/lac", password, params=params)
        return response.json()["lac"]

    async def tail(self, ledger_id: int, password: str, first: int = 0) -> AsyncIterator[Entry]:
        following = first
        while True:
            lac = await self.read_lac(ledger_id, password, following - 1, TAIL_POLL_MS)
            if lac >= following:
                async for entry in self.read_stream(ledger_id, password, following, lac):
                    yield entry
                    following = entry.entry_id + 1
                continue
            ledger = await self.get(ledger_id)
            if ledger.state == "CLOSED" and following > (ledger.last_entry_id or -1):
                return

    # -- operator calls (HTTP only) ---------------------------------------------------------

    async def get_json(self, path: str, **params: Any) -> Any:
        """GET an operator endpoint (e.g. /v1/bookies) and return its JSON."""
        return await self.request_json("GET", path, params=params or None)

    async def request_json(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call an operator endpoint and return its JSON (None for an empty body)."""
        response = await self._call(method, path, **kwargs)
        return response.json() if response.content else None

    async def close(self, ledger_id: int, password: str) -> int:
        path = f"/v1/ledgers/{ledger_id}/close"
        body = (await self._call("POST", path, password, ledger_id)).json()
        self._writers.pop(ledger_id, None)  # closed: no more writes to send anywhere
        return body["last_entry_id"]

    async def recover(self, ledger_id: int, password: str) -> int:
        body = (await self._call("POST", f"/v1/ledgers/{ledger_id}/recover", password)).json()
        return body["last_entry_id"]
