"""One job record shape: a job reads the same in `job status -o json`, `job list` and `history`,
whether the CLI or a flow run submitted it; the same job from both is one record."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import job_options, prompts, stub_swarm
from stack import PrefectStack

from prefect_swarm.flows import batch_inference, swarm_down
from prefect_swarm.state import StateStore

pytestmark = [pytest.mark.prefect_server]

RunCli = Callable[..., subprocess.CompletedProcess[str]]


def _json(res: subprocess.CompletedProcess[str]) -> dict:  # type: ignore[type-arg]
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def test_cli_and_flow_jobs_share_one_record_shape(prefect_api: PrefectStack, tmp_path: Path, run_cli: RunCli) -> None:
    cfg = stub_swarm("shape", latency_ms=2)
    opts = job_options()
    inp = prompts(tmp_path / "in.parquet", 30)
    flow_out, cli_out = tmp_path / "flow.parquet", tmp_path / "cli.parquet"
    env = {"PREFECT_API_URL": prefect_api.api_url}
    try:
        res = batch_inference(cfg, opts, str(inp), str(flow_out), shards=2, keep_swarm=True)
        flow_id = res["job_id"]
        common = ["-n", "shape", "--input", str(inp), "--shards", "2", "--id-column", "id"]
        kwargs = ["--job-kwargs", json.dumps(opts["job_kwargs"])]
        # the same job from the CLI is the same record: same id, nothing rerun
        same = run_cli("job", "submit", *common, *kwargs, "--output", str(flow_out), "--detach", env=env)
        assert same.returncode == 0, same.stderr
        assert same.stdout.strip() == flow_id
        # another job from the CLI (another output), run to the end
        other = run_cli("job", "submit", *common, *kwargs, "--output", str(cli_out), env=env, timeout=120)
        assert other.returncode == 0, other.stdout + other.stderr
        jobs = StateStore().list_jobs("shape")
        assert len(jobs) == 2, [j.id for j in jobs]
        cli_id = next(j.id for j in jobs if j.id != flow_id)

        flow_doc = _json(run_cli("job", "status", flow_id, "-o", "json", env=env))
        cli_doc = _json(run_cli("job", "status", cli_id, "-o", "json", env=env))
        assert flow_doc.keys() == cli_doc.keys()
        for doc in (flow_doc, cli_doc):
            assert doc["status"] == "SUCCEEDED" and doc["committed"] and doc["kind"] == "batch"
            assert doc["progress"]["done"] == 30 and doc["nshards"] == 2
        assert flow_doc["flow_run_id"] and cli_doc["flow_run_id"] is None

        listed = {j["id"]: j for j in _json(run_cli("job", "list", "-n", "shape", "-o", "json", env=env))["jobs"]}
        slow_api = {**env, "PREFECT_SWARM_PREFECT_API_TIMEOUT_S": "90"}  # a loaded test server answers slowly
        history = _json(run_cli("history", "shape", "-o", "json", env=slow_api, timeout=150))
        assert history["prefect_error"] is None, history["prefect_error"]
        in_history = {j["id"]: j for j in history["swarms"][0]["jobs"]}
        assert listed.keys() == in_history.keys() == {flow_id, cli_id}
        for job_id in (flow_id, cli_id):
            assert listed[job_id] == in_history[job_id]
        assert listed[flow_id].keys() == listed[cli_id].keys()
        # a flow's shards are submissions of its one record, each with the task run that made it
        subs = listed[flow_id]["submissions"]
        assert sorted(s["shards"][0] for s in subs) == [0, 1] and all(s["task_run_id"] for s in subs)
        assert [s["shards"] for s in listed[cli_id]["submissions"]] == [[0, 1]]
        assert any(r["flow_run_id"] == flow_doc["flow_run_id"] for r in history["swarms"][0]["runs"])
    finally:
        swarm_down("shape")
