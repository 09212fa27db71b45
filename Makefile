# Every target is a thin call into Python or pytest. Each one that runs code does its own set-up first.
PYTHON := $(shell python3 scripts/setup_env.py --print-python)
RUN ?=
A ?=
B ?=
WHEELS ?=

.PHONY: setup setup-dev setup-gpu-check test test-fast lint microbench bench report compare tensorboard clean \
	gpu-check reference

# `make <target> PYTHON=/path/to/python` installs into and runs with that interpreter (docs/gpu-node.md);
# a PYTHON from the environment is not used (the line above overrides it). `WHEELS=dir`: install from that
# folder of wheels only, on a node without a package index (docs/gpu-node.md "No package index").
SETUP := python3 scripts/setup_env.py $(if $(filter command line,$(origin PYTHON)),--python "$(PYTHON)") \
	$(if $(WHEELS),--wheels "$(WHEELS)")

# the runtime only (what `make bench` needs); the dev extras for the suite and lint; pytest for gpu-check
setup:
	@$(SETUP)

setup-dev:
	@$(SETUP) --extras dev

setup-gpu-check:
	@$(SETUP) --extras gpu-check

# Two pytest-xdist workers (TEST_WORKERS=0: one process). Much of a test's time is its ranks starting,
# meeting and waiting, which leaves the second core idle in one process (docs/development.md has the times).
# loadfile keeps each module on one worker (tests/conftest.py says why).
TEST_WORKERS ?= 2
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadfile

# pytest exits 5 when it collected no tests: for this suite that means tests went missing, so say so and fail.
# Tests marked `alone` hold a measured duration to a band the physics sets (a straggler's wait): they run after
# the parallel part, with the machine to themselves, since the other worker's load moves what they measure.
test: setup-dev
	@$(PYTHON) -m pytest -q $(PYTEST_PARALLEL) -m "not alone"; rc=$$?; \
	$(PYTHON) -m pytest -q -p no:xdist -m alone; rc2=$$?; \
	if [ $$rc -eq 5 -o $$rc2 -eq 5 ]; then echo "make test: pytest collected no tests; the suite must not be empty" >&2; fi; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; exit $$rc2

# The edit-test loop (docs/development.md): unit tests and one short end-to-end sweep, under 2 minutes on 2
# cores. `make test` (what CI runs) is still the whole suite.
test-fast: setup-dev
	@$(PYTHON) -m pytest -q $(PYTEST_PARALLEL) -m "(not slow and not integration) or edit_loop"

lint: setup-dev
	$(PYTHON) -m ruff check ddp_core bench tests benchmarks scripts examples

microbench: setup-dev
	$(PYTHON) -m pytest benchmarks -q -p no:cacheprovider --benchmark-enable --benchmark-columns=min,median,max,rounds --benchmark-sort=name -s

bench: setup
	$(PYTHON) -m bench run --config default --report

report: setup
	@test -n "$(RUN)" || { echo "usage: make report RUN=results/<run-id>"; exit 2; }
	$(PYTHON) -m bench report $(RUN)

compare: setup
	@test -n "$(A)" -a -n "$(B)" || { echo "usage: make compare A=results/<run-a> B=results/<run-b>"; exit 2; }
	$(PYTHON) -m bench compare $(A) $(B)

tensorboard: setup
	@test -n "$(RUN)" || { echo "usage: make tensorboard RUN=results/<run-id>"; exit 2; }
	$(PYTHON) -m bench tensorboard $(RUN)

clean:
	python3 scripts/clean.py

# docs/reference.md: the config keys, flags and result columns, generated from their owners (the config's
# dataclasses, the commands' parsers, bench/schema.py); tests/test_reference_tables.py fails when it is stale
reference: setup
	$(PYTHON) scripts/reference_tables.py

# The acceptance run on a GPU machine (docs/gpu-node.md "make gpu-check"): GPU tests, a short sweep, evidence
# in gpu-check/summary.md; exits 2 without a CUDA device.
gpu-check: setup-gpu-check
	$(PYTHON) scripts/gpu_check.py
