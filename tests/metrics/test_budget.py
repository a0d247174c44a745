"""The budget guard: a tiny cap stops the job mid-way and tears the swarm down; a larger cap resumes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from prefect_swarm.budget import BudgetGuard
from prefect_swarm.cli.errors import ExitCode, exit_code_for
from prefect_swarm.config.cost import CostConfig
from prefect_swarm.exceptions import BudgetReached, ConfigError, JobError
from prefect_swarm.testing.stub_engine import stub_swarm_config
from prefect_swarm.testing.waiting import wait_until


def test_guard_warns_at_80_percent_then_stops(caplog: pytest.LogCaptureFixture) -> None:
    used = [0.5]
    guard = BudgetGuard("s", CostConfig(gpu_hour_usd=10, max_cost_usd=10), lambda: (used[0], None), every_s=0)
    guard.check()
    used[0] = 0.85
    guard.check()
    assert "85% of its budget used: $8.5 of $10 (max_cost_usd)" in caplog.text
    used[0] = 1.2
    with pytest.raises(BudgetReached, match=r"budget reached: \$12 of \$10"):
        guard.check()
    hours = BudgetGuard("s", CostConfig(max_gpu_hours=1), lambda: (2.0, None), every_s=0)
    with pytest.raises(BudgetReached, match="budget reached: 2 of 1 GPU-hours"):
        hours.check()
    BudgetGuard("s", CostConfig(), lambda: (99.0, None), every_s=0).check()  # no cap: never stops


def test_a_run_cap_tightens_the_swarm_budget_the_lower_wins() -> None:
    swarm = CostConfig(gpu_hour_usd=2.0, max_gpu_hours=10.0, max_cost_usd=5.0)
    run = swarm.tightened(max_gpu_hours=1.0, max_cost_usd=50.0)
    assert (run.max_gpu_hours, run.max_cost_usd) == (1.0, 5.0)
    assert swarm.tightened() == swarm
    assert CostConfig().tightened(max_gpu_hours=2.0).max_gpu_hours == 2.0
    with pytest.raises(ConfigError, match=r"max_cost_usd=3 needs a price: set backend\.cost\.gpu_hour_usd"):
        CostConfig().tightened(max_cost_usd=3.0)
    # one error type, one exit code; not a JobError, so a task never retries into the same cap
    assert not isinstance(BudgetReached("x"), JobError)
    assert exit_code_for(BudgetReached("x")) is ExitCode.FAILURE


def test_a_budget_nobody_waits_for_stops_the_job_and_a_rerun_resumes_it(tmp_path: Path) -> None:
    """A --detach'ed job: its own process holds the swarm's cap and stops resumable (exit 75) naming it,
    with nobody waiting; `job status` says why. A waiting submit on the spent swarm sends nothing,
    tears the swarm down and fails naming the cap. A rerun with a larger cap finishes every row once."""
    n = 4000
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(n)], "prompt": [f"q {i}" for i in range(n)]}), src)
    out = tmp_path / "out.parquet"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"checkpoint_every": 100, "checkpoint_seconds": 0.5, "concurrency": 4}))
    job = ["job", "submit", "-n", "capped", "--input", str(src), "--output", str(out), "--id-column", "id"]
    job += ["--spec", str(spec), "--id", "capped-job"]

    # 2 GPUs, 80 GPU-seconds: about 40 s of wall time from `up` (room for the CLI and the job process to
    # start on a machine at load 10); the 4000 rows take ~60 s at 4 in flight, so the cap comes first
    replicas = _up(tmp_path, max_gpu_hours=80 / 3600)
    try:
        first = _cli(*job, "--detach")
        assert first.returncode == 0 and first.stdout.strip() == "capped-job", first.stderr
        doc = _wait_until_stopped("capped-job")
        assert doc["status"] == "PREEMPTED", doc["status"]
        (shard,) = doc["progress"]["shards"]
        assert shard["stopped"]["cause"] == "budget", shard
        assert "budget reached:" in shard["stopped"]["message"] and "GPU-hours" in shard["stopped"]["message"]
        done = doc["progress"]["done"]
        assert 0 < done < n and doc["progress"]["failed"] == 0, doc["progress"]
        assert not out.exists() and not _job_processes()
        shown = _cli("job", "status", "capped-job")
        assert "shard 0 stopped: swarm 'capped': budget reached:" in shown.stdout, shown.stdout

        # whoever waits on the spent swarm: nothing more is sent, the swarm goes down, the cap is named
        waited = _cli(*job)
        assert waited.returncode == 1, waited.stdout + waited.stderr
        assert "budget reached:" in waited.stderr and "GPU-hours" in waited.stderr, waited.stderr
        status = json.loads(_cli("job", "status", "capped-job", "-o", "json").stdout)
        assert status["progress"]["done"] == done, status["progress"]
        assert not [p for p in replicas if psutil.pid_exists(p)], "a replica outlived the budget stop"
        assert not _job_processes(), "a job process outlived the budget stop"
    finally:
        _cli("down", "capped", "-y", "--force")

    _up(tmp_path, max_gpu_hours=1.0)
    try:
        second = _cli(*job, "--concurrency", "32")  # a runner knob: the checkpoint resumes
        assert second.returncode == 0, second.stderr
        ids = pq.read_table(out, columns=["id"]).column("id").to_pylist()
        assert sorted(ids) == sorted(f"r{i}" for i in range(n))  # exactly one row per input row
    finally:
        _cli("down", "capped", "-y", "--force")


def _wait_until_stopped(job_id: str, timeout_s: float = 90) -> dict:
    return wait_until(
        f"job {job_id} to stop",
        lambda: json.loads(_cli("job", "status", job_id, "--refresh", "-o", "json").stdout),
        until=lambda doc: doc["status"] not in ("RUNNING", "PENDING"),
        timeout_s=timeout_s,
        poll_s=1,
    )


def _up(tmp_path: Path, **cost: float) -> list[int]:
    data = stub_swarm_config("capped", replicas=2, latency_ms=60, backend={"cost": cost})
    data["gpus_per_replica"] = 1
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(data))
    up = _cli("up", "-c", str(path), "--keep", "-o", "json")
    assert up.returncode == 0, up.stderr
    replicas = json.loads(up.stdout)["status"]["replicas"]
    pids = [int(r["external_id"]) for r in replicas if r.get("external_id")]
    assert len(pids) == 2, replicas
    return pids


def _job_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "prefect_swarm.jobs.run" in cmd and "capped-job" in cmd and proc.status() != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prefect_swarm.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_a_cost_cap_without_a_price_fails_validation(tmp_path) -> None:
    """max_cost_usd with no price could never be reached: the config is refused (validate exits 2), naming it."""
    from pydantic import ValidationError
    from typer.testing import CliRunner

    from prefect_swarm.cli.main import app

    with pytest.raises(ValidationError, match=r"max_cost_usd=5 needs a price"):
        CostConfig(max_cost_usd=5.0)
    assert CostConfig(max_cost_usd=5.0, per_shape={"gpu.h100-sxm": 3.0}).capped
    cfg = stub_swarm_config("no-price", backend={"cost": {"max_cost_usd": 5.0}})
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(app, ["validate", "-c", str(path)])
    assert res.exit_code == 2, res.output
    assert "max_cost_usd=5 needs a price" in res.output
