# remediator — make targets. `make` alone lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Test processes side by side (one per core); tests marked serial then run alone: they judge
# how fast the server answers and need the machine to themselves.
TEST_WORKERS ?= 2
STAMP := $(VENV)/.installed

.PHONY: help install system-deps postgres run demo sim test test-fast lint format bench bench-quick bench-soak bench-instructions bench-ingest docs clean

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install remediator with its dev tools

system-deps: ## Install the programs the tests and benchmarks drive (Prometheus, Alertmanager, kubectl, Chromium, wrk, valgrind)
	@bash .ci/system-deps

postgres: ## Make sure PostgreSQL answers on 127.0.0.1:5432
	@bash .ci/postgres

run: install ## Run the server on SQLite with the playbooks in rules/ (http://127.0.0.1:8080)
	$(BIN)/remediator serve

demo: install ## Replay real GPU alerts against the simulator and a real server (~20 s)
	$(BIN)/remediator demo

sim: install ## Run the simulated GPU cluster (Kubernetes API on 127.0.0.1:6443)
	$(BIN)/remediator sim

lint: install ## ruff, formatting, mypy --strict, import contracts, playbook lint
	$(BIN)/ruff check remediator tests bench migrations
	$(BIN)/ruff format --check remediator tests bench migrations
	$(BIN)/mypy remediator
	$(BIN)/lint-imports
	$(BIN)/remediator lint rules

format: install ## Reformat and autofix
	$(BIN)/ruff format remediator tests bench migrations
	$(BIN)/ruff check --fix remediator tests bench migrations

test: install system-deps postgres lint ## The whole suite, on SQLite and Postgres (what CI runs)
	$(BIN)/python -m pytest -q -p no:randomly -n $(TEST_WORKERS) --dist loadfile -m "not serial"
	$(BIN)/python -m pytest -q -p no:randomly -m serial

test-fast: install ## Unit tests only
	$(BIN)/python -m pytest -q tests/unit

bench: install system-deps postgres ## Every fleet-scale benchmark, one Markdown table (~1 h; BENCH_QUICK=1: minutes)
	$(BIN)/python -m bench.run

bench-quick: install ## The same benchmarks with short phases and small sizes (a smoke run)
	$(BIN)/python -m bench.run --quick

bench-soak: install ## RSS of `remediator serve` under a light alert load for an hour
	$(BIN)/python -m bench.run --only soak --no-postgres

bench-instructions: install ## Instructions a webhook delivery costs, against the bare server (callgrind)
	$(BIN)/python -m bench.instructions

bench-ingest: install ## Benchmark the webhook against a bare durable-insert server
	$(BIN)/python -m bench.ingest

clean: ## Remove the virtualenv and local databases
	rm -rf $(VENV) remediator.db remediator.db-wal remediator.db-shm artifacts
