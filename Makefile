# The two commands of the README.  Both set themselves up from nothing.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
# What `make demo` runs (the package and the service) and, on top, what `make test` needs
# (linters, test tools, the SDKs the tests compare against, Ray, the docs' builder).
RUN     = $(VENV)/.installed-run
STAMP   = $(VENV)/.installed-dev

.PHONY: test demo docs lint typecheck bench clean browser haproxy

$(RUN): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing fanout and its service (pip install -e '.[serve]') into $(VENV)"
	$(PY) -m pip install --quiet -e '.[serve]'
	touch $(RUN)

$(STAMP): $(RUN) pyproject.toml
	@echo "installing the test and lint tools, Ray and the docs builder (pip install -e '.[dev,ray]') into $(VENV)"
	$(PY) -m pip install --quiet -e '.[dev,ray]'
	touch $(STAMP)

## make browser: Debian's chromium for the page's test in tests/serve/test_browser.py,
## installed only when it is missing (Playwright drives it; its own browser download is
## never used).
CHROMIUM ?= /usr/bin/chromium
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@test -x $(CHROMIUM) || { echo "installing chromium and a font (apt, without recommended packages): tests/serve/test_browser.py and tests/eval/test_html_browser.py drive it"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends chromium fonts-liberation; }

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
demo: $(RUN)
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
