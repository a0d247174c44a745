"""A swarm's key given to a flow run (an inline config's api_key, with a job that fails some rows so the
failure paths speak too) reaches no word Prefect keeps: the run's parameters, its task runs'
parameters, its logs, its state messages, its artifacts, its events; nor a file of the swarm home but
the swarm's own ``swarm.key``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import job_options, prompts, run_logs
from stack import PrefectStack

from prefect_swarm.testing.stub_engine import stub_swarm_config
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.prefect_server]

KEY = "sk-flow-corpus-key-77aa01"


def _kept(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and p.name != "swarm.key" and KEY.encode() in p.read_bytes()]


def test_a_key_in_a_flow_runs_config_reaches_nothing_prefect_keeps(
    prefect_api: PrefectStack, swarm_home: Path, tmp_path: Path
) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
    )

    from prefect_swarm.flows import batch_inference

    since = datetime.now(UTC) - timedelta(seconds=5)
    backend = {"health_interval_s": 0.5, "wall_time_s": 600}
    cfg = {**stub_swarm_config("flow-corpus", backend=backend, error_rate=0.3), "api_key": KEY}
    inp = prompts(tmp_path / "in.parquet", 20)
    state = batch_inference(
        cfg,
        job_options(max_retries=0),
        str(inp),
        str(tmp_path / "out.parquet"),
        max_failed_fraction=1.0,
        return_state=True,
    )
    run_id = state.state_details.flow_run_id
    words: list[Any] = [state.message]
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        words += [run.parameters, run.state.message if run.state else None]
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
        words += [(t.name, t.state.message if t.state else None, t.task_inputs) for t in tasks]
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )
        words += [(a.key, a.description, a.data) for a in artifacts]
    assert artifacts, "the run made no artifact: nothing was checked"
    words += run_logs(run_id)
    ref = f"prefect.flow-run.{run_id}"

    def events() -> list[dict[str, Any]]:
        body = {"filter": {"occurred": {"since": since.isoformat()}, "any_resource": {"id": [ref]}}, "limit": 50}
        resp = httpx.post(prefect_api.api_url + "/events/filter", json=body, timeout=10)
        resp.raise_for_status()
        return list(resp.json()["events"])

    wait_until(
        "the run's events", lambda: any(e["event"] == "prefect-swarm.swarm.down" for e in events()), timeout_s=30
    )
    words += events()
    said = json.dumps(words, default=str)
    assert "prefect-swarm.job" in said and "failed" in said  # the failure paths were taken
    at = said.find(KEY)
    assert at < 0, said[max(0, at - 600) : at + 100]
    assert _kept(swarm_home) == [] and _kept(tmp_path) == []
