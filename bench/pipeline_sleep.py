"""A two-stage pipeline run several times (batches arriving one after another): its stages' models on
one allocation with sleep/wake vs two bring-ups per run, on the GPU-like simulator. Total time side by side.

    PYTHONPATH=$PWD .venv/bin/python bench/pipeline_sleep.py [--runs 3] [--rows 200] [--load-s 8] [--wake-s 0.5]

Both stages (generate, then judge) run on local swarms of :mod:`prefect_swarm.testing.gpu_sim` that share
GPU "0" (``backend.gpus: ["0"]``, one replica each) and load in ``--load-s`` seconds (the cold start: a
real 7-8B model takes 30-90 s to load on a GPU, more with a queue in front of the allocation):

- **two bring-ups**: ``pipeline(stages, ...)`` as by default: each run brings each stage's swarm up, runs
  the stage, and takes it down (two cold starts per run);
- **sleep/wake**: ``pipeline(stages, ..., keep_swarms=True, sleep_between=True)``: the first run brings
  both up (one after the other: stage 1's model sleeps before stage 2's loads), later runs only wake the
  stage's model (``--wake-s``, vLLM's level-1 wake: weights copied back from CPU memory) and put it back
  to sleep after its stage; both are taken down after the last run.

Each case runs in its own process on Prefect's temporary server (``PREFECT_API_URL`` empty) with its
own ``PREFECT_SWARM_HOME``. The total is what the runs took together (the last ``down`` included).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CASE = """
import json, sys, time
from prefect_swarm.flows import pipeline
from prefect_swarm.holding import Holding
case, runs, src, stages = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
slept = case == "sleep/wake"
times = []
t0 = time.monotonic()
for r in range(runs):
    t = time.monotonic()
    state = pipeline(stages, src, src.replace(".parquet", f"-out-{r}.parquet"), keep_swarms=slept,
                     sleep_between=slept, return_state=True)
    assert state.is_completed(), state.message
    times.append(time.monotonic() - t)
if slept:
    for stage in stages:
        Holding().stop(stage["swarm"]["name"])
times.append(time.monotonic() - t0)
print(json.dumps(times))
"""


def swarm(name: str, port: int, load_s: float, wake_s: float) -> dict[str, object]:
    """A one-replica local swarm of the simulator with sleep mode, on GPU "0"."""
    from prefect_swarm.testing.gpu_sim import MODULE
    from prefect_swarm.testing.stub_engine import engine_command

    command = engine_command(
        module=MODULE, enable_sleep_mode=True, startup_delay_s=load_s, wake_s=wake_s, sleep_s=0.2, step_ms=5
    )
    return {
        "name": name,
        "model": f"sim-{name}",  # two models: a live swarm of one is never reused for the other
        "replicas": 1,
        "gpus_per_replica": 1,
        "port": port,
        "ready_timeout_s": 120,
        "engine": {"kind": "command", "command": command, "startup_timeout_s": 120, "sleep_mode": True},
        "backend": {"type": "local", "gpus": ["0"], "health_interval_s": 0.5, "startup_grace_s": 0.5},
    }


def stages(load_s: float, wake_s: float) -> list[dict[str, object]]:
    """generate (its answer) -> judge (the question and the answer)."""
    from prefect_swarm.testing.ports import free_port

    job = {"job": "chat", "id_column": "id", "job_kwargs": {"prompt_column": "prompt"}}
    judge = {"job": "chat", "id_column": "id",
             "job_kwargs": {"prompt_template": "Question: {prompt} Answer: {generate_text} Is it right?"}}  # fmt: skip
    return [
        {"name": "generate", "swarm": swarm("gen", free_port(), load_s, wake_s), "job": job},
        {"name": "judge", "swarm": swarm("judge", free_port(), load_s, wake_s), "job": judge},
    ]


def run_case(case: str, runs: int, rows: int, load_s: float, wake_s: float) -> list[float]:
    """Seconds of each run, then the total, for ``case``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="psw-bench-sleep-") as tmp:
        src = Path(tmp) / "in.parquet"
        pq.write_table(pa.table({"id": [f"r{i}" for i in range(rows)], "prompt": [f"q {i}" for i in range(rows)]}), src)
        env = {**os.environ, "PREFECT_SWARM_HOME": str(Path(tmp) / "home"), "PREFECT_API_URL": "",
               "PYTHONPATH": str(ROOT)}  # fmt: skip
        env.pop("PREFECT_HOME", None)
        argv = [sys.executable, "-c", CASE, case, str(runs), str(src), json.dumps(stages(load_s, wake_s))]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise SystemExit(f"{case} failed:\n{out.stderr[-3000:]}")
        return [float(x) for x in json.loads(out.stdout.strip().splitlines()[-1])]


def main() -> None:
    """Both cases, side by side."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="pipeline runs (batches) one after another")
    ap.add_argument("--rows", type=int, default=200, help="rows per run")
    ap.add_argument("--load-s", type=float, default=8.0, help="the simulator's cold load time")
    ap.add_argument("--wake-s", type=float, default=0.5, help="the simulator's level-1 wake time")
    a = ap.parse_args()
    results = {case: run_case(case, a.runs, a.rows, a.load_s, a.wake_s) for case in ("two bring-ups", "sleep/wake")}
    print(f"two-stage pipeline x {a.runs} runs of {a.rows} rows; load {a.load_s:g} s, wake {a.wake_s:g} s")
    print(f"{'case':<16}" + "".join(f"{'run ' + str(i + 1):>10}" for i in range(a.runs)) + f"{'total':>10}")
    for case, times in results.items():
        print(f"{case:<16}" + "".join(f"{t:>9.1f}s" for t in times))
    ratio = results["two bring-ups"][-1] / results["sleep/wake"][-1]
    print(f"total: two bring-ups / sleep-wake = {ratio:.2f}x")


if __name__ == "__main__":
    main()
