# The two commands a new machine needs: `make demo` and `make test`.
PYTHON ?= python3.12
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup demo test lint protos clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[demo,pubsub,test]'
	touch $@

demo: setup
	$(BIN)/elastic-sidecar demo $(ARGS)

test: setup
	$(BIN)/python -m pytest $(ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Regenerate the gRPC code from protos/ (tests fail when it is stale).
protos: setup
	$(BIN)/python -m protos.generate

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
