"""Reruns: finished shards are skipped, a committed job sends zero requests and starts no swarm."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from helpers import job_options, prompts, run_logs, stub_swarm
from stack import PrefectStack

from prefect_swarm.flows import batch_inference, swarm_down
from prefect_swarm.state import StateStore

pytestmark = [pytest.mark.prefect_server]


def _requests(port: int) -> int:
    return int(httpx.get(f"http://127.0.0.1:{port}/stats", timeout=5).json().get("requests", 0))


def _artifacts(key: str, rerun_id: object) -> tuple[dict[str, object], list[str]]:
    """The latest summary row under ``key``, and the markdown artifacts of the rerun."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        latest = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
            sort=ArtifactSort.CREATED_DESC,
        )
        rerun = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[rerun_id])))
    data = latest[0].data
    rows = json.loads(data) if isinstance(data, str) else data
    return rows[0], [str(a.data) for a in rerun if a.type == "markdown"]


def _runs(flow_run_id: object) -> tuple[Any, list[Any]]:
    """The flow run and its task runs, as the API has them."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)  # type: ignore[arg-type]
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return run, tasks


def test_rerun_sends_zero_requests(prefect_api: PrefectStack, tmp_path: Path) -> None:
    cfg = stub_swarm("rerun", latency_ms=5)
    inp, out = prompts(tmp_path / "in.parquet", 50), tmp_path / "out.parquet"
    first = batch_inference(cfg, job_options(), str(inp), str(out), shards=4, keep_swarm=True)
    assert first["rows"] == 50 and first["ok"] == 50 and first["skipped"] == 0
    rec = StateStore().get_swarm("rerun")
    assert rec is not None and rec.phase == "RUNNING" and rec.keep  # kept: its /stats stays readable
    before = _requests(cfg["port"])
    t0 = time.monotonic()
    state = batch_inference(cfg, job_options(), str(inp), str(out), shards=4, keep_swarm=True, return_state=True)
    took = time.monotonic() - t0
    again = state.result()  # persisted: readable from the state, not only as the call's return value
    assert _requests(cfg["port"]) == before, "a rerun of a committed job sent requests"
    assert again["skipped"] == 50 and again["rows"] == 50 and took < 10
    summary, notes = _artifacts("rerun-out-summary", state.state_details.flow_run_id)  # <swarm>-<output>
    assert summary["ok"] == 50 and summary["tokens_this_run"] > 0, "the no-op rerun overwrote the summary"
    assert any("0 rows sent, all cached" in n for n in notes)
    assert StateStore().get_swarm("rerun").updated_at == rec.updated_at  # type: ignore[union-attr]
    assert pq.read_table(out).num_rows == 50
    swarm_down("rerun")
    assert StateStore().get_swarm("rerun").phase == "STOPPED"  # type: ignore[union-attr]
    print(f"rerun of a committed job: {took:.2f} s, 0 requests")


def test_partial_rerun_resumes_and_reuses(prefect_api: PrefectStack, tmp_path: Path) -> None:
    cfg = stub_swarm("partial", latency_ms=5)
    inp, out = prompts(tmp_path / "in.parquet", 40), tmp_path / "out.parquet"
    first = batch_inference(cfg, job_options(), str(inp), str(out), shards=2)
    job_dir = Path(first["job_dir"])
    (job_dir / "shards" / "00001" / "DONE").unlink()  # shard 1 "unfinished": its ledger is kept
    kept, *dropped = sorted((job_dir / "shards" / "00001").glob("part-*.parquet"))
    for part in dropped:
        part.unlink()
    out.unlink()
    again = batch_inference(cfg, job_options(), str(inp), str(out), shards=2)
    assert again["rows"] == 40 and again["ok"] == 40 and again["skipped"] == 20
    assert pq.read_table(out).column("id").to_pylist() == [f"r{i:05d}" for i in range(40)]
    # the resume shows in Prefect: shard 0's rows and those of shard 1's kept checkpoint were already done
    resumed = f"resumed: {20 + pq.read_metadata(kept).num_rows} of 40 rows already done"
    assert again["resumed"] == 20 + pq.read_metadata(kept).num_rows < 40, again
    assert any(resumed in line for line in run_logs(again["flow_run"])), resumed
    summary, notes = _artifacts("partial-out-summary", again["flow_run"])
    assert summary["resumed"] == again["resumed"] and any(resumed.capitalize() in n for n in notes), notes
    assert StateStore().get_swarm("partial").phase == "STOPPED"  # type: ignore[union-attr]


def test_reuse_gate_uses_kept_swarm(prefect_api: PrefectStack, tmp_path: Path) -> None:
    kept = stub_swarm("kept-a", latency_ms=5)
    inp = prompts(tmp_path / "in.parquet", 20)
    batch_inference(kept, job_options(), str(inp), str(tmp_path / "a.parquet"), shards=1, keep_swarm=True)
    other = {**kept, "name": "kept-b", "port": kept["port"] + 50}  # same engine, other name
    res = batch_inference(other, job_options(), str(inp), str(tmp_path / "b.parquet"), shards=1)
    store = StateStore()
    assert store.get_swarm("kept-b") is None, "a second swarm was brought up instead of reusing"
    assert store.get_swarm("kept-a").phase == "RUNNING"  # type: ignore[union-attr]  # reused, not torn down
    assert res["ok"] == 20 and _requests(kept["port"]) >= 20
    swarm_down("kept-a")


def test_openai_batch_in_and_out_through_the_flow(prefect_api: PrefectStack, tmp_path: Path) -> None:
    """An OpenAI Batch file through batch_inference: the output's name decides its format (the
    flow's job options carry no format of their own), and a format that contradicts the name is
    refused before the swarm is brought up."""
    src = tmp_path / "batch.jsonl"
    lines = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 8}}
        for i in range(30)
    ]  # fmt: skip
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "answers.jsonl"
    cfg = stub_swarm("batch-flow", latency_ms=2)
    done = batch_inference(cfg, "openai-batch", str(src), str(out), shards=2, return_state=True)
    result = done.result()
    assert result["rows"] == result["ok"] == 30
    flow_run, task_runs = _runs(done.state_details.flow_run_id)
    assert {"swarm:batch-flow", f"job:{result['job_id']}"} <= set(flow_run.tags)
    # task runs carry no tags: each tag would cost a concurrency-lease write on the API per task run
    assert len(task_runs) >= 5 and all(not t.tags for t in task_runs), [(t.name, t.tags) for t in task_runs]
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["custom_id"] for g in got] == [f"c{i}" for i in range(30)]
    assert all(g["response"]["status_code"] == 200 and g["error"] is None for g in got)
    state = batch_inference(
        stub_swarm("batch-flow-bad"), {"job": "openai-batch", "output_format": "parquet"}, str(src),
        str(tmp_path / "other.jsonl"), return_state=True,
    )  # fmt: skip
    assert state.is_failed() and "Drop output_format" in str(state.message)
    assert StateStore().get_swarm("batch-flow-bad") is None, "a refused job brought a swarm up"


def test_dataset_output_swarm_released_before_the_commit_and_rerun_brings_up_none(
    prefect_api: PrefectStack, tmp_path: Path
) -> None:
    """The timeline shows swarm-down ending before commit-output starts; the dataset is whole; a
    rerun sends nothing and brings no swarm up."""
    import pyarrow.dataset as pds

    from prefect_swarm.jobs.rows.output import POSITION_COLUMN, SUCCESS

    cfg = stub_swarm("dsout", latency_ms=5)
    inp, out = prompts(tmp_path / "in.parquet", 30), f"{tmp_path}/ds/"
    state = batch_inference(cfg, job_options(), str(inp), out, shards=2, return_state=True)
    assert state.result()["rows"] == 30
    _, tasks = _runs(state.state_details.flow_run_id)
    by_name = {t.name: t for t in tasks}
    down, commit = by_name["swarm-down-dsout"], next(t for t in tasks if t.name.startswith("commit-output-"))
    assert down.end_time is not None and commit.start_time is not None
    assert down.end_time <= commit.start_time, (down.end_time, commit.start_time)
    table = pds.dataset(tmp_path / "ds", format="parquet").to_table().sort_by(POSITION_COLUMN)
    assert table.column("id").to_pylist() == [f"r{i:05d}" for i in range(30)] and (tmp_path / "ds" / SUCCESS).exists()
    rec = StateStore().get_swarm("dsout")
    assert rec is not None and rec.phase == "STOPPED"
    again = batch_inference(cfg, job_options(), str(inp), out, shards=2)
    assert again["skipped"] == 30 and again["rows"] == 30
    assert StateStore().get_swarm("dsout").updated_at == rec.updated_at  # type: ignore[union-attr]
