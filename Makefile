# Dev/CI set-up: a private venv with the CPU wheel of torch (seconds, not a multi-GB CUDA download).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0

.PHONY: venv demo test test-fast test-gpu bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH_PIN)" numpy
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

# exit 1 = the demo found what it was planted to find (an error finding): that is success here
demo: venv
	$(VENV)/bin/torchdoctor demo || [ $$? -eq 1 ]

# The box sets PYTHONDONTWRITEBYTECODE, so an editable install's modules are compiled again by every
# process that imports them: ~0.25 s of CPU per torchdoctor process, and the suite starts ~500 of them
# (docs/testing.md). Writing the bytecode once, here, is read by all; a stale file is ignored by mtime.
BYTECODE = $(PY) -m compileall -q torchdoctor > /dev/null

# Two pytest-xdist workers (one per core of the CI box), a test file each at a time (module-scoped
# fixtures stay in one worker); the fixture runs are still made once per test run, shared by the
# workers (tests/fixture_lanes.py). TEST_JOBS=0: one process, as before (a debugger, -x).
TEST_JOBS ?= 2
XDIST = $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)

test: venv
	$(BYTECODE)
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST)

# the fast lane: no test that starts a Python process (tests/spawn_watch.py fails one that does)
test-fast: venv
	$(BYTECODE)
	TD_SPAWN_STRICT=1 $(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "not slow"

# On a GPU machine (torch already installed there): the GPU-marked tests only.
test-gpu:
	PYTHONPATH=$(CURDIR) python3 -m pytest -q -p no:cacheprovider -m "gpu or multigpu" tests

bench: venv
	$(PY) bench/startup.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
