# Entry points of the course repository. `make book` and `make test` set up everything they need
# (Debian, Python and npm packages) on a fresh machine, and do nothing again when nothing changed.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV     := .venv
PY       := $(VENV)/bin/python
# The venv first on PATH, so that the notebook kernels the book runs are the venv's Python.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export PIP_DISABLE_PIP_VERSION_CHECK := 1

SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEB_PKGS := chromium bubblewrap fonts-dejavu-core

PY_STAMP    := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
TEST_STAMP  := $(VENV)/.installed-test
DEB_STAMP   := $(VENV)/.system-packages
NPM_STAMP   := node_modules/.installed
MATHJAX     := _build/assets/mathjax/tex-chtml.js

.PHONY: help setup book test test-lib test-gpu lab assignments grade bench experiments clean course student-env \
        student-links

help:
	@echo "make book         set up, then build the book into _build/html"
	@echo "make test         set up, build the book, run the whole test suite"
	@echo "make lab          JupyterLab on the exercises"
	@echo "make assignments  regenerate exercises/ from solutions/ (nbgrader)"
	@echo "make grade        grade the demo submissions in autograder/demo/ (sandboxed)"
	@echo "make course       an nbgrader course folder for a term (COURSE=course EXCHANGE=... ROSTER=... DUE=...)"
	@echo "make student-env  a Python environment students' accounts can use (STUDENT_VENV=/opt/llmarch-env),"
	@echo "                  its nbgrader and jupyter linked into STUDENT_BIN=/usr/local/bin"
	@echo "make bench        run the benchmarks (each prints a ratio against a named peer)"
	@echo "make test-gpu     CUDA tests (a torchrun NCCL run on 1 and 2 GPUs) + benchmarks (book/data); skips without CUDA"
	@echo "make experiments  rerun the experiments whose results the book reads from book/data"
	@echo "make clean        remove build outputs (keeps .venv and node_modules)"

setup: $(PY_STAMP) $(DEB_STAMP) $(NPM_STAMP) $(MATHJAX)

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch==2.13.0 is pinned in pyproject.toml; pip takes the CPU wheel from the local wheel cache.
$(PY_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e .
	touch $@

$(BENCH_STAMP): $(PY_STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	touch $@

# transformers is the test oracle (tests/test_hf_equivalence.py and others); only the tests need it.
$(TEST_STAMP): $(PY_STAMP)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

$(DEB_STAMP): | $(VENV)/bin/python
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi
	touch $@

$(NPM_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(MATHJAX): $(NPM_STAMP)
	rm -rf _build/assets/mathjax && mkdir -p _build/assets
	cp -r node_modules/mathjax/es5 _build/assets/mathjax
	touch $@

# Real inputs of llmarch.webdata's tests and chapter: the WARC and ARC files in the source distributions of
# warcio and pywb, and the real HTML pages (with their reference checks) in trafilatura's; fetched with pip
# into _build/realdata, never committed.
REALDATA := _build/realdata/.fetched
$(REALDATA): | $(VENV)/bin/python
	rm -rf _build/realdata && mkdir -p _build/realdata/dist
	$(PY) -m pip download --quiet --no-binary :all: --no-deps -d _build/realdata/dist \
	  warcio==1.6.3 pywb==2.6.9 trafilatura==1.0.0
	tar -xzf _build/realdata/dist/warcio-1.6.3.tar.gz -C _build/realdata warcio-1.6.3/test/data
	tar -xzf _build/realdata/dist/pywb-2.6.9.tar.gz -C _build/realdata pywb-2.6.9/sample_archive/warcs
	tar -xzf _build/realdata/dist/trafilatura-1.0.0.tar.gz -C _build/realdata \
	  trafilatura-1.0.0/tests/cache trafilatura-1.0.0/tests/realworld_tests.py
	touch $@
# The chapter Pretraining data and tests/test_webdata_real.py read them (prerequisites added here, so that the
# rules below stay as they are).
book test test-lib: $(REALDATA)

# Warnings are errors (-W -n); the log is kept for tests/test_book.py.
book: setup
	set -o pipefail; $(VENV)/bin/jupyter-book build . --builder html -W -n --keep-going 2>&1 | tee _build/book-build.log
	@echo "The book is at file://$(CURDIR)/_build/html/index.html"

test: book $(TEST_STAMP)
	$(PY) -m pytest

test-lib: $(TEST_STAMP) $(NPM_STAMP)
	$(PY) -m pytest tests --ignore=tests/test_book.py

# No setup (no apt, npm or pip): on a GPU machine the venv may be absent, and then the machine's own python3 (with
# torch, triton and pytest) runs it, with lib/ on PYTHONPATH. Without CUDA the tests are skipped with their reason
# and the benchmark prints one line; both exit 0.
# Sized for 5 minutes on one H100: the CUDA tests (kernels, then whole models against transformers), the model
# benchmark (GPT-2 880M and Llama 1.1B shapes, bf16) and the attention kernels on the grid of the book's table.
GPU_PY ?= $(shell [ -x $(PY) ] && echo $(PY) || echo python3)
test-gpu:
	PYTHONPATH=$(CURDIR)/lib$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) -m pytest -m cuda -ra tests/test_efficient_attention.py tests/test_models_cuda.py tests/test_train_precision.py tests/test_train_launch.py tests/test_flash_benchmark.py
	PYTHONPATH=$(CURDIR)/lib$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) benchmarks/bench_model.py --device cuda --csv book/data/model_benchmark_gpu.csv
	PYTHONPATH=$(CURDIR)/lib$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) benchmarks/bench_attention_gpu.py --impls triton sdpa_flash --dtypes bf16 --d-heads 64 128 --lengths 1024 4096 16384 --warmup 3 --reps 10 --csv book/data/attention_gpu_benchmark.csv

