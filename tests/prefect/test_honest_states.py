"""Success means success: failed rows above max_failed_fraction make the run Failed; bad parameters
are refused when the run is created; a swarm-down of an unknown name is not retried."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import job_options, prompts, stub_swarm
from stack import PrefectStack

from prefect_swarm.exceptions import StateError
from prefect_swarm.flows import batch_inference, swarm_down
from prefect_swarm.state import StateStore
from prefect_swarm.testing.stub_engine import engine_command

pytestmark = [pytest.mark.prefect_server]


def test_failed_rows_above_the_threshold_fail_the_run(prefect_api: PrefectStack, tmp_path: Path) -> None:
    cfg = stub_swarm("flaky", latency_ms=2)
    cfg["engine"]["command"] = engine_command(latency_ms=2, error_rate=0.3)
    inp = prompts(tmp_path / "in.parquet", 200)
    opts = job_options(max_retries=0)
    below = batch_inference(
        cfg, opts, str(inp), str(tmp_path / "a.parquet"), shards=2, keep_swarm=True, max_failed_fraction=0.9
    )
    assert below["rows"] == 200 and 0 < below["failed"] < 180 and below["ok"] + below["failed"] == 200
    state = batch_inference(cfg, opts, str(inp), str(tmp_path / "b.parquet"), shards=2, return_state=True)
    assert state.is_failed()
    message = str(state.message)
    assert "rows:" in message and "failed" in message and "max_failed_fraction 0.01" in message
    assert "failed rows in " in message and ".jsonl" in message, message
    # the failed run shared the kept swarm and only released its own lease
    assert StateStore().require_swarm("flaky").phase == "RUNNING"
    assert swarm_down("flaky") is True and StateStore().require_swarm("flaky").phase == "STOPPED"
    print(f"below the threshold: Completed ({below['failed']}/200 failed); above: {message}")


def test_bad_parameter_refused_at_run_creation(prefect_stack: PrefectStack, tmp_path: Path) -> None:
    from prefect.deployments import run_deployment

    params = {"swarm": stub_swarm("never"), "job": "chat", "input": "x.parquet", "output": "y.parquet", "shards": 0}
    with pytest.raises(Exception) as info:
        run_deployment("batch-inference/on-demand", parameters=params, timeout=0)
    message = str(info.value)
    print(f"shards=0 refused at creation: {message}")
    assert "shards" in message and ("minimum" in message or "less than" in message), message


def test_swarm_down_of_unknown_name_is_not_retried(prefect_api: PrefectStack) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    state = swarm_down("no-such-swarm", return_state=True)
    assert state.is_failed()
    with pytest.raises(StateError):
        state.result()
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
        )
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert [t.run_count for t in tasks] == [1]
    assert "swarm:no-such-swarm" in run.tags
