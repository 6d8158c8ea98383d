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


def test_bookie_locations_and_placement_policy_reach_the_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QUIRE_PLACEMENT__POLICY", raising=False)
    config = ClusterConfig(
        data_dir=tmp_path,
        bookies=2,
        bookie_locations={"bookie-1": "/zone-a/rack-1"},
        placement_policy="rackaware",
    )
    cluster = Cluster(config)
    assert cluster._env("bookie-1")["QUIRE_BOOKIE_LOCATION"] == "/zone-a/rack-1"
    assert "QUIRE_BOOKIE_LOCATION" not in cluster._env("bookie-2")  # the default
    assert config.bookie_location("bookie-2") == "/default-zone/default-rack"
    assert cluster._env(None)["QUIRE_PLACEMENT__POLICY"] == "rackaware"
    assert "QUIRE_PLACEMENT__POLICY" not in Cluster(ClusterConfig(data_dir=tmp_path))._env(None)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"bookie_locations": {"bookie-9": "/z/r"}}, "not in the cluster"),
        ({"bookie_locations": {"bookie-1": "rack-1"}}, "network location"),
        ({"placement_policy": "nearest"}, "placement policy"),
    ],
)
def test_bad_placement_options_are_refused(tmp_path: Path, options: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ClusterConfig(data_dir=tmp_path, bookies=2, **options)
