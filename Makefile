# gpuscope: `make demo` (install + sample analysis), `make test`, `make bench`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test bench serve clean e2e slurm-test

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,cluster]'
	touch $(STAMP)

demo: install
	$(PY) -m gpuscope.fixtures.demo

test: install
	$(PY) -m pytest -q

# A real one-node SLURM (apt-get slurm-wlm + munge, ~15 s) for the SLURMCluster ingest and remote_context tests;
# skipped cleanly only where apt-get is unavailable.
slurm-test: install
	@bash tests/slurm/up.sh; rc=$$?; \
	if [ $$rc = 3 ]; then exit 0; fi; \
	if [ $$rc != 0 ]; then bash tests/slurm/down.sh; exit $$rc; fi; \
	$(PY) -m pytest -q -p no:cacheprovider tests/slurm; rc=$$?; bash tests/slurm/down.sh; exit $$rc

bench: install
	$(PY) -m gpuscope.fixtures.bench

e2e: install
	bash e2e/run.sh

serve: install
	$(VENV)/bin/gpuscope serve

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .bench .demo
