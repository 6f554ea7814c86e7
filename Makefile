# Convenience targets; README.md's two commands are the supported way in on a fresh machine.
PY ?= .venv/bin/python

.PHONY: test test-fast smoke list env gpu-check gpu-session

test:
	$(PY) -m pytest -q -n auto --dist loadfile

test-fast:  # a developer's inner loop: everything but the end-to-end runs
	$(PY) -m pytest -q -n auto --dist loadfile -m "not e2e"

smoke:
	.venv/bin/gpubench run --scenario smoke

list:
	.venv/bin/gpubench list

env:
	.venv/bin/gpubench env --calibrate

# On a GPU machine whose python already has torch etc. (no downloads): install without deps,
# calibrate, run gpu-quick, and copy the run directory to $(OUT) (default results/).
# ONLY=tech,tech runs part of gpu-quick (the whole of it no longer fits one 8-minute device call:
# e.g. ONLY=flash_attention,paged_attention, then ONLY=continuous_batching,paged_kv_serving).
OUT ?= results
ONLY ?=
gpu-check:
	mkdir -p $(OUT)
	python3 -m pip install -q --no-deps --no-build-isolation -e .
	python3 -m gpubench.cli env --calibrate --json > $(OUT)/env-calibrate.json
	python3 -m gpubench.cli run --scenario gpu-quick --out $(OUT)/runs $(if $(ONLY),--only $(ONLY)) || true

# The prepared session for a lent GPU (benchmarks/gpu_session.sh): gpu-quick whole, its dry-run
# estimate, gpu-consumer, calibration; each part under its own timeout, packed into $(SESSION_OUT).
SESSION_OUT ?= gpu-session-out
gpu-session:
	OUT=$(SESSION_OUT) bash benchmarks/gpu_session.sh
