"""The Grafana dashboards and the observability stack, checked without running them (there is
no Docker here): the generator is the source of the committed JSON, every query parses and
names only metrics that docs/metrics.md lists, and the compose stack's files agree with each
other and with the README."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.support.dashboards import (
    DASHBOARDS_DIR,
    SCRAPE_SERIES,
    catalog,
    committed_dashboards,
    grouping_labels,
    load_generator,
    matched_labels,
    prometheus_queries,
    selected_names,
    trace_to_metrics_queries,
)
from tests.support.layout import ROOT

GRAFANA = ROOT / "deploy" / "grafana"
OBSERVABILITY = ROOT / "deploy" / "observability"


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_the_committed_json_is_what_the_generator_writes() -> None:
    expected = load_generator().rendered()
    committed = {p.name: p.read_text() for p in DASHBOARDS_DIR.glob("*.json")}
    assert sorted(committed) == sorted(expected), "run `make dashboards`"
    stale = [name for name, text in expected.items() if committed[name] != text]
    assert not stale, f"{stale} differ from deploy/grafana/generate.py: run `make dashboards`"


def test_the_dashboards_cover_the_cluster() -> None:
    titles = {model["title"] for model in committed_dashboards().values()}
    assert titles == {
        "Quire: cluster overview",
        "Quire: gateway",
        "Quire: bookie",
        "Quire: autorecovery",
        "Quire: traces",
    }
    uids = [model["uid"] for model in committed_dashboards().values()]
    assert len(uids) == len(set(uids))


def test_every_prometheus_query_parses() -> None:
    queries = all_queries()
    assert len(queries) > 60
    failures = []
    for query in queries:
        try:
            assert selected_names(query.promql()), "selects no metric"
        except (ValueError, AssertionError) as error:
            failures.append(f"{query.dashboard} / {query.where}: {query.expr}: {error}")
    assert not failures, "\n".join(failures)


def all_queries() -> list:
    datasources = load_yaml(GRAFANA / "provisioning" / "datasources" / "quire.yaml")
    return prometheus_queries(committed_dashboards()) + trace_to_metrics_queries(datasources)


def test_every_metric_the_dashboards_query_is_in_the_catalog() -> None:
    """Each selected name must be a sample name docs/metrics.md promises in its exposition
    form: a counter's `_total`, a histogram's `_bucket`/`_sum`/`_count`, a summary's quantile
    samples (bare name) and `_sum`/`_count`."""
    exported = catalog().samples
    rows = re.findall(r"^\| `", (ROOT / "docs" / "metrics.md").read_text(), re.M)
    standard = {n for n in exported if n.startswith(("process_", "python_"))}
    assert len(set(exported.values()) - standard) == len(rows) > 100, "a row not read"
    assert "process_cpu_seconds_total" in standard
    missing = sorted(
        f"{query.dashboard} / {query.where}: {name}"
        for query in all_queries()
        for name in selected_names(query.promql())
        if name not in exported and name not in SCRAPE_SERIES
    )
    assert not missing, "not in docs/metrics.md:\n" + "\n".join(missing)


def test_every_label_the_dashboards_match_or_group_by_is_in_the_catalog() -> None:
    """A matcher or a `by (...)` on a label the metric does not have selects nothing, or
    lumps everything into one series, without any error: each label must be the metric's
    (docs/metrics.md's labels column), a bucket's `le` or a target label."""
    known = catalog()
    wrong = []
    for query in all_queries():
        promql = query.promql()
        for name, labels in matched_labels(promql):
            if name in SCRAPE_SERIES:
                continue
            unknown = labels - known.sample_labels(name)
            if unknown:
                wrong.append(f"{query.dashboard} / {query.where}: {name} has no {unknown}")
        for labels, names in grouping_labels(promql):
            allowed = set().union(*(known.sample_labels(n) for n in names - SCRAPE_SERIES))
            if labels - allowed:
                wrong.append(f"{query.dashboard} / {query.where}: by {labels - allowed}")
    assert not wrong, "\n".join(wrong)


def test_the_catalog_reader_knows_each_exposition_form() -> None:
    known = catalog()
    exported = known.samples
    assert exported["quire_gateway_add_entries_total"] == "quire_gateway_add_entries"
    assert "quire_gateway_add_entries" not in exported
    assert exported["quire_journal_sync_latency_seconds_bucket"] == (
        "quire_journal_sync_latency_seconds"
    )
    assert "bookie_journal_JOURNAL_SYNC" in exported  # quantile samples
    assert "bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES" not in exported  # count/sum only
    assert "bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES_sum" in exported
    assert "bookie_read_cache_hits" in exported  # BookKeeper's counter, untyped
    assert "bookie_read_cache_hits_total" not in exported
    assert known.labels["quire_ledgerstore_cache_hits"] == {"cache"}
    assert known.labels["quire_auditor_check_duration_seconds"] == {"check", "success"}
    assert "le" in known.sample_labels("quire_journal_sync_latency_seconds_bucket")
    assert "le" not in known.sample_labels("quire_journal_sync_latency_seconds_count")


def test_every_variable_a_dashboard_uses_it_defines() -> None:
    """An undefined $variable stays literal in the query, which then selects nothing."""
    wrong = []
    for name, model in committed_dashboards().items():
        defined = {variable["name"] for variable in model["templating"].get("list", [])}
        text = json.dumps([model["panels"], model["templating"]])
        used = set(re.findall(r"\$\{?(\w+)", text)) - {"__rate_interval"}
        if used - defined:
            wrong.append(f"{name}: {sorted(used - defined)}")
    assert not wrong, wrong


def test_panels_name_only_the_provisioned_datasources() -> None:
    provisioned = {
        (source["type"], source["uid"])
        for source in load_yaml(GRAFANA / "provisioning" / "datasources" / "quire.yaml")[
            "datasources"
        ]
    }
    used = set()
    for model in committed_dashboards().values():
        for panel in model["panels"]:
            for ref in [
                panel.get("datasource"),
                *(t.get("datasource") for t in panel.get("targets", [])),
            ]:
                if ref:
                    used.add((ref["type"], ref["uid"]))
    assert used == provisioned == {("prometheus", "prometheus"), ("tempo", "tempo")}


def compose() -> dict:
    return load_yaml(OBSERVABILITY / "compose.yaml")


def mounts(service: str) -> dict[str, str]:
    """A compose service's bind mounts: container path -> host path (as written)."""
    found = {}
    for volume in compose()["services"][service].get("volumes", []):
        # HOST:CONTAINER[:MODE], where HOST may hold a ${VAR:-default}.
        match = re.match(r"^(.+):(/[^:]+)(?::\w+)?$", volume)
        assert match, f"{service}: a volume not of the form HOST:CONTAINER[:MODE]: {volume}"
        found[match.group(2)] = match.group(1)
    return found


def test_every_file_the_stack_mounts_is_in_the_repo() -> None:
    named_volumes = set(compose().get("volumes") or {})
    checked = 0
    for service in compose()["services"]:
        for host in mounts(service).values():
            if host in named_volumes or host.startswith("${QUIRE_DATA_DIR"):
                continue
            assert (OBSERVABILITY / host).exists(), f"{service} mounts {host}: not in the repo"
            checked += 1
    assert checked >= 4


def test_prometheus_reads_the_targets_quire_up_writes() -> None:
    config = load_yaml(OBSERVABILITY / "prometheus.yml")
    (job,) = config["scrape_configs"]
    (files,) = [sd["files"] for sd in job["file_sd_configs"]]
    data_dir_mount = next(
        container
        for container, host in mounts("prometheus").items()
        if host.startswith("${QUIRE_DATA_DIR")
    )
    # quire up writes DIR/prometheus/targets.json; compose mounts DIR/prometheus.
    assert mounts("prometheus")[data_dir_mount].endswith("}/prometheus")
    assert files == [f"{data_dir_mount}/targets.json"]
    # $__rate_interval needs Grafana to know the scrape interval.
    datasources = load_yaml(GRAFANA / "provisioning" / "datasources" / "quire.yaml")
    prom = next(d for d in datasources["datasources"] if d["uid"] == "prometheus")
    assert prom["jsonData"]["timeInterval"] == config["global"]["scrape_interval"]


def listen_flag(service: str, flag: str) -> str:
    command = compose()["services"][service]["command"]
    return next(arg.split("=", 1)[1] for arg in command if arg.startswith(f"{flag}="))


def test_grafana_finds_prometheus_tempo_and_the_dashboards() -> None:
    tempo = load_yaml(OBSERVABILITY / "tempo.yaml")
    datasources = {
        d["uid"]: d
        for d in load_yaml(GRAFANA / "provisioning" / "datasources" / "quire.yaml")["datasources"]
    }
    prometheus_at = listen_flag("prometheus", "--web.listen-address")
    assert datasources["prometheus"]["url"] == f"http://{prometheus_at}"
    server = tempo["server"]
    assert datasources["tempo"]["url"] == (
        f"http://{server['http_listen_address']}:{server['http_listen_port']}"
    )
    # Tempo's service graph goes into Prometheus, which must accept remote writes.
    (remote_write,) = tempo["metrics_generator"]["storage"]["remote_write"]
    assert remote_write["url"] == f"http://{prometheus_at}/api/v1/write"
    assert "--web.enable-remote-write-receiver" in compose()["services"]["prometheus"]["command"]

    (provider,) = load_yaml(GRAFANA / "provisioning" / "dashboards" / "quire.yaml")["providers"]
    grafana = mounts("grafana")
    assert grafana[provider["options"]["path"]] == "../grafana/dashboards"
    assert grafana["/etc/grafana/provisioning"] == "../grafana/provisioning"
    home = compose()["services"]["grafana"]["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
    ]
    assert home.startswith(provider["options"]["path"] + "/")
    assert (DASHBOARDS_DIR / Path(home).name).exists()


def test_the_otlp_endpoint_the_readme_gives_is_tempos() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Dashboards (Prometheus, Tempo, Grafana)", 1)[1].split("\n## ", 1)[0]
    (endpoint,) = set(re.findall(r"OTEL_EXPORTER_OTLP_ENDPOINT=(\S+)", section))
    assert endpoint == "http://127.0.0.1:4318"
    protocols = load_yaml(OBSERVABILITY / "tempo.yaml")["distributor"]["receivers"]["otlp"][
        "protocols"
    ]
    # OTEL_EXPORTER_OTLP_PROTOCOL defaults to http/protobuf: the endpoint is Tempo's HTTP one.
    assert f"http://{protocols['http']['endpoint']}" == endpoint
    assert protocols["grpc"]["endpoint"] == "127.0.0.1:4317"
    # No Docker here: the README must not claim the stack is run.
    assert "checked by parsing, not run in CI" in " ".join(section.split())
