"""What `quire up` tells about the gateway it starts: scheme and authentication."""

from pathlib import Path

import pytest

from quire.cluster import Cluster, ClusterConfig, restarts_summary


@pytest.mark.parametrize(
    ("env", "url", "note"),
    [
        ({}, "http://127.0.0.1:7480", "no API tokens"),
        ({"QUIRE_API_TOKENS": " "}, "http://127.0.0.1:7480", "no API tokens"),
        ({"QUIRE_API_TOKENS": "t1,t2"}, "http://127.0.0.1:7480", "bearer tokens required"),
        ({"QUIRE_GATEWAY__TLS_CERT_FILE": "/c.pem"}, "https://127.0.0.1:7480", "no API tokens"),
    ],
)
def test_ready_line_parts(
    env: dict[str, str], url: str, note: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QUIRE_API_TOKENS", raising=False)
    monkeypatch.delenv("QUIRE_GATEWAY__TLS_CERT_FILE", raising=False)
    cluster = Cluster(ClusterConfig(data_dir=tmp_path, extra_env=env))
    assert cluster.http_url == url
    assert cluster.auth_note == note


def test_the_stop_line_says_what_was_restarted() -> None:
    assert restarts_summary({"nats": 0, "gateway": 0}) == "restarts while up: none"
    assert (
        restarts_summary({"nats": 1, "metadata": 0, "bookie-2.journal": 3})
        == "restarts while up: nats 1, bookie-2.journal 3"
    )
