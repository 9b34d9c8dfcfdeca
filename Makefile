# Two commands on a fresh machine (Python 3.11 and the package registries; no Node.js):
#   make pipeline   install everything pinned in requirements.lock, then `dvc repro` the default params.yaml
#   make test       install the same, then run the whole test suite (slow tests included)
# and, for the inner loop, `make test-fast` (no real `dvc repro`, no optional extras; docs/testing.md);
# and, after a run, `make metrics-diff` (headline metrics vs the committed ones, docs/comparing.md);
# `make docs` builds the documentation site into site/; `make ci` is what CI runs (.ci/run);
# `make mutation` measures how many planted bugs the tests catch (docs/testing.md).
PYTHON ?= python3
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup pipeline test test-fast durations metrics-diff docs ci bench lock mutation

setup: $(VENV)/.installed .dvc/offline_plots.html

# requirements.lock pins every platform it was resolved for (pyproject.toml [tool.uv] environments);
# pip keeps the lines whose environment markers hold here. TORCH_INDEX (e.g.
# https://download.pytorch.org/whl/cpu, the CPU-only build) installs torch and torchvision at the
# locked versions from that index instead, without hash checks, and skips the CUDA libraries the
# PyPI builds pull in on Linux (docs/install.md "CPU-only or CUDA").
TORCH_INDEX ?=
NO_TORCH := awk '/^[a-z0-9]/ { split($$1, a, "=="); skip = a[1] ~ /^(torch|torchvision|triton|cuda-.*|nvidia-.*)$$/ \
	&& a[1] != "nvidia-ml-py" } !skip'
$(VENV)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
ifeq ($(TORCH_INDEX),)
	$(VENV)/bin/pip install --quiet --require-hashes -r requirements.lock
else
	$(VENV)/bin/pip install --quiet --no-deps --index-url $(TORCH_INDEX) \
		$$(grep -o '^torch==[^ ;]*' requirements.lock) $$(grep -o '^torchvision==[^ ;]*' requirements.lock)
	$(NO_TORCH) requirements.lock > $(VENV)/requirements-no-torch.txt
	$(VENV)/bin/pip install --quiet --require-hashes -r $(VENV)/requirements-no-torch.txt
	$(VENV)/bin/pip check
endif
	$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .
	$(VENV)/bin/python -c "import torch, torchvision, dvc, lmclab" || { echo "make setup: the venv does \
	not import (above); requirements.lock covers Linux x86-64 and aarch64, macOS arm64 (docs/install.md)" >&2; exit 1; }
	touch $@

# vega, vega-lite and vega-embed from the bundle the PyPI package vl-convert-python ships (pinned in
# requirements.lock; no Node.js), inlined into the HTML template of `dvc plots show`/`diff` so the page
# renders offline (docs/plots-page.md)
.dvc/offline_plots.html: tools/offline_plots.py $(wildcard .dvc/plots/*.json) $(VENV)/.installed
	$(VENV)/bin/python tools/offline_plots.py

pipeline: setup
	dvc repro

# Both tiers run on WORKERS pytest-xdist processes, a test file per worker at a time (module fixtures stay
# in one process), the files longest in tests/durations.json first (tests/suite_cost.py; xdist would
# otherwise order them by their number of tests), and print their 30 slowest tests. pytest exits 5 when it
# collects no test; that is not a failure of the suite. PYTEST_ARGS adds to either (e.g. "tests/search").
WORKERS ?= 2
PYTEST := $(VENV)/bin/python -m pytest -n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=30
NO_TESTS_OK := rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi; exit $$rc
FAST := -m "not slow and not extras"

# the whole suite, as CI runs it
test: setup
	$(PYTEST) $(PYTEST_ARGS); $(NO_TESTS_OK)

# the inner loop: every package's fast tests, no real `dvc repro` (marked slow), no optional extras
# (marked extras: timm, transformers, datasets)
test-fast: setup
	$(PYTEST) $(FAST) $(PYTEST_ARGS); $(NO_TESTS_OK)

# both tiers with their times recorded into tests/durations.json, then the suite-cost section of
# docs/testing.md generated from it (tools/test_durations.py); tests/meta/test_suite_budget.py holds
# the record against the budgets
BUDGET_TESTS := --ignore=tests/meta/test_suite_budget.py  # they check the record being written
durations: setup
	$(PYTEST) $(FAST) $(BUDGET_TESTS) --record-durations fast
	$(PYTEST) $(BUDGET_TESTS) --record-durations full
	$(VENV)/bin/python tools/test_durations.py

# mutation testing (tools/mutation.py, docs/testing.md): MODULES are packages (core), modules
# (lmclab.core.spec) or files; none given: the library modules changed since SINCE (auto: the merge base
# of HEAD with origin/main, else main, uncommitted changes included), and when none changed a seeded
# first draw of 10 mutants per package of every package. SAMPLE mutants are drawn per package with SEED
# (0: all); MUTATION_ARGS e.g. "--survivors" (test the recorded survivors again after adding tests),
# "--trust-tests" or "--check-equivalents". Writes reports/mutation/results.json and docs/mutation.md
MUTATION_ARGS ?=
MODULES ?=
SINCE ?= auto
SAMPLE ?= 0
SEED ?= 0
mutation: setup
	$(VENV)/bin/python tools/mutation.py $(MODULES) --since $(SINCE) --sample $(SAMPLE) --seed $(SEED) $(MUTATION_ARGS)

# DIFF_ARGS e.g. "--baseline main" or "--baseline my-exp --new other-exp"; exits 1 beyond tolerance
metrics-diff: setup
	$(VENV)/bin/python tools/metrics_diff.py $(DIFF_ARGS)

# the site (mkdocs.yml, docs/) into site/: open site/index.html, or `mkdocs serve` for a live preview
docs: setup
	$(VENV)/bin/mkdocs build --strict

ci:
	bash .ci/run

bench: setup
	$(VENV)/bin/python benchmarks/bench_methods.py --sizes mlp_trained --methods wm,am --repeats 5 --out benchmarks/scratch/search.json

# regenerate requirements.lock from pyproject.toml (the library, [pipeline], [models] and [dev]) for every platform
# of [tool.uv] environments, with hashes; needs uv (pip install uv). The resolver's output and what
# the lock pins on each platform go to reports/lock/resolution.txt
LOCK := uv pip compile pyproject.toml --extra pipeline --extra models --extra text --extra dev --universal --generate-hashes \
	--python-version 3.11 -o requirements.lock
lock:
	@mkdir -p reports/lock
	{ echo "# $$(date -u '+%Y-%m-%d %H:%M UTC'), $$(uv --version)"; echo '$$ $(LOCK)'; \
		$(LOCK) 2>&1 >/dev/null; } > reports/lock/resolution.txt
	$(VENV)/bin/python tools/lock_check.py --pins-only linux-x86_64 linux-aarch64 macos-arm64 \
		>> reports/lock/resolution.txt
	cat reports/lock/resolution.txt
