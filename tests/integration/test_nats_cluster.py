"""Quire on a NATS cluster (QUIRE_NATS_URL naming three servers of a real 3-node JetStream
cluster on loopback): a service keeps serving and publishing events when the server it is
connected to stops, and the event stream is created with the replicas asked for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.errors import NoRespondersError, TimeoutError
from nats.micro.request import Request

from quire.infra import ManagedProcess, start_nats_cluster
from shared.config import QuireSettings, nats_servers
from shared.events import ensure_event_stream
from shared.service import ServiceRuntime, redact_nats_url
from shared.subjects import Subjects
from tests.support.events import jetstream_ready, stream_events
from tests.support.wait import until


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[ManagedProcess]]:
    servers = start_nats_cluster(tmp_path / "nats")
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def cluster_settings(servers: list[ManagedProcess], **kwargs) -> QuireSettings:
    return QuireSettings(nats_url=",".join(s.url for s in servers), **kwargs)


@pytest.fixture
async def observer(cluster: list[ManagedProcess]) -> AsyncIterator[nats.NATS]:
    """A client of the last server (the one the test never stops)."""
    nc = await nats.connect(servers=[cluster[-1].url], allow_reconnect=False)
    await until(lambda: jetstream_ready(nc), "JetStream ready on the cluster", timeout_s=60)
    yield nc
    await nc.close()


def test_the_nats_url_setting_names_several_servers_in_order() -> None:
    url = "nats://n1:4222, nats://a:s3cret@n2:4222,nats://n3:4222"
    assert nats_servers(url) == ["nats://n1:4222", "nats://a:s3cret@n2:4222", "nats://n3:4222"]
    assert redact_nats_url(url) == "nats://n1:4222,nats://a:***@n2:4222,nats://n3:4222"
    with pytest.raises(ValueError):
        nats_servers(" , ")
    assert QuireSettings().event_stream_replicas == 1


async def test_a_service_keeps_serving_when_its_nats_server_stops(
    cluster: list[ManagedProcess], observer: nats.NATS
) -> None:
    settings = cluster_settings(cluster, event_stream_replicas=3)
    subjects = Subjects(settings.subject_prefix)
    rt = ServiceRuntime("test", settings, "test-1")
    await rt.start()
    try:

        async def echo(req: Request) -> None:
            await req.respond(b"ok:" + req.data)

        subject = f"{settings.subject_prefix}.test.echo"
        await rt.add_endpoint("echo", subject, echo)
        # Servers in the order given: the first is the one it is connected to.
        assert rt.nc.connected_url is not None
        assert rt.nc.connected_url.port == int(cluster[0].url.rsplit(":", 1)[1])

        async def answered() -> bool:
            try:
                return (await observer.request(subject, b"b", timeout=1)).data == b"ok:b"
            except (NoRespondersError, TimeoutError):
                return False

        # The observer is on another server: the subscription reaches it over the routes
        # a moment after it was made.
        await until(answered, "the service answering through the cluster")
        rt.events.emit("test.before", n=1)
        await until(lambda: rt.events.stats.published == 1, "the first event published")

        await asyncio.to_thread(cluster[0].stop)
        await until(
            lambda: (
                rt.nc.is_connected
                and rt.nc.connected_url.port != int(cluster[0].url.rsplit(":", 1)[1])
            ),
            "the service reconnected to another server",
        )

        await until(answered, "the service answering through another server")
        # The stream has replicas on the other two servers: events still get stored.
        rt.events.emit("test.after", n=2)
        await until(lambda: rt.events.stats.published == 2, "the event after the stop published")
        stored = await stream_events(observer.jetstream(), subjects)
        assert [e["data"]["n"] for e in stored if e["kind"].startswith("test.")] == [1, 2]
    finally:
        rt.stop()
        await rt.shutdown()


async def test_the_event_stream_has_the_replicas_asked_for(observer: nats.NATS) -> None:
    subjects = Subjects("quire")
    js = observer.jetstream()
    await ensure_event_stream(js, subjects, replicas=3)
    info = await js.stream_info(subjects.event_stream)
    assert info.config.num_replicas == 3
    assert info.cluster is not None
    assert info.cluster.leader is not None
    assert len(info.cluster.replicas or []) == 2  # the other two servers, besides the leader
