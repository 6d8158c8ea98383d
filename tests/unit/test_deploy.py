"""deploy/ checked without a cluster (no Docker or Kubernetes here): every Kubernetes manifest
against the Kubernetes JSON schemas (kubernetes-validate), the compose file against the
compose-spec schema (vendored in deploy/compose/schema/), the NATS configs by `nats-server -t`
on keys that deploy/nats/gen-keys.py makes, and every `QUIRE_*` variable, `python -m` module
and `quire` command that a deploy file names against the code: a variable QuireSettings does
not have would be ignored in silence (extra="ignore"), so it is a test failure here."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import typer
import yaml
from pydantic import BaseModel

from quire.cli import app as quire_app
from quire.infra import nats_server_binary
from services.metadata.postgres import conninfo_from_url
from shared.config import QuireSettings
from shared.subjects import EVENT_STREAM
from tests.support.layout import ROOT

DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
NATS = DEPLOY / "nats"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
COMPOSE_SCHEMA = DEPLOY / "compose" / "schema" / "compose-spec.json"
# The oldest Kubernetes the manifests are for (policy/v1 PDBs, StatefulSets' current fields).
KUBERNETES_VERSION = "1.33.0"
# Files under deploy/ that are not written by hand, or name QUIRE_ only as data.
NOT_DEPLOY_TEXT = {"compose-spec.json", "LICENSE"}
# A fieldRef's value, as the kubelet would give it, for the settings check.
FIELD_REFS = {"metadata.name": "bookie-zone-a-0", "status.podIP": "10.1.2.3"}
# Compose variables (`${VAR:-default}`, `${VAR:?message}`) stand for what the operator sets:
# the default where there is one, else a placeholder.
COMPOSE_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*)|:\?[^}]*)?\}")


def k8s_manifests() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def k8s_documents() -> Iterator[tuple[Path, dict]]:
    for path in k8s_manifests():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                yield path, doc


def deploy_text_files() -> list[Path]:
    return sorted(
        p
        for p in DEPLOY.rglob("*")
        if p.is_file()
        and p.name not in NOT_DEPLOY_TEXT
        and "keys" not in p.relative_to(DEPLOY).parts
        and "grafana" not in p.relative_to(DEPLOY).parts
    )


# -- Kubernetes -------------------------------------------------------------------------------


def test_every_k8s_manifest_matches_the_kubernetes_schemas() -> None:
    failures = []
    kinds = set()
    for path, doc in k8s_documents():
        kinds.add(doc["kind"])
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{path.name} {doc['kind']} {doc['metadata']['name']}: {exc}")
    assert not failures, "\n".join(failures)
    assert {"StatefulSet", "Deployment", "PodDisruptionBudget", "ConfigMap", "Service"} <= kinds


def test_the_kustomization_deploys_every_manifest_into_the_quire_namespace() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == "quire"
    assert sorted(kustomization["resources"]) == sorted(p.name for p in k8s_manifests())
    namespaces = [doc for _, doc in k8s_documents() if doc["kind"] == "Namespace"]
    assert [ns["metadata"]["name"] for ns in namespaces] == ["quire"]
    elsewhere = [
        doc["metadata"]["name"]
        for _, doc in k8s_documents()
        if doc["metadata"].get("namespace", "quire") != "quire"
    ]
    assert not elsewhere


def pod_specs() -> Iterator[tuple[str, dict]]:
    for _, doc in k8s_documents():
        if doc["kind"] in ("Deployment", "StatefulSet"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def test_a_bookie_pod_runs_one_cohosted_bookie_on_its_volumes() -> None:
    """One container, `python -m services.bookie` (the journal and the ledgerstore in one
    process, as `quire up` runs them), on a journal disk and ledger disks of its own."""
    bookies = [doc for _, doc in k8s_documents() if doc["kind"] == "StatefulSet"]
    bookies = [b for b in bookies if b["metadata"]["name"].startswith("bookie-")]
    assert len(bookies) >= 3
    locations = set()
    for sts in bookies:
        claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
        assert "journal" in claims and len(claims) >= 3  # a journal disk, ledger disks
        containers = sts["spec"]["template"]["spec"]["containers"]
        commands = [c["command"] for c in containers]
        assert commands == [["python", "-m", "services.bookie"]]
        mounts = [{m["name"]: m["mountPath"] for m in c["volumeMounts"]} for c in containers]
        assert all({n: m[n] for n in claims} == {n: mounts[0][n] for n in claims} for m in mounts)
        for container in containers:
            env = {e["name"]: e for e in container["env"]}
            assert env["QUIRE_BOOKIE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            locations.add(env["QUIRE_BOOKIE_LOCATION"]["value"])
            journal = json.loads(env["QUIRE_JOURNAL__JOURNAL_DIRECTORIES"]["value"])
            ledgers = json.loads(env["QUIRE_LEDGERSTORE__LEDGER_DIRECTORIES"]["value"])
            # Each directory on its own claim: the mount that holds it most closely.
            by_path = {path: name for name, path in mounts[0].items() if name in claims}
            disks = [claim_of(by_path, d) for d in journal + ledgers]
            assert len(set(disks)) == len(disks), f"{sts['metadata']['name']}: {disks}"
    assert len({loc.split("/")[1] for loc in locations}) == 3  # three zones


def claim_of(mounts: dict[str, str], directory: str) -> str:
    """The volume (of `mounts`, path -> volume) that holds `directory`."""
    holders = [p for p in mounts if directory == p or directory.startswith(p + "/")]
    return mounts[max(holders, key=len)]


def test_every_service_is_probed_where_it_answers() -> None:
    """The gateway serves /healthz and /readyz on its HTTP port (services/gateway/http.py);
    every other service beside /metrics on QUIRE_METRICS_PORT (shared/metrics.py
    serve_metrics): each container is probed on the port that serves them."""
    want = {"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/healthz"}
    probed = set()
    for name, spec in pod_specs():
        for container in spec["containers"]:
            where = f"{name}/{container['name']}"
            probes = {k: v["httpGet"] for k, v in container.items() if k.endswith("Probe")}
            probed.add(where)
            if where == "nats/nats":
                continue  # nats-server's own monitoring endpoint
            assert {kind: get["path"] for kind, get in probes.items()} == want, where
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            served = ports["http"] if where == "gateway/gateway" else int(env["QUIRE_METRICS_PORT"])
            at = {kind: ports[get["port"]] for kind, get in probes.items()}
            if container["command"][-1] == "services.bookie":
                # Co-hosted: the journal's port for liveness and startup (one event loop),
                # the ledgerstore's (set up after the journal) for readiness.
                store = int(env["QUIRE_LEDGERSTORE_METRICS_PORT"])
                assert store != served and set(ports.values()) == {served, store}, where
                assert at == {
                    "livenessProbe": served,
                    "readinessProbe": store,
                    "startupProbe": served,
                }
            else:
                assert set(at.values()) == {served}, where
    assert {"gateway/gateway", "metadata/metadata", "nats/nats"} <= probed
    assert any(where.startswith("bookie-") for where in probed)


def test_every_disruption_budget_selects_pods_and_bookies_go_one_at_a_time() -> None:
    pods = [
        spec_doc["spec"]["template"]["metadata"]["labels"]
        for _, spec_doc in k8s_documents()
        if spec_doc["kind"] in ("Deployment", "StatefulSet")
    ]
    for _, doc in k8s_documents():
        if doc["kind"] != "PodDisruptionBudget":
            continue
        selector = doc["spec"]["selector"]["matchLabels"]
        assert any(selector.items() <= labels.items() for labels in pods), doc["metadata"]
    budgets = {
        d["metadata"]["name"]: d["spec"]
        for _, d in k8s_documents()
        if d["kind"] == "PodDisruptionBudget"
    }
    assert budgets["bookies"]["maxUnavailable"] == 1
    assert budgets["bookies"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "bookie"


def test_secrets_are_referenced_never_committed() -> None:
    assert not [doc for _, doc in k8s_documents() if doc["kind"] == "Secret"]
    compose = COMPOSE.read_text()
    assert "PG_PASSWORD:?" in compose  # the operator must set it
    assert (NATS / ".gitignore").read_text().split() == ["keys/"]


# -- compose ----------------------------------------------------------------------------------


def test_the_compose_file_matches_the_compose_spec() -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    compose = yaml.safe_load(COMPOSE.read_text())
    errors = [
        f"{'/'.join(map(str, e.path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(compose)
    ]
    assert not errors, "\n".join(errors)


def test_the_compose_topology() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    commands = [" ".join(s.get("command", [])) for s in services.values()]
    assert sum(c == "python -m services.gateway" for c in commands) >= 2
    assert sum(c == "python -m services.bookie" for c in commands) >= 3
    assert not any(
        c in ("python -m services.journal", "python -m services.ledgerstore") for c in commands
    )
    for kind in ("metadata", "auditor", "replicator"):
        assert f"python -m services.{kind}" in commands
    assert {"nats-1", "nats-2", "nats-3", "pg-primary", "pg-standby", "lb"} <= set(services)
    # Every bookie has volumes of its own, and its ledgerstore a metrics port beside the
    # journal's.
    bookies = {name: s for name, s in services.items() if name.startswith("bookie-")}
    assert len(bookies) >= 3
    volumes = [v for s in bookies.values() for v in s["volumes"] if not v.startswith("..")]
    assert len(volumes) == len(set(volumes)) == 3 * len(bookies)
    for service in bookies.values():
        env = service["environment"]
        assert env["QUIRE_LEDGERSTORE_METRICS_PORT"] != env["QUIRE_METRICS_PORT"]


def test_every_host_path_the_compose_file_mounts_exists() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    missing = []
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                path = (COMPOSE.parent / source).resolve()
                # keys/ is what gen-keys.py writes, never committed.
                if NATS / "keys" not in path.parents and not path.exists():
                    missing.append(source)
    assert not missing


# -- NATS -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nats_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What gen-keys.py writes, in a temporary directory: nats.env's variables."""
    keys = tmp_path_factory.mktemp("keys")
    run = subprocess.run(
        [sys.executable, str(NATS / "gen-keys.py"), str(keys)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    for name in ("nats.env", "quire-services.nk", "system.nk", "sla.password"):
        assert (keys / name).stat().st_mode & 0o077 == 0, f"{name} is readable by others"
    again = subprocess.run(
        [sys.executable, str(NATS / "gen-keys.py"), str(keys)], capture_output=True, timeout=60
    )
    assert again.returncode == 1, "gen-keys.py must not overwrite keys"
    assert (keys / "quire-services.nk").read_text().startswith("SU")
    lines = (keys / "nats.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def nats_check(config: Path, env: dict[str, str]) -> None:
    run = subprocess.run(
        [str(nats_server_binary()), "-t", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", ""), **env},
    )
    assert run.returncode == 0 and "is valid" in run.stderr + run.stdout, run.stderr


@pytest.mark.parametrize("node", [1, 2, 3])
def test_each_nats_node_config_is_valid(
    node: int, nats_keys: dict[str, str], tmp_path: Path
) -> None:
    for name in ("common.conf", "accounts.conf", f"nats-{node}.conf"):
        shutil.copy(NATS / name, tmp_path / name)
    nats_check(tmp_path / f"nats-{node}.conf", nats_keys)


def test_a_nats_config_without_its_keys_is_refused(tmp_path: Path) -> None:
    for name in ("common.conf", "accounts.conf", "nats-1.conf"):
        shutil.copy(NATS / name, tmp_path / name)
    run = subprocess.run(
        [str(nats_server_binary()), "-t", "-c", str(tmp_path / "nats-1.conf")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert run.returncode != 0 and "SERVICES_NKEY" in run.stderr


def test_the_k8s_nats_config_is_deploy_nats_and_valid(
    nats_keys: dict[str, str], tmp_path: Path
) -> None:
    config = next(doc for _, doc in k8s_documents() if doc["metadata"]["name"] == "nats-config")[
        "data"
    ]
    for name in ("common.conf", "accounts.conf"):
        assert config[name] == (NATS / name).read_text(), f"{name} differs from deploy/nats/"
    for name, text in config.items():
        (tmp_path / name).write_text(text)
    nats_check(tmp_path / "nats.conf", {**nats_keys, "POD_NAME": "nats-0"})


def test_the_services_account_may_use_only_quire_subjects() -> None:
    accounts = (NATS / "accounts.conf").read_text()
    block = accounts[accounts.index("SERVICE_PERMISSIONS") :]
    block = block[: block.index("}")]
    subjects = re.findall(r'"([^"]+)"', block)
    prefix = QuireSettings.model_fields["subject_prefix"].default
    assert {s for s in subjects if not s.startswith("$") and s != "_INBOX.>"} == {f"{prefix}.>"}


# -- names against the code -------------------------------------------------------------------


def setting_names() -> tuple[set[str], set[str]]:
    """Every environment variable QuireSettings reads, and its sections' prefixes."""
    names, sections = set(), set()
    for field, info in QuireSettings.model_fields.items():
        name = f"QUIRE_{field.upper()}"
        names.add(name)
        model = info.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            sections.add(f"{name}__")
            names.update(f"{name}__{sub.upper()}" for sub in model.model_fields)
    return names, sections


def test_every_quire_variable_named_in_deploy_is_a_setting() -> None:
    names, sections = setting_names()
    # Named in deploy files, and not settings: the events stream's name.
    allowed = names | {EVENT_STREAM}
    unknown = set()
    for path in deploy_text_files():
        for found in re.findall(r"\bQUIRE_[A-Z0-9_]*", path.read_text(errors="replace")):
            if found == "QUIRE_" or found in sections or found in allowed:
                continue
            unknown.add(f"{path.relative_to(ROOT)}: {found}")
    assert not unknown, "not QuireSettings fields:\n" + "\n".join(sorted(unknown))


def expand(value: str, env: dict[str, str]) -> str:
    """A container env value with its $(VAR) references replaced, as the kubelet does."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), ""), value)


def workload_environments() -> Iterator[tuple[str, dict[str, str]]]:
    """Each process's QUIRE_* environment as the deploy files give it."""
    config_maps = {
        doc["metadata"]["name"]: doc["data"]
        for _, doc in k8s_documents()
        if doc["kind"] == "ConfigMap"
    }
    for name, spec in pod_specs():
        for container in spec["containers"]:
            env: dict[str, str] = {}
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    env.update(config_maps[source["configMapRef"]["name"]])
            for item in container.get("env", []):
                if "value" in item:
                    env[item["name"]] = expand(item["value"], env)
                elif "fieldRef" in item["valueFrom"]:
                    env[item["name"]] = FIELD_REFS[item["valueFrom"]["fieldRef"]["fieldPath"]]
            yield f"k8s {name}/{container['name']}", env
    for name, service in yaml.safe_load(COMPOSE.read_text())["services"].items():
        env = {
            key: COMPOSE_VARIABLE.sub(lambda m: m.group(2) or "x", str(value))
            for key, value in (service.get("environment") or {}).items()
        }
        yield f"compose {name}", env
    host_env: dict[str, str] = {}
    for env_file in ("quire.env", "bookie.env"):
        for line in (DEPLOY / "bookie" / env_file).read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                key, value = line.split("=", 1)
                host_env[key] = value[1:-1] if value[:1] == value[-1:] == "'" else value
    yield "bookie host", host_env


def test_every_workload_environment_loads_as_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Names and values: each process's environment builds a QuireSettings (JSON lists,
    placement policies, locations, ports all parse and pass the validators), and its
    database URL is one the metadata service takes."""
    seen = 0
    for env_name in [k for k in os.environ if k.startswith("QUIRE_")]:
        monkeypatch.delenv(env_name)
    for workload, env in workload_environments():
        quire_env = {k: v for k, v in env.items() if k.startswith("QUIRE_")}
        with monkeypatch.context() as patch:
            for key, value in quire_env.items():
                patch.setenv(key, value)
            try:
                settings = QuireSettings()
                # As the metadata service reads it (several hosts need read-write sessions).
                conninfo_from_url(settings.database_url)
            except Exception as exc:
                pytest.fail(f"{workload}: {exc}")
        seen += 1
    assert seen > 10


def named_modules() -> set[str]:
    modules = set()
    for path in deploy_text_files():
        text = path.read_text(errors="replace")
        # Whole names only: "python -m services.<kind>" names none.
        modules.update(re.findall(r"python3?\s+-m\s+([a-z_][\w.]*\w)(?![\w.<])", text))
        modules.update(re.findall(r'"-m",\s*"([a-z_][\w.]*)"', text))
    for _, spec in pod_specs():
        for container in spec["containers"]:
            command = container.get("command", [])
            if command[:2] == ["python", "-m"]:
                modules.add(command[2])
    return modules


def test_every_python_module_named_in_deploy_runs() -> None:
    modules = named_modules()
    assert {f"services.{k}" for k in ("bookie", "journal", "ledgerstore", "gateway")} <= modules
    # `python -m X` needs X.__main__ for a package.
    missing = [
        m
        for m in sorted(modules)
        if importlib.util.find_spec(m) is None
        or (
            importlib.util.find_spec(m).submodule_search_locations is not None
            and importlib.util.find_spec(f"{m}.__main__") is None
        )
    ]
    assert not missing


def test_every_quire_command_named_in_deploy_exists() -> None:
    cli = typer.main.get_command(quire_app)
    named = set()
    for path in deploy_text_files():
        text = path.read_text(errors="replace")
        named.update(re.findall(r"`quire ([a-z][\w-]*(?: [a-z][\w-]*)?)", text))
        named.update(re.findall(r"(?m)^\s*(?:\$ )?quire ([a-z][\w-]*(?: [a-z][\w-]*)?)", text))
    assert named
    missing = []
    for words in sorted(named):
        first, *rest = words.split()
        command = cli.commands.get(first)
        if command is None:
            missing.append(words)
        elif rest and hasattr(command, "commands") and rest[0] not in command.commands:
            missing.append(words)
    assert not missing


def test_the_dockerfile_copies_what_exists() -> None:
    copies = re.findall(r"(?m)^COPY (?!--from)(.+)$", (DEPLOY / "Dockerfile").read_text())
    sources = [part for line in copies for part in line.split()[:-1]]
    assert sources and all((ROOT / s).exists() for s in sources)
    for package in ("shared", "services", "quire", "analytics"):
        assert package in sources


def test_submit_sla_packages_analytics_and_shared(tmp_path: Path) -> None:
    """deploy/spark/submit-sla.sh with a stand-in spark-submit that records its arguments."""
    recorder = tmp_path / "spark-submit"
    recorder.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > {tmp_path}/args\n'
        f'for a in "$@"; do case "$a" in *.zip) cp "$a" {tmp_path}/py-files.zip;; esac; done\n'
    )
    recorder.chmod(0o755)
    (tmp_path / "password").write_text("p-secret\n")
    run = subprocess.run(
        [
            str(DEPLOY / "spark" / "submit-sla.sh"),
            "--master",
            "spark://m:7077",
            "--",
            "--since",
            "2026-11-23T00:00:00Z",
            "--output",
            "/tmp/out",
        ],
        env={
            "PATH": os.environ.get("PATH", ""),
            "QUIRE_NATS_URL": "nats://n1:4222,nats://n2:4222",
            "SLA_PASSWORD_FILE": str(tmp_path / "password"),
            "SPARK_SUBMIT": str(recorder),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    args = (tmp_path / "args").read_text().splitlines()
    job = args.index(str(ROOT / "analytics" / "sla" / "job.py"))
    assert args[:2] == ["--master", "spark://m:7077"] and "--py-files" in args[:job]
    assert args[job + 1 :] == [
        "--url",
        "nats://n1:4222,nats://n2:4222",
        "--user",
        "sla",
        "--password-file",
        str(tmp_path / "password"),
        "--since",
        "2026-11-23T00:00:00Z",
        "--output",
        "/tmp/out",
    ]
    names = zipfile.ZipFile(tmp_path / "py-files.zip").namelist()
    assert "analytics/sla/job.py" in names and "shared/latency.py" in names
    assert not [n for n in names if "__pycache__" in n]
