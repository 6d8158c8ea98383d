"""End to end: every metric the Grafana dashboards query is exported by a live `quire up`.

One cluster, a few appends and reads, then every target of DIR/prometheus/targets.json is
scraped as Prometheus would: each name a dashboard selects (or a Tempo span-to-metrics link)
must be a sample name of a family some process exports, in its exposition form (a counter's
`_total`, a histogram's `_bucket`...). A family counts even without samples yet (a labelled
counter nobody has incremented): its name and type are what the dashboards depend on."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cluster import QuireUp
from tests.support.dashboards import (
    SCRAPE_SERIES,
    committed_dashboards,
    prometheus_queries,
    quantile_matchers,
    sample_names,
    selected_names,
    trace_to_metrics_queries,
)
from tests.support.layout import ROOT
from tests.support.wait import until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PASSWORD = "e2e-dashboards"
AUTH = {"Quire-Ledger-Password": PASSWORD}
ENTRIES = 20
# The processes the dashboards' variables list, by the `service` label of their target.
SERVICES = {"gateway", "metadata", "journal", "ledgerstore", "auditor", "replicator"}


async def write_and_read(http: httpx.AsyncClient) -> None:
    resp = await http.post(
        "/v1/ledgers",
        json={
            "ensemble_size": 3,
            "write_quorum": 3,
            "ack_quorum": 2,
            "digest": "crc32c",
            "password": PASSWORD,
        },
    )
    assert resp.status_code == 201, resp.text
    lid = resp.json()["ledger_id"]
    entries = [base64.b64encode(f"entry {i}".encode()).decode() for i in range(ENTRIES)]
    resp = await http.post(f"/v1/ledgers/{lid}/entries", headers=AUTH, json={"entries": entries})
    assert resp.status_code == 200, resp.text
    resp = await http.get(
        f"/v1/ledgers/{lid}/entries", params={"from": 0, "to": ENTRIES - 1}, headers=AUTH
    )
    assert resp.status_code == 200, resp.text


async def scrape(http: httpx.AsyncClient, target: str) -> str | None:
    try:
        resp = await http.get(f"http://{target}/metrics")
    except httpx.TransportError:
        return None
    return resp.text if resp.status_code == 200 else None


async def test_every_metric_the_dashboards_query_is_exported(cluster_dir) -> None:
    up = QuireUp(cluster_dir("e2e-dashboards") / "quire-data", bookies=3)
    with up.running():
        async with httpx.AsyncClient(base_url=up.url, timeout=30.0) as http:
            await write_and_read(http)
            groups = json.loads((up.data_dir / "prometheus" / "targets.json").read_text())
            # What the variables and selectors of the dashboards rely on.
            assert {g["labels"]["service"] for g in groups} == SERVICES
            bookies = [g for g in groups if g["labels"]["service"] in {"journal", "ledgerstore"}]
            assert len(bookies) == 2 * up.bookies
            assert all(g["labels"].get("bookie_id") for g in bookies)
            assert len({g["labels"]["instance"] for g in groups}) == len(groups)

            exported: dict[str, str] = {}
            quantiles: dict[str, set[str]] = {}  # the quantile labels of a summary's samples
            for group in groups:
                instance = group["labels"]["instance"]
                for target in group["targets"]:
                    text = await until(
                        lambda target=target: scrape(http, target),
                        f"{instance} to serve /metrics at {target}",
                    )
                    for family in text_string_to_metric_families(text):
                        for name in sample_names(family.name, family.type):
                            exported[name] = instance
                        for sample in family.samples:
                            if "quantile" in sample.labels:
                                quantiles.setdefault(sample.name, set()).add(
                                    sample.labels["quantile"]
                                )

    datasources = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/quire.yaml").read_text()
    )
    queries = prometheus_queries(committed_dashboards()) + trace_to_metrics_queries(datasources)
    missing = sorted(
        f"{query.dashboard} / {query.where}: {name}"
        for query in queries
        for name in selected_names(query.promql())
        if name not in exported and name not in SCRAPE_SERIES
    )
    assert not missing, "no process of quire up exports:\n" + "\n".join(missing)
    # A summary's quantile is a label value: one spelled otherwise ("0.50") selects nothing.
    wrong = sorted(
        f"{query.dashboard} / {query.where}: {name}{{quantile={value!r}}}"
        for query in queries
        for name, value in quantile_matchers(query.promql())
        if value not in quantiles.get(name, set())
    )
    assert not wrong, "no such quantile exported:\n" + "\n".join(wrong)
