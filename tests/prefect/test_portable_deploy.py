"""A deployment runs on a worker that has only the installed package and an empty folder.

prefect.yaml is deployed from a scratch folder (as a user deploys from theirs), that folder is
deleted, and a worker started in an empty temp dir on its own pool runs the flow to the end.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from helpers import job_options, prompts, stub_swarm
from stack import PREFECT, REPO, PrefectStack, job_variables

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]


def test_worker_in_an_empty_folder_runs_the_deployment(
    prefect_stack: PrefectStack, swarm_home: Path, tmp_path: Path
) -> None:
    from prefect.deployments import run_deployment

    spec = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    deployment = next(d for d in spec["deployments"] if d["name"] == "on-demand")
    spec["deployments"] = [{**deployment, "name": "portable", "work_pool": {"name": "portable-pool"}}]
    deployer = tmp_path / "deployer"
    deployer.mkdir()
    (deployer / "prefect.yaml").write_text(yaml.safe_dump(spec))
    shutil.copy(REPO / "deployments" / "process-pool.json", deployer)
    env = prefect_stack.env

    def prefect(*args: str, cwd: Path) -> None:
        out = subprocess.run([PREFECT, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr

    prefect(
        "work-pool", "create", "portable-pool", "--type", "process", "--base-job-template", "process-pool.json",
        cwd=deployer,
    )  # fmt: skip
    prefect("--no-prompt", "deploy", "--prefect-file", "prefect.yaml", "--all", cwd=deployer)
    shutil.rmtree(deployer)

    from prefect import get_client

    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name("batch-inference/portable")
    assert str(deployer) not in json.dumps(dep.pull_steps or []), dep.pull_steps

    empty = tmp_path / "empty"
    empty.mkdir()
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [PREFECT, "worker", "start", "--pool", "portable-pool", "--type", "process", "--name", "portable-worker"],
        env=env,
        cwd=empty,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        inp, out = prompts(tmp_path / "in.parquet", 20), tmp_path / "out.parquet"
        run = run_deployment(
            "batch-inference/portable",
            parameters={"swarm": stub_swarm("portable"), "job": job_options(), "input": str(inp), "output": str(out)},
            job_variables=job_variables(swarm_home),
            timeout=240,
            poll_interval=1,
        )
        assert run.state is not None and run.state.is_completed(), (
            run.state,
            (tmp_path / "worker.log").read_text(errors="replace")[-3000:],
        )
        assert pq.read_table(out).num_rows == 20
    finally:
        import os
        import signal

        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(5)
