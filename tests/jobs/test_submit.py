"""Submission through a real Swarm (local backend, stub engine replicas) and the `job` CLI sub-app."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _jobkit import make_dataset
from typer.testing import CliRunner

from prefect_swarm.cli.job import job_app
from prefect_swarm.config import SwarmConfig
from prefect_swarm.jobs.checkpoint.plan import pending_shards
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.launch import (
    POLL_MIN_S,
    PollSchedule,
    cancel_job,
    job_status,
    prepare_job,
    submit_job,
    wait_job,
)
from prefect_swarm.state import StateStore
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.stub_engine import stub_swarm_config
from prefect_swarm.testing.waiting import wait_until


@pytest.fixture
def swarm() -> Iterator[Swarm]:
    """Two stub-engine replicas on the local backend."""
    cfg = SwarmConfig.model_validate(stub_swarm_config("jobs-stub", replicas=2, latency_ms=5))
    with Swarm(cfg) as s:
        yield s


def test_submit_wait_status_resubmit_cancel(tmp_path: Path, swarm: Swarm) -> None:
    make_dataset(tmp_path / "in.parquet", 1200)
    spec = JobSpec(
        input=str(tmp_path / "in.parquet"),
        output=str(tmp_path / "out.parquet"),
        id_column="id",
        shards=2,
        checkpoint_every=100,
        job_kwargs={"sampling": {"max_tokens": 4}},
    )
    rec = submit_job(swarm, spec, detach=False)
    assert rec.status == "SUCCEEDED" and rec.swarm == "jobs-stub"
    rows = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [r["id"] for r in rows] == [f"r{i:06d}" for i in range(1200)]
    doc = job_status(rec.id)
    assert doc["committed"] and doc["progress"]["done"] == 1200 and doc["manifest"]["ok"] == 1200
    assert len(doc["backend"]) == 1 and doc["backend"][0]["status"] == "SUCCEEDED"
    done_spec = JobSpec.model_validate(rec.spec)
    assert pending_shards(done_spec) == []
    # resubmitting the finished job starts nothing
    again = submit_job(swarm, done_spec, detach=True)
    assert len(again.handle["submissions"]) == 1 and again.status == "PENDING"

    # a long job, cancelled: the shards flush and a resubmit resumes
    make_dataset(tmp_path / "big.parquet", 200_000, row_group=20_000)
    big = JobSpec(
        input=str(tmp_path / "big.parquet"),
        output=str(tmp_path / "big.parquet.out"),
        id_column="id",
        shards=2,
        concurrency=8,
        checkpoint_seconds=0.5,
    )
    rec = submit_job(swarm, big, detach=True)
    wait_until("a row done", lambda: job_status(rec.id)["progress"]["done"], timeout_s=60, poll_s=0.3)
    assert cancel_job(rec.id)["status"] == "CANCELLED"
    doc = job_status(rec.id)
    assert doc["status"] == "CANCELLED" and 0 < doc["progress"]["done"] < 200_000
    assert all(s["state"] == "requeue" for s in doc["progress"]["shards"])


def test_prepare_refuses_bad_input_before_submitting(tmp_path: Path) -> None:
    from prefect_swarm.exceptions import DatasetError

    make_dataset(tmp_path / "in.parquet", 10, ids=["x"] * 10)
    with pytest.raises(DatasetError, match="duplicated"):
        prepare_job(JobSpec(input=str(tmp_path / "in.parquet"), output=str(tmp_path / "o.parquet"), id_column="id"))
    assert StateStore().list_jobs() == []


def test_cli_submit_status_list(tmp_path: Path, swarm: Swarm) -> None:
    make_dataset(tmp_path / "in.parquet", 300)
    runner = CliRunner()
    res = runner.invoke(
        job_app,
        [
            "submit",
            "-n",
            "jobs-stub",
            "--input",
            str(tmp_path / "in.parquet"),
            "--output",
            str(tmp_path / "out.parquet"),
            "--shards",
            "2",
            "--id-column",
            "id",
            "--job-kwargs",
            '{"sampling": {"max_tokens": 4}}',
            "--detach",
        ],
    )
    assert res.exit_code == 0, res.output
    job_id = res.stdout.strip().splitlines()[-1]
    doc = wait_job(job_id, poll_s=0.3, timeout_s=120)
    assert doc["status"] == "SUCCEEDED" and doc["committed"]
    res = runner.invoke(job_app, ["status", job_id, "-o", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["progress"]["done"] == 300
    res = runner.invoke(job_app, ["list", "-o", "json"])
    assert [j["id"] for j in json.loads(res.stdout)["jobs"]] == [job_id]
    script = tmp_path / "probe.py"
    out = tmp_path / "env.json"
    script.write_text(
        f"import json, os\njson.dump({{k: os.environ.get(k) for k in ('ENDPOINT', 'MODEL')}}, "
        f"open({str(out)!r}, 'w'))\n"
    )
    res = runner.invoke(job_app, ["submit-script", "-n", "jobs-stub", str(script)])
    assert res.exit_code == 0, res.output
    env = json.loads(out.read_text())
    assert env["MODEL"] == "stub-model" and env["ENDPOINT"].startswith("http://")


def test_a_backend_that_cannot_tell_is_not_a_failed_job(tmp_path: Path, stub) -> None:
    """A probe that could not ask the scheduler (sacct absent or lagging, an API hiccup) says
    nothing about the processes: while shards still have rows the job stays RUNNING, and once the
    ledger is complete it is SUCCEEDED whatever the probe says."""
    from _jobkit import run_job, write_spec

    from prefect_swarm.interfaces import JobStatus
    from prefect_swarm.launch import _overall

    make_dataset(tmp_path / "in.parquet", 30)
    spec = JobSpec.load(write_spec(tmp_path, endpoints=[stub.url]))
    untold = [{"id": "46.0,46.1", "status": None, "error": "cannot ask Slurm: sacct exited 1"}]
    assert _overall(spec, untold, JobStatus.RUNNING)[0] is JobStatus.RUNNING
    assert run_job(write_spec(tmp_path, endpoints=[stub.url])).returncode == 0
    assert _overall(spec, untold, JobStatus.RUNNING)[0] is JobStatus.SUCCEEDED


def test_poll_schedule_wakes_and_starts_over_when_the_manifest_changes(tmp_path: Path) -> None:
    """A finished job is seen when its manifest is written, not at the end of a long polling step."""
    mark = tmp_path / "manifest.json"
    schedule = PollSchedule(mark, most=600)
    schedule.step = 600.0  # a step no test would wait out
    threading.Timer(0.3, mark.write_text, args=("{}",)).start()
    t0 = time.monotonic()
    assert schedule.wait() is True
    assert time.monotonic() - t0 < 60
    assert schedule.step == POLL_MIN_S  # the steps start over: the processes' exit is seen soon too


def test_poll_schedule_ends_on_stop_and_grows_without_a_mark(tmp_path: Path) -> None:
    stop = threading.Event()
    schedule = PollSchedule(tmp_path / "manifest.json", most=600, stop=stop)
    schedule.step = 600.0
    threading.Timer(0.3, stop.set).start()
    assert schedule.wait() is False
    plain = PollSchedule(None, most=0.3)
    waits = [plain.step]
    for _ in range(4):
        assert plain.wait() is True
        waits.append(plain.step)
    assert waits == pytest.approx([POLL_MIN_S, 0.15, 0.225, 0.3, 0.3])
