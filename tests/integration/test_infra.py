"""The infrastructure fixtures start real servers that answer."""

import psycopg
import pytest
from sqlalchemy.engine import make_url

from quire.infra import NATS_MAX_PAYLOAD


async def test_nats_has_jetstream_and_large_payloads(nc) -> None:
    info = await nc.jetstream().account_info()
    assert info.limits is not None
    assert nc.max_payload == NATS_MAX_PAYLOAD


def test_postgres_answers_on_loopback(database_url: str) -> None:
    url = make_url(database_url)
    assert url.host == "127.0.0.1"
    with psycopg.connect(host=url.host, port=url.port, user=url.username, dbname=url.database) as c:
        assert c.execute("SELECT current_database()").fetchone() == ("quire",)


@pytest.mark.parametrize("bad", [0, -1])
def test_free_port_values(bad: int) -> None:
    from quire.infra import free_port

    assert free_port() > bad


def test_free_port_is_outside_the_range_outgoing_connections_take() -> None:
    from quire.infra import LISTEN_PORTS_FROM, ephemeral_port_range, free_port

    low, high = ephemeral_port_range()
    ports = {free_port() for _ in range(20)}
    assert len(ports) == 20  # never the same port twice to one process
    if low - LISTEN_PORTS_FROM >= 1000:
        assert all(LISTEN_PORTS_FROM <= port < low for port in ports), (ports, low)
    else:  # no room below it: bind(0), inside the range
        assert all(low <= port <= high for port in ports), (ports, low, high)
