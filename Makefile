# Two commands set everything up on a fresh machine with Python 3.11+ (JAX >= 0.7 needs it):
#   make demo   -> .venv, install, `jaxmem reproduce --quick --only $(DEMO)` (reports/quick/REPORT.md)
#   make test   -> .venv, install .[dev], the test suite
# A second run reinstalls nothing unless pyproject.toml or constraints.txt changed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
# constraints.txt pins the versions the suite was last verified with.
PIP_INSTALL := $(PIP) install --quiet --disable-pip-version-check -c constraints.txt
PYTEST_ARGS ?=
# the suite runs on pytest-xdist workers (one per core on the 2-core CI machine); WORKERS=0 runs it in-process.
# --dist loadfile: a test module runs whole on one worker, so its tests share that process's compiled programs;
# --no-loadscope-reorder: modules go out in the order tests/conftest.py gives (the longest first, so that the
# workers finish together), not by their number of tests.
WORKERS ?= 2
XDIST = $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadfile --no-loadscope-reorder)

.PHONY: demo test test-fast notebooks install install-dev bench lint clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "jaxmem needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP_INSTALL) -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP_INSTALL) -e '.[dev]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# the quick experiments that take minutes; `make demo DEMO=` runs every registered one (hours on 2 cores)
DEMO ?= lm_baseline,dnc_tasks,assoc_capacity,assoc_capacity_onehot,assoc_drift,assoc_error_propagation

demo: $(VENV)/.installed
	$(BIN)/jaxmem reproduce --quick --out reports/quick $(if $(DEMO),--only $(DEMO),)

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

# the inner loop: everything but the subprocess and end-to-end tests marked slow
test-fast: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS)

# every notebook executed end to end at tiny size (`make test` executes the quickstart only); CI runs it too
notebooks: $(VENV)/.installed-dev
	JAXMEM_TEST_NOTEBOOKS=all $(BIN)/python -m pytest -q $(XDIST) tests/test_notebooks.py -k executes $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(PIP_INSTALL) -e '.[bench]'
	$(BIN)/jaxmem bench

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check jaxmem tests configs

clean:
	rm -rf $(VENV) reports runs .pytest_cache
