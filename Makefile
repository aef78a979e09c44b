# The two commands a new machine needs: `make demo` and `make test`.
PYTHON ?= python3.12
VENV   ?= .venv
BIN    := $(VENV)/bin
# The real MaxText (maxtext[tpu]==0.2.5, about 2.5 GB) lives in its own venv:
# its pins must not move the daemon's. tests/maxtext runs it in subprocesses.
VENV_MAXTEXT ?= .venv-maxtext

.PHONY: setup setup-maxtext system-deps demo test test-unit test-integration test-e2e test-fast test-maxtext lint protos clean \
	bench-recovery bench-scale bench-detection bench-footprint bench-docs

# Headless Chromium renders the status page in a test (Debian's package; root or sudo).
system-deps:
	@command -v chromium >/dev/null 2>&1 || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium; }

setup: $(VENV)/.installed

setup-maxtext: $(VENV_MAXTEXT)/.installed

$(VENV_MAXTEXT)/.installed: pyproject.toml constraints-maxtext.txt
	$(PYTHON) -m venv $(VENV_MAXTEXT)
	$(VENV_MAXTEXT)/bin/pip install -q --upgrade pip
	$(VENV_MAXTEXT)/bin/pip install -q -c constraints-maxtext.txt 'maxtext[tpu]==0.2.5' \
		grpcio-health-checking grpcio-reflection structlog prometheus-client aiohttp
	$(VENV_MAXTEXT)/bin/pip install -q --no-deps -e .
	$(VENV_MAXTEXT)/bin/pip check
	touch $@

# This checkout, installed editable: the checkout itself goes on sys.path (pyproject.toml's
# package-dir), so the demo's parts and bench, which the wheel leaves out, import from the tree.
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[demo,pubsub,tpu,test,bench,drill]'
	touch $@

demo: setup
	$(BIN)/elastic-sidecar demo $(ARGS)

# Everything CI runs (.ci/run): both venvs, lint, then the tiers in order, each stopping the run when it
# fails (tests/conftest.py assigns every test one tier; hypothesis runs its derandomised `ci` profile).
PYTEST := $(BIN)/python -m pytest
test: setup setup-maxtext system-deps lint
	$(PYTEST) -m unit $(ARGS)
	$(PYTEST) -m integration $(ARGS)
	$(PYTEST) -m e2e $(ARGS)

# No process started: the decision core, parsers, models, in-process servers (a few minutes).
test-unit: setup
	$(PYTEST) -m unit $(ARGS)

# Daemons on loopback (in-process or as processes) with a fake trainer, the Pub/Sub emulator.
test-integration: setup
	$(PYTEST) -m integration $(ARGS)

# The JAX trainer's simulated job, the real MaxText, Chromium, wheel builds, benchmark smoke runs.
test-e2e: setup setup-maxtext system-deps
	$(PYTEST) -m e2e $(ARGS)

# Without MaxText (no 2.5 GB venv): the quick loop while developing.
test-fast: setup system-deps
	$(PYTEST) -m "not maxtext" $(ARGS)

test-maxtext: setup setup-maxtext
	$(PYTEST) -m maxtext $(ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Regenerate the gRPC code from protos/ (tests fail when it is stale).
protos: setup
	$(BIN)/python -m protos.generate

# The documented benchmark runs (quiet machine, committed tree): each merges its result into
# docs/benchmarks.json; bench-docs renders docs/benchmarks.md and its plots from that file alone.
BENCH := $(BIN)/python -m bench
BENCH_OUT ?= docs/benchmarks.json

# The real MaxText (docs/maxtext.md): 4 slices of 2 CPU devices, a kill, every strategy, checkpoint period
# 1,000 steps, 3 rounds (and the sidecar's notice). MAXTEXT_MODEL=larger runs the ten-times-larger model
# (its rows: maxtext-larger).
MAXTEXT_MODEL ?= tiny
bench-recovery: setup setup-maxtext
	$(BENCH) recovery --require-clean --maxtext-model $(MAXTEXT_MODEL) --merge-into $(BENCH_OUT) $(ARGS)

# 10,000 and 25,000 workers (a 100,000-chip job's hosts) at the shipped heartbeats (0.25 s / 1.2 s),
# registration unpaced, 3 hold cycles a run, 3 runs a size; then the coordinator SIGKILLed and
# restarted under that load, 3 runs a size. Give the machine the coordinator nodes' receive-buffer cap
# first (deploy/gke/node-system-config.yaml): sudo sysctl -w net.core.rmem_max=67108864; the result records it.
bench-scale: setup
	$(BENCH) scale --require-clean --sizes 10000,25000 --scenarios hold_cycles,coordinator_restart \
		--repeats 3 --merge-into $(BENCH_OUT) $(ARGS)

bench-detection: setup
	$(BENCH) detection --require-clean --merge-into $(BENCH_OUT) $(ARGS)

bench-footprint: setup
	$(BENCH) footprint --require-clean --merge-into $(BENCH_OUT) $(ARGS)

bench-docs: setup
	$(BIN)/python -m bench.report --json $(BENCH_OUT) --out $(dir $(BENCH_OUT))

clean:
	rm -rf $(VENV) $(VENV_MAXTEXT) .pytest_cache build *.egg-info
