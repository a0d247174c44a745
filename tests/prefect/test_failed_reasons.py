"""A run that ends with failed rows says why where the user looks: the state message's first lines,
the ``failed-rows`` table artifact, the ``job.failed`` event and ``job status`` all carry the top
reasons with counts and example rows (id, reason, the engine's own words), read back from the server.

The stub answers a share of requests with HTTP 500 or 503 and the body
``{"error":{"message":"injected failure"}}``: those are the words an example row must show."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import job_options, prompts, run_logs, stub_swarm
from stack import PrefectStack
from typer.testing import CliRunner

from prefect_swarm.cli.main import app
from prefect_swarm.flows import batch_inference
from prefect_swarm.testing.stub_engine import engine_command
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.prefect_server]

N = 80
WORDS = '{"error":{"message":"injected failure"}}'


def _artifact(run_id: str, key: str) -> Any:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        (art,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])),
        )
    return art


def _failed_event(api_url: str, since: datetime, run_id: str) -> dict[str, Any] | None:
    body = {"filter": {"event": {"name": ["prefect-swarm.job.failed"]}, "occurred": {"since": since.isoformat()}}}
    resp = httpx.post(api_url + "/events/filter", json={**body, "limit": 50}, timeout=10)
    resp.raise_for_status()
    ref = f"prefect.flow-run.{run_id}"
    found = [e for e in resp.json()["events"] if any(r["prefect.resource.id"] == ref for r in e["related"])]
    return found[0] if found else None


def test_a_failed_run_says_why_its_rows_failed(prefect_api: PrefectStack, tmp_path: Path) -> None:
    since = datetime.now(UTC) - timedelta(seconds=5)
    inp, out = prompts(tmp_path / "in.parquet", N), tmp_path / "out.parquet"
    cfg = stub_swarm("why-failed", latency_ms=1)
    cfg["engine"]["command"] = engine_command(latency_ms=1, error_rate=0.4)
    opts = job_options(max_retries=0, concurrency=8)

    state = batch_inference(cfg, opts, str(inp), str(out), shards=2, max_failed_fraction=0.05, return_state=True)
    assert state.is_failed(), state
    run_id = str(state.state_details.flow_run_id)

    # the state message: the verdict, then "Why: HTTP 500 xA, HTTP 503 xB." and example rows
    lines = (state.message or "").splitlines()
    assert "more than max_failed_fraction 0.05" in lines[0], lines
    assert lines[1].startswith("Why: ") and "HTTP 500 x" in lines[1] and "HTTP 503 x" in lines[1], lines
    counts = {p.split(" x")[0]: int(p.split(" x")[1]) for p in lines[1].removeprefix("Why: ").rstrip(".").split(", ")}
    examples = [x.strip() for x in lines[2:4]]
    assert all(x.startswith("row r000") and WORDS in x for x in examples), lines
    assert not any("say hello" in line for line in lines)  # the engine's words, never the prompt

    # the failed-rows table: one row per reason with an example row and the engine's words
    art = _artifact(run_id, "why-failed-out-failed-rows")
    table = json.loads(art.data) if isinstance(art.data, str) else art.data
    assert {r["reason"]: r["rows"] for r in table} == counts, table
    assert all(r["example_row"].startswith("r000") and r["engine_said"].endswith(WORDS) for r in table), table

    # the job.failed event's payload
    wait_until(
        "the job.failed event", lambda: _failed_event(prefect_api.api_url, since, run_id) is not None, timeout_s=30
    )
    event = _failed_event(prefect_api.api_url, since, run_id)
    assert event is not None
    reasons, job_id = event["payload"]["failure_reasons"], event["payload"]["job_id"]
    assert {r["reason"]: r["rows"] for r in reasons["reasons"]} == counts
    assert reasons["rows"] == sum(counts.values()) and len(reasons["examples"]) == 2, reasons

    # the run's log says it too, and `job status` (table and JSON)
    assert any(line.startswith(f"Job {job_id}: Why: ") for line in run_logs(run_id))
    shown = CliRunner().invoke(app, ["job", "status", job_id])
    assert lines[1] in shown.stdout and WORDS in shown.stdout, shown.stdout
    doc = json.loads(CliRunner().invoke(app, ["job", "status", job_id, "-o", "json"]).stdout)
    assert {r["reason"]: r["rows"] for r in doc["failure_reasons"]["reasons"]} == counts, doc["failure_reasons"]
