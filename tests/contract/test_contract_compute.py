"""ComputeBackend contract: submit, probe, wait, cancel, fan-out, reattach (runs once per backend)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from contract_kit import BackendFactory, run_py

from prefect_swarm.interfaces import JobHandle, JobRequest, JobStatus
from prefect_swarm.swarm import Swarm

SECRET = "s3cr3t-token-value-42"

_REPORT = (
    "import json, os, sys\n"
    "keys = ['ENDPOINT', 'MODEL', 'PREFECT_SWARM_ENDPOINTS', 'PREFECT_SWARM_SHARD_ID',\n"
    "        'PREFECT_SWARM_NSHARDS', 'SECRET_TOKEN', 'PLAIN']\n"
    "rec = {'pid': os.getpid(), 'argv': sys.argv[1:], 'env': {k: os.environ.get(k) for k in keys}}\n"
    "out = os.path.join(os.environ['OUT'], 'shard-%s.json' % os.environ['PREFECT_SWARM_SHARD_ID'])\n"
    "open(out, 'w').write(json.dumps(rec))\n"
    "print('report written')\n"
)


@pytest.fixture
def swarm(up: Callable[..., Swarm]) -> Swarm:
    """A swarm that is up (jobs get its endpoint); not waited for: jobs here make no requests."""
    return up(replicas=2, ready=False)


def _py(swarm: Swarm) -> str:
    """The interpreter that exists where this backend runs jobs (never assumed to be ours)."""
    return swarm.compute.job_runtime().python


def _reports(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("shard-*.json"))]


def _files_containing(root: Path, needle: str) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and needle.encode() in path.read_bytes():
            hits.append(str(path))
    return hits


def test_env_and_secrets(swarm: Swarm, tmp_path: Path) -> None:
    swarm.wait_ready()  # every replica announced: the endpoints a job gets are settled (Slurm: head files)
    before = swarm.endpoints
    job = swarm.compute.submit(
        JobRequest(
            name="env",
            command=[_py(swarm), "-c", _REPORT],
            env={"OUT": str(tmp_path), "PLAIN": "visible"},
            secret_env={"SECRET_TOKEN": SECRET},
        )
    )
    assert swarm.compute.wait(job, poll_s=0.2) is JobStatus.SUCCEEDED
    (rep,) = _reports(tmp_path)
    env = rep["env"]
    assert env["ENDPOINT"] == swarm.endpoint and env["MODEL"] == swarm.cfg.model_name
    # the replicas as they were just before or after the submit: a loaded machine can fail one health
    # probe of a replica (on Slurm its head file then goes for a second, and the list changes)
    assert env["PREFECT_SWARM_ENDPOINTS"].split(",") in (before, swarm.endpoints)
    assert env["SECRET_TOKEN"] == SECRET and env["PLAIN"] == "visible"
    assert SECRET not in json.dumps(job.to_dict())
    assert _files_containing(Path(os.environ["PREFECT_SWARM_HOME"]), SECRET) == []


def test_submit_attached_returns_finished(swarm: Swarm) -> None:
    job = swarm.compute.submit(JobRequest(name="attached", command=[_py(swarm), "-c", "pass"], detach=False))
    probe = swarm.compute.probe(job)
    assert probe.status is JobStatus.SUCCEEDED and probe.exit_code == 0


def test_failure_reports_exit_code(factory: BackendFactory, swarm: Swarm) -> None:
    job = swarm.compute.submit(JobRequest(name="fails", command=[_py(swarm), "-c", "import sys; sys.exit(3)"]))
    assert swarm.compute.wait(job, poll_s=0.2) is JobStatus.FAILED
    probe = swarm.compute.probe(job)
    assert probe.status is JobStatus.FAILED and probe.error is None
    assert probe.exit_code == (3 if factory.exit_codes else None)


def test_probe_never_blocks_and_cancel(factory: BackendFactory, swarm: Swarm) -> None:
    compute = swarm.compute
    job = compute.submit(JobRequest(name="sleeper", command=[_py(swarm), "-c", "import time; time.sleep(120)"]))
    for _ in range(3):
        t0 = time.monotonic()
        probe = compute.probe(job)
        assert time.monotonic() - t0 < factory.status_budget_s
        assert probe.status in (JobStatus.PENDING, JobStatus.RUNNING), probe
    t0 = time.monotonic()
    compute.cancel(job)
    assert compute.wait(job, poll_s=0.2) is JobStatus.CANCELLED
    assert time.monotonic() - t0 < 30
    compute.cancel(job)  # idempotent
    assert compute.probe(job).status is JobStatus.CANCELLED


def test_cancel_after_success_keeps_success(swarm: Swarm) -> None:
    job = swarm.compute.submit(JobRequest(name="quick", command=[_py(swarm), "-c", "pass"], detach=False))
    swarm.compute.cancel(job)
    assert swarm.compute.probe(job).status is JobStatus.SUCCEEDED


def test_fan_out_makes_n_processes(swarm: Swarm, tmp_path: Path) -> None:
    job = swarm.compute.submit(
        JobRequest(name="fan", command=[_py(swarm), "-c", _REPORT], env={"OUT": str(tmp_path)}, nshards=3)
    )
    assert swarm.compute.wait(job, poll_s=0.2) is JobStatus.SUCCEEDED
    reps = _reports(tmp_path)
    assert len({r["pid"] for r in reps}) == 3
    for i, rep in enumerate(reps):
        assert rep["argv"][-4:] == ["--shard-id", str(i), "--nshards", "3"]
        assert rep["env"]["PREFECT_SWARM_SHARD_ID"] == str(i) and rep["env"]["PREFECT_SWARM_NSHARDS"] == "3"


def test_one_shard_of_many(swarm: Swarm, tmp_path: Path) -> None:
    job = swarm.compute.submit(
        JobRequest(name="one", command=[_py(swarm), "-c", _REPORT], env={"OUT": str(tmp_path)}, nshards=4, shard_id=2)
    )
    assert swarm.compute.wait(job, poll_s=0.2) is JobStatus.SUCCEEDED
    (rep,) = _reports(tmp_path)
    assert rep["argv"][-4:] == ["--shard-id", "2", "--nshards", "4"]


_PROBE_CHILD = """
import json, sys
from prefect_swarm.interfaces import JobHandle
from prefect_swarm.swarm import Swarm
compute = Swarm.from_state(sys.argv[1]).compute
job = JobHandle.from_dict(json.loads(sys.argv[2]))
status = compute.wait(job, poll_s=0.2)
print(json.dumps({"status": status.value, "exit_code": compute.probe(job).exit_code}))
"""


def test_reattach_to_a_job_from_a_new_process(factory: BackendFactory, swarm: Swarm) -> None:
    code = "import time, sys; time.sleep(1); sys.exit(5)"
    job = swarm.compute.submit(JobRequest(name="later", command=[_py(swarm), "-c", code]))
    stored = json.loads(json.dumps(job.to_dict()))  # what a state row keeps
    out = json.loads(run_py(_PROBE_CHILD, swarm.cfg.name, json.dumps(stored)))
    assert out == {"status": "FAILED", "exit_code": 5 if factory.exit_codes else None}
    assert JobHandle.from_dict(stored).id == job.id
