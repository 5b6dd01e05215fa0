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

.PHONY: book test unit notebooks html browser serve bench colab-check clean venv

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

## make book: execute every chapter on a fresh kernel, then build the HTML book into _build/html
book: $(STAMP)
	$(PY) book/tools/run_notebooks.py
	$(PY) book/tools/build_html.py

## make test: unit tests + every notebook executed, the HTML build (-n -W --keep-going), browser tests
test: $(STAMP)
	$(PY) -m pytest tests --ignore=tests/browser
	$(PY) book/tools/build_html.py
	$(MAKE) browser

unit: $(STAMP)
	$(PY) -m pytest tests --ignore=tests/browser -m "not notebooks"

browser: $(STAMP)
	$(PY) book/tools/ensure_chromium.py
	$(PY) -m pytest tests/browser

## make bench: RoPE against the libraries people use, and the book's timings -> _build/bench.json
bench: $(STAMP)
	$(PY) -m pip install --quiet -r benchmarks/requirements.txt
	$(PY) benchmarks/run.py

serve:
	@echo "serving _build/html on http://127.0.0.1:$(PORT)"
	$(PYTHON) -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

clean:
	rm -rf _build
