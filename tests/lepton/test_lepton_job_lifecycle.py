"""Jobs as the platform keeps them: a shard that cannot be scheduled stays Queueing (a queue timeout
stops it), and a finished job is archived after its TTL (its state then comes from its ledger)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from prefect_swarm.backends.lepton.compute import LeptonCompute
from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import JobHandle, JobRequest, JobStatus
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import JobPaths, SwarmPaths
from prefect_swarm.testing.fake_lepton import FakeLepton
from prefect_swarm.testing.waiting import wait_until

pytestmark = pytest.mark.lepton

Make = Callable[..., SwarmConfig]

# A stand-in for the job process: shard i marks its ledger DONE unless told to fail first.
MARK_DONE = """
import sys, pathlib
spec = pathlib.Path(sys.argv[sys.argv.index('--spec') + 1])
shard = int(sys.argv[sys.argv.index('--shard-id') + 1])
if shard == 1 and 'fail' in spec.parent.name:
    sys.exit(0)  # exits cleanly without finishing its ledger
done = spec.parent / 'shards' / f'{shard:05d}' / 'DONE'
done.parent.mkdir(parents=True, exist_ok=True)
done.write_text('')
"""


def _submit(compute: LeptonCompute, shared_dir: Path, job: str) -> JobHandle:
    spec_path = shared_dir / "runs" / job / "spec.json"
    spec_path.parent.mkdir(parents=True)
    JobSpec(input=str(shared_dir / "in.parquet"), output=str(shared_dir / "out.parquet")).save(spec_path)
    command = [compute.job_runtime().python, "-c", MARK_DONE, "--spec", str(spec_path)]
    return compute.submit(JobRequest(name=job, command=command, nshards=2))


@pytest.mark.parametrize("fake_lepton", [{"archive_after_s": 600.0}], indirect=True)
def test_archived_and_expired_jobs_are_read_from_the_ledger(
    lepton_cfg: Make, fake_lepton: FakeLepton, shared_dir: Path
) -> None:
    cfg = lepton_cfg()
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    ok, half = _submit(compute, shared_dir, "job-ok"), _submit(compute, shared_dir, "job-fail")
    assert compute.wait(ok, poll_s=0.1) is JobStatus.SUCCEEDED
    assert compute.wait(half, poll_s=0.1) is JobStatus.SUCCEEDED  # Lepton saw both exit 0
    fake_lepton.age_finished_jobs(601)  # archived: no counts left
    assert "Archived" in compute.probe(ok).detail
    assert compute.probe(ok).status is JobStatus.SUCCEEDED
    probe = compute.probe(half)
    assert probe.status is JobStatus.FAILED and "ledger is unfinished" in probe.detail
    fake_lepton.age_finished_jobs(600)  # out of the archive: 404
    assert compute.probe(ok).status is JobStatus.SUCCEEDED
    assert not set(ok.meta["jobs"]) & set(fake_lepton.jobs)
    assert JobPaths(shared_dir / "runs" / "job-ok").shard(1).done_marker.exists()


@pytest.mark.parametrize("fake_lepton", [{"queue_jobs": ("stuck",)}], indirect=True)
def test_a_shard_that_stays_queueing_is_stopped_after_the_queue_timeout(
    lepton_cfg: Make, fake_lepton: FakeLepton
) -> None:
    cfg = lepton_cfg(job_queue_timeout_s=1.0)
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    job = compute.submit(JobRequest(name="stuck", command=[compute.job_runtime().python, "-c", "print(1)"]))
    assert compute.probe(job).status is JobStatus.PENDING
    t0 = time.monotonic()
    assert compute.wait(job, poll_s=0.1) is JobStatus.FAILED
    assert time.monotonic() - t0 < 10
    probe = compute.probe(job)
    assert probe.status is JobStatus.CANCELLED  # it was stopped, so it holds no queue place
    (jid,) = job.meta["jobs"]
    assert fake_lepton.jobs[jid].stopped


def test_a_job_pending_a_retry_is_not_read_as_failed(lepton_cfg: Make, fake_lepton: FakeLepton) -> None:
    cfg = lepton_cfg()
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    job = compute.submit(JobRequest(name="retry", command=[compute.job_runtime().python, "-c", "print(1)"]))
    (jid,) = job.meta["jobs"]
    fake_lepton.force_state(jid, "PendingRetry")  # a worker failed; the platform will run it again
    probe = compute.probe(job)
    assert probe.status is JobStatus.PENDING and "PendingRetry" in probe.detail
    fake_lepton.force_state(jid, None)
    assert compute.wait(job, poll_s=0.1) is JobStatus.SUCCEEDED


@pytest.mark.parametrize("fake_lepton", [{"archive_after_s": 600.0}], indirect=True)
def test_an_archived_jobs_log_comes_from_the_historical_logs(
    lepton_cfg: Make, fake_lepton: FakeLepton, shared_dir: Path
) -> None:
    """Past its TTL a job has no replicas to stream from: its log is read by the historical query
    (`GET /logs` with start and end), also once the job itself is gone (404)."""
    cfg = lepton_cfg()
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    code = "print('first line of the shard'); print('last line of the shard')"
    job = compute.submit(JobRequest(name="talker", command=[compute.job_runtime().python, "-c", code]))
    assert compute.wait(job, poll_s=0.1) is JobStatus.SUCCEEDED
    (jid,) = job.meta["jobs"]
    live = compute.logs(job)
    assert f"[{jid}] first line of the shard" in live
    fake_lepton.age_finished_jobs(601)  # archived: no replicas left to stream from
    assert "Archived" in compute.probe(job).detail
    assert compute.logs(job).splitlines()[-2:] == [
        f"[{jid}] first line of the shard",
        f"[{jid}] last line of the shard",
    ]
    fake_lepton.age_finished_jobs(600)  # out of the archive: the job is gone (404), its log is not
    assert "gone" in compute.probe(job).detail and jid not in fake_lepton.jobs
    assert f"[{jid}] last line of the shard" in compute.logs(job)


@pytest.mark.parametrize("fake_lepton", [{"archive_after_s": 0.5}], indirect=True)
def test_the_historical_logs_404_is_no_logs_yet_and_429_is_retried(
    lepton_cfg: Make, fake_lepton: FakeLepton, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect_swarm.backends.lepton.compute import NO_LOGS_YET

    monkeypatch.setenv("PREFECT_SWARM_LEPTON_API_BACKOFF_S", "0.01")
    cfg = lepton_cfg()
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    job = compute.submit(JobRequest(name="talker", command=["python3", "-c", "print('said once')"]))
    assert compute.wait(job, poll_s=0.1) is JobStatus.SUCCEEDED
    (jid,) = job.meta["jobs"]
    wait_until(  # the state the API reports
        "the job Archived", lambda: compute.probe(job).detail, until=lambda d: "Archived" in d, timeout_s=30, poll_s=0.1
    )
    fake_lepton.inject(404, count=1, match="/logs", method="GET")
    assert compute.logs(job) == f"[{jid}] {NO_LOGS_YET}"
    fake_lepton.inject(429, count=2, match="/logs", method="GET", retry_after=0)
    assert compute.logs(job) == f"[{jid}] said once"
    statuses = [s for m, p, s in fake_lepton.requests if p.endswith("/logs")]
    assert statuses[-3:] == [429, 429, 200]
