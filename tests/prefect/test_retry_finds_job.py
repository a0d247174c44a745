"""``retry_failed`` from a fresh run form finds the job the user means: the one earlier job of the same
input, output and swarm is retried with its own settings (not a new job resending every row); a form
that would resend rows a job already answered says so in the run's first lines; with two earlier jobs
the retry is refused naming both. The counts a resumed run logs agree with each other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import job_options, prompts, run_logs, stub_swarm
from stack import PrefectStack

from prefect_swarm.flows import batch_inference, swarm_down
from prefect_swarm.state import StateStore
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.stub_engine import engine_command

pytestmark = [pytest.mark.prefect_server]

N = 60
NAME = "retry-finds"


def _requests() -> int:
    swarm = Swarm.from_state(NAME, StateStore())
    return sum(int(httpx.get(f"{u.removesuffix('/v1')}/stats", timeout=5).json()["requests"]) for u in swarm.endpoints)


def _first(logs: list[str], prefix: str) -> int:
    return next(i for i, line in enumerate(logs) if line.startswith(prefix))


def test_a_fresh_form_with_retry_failed_retries_the_earlier_job(prefect_api: PrefectStack, tmp_path: Path) -> None:
    inp, out = prompts(tmp_path / "in.parquet", N), str(tmp_path / "out.parquet")
    marker = tmp_path / "failing"
    marker.touch()
    cfg = stub_swarm(NAME, latency_ms=1)
    cfg["engine"]["command"] = engine_command(latency_ms=1, error_rate=0.3, fail_while=str(marker))
    opts = job_options(max_retries=0, concurrency=4)
    first = batch_inference(cfg, opts, str(inp), out, shards=2, max_failed_fraction=0.05, return_state=True)
    assert first.is_failed(), first
    (job,) = StateStore().list_jobs(NAME)
    failed = int((job.progress or {}).get("failed") or 0)
    assert failed > 3, job.progress

    marker.unlink()
    # a fresh form: the same input, output and swarm, another shard count, retry_failed set
    fixed = batch_inference(cfg, opts, str(inp), out, shards=1, retry_failed=True, keep_swarm=True)
    try:
        assert fixed["job_id"] == job.id and fixed["rows"] == N and fixed["failed"] == 0, fixed
        assert _requests() == 1 + failed  # the readiness probe and the failed rows: nothing resent
    finally:
        swarm_down(NAME)
    logs = run_logs(fixed["flow_run"])
    said = logs[_first(logs, "retry_failed: retrying job ")]
    assert f"retrying job {job.id}, the earlier job of this input and output on swarm '{NAME}'" in said, said
    shards = logs[_first(logs, "Shards: 2 of 2 started")]
    assert f"their checkpoints hold {N - failed} of {N} rows, not sent again" in shards, shards

    # a fresh form without retry_failed naming another job (3 shards) says it resends every row, first
    again: Any = batch_inference(cfg, opts, str(inp), out, shards=3, return_state=True)
    assert again.is_completed(), again
    logs = run_logs(again.state_details.flow_run_id)
    warned = _first(logs, "Job ")
    assert "is new: this run sends every row of" in logs[warned] and f"as job {job.id} (" in logs[warned], logs[warned]
    assert "differs in shards 2 -> 3" in logs[warned], logs[warned]
    assert warned < _first(logs, "Bring-up: "), logs[:8]

    # two earlier jobs of this data: a retry from a fresh form is refused, naming both
    refused = batch_inference(cfg, opts, str(inp), out, shards=4, retry_failed=True, return_state=True)
    assert refused.is_failed(), refused
    message = refused.message or ""
    assert "retry_failed: 2 earlier jobs of input" in message and job.id in message, message
    assert sum(1 for j in StateStore().list_jobs(NAME) if j.id in message) == 2, message
