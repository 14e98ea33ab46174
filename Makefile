# Two entry points for a fresh machine: `make simulate` (the main job) and
# `make test` (the test suite). Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
ARGS   ?=

.PHONY: simulate test clean

$(VENV)/.installed-%: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$*]'
	touch $@

simulate: $(VENV)/.installed-report
	$(PY) -m simulate $(ARGS)

test: $(VENV)/.installed-test,oracles,report
	$(PY) -m pytest $(ARGS)

clean:
	rm -rf $(VENV) reports .pytest_cache .hypothesis
