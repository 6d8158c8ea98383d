"""Schemathesis against a real cluster's /openapi.json: no undocumented 5xx, and every
response (status, content type, body) matches the OpenAPI document."""

from __future__ import annotations

import os
import subprocess
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import QuireUp
from tests.support.layout import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# positive_data_acceptance is left out: the document cannot say "ack_quorum <= write_quorum
# <= ensemble_size", so schema-valid bodies that break it are rightly refused (400).
# not_a_server_error is replaced by the hook's check, which allows 503 NOT_ENOUGH_BOOKIES.
EXCLUDED = "positive_data_acceptance,not_a_server_error"


@pytest.fixture(scope="module")
def cluster(cluster_dir) -> Iterator[QuireUp]:
    parent = cluster_dir("fuzz")
    up = QuireUp(parent / "quire-data", bookies=3)
    with up.running():
        # The auto-recovery commands answer 503 UNAVAILABLE until an auditor is elected
        # (documented, but not what this test is about): fuzz an elected cluster.
        deadline = time.monotonic() + 30
        with up.client() as client:
            while client.get("/api/v1/autorecovery/who_is_auditor").json()["Auditor"] is None:
                assert time.monotonic() < deadline, "no auditor elected"
                time.sleep(0.1)
        yield up


def test_schemathesis_finds_nothing(cluster: QuireUp, tmp_path: Path) -> None:
    st = Path(sysconfig.get_path("scripts")) / "st"
    done = subprocess.run(
        [
            str(st),
            "run",
            f"{cluster.url}/openapi.json",
            "--checks",
            "all",
            "--exclude-checks",
            EXCLUDED,
            "--max-examples",
            "20",
            "--seed",
            "20261122",
            "--header",
            "Quire-Ledger-Password: pw",
            "--request-timeout",
            "30",
            "--no-color",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **os.environ,
            "SCHEMATHESIS_HOOKS": "tests.support.schemathesis_hooks",
            "HOME": str(tmp_path),
        },
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    # The server took the fuzzing unharmed.
    with cluster.client() as client:
        assert client.get("/readyz").status_code == 200
