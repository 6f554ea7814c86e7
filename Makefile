# Convenience targets; README.md's two commands are the supported way in on a fresh machine.
PY ?= .venv/bin/python

.PHONY: test test-fast smoke list catalog architecture env docs docs-serve gpu-check gpu-session

test:
	$(PY) -m pytest -q -n auto --dist loadfile

test-fast:  # a developer's inner loop: everything but the end-to-end runs
	$(PY) -m pytest -q -n auto --dist loadfile -m "not e2e"

smoke:
	.venv/bin/gpubench run --scenario smoke

list:
	.venv/bin/gpubench list

# The built-in techniques' declarations as data (suite/techniques/catalog.json), read by `list` and
# a scenario's validation without torch; rebuild after editing suite/, optimizations/ or baselines/.
catalog:
	$(PY) -m gpubench.techniques.catalog --write

# docs/architecture.svg, the import graph by folder (tests/test_import_graph.py fails when it is stale);
# redraw after moving a module or adding an import between folders.
architecture:
	$(PY) benchmarks/import_graph.py

env:
	.venv/bin/gpubench env --calibrate

docs:  # the documentation site into site/ (the docs or test extra), warnings as errors as the test does
	$(PY) -m mkdocs build --strict

docs-serve:  # the site at http://127.0.0.1:8000, rebuilt as docs/ changes
	$(PY) -m mkdocs serve

# On a GPU machine whose python already has torch etc. (no downloads): install without deps,
# calibrate, then run gpu-quick within BUDGET (gpubench run --budget: breadth-first, the cases
# that do not fit are recorded as not run), and copy the run directory to $(OUT) (default
# results/). ONLY=tech,tech runs part of gpu-quick.
OUT ?= results
ONLY ?=
BUDGET ?= 8m
gpu-check:
	mkdir -p $(OUT)
	python3 -m pip install -q --no-index --disable-pip-version-check --no-deps --no-build-isolation -e .
	python3 -m gpubench.cli env --calibrate --json > $(OUT)/env-calibrate.json
	python3 -m gpubench.cli run --scenario gpu-quick --budget $(BUDGET) --out $(OUT)/runs $(if $(ONLY),--only $(ONLY)) || true

# The prepared session for a lent GPU (benchmarks/gpu_session.sh: one deadline, parts most
# important first, each packed into the output folder as it goes). The output folder is the
# caller's $OUT when one is set (the device machine returns only what lands there), else
# gpu-session-out.
SESSION_OUT ?= $(if $(filter environment command line,$(origin OUT)),$(OUT),gpu-session-out)
gpu-session:
	OUT=$(SESSION_OUT) bash benchmarks/gpu_session.sh
