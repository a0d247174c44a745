"""The budget guard in a flow: a tiny cap stops the run mid-job (Failed, the reason in its message, no
process left); the rerun with a larger cap resumes and writes each row exactly once."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import job_options, prompts, stub_swarm, swarm_processes, wait_for
from stack import PrefectStack

from prefect_swarm.flows import batch_inference

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]


def test_budget_stops_the_flow_and_the_rerun_resumes(
    prefect_api: PrefectStack, tmp_path: Path, swarm_home: Path
) -> None:
    n = 3000
    inp, out = prompts(tmp_path / "in.parquet", n), tmp_path / "out.parquet"
    cfg = stub_swarm("budgeted", latency_ms=20, cost={"max_gpu_hours": 8 / 3600})  # 8 GPU-seconds
    cfg["gpus_per_replica"] = 1
    opts = job_options(concurrency=2)
    state = batch_inference(cfg, opts, str(inp), str(out), shards=1, return_state=True)
    assert state.is_failed(), state
    assert "budget reached: " in (state.message or ""), state.message
    wait_for(lambda: not swarm_processes(swarm_home, "budgeted", cfg["port"]), 30, what="no process left")
    assert not out.exists()

    cfg["backend"]["cost"] = {"max_gpu_hours": 1.0}
    again = batch_inference(cfg, opts, str(inp), str(out), shards=1)
    assert again["rows"] == n and again["ok"] == n
    ids = pq.read_table(out, columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == [f"r{i:05d}" for i in range(n)]
    resent = again["tokens_this_run"]
    assert 0 < resent < again["prompt_tokens"] + again["completion_tokens"], "the rerun did not resume"
