# The two commands of the README.  Both set themselves up from nothing.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
# What `make demo` runs (the package and the service), what `make docs` builds with (the
# package and MkDocs: the docs extra), and, on top of both, what `make test` needs (linters,
# test tools, the SDKs the tests compare against, Ray).
RUN     = $(VENV)/.installed-run
DOCS    = $(VENV)/.installed-docs
STAMP   = $(VENV)/.installed-dev
# The sans-I/O core compiled with mypyc (build_core.py): fanout/core/*.so, gitignored.
# The stamp holds "compiled", or "pure" when this machine has no C compiler.
CORE    = build/mypyc/core
PURE    = build/pure

.PHONY: test demo docs lint typecheck bench clean browser haproxy redis core

$(RUN): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing fanout and its service (pip install -e '.[serve]') into $(VENV)"
	$(PY) -m pip install --quiet -e '.[serve]'
	touch $(RUN)

# Only the package and the docs extra (~25 s and ~210 MB from nothing, Material and Babel
# most of it), not the dev tools and Ray (~70 s and ~1.3 GB with local wheels, minutes online).
# A venv the dev extra was installed into has them already (dev holds fanout[docs]): the
# stamp then takes the dev stamp's time, so neither is out of date with the other.
$(DOCS): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if [ $(STAMP) -nt pyproject.toml ]; then \
	  touch -r $(STAMP) $(DOCS); \
	else \
	  echo "installing fanout and the docs builder (pip install -e '.[docs]') into $(VENV)"; \
	  $(PY) -m pip install --quiet -e '.[docs]' && touch $(DOCS); \
	fi

$(STAMP): $(RUN) $(DOCS) pyproject.toml
	@echo "installing the test and lint tools and Ray (pip install -e '.[dev,ray]') into $(VENV)"
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

## make redis: Debian's redis-server for tests/test_shared_limit.py, which starts its own
## on a free loopback port (the shards' shared limit); installed only when it is missing.
REDIS_SERVER ?= /usr/bin/redis-server
redis:
	@test -x $(REDIS_SERVER) || { echo "installing redis-server (apt): tests/test_shared_limit.py runs the shards' shared limit on it"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends redis-server; }

## make docs: the documentation (docs/, mkdocs.yml) built into site/ with --strict: a broken
## link, anchor or API reference fails it.  It installs the docs extra only, not the dev tools.
## Offline: no fonts or anything else fetched, and site/index.html opened from disk searches
## (Material's offline plugin, with our own worker polyfill: docs/javascripts/iframe-worker.js).
docs: $(DOCS)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d site

## make core: compile the sans-I/O core with mypyc (~40 s on 2 cores), again whenever one
## of its sources changed.  Without a C compiler, one line says so and the core stays pure.
core: $(CORE)
$(CORE): $(STAMP) build_core.py $(wildcard fanout/core/*.py)
	@mkdir -p $(dir $@)
	@if why=$$($(PY) build_core.py --check-compiler 2>&1); then \
	  echo "compiling the sans-I/O core with mypyc (python build_core.py)"; \
	  $(PY) build_core.py && echo compiled > $@; \
	else \
	  echo "not compiling the core: $$why; the suite runs on the pure-Python core only"; \
	  $(PY) build_core.py --clean && mkdir -p $(dir $@) && echo pure > $@; \
	fi

## make test: lint, type-check, build the docs, compile the core and run the whole suite on
## it (the page's test in chromium and the load balancer's in haproxy too), then again on
## the pure-Python core: a copy of the tree without the compiled modules, first on
## PYTHONPATH, so the subprocesses the tests start (python -m fanout, .venv/bin/fanout)
## import it too.
test: $(STAMP) browser haproxy redis docs $(CORE)
	$(PY) -m ruff check fanout tests bench examples build_core.py hatch_build.py
	$(PY) -m mypy fanout
	FANOUT_TEST_CORE=$$(cat $(CORE)) $(PY) -m pytest
	@if [ "$$(cat $(CORE))" = compiled ]; then \
	  echo "the whole suite again, on the pure-Python core ($(PURE)/)"; \
	  rm -rf $(PURE) && mkdir -p $(PURE) && \
	  tar -cf - --exclude=./.git --exclude=./$(VENV) --exclude=./build --exclude=./site \
	    --exclude='*.so' --exclude='*.pyd' --exclude=__pycache__ --exclude=./.hypothesis \
	    --exclude=./.pytest_cache --exclude=./.mypy_cache --exclude=./.ruff_cache . \
	    | tar -xf - -C $(PURE) && \
	  cd $(PURE) && PYTHONPATH=$$PWD FANOUT_TEST_CORE=pure $(abspath $(PY)) -m pytest; \
	fi

## make demo: `fanout compare` with config/default.toml: one prompt, four models of the
## embedded upstream streaming side by side.  No key, no network.  It does not compile the
## core (that needs the dev tools and ~40 s), but a core that `make test` compiled is
## compiled again first when one of its sources changed.
DEMO_PROMPT ?= Tell me about rivers, in a few sentences.
demo: $(RUN)
	@if [ -f $(CORE) ]; then $(MAKE) --no-print-directory $(CORE); fi
	$(VENV)/bin/fanout compare "$(DEMO_PROMPT)" --config config/default.toml

## make bench: the benchmarks of bench/, each printing its table.
bench: $(STAMP) redis
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) bench/parse.py
	$(PY) bench/upstream.py
	$(PY) bench/fanout.py
	$(PY) bench/render.py
	$(PY) bench/hostile.py
	$(PY) bench/batch.py
	$(PY) bench/serve.py
	$(PY) bench/shards.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis site build
	rm -f fanout/core/*.so fanout/core/*.pyd
