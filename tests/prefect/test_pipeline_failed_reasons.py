"""A pipeline says why each stage's rows failed: a stage that failed ends the pipeline Failed with that
stage's reasons in the state message; a stage that went on with failed rows shows its reasons in the
pipeline's summary (its ``why`` column)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import prompts, stub_swarm
from stack import PrefectStack

from prefect_swarm.flows import pipeline
from prefect_swarm.testing.stub_engine import engine_command

pytestmark = [pytest.mark.prefect_server]


def _failing(name: str, rate: float) -> dict[str, Any]:
    cfg = stub_swarm(name, latency_ms=1)
    cfg["engine"]["command"] = engine_command(latency_ms=1, error_rate=rate)
    return cfg


def _summary(run_id: Any, key: str) -> list[dict[str, Any]]:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        (art,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])),
        )
    return json.loads(art.data) if isinstance(art.data, str) else art.data  # type: ignore[no-any-return]


def test_each_stage_says_why_its_rows_failed(prefect_api: PrefectStack, tmp_path: Path) -> None:
    job = {"job": "chat", "id_column": "id", "max_retries": 0, "job_kwargs": {"prompt_column": "prompt"}}
    stages = [
        {"name": "gen", "swarm": _failing("why-gen", 0.3), "job": job, "max_failed_fraction": 0.9},
        {
            "name": "again",
            "swarm": _failing("why-again", 0.5),
            "job": {"job": "chat", "max_retries": 0, "job_kwargs": {"prompt_template": "Again: {gen_text}"}},
            "max_failed_fraction": 0.05,
        },
    ]
    inp = prompts(tmp_path / "in.parquet", 60)
    state = pipeline(stages=stages, input=str(inp), output=str(tmp_path / "out.parquet"), return_state=True)
    assert state.is_failed(), state
    lines = (state.message or "").splitlines()
    assert "stage 2 (again) Failed: job " in lines[0], lines
    assert lines[1].startswith("Why: HTTP 50") and "injected failure" in lines[2], lines
    run_id = state.state_details.flow_run_id
    pid = lines[0].split("pipeline ", 1)[1].split(":", 1)[0]
    rows = {r["stage"]: r for r in _summary(run_id, f"{pid}-summary")}
    assert rows["gen"]["failed"] > 0 and rows["gen"]["why"].startswith("Why: HTTP 50"), rows["gen"]
