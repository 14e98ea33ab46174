# Two entry points for a fresh machine: `make simulate` (the main job) and
# `make test` (the test suite). Each creates .venv and installs what it needs,
# every package at the version constraints.txt pins.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
ARGS   ?=
# The extras constraints.txt covers: every one `make` installs, and the integration extras.
PINNED_EXTRAS := test,oracles,report,torch,deploy

.PHONY: simulate test clean constraints

$(VENV)/.installed-%: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade -c constraints.txt pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[$*]'
	touch $@

simulate: $(VENV)/.installed-report
	$(PY) -m simulate $(ARGS)

test: $(VENV)/.installed-test,oracles,report
	$(PY) -m pytest $(ARGS)

# Re-resolve every pin from the package index in a scratch venv (newest releases that
# pyproject.toml admits), then run `make test` before committing the new file.
constraints:
	rm -rf .constraints-venv
	$(PYTHON) -m venv .constraints-venv
	.constraints-venv/bin/python -m pip install --quiet --upgrade pip
	.constraints-venv/bin/python -m pip install --quiet -e '.[$(PINNED_EXTRAS)]'
	{ echo "# Every package the test run and the main job resolve, pinned so that a fresh clone"; \
	  echo "# installs the same versions everywhere. Regenerate with 'make constraints' (never by"; \
	  echo "# hand), then run 'make test'."; \
	  .constraints-venv/bin/python -m pip freeze --all --exclude-editable \
	    | grep -v '^setuptools==\|^wheel==' | sed 's/+cpu$$//'; } > constraints.txt
	rm -rf .constraints-venv

clean:
	rm -rf $(VENV) reports .pytest_cache .hypothesis
