# Kiln developer entry points. Works from a fresh clone on Debian as root (python3 >= 3.11, network
# to PyPI/Debian only): creates .venv, installs kiln with its test, demo and serve extras at the
# exact versions of constraints.txt (pip -c; pyproject.toml has ranges) once (stamp file, redone
# when pyproject.toml or constraints.txt changes), installs a C compiler with apt-get when `cc` is
# missing, then runs. Afterwards `. .venv/bin/activate` puts `kiln` on PATH (or: .venv/bin/kiln).
#
#   make demo       compile the text-orientation model for the host's fastest target (llvm
#                   -mcpu=native) and check it against onnxruntime (prints both latencies)
#   make test       the whole test suite (pytest -n 2); first installs the aarch64/riscv64 cross
#                   toolchains and qemu-user for tests/backend/codegen/test_cross.py, clang/lld/
#                   llvm 14
#                   for the jit device's riscv64 RVV tests, and OpenBLAS with pkg-config for the
#                   BYOC cblas backend (root + apt-get; otherwise those tests skip)
#   make test-fast  tests/unit only
#   make bench      Kiln vs onnxruntime and OpenVINO on five models at 1 and 2 threads
#                   (benchmarks/models.py; BENCH_ARGS="--models squeezenet --repeat 5" narrows
#                   it); first installs the bench extra (matplotlib, openvino); then latency
#                   under load (two busy processes:
#                   p50/p99/max vs onnxruntime, benchmarks/load.py, LOAD_BENCH_ARGS); then
#                   SmolLM2 prefill/decode speed, Kiln fp32,
#                   int8 and q4 vs onnxruntime (benchmarks/llm.py, LLM_BENCH_ARGS); serving
#                   throughput and p99 time between tokens at 1, 4 and 16 concurrent clients,
#                   kiln serve vs llama-cpp-python's own server on the same GGUF at 2 threads
#                   (benchmarks/serve.py, SERVE_BENCH_ARGS="--threads 1"); the QDQ
#                   resnet50s (U8S8, S8S8) beside float resnet50 (INT8_BENCH_ARGS, into
#                   benchmarks/results/int8) and int8 conv GOP/s (benchmarks/int8_conv.py,
#                   INT8_CONV_BENCH_ARGS); then MiniLM and PP-OCRv4 at fixed
#                   shapes (benchmarks/encoders.py, ENCODER_BENCH_ARGS); then a
#                   portable (-mcpu=portable, multi-level) library vs -mcpu=native at 1 thread
#                   (benchmarks/portable.py, PORTABLE_BENCH_ARGS); the VM compiled with no
#                   flags (assumptions checked at run time) vs the same relations declared
#                   as --dim (benchmarks/assume_checks.py, ASSUME_BENCH_ARGS); writes benchmarks/results/,
#                   and for the models, int8, LLM, serving and encoder runs a summary to commit in
#                   benchmarks/results/summary/ with the change against the committed one of
#                   the same machine class (benchmarks/summary.py); BENCH_NOTE="..." is recorded
#                   with them (e.g. that the machine was busy)
#   make corpus     Kiln's own model corpus (corpus/models.py: torchvision CNNs, ViT, Swin,
#                   segmentation and detection parts; transformers encoders, decoders with and
#                   without past, encoder-decoders, vision and audio encoders from tiny configs
#                   with random weights, legacy and dynamo exports at opsets 13-20; ONNX files of
#                   PyPI wheels): each compiled with no flags (symbolic, VM) and at one fixed
#                   shape, run at 2-3 shapes vs onnxruntime, timed at 1 thread; writes
#                   corpus/results/results.{json,md}; first installs the corpus extra (torch
#                   CPU, torchvision, transformers, onnxscript); CORPUS_ARGS="--models a,b",
#                   "--source wheel", "--timeout S" narrow it; not part of make test (its fast
#                   subset is tests/models/corpus/test_corpus_fast.py)
#   make fuzz       the long loader fuzz run (KILN_FUZZ_CASES per target, default 5000;
#                   KILN_FUZZ_SEED picks another sequence), the native runtime's loader
#                   (ASan + UBSan) included; not part of make test
#   make conformance  all ONNX node conformance cases (onnx 1.23: 1884) through Kiln's ONNX
#                   backend on CONFORMANCE_WORKERS processes (default: all cores); writes a table
#                   per op type to conformance/results/kiln.{md,json}; CONFORMANCE_ARGS="--backend
#                   onnxruntime" runs onnxruntime under the same rules; then the com.microsoft
#                   contrib ops' single-op cases vs onnxruntime into
#                   conformance/results/contrib.md (conformance/contrib.py); not part of make test
#   make ops        regenerate docs/ops.md, the supported-ops table (converter registry, onnx's
#                   schemas, the committed conformance summary docs/ops-conformance.json;
#                   tools/gen_ops_table.py); OPS_RESULTS=conformance/results/kiln.json first
#                   refreshes that summary from a make conformance run;
#                   tests/unit/test_ops_table.py fails when docs/ops.md is stale
#   make docs       regenerate docs/api.md (the Python API reference, from the docstrings:
#                   tools/gen_api_docs.py) and docs/cli.md (the command-line reference, from the
#                   argument parsers: tools/gen_cli_docs.py); make api-docs is the same;
#                   tests/unit/test_api_docs.py and test_cli_docs.py fail when they are stale
#   make lint       ruff over src/, tests/, benchmarks/, conformance/, corpus/, tools/, examples/
#                   (pyflakes, pycodestyle with the 100-column limit, import sorting; CI runs it)
#   make vocabulary regenerate the C VM's rt_vocabulary.h (opcodes, argument kinds, section
#                   ids, tags, builtin names) from the Python VM's tables
#                   (tools/gen_c_vocabulary.py); tests/unit/native/test_c_vocabulary.py fails
#                   when stale
#   make check-python  pip resolves the dependencies (pins and ranges) for every CPython from
#                   requires-python's floor to 3.13, and not below it; no removed stdlib module
#                   is imported (tools/check_python_versions.py; needs the package index)
#   make clean      remove the virtual environment and caches

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kiln-installed
BENCH_STAMP := $(VENV)/.kiln-bench-installed
CORPUS_STAMP := $(VENV)/.kiln-corpus-installed
PYTEST_ARGS ?=
BENCH_ARGS ?=
LLM_BENCH_ARGS ?=
SERVE_BENCH_ARGS ?=
LOAD_BENCH_ARGS ?=
ENCODER_BENCH_ARGS ?=
INT8_BENCH_ARGS ?=
BENCH_NOTE ?=
INT8_CONV_BENCH_ARGS ?=
PORTABLE_BENCH_ARGS ?=
ASSUME_BENCH_ARGS ?=
CONFORMANCE_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
CONFORMANCE_ARGS ?=
OPS_RESULTS ?=
CORPUS_ARGS ?=
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: all demo test test-fast bench corpus conformance fuzz lint vocabulary ops check-python docs \
	api-docs toolchain \
	cross-toolchain \
	device-toolchain blas-toolchain venv clean

