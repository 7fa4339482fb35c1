# Every target does its own set-up: a fresh clone needs only `make serve` or `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# llama-cpp-python compiles llama.cpp (~12 min on 2 cores): its wheel is built once and kept here.
WHEELS ?= $(or $(ARAG_DATA_DIR),$(HOME)/.local/share/arag)/wheels
LLAMA_CPP := llama-cpp-python==0.3.36
# A portable build: never -march=native, whose wheel runs only on CPUs like the one it was built on,
# and never AMX or AVX-512, which a CPU can list while its OS forbids them (SIGILL on the first long
# prompt). x86-64 gets AVX2/FMA/F16C (every x86 CPU since 2013-2015); others build ggml's defaults.
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF \
	-DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
else
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF
endif
# The cached wheel's folder is named by the recipe: a changed recipe (or version) builds a new wheel.
LLAMA_RECIPE := $(shell printf '%s %s' '$(LLAMA_CPP)' '$(LLAMA_CMAKE_ARGS)' | sha256sum | cut -c1-12)
LLAMA_WHEELS := $(WHEELS)/llama-cpp-$(LLAMA_RECIPE)
# A second build on a CPU with AVX-512 (x86-64-v4 with VBMI and VNNI; still no AMX): its prefill,
# what an answer mostly waits for, is 1.5x (0.5B) to 1.8x (1.5B) the portable build's here. It is installed beside the
# venv's own (llama-builds/avx512), and a model process runs it only on a CPU that lists these
# instructions and passed `arag llm check --build all` with it (src/arag/llm/builds.py, whose
# REQUIRES["avx512"] is this list); anywhere else the portable build runs.
AVX512_FLAGS := avx512f avx512cd avx512vl avx512dq avx512bw avx512vbmi avx512_vnni
ifeq ($(shell uname -m),x86_64)
HAS_AVX512 := $(shell for f in $(AVX512_FLAGS); do grep -qw $$f /proc/cpuinfo || exit 0; done; echo yes)
endif
LLAMA_AVX512_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
	-DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
LLAMA_AVX512_RECIPE := $(shell printf '%s %s' '$(LLAMA_CPP)' '$(LLAMA_AVX512_ARGS)' | sha256sum | cut -c1-12)
LLAMA_AVX512_WHEELS := $(WHEELS)/llama-cpp-$(LLAMA_AVX512_RECIPE)
LLAMA_BUILDS := $(VENV)/llama-builds
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
	# --no-cache-dir: pip's own wheel cache knows nothing of CMAKE_ARGS and would hand back an old build.
	test -n "$$(ls $(LLAMA_WHEELS)/llama_cpp_python-0.3.36-*.whl 2>/dev/null)" || \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(BIN)/pip wheel --quiet --no-cache-dir --no-deps -w $(LLAMA_WHEELS) $(LLAMA_CPP)
	$(BIN)/pip install --quiet --find-links $(LLAMA_WHEELS) -e '.[torch,dev,llm]'
	rm -rf $(LLAMA_BUILDS)
ifeq ($(HAS_AVX512),yes)
	test -n "$$(ls $(LLAMA_AVX512_WHEELS)/llama_cpp_python-0.3.36-*.whl 2>/dev/null)" || \
		CMAKE_ARGS="$(LLAMA_AVX512_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(BIN)/pip wheel --quiet --no-cache-dir --no-deps -w $(LLAMA_AVX512_WHEELS) $(LLAMA_CPP)
	$(BIN)/pip install --quiet --no-deps --target $(LLAMA_BUILDS)/avx512 \
		$(LLAMA_AVX512_WHEELS)/llama_cpp_python-0.3.36-*.whl
endif
	# One real generation on a 600-token prompt, in a child process, with each build: a portable
	# build this CPU cannot run stops set-up here, with the signal and the fix, not in the middle of
	# the tests or of a question; a faster build that fails is left unused (answers keep to portable).
	$(BIN)/arag llm check --model qwen2.5-coder-0.5b --prompt-tokens 600 --max-tokens 16 --build all
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
