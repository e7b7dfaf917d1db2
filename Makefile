# gpuscope: `make demo` (install + sample analysis), `make test`, `make bench`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test bench serve clean e2e

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: install
	$(PY) -m gpuscope.fixtures.demo

test: install
	$(PY) -m pytest -q

bench: install
	$(PY) -m gpuscope.fixtures.bench

e2e: install
	bash e2e/run.sh

serve: install
	$(VENV)/bin/gpuscope serve

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .bench .demo
