# Two commands on a fresh machine (Python 3.11 + the package registries):
#   make pipeline   install everything pinned in requirements.lock, then `dvc repro` the default params.yaml
#   make test       install the same, then run the whole test suite (slow tests included)
PYTHON ?= python3
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup pipeline test bench lock

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --require-hashes -r requirements.lock
	$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

pipeline: setup
	dvc repro

# pytest exits 5 when it collects no test; that is not a failure of the suite
test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi; exit $$rc

bench: setup
	$(VENV)/bin/python benchmarks/bench_search.py

# regenerate the lock file after editing requirements.in (needs uv: pip install uv)
lock:
	uv pip compile requirements.in --generate-hashes --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 -o requirements.lock