all: test

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@set -e; \
	if ! $(PYTHON) -c 'import ensurepip, venv' >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    ver=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
	      python3-venv "python$$ver-venv" || \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv; \
	  else \
	    echo "make: $(PYTHON) lacks venv/ensurepip; install python3-venv" >&2; exit 1; \
	  fi; \
	fi; \
	if [ ! -x $(PY) ] || ! $(PY) -m pip --version >/dev/null 2>&1; then \
	  rm -rf $(VENV); $(PYTHON) -m venv $(VENV); \
	fi
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,demo,serve,torch-test]'
	@touch $(STAMP)

# The bench extra on top of the default install, once (its own stamp: make test/demo skip it).
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,demo,serve,torch-test,bench]'
	@touch $(BENCH_STAMP)

# The corpus extra (torch, torchvision, transformers, onnxscript), once, on its own stamp.
$(CORPUS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,demo,corpus]'
	@touch $(CORPUS_STAMP)

toolchain:
	@if ! command -v "$${CC:-cc}" >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make: no C compiler; installing gcc with apt-get" >&2; \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
	      gcc libc6-dev libgomp1; \
	  else \
	    echo "make: no C compiler (cc); install gcc (Debian: apt-get install gcc)" >&2; \
	    exit 1; \
	  fi; \
	fi

# Cross compilers, sysroots and qemu-user for the llvm target's cross tests. Best effort: without
# root/apt-get (or offline) it only warns, and the cross tests skip naming the missing tool.
CROSS_PACKAGES := gcc-aarch64-linux-gnu gcc-riscv64-linux-gnu qemu-user \
	libc6-dev-arm64-cross libc6-dev-riscv64-cross
cross-toolchain:
	@missing=; for t in aarch64-linux-gnu-gcc riscv64-linux-gnu-gcc qemu-aarch64 qemu-riscv64; do \
	  command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make: installing cross toolchains for the cross tests (missing:$$missing)" >&2; \
	    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
	      $(CROSS_PACKAGES); } || \
	    echo "make: warning: could not install$$missing; cross tests will skip" >&2; \
	  else \
	    echo "make: warning: missing$$missing (apt-get install $(CROSS_PACKAGES));" \
	      "cross tests will skip" >&2; \
	  fi; \
	fi