lab: setup
	mkdir -p exercises
	$(VENV)/bin/jupyter lab --allow-root --ServerApp.root_dir=exercises

# With VENV=... naming another environment (one that has nbgrader), nothing is installed into it: the clone
# is put on PYTHONPATH instead.
assignments: $(if $(filter .venv,$(VENV)),$(PY_STAMP),$(VENV)/bin/python)
	PYTHONPATH=$(CURDIR):$(CURDIR)/lib$${PYTHONPATH:+:$$PYTHONPATH} $(PY) -m autograder generate

# An nbgrader course folder (README, "Teach with it"): nbgrader_config.py, release/, gradebook.db, exchange.
COURSE   ?= course
EXCHANGE ?= /srv/nbgrader/exchange
course: $(PY_STAMP)
	$(PY) -m autograder course $(COURSE) --exchange $(EXCHANGE) $(if $(ROSTER),--roster $(ROSTER)) \
	  $(foreach d,$(DUE),--due $(d))

# What students' notebooks need (they do not import llmarch), in a folder every account can read: the course's
# .venv lives in the clone, often under /root, which other accounts cannot enter. The interpreter must be readable
# too: a venv only links to the Python it was made from, and a pyenv or conda Python under /root is not, so the
# system's Python 3.11 is the default. The last step runs the environment as the account `nobody` to prove it.
STUDENT_VENV ?= /opt/llmarch-env
STUDENT_PYTHON ?= $(shell [ -x /usr/bin/python3.11 ] && echo /usr/bin/python3.11 || echo python3)
STUDENT_PKGS := "torch==2.13.0" "numpy>=1.26,<3" "matplotlib>=3.8,<4" "jupyterlab>=4.2,<5" "ipykernel>=6.29" \
                "nbgrader>=0.9.3,<0.10" "triton==3.7.1; platform_system == 'Linux' and platform_machine == 'x86_64'"
student-env:
	$(STUDENT_PYTHON) -m venv $(STUDENT_VENV)
	$(STUDENT_VENV)/bin/python -m pip install --quiet $(STUDENT_PKGS)
	chmod -R a+rX $(STUDENT_VENV)
	$(STUDENT_VENV)/bin/python -m ipykernel install --name llmarch --display-name "Python (llmarch course)" \
	  --prefix /usr/local
	@cd / && runuser -u nobody -- $(STUDENT_VENV)/bin/python -c "import numpy, torch, matplotlib, nbgrader" \
	  || { echo "$(STUDENT_VENV) cannot be used by other accounts: is $(STUDENT_PYTHON) (or a folder above it) readable by all?"; exit 1; }
	@$(MAKE) --no-print-directory student-links
	@cd / && runuser -u nobody -- env PATH=$(STUDENT_BIN):/usr/bin:/bin nbgrader --version >/dev/null \
	  || { echo "nbgrader in $(STUDENT_BIN) does not run for other accounts"; exit 1; }
	@echo "$(STUDENT_VENV) works for every account, and $(STUDENT_COMMANDS) are on their PATH in $(STUDENT_BIN) (checked as nobody)"

# Students type `nbgrader fetch_assignment ...` and `jupyter lab`: links in STUDENT_BIN (on every account's PATH)
# to the student environment's commands. A file there that is not a link into STUDENT_VENV is never replaced.
STUDENT_BIN ?= /usr/local/bin
STUDENT_COMMANDS := nbgrader jupyter
student-links:
	@for cmd in $(STUDENT_COMMANDS); do \
	  target=$(abspath $(STUDENT_VENV))/bin/$$cmd; link=$(STUDENT_BIN)/$$cmd; \
	  [ -x "$$target" ] || { echo "$$target is missing: run make student-env first"; exit 1; }; \
	  if [ -e "$$link" ] || [ -L "$$link" ]; then \
	    case "$$(readlink "$$link")" in $(abspath $(STUDENT_VENV))/bin/*) ;; \
	      *) echo "$$link exists and is not a link into $(STUDENT_VENV): left as it is; remove it, or choose STUDENT_BIN=..."; exit 1;; esac; \
	  fi; \
	  mkdir -p $(STUDENT_BIN) && ln -sfn "$$target" "$$link" && echo "$$link -> $$target"; \
	done

grade: $(PY_STAMP) $(DEB_STAMP)
	$(PY) -m autograder grade ps1-attention autograder/demo --out _build/grading/ps1-attention

bench: $(BENCH_STAMP) $(DEB_STAMP) $(NPM_STAMP)
	@for script in benchmarks/bench_*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

experiments: $(PY_STAMP)
	$(PY) -m llmarch.train
	$(PY) book/experiments/tiny_gpt.py
	$(PY) book/experiments/length_generalisation.py
	$(PY) book/experiments/tokenizer_compression.py
	$(PY) book/experiments/decoding.py
	$(PY) benchmarks/bench_kv_cache.py --csv book/data/kv_cache_timing.csv
	$(PY) benchmarks/bench_attention.py --csv book/data/attention_benchmark.csv
	$(PY) book/experiments/scaling_study.py
	$(PY) book/experiments/modern_decoder.py --jobs 2
	$(PY) book/experiments/moe_training.py
	$(PY) book/experiments/logit_stability.py
	$(PY) book/experiments/induction_heads.py
	$(PY) book/experiments/pretraining_objectives.py --jobs 2
	$(PY) book/experiments/t5_diagnostics.py
	$(PY) book/experiments/pretraining_data.py
	$(PY) book/experiments/training_at_scale.py
	$(PY) -m autograder.assignments.ps11_loss_target
	@# the execution cache keys on a chapter's code, not on the data it reads: drop it so the book shows the new results
	rm -rf _build/.jupyter_cache

clean:
	rm -rf _build .pytest_cache
