# The two commands of README.md: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# Hosts of the simulated fleet: the e2e tests need three (a bump's canary and two more).
HOSTS      ?= 3
DEMO_HOSTS ?= 2

.PHONY: setup testbed-deps demo test test-unit test-twin test-e2e lint testbed-up testbed-down bench clean

$(BIN)/rigfleet: pyproject.toml testbed/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,plot]' -e ./testbed
	touch $@

setup: $(BIN)/rigfleet

testbed-deps:
	bash scripts/ensure-docker.sh

testbed-up: setup testbed-deps
	$(BIN)/rigfleet testbed up --hosts $(DEMO_HOSTS)

testbed-down: setup
	$(BIN)/rigfleet testbed down

# Bare simulated hosts to serving: testbed, converge, then the endpoints.
demo: testbed-up
	PATH=$(CURDIR)/$(BIN):$$PATH bash scripts/demo.sh

test: setup testbed-deps
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest tests/unit -q -n 2
	$(BIN)/python -m pytest testbed/tests -q -n 2
	RIGFLEET_TESTBED_HOSTS=$(HOSTS) $(BIN)/python -m pytest tests/e2e -v --durations=20

# The product's unit tests need the project alone (no testbed package, no ../shared).
test-unit: setup
	$(BIN)/python -m pytest tests/unit -q -n 2

# The twin's own tests, and the product's against the twin's servers in-process.
test-twin: setup
	$(BIN)/python -m pytest testbed/tests -q -n 2

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

clean: testbed-down
	rm -rf .testbed
