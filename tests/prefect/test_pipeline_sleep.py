"""A two-stage pipeline whose stages take turns on one GPU (``sleep_between``): each stage's swarm of
GPU-like simulators sleeps after its stage and is woken, not brought up again, on the next run; every
run writes every row once. Runs the flow on Prefect's temporary server in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.testing.gpu_sim import MODULE
from prefect_swarm.testing.ports import free_port
from prefect_swarm.testing.stub_engine import engine_command

RUNS = """
import json, sys
import httpx
from prefect_swarm.flows import pipeline
from prefect_swarm.paths import SwarmPaths, read_json
src, stages = sys.argv[1], json.loads(sys.argv[2])
seen = []
for r in range(2):
    state = pipeline(stages, src, src.replace(".parquet", f"-out-{r}.parquet"), keep_swarms=True,
                     sleep_between=True, return_state=True)
    assert state.is_completed(), state.message
    seen.append({s["swarm"]["name"]: {
        "pid": read_json(SwarmPaths.for_swarm(s["swarm"]["name"]).watchdog_pid(0))["pid"],
        "asleep": httpx.get(f"http://127.0.0.1:{s['swarm']['port']}/is_sleeping").json()["is_sleeping"],
    } for s in stages})
print(json.dumps(seen))
"""


def _swarm(name: str) -> dict[str, Any]:
    command = engine_command(module=MODULE, enable_sleep_mode=True, step_ms=2, sleep_s=0.05, wake_s=0.2)
    return {
        "name": name,
        "model": f"sim-{name}",  # two models: a live swarm of one is never reused for the other
        "replicas": 1,
        "gpus_per_replica": 1,
        "port": free_port(),
        "ready_timeout_s": 60,
        "engine": {"kind": "command", "command": command, "startup_timeout_s": 60, "sleep_mode": True},
        "backend": {"type": "local", "gpus": ["0"], "health_interval_s": 0.3, "wall_time_s": 600},
    }


def _stages() -> list[dict[str, Any]]:
    job = {"job": "chat", "id_column": "id", "job_kwargs": {"prompt_column": "prompt"}}
    judge = {"job": "chat", "id_column": "id", "job_kwargs": {"prompt_template": "Q: {prompt} A: {generate_text} ok?"}}
    return [
        {"name": "generate", "swarm": _swarm(f"gen-{os.getpid()}"), "job": job},
        {"name": "judge", "swarm": _swarm(f"judge-{os.getpid()}"), "job": judge},
    ]


@pytest.mark.slow
def test_stages_take_turns_on_one_gpu_and_later_runs_only_wake_them(tmp_path: Path) -> None:
    n = 60
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(n)], "prompt": [f"q {i}" for i in range(n)]}), src)
    stages = _stages()
    env = {**os.environ, "PREFECT_SWARM_HOME": str(tmp_path / "home"), "PREFECT_API_URL": ""}
    env.pop("PREFECT_HOME", None)
    try:
        out = subprocess.run([sys.executable, "-c", RUNS, str(src), json.dumps(stages)], env=env,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
        assert out.returncode == 0, out.stderr[-4000:]
        first, second = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for s in stages:
            subprocess.run([sys.executable, "-m", "prefect_swarm.cli.main", "down", s["swarm"]["name"], "-y",
                            "--force"], env=env, capture_output=True, timeout=120)  # fmt: skip
    for name in first:
        assert first[name]["asleep"] and second[name]["asleep"], (first, second)  # asleep between stages and runs
        assert first[name]["pid"] == second[name]["pid"], (first, second)  # woken, not brought up again
    for r in range(2):
        ids = pq.read_table(tmp_path / f"in-out-{r}.parquet").column("id").to_pylist()
        assert sorted(ids) == sorted(f"r{i}" for i in range(n))  # every row once


def test_sleep_between_is_refused_before_anything_starts_without_keep_swarms_or_sleep_mode() -> None:
    from prefect_swarm.flows.pipeline import Stage, _check_sleep_between, _Planned, job_options

    stage = _stages()[0]
    cfg = SwarmConfig.model_validate(stage["swarm"])
    planned = _Planned(Stage(name="generate", swarm=stage["swarm"]), 1, cfg, job_options("chat"), [], "", Path(), "")
    with pytest.raises(ConfigError, match="keep_swarms"):
        _check_sleep_between([planned], keep_swarms=False)
    _check_sleep_between([planned], keep_swarms=True)
    awake = {**stage["swarm"], "engine": {**stage["swarm"]["engine"], "sleep_mode": False}}
    planned.cfg = SwarmConfig.model_validate(awake)
    with pytest.raises(ConfigError, match=r"engine\.sleep_mode"):
        _check_sleep_between([planned], keep_swarms=True)
