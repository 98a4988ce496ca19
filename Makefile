# shadowgrad quick start. Every target installs what it needs, idempotently:
#   make demo   -> system packages (when root), the venv, then the emulated demo (shadowgrad demo)
#   make test   -> system packages (when root), the venv, then lint + the test suite
# Variables: PYTHON (interpreter that creates the venv), VENV, PYTEST_ARGS.

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip
APT_PKGS    := mininet iproute2 ethtool iputils-ping tcpdump gcc libc6-dev libssl-dev
PYTEST_ARGS ?=
SCENARIO    ?= default
DEMO_ARGS   ?=

.PHONY: help deps install demo lint typecheck test test-fast bench bench-quick clean

help:
	@echo "make demo       install everything (idempotent), then run the emulated demo (SCENARIO=default)"
	@echo "make test       install everything (idempotent), then lint, type-check and run the tests"
	@echo "make install    system packages (root only) + $(VENV) with torch==2.13.0 and -e .[all,dev] + Mininet"
	@echo "make lint       ruff check, ruff format --check, mypy"
	@echo "make test-fast  the tests without lint, skipping tests marked slow"
	@echo "make bench      every benchmark with its default settings, then docs/benchmarks.md"
	@echo "make bench-quick  every benchmark in its quick mode (minutes), then docs/benchmarks.md"

# System packages: only as root; otherwise say what is missing and carry on (the tests that need
# them skip). Skips apt entirely when everything is already installed.
deps:
	@missing=""; for p in $(APT_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then echo "deps: system packages present"; \
	elif [ "$$(id -u)" = 0 ]; then \
	  echo "deps: installing$$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	else echo "deps: not root; cannot install$$missing (netns tests will skip). Run 'sudo make deps'."; fi

$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: the CPU wheel on local disk (an unpinned torch pulls a CUDA build)
	$(PIP) install -q torch==2.13.0
	touch $@

$(VENV)/.installed: $(VENV)/.torch pyproject.toml shadow/_rxnative.c
	$(PIP) install -q -e '.[all,dev]'
	touch $@

# Debian's Mininet (a system package) made importable from the venv: that one package, linked
# into a folder of the venv's own named by a .pth (tools/system_mininet.py says why not more)
install: deps $(VENV)/.installed
	@$(PY) tools/system_mininet.py

demo: install
	$(VENV)/bin/shadowgrad demo $(SCENARIO) --out demo-out $(DEMO_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) tools/typecheck.py

typecheck: lint

test: install lint
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(VENV)/.installed
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(PY) bench/harness.py --full

bench-quick: $(VENV)/.installed
	$(PY) bench/harness.py --quick

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache .hypothesis
