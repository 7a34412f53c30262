# minillm: the two quick-start commands are `make course` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup fetch course test lint bench clean

$(BIN)/minillm: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev,book]"
	touch $@

setup: $(BIN)/minillm  ## virtual environment with minillm and its tools

fetch: setup  ## the course model and corpora into $MINILLM_HOME (once)
	$(BIN)/minillm fetch

course: fetch  ## the main job: fetch, then show the engine working
	$(BIN)/minillm generate "What is a KV cache? Answer in one sentence." --chat --max-new-tokens 60

test: fetch  ## every test CI runs
	$(BIN)/ruff check minillm kernels tests benchmarks
	$(BIN)/pytest -n 2 --dist loadfile -q

bench: fetch  ## decode benchmark table (docs/benchmarks.md)
	$(BIN)/python benchmarks/decode.py

clean:
	rm -rf $(VENV) build *.egg-info
