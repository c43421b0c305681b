# The two commands of the README.  Both set themselves up from nothing.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-dev

.PHONY: test demo docs lint typecheck bench clean browser haproxy

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## make browser: Debian's chromium for the page's test in tests/serve/test_browser.py,
## installed only when it is missing (Playwright drives it; its own browser download is
## never used).
CHROMIUM ?= /usr/bin/chromium
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@test -x $(CHROMIUM) || { $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q chromium; }

## make haproxy: Debian's haproxy for tests/serve/test_haproxy.py, which runs
## examples/haproxy.cfg in front of two replicas of `fanout serve`; installed only when
## it is missing.
HAPROXY ?= /usr/sbin/haproxy
haproxy:
	@test -x $(HAPROXY) || { echo "installing haproxy (apt): tests/serve/test_haproxy.py runs examples/haproxy.cfg"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends haproxy; }

## make docs: the documentation (docs/, mkdocs.yml) built into site/ with --strict: a broken
## link, anchor or API reference fails it.  Offline: no fonts or anything else fetched.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d site

## make test: lint, type-check, build the docs and run the whole suite (the page's test in
## chromium and the load balancer's in haproxy too).
test: $(STAMP) browser haproxy docs
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
	$(PY) bench/serve.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis site