# clang (the jit device's riscv64 compiler: KILN_DEVICE_CC="clang-14 --target=riscv64-linux-gnu",
# with the cross toolchain's sysroot), lld, and llvm-objdump to find RVV instructions in the
# compiled kernels. Best effort, like the cross toolchains: the tests skip naming what is missing.
DEVICE_PACKAGES := clang-14 lld-14 llvm-14
device-toolchain:
	@missing=; for t in clang-14 ld.lld-14 llvm-objdump-14; do \
	  command -v $$t >/dev/null 2>&1 || [ -x /usr/lib/llvm-14/bin/$${t%-14} ] || \
	    missing="$$missing $$t"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make: installing clang/lld/llvm 14 for the jit device tests (missing:$$missing)" >&2; \
	    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
	      $(DEVICE_PACKAGES); } || \
	    echo "make: warning: could not install$$missing; jit riscv64 tests will skip" >&2; \
	  else \
	    echo "make: warning: missing$$missing (apt-get install $(DEVICE_PACKAGES));" \
	      "jit riscv64 tests will skip" >&2; \
	  fi; \
	fi

# OpenBLAS and pkg-config for the BYOC cblas backend (kiln.byoc.cblas). Best effort, like the
# cross toolchains: without them the cblas tests skip naming what is missing.
BLAS_PACKAGES := libopenblas-dev pkg-config
blas-toolchain:
	@if ! pkg-config --exists openblas >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make: installing OpenBLAS for the BYOC cblas tests" >&2; \
	    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
	      $(BLAS_PACKAGES); } || \
	    echo "make: warning: could not install $(BLAS_PACKAGES); cblas tests will skip" >&2; \
	  else \
	    echo "make: warning: OpenBLAS not found by pkg-config (apt-get install" \
	      "$(BLAS_PACKAGES)); cblas tests will skip" >&2; \
	  fi; \
	fi

demo: $(STAMP) toolchain
	$(VENV)/bin/kiln demo

# --max-worker-restart=0: a worker that dies (a crash in native code) ends the run at once,
# naming the test it ran. pytest-xdist 3.8's loadgroup scheduler, given a replacement worker,
# can wait forever at the end of the run (pytest-xdist issues 1323 and 1378): CI then ran out
# of time at 98 % with no summary.
test: $(STAMP) toolchain cross-toolchain device-toolchain blas-toolchain
	$(PY) -m pytest tests -n 2 --dist loadgroup --max-worker-restart=0 -q $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest tests/unit -n 2 -q $(PYTEST_ARGS)

bench: $(BENCH_STAMP) toolchain
	$(PY) benchmarks/models.py --note "$(BENCH_NOTE)" $(BENCH_ARGS)
	$(PY) benchmarks/load.py $(LOAD_BENCH_ARGS)
	$(PY) benchmarks/models.py \
	  --models resnet50_qdq,resnet50_qdq_per_channel,resnet50,mobilenet_v2_qdq,mobilenet_v2_qdq_per_channel,mobilenet_v2 \
	  --out benchmarks/results/int8 --summary int8 --note "$(BENCH_NOTE)" $(INT8_BENCH_ARGS)
	$(PY) benchmarks/int8_conv.py $(INT8_CONV_BENCH_ARGS)
	$(PY) benchmarks/llm.py $(LLM_BENCH_ARGS)
	$(PY) benchmarks/serve.py --note "$(BENCH_NOTE)" $(SERVE_BENCH_ARGS)
	$(PY) benchmarks/encoders.py --note "$(BENCH_NOTE)" $(ENCODER_BENCH_ARGS)
	$(PY) benchmarks/portable.py $(PORTABLE_BENCH_ARGS)
	$(PY) benchmarks/assume_checks.py $(ASSUME_BENCH_ARGS)

corpus: $(CORPUS_STAMP) toolchain
	$(PY) corpus/run.py $(CORPUS_ARGS)

conformance: $(STAMP) toolchain
	$(PY) conformance/run.py --workers $(CONFORMANCE_WORKERS) $(CONFORMANCE_ARGS)
	$(PY) conformance/contrib.py

fuzz: $(STAMP) toolchain
	$(PY) -m pytest tests/unit/runtime/test_runtime_fuzz.py \
	  tests/backend/runtime/test_runtime_fuzz_so.py tests/backend/native/test_native_fuzz.py -m fuzz -n 2 -q -rP $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(PY) -m ruff check src tests benchmarks conformance corpus tools examples

vocabulary: $(STAMP)
	$(PY) tools/gen_c_vocabulary.py

ops: $(STAMP)
	$(PY) tools/gen_ops_table.py $(if $(OPS_RESULTS),--results $(OPS_RESULTS))

check-python: $(STAMP)
	$(PY) tools/check_python_versions.py

docs: $(STAMP)
	$(PY) tools/gen_api_docs.py
	$(PY) tools/gen_cli_docs.py

api-docs: docs

clean:
	rm -rf $(VENV) .pytest_cache build src/*.egg-info
