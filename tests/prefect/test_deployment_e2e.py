"""`prefect deployment run batch-inference/on-demand` on the local backend, through a real worker."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import job_options, prompts, stub_swarm
from stack import PrefectStack, jv_arg

from prefect_swarm.state import StateStore

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]


def _flow_run(name: str):  # type: ignore[no-untyped-def]
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    async def read():  # type: ignore[no-untyped-def]
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
            run = runs[0]
            arts = await client.read_artifacts(flow_run_filter=FlowRunFilter(id={"any_": [run.id]}))
            return run, arts

    return asyncio.run(read())


@pytest.mark.smoke
def test_deployment_run_completes_with_artifacts(prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path) -> None:
    inp = prompts(tmp_path / "in.parquet", 60)
    out = tmp_path / "out.parquet"
    t0 = time.monotonic()
    res = prefect_stack.cli(
        "deployment",
        "run",
        "batch-inference/on-demand",
        "--param",
        "swarm=" + json.dumps(stub_swarm("e2e")),
        "--param",
        "job=" + json.dumps(job_options()),
        "--param",
        f"input={inp}",
        "--param",
        f"output={out}",
        "--param",
        "shards=3",
        "--flow-run-name",
        "e2e-ondemand",
        *jv_arg(swarm_home),
        "--watch",
        "--watch-interval",
        "1",
        "--watch-timeout",
        "240",
        timeout=300,
    )
    elapsed = time.monotonic() - t0
    assert "Completed" in res.stdout, res.stdout + res.stderr
    table = pq.read_table(out)
    assert table.num_rows == 60 and table.column("id").to_pylist() == [f"r{i:05d}" for i in range(60)]
    assert set(table.column("status").to_pylist()) == {"ok"}
    run, arts = _flow_run("e2e-ondemand")
    assert {"swarm:e2e", "prefect-swarm"} <= set(run.tags) and any(t.startswith("job:") for t in run.tags)
    kinds = {(a.type, (a.key or "").rsplit("-", 1)[-1]) for a in arts}
    assert (
        ("table", "summary") in kinds
        and ("markdown", "output") in kinds
        and ("progress", "") in {(a.type, "") for a in arts}
    )
    summary = next(a for a in arts if a.key and a.key.endswith("-summary") and a.type == "table")
    assert summary.key == "e2e-out-summary", summary.key  # <swarm>-<output>-summary: no hash, one collection
    rows = json.loads(summary.data) if isinstance(summary.data, str) else summary.data
    assert rows[0]["rows"] == 60 and rows[0]["ok"] == 60
    assert rows[0]["block"] == "inline"  # an inline config, not a SwarmSpec block
    rec = StateStore().get_swarm("e2e")
    assert rec is not None and rec.phase == "STOPPED" and rec.flow_run_id == str(run.id)
    jobs = StateStore().list_jobs("e2e")
    assert len(jobs) == 1 and jobs[0].flow_run_id == str(run.id)  # one record per job, its shards as submissions
    subs = (jobs[0].handle or {})["submissions"]
    assert len(subs) == 3 and all(s["task_run_id"] for s in subs)
    print(f"deployment run --watch: {elapsed:.1f} s")
