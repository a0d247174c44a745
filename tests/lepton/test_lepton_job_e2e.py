"""End to end through the real SDK and the fake: endpoint up, ready, a 2-shard job (two Lepton
jobs running ``python -m prefect_swarm.jobs.run``), exactly-once output, down, nothing left."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import JobRequest, JobStatus
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.fake_lepton import FakeLepton

pytestmark = [pytest.mark.lepton, pytest.mark.slow]

ROWS = 120


def _input(path: Path) -> Path:
    pq.write_table(
        pa.table(
            {
                "id": [f"r{i:04d}" for i in range(ROWS)],
                "prompt": [f"question number {i}" for i in range(ROWS)],
            }
        ),
        path,
        row_group_size=16,
    )
    return path


def _check_output(path: Path) -> None:
    out = pq.read_table(path)
    ids = out.column("id").to_pylist()
    assert len(ids) == ROWS and len(set(ids)) == ROWS
    assert ids == [f"r{i:04d}" for i in range(ROWS)]  # input order
    assert set(out.column("status").to_pylist()) == {"ok"}


def test_two_shard_job_exactly_once(
    lepton_cfg: Callable[..., SwarmConfig], fake_lepton: FakeLepton, shared_dir: Path
) -> None:
    from prefect_swarm.jobs.rows.commit import commit_output
    from prefect_swarm.jobs.spec import JobSpec

    cfg = lepton_cfg(name="e2e")
    runs = Path(cfg.backend.shared_path)  # type: ignore[union-attr]
    with Swarm(cfg) as swarm:
        spec = JobSpec(
            job_id="job-e2e",
            input=str(_input(shared_dir / "in.parquet")),
            output=str(shared_dir / "out.parquet"),
            job_dir=str(runs / "job-e2e"),
            id_column="id",
            shards=2,
            concurrency=8,
            checkpoint_every=10,
            model=cfg.model_name,
            endpoints=swarm.endpoints,
            swarm_fingerprint=swarm.fingerprint,
        )
        spec_path = spec.save()
        compute = swarm.compute
        command = compute.job_runtime().module_argv("prefect_swarm.jobs.run", "--spec", str(spec_path))
        handle = compute.submit(JobRequest(name="job-e2e", command=command, nshards=2))
        assert len(handle.meta["jobs"]) == 2 and set(handle.meta["jobs"]) <= set(fake_lepton.jobs)
        status = compute.wait(handle, poll_s=0.2)
        assert status is JobStatus.SUCCEEDED, compute.logs(handle)
        commit_output(spec)
        _check_output(shared_dir / "out.parquet")
        # a rerun resumes from the ledger: nothing is redone, still one row per input row
        again = compute.submit(JobRequest(name="job-e2e", command=command, nshards=2))
        assert compute.wait(again, poll_s=0.2) is JobStatus.SUCCEEDED
        commit_output(spec)
        _check_output(shared_dir / "out.parquet")
    fake_lepton.wait_deletes()  # deletes finish in the background, as on the platform
    assert fake_lepton.deployments == {} and fake_lepton.jobs == {}
    assert fake_lepton.running_processes() == []


def test_submit_job_through_the_job_api(
    lepton_cfg: Callable[..., SwarmConfig],
    fake_lepton: FakeLepton,
    shared_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job API (prepare, submit, wait, commit) on a Lepton swarm whose home lies on the shared mount."""
    from prefect_swarm.jobs.spec import JobSpec
    from prefect_swarm.launch import submit_job

    monkeypatch.setenv("PREFECT_SWARM_HOME", str(shared_dir / "home"))
    # the job API reattaches with Swarm.from_state (secrets dropped): the token comes from the env
    monkeypatch.setenv("LEPTON_WORKSPACE_TOKEN", fake_lepton.token)
    cfg = lepton_cfg(name="e2e-api", token=None)
    spec = JobSpec(
        input=str(_input(shared_dir / "in2.parquet")),
        output=str(shared_dir / "out2.parquet"),
        id_column="id",
        shards=2,
        concurrency=8,
    )
    with Swarm(cfg) as swarm:
        rec = submit_job(swarm, spec, detach=False)
        assert rec.status == JobStatus.SUCCEEDED.value, rec
        assert len(rec.handle["submissions"]) == 1 and len(rec.handle["submissions"][0]["meta"]["jobs"]) == 2
    _check_output(shared_dir / "out2.parquet")
    assert fake_lepton.running_processes() == []


def test_spec_off_the_shared_mount_is_refused(
    lepton_cfg: Callable[..., SwarmConfig], fake_lepton: FakeLepton, tmp_path: Path
) -> None:
    from prefect_swarm.backends.lepton.compute import LeptonCompute
    from prefect_swarm.exceptions import ConfigError
    from prefect_swarm.paths import SwarmPaths

    cfg = lepton_cfg()
    compute = LeptonCompute(cfg, SwarmPaths.for_swarm(cfg.name), None)
    with pytest.raises(ConfigError, match="not on the storage Lepton jobs mount"):
        compute.submit(
            JobRequest(
                name="x",
                command=[
                    "python",
                    "-m",
                    "prefect_swarm.jobs.run",
                    "--spec",
                    str(tmp_path / "elsewhere" / "spec.json"),
                ],
            )
        )
    assert fake_lepton.jobs == {}
