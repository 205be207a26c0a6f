# Two commands on a fresh machine: `make demo` and `make test`. Each sets up .venv first.
# CPU machine: the venv gets the pinned CPU torch (requirements/dev-cpu.txt). A machine whose
# python3 already has a CUDA torch: the venv sees it (--system-site-packages) and installs
# the rest (requirements/dev-gpu.txt).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.specdec-installed
HAS_CUDA_TORCH := $(shell $(PYTHON) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1 && echo 1)
ifeq ($(HAS_CUDA_TORCH),1)
  VENV_FLAGS := --system-site-packages
  REQUIREMENTS := requirements/dev-gpu.txt
else
  VENV_FLAGS :=
  REQUIREMENTS := requirements/dev-cpu.txt
endif
PYTEST_WORKERS ?= 2
# A CPU-only machine takes the CPU build of requirements/dev-cpu.txt's torch pin. This project's
# machines carry that wheel (pip's find-links, checked offline: ~2 s, only when the venv is made);
# elsewhere it comes from PyTorch's CPU index: PyPI's torch of that version is the CUDA build
# (several GB), which also requires another triton than the pinned 3.6.0, so pip cannot resolve
# dev-cpu.txt from PyPI alone. Not added where the wheel is local: an unreachable index costs
# minutes of retries (seen here: `make setup` 8 min 50 s with it, on a machine without access).
TORCH_PIN := $(shell grep -E '^torch==' requirements/dev-cpu.txt)
CPU_TORCH_INDEX_URL := https://download.pytorch.org/whl/cpu
cpu_torch_index = $(shell $(PYTHON) -m pip install --dry-run --quiet --ignore-installed --no-deps --no-index \
	"$(TORCH_PIN)" >/dev/null 2>&1 || echo --extra-index-url $(CPU_TORCH_INDEX_URL))

.PHONY: setup test test-fast demo bench wheel clean

$(STAMP): $(REQUIREMENTS) setup.py pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install -q $(if $(filter requirements/dev-cpu.txt,$(REQUIREMENTS)),$(cpu_torch_index)) -r $(REQUIREMENTS)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

setup: $(STAMP)

test: $(STAMP)  ## the whole suite (CI runs this; it lists the 25 slowest tests, to keep its time in check)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --benchmark-disable --durations=25

test-fast: $(STAMP)  ## skip the tests marked slow
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --benchmark-disable -m "not slow"

demo: $(STAMP)  ## the package's main job
	$(PY) -m specdec_fast demo

bench: $(STAMP)  ## CPU microbenchmarks (pytest-benchmark tables)
	$(PY) -m pytest bench --benchmark-only --benchmark-group-by=group -p no:xdist

wheel: $(STAMP)
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist .

clean:
	rm -rf $(VENV) build dist *.egg-info
