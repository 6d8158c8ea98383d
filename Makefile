# Quire: `make run` starts a local cluster, `make test` runs every test.
# Both create .venv on first use and install the pinned dependencies into it.

PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	&& { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test faults multihost lint lock proto dashboards clean

$(STAMP): pyproject.toml constraints.txt
	@test -n "$(PYTHON)" || { echo "Quire needs Python 3.11 or newer" >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/quire up $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The fault suite (docs/reliability.md): the scenarios of tier TIER (short: a few minutes, also
# run by `make test`; long: every fault kind and the multi-host run's partitions, ~25 min) on
# fresh clusters; runs, logs and summary.json in OUT. Fails when a run lost or invented an
# acknowledged entry (or broke another rule) or when the control run (fsync off) shows no loss.
TIER ?= short
OUT ?= faults-out
faults: $(STAMP)
	rm -rf $(OUT)
	$(BIN)/python -m quire.faults --tier $(TIER) --out $(OUT)

# The multi-host run (docs/reliability.md, "Multi-host run"): Quire over network namespaces on
# this machine, partitioned (a NATS minority, a bookie host), checked; needs root.
MULTIHOST_TIER ?= short
MULTIHOST_OUT ?= multihost-out
multihost: $(STAMP)
	rm -rf $(MULTIHOST_OUT)
	$(BIN)/python -m quire.faults.multihost --tier $(MULTIHOST_TIER) --out $(MULTIHOST_OUT)

# The deterministic simulator: SEEDS seeds of the real protocol cores under faults; ends with
# the line "N seeds, F failures". One seed: $(BIN)/python -m quire.sim --seed S --log
simulate: $(STAMP)
	$(BIN)/python -m quire.sim --seeds $(SEEDS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# Regenerate the gRPC code (quire/v1/) from proto/quire/v1/ledgers.proto.
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. \
		proto/quire/v1/ledgers.proto

# Regenerate the Grafana dashboards (deploy/grafana/dashboards/*.json) from
# deploy/grafana/generate.py; tests/unit/test_dashboards.py fails until the JSON is current.
dashboards: $(STAMP)
	$(BIN)/python deploy/grafana/generate.py

# Re-pin every dependency to what resolves today.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet --upgrade pip && .lock-venv/bin/pip install --quiet '.[dev]'
	{ echo '# Pinned versions of every dependency (pip install -c constraints.txt). Regenerate with `make lock`.'; \
	  .lock-venv/bin/pip freeze --exclude quire; } > constraints.txt
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) .pytest_cache
