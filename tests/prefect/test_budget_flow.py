"""The budget guard in a flow: a tiny cap (the run's own max_gpu_hours, tighter than the swarm's) stops
the run mid-job (Failed, the reason in its message, no process left); the rerun with a larger cap
resumes and writes each row exactly once."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from helpers import job_options, job_progress_artifact, prompts, read_event, stub_swarm, swarm_processes
from stack import PrefectStack

from prefect_swarm.flows import batch_inference
from prefect_swarm.state import StateStore
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]


def test_budget_stops_the_flow_and_the_rerun_resumes(
    prefect_api: PrefectStack, tmp_path: Path, swarm_home: Path
) -> None:
    n = 3000
    inp, out = prompts(tmp_path / "in.parquet", n), tmp_path / "out.parquet"
    cfg = stub_swarm("budgeted", latency_ms=20, cost={"max_gpu_hours": 1.0})
    cfg["gpus_per_replica"] = 1
    opts = job_options(concurrency=2)
    first = datetime.now(UTC) - timedelta(seconds=5)
    # the run's own cap (16 GPU-seconds: the job processes hold it to the second, so it leaves room for
    # the flow to bring the swarm up and start them on a loaded machine) is tighter than the swarm's hour:
    # it wins; the budget stops the swarm even though the run asked to keep it
    state = batch_inference(
        cfg, opts, str(inp), str(out), shards=1, max_gpu_hours=16 / 3600, keep_swarm=True, return_state=True
    )
    assert state.is_failed(), state
    assert "budget reached: " in (state.message or ""), state.message
    assert "at exit" in (state.message or "") and "rows left" in (state.message or ""), state.message
    started = StateStore().require_swarm("budgeted").created_at  # claimed before its replica started
    wait_until(
        "no process left", lambda: not swarm_processes(swarm_home, "budgeted", cfg["port"]), timeout_s=30, poll_s=0.05
    )
    # the GPU time the swarm held (at most: from its record's claim, before its replica started, to its
    # processes' end; 1 GPU) against the run's cap: its job stops issuing 5 s before the cap, and the flow
    # tears the swarm down once it exits (before: the cap was checked late and passed by ~47 %)
    held = time.time() - started
    print(f"flow run, GPU-hour cap of 16 GPU-s: the swarm held at most {held:.1f} GPU-s")
    assert held <= 16 + 4, held
    assert StateStore().require_swarm("budgeted").phase == "STOPPED"
    assert not out.exists()
    reached = _event(prefect_api.api_url, "prefect-swarm.job.budget-reached", first)
    assert reached["payload"]["swarm"] == "budgeted" and "budget reached" in reached["payload"]["message"]
    recorded = StateStore().require_swarm("budgeted").config["backend"]["cost"]
    assert recorded["max_gpu_hours"] == 1.0, recorded  # the run's cap held this run only

    cfg["backend"]["cost"] = {"max_gpu_hours": 1.0, "gpu_hour_usd": 2.0}  # neither changes the checkpoints' key
    since = datetime.now(UTC) - timedelta(seconds=5)
    again = batch_inference(cfg, opts, str(inp), str(out), shards=1, max_cost_usd=100.0)
    assert again["rows"] == n and again["ok"] == n
    ids = pq.read_table(out, columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == [f"r{i:05d}" for i in range(n)]
    resent = again["tokens_this_run"]
    assert 0 < resent < again["prompt_tokens"] + again["completion_tokens"], "the rerun did not resume"
    # the run's summary (the artifact's row) and the job.committed event carry the priced figures
    assert again["gpu_hours"] > 0 and again["usd"] == pytest.approx(2.0 * again["gpu_hours"], abs=1e-3)
    assert again["usd_per_million_tokens"] == pytest.approx(again["usd"] / resent * 1e6, rel=0.05)
    committed = _committed_event(prefect_api.api_url, since)
    cost = committed["payload"]["cost"]
    assert cost["gpu_hours"] > 0 and cost["usd"] == pytest.approx(2.0 * cost["gpu_hours"], abs=1e-3), cost
    # the job's progress artifact projected the whole input's time, GPU-hours and USD while it ran (the
    # rerun runs ~20 s at <= 100 rows/s: updates every 10 s) and keeps the last projection at the end
    job = job_progress_artifact(again["flow_run"])
    assert (
        job.data == 100.0 and f"{n - again['failed']} ok, {again['failed']} failed of {n} rows in " in job.description
    )
    assert "; last projection: " in job.description and "rows/s: " in job.description, job.description
    assert "GPU-hours (1 GPU), $" in job.description and "at $2/GPU-hour" in job.description, job.description


def _committed_event(api_url: str, since: datetime) -> dict[str, Any]:
    return _event(api_url, "prefect-swarm.job.committed", since)


def _event(api_url: str, name: str, since: datetime) -> dict[str, Any]:
    return read_event(api_url, name, since)
