"""`quire analytics sla`: its help, and mistakes reported before Spark starts (no JVM, nothing
written)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import analytics.sla.job
from quire.cli import app


@pytest.fixture(autouse=True)
def no_spark(monkeypatch):
    """Fails the test if the command gets as far as starting Spark."""

    def refuse(master):
        raise AssertionError("Spark was started: the options should have been refused first")

    monkeypatch.setattr(analytics.sla.job, "spark_session", refuse)


def sla(*args: str):
    return CliRunner().invoke(app, ["analytics", "sla", *args])


def test_help_names_every_option():
    done = sla("--help")
    assert done.exit_code == 0, done.output
    for option in (
        "--output", "--data-dir", "--since", "--until", "--master", "--input", "--url",
        "--user", "--password", "--creds", "--stream", "--target-ms", "--window", "--follow",
        "--checkpoint", "--refresh",
    ):  # fmt: skip
        assert option in done.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--since", "2026-11-24T12:00:00Z", "--until", "2026-11-24T11:00:00Z"],
            "--since must be before --until",
        ),
        (["--since", "yesterday"], "not an ISO 8601 time"),
        (["--input", "{missing}"], "no such file or directory"),
        (["--input", "{glob}"], "no file matches"),
        (["--input", "{empty}"], "an empty directory"),
        (["--input", "{events}", "--url", "nats://127.0.0.1:4222"], "one of --input, --url"),
        (["--input", "{events}", "--follow"], "--follow reads the stream"),
        (["--data-dir", "{empty}"], "is `quire up` running"),
        (["--input", "{events}", "--window", "0"], "must be at least 1"),
        (["--input", "{events}", "--user", "u"], "go with --url"),
    ],
)
def test_mistakes_are_refused_before_spark_and_nothing_is_written(tmp_path, args, message):
    paths = {
        "missing": tmp_path / "missing.jsonl",
        "glob": tmp_path / "*.json.gz",
        "empty": tmp_path / "empty",
        "events": tmp_path / "events.jsonl",
    }
    paths["empty"].mkdir()
    paths["events"].write_text("{}\n")
    output = tmp_path / "out"
    done = sla("--output", str(output), *(a.format(**paths) for a in args))
    assert done.exit_code == 2, done.output
    assert message in done.output
    assert not output.exists()


def test_a_data_dir_names_its_stream_and_the_cluster_credentials(tmp_path):
    from analytics.sla.sources import StreamSource, data_dir_source
    from quire.cluster import nats_credentials

    (tmp_path / "cluster.json").write_text('{"nats_url": "nats://127.0.0.1:4999"}')
    assert data_dir_source(tmp_path) == StreamSource("nats://127.0.0.1:4999")
    user, password = nats_credentials(tmp_path, create=True)
    assert data_dir_source(tmp_path, stream="OTHER") == StreamSource(
        "nats://127.0.0.1:4999", user=user, password=password, stream="OTHER"
    )


def test_the_job_takes_its_password_from_a_file(tmp_path):
    """spark-submit's form (deploy/spark/submit-sla.sh): the password stays off the command
    line, which the driver's process list and the Spark UI show."""
    from analytics.sla.job import UsageError, parser, validate
    from analytics.sla.sources import StreamSource

    secret = tmp_path / "sla.password"
    secret.write_text("p-secret\n")
    url = "nats://n1:4222,nats://n2:4222"

    def source(*args: str):
        return validate(parser().parse_args(["--output", str(tmp_path / "out"), *args]))

    given = source("--url", url, "--user", "sla", "--password-file", str(secret))
    assert given == StreamSource(url, user="sla", password="p-secret")
    for args, message in [
        (["--url", url, "--password", "x", "--password-file", str(secret)], "not both"),
        (["--url", url, "--password-file", str(tmp_path / "none")], "--password-file"),
        (["--input", str(secret), "--password-file", str(secret)], "go with --url"),
    ]:
        with pytest.raises(UsageError, match=message):
            source(*args)
