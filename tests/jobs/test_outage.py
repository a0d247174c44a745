"""Outages pause, they do not fail rows (issue 22, item 7).

Real job processes against stub engines that are stopped and started again on the same ports: a
swarm whose replicas are all gone for longer than the old retry budget loses no row, and one gone
for longer than ``outage_timeout_s`` stops resumable (exit 75) and a rerun finishes exactly once.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _jobkit import job_argv, make_dataset, requests, run_job, write_spec

from prefect_swarm.interfaces.jobenv import EXIT_REQUEUE
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import JobPaths, read_json
from prefect_swarm.testing.stub_engine import StubEngine
from prefect_swarm.testing.waiting import wait_until

FAST = {"max_retries": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.05, "concurrency": 8, "checkpoint_every": 100}
OLD_RETRY_BUDGET_S = 7.0
"""What these knobs gave the runner before: rows failed once every endpoint had been out this long
(the backoffs of max_retries retries, at least three ejections of 1, 2 and 4 s)."""


def _wait_for_requests(stubs: list[StubEngine], n: int, proc: subprocess.Popen[str]) -> None:
    def sent() -> int:
        assert proc.poll() is None, proc.communicate()[1]
        return sum(requests(s) for s in stubs)

    wait_until(f"the job to send {n} requests", sent, until=lambda k: k >= n, timeout_s=60, poll_s=0.05)


def _ids(path: Path) -> list[str]:
    return pq.read_table(path, columns=["id"]).column("id").to_pylist()


def _manifest(tmp: Path) -> dict:
    return read_json(JobPaths(tmp / "job").manifest)


def test_every_replica_gone_past_the_retry_budget_then_back_loses_no_row(tmp_path: Path, stub_factory) -> None:
    """Both replicas die mid-job for longer than the old retry budget, then come back on their ports:
    0 failed rows, every row exactly once, and the dead endpoints were probed, not hammered."""
    n = 1000
    replicas = [stub_factory(latency_ms=20), stub_factory(latency_ms=20)]
    make_dataset(tmp_path / "in.parquet", n)
    spec = write_spec(tmp_path, endpoints=[r.url for r in replicas], outage_timeout_s=60, **FAST)
    proc = subprocess.Popen(job_argv(spec), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_requests(replicas, 200, proc)
        for r in replicas:
            r.stop()
        time.sleep(OLD_RETRY_BUDGET_S + 1.5)
        assert proc.poll() is None, "the job ended while every replica was gone"
        for r in replicas:
            r.start()  # the same port: the job's endpoints come back
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert _ids(tmp_path / "job-out.parquet") == [f"r{i:06d}" for i in range(n)]  # exactly once, in order
    rows = pq.read_table(tmp_path / "job-out.parquet", columns=["status", "error"]).to_pylist()
    assert [r for r in rows if r["status"] != "ok"] == []
    manifest = _manifest(tmp_path)
    assert (manifest["ok"], manifest["failed"]) == (n, 0)
    sent = read_json(JobPaths(tmp_path / "job").shard(0).progress)["requests"]
    # resent: what was in flight when they died, the failures before each was ejected, the probes
    assert n <= sent <= n + 150, sent


def test_an_outage_past_its_deadline_stops_resumable_and_a_rerun_finishes_exactly_once(
    tmp_path: Path, stub_factory
) -> None:
    """The only replica dies for longer than outage_timeout_s: the shard flushes and exits 75 naming
    the outage and the command that resumes it, no row is written off; once the replica is back the
    same command finishes every row exactly once."""
    n = 800
    replica = stub_factory(latency_ms=20)
    make_dataset(tmp_path / "in.parquet", n)
    spec = write_spec(tmp_path, endpoints=[replica.url], outage_timeout_s=1.0, **FAST)
    proc = subprocess.Popen(job_argv(spec), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_requests([replica], 100, proc)
        replica.stop()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_REQUEUE, err
    assert "no endpoint of the swarm answered" in err and "outage_timeout_s=1" in err, err
    assert f"python -m prefect_swarm.jobs.run --spec {spec} --shard-id 0 --nshards 1" in err, err
    assert not (tmp_path / "job-out.parquet").exists()
    progress = read_json(JobPaths(tmp_path / "job").shard(0).progress)
    assert progress["stopped"]["cause"] == "outage" and progress["state"] == "requeue", progress
    assert 0 < progress["done"] < n and progress["failed"] == 0, progress  # those in flight at the stop are redone

    replica.start()
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    assert _ids(tmp_path / "job-out.parquet") == [f"r{i:06d}" for i in range(n)]
    manifest = _manifest(tmp_path)
    assert (manifest["ok"], manifest["failed"]) == (n, 0)
    assert "stopped" not in read_json(JobPaths(tmp_path / "job").shard(0).progress)


def test_outage_timeout_must_be_positive(tmp_path: Path) -> None:
    base = {"input": str(tmp_path / "in.parquet"), "output": str(tmp_path / "out.parquet")}
    assert JobSpec(**base).outage_timeout_s == 900.0
    for bad in (0, -1):
        with pytest.raises(ValueError, match="outage_timeout_s"):
            JobSpec(**base, outage_timeout_s=bad)


def test_no_answer_counts_against_a_row_only_while_its_endpoint_answers_others() -> None:
    """The rule behind it, on the runner's own bookkeeping: a timeout or connection error is the row's
    own (counted) only when its endpoint answered another request since it was sent and stays in
    rotation; else it is the swarm's (not counted), sent elsewhere when another endpoint is in rotation."""
    from prefect_swarm.jobs.builtin import ChatCompletionJob
    from prefect_swarm.jobs.dispatch.runner import Runner, RunnerConfig

    runner = Runner(ChatCompletionJob(), ["http://a", "http://b"], RunnerConfig(eject_after=2), lambda _r: None)
    pool = runner.pool
    a, b = pool.endpoints
    sent = time.monotonic()
    assert runner._no_answer(a, sent) == (False, False)  # nothing answered since: not the row's fault
    pool.answered(a)
    assert runner._no_answer(a, sent) == (True, False)  # a answered others meanwhile: the row's own
    assert runner._no_answer(a, time.monotonic()) == (False, True)  # a leaves rotation: to b, not counted
    pool.failed(b)
    assert runner._no_answer(b, time.monotonic()) == (False, False)  # every endpoint out: the row waits
    assert pool.in_rotation == 0 and pool.out_for() >= 0
