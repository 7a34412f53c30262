# minillm: the two quick-start commands are `make course` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SITE   := book/_build/html

.PHONY: setup fetch chromium course test exercises notebooks nbval book browser-test bench gpu-check clean

$(BIN)/minillm: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev,book]"
	touch $@

setup: $(BIN)/minillm  ## virtual environment with minillm and its tools

fetch: setup  ## the course models (SmolLM2, Gemma 3 270M) and corpora into $MINILLM_HOME (once)
	$(BIN)/minillm fetch
	$(BIN)/minillm fetch gemma3-270m

course: fetch  ## the quick start: set up, fetch, one generation with the engine, the website
	$(BIN)/minillm generate "What is a KV cache? Answer in one sentence." --chat --max-new-tokens 60
	@$(MAKE) --no-print-directory book
	@echo ""
	@echo "Ready. Work through the chapters in JupyterLab:"
	@echo "    $(BIN)/jupyter lab notebooks/"
	@echo "Read the course website: open $(CURDIR)/$(SITE)/index.html in a browser, or serve it"
	@echo "    $(BIN)/python -m http.server -d $(SITE)      (then http://localhost:8000)"

# Debian's Chromium, for the chat-page test and the website checks (apt-get, as root or
# with sudo); nothing is installed when a Chromium is already on the PATH.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

chromium:  ## headless Chromium for the browser tests, if the machine has none
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
	  || command -v google-chrome >/dev/null || { echo "installing Chromium (Debian's package)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium; }

# The library tests and the graded tests (on the solutions) in one run: plain `pytest`
# leaves tests/grading and tests/browser out (pyproject.toml), this run puts grading back.
# Two test workers at one torch thread each, as nbval's: two workers of two threads on two
# cores spin on each other (docs/benchmarks.md, "CI time plan").
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
test: fetch chromium  ## every test CI runs
	$(BIN)/ruff check minillm kernels tests benchmarks solutions exercises
	$(BIN)/lint-imports  # the library's layers (pyproject.toml; docs/decisions.md draws them)
	$(BIN)/python -m minillm.grading.exercises --check
	$(TEST_ENV) $(BIN)/pytest -n 2 --dist loadfile -q --impl=solutions -o "norecursedirs=.* browser" tests
	$(TEST_ENV) $(BIN)/minillm grade --check-honesty --workers 2
	$(TEST_ENV) $(BIN)/minillm grade --check-mutants --workers 2
	$(MAKE) nbval book browser-test

exercises: setup  ## regenerate exercises/ from solutions/
	$(BIN)/python -m minillm.grading.exercises

notebooks: fetch  ## re-execute every notebook in place (outputs are committed)
	$(BIN)/python benchmarks/notebooks.py

# Two notebooks at a time, one thread each: the kernels start with IPython's profile in
# .ci/ipython, which caps the notebooks' torch.set_num_threads(2) at MINILLM_KERNEL_THREADS.
# On the shared 2-core machine this was 3x faster than two kernels of two threads each and
# than one worker (docs/benchmarks.md, "CI time plan").
NBVAL_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 MINILLM_KERNEL_THREADS=1 IPYTHONDIR=$(CURDIR)/.ci/ipython

nbval: fetch  ## strict check of every notebook against its stored outputs (a test, 10-20 min)
	$(NBVAL_ENV) $(BIN)/pytest --nbval notebooks/ --nbval-sanitize-with notebooks/nbval_sanitize.cfg \
	  -n 2 --dist loadfile -q -p no:cacheprovider

book: setup  ## the course website in book/_build/html (stored outputs, no execution; seconds)
	$(BIN)/jupyter-book build book/ --warningiserror --quiet

browser-test: book chromium  ## check the built site: HTML, links, and every page in headless Chromium
	$(BIN)/pytest -q tests/browser -p no:cacheprovider -n 2 --dist load

bench: fetch  ## decode benchmark table (docs/benchmarks.md)
	$(BIN)/python benchmarks/decode.py

# On a GPU machine: every Triton kernel and the engine on CUDA against the CPU, then the
# speed rows (minutes). Without CUDA the same correctness rows run in Triton's interpreter
# (tests/test_gpu_check.py does that in CI) and the speed rows are skipped.
gpu-check: fetch  ## check every GPU path on this machine's GPU; the table goes to gpu_check.json
	$(BIN)/python benchmarks/gpu_check.py --out gpu_check.json

clean:
	rm -rf $(VENV) build *.egg-info
