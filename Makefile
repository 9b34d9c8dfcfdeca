# Two commands on a fresh machine (Python 3.11 and the package registries; no Node.js):
#   make pipeline   install everything pinned in requirements.lock, then `dvc repro` the default params.yaml
#   make test       install the same, then run the whole test suite (slow tests included)
# and, after a run, `make metrics-diff` (headline metrics vs the committed ones, docs/comparing.md);
# `make docs` builds the documentation site into site/; `make ci` is what CI runs (.ci/run).
PYTHON ?= python3
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup pipeline test metrics-diff docs ci bench lock

setup: $(VENV)/.installed .dvc/offline_plots.html

$(VENV)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --require-hashes -r requirements.lock
	$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

# vega, vega-lite and vega-embed from the bundle the PyPI package vl-convert-python ships (pinned in
# requirements.lock; no Node.js), inlined into the HTML template of `dvc plots show`/`diff` so the page
# renders offline (docs/plots-page.md)
.dvc/offline_plots.html: tools/offline_plots.py $(wildcard .dvc/plots/*.json) $(VENV)/.installed
	$(VENV)/bin/python tools/offline_plots.py

pipeline: setup
	dvc repro

# pytest exits 5 when it collects no test; that is not a failure of the suite
test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi; exit $$rc

# DIFF_ARGS e.g. "--baseline main" or "--baseline my-exp --new other-exp"; exits 1 beyond tolerance
metrics-diff: setup
	$(VENV)/bin/python tools/metrics_diff.py $(DIFF_ARGS)

# the site (mkdocs.yml, docs/) into site/: open site/index.html, or `mkdocs serve` for a live preview
docs: setup
	$(VENV)/bin/mkdocs build --strict

ci:
	bash .ci/run

bench: setup
	$(VENV)/bin/python benchmarks/bench_search.py

# regenerate the lock file after editing requirements.in (needs uv: pip install uv)
lock:
	uv pip compile requirements.in --generate-hashes --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 -o requirements.lock
