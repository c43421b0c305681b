# The two commands of the README.  Both set themselves up from nothing.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-dev

.PHONY: test demo lint typecheck bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## make test: lint, type-check and run the whole suite.
test: $(STAMP)
	$(PY) -m ruff check fanout tests bench examples
	$(PY) -m mypy fanout
	$(PY) -m pytest

## make demo: `fanout compare` with config/default.toml: one prompt, four models of the
## embedded upstream streaming side by side.  No key, no network.
DEMO_PROMPT ?= Tell me about rivers, in a few sentences.
demo: $(STAMP)
	$(VENV)/bin/fanout compare "$(DEMO_PROMPT)" --config config/default.toml

## make bench: the benchmarks of bench/, each printing its table.
bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) bench/parse.py
	$(PY) bench/upstream.py
	$(PY) bench/fanout.py
	$(PY) bench/render.py
	$(PY) bench/hostile.py
	$(PY) bench/batch.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
