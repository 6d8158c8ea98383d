"""`python -m quire.bench.nats_raw` (docs/scaling.md's NATS figures) on the session's
nats-server, at a size that takes a second: every message arrives, every request is answered."""

from __future__ import annotations

from pathlib import Path

from quire.bench import nats_raw


def test_counts_every_message_and_request(nats_url: str, tmp_path: Path) -> None:
    out = tmp_path / "nats.json"
    results = nats_raw.main(
        ["--count", "500", "--requests", "200", "--in-flight", "8", "--nats-url", nats_url]
        + ["--json", str(out)]
    )
    assert results["publish"]["messages"] == 500 and results["publish"]["received_per_s"] > 0
    assert results["request"]["requests"] == 200 and results["request"]["requests_per_s"] > 0
    assert out.read_text().strip().startswith("{")
