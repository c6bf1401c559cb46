# On a fresh machine:
#   make demo        set up .venv, then run the main job (mini-lora to target on 2 processes) and the report
#   make check       set up .venv with the test extras, then the unit tier's fast tests (tests/unit: no process
#                    started; the few marked slow, which compile graphs, are left to make test)
#   make test        everything that leaves the host as it is: unit + integration (CLI subprocesses, torchrun,
#                    multi-process gloo) + gpu (skipped without CUDA); two pytest workers (pytest-xdist): many
#                    integration tests wait on timeouts and signals, so two keep 2 cores busier; longest
#                    first (tests/durations.json), an idle worker takes half of the other's queue (worksteal)
#   make test-slurm  the real-Slurm tier: installs slurm-wlm and munge, writes /etc/slurm and starts the daemons
#                    (root; for a machine that may be changed, such as CI's)
#
# torch: a GPU machine's own torch is used when one is already importable by $(PYTHON); otherwise
# the CPU build torch==2.13.0 (a local wheel on the project's CPU machines) goes into .venv.
# Nothing here can pull a multi-GB CUDA build: torch is installed first, pinned, and no other
# requirement asks for a newer one.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH_CPU := torch==2.13.0
STAMP  := $(VENV)/.trainperf-installed
STAMP_TEST := $(VENV)/.trainperf-test-installed

.PHONY: demo check test test-long test-slurm setup setup-test clean

$(VENV)/bin/python:
	@if $(PYTHON) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
	  echo "using the machine's own torch (CUDA) through --system-site-packages"; \
	  $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
	  $(PYTHON) -m venv $(VENV); \
	fi

$(STAMP): $(VENV)/bin/python pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q $(TORCH_CPU)
	$(PIP) install -q -e .
	@touch $(STAMP)

$(STAMP_TEST): $(STAMP)
	$(PIP) install -q -e ".[test]"
	@touch $(STAMP_TEST)

setup: $(STAMP)

setup-test: $(STAMP_TEST)

demo: $(STAMP)
	$(VENV)/bin/trainperf demo

check: $(STAMP_TEST)
	$(PY) -m pytest -q -ra -n 2 -m "not slow" tests/unit

test: $(STAMP_TEST)
	$(PY) -m pytest -q -ra --durations=15 -n 2 --dist worksteal -m "not slurm" tests

test-long: $(STAMP_TEST)
	TRAINPERF_TEST_LONG=1 $(PY) -m pytest -q -ra -m long tests

test-slurm: $(STAMP_TEST)
	TRAINPERF_TEST_SLURM=1 $(PY) -m pytest -q -ra -m slurm tests/slurm

clean:
	rm -rf $(VENV) .cache runs trainperf.db trainperf.db-wal trainperf.db-shm
