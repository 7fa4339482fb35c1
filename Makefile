# Every target does its own set-up: a fresh clone needs only `make serve` or `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# llama-cpp-python compiles llama.cpp (~12 min on 2 cores): its wheel is built once and kept here.
WHEELS ?= $(or $(ARAG_DATA_DIR),$(HOME)/.local/share/arag)/wheels
LLAMA_CPP := llama-cpp-python==0.3.36
# Two cores: cap native thread pools so ONNX Runtime / BLAS / torch never oversubscribe.
export OMP_NUM_THREADS ?= 2
export OPENBLAS_NUM_THREADS ?= 2
export MKL_NUM_THREADS ?= 2
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1

.PHONY: venv serve test test-fast lint bench stress clean-venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==25.3
	# torch first and pinned: the CPU build lies on local disk; unpinned torch pulls CUDA (GBs).
	$(BIN)/pip install --quiet torch==2.13.0
	test -n "$$(ls $(WHEELS)/llama_cpp_python-0.3.36-*.whl 2>/dev/null)" || \
		CMAKE_BUILD_PARALLEL_LEVEL=2 $(BIN)/pip wheel --quiet --no-deps -w $(WHEELS) $(LLAMA_CPP)
	$(BIN)/pip install --quiet --find-links $(WHEELS) -e '.[torch,dev,llm]'
	touch $(STAMP)

# The page at http://127.0.0.1:7860 as soon as set-up is done: on a first run the server builds the
# library and then trains the reranker in the background, answering over what is indexed meanwhile
# (`arag library build` / `arag train reranker` still do either by hand).
serve: venv
	$(BIN)/arag serve

test: venv
	$(BIN)/python -m pytest -q

test-fast: venv
	$(BIN)/python -m pytest -q -m "not real_models"

lint: venv
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy src

bench: venv
	$(BIN)/arag bench build --papers 100

# Reliability: kill builds and resume, broken PDFs, API fuzzing and 2 minutes of load (each prints its
# figures and fails on a problem). STRESS_LIBRARY=<data dir> loads a built library instead of a small one.
stress: venv
	$(BIN)/arag stress crash --papers 100 --kills 5
	$(BIN)/arag stress bad-pdfs
	$(BIN)/arag stress api $(if $(STRESS_LIBRARY),--library $(STRESS_LIBRARY))
	$(BIN)/python -m pytest -q tests/test_stress_api.py -k "inject or payload or prompt or marker or token"

clean-venv:
	rm -rf $(VENV)
